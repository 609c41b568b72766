"""Importing an OCI image layout (a directory or a tar of one) or a ``docker
save`` tarball into the store, with no registry and no container engine.

Everything is checked from outside before it is trusted: the JSON of the
index, the manifest and the config (an error names the field and the fix),
each layer blob against its manifest digest and, uncompressed, against the
config's ``rootfs.diff_ids``, and every path a layer writes (``_layers``).
``skopeo`` is not needed: a ``docker save`` tarball is a ``manifest.json``
beside its config and layer files (Docker ≥ 25 writes an OCI layout with it),
and reading it takes forty lines.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import platform
import shutil
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from stockade.errors import ImageError
from stockade.image._layers import apply_layer
from stockade.image._model import DIGEST, Image, config_from_oci
from stockade.image._store import ImageStore
from stockade.image._tree import clean_member, openat2

MAX_JSON = 4 * 1024 * 1024
"""An index, manifest or config larger than this is not an image's (they are KiBs)."""
GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le", "s390x": "s390x"}
MT_INDEX = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)


class _Source(Protocol):
    """Where the layout's files are: a directory or a tar archive."""

    def exists(self, name: str) -> bool: ...

    def open(self, name: str) -> IO[bytes]: ...


class _DirSource:
    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        self.path = path

    def exists(self, name: str) -> bool:
        try:
            os.close(openat2(self.fd, name, os.O_PATH))
            return True
        except OSError:
            return False

    def open(self, name: str) -> IO[bytes]:
        # Beneath the layout directory: a manifest naming '../../etc/shadow'
        # or a blob that is a symlink out reads nothing of the host.
        try:
            fd = openat2(self.fd, name, os.O_RDONLY)
        except OSError as exc:
            raise ImageError(
                f"{self.path}: {name!r} cannot be read from the image layout ({exc.strerror}); "
                "the layout is incomplete, export it again"
            ) from None
        return os.fdopen(fd, "rb")


class _TarSource:
    def __init__(self, path: Path) -> None:
        try:
            self.tar = tarfile.open(path, mode="r:*")  # noqa: SIM115 (closed by _source)
            self.members = {clean_member(m.name, what=str(path)): m for m in self.tar.getmembers()}
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise ImageError(
                f"{path} is not a readable tar archive ({exc}); give a `docker save` "
                "tarball or an OCI layout (a directory or its tar)"
            ) from None
        self.path = path

    def exists(self, name: str) -> bool:
        return name in self.members

    def open(self, name: str) -> IO[bytes]:
        member = self.members.get(name)
        seen = 0
        # A symlinked blob within the archive (docker save links shared layers).
        while member is not None and member.issym() and seen < 8:
            seen += 1
            target = os.path.normpath(os.path.join(os.path.dirname(name), member.linkname))
            name = clean_member(target, what=str(self.path))
            member = self.members.get(name)
        f = self.tar.extractfile(member) if member is not None and member.isreg() else None
        if f is None:
            raise ImageError(
                f"{self.path}: {name!r} is not a file in the archive; the tarball is incomplete, "
                "export it again"
            )
        return f


@contextlib.contextmanager
def _source(path: Path) -> Iterator[_Source]:
    if path.is_dir():
        src = _DirSource(path)
        try:
            yield src
        finally:
            os.close(src.fd)
    elif path.is_file():
        tsrc = _TarSource(path)
        try:
            yield tsrc
        finally:
            tsrc.tar.close()
    else:
        raise ImageError(f"{path} does not exist; give a `docker save` tarball or an OCI layout", exit_code=6)


def _json(src: _Source, name: str, *, where: str) -> tuple[object, str]:
    obj, digest, _ = _json_raw(src, name, where=where)
    return obj, digest


def _json_raw(src: _Source, name: str, *, where: str) -> tuple[object, str, bytes]:
    with src.open(name) as f:
        raw = f.read(MAX_JSON + 1)
    if len(raw) > MAX_JSON:
        raise ImageError(
            f"{where}: {name!r} is larger than {MAX_JSON} bytes, which no image's JSON is; refused"
        )
    try:
        return json.loads(raw), "sha256:" + hashlib.sha256(raw).hexdigest(), raw
    except ValueError as exc:
        raise ImageError(f"{where}: {name!r} is not valid JSON ({exc}); export the image again") from None


def _field(doc: object, key: str, kind: type, *, where: str, fix: str) -> object:
    if not isinstance(doc, dict) or not isinstance(doc.get(key), kind):
        got = type(doc.get(key)).__name__ if isinstance(doc, dict) and key in doc else "missing"
        raise ImageError(f"{where}: field '{key}' is {got}, not a {kind.__name__}; {fix}")
    return doc[key]


