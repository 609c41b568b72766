"""``limits.disk``: the cell's own /tmp is a tmpfs, and a fresh workspace an
ext4 image, that the kernel keeps to the policy's bytes and files; a run
that filled one says so."""

from __future__ import annotations

import dataclasses
import errno
import os
from pathlib import Path

import pytest

from stockade.cell import Cell
from stockade.cell._disk import IMAGES
from stockade.errors import PolicyError
from stockade.policy import DiskLimit, Policy, default_policy, loads_policy

PY = "/usr/bin/python3"

FILL = r"""
import os, sys
kind, where = sys.argv[1], sys.argv[2]
small = os.path.join(where, "small")
open(small, "wb").write(b"x" * 4096)  # the control: well under every limit here
print("control", os.path.getsize(small))
try:
    if kind == "bytes":
        with open(os.path.join(where, "big"), "wb") as f:
            while True:
                f.write(b"x" * (1 << 20))
    else:
        n = 0
        while True:
            open(os.path.join(where, f"f{n}"), "w").close()
            n += 1
except OSError as exc:
    print("refused", exc.errno)
"""
"""Fills the directory ``argv[2]`` (the cell's /tmp, or ``.``, its workspace)
by ``bytes`` or by ``files`` (``argv[1]``) after a small control file: one
filler for both of the cell's limited filesystems."""


def _limited(disk: DiskLimit | None) -> Policy:
    policy = default_policy("test")
    return dataclasses.replace(policy, limits=dataclasses.replace(policy.limits, disk=disk))


def test_tmp_stops_at_its_byte_limit_and_the_run_says_so() -> None:
    with Cell(_limited(DiskLimit(bytes=8 << 20)), environ={}) as cell:
        result = cell.run([PY, "-I", "-c", FILL, "bytes", "/tmp"], timeout=60)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.decode().split() == ["control", "4096", "refused", str(errno.ENOSPC)]
    assert "disk" in result.limits_hit
    limit = [e for e in result.events if e.kind == "cell.limit"]
    assert [e.summary for e in limit] == [
        f"disk limit of /tmp reached: {8 << 20} bytes, writes refused (ENOSPC)"
    ]


def test_tmp_stops_at_its_file_limit_and_the_run_says_so() -> None:
    with Cell(_limited(DiskLimit(bytes=32 << 20, files=200)), environ={}) as cell:
        result = cell.run([PY, "-I", "-c", FILL, "files", "/tmp"], timeout=60)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.decode().split() == ["control", "4096", "refused", str(errno.ENOSPC)]
    assert [e.summary for e in result.events if e.kind == "cell.limit"] == [
        "file limit of /tmp reached: 200 files, creation refused (ENOSPC)"
    ]


def test_a_run_that_stays_under_the_limit_records_no_limit() -> None:
    with Cell(_limited(DiskLimit(bytes=8 << 20, files=200)), environ={}) as cell:
        result = cell.run([PY, "-I", "-c", "open('/tmp/a', 'w').write('a' * 4096)"])
    assert result.exit_code == 0, result.stderr
    assert result.limits_hit == ()
    assert not [e for e in result.events if e.kind == "cell.limit"]


def test_limits_disk_in_a_policy_file() -> None:
    policy = loads_policy("name: t\nlimits:\n  disk: {bytes: 1G, files: 100000}\n")
    assert policy.limits.disk == DiskLimit(bytes=1 << 30, files=100_000)
    assert loads_policy("name: t\nlimits:\n  disk: {bytes: unlimited}\n").limits.disk is None
    assert loads_policy("name: t\n").limits.disk is None


def test_a_fresh_workspace_is_a_filesystem_of_that_size() -> None:
    """A fresh workspace under ``limits.disk`` is an ext4 image of its own:
    writing past its bytes fails with ENOSPC and the run says so; closing
    the Cell unmounts it and deletes the image."""
    with Cell(_limited(DiskLimit(bytes=32 << 20)), environ={}) as cell:
        workspace = cell.workspace
        assert os.path.ismount(workspace)
        result = cell.run([PY, "-I", "-c", FILL, "bytes", "."], timeout=60)
        size = os.path.getsize(os.path.join(workspace, "big"))
    assert result.exit_code == 0, result.stderr
    assert result.stdout.decode().split() == ["control", "4096", "refused", str(errno.ENOSPC)]
    assert 16 << 20 < size <= 32 << 20
    assert [e.summary for e in result.events if e.kind == "cell.limit"] == [
        f"disk limit of the workspace reached: {32 << 20} bytes, writes refused (ENOSPC)"
    ]
    assert not os.path.exists(workspace)
    assert not any(name.startswith(os.path.basename(workspace)) for name in os.listdir(IMAGES))


