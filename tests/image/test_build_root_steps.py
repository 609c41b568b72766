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


TOP_DOCKERFILE = """\
FROM python:3.11-slim
ARG T
RUN mkdir /app && echo built > /app/out && ls / > /app/top # $T
"""


def test_root_makes_names_at_the_top_and_meets_its_decoys_on_a_real_image(
    store: ImageStore, tmp_path: Path
) -> None:
    """Root's whole image on the real Debian base: a RUN step makes /app at
    the top of / and lists /; then a workbench of that image, root inside,
    does what dpkg does (its own database, a new top-level name), while
    /tests and /solution (deny entries, absent from the image) refuse every
    reach, on record with the path tried."""
    import dataclasses

    from stockade.cell import Cell
    from stockade.policy import default_policy

    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(TOP_DOCKERFILE)
    image = build_image(store, ctx, build_args={"T": os.urandom(4).hex()})
    try:
        assert (image.rootfs / "app/out").read_text() == "built\n"
        top = (image.rootfs / "app/top").read_text().split()
        assert {"app", "usr", "etc", "var"} <= set(top), top
        base = default_policy()
        fs = base.filesystem
        policy = dataclasses.replace(
            base, user="root", filesystem=dataclasses.replace(fs, deny=(*fs.deny, "/tests", "/solution"))
        )
        script = (
            "cat /tests/test_outputs.py; ls /solution/solve.sh; "
            "mkdir /logs && echo v > /logs/verifier.txt && cat /logs/verifier.txt; "
            "dpkg-query -W -f='${Status}\\n' dpkg; touch /var/lib/dpkg/stockade-test && echo dpkg-db; "
            "cat /app/out"
        )
        with Cell(policy, image=image) as cell:
            r = cell.run(["/bin/sh", "-c", script])
        assert r.stdout.decode().split("\n")[:4] == ["v", "install ok installed", "dpkg-db", "built"], (
            r.stderr
        )
        tried = {e.detail.get("path") for e in r.denials}
        assert {"/tests/test_outputs.py", "/solution/solve.sh"} <= tried, [e.summary for e in r.denials]
        assert not any(str(p).startswith(("/logs", "/var/lib/dpkg")) for p in tried), tried
    finally:
        store.prune()
