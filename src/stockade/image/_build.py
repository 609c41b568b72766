"""``stockade image build``: an image from a Dockerfile, with no container engine.

The base comes from ``_base`` (mmdebstrap, cached). Every step that changes
files makes an image of its own in the store: the parent's rootfs copied as
hard links, the step's changes applied on top (``_tree.apply_upper``), so the
next ``RUN`` has a whole rootfs to stand on and a rebuild finds each step in
the cache. Config-only instructions (``ENV``, ``USER``, ``LABEL``, ``CMD``…)
change the config the next step sees and the final image carries.

Each ``RUN`` runs in a **build cell**: ``Cell(build_policy(), image=<the
image so far>, upper_dir=<the step's upper>)`` as ``root`` of a user
namespace mapped to an unprivileged host range, every other layer of a cell
in place, its only way out the gateway, which lets it reach Debian's archive,
PyPI and npm and nothing else, and records every request: the image's record
lists every URL it was built from.

Step caching by content hash: the parent image's digest, the instruction as
substituted, the config it runs with, the build arguments in effect and, for
``COPY``/``ADD``, the hash of every source file (path, mode, bytes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import hashlib
import json
import os
import stat
import tarfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from stockade.errors import ImageError
from stockade.image._base import DEFAULT_PATH, base_image, choose_base
from stockade.image._dockerfile import (
    Dockerfile,
    Instruction,
    key_values,
    parse_dockerfile,
    substitute,
    words,
)
from stockade.image._layers import apply_layer
from stockade.image._model import Image, ImageConfig
from stockade.image._store import ImageStore
from stockade.image._tree import (
    Root,
    apply_upper,
    copy_tree_linked,
    file_sha256,
    openat2,
    remove_at,
    tree_digest,
)

if TYPE_CHECKING:
    from stockade.cell._cell import CellNetwork
    from stockade.policy import Policy
    from stockade.record import Event

BUILD_HOSTS = (
    "deb.debian.org",
    "security.debian.org",
    "pypi.org",
    "files.pythonhosted.org",
    "registry.npmjs.org",
)
"""What a build cell may reach through the gateway: Debian's archive, PyPI and npm."""
BUILD_NETWORKS = ("203.0.113.0/24",)
"""On the machines stockade is developed on, every registry's name resolves to
one address of this documentation range (../shared/HOST.md, "Package
registries from inside a cell"); the gateway refuses that range unless a
policy names it, so the build policy does. Only the build policy: the
default policy never names it (docs/IMAGES.md says how another policy may).
On any other host these names resolve to public addresses and this entry
matches nothing."""
STEP_TIMEOUT = 1800.0
STOP_TIMEOUT = 10.0
LAYER_STEPS = ("RUN", "COPY", "ADD", "WORKDIR")

Log = Callable[[str], None]


def build_policy(*, user: str = "root", extra_hosts: Sequence[str] = ()) -> Policy:
    """The policy of a build cell: root of its own user namespace, the gateway
    to the registries only, the default policy's limits with half an hour per step."""
    from stockade.policy import default_policy
    from stockade.policy._model import EnvPolicy, FilesystemPolicy, HostRule, NetworkPolicy

    base = default_policy("image-build")
    # ``paths: ["/"]`` allows every path and makes the gateway terminate TLS
    # (with the run's own CA, which only the cell trusts): it then sees, and
    # records, each URL of an HTTPS fetch, where a tunnel shows only the host.
    rules = tuple(HostRule(h, ports=(80, 443), paths=("/",)) for h in (*BUILD_HOSTS, *extra_hosts))
    rules += tuple(HostRule(n, ports=(80, 443)) for n in BUILD_NETWORKS)
    fields = {f.name for f in dataclasses.fields(base)}
    changes: dict[str, object] = {
        "network": NetworkPolicy(allow=rules),
        # None of the host's paths: the image's own /etc/shadow is the
        # image's, and a deny or protect entry in it would make its directory
        # a hole in the cell's write grant (apt replaces files in /etc).
        "filesystem": FilesystemPolicy(),
        "env": EnvPolicy(),
        "limits": dataclasses.replace(base.limits, timeout=STEP_TIMEOUT, output=64 * 1024 * 1024),
    }
    if "user" in fields:
        changes["user"] = user
    return dataclasses.replace(base, **changes)


