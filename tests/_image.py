"""How the tests' images are laid out from this host's own programs.

Two test images are built this way (tests/cell/_image.py, the workbench image
with its hostile parts, and tests/harness/_image.py, the image the harness
puts in a store); both need the same steps: a usrmerged skeleton, the host's
binaries and the libraries ``ldd`` names, hard-linked where it can be (same
filesystem, and the lower layer is never written), and a link for each
program name that did not land at ``usr/bin``. They live here once so that a
fix to one image's layout reaches the other.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

HOST_PATH = "/usr/bin:/usr/sbin:/bin:/sbin"
"""Where a program of the image is looked for on the host."""

SKELETON = ("usr/bin", "usr/sbin", "usr/lib", "usr/lib64", "etc", "tmp", "proc", "dev", "sys", "root")
"""The directories every test image has."""

USRMERGE = (("bin", "usr/bin"), ("sbin", "usr/sbin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"))
"""The links of a usrmerged root: each top directory is its ``usr/`` one."""


def which_host(names: Iterable[str]) -> list[str | None]:
    """Each name's path on the host's system directories (None where it lacks it)."""
    return [shutil.which(name, path=HOST_PATH) for name in names]


def _libraries(binaries: list[str]) -> set[str]:
    """The shared libraries ``ldd`` names for ``binaries``, by real and by given path."""
    out = subprocess.run(["ldd", *binaries], capture_output=True, text=True, check=False).stdout
    libs: set[str] = set()
    for line in out.splitlines():
        for part in line.split():
            if part.startswith("/") and os.path.exists(part):
                libs.add(os.path.realpath(part))
                libs.add(os.path.normpath(part))
    return libs


def _place(src: str, root: Path) -> None:
    """The host's ``src`` at the same path under ``root``: a link stays a link,
    a file is hard-linked (copied across filesystems); present ones are kept."""
    dst = root / src.lstrip("/")
    if dst.exists() or dst.is_symlink():
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    if os.path.islink(src):
        os.symlink(os.readlink(src), dst)
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def lay_out_root(rootfs: Path, extra_dirs: Sequence[str] = ()) -> None:
    """The skeleton and ``extra_dirs`` under ``rootfs``, with the usrmerge links."""
    for name in (*SKELETON, *extra_dirs):
        (rootfs / name).mkdir(parents=True, exist_ok=True)
    for link, target in USRMERGE:
        os.symlink(target, rootfs / link)


def place_files(rootfs: Path, files: Sequence[str], libraries_of: Sequence[str]) -> None:
    """``files`` under ``rootfs``, and the libraries that ``libraries_of`` load."""
    for path in (*files, *_libraries(list(libraries_of))):
        _place(path, rootfs)


def link_program_names(
    rootfs: Path,
    names: Sequence[str],
    found: Sequence[str | None],
    present_in: Sequence[str] = ("usr/bin",),
) -> None:
    """A ``usr/bin/<name>`` link to each found program's real file, unless the
    name is already in one of the ``present_in`` directories (a program whose
    real name differs, such as ``sh`` for ``dash``, gets its own name this way)."""
    for name, path in zip(names, found, strict=True):
        if path and not any((rootfs / where / name).exists() for where in present_in):
            os.symlink(os.path.realpath(path), rootfs / "usr/bin" / name)


__all__ = ["HOST_PATH", "lay_out_root", "link_program_names", "place_files", "which_host"]
