"""What a cell's layers cost the launching process in descriptors: bounded,
whatever the grants hold (THREATS.md, "Exhaustion": the daemon's descriptors)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.cell import Cell
from stockade.policy import Policy, default_policy

FILES = 25_000
"""As many entries as made the daemon die with EMFILE (one descriptor each)."""


@pytest.fixture
def crowded() -> Iterator[Path]:
    """A directory outside /tmp with ``FILES`` files and one listening unix
    socket, which the planner hides (a host socket in a grant is a way out)."""
    path = Path(tempfile.mkdtemp(prefix="stockade-crowded-", dir="/var/tmp"))
    path.chmod(0o755)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        for i in range(FILES):
            os.close(os.open(path / f"f{i:05d}", os.O_WRONLY | os.O_CREAT, 0o644))
        (path / "f00001").write_text("granted\n")
        listener.bind(str(path / "service.sock"))
        listener.listen(1)
        yield path
    finally:
        listener.close()
        shutil.rmtree(path, ignore_errors=True)


def _reading(path: Path) -> Policy:
    """Reads ``path``; its socket is also denied by name, so that it is hidden
    whatever the order in which the planner's bounded socket search (20,000
    entries) meets the entries."""
    policy = default_policy("test")
    fs = policy.filesystem
    return dataclasses.replace(
        policy,
        filesystem=dataclasses.replace(
            fs, read=(*fs.read, str(path)), deny=(*fs.deny, str(path / "service.sock"))
        ),
    )


PROBE = """
import os, socket, sys
d = sys.argv[1]
print(open(os.path.join(d, "f00001")).read().strip(), len(os.listdir(d)))
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(os.path.join(d, "service.sock"))
    print("connected")
except OSError as exc:
    print("refused", exc.errno)
"""


def test_a_crowded_grant_with_a_hidden_path_costs_no_descriptor_per_entry(crowded: Path) -> None:
    """A granted directory that holds a hidden path is granted entry by entry;
    its 25,000 entries must not cost 25,000 descriptors held by the launching
    process (the daemon died with EMFILE). The cell still reads the entries
    (the control), and the hidden socket stays out of reach."""
    before = len(os.listdir("/proc/self/fd"))
    with Cell(_reading(crowded), environ={}) as cell:
        result = cell.run(["/usr/bin/python3", "-I", "-c", PROBE, str(crowded)], timeout=60)
        held = len(os.listdir("/proc/self/fd")) - before  # the prepared layers are kept for reuse
        into = [fd for fd in os.listdir("/proc/self/fd") if _names(int(fd), crowded)]
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.decode().splitlines()
    assert lines[0] == f"granted {FILES + 1}", lines
    assert lines[1].startswith("refused"), lines
    assert not into, f"the launcher holds {len(into)} descriptors of the crowded grant's entries"
    # Besides: one a process at most for each entry of /etc, which holds
    # hidden paths (_native.hold_entries keeps those of small directories).
    assert held < 64 + len(os.listdir("/etc")), f"the launcher holds {held} more descriptors for one cell"


def _names(fd: int, top: Path) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}").startswith(f"{top}/")
    except OSError:
        return False