@dataclass
class _State:
    dockerfile: Dockerfile
    image: Image
    config: ImageConfig
    args: dict[str, str] = field(default_factory=dict)
    steps: list[dict[str, object]] = field(default_factory=list)
    fetches: list[str] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        """What ``$VAR`` means at this point: the build arguments, then the config's env over them."""
        return {**self.args, **self.config.env_map()}


def build_image(
    store: ImageStore,
    context: str | os.PathLike[str],
    *,
    dockerfile: str | os.PathLike[str] | None = None,
    name: str | None = None,
    build_args: Mapping[str, str] | None = None,
    extra_hosts: Sequence[str] = (),
    no_cache: bool = False,
    log: Log | None = None,
) -> Image:
    """Build the image of ``dockerfile`` (``CONTEXT/Dockerfile``) in ``context``.

    Raises:
        ImageError: the Dockerfile is malformed or unsupported (``file:line``),
            a source is outside the context, a step failed (exit 1), or the
            base could not be made.
    """
    say = log or (lambda _line: None)
    ctx = Path(context).resolve()
    if not ctx.is_dir():
        raise ImageError(
            f"build context {str(context)!r} is not a directory; give the directory the "
            "Dockerfile's COPY sources are in",
            exit_code=6,
        )
    path = Path(dockerfile) if dockerfile is not None else ctx / "Dockerfile"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ImageError(
            f"Dockerfile {str(path)!r} cannot be read ({exc.strerror}); give one with -f", exit_code=6
        ) from None
    parsed = parse_dockerfile(text, source=str(path))
    given = dict(build_args or {})
    started = time.time()
    pre_args: dict[str, str] = {}
    index = 0
    for index, ins in enumerate(parsed.instructions):  # noqa: B007 (used after the loop)
        if ins.keyword == "FROM":
            break
        for arg_name, default in _arg_pairs(ins, pre_args, parsed):
            pre_args[arg_name] = given.get(arg_name, default)
    from_ins = parsed.instructions[index]
    ref = substitute(from_ins.rest, pre_args, escape=from_ins.escape, where=parsed.where(from_ins))
    base, base_record = _from(store, ref, parsed.where(from_ins), flags=from_ins.flags, say=say)
    state = _State(parsed, base, base.config)
    state.fetches.extend(_strings(base.provenance.get("fetches")))
    for ins in parsed.instructions[index + 1 :]:
        _step(store, state, ins, ctx, given, extra_hosts=extra_hosts, no_cache=no_cache, say=say)
    final = _finish(store, state)
    provenance: dict[str, object] = {
        "kind": "build",
        "dockerfile": str(path.resolve()),
        "dockerfile_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "context": str(ctx),
        "from": ref,
        "base": base_record,
        "approximate": bool(base_record.get("approximate")),
        "build_args": dict(sorted(given.items())),
        "steps": state.steps,
        "fetches": state.fetches,
        "started": started,
        "duration": round(time.time() - started, 3),
    }
    image = _record(store, final, provenance)
    if name:
        store.tag(name, image.digest)
    return store.get(image.digest)


