"""What Dockerfiles do as root in a build cell, on the real Debian base of
test_build_real.py (cached under $STOCKADE_TEST_IMAGES, else
/var/tmp/stockade-test-images): a setuid bit, shadow's ``useradd`` (which
opens the audit netlink socket), a new name in /etc beside the gateway's CA."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from stockade.image import ImageStore
from stockade.image._build import build_image

DOCKERFILE = """\
FROM python:3.11-slim
ARG T
RUN cp /bin/true /usr/local/bin/s && chmod 4755 /usr/local/bin/s \\
    && useradd -m bob && echo ok > /etc/newfile # $T
"""


@pytest.fixture(scope="module")
def store() -> ImageStore:
    if shutil.which("mmdebstrap") is None:
        pytest.fail("mmdebstrap is not installed: run scripts/setup.sh (apt-get install -y mmdebstrap)")
    return ImageStore(Path(os.environ.get("STOCKADE_TEST_IMAGES", "/var/tmp/stockade-test-images")))


def test_a_root_step_sets_setuid_adds_a_user_and_writes_etc(store: ImageStore, tmp_path: Path) -> None:
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(DOCKERFILE)
    image = build_image(store, ctx, build_args={"T": os.urandom(4).hex()})
    try:
        st = os.lstat(image.rootfs / "usr/local/bin/s")
        assert st.st_mode & 0o4000 and st.st_uid == 0  # the image's root's, as Docker makes it
        passwd = (image.rootfs / "etc/passwd").read_text()
        bob = next(line for line in passwd.splitlines() if line.startswith("bob:")).split(":")
        assert os.stat(image.rootfs / "home/bob").st_uid == int(bob[2])
        assert (image.rootfs / "etc/newfile").read_text() == "ok\n"
    finally:
        store.prune()
