"""The content-addressed image store under ``<state dir>/images`` (0700).

```
images/
  blobs/sha256/<hex>          an imported image's config, manifest and layer blobs, by digest
  images/<hex>/rootfs/        the image's flattened rootfs (its own uids and gids on disk)
  images/<hex>/image.json     its config, its record (provenance), size, when made
  names.json                  name:tag -> digest
  cache/steps/<key>.json      a build step's result, by content hash (see _build)
  cache/base/<key>.json       an mmdebstrap base, by suite, variant and packages
  tmp/<random>/               work in progress; renamed into place when whole
  lock                        flock(2) held while names, images or the cache change
```

Atomic: an image is made whole under ``tmp/`` and renamed into ``images/``
(rename(2) of a directory within one filesystem), and every JSON file is
written beside its place and renamed over it, so a failed or killed import or
build leaves nothing half-written (``prune`` clears an abandoned ``tmp/``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from stockade.errors import ImageError
from stockade.image._model import DIGEST, Image, ImageConfig, check_name

HEX_LEN = 64
TMP_STALE_SECONDS = 3600.0
"""A ``tmp/`` entry older than this belongs to no running import or build (a
base takes ~40 s, a build minutes): ``prune`` removes it."""


def write_json(path: Path, data: object) -> None:
    """Write ``data`` to ``path`` atomically (a sibling file renamed over it)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(3).hex()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@dataclass(frozen=True, slots=True)
class PruneReport:
    """What ``prune`` removed (or, with ``dry_run``, would remove)."""

    images: tuple[str, ...]
    cache_entries: tuple[str, ...]
    tmp: tuple[str, ...]
    bytes: int