def _digest(value: object, *, where: str, field: str) -> str:
    if not isinstance(value, str) or not DIGEST.match(value):
        raise ImageError(
            f"{where}: field '{field}' is {value!r}, not a 'sha256:' and 64 hex digits; "
            "only sha256 digests are supported"
        )
    return value


@dataclass(frozen=True, slots=True)
class _Plan:
    """What an archive holds, read and checked, before anything is written."""

    format: str
    config: dict[str, object]
    config_digest: str
    config_raw: bytes
    layers: tuple[tuple[str, str | None], ...]
    """(file in the archive, digest of that file as stored, if the format gives one)."""
    diff_ids: tuple[str, ...]
    names: tuple[str, ...]


def _plan(src: _Source, where: str) -> _Plan:
    if src.exists("manifest.json"):
        return _plan_docker(src, where)
    if src.exists("index.json"):
        return _plan_oci(src, where)
    raise ImageError(
        f"{where} holds neither manifest.json (a `docker save` tarball) nor index.json "
        "(an OCI image layout); export the image with `docker save IMAGE -o FILE.tar`"
    )


def _plan_docker(src: _Source, where: str) -> _Plan:
    doc, _ = _json(src, "manifest.json", where=where)
    at = f"{where}: manifest.json"
    if not isinstance(doc, list) or not doc:
        raise ImageError(f"{at} is not a non-empty JSON list; export the image again with `docker save`")
    if len(doc) > 1:
        raise ImageError(f"{at} holds {len(doc)} images; save one image per tarball (`docker save IMAGE`)")
    entry = doc[0]
    config_name = str(_field(entry, "Config", str, where=f"{at}[0]", fix="it names the config file"))
    layers = _field(entry, "Layers", list, where=f"{at}[0]", fix="it lists the layer files")
    assert isinstance(layers, list)
    tags = entry.get("RepoTags") if isinstance(entry, dict) else None
    config_path = clean_member(config_name, what=at)
    config, config_digest, raw = _json_raw(src, config_path, where=where)
    stem = config_path.rsplit("/", 1)[-1].removesuffix(".json")
    if len(stem) == 64 and all(c in "0123456789abcdef" for c in stem) and config_digest != f"sha256:{stem}":
        raise ImageError(
            f"{at}: config {config_name!r} has digest {config_digest}, not the {stem[:12]}… its "
            "name says; the tarball is corrupt or altered"
        )
    files: list[tuple[str, str | None]] = []
    for i, layer in enumerate(layers):
        if not isinstance(layer, str):
            raise ImageError(f"{at}[0]: field 'Layers[{i}]' is not a string; it names a layer file")
        rel = clean_member(layer, what=at)
        parts = rel.split("/")
        known = f"sha256:{parts[2]}" if len(parts) == 3 and parts[:2] == ["blobs", "sha256"] else None
        files.append((rel, known))
    return _finish("docker-archive", config, config_digest, raw, files, tags, where)


