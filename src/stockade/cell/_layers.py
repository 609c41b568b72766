"""The cell's Landlock ruleset and seccomp filters, prepared in the parent.

Joins the plan (what the view shows) with the policy (ports, mode) into what
``_launch`` hands to the child. Kept apart from ``_plan`` so that planning
stays free of kernel specifics.
"""

from __future__ import annotations

import os
import stat
import struct
import time

from stockade.cell import _landlock, _seccomp
from stockade.cell._plan import CellPlan, MountOp
from stockade.policy import Policy

GATEWAY_PORT = 3128
"""The TCP port on the cell's loopback where the gateway will answer (a later
layer); the only port a default cell may connect to."""

_DEVICE_RIGHTS = (
    _landlock.ACCESS_FS_READ_FILE
    | _landlock.ACCESS_FS_WRITE_FILE
    | _landlock.ACCESS_FS_TRUNCATE
    | _landlock.ACCESS_FS_IOCTL_DEV
)


def prepare_layers(
    policy: Policy, plan: CellPlan
) -> tuple[_landlock.PreparedLandlock, tuple[tuple[bytes, bool], ...]]:
    """Landlock and seccomp for one cell.

    Raises:
        HostError: the host's Landlock lacks a feature the cell needs.
    """
    grants = plan.grants
    loopback = tuple(policy.network.loopback_ports)
    rules = _landlock.LandlockRules(
        read=grants.read,
        read_exec=grants.read_exec,
        write=grants.write,
        write_exec=grants.write_exec,
        exec_files=_landlock.exec_closure(grants.exec_files) if grants.exec_files else (),
        connect_tcp=(GATEWAY_PORT, *loopback),
        bind_tcp=loopback,
    )
    prepared = _landlock.prepare(rules, _landlock.landlock_abi())
    handled = _landlock.FS_RIGHTS_BY_ABI[min(prepared.abi, 5)]
    extra: list[tuple[bytes, int, int]] = []
    # Directories that may be listed but whose files stay refused (the parents
    # of hidden paths, and /): Landlock inherits rights down a tree, so these
    # get READ_DIR alone, and their other entries are granted one by one.
    for path in grants.list_dirs:
        extra.append((path.encode(), _landlock.ACCESS_FS_READ_DIR, 0))
    for path in grants.devices:
        rights = _DEVICE_RIGHTS & handled
        extra.append((path.encode(), rights | _landlock.ACCESS_FS_READ_DIR, rights))
    # Paths the cell sees through a bind of the host are opened here, once per
    # process, and handed to the child as ready rules: a Landlock rule binds
    # an inode, and the bind shows the host's. The rest (the cell's own /tmp,
    # /dev, /proc, decoys) only exists in the child, which opens them itself.
    ready: list[bytes] = []
    local: list[tuple[bytes, int, int]] = []
    for raw, dir_rights, file_rights in (*prepared.paths, *extra):
        name = raw.decode()
        opened = _host_fd(name) if _shows_host(plan.mounts, name) else None
        if opened is None:
            local.append((raw, dir_rights, file_rights))
            continue
        fd, is_dir = opened
        access = dir_rights if is_dir else file_rights
        if access:
            ready.append(struct.pack("=Qi", access, fd))
    prepared = _landlock.PreparedLandlock(
        prepared.abi,
        prepared.ruleset_attr,
        tuple(local),
        prepared.ports,
        prepared.restrict_flags,
        rules=tuple(ready),
    )
    return prepared, _seccomp_filters(policy.mode)


def _shows_host(mounts: tuple[MountOp, ...], path: str) -> bool:
    """Whether ``path`` in the cell is the host's own inode (the last mount
    that covers it is a bind of the host)."""
    covering: MountOp | None = None
    for op in mounts:
        if op.kind == "symlink":
            continue
        if path == op.dst or path.startswith(op.dst.rstrip("/") + "/"):
            covering = op
    return covering is not None and covering.kind == "bind"


_HOST_FDS: dict[str, tuple[int, bool, float]] = {}
_HOST_FDS_MAX = 256
_REVALIDATE_AFTER = 2.0
"""Seconds a kept descriptor is trusted before its path is looked up again: a
file replaced on the host since then would otherwise keep the old inode's
grant (and the new file none: the mistake fails closed)."""


def _host_fd(path: str) -> tuple[int, bool] | None:
    now = time.monotonic()
    kept = _HOST_FDS.get(path)
    if kept is not None:
        fd, is_dir, checked = kept
        if now - checked < _REVALIDATE_AFTER:
            return fd, is_dir
        try:
            current = os.stat(path)
            held = os.fstat(fd)
            if (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino):
                _HOST_FDS[path] = (fd, is_dir, now)
                return fd, is_dir
        except OSError:
            pass
        os.close(fd)
        del _HOST_FDS[path]
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return None  # gone, or not reachable from here: the child will try
    if len(_HOST_FDS) >= _HOST_FDS_MAX:
        oldest = next(iter(_HOST_FDS))
        os.close(_HOST_FDS.pop(oldest)[0])
    is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
    _HOST_FDS[path] = (fd, is_dir, now)
    return fd, is_dir


_FILTERS: dict[str, tuple[tuple[bytes, bool], ...]] = {}


def _seccomp_filters(mode: str) -> tuple[tuple[bytes, bool], ...]:
    cached = _FILTERS.get(mode)
    if cached is None:
        # The deny filter logs every refusal; the clone3 one must not (glibc
        # falls back from clone3 to clone on every thread it starts).
        deny, clone3 = _seccomp.build_filters("audit" if mode == "audit" else "enforce")
        cached = ((deny, True), (clone3, False))
        _FILTERS[mode] = cached
    return cached
