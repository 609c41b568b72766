"""A small workbench image for tests, made from this host's own programs.

No registry and no image store: a root filesystem with a shell, a few
coreutils, Python and their libraries, hard-linked from the host where it
can be (same filesystem, and the lower layer is never written), plus an
/etc of its own. Built once per machine and content (under /var/tmp) and
reused: about a second the first time.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

from stockade.image import Image, ImageConfig
from tests._image import lay_out_root, link_program_names, place_files, which_host

PROGRAMS = (
    "sh",
    "dash",
    "bash",
    "cat",
    "ls",
    "id",
    "touch",
    "mkdir",
    "rm",
    "rmdir",
    "chown",
    "chmod",
    "stat",
    "ln",
    "mknod",
    "cp",
    "mv",
    "env",
    "echo",
    "true",
    "false",
    "head",
    "readlink",
    "whoami",
    "mount",
    "umount",
    "unshare",
    "dd",
    "printf",
    "test",
    "wc",
    "grep",
    "su",
    "dpkg",
    "dpkg-deb",
    "tar",
    "find",
    "diff",
    "ldconfig",
    "ldconfig.real",
    "start-stop-daemon",
    "dpkg-query",
    "dpkg-split",
    "dpkg-divert",
    "dpkg-trigger",
    "dpkg-maintscript-helper",
    "tail",
    "sed",
    "useradd",
)
"""Host programs copied into the image (those the host has)."""

ROOT = Path("/var/tmp/stockade-test-images")

PASSWD = (
    "root:x:0:0:root:/root:/bin/sh\n"
    "daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n"
    "builder:x:1234:1234:image user:/home/builder:/bin/sh\n"
    # A hostile entry: a name that claims uid 0 (as a task's image might).
    "agent:x:0:0:claims root:/root:/bin/sh\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
)
GROUP = "root:x:0:\ndaemon:x:1:\nbuilder:x:1234:\nstaff:x:50:\nnogroup:x:65534:\n"


def _python_files() -> list[str]:
    """The stdlib of the host's /usr/bin/python3 (the cell runs that one)."""
    lib = "/usr/lib/python3.11"
    found = []
    for dirpath, dirnames, filenames in os.walk(lib):
        dirnames[:] = [d for d in dirnames if d not in ("test", "idlelib", "tkinter", "ensurepip")]
        found.extend(os.path.join(dirpath, f) for f in filenames)
    return found


def build_rootfs() -> Path:
    """The test image's root filesystem (built once, then reused)."""
    binaries = [p for p in which_host(PROGRAMS) if p]
    binaries.append("/usr/bin/python3.11")
    binaries = [os.path.realpath(b) for b in binaries]
    key = hashlib.sha256(("\n".join(sorted(binaries)) + PASSWD + GROUP + "v7").encode()).hexdigest()[:16]
    done = ROOT / key / "rootfs"
    if done.is_dir():
        return done
    tmp = ROOT / f"{key}.tmp-{os.getpid()}"
    rootfs = tmp / "rootfs"
    rootfs.mkdir(parents=True)
    lay_out_root(rootfs, ("home/builder", "var/lib/dpkg", "var/tmp", "run", "opt/app", "srv"))
    python = _python_files()
    modules = [p for p in python if p.endswith(".so")]  # lib-dynload: _ctypes needs libffi
    place_files(rootfs, [*binaries, *python], libraries_of=[*binaries, *modules])
    link_program_names(rootfs, PROGRAMS, which_host(PROGRAMS))
    if not (rootfs / "usr/bin/python3").exists():
        os.symlink("python3.11", rootfs / "usr/bin/python3")
    (rootfs / "etc/passwd").write_text(PASSWD)
    (rootfs / "etc/group").write_text(GROUP)
    (rootfs / "etc/shadow").write_text("root:*:19000:0:99999:7:::\n")
    (rootfs / "etc/sudoers").write_text("ALL ALL=(ALL) NOPASSWD: ALL\n")
    (rootfs / "etc/hostname").write_text("task-image\n")
    # What shadow's useradd reads (the host's own, as its programs are).
    for name in ("login.defs", "default/useradd"):
        if os.path.exists(f"/etc/{name}"):
            (rootfs / "etc" / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f"/etc/{name}", rootfs / "etc" / name)
    (rootfs / "etc/skel").mkdir(exist_ok=True)
    (rootfs / "var/lib/dpkg/status").write_text("")
    (rootfs / "var/lib/dpkg/available").write_text("")
    for name in ("updates", "info", "triggers", "alternatives"):
        (rootfs / "var/lib/dpkg" / name).mkdir(exist_ok=True)
    (rootfs / "root").chmod(0o700)
    (rootfs / "tmp").chmod(0o1777)
    os.chown(rootfs / "home/builder", 1234, 1234)
    (rootfs / "home/builder/notes.txt").write_text("the image user's own file\n")
    os.chown(rootfs / "home/builder/notes.txt", 1234, 1234)
    (rootfs / "opt/app/data.txt").write_text("image data\n")
    # Hostile parts of a task's image: a setuid-root copy of a shell, a link
    # to the host's secrets, a device node, its own .git with a hook.
    shutil.copy2(os.path.realpath("/usr/bin/dash"), rootfs / "usr/bin/suid-sh")
    os.chmod(rootfs / "usr/bin/suid-sh", 0o4755)
    os.symlink("/etc/shadow", rootfs / "opt/app/host-shadow")
    os.symlink("/root/.ssh/id_rsa", rootfs / "opt/app/host-key")
    os.symlink("../../../../../root/.ssh/id_rsa", rootfs / "opt/app/climb-key")
    (rootfs / "root/.ssh").mkdir(mode=0o700)
    (rootfs / "root/.ssh/id_rsa").write_text("the image's own key\n")
    os.symlink("../../../../../../etc/shadow", rootfs / "opt/app/climb-shadow")
    os.mknod(rootfs / "opt/app/mem", 0o666 | 0o020000, os.makedev(1, 1))  # /dev/mem's numbers
    (rootfs / "opt/app/.git/hooks").mkdir(parents=True)
    (rootfs / "opt/app/.git/hooks/post-commit").write_text("#!/bin/sh\necho hook ran\n")
    tmp.rename(ROOT / key) if not (ROOT / key).exists() else shutil.rmtree(tmp)
    return done


def make_image(**config: object) -> Image:
    """The test image as the store would give it (``stockade.image.Image``)."""
    rootfs = build_rootfs()
    return Image(
        digest="sha256:" + hashlib.sha256(str(rootfs).encode()).hexdigest(),
        names=("stockade-test:latest",),
        rootfs=rootfs,
        config=ImageConfig(
            env=tuple(
                config.get(
                    "env",
                    (
                        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                        "IMAGE_VAR=from-image",
                    ),
                )
            ),  # type: ignore[arg-type]
            workdir=str(config.get("workdir", "")),
            user=str(config.get("user", "")),
        ),
        provenance={"kind": "test", "approximate": False},
    )


PYTHON = "/usr/bin/python3.11"
"""The interpreter inside the test image (the host's system one, linked in)."""

__all__ = ["PYTHON", "build_rootfs", "make_image"]

if __name__ == "__main__":  # pragma: no cover
    print(build_rootfs(), file=sys.stderr)
