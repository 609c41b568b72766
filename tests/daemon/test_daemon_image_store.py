"""A daemon resolves a policy's ``image:`` in its own store (``--state``),
not in the default state directory's."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from stockade.daemon._client import Client
from stockade.image import ImageConfig, ImageStore
from tests.cell._image import build_rootfs
from tests.daemon.test_server import daemon_at

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="a workbench maps an id range: needs root (CAP_SETUID)"
)


def test_a_session_finds_the_policys_image_in_the_daemons_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The default state directory is another, empty one: only the daemon's
    # own store (its --state, tmp_path/state) has the image.
    monkeypatch.setenv("STOCKADE_STATE", str(tmp_path / "elsewhere"))
    store = ImageStore(tmp_path / "state" / "images")
    store.ensure()
    copy = store.tmp_dir / "rootfs-copy"
    subprocess.run(["cp", "-al", str(build_rootfs()), str(copy)], check=True)
    digest = "sha256:" + "d" * 64
    store.add(digest, copy, ImageConfig(env=("PATH=/usr/bin:/bin",)), {"kind": "test"})
    store.tag("daemon-own:latest", digest)
    policy = json.dumps({"name": "own-store", "image": "daemon-own:latest"})
    with daemon_at(tmp_path) as dt, Client(dt.socket_path, timeout=60) as client:
        with client.open_session(policy_text=policy) as session:
            done = session.exec(["cat", "/etc/hostname"])
        # The control: a reference neither store has is still not found.
        with pytest.raises(Exception, match="nosuch:tag"):
            client.open_session(policy_text=json.dumps({"name": "x", "image": "nosuch:tag"}))
    assert (done.returncode, done.stdout) == (0, b"task-image\n"), done