def _strings(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def _from(
    store: ImageStore, ref: str, where: str, *, flags: Mapping[str, str], say: Log
) -> tuple[Image, dict[str, object]]:
    platform = flags.get("platform")
    if platform is not None and platform not in ("linux/amd64", "$BUILDPLATFORM", "$TARGETPLATFORM"):
        raise ImageError(
            f"FROM --platform={platform} is not this host's linux/amd64; remove the flag", location=where
        )
    try:
        image = store.get(ref)
    except ImageError:
        pass
    else:
        say(f"FROM {ref}: the store's {image.short}")
        approximate = bool(image.provenance.get("approximate"))
        return image, {"ref": ref, "digest": image.digest, "source": "store", "approximate": approximate}
    if ref == "scratch":
        with store.workdir("scratch") as work:
            rootfs = work / "rootfs"
            rootfs.mkdir(mode=0o755)
            config = ImageConfig(env=(f"PATH={DEFAULT_PATH}",))
            digest = _digest({"scratch": True, "config": config.to_json()})
            image = store.add(
                digest, rootfs, config, {"kind": "scratch", "approximate": False, "fetches": []}
            )
        return image, {"ref": ref, "digest": image.digest, "source": "scratch", "approximate": False}
    choice = choose_base(ref)
    image, cached = base_image(store, choice, log=say)
    say(
        f"FROM {ref}: Debian {choice.suite} base {image.short}{' (cached)' if cached else ''}"
        f"{' — approximate: ' + choice.reason if choice.approximate else ''}"
    )
    return image, {
        "ref": ref,
        "digest": image.digest,
        "source": "mmdebstrap",
        "suite": choice.suite,
        "variant": choice.variant,
        "packages": list(choice.packages),
        "approximate": choice.approximate,
        "reason": choice.reason,
        "cached": cached,
    }


def _arg_pairs(ins: Instruction, env: Mapping[str, str], parsed: Dockerfile) -> list[tuple[str, str]]:
    if ins.keyword != "ARG":
        return []
    out = []
    for word in words(ins.rest, env, escape=ins.escape, where=parsed.where(ins)):
        arg_name, _, default = word.partition("=")
        if not arg_name.replace("_", "a").isalnum():
            raise ImageError(f"ARG {word!r} is not NAME or NAME=DEFAULT", location=parsed.where(ins))
        out.append((arg_name, default))
    return out


def _digest(data: object) -> str:
    return "sha256:" + hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _step(
    store: ImageStore,
    state: _State,
    ins: Instruction,
    ctx: Path,
    given: Mapping[str, str],
    *,
    extra_hosts: Sequence[str],
    no_cache: bool,
    say: Log,
) -> None:
    where = state.dockerfile.where(ins)
    env = state.env()
    cfg = state.config
    if ins.keyword == "ARG":
        for arg_name, default in _arg_pairs(ins, env, state.dockerfile):
            state.args[arg_name] = given.get(arg_name, default)
        return
    if ins.keyword == "ENV":
        pairs = dict(key_values(ins.rest, env, keyword="ENV", escape=ins.escape, where=where))
        kept = tuple(e for e in cfg.env if e.partition("=")[0] not in pairs)
        state.config = dataclasses.replace(cfg, env=kept + tuple(f"{k}={v}" for k, v in pairs.items()))
        return
    if ins.keyword == "LABEL":
        labels = dict(cfg.labels)
        labels.update(key_values(ins.rest, env, keyword="LABEL", escape=ins.escape, where=where))
        state.config = dataclasses.replace(cfg, labels=labels)
        return
    if ins.keyword == "USER":
        state.config = dataclasses.replace(
            cfg, user=substitute(ins.rest, env, escape=ins.escape, where=where)
        )
        return
    if ins.keyword == "EXPOSE":
        ports = [p if "/" in p else f"{p}/tcp" for p in words(ins.rest, env, escape=ins.escape, where=where)]
        state.config = dataclasses.replace(cfg, exposed=tuple(sorted({*cfg.exposed, *ports})))
        return
    if ins.keyword in ("CMD", "ENTRYPOINT"):
        argv = ins.exec_form if ins.exec_form is not None else ("/bin/sh", "-c", ins.rest)
        if ins.keyword == "CMD":
            state.config = dataclasses.replace(cfg, cmd=argv)
        else:
            # As Docker: a new ENTRYPOINT drops the CMD inherited from the base.
            state.config = dataclasses.replace(cfg, entrypoint=argv, cmd=())
        return
    if ins.keyword == "WORKDIR":
        target = substitute(ins.rest, env, escape=ins.escape, where=where)
        target = os.path.normpath(os.path.join(cfg.workdir or "/", target))
        state.config = dataclasses.replace(cfg, workdir=target)
        if _exists_in(state.image.rootfs, target):
            return
        _layer(store, state, ins, {"path": target}, lambda root: _mkdir(root, target, where), no_cache, say)
        return
    if ins.keyword in ("COPY", "ADD"):
        _copy(store, state, ins, ctx, env, no_cache=no_cache, say=say)
        return
    if ins.keyword == "RUN":
        argv = ins.exec_form if ins.exec_form is not None else ("/bin/sh", "-c", ins.rest)
        fetched: list[str] = []

        def run(root: Path, upper: Path) -> str:
            fetched.extend(_run_cell(state, ins, argv, upper, extra_hosts=extra_hosts, say=say))
            apply_upper(upper, root)
            return tree_digest(upper)

        _layer(
            store,
            state,
            ins,
            {"argv": list(argv), "args": dict(sorted(state.args.items()))},
            run,
            no_cache,
            say,
            fetches=fetched,
            wants_upper=True,
        )
        return
    raise ImageError(f"instruction {ins.keyword} has no build step here", location=where)  # parser prevents


def _exists_in(rootfs: Path, path: str) -> bool:
    with Root(rootfs) as root:
        try:
            os.close(openat2(root.fd, path.lstrip("/") or ".", os.O_PATH))
            return True
        except OSError:
            return False


def _mkdir(root: Path, target: str, where: str) -> str:
    rel = target.strip("/")
    with Root(root) as rootfs:
        pfd, base = rootfs.parent(rel + "/x", what=where, create=True)
        os.close(pfd)
        del base
    return _digest({"mkdir": target})


def _layer(
    store: ImageStore,
    state: _State,
    ins: Instruction,
    what: Mapping[str, object],
    apply: Callable[..., str],
    no_cache: bool,
    say: Log,
    *,
    fetches: list[str] | None = None,
    wants_upper: bool = False,
) -> None:
    where = state.dockerfile.where(ins)
    key = hashlib.sha256(json.dumps({
        "parent": state.image.digest, "keyword": ins.keyword, "what": what, "config": state.config.to_json(),
        "v": 1,
    }, sort_keys=True).encode()).hexdigest()  # fmt: skip
    label = f"{ins.keyword} {ins.rest}"[:120]
    hit = None if no_cache else store.cache_get("steps", key)
    if hit is not None:
        image = store.get(hit)
        say(f"{where}: {label} (cached {image.short})")
        prov = store.meta(hit).get("provenance")
        record = prov.get("step") if isinstance(prov, dict) else None
        step = dict(record) if isinstance(record, dict) else {}
        step["cached"] = True
        state.steps.append(step)
        state.fetches.extend(_strings(step.get("fetches")))
        state.image = image
        return
    say(f"{where}: {label}")
    began = time.monotonic()
    with store.workdir("step") as work:
        rootfs = work / "rootfs"
        copy_tree_linked(state.image.rootfs, rootfs)
        if wants_upper:
            upper = work / "upper"
            upper.mkdir(mode=0o700)
            layer = apply(rootfs, upper)
        else:
            layer = apply(rootfs)
        digest = _digest({"parent": state.image.digest, "layer": layer, "config": state.config.to_json()})
        made: dict[str, object] = {
            "line": ins.line,
            "instruction": label,
            "layer": layer,
            "digest": digest,
            "seconds": round(time.monotonic() - began, 3),
            "fetches": list(fetches or ()),
            "cached": False,
        }
        image = store.add(
            digest,
            rootfs,
            state.config,
            {"kind": "step", "step": made, "approximate": False, "fetches": list(fetches or ())},
            parent=state.image.digest,
        )
    store.cache_put("steps", key, image.digest, line=ins.line)
    state.steps.append(made)
    state.fetches.extend(fetches or ())
    state.image = image


def _finish(store: ImageStore, state: _State) -> Image:
    """The last image with the final config (a copy of its rootfs as links when only the config changed)."""
    if state.config == state.image.config:
        return state.image
    digest = _digest({"parent": state.image.digest, "layer": None, "config": state.config.to_json()})
    try:
        return store.get(digest)
    except ImageError:
        pass
    with store.workdir("config") as work:
        rootfs = work / "rootfs"
        copy_tree_linked(state.image.rootfs, rootfs)
        return store.add(
            digest,
            rootfs,
            state.config,
            {"kind": "config", "approximate": False, "fetches": []},
            parent=state.image.digest,
        )


def _record(store: ImageStore, image: Image, provenance: Mapping[str, object]) -> Image:
    """Give the final image the build's whole record (its image.json rewritten)."""
    from stockade.image._store import write_json

    with store.locked():
        meta = store.meta(image.digest)
        meta["provenance"] = dict(provenance)
        write_json(store.images_dir / image.digest[7:] / "image.json", meta)
    return store.get(image.digest)


# ----------------------------------------------------------------- COPY / ADD


def _copy(
    store: ImageStore,
    state: _State,
    ins: Instruction,
    ctx: Path,
    env: Mapping[str, str],
    *,
    no_cache: bool,
    say: Log,
) -> None:
    where = state.dockerfile.where(ins)
    items = (
        list(ins.exec_form)
        if ins.exec_form is not None
        else words(ins.rest, env, escape=ins.escape, where=where)
    )
    if len(items) < 2:
        raise ImageError(f"{ins.keyword} needs a source and a destination", location=where)
    *sources, dest = items
    dest_abs = dest if dest.startswith("/") else os.path.join(state.config.workdir or "/", dest)
    into_dir = dest.endswith("/") or len(sources) > 1
    owner = _owner(state.image.rootfs, ins.flags.get("chown"), where)
    chmod = _chmod(ins.flags.get("chmod"), where)
    files: list[tuple[Path, str]] = []  # (host path, path in the image)
    real_ctx = os.path.realpath(ctx)
    for src in sources:
        clean = os.path.normpath(src.lstrip("/"))
        if clean.startswith(".."):
            raise ImageError(
                f"{ins.keyword} source {src!r} is outside the build context {ctx}; "
                "copy it into the context first",
                location=where,
            )
        matches = sorted(glob.glob(clean, root_dir=ctx)) if glob.has_magic(clean) else [clean]
        if not matches or not os.path.lexists(ctx / matches[0]):
            raise ImageError(
                f"{ins.keyword} source {src!r} is not in the build context {ctx}", location=where, exit_code=6
            )
        for match in matches:
            host = ctx / match
            real = os.path.realpath(host)
            if real != real_ctx and not real.startswith(real_ctx + "/"):
                raise ImageError(
                    f"{ins.keyword} source {src!r} leads out of the build context ({real}); "
                    "copy the file itself into the context",
                    location=where,
                )
            if ins.keyword == "ADD" and host.is_file() and _is_archive(host):
                files.append((host, dest_abs.rstrip("/") or "/"))
                continue
            if host.is_dir() and not host.is_symlink():
                for sub, _st in _walk_dir(host):
                    files.append((host / sub, os.path.join(dest_abs, sub)))
                into_dir = True
                files.append((host, dest_abs.rstrip("/") or "/"))
            else:
                target = (
                    os.path.join(dest_abs, os.path.basename(match))
                    if into_dir or dest.endswith("/") or _is_dir_in(state.image.rootfs, dest_abs)
                    else dest_abs
                )
                files.append((host, target))
    digests = []
    for host, target in files:
        st = os.lstat(host)
        content = (
            file_sha256(str(host))
            if stat.S_ISREG(st.st_mode)
            else os.readlink(host)
            if stat.S_ISLNK(st.st_mode)
            else "dir"
        )
        digests.append(
            [str(host.relative_to(ctx)) if host != ctx else ".", target, stat.S_IMODE(st.st_mode), content]
        )
    what = {"sources": digests, "owner": list(owner), "chmod": chmod}

    def apply(root: Path) -> str:
        with Root(root) as rootfs:
            for host, target in files:
                if (
                    ins.keyword == "ADD"
                    and host.is_file()
                    and _is_archive(host)
                    and target == dest_abs.rstrip("/")
                ):
                    _extract_into(rootfs, host, target, where)
                else:
                    _put(rootfs, host, target, owner, chmod, where)
        return _digest(what)

    _layer(store, state, ins, what, apply, no_cache, say)


def _walk_dir(top: Path) -> Iterator[tuple[str, os.stat_result]]:
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            full = os.path.join(dirpath, name)
            yield os.path.relpath(full, top), os.lstat(full)


def _is_dir_in(rootfs: Path, path: str) -> bool:
    with Root(rootfs) as root:
        try:
            fd = openat2(root.fd, path.strip("/") or ".", os.O_PATH | os.O_DIRECTORY)
        except OSError:
            return False
        os.close(fd)
        return True


def _is_archive(path: Path) -> bool:
    try:
        return tarfile.is_tarfile(path)
    except OSError:
        return False


def _put(
    rootfs: Root, host: Path, target: str, owner: tuple[int, int], chmod: int | None, where: str
) -> None:
    rel = target.strip("/")
    st = os.lstat(host)
    if not rel:
        return
    pfd, base = rootfs.parent(rel, what=where, create=True)
    try:
        if stat.S_ISDIR(st.st_mode):
            try:
                cur = os.stat(base, dir_fd=pfd, follow_symlinks=False)
                if not stat.S_ISDIR(cur.st_mode):
                    remove_at(pfd, base)
                    os.mkdir(base, 0o755, dir_fd=pfd)
            except FileNotFoundError:
                os.mkdir(base, 0o755, dir_fd=pfd)
            fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=pfd)
            try:
                os.fchown(fd, *owner)
                os.fchmod(fd, chmod if chmod is not None else stat.S_IMODE(st.st_mode))
            finally:
                os.close(fd)
            return
        remove_at(pfd, base)  # a new inode: the parent image's file is a hard link to this one
        if stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(host), base, dir_fd=pfd)
            os.chown(base, *owner, dir_fd=pfd, follow_symlinks=False)
            return
        fd = os.open(
            base, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=pfd
        )
        try:
            with open(host, "rb") as src, os.fdopen(os.dup(fd), "wb") as out:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
            os.fchown(fd, *owner)
            os.fchmod(fd, chmod if chmod is not None else stat.S_IMODE(st.st_mode))
            os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(fd)
    finally:
        os.close(pfd)


