"""Tiny images made in Python: layer tars, OCI layouts and ``docker save``
tarballs, with no registry and no container engine."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Entry:
    """One member of a layer."""

    name: str
    kind: str = "file"  # file dir symlink hardlink chr fifo
    data: bytes = b""
    mode: int = 0o644
    uid: int = 0
    gid: int = 0
    link: str = ""
    dev: tuple[int, int] = (0, 0)
    xattrs: dict[str, str] = field(default_factory=dict)


def layer_tar(entries: Sequence[Entry]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in entries:
            info = tarfile.TarInfo(e.name)
            info.mode, info.uid, info.gid, info.mtime = e.mode, e.uid, e.gid, 1_700_000_000
            info.pax_headers = {f"SCHILY.xattr.{k}": v for k, v in e.xattrs.items()}
            body = None
            if e.kind == "file":
                info.size = len(e.data)
                body = io.BytesIO(e.data)
            elif e.kind == "dir":
                info.type = tarfile.DIRTYPE
            elif e.kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, e.link
            elif e.kind == "hardlink":
                info.type, info.linkname = tarfile.LNKTYPE, e.link
            elif e.kind == "chr":
                info.type = tarfile.CHRTYPE
                info.devmajor, info.devminor = e.dev
            elif e.kind == "fifo":
                info.type = tarfile.FIFOTYPE
            tar.addfile(info, body)
    return buf.getvalue()


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def image_config(layers: Sequence[bytes], **runtime: object) -> bytes:
    return json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": runtime,
            "rootfs": {"type": "layers", "diff_ids": [sha(t) for t in layers]},
        }
    ).encode()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def oci_tarball(
    path: Path,
    layers: Sequence[bytes],
    *,
    config: bytes | None = None,
    gzip_layers: bool = True,
    ref: str | None = "tiny:1",
    tamper: int | None = None,
) -> Path:
    """An OCI image layout as a tar; ``tamper`` flips a byte of that layer's blob
    after its digest was taken."""
    config = config if config is not None else image_config(layers)
    blobs: dict[str, bytes] = {sha(config): config}
    descs = []
    for i, raw in enumerate(layers):
        blob = gzip.compress(raw, mtime=0) if gzip_layers else raw
        digest = sha(blob)
        if tamper == i:
            blob = blob[:-8] + bytes([blob[-8] ^ 1]) + blob[-7:]
        blobs[digest] = blob
        media = "application/vnd.oci.image.layer.v1.tar" + ("+gzip" if gzip_layers else "")
        descs.append({"mediaType": media, "digest": digest, "size": len(blob)})
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": sha(config),
                "size": len(config),
            },
            "layers": descs,
        }
    ).encode()
    blobs[sha(manifest)] = manifest
    mdesc: dict[str, object] = {
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": sha(manifest),
        "size": len(manifest),
    }
    if ref:
        mdesc["annotations"] = {"org.opencontainers.image.ref.name": ref}
    index = json.dumps({"schemaVersion": 2, "manifests": [mdesc]}).encode()
    with tarfile.open(path, "w") as tar:
        _add(tar, "oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
        _add(tar, "index.json", index)
        for digest, blob in blobs.items():
            _add(tar, f"blobs/sha256/{digest[7:]}", blob)
    return path


def docker_tarball(
    path: Path,
    layers: Sequence[bytes],
    *,
    config: bytes | None = None,
    tags: Sequence[str] = ("tiny:docker",),
    manifest: object = None,
    oci_names: bool = False,
    compress: bool = False,
) -> Path:
    """A ``docker save`` tarball of the classic layout (``<id>/layer.tar``), or
    Docker 25's (``blobs/sha256/<hex>``) with ``oci_names``; gzip'd whole with ``compress``."""
    config = config if config is not None else image_config(layers)
    cname = f"{sha(config)[7:]}.json"
    names = [
        f"blobs/sha256/{sha(raw)[7:]}"
        if oci_names
        else f"{hashlib.sha256(raw).hexdigest()[:16]}{i}/layer.tar"
        for i, raw in enumerate(layers)
    ]
    doc = manifest if manifest is not None else [{"Config": cname, "RepoTags": list(tags), "Layers": names}]
    with tarfile.open(path, "w:gz" if compress else "w") as tar:
        _add(tar, "manifest.json", json.dumps(doc).encode())
        _add(tar, cname, config)
        for name, raw in zip(names, layers, strict=True):
            _add(tar, name, raw)
    return path