def test_a_fresh_workspace_stops_at_its_file_limit() -> None:
    with Cell(_limited(DiskLimit(bytes=32 << 20, files=500)), environ={}) as cell:
        result = cell.run([PY, "-I", "-c", FILL, "files", "."], timeout=60)
        made = len(os.listdir(cell.workspace))
    assert result.exit_code == 0, result.stderr
    assert result.stdout.decode().split()[-2:] == ["refused", str(errno.ENOSPC)]
    assert 400 < made <= 512  # inodes come in whole block groups' worth
    assert "file limit of the workspace reached: 500 files, creation refused (ENOSPC)" in [
        e.summary for e in result.events if e.kind == "cell.limit"
    ]


def test_an_existing_workspace_cannot_be_limited(tmp_path: Path) -> None:
    """A directory the caller gives has no filesystem of its own to limit:
    refused, never run without the limit."""
    with pytest.raises(PolicyError, match=r"limits\.disk cannot be enforced on the existing workspace"):
        Cell(_limited(DiskLimit(bytes=32 << 20)), workspace=tmp_path, environ={})
    with pytest.raises(PolicyError, match=r"needs limits\.disk\.bytes too"):
        Cell(_limited(DiskLimit(files=500)), environ={})


FILL_THEN_EMPTY = r"""
import os, sys
try:
    with open("/tmp/big", "wb") as f:
        while True:
            f.write(b"x" * (1 << 20))
except OSError as exc:
    print("refused", exc.errno, flush=True)
with open(sys.argv[1], "rb") as go:  # until the test saw the limit, live
    go.read()
os.unlink("/tmp/big")
print("emptied", os.statvfs("/tmp").f_bavail > 0, flush=True)
"""


def test_a_limit_reached_is_recorded_live_even_if_emptied_before_the_end() -> None:
    """Not only at the end: the watch sees /tmp full while the cell runs, the
    event is on ``on_event`` then, and it stays in the record after the agent
    emptied /tmp (which the end's look alone would have missed)."""
    live: list[str] = []
    with Cell(_limited(DiskLimit(bytes=8 << 20)), environ={}) as cell:
        go = os.path.join(cell.workspace, "go")
        os.mkfifo(go, 0o666)

        def on_event(event: object) -> None:
            kind, summary = getattr(event, "kind", ""), getattr(event, "summary", "")
            if kind == "cell.limit":
                live.append(summary)
                with open(go, "wb") as f:  # the agent waits for this
                    f.write(b"go")

        result = cell.run([PY, "-I", "-c", FILL_THEN_EMPTY, go], timeout=60, on_event=on_event)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.decode().split() == ["refused", str(errno.ENOSPC), "emptied", "True"]
    sentence = f"disk limit of /tmp reached: {8 << 20} bytes, writes refused (ENOSPC)"
    assert live == [sentence]
    limit = [e for e in result.events if e.kind == "cell.limit"]
    assert [e.summary for e in limit] == [sentence] and limit[0] in result.live
    assert "disk" in result.limits_hit


KEEP_WORK = r"""
import os
os.makedirs("sub/deeper")
open("sub/deeper/work.txt", "w").write("the agent's work\n")
open("private", "w").write("p")
os.chmod("private", 0o600)
os.symlink("sub/deeper/work.txt", "link")
"""


def test_a_kept_workspace_is_copied_out_and_not_left_loop_mounted() -> None:
    """A kept fresh workspace under ``limits.disk`` ends as plain files at its
    path (owners, modes and links as the agent left them), its image and
    loop mount gone."""
    import shutil

    cell = Cell(_limited(DiskLimit(bytes=32 << 20)), environ={}, keep_workspace=True)
    workspace = cell.workspace
    try:
        assert os.path.ismount(workspace)
        result = cell.run([PY, "-I", "-c", KEEP_WORK], timeout=60)  # its cwd: the workspace
        assert result.exit_code == 0, result.stderr
        inside = os.stat(os.path.join(workspace, "private"))
        cell.close()
        assert not os.path.ismount(workspace)
        assert Path(workspace, "sub/deeper/work.txt").read_text() == "the agent's work\n"
        after = os.stat(os.path.join(workspace, "private"))
        assert (after.st_mode & 0o777, after.st_uid, after.st_gid) == (0o600, inside.st_uid, inside.st_gid)
        assert os.readlink(os.path.join(workspace, "link")) == "sub/deeper/work.txt"
        assert not any(name.startswith(os.path.basename(workspace)) for name in os.listdir(IMAGES))
        with open("/proc/self/mountinfo") as f:
            assert f" {workspace} " not in f.read()
    finally:
        cell.close()
        shutil.rmtree(workspace, ignore_errors=True)