def _extract_into(rootfs: Root, archive: Path, target: str, where: str) -> None:
    """ADD of a local tar: extracted at ``target`` with the layer unpacker's checks."""
    rel = target.strip("/")
    if rel:
        pfd, base = rootfs.parent(rel + "/x", what=where, create=True)
        os.close(pfd)
        del base
    import gzip
    import lzma

    with open(archive, "rb") as raw:
        head = raw.read(6)
    opener: Callable[[Path], object] = (
        gzip.open if head.startswith(b"\x1f\x8b") else lzma.open if head.startswith(b"\xfd7zXZ") else open
    )
    with opener(archive) as f:  # type: ignore[attr-defined]
        data = f.read()
    import io

    dest = rootfs.path / rel if rel else rootfs.path
    # rel was opened beneath the rootfs just now; its realpath stays inside it.
    real = os.path.realpath(dest)
    if real != str(rootfs.path) and not real.startswith(str(rootfs.path) + "/"):
        raise ImageError(f"ADD destination {target!r} leads out of the image", location=where)
    apply_layer(io.BytesIO(data), Path(real), what=f"{where}: ADD {archive.name}")


def _owner(rootfs: Path, chown: str | None, where: str) -> tuple[int, int]:
    if not chown:
        return 0, 0
    user, _, group = chown.partition(":")
    uid = _id(rootfs, "passwd", user, where) if user else 0
    gid = _id(rootfs, "group", group, where) if group else (_primary_gid(rootfs, user) if user else 0)
    return uid, gid


