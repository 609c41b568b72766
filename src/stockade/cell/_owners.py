"""The host uids that own cells' user namespaces: one per running cell.

The kernel charges a user namespace's per-user counters (inotify instances
and watches, fanotify groups, queued signals, nested user namespaces;
kernel/ucount.c) up the namespace chain to the uid that *created* each
namespace. A cell whose namespace host root creates uses up root's: 128
inotify instances in one cell made every ``inotify_init`` of host root fail.
So a cell's user namespace is created by a host uid of its own, leased here
for the cell's life, and the cell then uses up that uid's counters only,
not root's and not another cell's.

The uids come from a range no account uses: slot ``k`` is
``OWNER_BASE + k * OWNER_STRIDE``, above the ``/etc/subuid`` ranges that
``useradd`` hands out (100000 up, 65536 each, for a few thousand users). Each
slot's 65536 ids are reserved for the cell holding it: the first is the
namespace's owner; the rest are for a workbench that maps a whole range
(root inside it) later. No process runs as these uids outside a cell, and no
file on the host belongs to them.

Leases hold across processes (the daemon, ``stockade exec``, tests) through
one lock file: slot ``k`` is byte ``k`` of it, held with an open file
description lock (``F_OFD_SETLK``, Linux 3.15) that the kernel lets go of when
its holder dies. One descriptor per process, whatever the number of cells.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import threading

from stockade._slots import Frozen
from stockade.errors import CellError

OWNER_BASE = 1 << 20
"""The first uid of slot 0."""
OWNER_STRIDE = 1 << 16
"""Ids reserved per slot: a workbench's whole mapping (0-65535 inside)."""
OWNER_SLOTS = 4096
"""Cells that can run at once on one host (uids up to 2^20 + 2^28)."""
LOCK_PATH = "/var/lib/stockade/cell-owners.lock"
"""Where leases are held; under the state directory every cell sees as a decoy."""

# <fcntl.h> (Linux 3.15): open file description locks, not in Python's fcntl.
F_OFD_SETLK = 37
# struct flock on 64-bit Linux: l_type, l_whence (short), l_start, l_len (off_t), l_pid (pid_t).
_FLOCK = struct.Struct("hh4xqqi4x")


class OwnerLease(Frozen):
    """One leased slot: its namespace owner's host uid and gid (the same number)."""

    _fields = ("slot",)
    __slots__ = _fields
    slot: int

    def __init__(self, slot: int) -> None:
        object.__setattr__(self, "slot", slot)

    @property
    def uid(self) -> int:
        return OWNER_BASE + self.slot * OWNER_STRIDE

    @property
    def gid(self) -> int:
        return self.uid


class OwnerPool:
    """The leases of this process, held in ``lock_path``. Thread-safe."""

    def __init__(self, lock_path: str = LOCK_PATH, slots: int = OWNER_SLOTS) -> None:
        self._path = lock_path
        self._slots = slots
        self._lock = threading.Lock()
        self._fd = -1
        self._held: set[int] = set()
        self._next = 0

    def lease(self) -> OwnerLease:
        """A slot no cell of any process holds now.

        Raises:
            CellError: the lock file cannot be opened, or every slot is held.
        """
        with self._lock:
            fd = self._open()
            for i in range(self._slots):
                # Round robin: a slot let go of just now is taken last, so the
                # counters its last cell left behind (queued signals die with
                # their processes, but not always at once) have time to drain.
                slot = (self._next + i) % self._slots
                if slot in self._held:
                    continue  # this process's own: the OFD lock would not refuse it
                try:
                    fcntl.fcntl(fd, F_OFD_SETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, slot, 1, 0))
                except OSError as exc:
                    if exc.errno in (errno.EAGAIN, errno.EACCES):
                        continue  # another process's cell holds it
                    raise CellError(f"could not lock slot {slot} of {self._path}: {exc.strerror}") from exc
                self._held.add(slot)
                self._next = slot + 1
                return OwnerLease(slot)
        raise CellError(
            f"all {self._slots} cell owner uids are in use on this host (see {self._path}); "
            "wait for a cell to end"
        )

    def release(self, lease: OwnerLease) -> None:
        """Let go of ``lease`` (after every process of its cell has ended)."""
        with self._lock:
            if lease.slot not in self._held:
                return
            self._held.discard(lease.slot)
            fcntl.fcntl(self._fd, F_OFD_SETLK, _FLOCK.pack(fcntl.F_UNLCK, os.SEEK_SET, lease.slot, 1, 0))

    def held(self) -> frozenset[int]:
        with self._lock:
            return frozenset(self._held)

    def _open(self) -> int:
        if self._fd < 0:
            try:
                os.makedirs(os.path.dirname(self._path), mode=0o711, exist_ok=True)
                self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                raise CellError(
                    f"could not open the cell owners' lock file {self._path}: {exc.strerror}; "
                    "it must be writable by root"
                ) from exc
        return self._fd


_POOL = OwnerPool()


def lease_owner() -> OwnerLease | None:
    """A namespace owner for one cell, or None when this process is not root
    (an unprivileged caller can only create namespaces as itself).

    Raises:
        CellError: no owner uid could be leased.
    """
    if os.geteuid() != 0:
        return None
    return _POOL.lease()


def release_owner(lease: OwnerLease | None) -> None:
    if lease is not None:
        _POOL.release(lease)


__all__ = ["OWNER_BASE", "OWNER_STRIDE", "OwnerLease", "OwnerPool", "lease_owner", "release_owner"]