def _plan_oci(src: _Source, where: str) -> _Plan:
    if src.exists("oci-layout"):
        layout, _ = _json(src, "oci-layout", where=where)
        version = layout.get("imageLayoutVersion") if isinstance(layout, dict) else None
        if version != "1.0.0":
            raise ImageError(
                f"{where}: oci-layout field 'imageLayoutVersion' is {version!r}, not '1.0.0'; "
                "only version 1.0.0 layouts are read"
            )
    index, _ = _json(src, "index.json", where=where)
    at = f"{where}: index.json"
    manifests = _field(index, "manifests", list, where=at, fix="an OCI index lists its manifests")
    assert isinstance(manifests, list)
    names: list[str] = []
    chosen: dict[str, object] | None = None
    for _depth in range(3):
        if not manifests:
            raise ImageError(f"{at}: field 'manifests' is empty; the layout holds no image")
        pick = _pick(manifests, where=at)
        desc_digest = _digest(pick.get("digest"), where=at, field="manifests[].digest")
        ann = pick.get("annotations")
        if isinstance(ann, dict) and isinstance(ann.get("org.opencontainers.image.ref.name"), str):
            names.append(str(ann["org.opencontainers.image.ref.name"]))
        doc, got = _json(src, f"blobs/sha256/{desc_digest[7:]}", where=where)
        if got != desc_digest:
            raise ImageError(
                f"{where}: manifest blob {desc_digest[7:19]} has digest {got}; the layout is corrupt"
            )
        if not isinstance(doc, dict):
            raise ImageError(f"{where}: manifest {desc_digest[7:19]} is not a JSON object")
        if doc.get("mediaType") in MT_INDEX or ("manifests" in doc and "layers" not in doc):
            inner = doc.get("manifests")
            if not isinstance(inner, list):
                raise ImageError(f"{where}: nested index {desc_digest[7:19]} field 'manifests' is not a list")
            manifests = inner
            at = f"{where}: index {desc_digest[7:19]}"
            continue
        chosen = doc
        break
    if chosen is None:
        raise ImageError(f"{at}: indexes nest more than 3 deep; the layout is malformed")
    mat = f"{where}: manifest"
    cdesc = _field(chosen, "config", dict, where=mat, fix="a manifest names its config blob")
    assert isinstance(cdesc, dict)
    cdigest = _digest(cdesc.get("digest"), where=mat, field="config.digest")
    config, got, raw = _json_raw(src, f"blobs/sha256/{cdigest[7:]}", where=where)
    if got != cdigest:
        raise ImageError(f"{where}: config blob {cdigest[7:19]} has digest {got}; the layout is corrupt")
    layers = _field(chosen, "layers", list, where=mat, fix="a manifest lists its layers")
    assert isinstance(layers, list)
    files: list[tuple[str, str | None]] = []
    for i, layer in enumerate(layers):
        ldigest = _digest(
            layer.get("digest") if isinstance(layer, dict) else None, where=mat, field=f"layers[{i}].digest"
        )
        files.append((f"blobs/sha256/{ldigest[7:]}", ldigest))
    return _finish("oci-layout", config, cdigest, raw, files, names, where)


def _pick(manifests: list[object], *, where: str) -> dict[str, object]:
    """The manifest for this host's platform (the only one, or linux/<this arch>)."""
    arch = ARCH.get(platform.machine(), platform.machine())
    entries = [m for m in manifests if isinstance(m, dict)]
    if len(entries) != len(manifests):
        raise ImageError(
            f"{where}: field 'manifests' holds something other than objects; the index is malformed"
        )
    if len(entries) == 1:
        return entries[0]
    for entry in entries:
        plat = entry.get("platform")
        if isinstance(plat, dict) and plat.get("os") == "linux" and plat.get("architecture") == arch:
            return entry
    raise ImageError(
        f"{where}: none of the {len(entries)} manifests is for linux/{arch}; "
        "export the image for this platform (`docker save --platform linux/" + arch + "`)"
    )


def _finish(
    fmt: str,
    config: object,
    config_digest: str,
    raw: bytes,
    files: list[tuple[str, str | None]],
    tags: object,
    where: str,
) -> _Plan:
    at = f"{where}: config {config_digest[7:19]}"
    if not isinstance(config, dict):
        raise ImageError(f"{at} is not a JSON object; export the image again")
    arch = ARCH.get(platform.machine(), platform.machine())
    if config.get("os", "linux") != "linux":
        raise ImageError(f"{at}: field 'os' is {config.get('os')!r}; only linux images run in a cell")
    if config.get("architecture", arch) != arch:
        raise ImageError(
            f"{at}: field 'architecture' is {config.get('architecture')!r}, and this host is "
            f"{arch}; export the image for linux/{arch}"
        )
    rootfs = _field(config, "rootfs", dict, where=at, fix="an image config says its layers' diff_ids")
    assert isinstance(rootfs, dict)
    if rootfs.get("type") != "layers":
        raise ImageError(f"{at}: field 'rootfs.type' is {rootfs.get('type')!r}, not 'layers'")
    diff_ids = rootfs.get("diff_ids")
    if not isinstance(diff_ids, list):
        raise ImageError(f"{at}: field 'rootfs.diff_ids' is not a list of digests")
    ids = tuple(_digest(d, where=at, field=f"rootfs.diff_ids[{i}]") for i, d in enumerate(diff_ids))
    if len(ids) != len(files):
        raise ImageError(
            f"{at}: field 'rootfs.diff_ids' has {len(ids)} entries and the manifest {len(files)} "
            "layers; they must match one to one (the archive is malformed)"
        )
    config_from_oci(config, where=at)  # its runtime fields, checked now
    names = tuple(t for t in tags if isinstance(t, str)) if isinstance(tags, list) else ()
    return _Plan(fmt, config, config_digest, raw, tuple(files), ids, names)


