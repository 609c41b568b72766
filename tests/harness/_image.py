"""A small image for the harness tests: the host's own shell, coreutils,
procps and shadow's tools, hard-linked (tests/cell/_image.py's way), an /etc
of its own, and an ``adduser`` of a few lines of sh over useradd (Debian's
is Perl). Put into the image store of a state directory under the tests'
own name."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from stockade.image import ImageConfig, ImageStore
from tests.cell._image import _libraries, _place

NAME = "stockade-inspect-test:1"
PROGRAMS = (
    "sh", "dash", "bash", "cat", "ls", "id", "touch", "mkdir", "rm", "rmdir", "chmod", "chown", "env",
    "echo", "true", "false", "printf", "wc", "grep", "whoami", "sleep", "kill", "ps", "head", "dirname",
    "basename", "tar", "cp", "mv", "useradd", "userdel", "groupadd", "stat", "tr",
)  # fmt: skip
ADDUSER = """#!/bin/sh
# adduser [--comment TEXT] [--disabled-password] NAME, over useradd.
comment=""
while [ $# -gt 1 ]; do
  case "$1" in
    --comment) comment="$2"; shift 2 ;;
    --disabled-password) shift ;;
    --help) echo "adduser (stockade test image) --comment TEXT --disabled-password NAME"; exit 0 ;;
    *) shift ;;
  esac
done
[ "$1" = "--help" ] && { echo "adduser (stockade test image)"; exit 0; }
exec /usr/sbin/useradd -m -U -c "$comment" -s /bin/sh "$1"
"""


def store_image(state: Path, tag: str = NAME) -> str:
    """The image in ``<state>/images`` under ``tag``; returns it."""
    store = ImageStore(state / "images")
    store.ensure()
    found = [shutil.which(p, path="/usr/bin:/usr/sbin:/bin:/sbin") for p in PROGRAMS]
    binaries = [os.path.realpath(p) for p in found if p]
    with store.workdir("test-image") as work:
        rootfs = work / "rootfs"
        dirs = (
            "usr/bin",
            "usr/sbin",
            "usr/lib",
            "usr/lib64",
            "etc",
            "tmp",
            "proc",
            "dev",
            "sys",
            "root",
            "home",
        )
        for name in (*dirs, "var/tmp", "run"):
            (rootfs / name).mkdir(parents=True, exist_ok=True)
        for link, target in (
            ("bin", "usr/bin"),
            ("sbin", "usr/sbin"),
            ("lib", "usr/lib"),
            ("lib64", "usr/lib64"),
        ):
            os.symlink(target, rootfs / link)
        for path in (*binaries, *_libraries(binaries)):
            _place(path, rootfs)
        for name, path in zip(PROGRAMS, found, strict=True):
            if (
                path
                and not (rootfs / "usr/bin" / name).exists()
                and not (rootfs / "usr/sbin" / name).exists()
            ):
                os.symlink(os.path.realpath(path), rootfs / "usr/bin" / name)
        (rootfs / "usr/sbin/adduser").write_text(ADDUSER)
        (rootfs / "usr/sbin/adduser").chmod(0o755)
        (rootfs / "etc/passwd").write_text(
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n"
        )
        (rootfs / "etc/group").write_text("root:x:0:\nusers:x:100:\nnogroup:x:65534:\n")
        (rootfs / "etc/shadow").write_text("root:*:19000:0:99999:7:::\n")
        (rootfs / "etc/gshadow").write_text("root:*::\n")
        (rootfs / "etc/os-release").write_text('PRETTY_NAME="stockade test image"\nID=stockade-test\n')
        if os.path.exists("/etc/login.defs"):
            shutil.copy("/etc/login.defs", rootfs / "etc/login.defs")
        for name in ("shadow", "gshadow"):
            (rootfs / "etc" / name).chmod(0o640)
        (rootfs / "root").chmod(0o700)
        (rootfs / "tmp").chmod(0o1777)
        listing = subprocess.run(
            ["find", str(rootfs), "-printf", "%P %s %m\\n"], capture_output=True, check=True
        )
        digest = "sha256:" + hashlib.sha256(listing.stdout).hexdigest()
        config = ImageConfig(
            env=("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",),
            workdir="/root",
            user="root",
            entrypoint=(),
            cmd=(),
            labels={},
        )
        store.add(digest, rootfs, config, {"made_by": "tests/harness/_image.py", "approximate": False})
    store.tag(tag, digest)
    return tag
