"""What an image is: its digest, names, flattened rootfs, config and record.

Pure: nothing here touches the filesystem. The OCI image config is read at the
trust boundary (an imported tarball) by ``config_from_oci``, which names the
offending field of a malformed one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from stockade.errors import ImageError

DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
"""A content digest as the store spells it (OCI image-spec, descriptor.md)."""
NAME = re.compile(r"^[a-z0-9][a-z0-9._/-]{0,199}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?$")
"""A name given at import or build: ``repo[:tag]``, lower case (as Docker's references)."""


def _frozen(labels: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(sorted(labels.items())))


@dataclass(frozen=True, slots=True)
class ImageConfig:
    """The parts of an image's config a cell runs by (OCI image-spec, config.md)."""

    env: tuple[str, ...] = ()
    """``K=V`` entries, in order."""
    workdir: str = ""
    user: str = ""
    """``NAME``, ``UID``, ``UID:GID`` or empty (root, as Docker reads it)."""
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=lambda: _frozen({}))
    exposed: tuple[str, ...] = ()
    """``EXPOSE`` ports (``80/tcp``): recorded only, a cell publishes nothing."""

    def to_json(self) -> dict[str, object]:
        return {
            "env": list(self.env),
            "workdir": self.workdir,
            "user": self.user,
            "entrypoint": list(self.entrypoint),
            "cmd": list(self.cmd),
            "labels": dict(self.labels),
            "exposed": list(self.exposed),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> ImageConfig:
        """The store's own form (written by ``to_json``)."""
        return cls(
            env=_strs(data.get("env"), "env"),
            workdir=str(data.get("workdir") or ""),
            user=str(data.get("user") or ""),
            entrypoint=_strs(data.get("entrypoint"), "entrypoint"),
            cmd=_strs(data.get("cmd"), "cmd"),
            labels=_labels(data.get("labels"), "labels"),
            exposed=_strs(data.get("exposed"), "exposed"),
        )

    def env_map(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for entry in self.env:
            key, _, value = entry.partition("=")
            out[key] = value
        return out


@dataclass(frozen=True, slots=True)
class Image:
    """One image of the store.

    ``rootfs`` is one flattened directory (whiteouts applied) whose files have
    the image's own uids and gids as their real owners on disk. It is
    read-only by convention: a cell shows it as the read-only lower layer of
    an overlay and never writes it; nothing else may either (the store's
    images share unchanged files with the images they were built from, as
    hard links).
    """

    digest: str
    names: tuple[str, ...]
    rootfs: Path
    config: ImageConfig
    provenance: Mapping[str, object]
    """How it was made: ``kind`` (``import``, ``build``, ``base``), where from,
    the Dockerfile and its steps, the base suite, ``fetches`` (every URL),
    ``approximate`` (the base only approximates the ``FROM`` asked for)."""

    @property
    def short(self) -> str:
        return self.digest[7:19]


def config_from_oci(doc: object, *, where: str) -> ImageConfig:
    """The runtime config of an OCI (or Docker) image config document.

    Raises:
        ImageError: a field has the wrong type; the message names it.
    """
    if not isinstance(doc, dict):
        raise ImageError(
            f"{where}: the image config is a {type(doc).__name__}, not a JSON object; "
            "export the image again with `docker save` or `skopeo copy`"
        )
    raw = doc.get("config")
    if raw is None:
        return ImageConfig()
    if not isinstance(raw, dict):
        raise ImageError(
            f"{where}: field 'config' is a {type(raw).__name__}, not an object; "
            "it must be the OCI image config's runtime section"
        )
    exposed = raw.get("ExposedPorts") or {}
    if not isinstance(exposed, dict):
        raise ImageError(
            f"{where}: field 'config.ExposedPorts' is not an object; it must map '80/tcp' to {{}}"
        )
    return ImageConfig(
        env=_strs(raw.get("Env"), f"{where}: field 'config.Env'"),
        workdir=_str(raw.get("WorkingDir"), f"{where}: field 'config.WorkingDir'"),
        user=_str(raw.get("User"), f"{where}: field 'config.User'"),
        entrypoint=_strs(raw.get("Entrypoint"), f"{where}: field 'config.Entrypoint'"),
        cmd=_strs(raw.get("Cmd"), f"{where}: field 'config.Cmd'"),
        labels=_labels(raw.get("Labels"), f"{where}: field 'config.Labels'"),
        exposed=tuple(sorted(str(k) for k in exposed)),
    )


def _str(value: object, what: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ImageError(f"{what} is a {type(value).__name__}, not a string; write it as a JSON string")
    return value


def _strs(value: object, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ImageError(f'{what} is not a list of strings; write it as ["a", "b"]')
    return tuple(value)


def _labels(value: object, what: str) -> Mapping[str, str]:
    if value is None:
        return _frozen({})
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ImageError(f'{what} is not an object of strings; write it as {{"key": "value"}}')
    return _frozen(value)


def check_name(name: str) -> str:
    """A name to give an image; ``:latest`` added when no tag is given.

    Raises:
        ImageError: not a valid ``repo[:tag]``.
    """
    if not NAME.match(name) or name.startswith("sha256"):
        raise ImageError(
            f"image name {name!r} is not a valid name; write lower-case 'repo[:tag]' such as 'myimage:1.0'"
        )
    last = name.rsplit("/", 1)[-1]
    return name if ":" in last else f"{name}:latest"


__all__ = ["DIGEST", "Image", "ImageConfig", "check_name", "config_from_oci"]
