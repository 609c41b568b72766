"""The host uids that own cells' user namespaces (cell/_owners.py)."""

from __future__ import annotations

import fcntl
import os
import struct
from pathlib import Path

import pytest

from stockade.cell import Cell
from stockade.cell._owners import OWNER_BASE, OWNER_STRIDE, OwnerPool
from stockade.errors import CellError
from stockade.record import Event

NS_GET_OWNER_UID = 0xB704
"""<linux/nsfs.h>: _IO(0xb7, 0x4), Linux 4.11."""


def test_two_holders_never_share_a_slot(tmp_path: Path) -> None:
    """Two pools on one lock file stand for two processes (open file
    description locks conflict between descriptions, even in one process)."""
    lock = str(tmp_path / "owners.lock")
    first, second = OwnerPool(lock, slots=3), OwnerPool(lock, slots=3)
    a = first.lease()
    b = second.lease()
    assert a.slot != b.slot
    c = first.lease()
    assert len({a.slot, b.slot, c.slot}) == 3
    with pytest.raises(CellError, match="all 3 cell owner uids are in use"):
        second.lease()
    first.release(a)
    assert second.lease().slot == a.slot
    assert a.uid == OWNER_BASE + a.slot * OWNER_STRIDE and a.gid == a.uid


def test_a_dead_holders_slots_are_free_again(tmp_path: Path) -> None:
    """The kernel lets go of a dead process's locks: a crashed daemon leaks no slot."""
    lock = str(tmp_path / "owners.lock")
    leased_r, leased_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child only holds a lease, then dies
        try:
            os.write(leased_w, str(OwnerPool(lock, slots=1).lease().slot).encode())
            os.read(go_r, 1)
        finally:
            os._exit(0)
    assert os.read(leased_r, 8) == b"0"
    with pytest.raises(CellError):
        OwnerPool(lock, slots=1).lease()
    os.write(go_w, b"x")
    os.waitpid(pid, 0)
    for fd in (leased_r, leased_w, go_r, go_w):
        os.close(fd)
    assert OwnerPool(lock, slots=1).lease().slot == 0


class _Owners:
    """Stands in for the audit reader: reads the owner of the cell's user
    namespace from the host while the cell runs."""

    def __init__(self, release: int) -> None:
        self.owner = -1
        self.release = release
        """Written once the owner is read: the cell waits for it on stdin."""

    def watch(self, cell_id: str, *, session: int, pid: int, places: object = None) -> None:
        fd = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        try:
            buf = bytearray(4)
            fcntl.ioctl(fd, NS_GET_OWNER_UID, buf)
            self.owner = struct.unpack("I", buf)[0]
        finally:
            os.close(fd)
            os.write(self.release, b"\n")

    def unwatch(self, cell_id: str) -> None:
        pass

    def begin_settle(self, timeout: float = 2.0) -> None:
        return None

    def abandon(self, settling: object) -> None:
        pass

    def collect(self, cell_id: str, *, timeout: float = 2.0, begun: object = None) -> list[Event]:
        return []


def test_the_cells_user_namespace_is_owned_by_its_own_uid(tmp_path: Path) -> None:
    """Not host root: an unprivileged uid of the reserved range, whose slot is
    free again after the cell; the cell still works (a file written in its
    workspace belongs to the workspace's owner, as before)."""
    stdin_r, stdin_w = os.pipe()
    spy = _Owners(stdin_w)
    try:
        with Cell(workspace=tmp_path, audit=spy) as cell:  # type: ignore[arg-type]
            result = cell.run(["/bin/sh", "-c", "read line; echo x > made"], stdin=stdin_r)
    finally:
        os.close(stdin_r)
        os.close(stdin_w)
    assert result.exit_code == 0, result.stderr
    assert spy.owner >= OWNER_BASE and (spy.owner - OWNER_BASE) % OWNER_STRIDE == 0, spy.owner
    assert (tmp_path / "made").read_text() == "x\n"
    assert (tmp_path / "made").stat().st_uid == tmp_path.stat().st_uid
    from stockade.cell import _owners

    assert (spy.owner - OWNER_BASE) // OWNER_STRIDE not in _owners._POOL.held()
