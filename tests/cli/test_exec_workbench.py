"""``stockade exec --image REF`` and ``--user``: a workbench from the shell,
with an image put in a store of the test's own state directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stockade.image import ImageConfig, ImageStore
from tests.cell._image import build_rootfs

STOCKADE = str(Path(sys.executable).with_name("stockade"))
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="a workbench maps an id range: needs root (CAP_SETUID)"
)


def _exec(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STOCKADE_STATE": str(state)}
    return subprocess.run([STOCKADE, "exec", *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """A state directory whose store holds the test image as ``task:latest``."""
    state = tmp_path / "state"
    store = ImageStore(state / "images")
    store.ensure()
    rootfs = store.tmp_dir / "rootfs"
    # A hard-linked copy (the store moves what it is given; the lower layer is never written).
    subprocess.run(["cp", "-al", str(build_rootfs()), str(rootfs)], check=True)
    store.add("sha256:" + "ab" * 32, rootfs, ImageConfig(env=("IMAGE_VAR=yes",)), {"kind": "test"})
    store.tag("task:latest", "sha256:" + "ab" * 32)
    return state


def test_exec_image_runs_in_the_image(state: Path) -> None:
    done = _exec(
        state,
        "-q",
        "--image",
        "task:latest",
        "--user",
        "root",
        "--",
        "/bin/sh",
        "-c",
        "cat /etc/hostname; id -u; echo $IMAGE_VAR",
    )
    assert (done.returncode, done.stdout) == (0, "task-image\n0\nyes\n"), done.stderr


def test_exec_an_unknown_image_is_not_found(state: Path) -> None:
    done = _exec(state, "--image", "nosuch:tag", "--", "/bin/true")
    assert done.returncode == 6
    assert "'nosuch:tag'" in done.stderr and "stockade image ls" in done.stderr


def test_exec_user_root_without_an_image(tmp_path: Path) -> None:
    done = _exec(tmp_path, "-q", "--user", "root", "--", "/bin/sh", "-c", "id -u; touch /usr/x; echo rc=$?")
    assert done.stdout == "0\nrc=1\n", done.stderr
    assert not os.path.exists("/usr/x")


def test_exec_user_out_of_range_is_a_usage_error(tmp_path: Path) -> None:
    done = _exec(tmp_path, "--user", "70000", "--", "/bin/true")
    assert done.returncode == 2 and "--user '70000'" in done.stderr