class _Hashing:
    """A file-like reader that hashes what passes through it."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.hash = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.hash.update(data)
        return data


def _unpack_blob(
    src: _Source, name: str, known: str | None, out: IO[bytes], blob_out: IO[bytes], *, where: str
) -> str:
    """Copy layer ``name`` uncompressed into ``out`` (and as stored into
    ``blob_out``); returns the uncompressed sha256, having checked the stored one."""
    with src.open(name) as raw:
        hashing = _Hashing(raw)
        head = hashing.read(4)
        blob_out.write(head)
        diff = hashlib.sha256()
        if head.startswith(ZSTD_MAGIC):
            raise ImageError(
                f"{where}: layer {name!r} is zstd-compressed, which this Python cannot read; "
                "export the image with gzip or uncompressed layers (`docker save` does)"
            )
        if head.startswith(GZIP_MAGIC):
            dec = zlib.decompressobj(wbits=31)
            chunk = head
            try:
                while True:
                    if chunk:
                        data = dec.decompress(chunk)
                        diff.update(data)
                        out.write(data)
                    chunk = hashing.read(1 << 20)
                    if not chunk:
                        break
                    blob_out.write(chunk)
                data = dec.flush()
            except (zlib.error, gzip.BadGzipFile) as exc:
                raise ImageError(
                    f"{where}: layer {name!r} is not valid gzip ({exc}); export the image again"
                ) from None
            diff.update(data)
            out.write(data)
        else:
            diff.update(head)
            out.write(head)
            while chunk := hashing.read(1 << 20):
                blob_out.write(chunk)
                diff.update(chunk)
                out.write(chunk)
    stored = "sha256:" + hashing.hash.hexdigest()
    if known is not None and stored != known:
        raise ImageError(
            f"{where}: layer {name!r} has digest {stored}, not the {known} its manifest says; "
            "the archive is corrupt or altered"
        )
    return "sha256:" + diff.hexdigest()


def import_image(store: ImageStore, path: str | os.PathLike[str], *, name: str | None = None) -> Image:
    """Import the ``docker save`` tarball or OCI layout at ``path``.

    The image's digest is its config's (Docker's image id). Names: ``name``,
    else the archive's own (``RepoTags``, the OCI ref annotation).

    Raises:
        ImageError: the archive is malformed, a digest does not match, or a
            layer writes outside its rootfs; nothing was added to the store.
    """
    src_path = Path(path)
    where = str(src_path)
    with _source(src_path) as src:
        plan = _plan(src, where)
        with store.workdir("import") as work:
            rootfs = work / "rootfs"
            rootfs.mkdir(mode=0o755)
            total = {
                "entries": 0,
                "whiteouts": 0,
                "opaque": 0,
                "devices": 0,
                "setuid": 0,
                "dropped_xattrs": 0,
            }
            blobs: list[tuple[str, Path]] = []
            for i, ((file, known), diff_id) in enumerate(zip(plan.layers, plan.diff_ids, strict=True)):
                what = f"{where}: layer {i} ({file})"
                tar_path = work / f"layer{i}.tar"
                blob_path = work / f"blob{i}"
                with open(tar_path, "w+b") as out, open(blob_path, "wb") as blob_out:
                    got = _unpack_blob(src, file, known, out, blob_out, where=where)
                    if got != diff_id:
                        raise ImageError(
                            f"{what}: uncompressed digest {got} is not the config's "
                            f"rootfs.diff_ids[{i}] {diff_id}; the archive is corrupt or altered"
                        )
                    out.seek(0)
                    counts = apply_layer(out, rootfs, what=what)
                tar_path.unlink()
                blobs.append((known or diff_id, blob_path))
                for key, value in counts.items():
                    total[key] += value
            config_file = work / "config.json"
            config_file.write_bytes(plan.config_raw)
            blobs.append((plan.config_digest, config_file))
            for digest, blob in blobs:
                store.put_blob(digest, blob)
            config = config_from_oci(plan.config, where=where)
            provenance: dict[str, object] = {
                "kind": "import",
                "source": os.path.abspath(where),
                "format": plan.format,
                "layers": [d for d, _ in blobs[:-1]],
                "diff_ids": list(plan.diff_ids),
                "archive_names": list(plan.names),
                "applied": total,
                "approximate": False,
                "fetches": [],
            }
            image = store.add(plan.config_digest, rootfs, config, provenance)
            shutil.rmtree(work / "rootfs", ignore_errors=True)
    for given in [name] if name else list(plan.names):
        store.tag(given, image.digest)
    return store.get(image.digest)


__all__ = ["import_image"]
