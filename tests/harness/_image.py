"""A small image for the harness tests: the host's own shell, coreutils and
procps, laid out by tests/_image.py (as tests/cell/_image.py is), an /etc of
its own, and an ``adduser``/``userdel`` of a few lines of sh (Debian's adduser is Perl, and
shadow's useradd aborts when the kernel's audit socket is refused, as a
cell's seccomp does). Put into the image store of a state directory under
the tests' own name."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from stockade.image import ImageConfig, ImageStore
from tests._image import lay_out_root, link_program_names, place_files, which_host

NAME = "stockade-inspect-test:1"
PROGRAMS = (
    "sh", "dash", "bash", "cat", "ls", "id", "touch", "mkdir", "rm", "rmdir", "chmod", "chown", "env",
    "echo", "true", "false", "printf", "wc", "grep", "whoami", "sleep", "kill", "ps", "head", "dirname",
    "basename", "tar", "cp", "mv", "stat", "tr", "tail",
)  # fmt: skip
ADDUSER = """#!/bin/sh
# adduser [--comment TEXT] [--disabled-password] NAME: the files' lines, by hand.
comment=""
while [ $# -gt 1 ]; do
  case "$1" in --comment) comment="$2"; shift 2 ;; *) shift ;; esac
done
name="$1"
[ "$name" = "--help" ] && { echo "adduser (stockade test image) [--comment TEXT] NAME"; exit 0; }
grep -q "^$name:" /etc/passwd && { echo "adduser: the user '$name' already exists" >&2; exit 1; }
uid=1000
while grep -q "^[^:]*:[^:]*:$uid:" /etc/passwd; do uid=$((uid + 1)); done
echo "$name:x:$uid:$uid:$comment:/home/$name:/bin/sh" >> /etc/passwd
echo "$name:x:$uid:" >> /etc/group
echo "$name:!:19000:0:99999:7:::" >> /etc/shadow
mkdir -p "/home/$name" && chown "$uid:$uid" "/home/$name"
"""
USERDEL = """#!/bin/sh
# userdel [-r] NAME
[ "$1" = "-r" ] && shift
for f in /etc/passwd /etc/group /etc/shadow; do
  grep -v "^$1:" "$f" > "$f.new"; cat "$f.new" > "$f"; rm -f "$f.new"
done
rm -rf "/home/$1"
"""


def store_image(state: Path, tag: str = NAME) -> str:
    """The image in ``<state>/images`` under ``tag``; returns it."""
    store = ImageStore(state / "images")
    store.ensure()
    found = which_host(PROGRAMS)
    binaries = [os.path.realpath(p) for p in found if p]
    with store.workdir("test-image") as work:
        rootfs = work / "rootfs"
        lay_out_root(rootfs, ("home", "var/tmp", "run"))
        place_files(rootfs, binaries, libraries_of=binaries)
        link_program_names(rootfs, PROGRAMS, found, present_in=("usr/bin", "usr/sbin"))
        for tool, script in (("adduser", ADDUSER), ("userdel", USERDEL)):
            (rootfs / "usr/sbin" / tool).unlink(missing_ok=True)
            (rootfs / "usr/sbin" / tool).write_text(script)
            (rootfs / "usr/sbin" / tool).chmod(0o755)
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
