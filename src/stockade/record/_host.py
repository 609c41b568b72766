"""What the record needs of the host, for ``stockade doctor``.

The daemon refuses to start where it cannot record (docs/RECORD.md): the state
directory must be writable, on a local filesystem (SQLite's WAL shares memory
between processes and needs working locks; the journal's durability rests on
``O_DSYNC``), and have room for the journal and some growth. These checks say
so before a daemon is started, with the fix. Nothing here writes anything.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from stockade.record._journal import DEFAULT_SIZE, SUFFIX

ROOM = DEFAULT_SIZE + (64 << 20)
"""Free bytes wanted: the journal (allocated at the first start) and 64 MiB for
SQLite's file and WAL to grow (a full disk halts every run)."""

NETWORK_FILESYSTEMS = frozenset(
    {"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "fuse.sshfs", "ceph", "glusterfs", "lustre", "afs"}
)
"""Where SQLite's WAL mode and locks are not to be trusted (sqlite.org/wal.html)."""


@dataclass(frozen=True)
class RecordCheck:
    name: str
    ok: bool
    here: str
    fix: str | None = None


def probe_record(state: str) -> list[RecordCheck]:
    """The record's checks for the state directory ``state`` (see the module docstring)."""
    existing = _nearest_existing(state)
    return [_writable(state, existing), _local(existing), _room(state, existing)]


def _nearest_existing(path: str) -> str:
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def _writable(state: str, existing: str) -> RecordCheck:
    name = "state directory"
    if existing == state:
        if not os.path.isdir(state):
            return RecordCheck(name, False, f"{state} is not a directory", "choose another --state")
        if os.access(state, os.W_OK | os.X_OK):
            return RecordCheck(name, True, f"{state}, writable")
        return RecordCheck(
            name, False, f"{state} is not writable by this user", "run the daemon as the directory's owner"
        )
    if os.access(existing, os.W_OK | os.X_OK):
        return RecordCheck(name, True, f"{state} does not exist yet; the daemon will create it (0700)")
    return RecordCheck(
        name,
        False,
        f"{state} does not exist and {existing} is not writable by this user",
        f"create {state} (mode 0700) for the daemon's user, or choose another --state",
    )


def _local(existing: str) -> RecordCheck:
    name = "a local filesystem"
    fstype, mount, read_only = _mount_of(existing)
    if read_only:
        return RecordCheck(
            name,
            False,
            f"{mount} is mounted read-only ({fstype})",
            "put the state directory on a writable mount",
        )
    if fstype in NETWORK_FILESYSTEMS or fstype.startswith("fuse"):
        return RecordCheck(
            name,
            False,
            f"{mount} is {fstype}, a network or FUSE filesystem",
            "put the state directory on a local filesystem (SQLite's WAL and the journal need one)",
        )
    return RecordCheck(name, True, f"{fstype} at {mount}")


def _room(state: str, existing: str) -> RecordCheck:
    name = "room for the record"
    try:
        st = os.statvfs(existing)
    except OSError as exc:
        return RecordCheck(name, False, f"cannot look at {existing}: {exc.strerror}", "check the path")
    free = st.f_bavail * st.f_frsize
    have_journal = os.path.exists(os.path.join(state, "events.db" + SUFFIX))
    wanted = ROOM - (DEFAULT_SIZE if have_journal else 0)
    here = f"{_size(free)} free" + (
        "" if have_journal else f"; the journal takes {_size(DEFAULT_SIZE)} at the first start"
    )
    if free >= wanted:
        return RecordCheck(name, True, here)
    return RecordCheck(
        name,
        False,
        here,
        f"free at least {_size(wanted - free)} there, or choose another --state "
        "(a store that cannot write halts every run)",
    )


def _mount_of(path: str) -> tuple[str, str, bool]:
    """(filesystem type, mount point, read-only) of the mount holding ``path``,
    from /proc/self/mountinfo (the longest mount point that contains it)."""
    real = os.path.realpath(path)
    best = ("unknown", "/", False)
    best_len = -1
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return best
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) < 6 or not rest:
            continue
        mount = fields[4].replace("\\040", " ")
        if (real == mount or real.startswith(mount.rstrip("/") + "/")) and len(mount) >= best_len:
            best_len = len(mount)
            best = (rest[0], mount, "ro" in fields[5].split(","))
    return best


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"


__all__ = ["RecordCheck", "probe_record"]