def _image_file(rootfs: Path, name: str) -> str:
    with Root(rootfs) as root:
        try:
            fd = openat2(root.fd, f"etc/{name}", os.O_RDONLY)
        except OSError:
            return ""
        with os.fdopen(fd, "rb") as f:
            return f.read(1 << 20).decode("utf-8", "replace")


def _id(rootfs: Path, table: str, value: str, where: str) -> int:
    if value.isdigit():
        return int(value)
    for line in _image_file(rootfs, table).splitlines():
        parts = line.split(":")
        if len(parts) >= 3 and parts[0] == value and parts[2].isdigit():
            return int(parts[2])
    raise ImageError(
        f"--chown {value!r} is not in the image's /etc/{table}; give a number or a name it has",
        location=where,
    )


def _primary_gid(rootfs: Path, user: str) -> int:
    for line in _image_file(rootfs, "passwd").splitlines():
        parts = line.split(":")
        if len(parts) >= 4 and (parts[0] == user or parts[2] == user) and parts[3].isdigit():
            return int(parts[3])
    return int(user) if user.isdigit() else 0


def _chmod(value: str | None, where: str) -> int | None:
    if value is None:
        return None
    try:
        mode = int(value, 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o7777:
        raise ImageError(f"--chmod={value} is not an octal mode; write e.g. --chmod=0755", location=where)
    return mode


# ----------------------------------------------------------------- RUN


def _run_cell(
    state: _State, ins: Instruction, argv: Sequence[str], upper: Path, *, extra_hosts: Sequence[str], say: Log
) -> list[str]:
    """Run ``argv`` in a build cell on the image so far; its upper kept in ``upper``.
    Returns the URLs fetched (every request the gateway let through).

    Raises:
        ImageError: the command failed (exit 1), or workbench cells are not here.
    """
    import inspect

    from stockade.cell._cell import Cell

    where = state.dockerfile.where(ins)
    if "image" not in inspect.signature(Cell.__init__).parameters:
        raise ImageError(
            "RUN needs workbench cells (Cell(image=…)), which this build of stockade lacks; "
            "build with only COPY/ADD/ENV-type steps, or update stockade",
            location=where,
        )
    policy = build_policy(user=state.config.user or "root", extra_hosts=extra_hosts)
    image = dataclasses.replace(state.image, config=state.config)
    # Build arguments are in RUN's environment and in no image (as Docker).
    extra = {k: v for k, v in state.args.items() if k not in state.config.env_map()}
    # The step's own workspace, beside its upper in the store's private work
    # directory: no other host user can reach it, so the cell may set setuid
    # bits (`chmod 4755`, routine in Dockerfiles; _workbench.private_places),
    # which a fresh workspace under the shared workspaces directory may not.
    workspace = upper.parent / "workspace"
    workspace.mkdir(mode=0o700, exist_ok=True)
    with _gateway(policy) as (gateway, events):
        network = _OutsideEtc(gateway)
        cell = Cell(
            policy,
            image=image,
            upper_dir=upper,
            network=network,
            extra_env=extra,
            workspace=workspace,
        )
        lines: list[bytes] = []

        def output(_stream: int, chunk: bytes) -> None:
            lines.append(chunk)
            for text in chunk.decode(errors="replace").splitlines():
                say(f"  | {text}")

        result = cell.run(list(argv), on_output=output)
        gateway_events = list(events)
    fetches = _fetch_urls(gateway_events)
    refused = [e.summary for e in gateway_events if e.outcome == "denied"]
    refused += [e.summary for e in result.events if e.outcome == "denied"]
    if result.exit_code != 0:
        tail = b"".join(lines).decode(errors="replace").strip().splitlines()[-3:]
        extra_note = f"; refused: {refused[0]}" if refused else ""
        if result.timed_out:
            extra_note += f"; it ran out of its {STEP_TIMEOUT:.0f} s"
        raise ImageError(
            f"RUN {' '.join(argv)[:80]!r} failed with exit code {result.exit_code} "
            f"({' / '.join(tail) or 'no output'}){extra_note}; fix the command (its output is above)",
            location=where,
            exit_code=1,
        )
    return fetches


def _fetch_urls(events: Sequence[Event]) -> list[str]:
    """Every request the gateway let through, as a URL (a TLS tunnel's is
    ``https://host:port`` with no path: the gateway sees no more of it)."""
    urls = []
    for event in events:
        if event.kind != "http.request" or event.outcome != "allowed":
            continue
        d = event.detail
        scheme = "https" if d.get("scheme") == "tunnel" else str(d.get("scheme") or "http")
        port = d.get("port")
        default = {"http": 80, "https": 443}.get(scheme)
        host = f"{d.get('host')}" + (f":{port}" if port and port != default else "")
        path = str(d.get("path") or "") if d.get("scheme") != "tunnel" else ""
        urls.append(f"{d.get('method')} {scheme}://{host}{path}")
    return urls


class _OutsideEtc:
    """The gateway as a build cell sees it: its CA bundle only where the
    variables it sets point (``/run/stockade/…``: ``SSL_CERT_FILE``,
    ``PIP_CERT``, ``REQUESTS_CA_BUNDLE``, ``NODE_EXTRA_CA_CERTS``…), not also
    over the image's ``/etc/ssl/certs/ca-certificates.crt``. A file shown in
    ``/etc`` makes ``/etc`` a directory of holes in the cell's write grant,
    and a build's ``useradd`` or a package's new ``/etc/foo`` must write there."""

    def __init__(self, inner: CellNetwork) -> None:
        self._inner = inner

    def env(self) -> Mapping[str, str]:
        return self._inner.env()

    def files(self) -> Mapping[str, bytes]:
        return {path: data for path, data in self._inner.files().items() if not path.startswith("/etc/")}

    def attach(self, cell_id: str, netns_fd: int) -> Callable[[], None]:
        return self._inner.attach(cell_id, netns_fd)


@contextlib.contextmanager
def _gateway(policy: Policy) -> Iterator[tuple[CellNetwork, list[Event]]]:
    """A gateway for one build cell on a loop of its own (as ``stockade exec``'s)."""
    import asyncio
    import secrets
    from collections.abc import Sequence as Seq

    from stockade.gateway import Gateway, GatewayOptions

    events: list[Event] = []
    lock = threading.Lock()

    class Hooks:
        async def record(self, batch: Seq[Event]) -> None:
            with lock:
                events.extend(batch)

        async def denied(self) -> None:
            return None

        def halted(self) -> str | None:
            return None

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="stockade-build-gateway", daemon=True)
    thread.start()
    try:
        gateway = Gateway(
            policy,
            run_id="",
            token=secrets.token_urlsafe(24),
            hooks=Hooks(),
            loop=loop,
            environ=os.environ,
            options=GatewayOptions.from_env(os.environ),
        )
        try:
            yield gateway, events
        finally:
            asyncio.run_coroutine_threadsafe(gateway.close(), loop).result(STOP_TIMEOUT)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(STOP_TIMEOUT)
        loop.close()


__all__ = ["BUILD_HOSTS", "BUILD_NETWORKS", "build_image", "build_policy"]