class ImageStore:
    """The images of one state directory.

    ``get`` resolves a ref (``name[:tag]``, ``sha256:…``, or a unique prefix
    of a digest's hex); ``add`` puts a finished rootfs in (import and build
    use it); ``rm`` and ``prune`` take images out.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    # ------------------------------------------------------------- layout

    @property
    def blobs(self) -> Path:
        return self.root / "blobs" / "sha256"

    @property
    def images_dir(self) -> Path:
        return self.root / "images"

    @property
    def cache_dir(self) -> Path:
        return self.root / "cache"

    @property
    def tmp_dir(self) -> Path:
        return self.root / "tmp"

    def ensure(self) -> None:
        """Make the store's directories (0700: rootfs trees hold the images'
        setuid files and devices, which no host user should reach)."""
        for path in (
            self.root,
            self.blobs.parent,
            self.blobs,
            self.images_dir,
            self.cache_dir,
            self.cache_dir / "steps",
            self.cache_dir / "base",
            self.tmp_dir,
        ):
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        self.ensure()
        fd = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def workdir(self, purpose: str) -> Iterator[Path]:
        """A fresh directory under ``tmp/``, removed afterwards whatever happens."""
        self.ensure()
        path = self.tmp_dir / f"{purpose}-{os.getpid()}-{os.urandom(4).hex()}"
        path.mkdir(mode=0o700)
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    # ------------------------------------------------------------- names

    def names(self) -> dict[str, str]:
        path = self.root / "names.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise ImageError(
                f"the image store's names file {path} cannot be read ({exc}); "
                "restore it or remove it (images stay, unnamed)"
            ) from None
        if not isinstance(data, dict):
            raise ImageError(f"the image store's names file {path} is not a JSON object; remove it")
        return {str(k): str(v) for k, v in data.items()}

    def tag(self, name: str, digest: str) -> str:
        """Point ``name`` (``:latest`` when untagged) at the image ``digest``; returns the name."""
        name = check_name(name)
        with self.locked():
            if not (self.images_dir / digest[7:]).is_dir():
                raise ImageError(
                    f"no image {digest} in the store to name {name!r}; see `stockade image ls`", exit_code=6
                )
            names = self.names()
            names[name] = digest
            write_json(self.root / "names.json", names)
        return name

    # ------------------------------------------------------------- reading

    def digests(self) -> list[str]:
        if not self.images_dir.is_dir():
            return []
        return sorted(
            "sha256:" + p.name
            for p in self.images_dir.iterdir()
            if len(p.name) == HEX_LEN and (p / "image.json").is_file()
        )

    def resolve(self, ref: str) -> str:
        """The digest ``ref`` names.

        Raises:
            ImageError: no image, or several, match (exit 6 for none).
        """
        names = self.names()
        if ref in names:
            return names[ref]
        if ":" not in ref.rsplit("/", 1)[-1] and f"{ref}:latest" in names:
            return names[f"{ref}:latest"]
        digests = self.digests()
        if DIGEST.match(ref):
            if ref in digests:
                return ref
        else:
            prefix = ref.removeprefix("sha256:")
            if len(prefix) >= 4 and all(c in "0123456789abcdef" for c in prefix):
                found = [d for d in digests if d[7:].startswith(prefix)]
                if len(found) == 1:
                    return found[0]
                if len(found) > 1:
                    raise ImageError(
                        f"image ref {ref!r} is the start of {len(found)} digests; "
                        "give more of it (see `stockade image ls`)"
                    )
        raise ImageError(
            f"no image {ref!r} in the store {self.root}; see `stockade image ls` "
            "for what there is, or `stockade image import`/`build` to add it",
            exit_code=6,
        )

    def get(self, ref: str) -> Image:
        """The image ``ref`` names (``name:tag``, ``sha256:…`` or a unique digest prefix).

        Raises:
            ImageError: the store holds no such image (exit 6).
        """
        digest = self.resolve(ref)
        return self._load(digest, self.names())

    def _load(self, digest: str, names: Mapping[str, str]) -> Image:
        base = self.images_dir / digest[7:]
        try:
            meta = json.loads((base / "image.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ImageError(
                f"image {digest} in the store is damaged ({exc}); remove it with "
                f"`stockade image rm --force {digest[7:19]}` and import or build it again"
            ) from None
        return Image(
            digest=digest,
            names=tuple(sorted(n for n, d in names.items() if d == digest)),
            rootfs=base / "rootfs",
            config=ImageConfig.from_json(meta.get("config") or {}),
            provenance=MappingProxyType(dict(meta.get("provenance") or {})),
        )

    def meta(self, digest: str) -> dict[str, object]:
        data = json.loads((self.images_dir / digest[7:] / "image.json").read_text(encoding="utf-8"))
        assert isinstance(data, dict)
        return data

    def list(self) -> list[Image]:
        names = self.names()
        return [self._load(d, names) for d in self.digests()]

    # ------------------------------------------------------------- writing

    def add(
        self,
        digest: str,
        rootfs: Path,
        config: ImageConfig,
        provenance: Mapping[str, object],
        *,
        parent: str | None = None,
    ) -> Image:
        """Put the finished ``rootfs`` (a directory under ``tmp/``) in as image
        ``digest``; moved, not copied. An image of that digest already there is
        kept and ``rootfs`` removed (same digest, same content).
        """
        if not DIGEST.match(digest):
            raise ValueError(f"not a digest: {digest!r}")
        from stockade.image._tree import tree_size

        final = self.images_dir / digest[7:]
        with self.locked():
            if not (final / "image.json").is_file():
                staging = rootfs.parent / f"image-{digest[7:19]}-{os.urandom(3).hex()}"
                staging.mkdir(mode=0o700)
                os.rename(rootfs, staging / "rootfs")
                write_json(
                    staging / "image.json",
                    {
                        "digest": digest,
                        "config": config.to_json(),
                        "provenance": dict(provenance),
                        "parent": parent,
                        "created": time.time(),
                        "size": tree_size(staging / "rootfs"),
                    },
                )
                if final.exists():
                    shutil.rmtree(final)  # an image.json-less leftover of a crash
                os.rename(staging, final)
            else:
                shutil.rmtree(rootfs, ignore_errors=True)
        return self._load(digest, self.names())

    def put_blob(self, digest: str, src: Path) -> None:
        """Keep the verified blob file ``src`` (moved) as ``blobs/sha256/<hex>``."""
        self.ensure()
        dest = self.blobs / digest[7:]
        if dest.exists():
            src.unlink()
        else:
            os.replace(src, dest)

    # ------------------------------------------------------------- cache

    def cache_get(self, kind: str, key: str) -> str | None:
        """The image a cache entry of ``kind`` (``steps``, ``base``) holds, if it is still here."""
        path = self.cache_dir / kind / f"{key}.json"
        try:
            digest = str(json.loads(path.read_text(encoding="utf-8"))["digest"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return digest if (self.images_dir / digest[7:] / "image.json").is_file() else None

    def cache_put(self, kind: str, key: str, digest: str, **extra: object) -> None:
        self.ensure()
        write_json(self.cache_dir / kind / f"{key}.json", {"digest": digest, "time": time.time(), **extra})

    # ------------------------------------------------------------- removing

    def rm(self, ref: str, *, force: bool = False) -> tuple[str, tuple[str, ...], bool]:
        """Remove the image ``ref``; returns its digest, the names removed and
        whether the image itself went.

        A name ref removes only that name, and the image with it when no other
        name points there and no named image was built from it (as ``docker
        rmi``). A digest ref removes the image, refused while a name points at
        it unless ``force`` (then the names go too).

        Raises:
            ImageError: no such image, or names point at it and not ``force``.
        """
        with self.locked():
            names = self.names()
            digest = self.resolve(ref)
            name = ref if ref in names else f"{ref}:latest" if f"{ref}:latest" in names else None
            removed: list[str] = []
            if name is not None:
                del names[name]
                removed.append(name)
            others = sorted(n for n, d in names.items() if d == digest)
            if others and name is None and not force:
                raise ImageError(
                    f"image {digest[7:19]} is named {', '.join(others)}; remove the names "
                    f"(`stockade image rm {others[0]}`) or pass --force to remove it with them"
                )
            # An image another named image was built from stays, unnamed (as
            # `docker rmi` keeps a parent): a rebuild of that one hits it in the cache.
            gone = force or (not others and digest not in self.kept(names))
            if gone:
                for other in others:
                    del names[other]
                    removed.append(other)
                self._remove_image(digest)
            write_json(self.root / "names.json", names)
        return digest, tuple(removed), gone

    def _remove_image(self, digest: str) -> None:
        final = self.images_dir / digest[7:]
        # Renamed away first, so that a crash mid-removal leaves no image.json-bearing husk.
        doomed = self.tmp_dir / f"rm-{digest[7:19]}-{os.urandom(3).hex()}"
        self.ensure()
        os.rename(final, doomed)
        shutil.rmtree(doomed, ignore_errors=True)

    def kept(self, names: Mapping[str, str] | None = None) -> set[str]:
        """Digests that stay in a prune: named images and every image one of
        them was built from (its steps and base, which a rebuild hits in the cache)."""
        names = self.names() if names is None else names
        keep: set[str] = set()
        todo = list(names.values())
        while todo:
            digest = todo.pop()
            if digest in keep:
                continue
            keep.add(digest)
            try:
                parent = self.meta(digest).get("parent")
            except (OSError, ValueError):
                continue
            if isinstance(parent, str):
                todo.append(parent)
        return keep

    def bases(self) -> set[str]:
        """The images the base cache holds (mmdebstrap bases: ~40 s each to make again)."""
        folder = self.cache_dir / "base"
        out: set[str] = set()
        for entry in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            try:
                out.add(str(json.loads(entry.read_text(encoding="utf-8"))["digest"]))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return out

    def prune(self, *, dry_run: bool = False, all_cache: bool = False) -> PruneReport:
        """Remove unnamed images (not the ancestors of a named one, nor the
        cached bases unless ``all_cache``), cache entries whose image is gone,
        and abandoned ``tmp/`` work."""
        with self.locked():
            keep = self.kept() | (set() if all_cache else self.bases())
            images = [d for d in self.digests() if d not in keep]
            total = 0
            for digest in images:
                try:
                    size = self.meta(digest).get("size")
                    total += int(size) if isinstance(size, int) else 0
                except (OSError, ValueError):
                    pass
            gone = set(images)
            stale: list[str] = []
            for kind in ("steps", "base"):
                folder = self.cache_dir / kind
                for entry in sorted(folder.glob("*.json")) if folder.is_dir() else []:
                    try:
                        digest = str(json.loads(entry.read_text(encoding="utf-8"))["digest"])
                    except (OSError, ValueError, KeyError, TypeError):
                        digest = ""
                    if digest in gone or not (self.images_dir / digest[7:] / "image.json").is_file():
                        stale.append(f"{kind}/{entry.stem}")
            now = time.time()
            tmp = (
                [
                    p.name
                    for p in sorted(self.tmp_dir.iterdir())
                    if now - p.lstat().st_mtime > TMP_STALE_SECONDS or p.name.startswith("rm-")
                ]
                if self.tmp_dir.is_dir()
                else []
            )
            if not dry_run:
                for digest in images:
                    self._remove_image(digest)
                for entry_name in stale:
                    (self.cache_dir / f"{entry_name}.json").unlink(missing_ok=True)
                for name in tmp:
                    shutil.rmtree(self.tmp_dir / name, ignore_errors=True)
        return PruneReport(images=tuple(images), cache_entries=tuple(stale), tmp=tuple(tmp), bytes=total)


def default_store(state: str | None = None) -> ImageStore:
    """The store of the state directory (``stockade.daemon._paths.state_dir``): ``<state>/images``."""
    from stockade.daemon._paths import state_dir

    return ImageStore(Path(state_dir(state)) / "images")


__all__ = ["ImageStore", "PruneReport", "default_store", "write_json"]
