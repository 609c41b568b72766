"""The cell's Landlock ruleset and seccomp filters, prepared in the parent.

Joins the plan (what the view shows) with the policy (ports, mode) into what
``_launch`` hands to the child. Kept apart from ``_plan`` so that planning
stays free of kernel specifics.
"""

from __future__ import annotations

import collections
import os
import stat
import struct
import threading
import time

from stockade.cell import _landlock, _seccomp
from stockade.cell._plan import CellPlan, MountOp
from stockade.policy import Policy

GATEWAY_PORT = 3128
"""The TCP port on the cell's loopback where the gateway's proxy answers."""
LLM_PORT = 3129
"""The TCP port on the cell's loopback where the LLM endpoint answers. With
``GATEWAY_PORT`` the only ports a default cell may connect to."""

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
        connect_tcp=(GATEWAY_PORT, LLM_PORT, *loopback),
        # Port 0 (the kernel picks one of the ephemeral range): urllib3 binds
        # ('::1', 0) at import to learn whether IPv6 works, so every pip run
        # was a refused bind, noise that teaches users to skip refusals. It
        # gives the agent nothing listen(2) without a bind does not already
        # give (autobind, which Landlock up to ABI 7 cannot refuse): a socket
        # in the cell's own network namespace that no process of the cell may
        # connect to (connect_tcp above), and that nothing outside reaches.
        bind_tcp=(0, *loopback),
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
    # So do the entries of a granted directory that holds a hidden path (its
    # entries are granted one by one: see _plan._grants): there can be any
    # number of them, and one descriptor each, kept here for the ruleset's
    # life, made the daemon die with EMFILE (25,000 files and a socket). The
    # child opens, adds and closes them one at a time, through the binds that
    # show the host's own inodes.
    listed = frozenset(grants.list_dirs)
    ready: list[bytes] = []
    local: list[tuple[bytes, int, int]] = []
    held = HostDescriptors()
    covers = _covers(plan.mounts)
    for raw, dir_rights, file_rights in (*prepared.paths, *extra):
        name = raw.decode()
        entry = _dirname(name) in listed and name not in listed
        opened = held.open(name) if not entry and _shows_host(covers, name) else None
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
        held=held,
    )
    return prepared, _seccomp_filters(policy.mode, plan.setid)


def _covers(mounts: tuple[MountOp, ...]) -> tuple[tuple[str, str, bool], ...]:
    """(path, path + "/", whether it binds the host) of each mount that covers
    a tree, in the plan's order: what ``_shows_host`` looks through."""
    return tuple(
        (op.dst, op.dst.rstrip("/") + "/", op.kind == "bind") for op in mounts if op.kind != "symlink"
    )


def _shows_host(covers: tuple[tuple[str, str, bool], ...], path: str) -> bool:
    """Whether ``path`` in the cell is the host's own inode (the last mount
    that covers it is a bind of the host)."""
    for dst, below, bind in reversed(covers):
        if path == dst or path.startswith(below):
            return bind
    return False


def _dirname(path: str) -> str:
    """``os.path.dirname`` of a str path, without its per-call conversions
    (it runs for each of a ruleset's ~300 paths)."""
    head = path[: path.rfind("/") + 1]
    if head and head != "/" * len(head):
        head = head.rstrip("/")
    return head


class _Shared:
    """One kept ``O_PATH`` descriptor and how many prepared rulesets use it."""

    __slots__ = ("checked", "fd", "identity", "is_dir", "users")

    def __init__(self, fd: int, is_dir: bool, identity: tuple[int, int], checked: float) -> None:
        self.fd = fd
        self.is_dir = is_dir
        self.identity = identity
        self.checked = checked
        self.users = 0


_REVALIDATE_AFTER = 2.0
"""Seconds a shared descriptor is trusted before its path is looked up again. A
file replaced on the host since gets a new descriptor; the old one lives on
for the rulesets that still use it, and is closed when the last lets go."""

_lock = threading.Lock()
_current: dict[str, _Shared] = {}
_orphans: collections.deque[list[tuple[str, _Shared]]] = collections.deque()
"""Descriptors of rulesets collected unclosed (``HostDescriptors.__del__``),
let go by the next holder of ``_lock``."""


class HostDescriptors:
    """The ``O_PATH`` descriptors of host paths that one prepared ruleset names.

    Descriptors are shared between rulesets of the same process (a hundred
    cells of one policy hold one descriptor per path, not a hundred) and
    counted: one is closed only when no ruleset uses it any more, so a rule
    can never come to name another file because its number was reused.
    Thread-safe.
    """

    def __init__(self) -> None:
        self._held: list[tuple[str, _Shared]] = []

    def open(self, path: str) -> tuple[int, bool] | None:
        now = time.monotonic()
        with _lock:
            shared = _current.get(path)
            if shared is not None and now - shared.checked >= _REVALIDATE_AFTER:
                try:
                    st = os.stat(path)
                    same = (st.st_dev, st.st_ino) == shared.identity
                except OSError:
                    same = False
                if same:
                    shared.checked = now
                else:
                    del _current[path]  # its users still hold it; the last closes it
                    shared = None
            if shared is None:
                try:
                    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except OSError:
                    return None  # gone, or not reachable from here: the child will try
                st = os.fstat(fd)
                shared = _Shared(fd, stat.S_ISDIR(st.st_mode), (st.st_dev, st.st_ino), now)
                _current[path] = shared
            shared.users += 1
            self._held.append((path, shared))
            _drain()
        _drain_if_free()
        return shared.fd, shared.is_dir

    def close(self) -> None:
        with _lock:
            held, self._held = self._held, []
            _let_go(held)
            _drain()
        _drain_if_free()

    def __del__(self) -> None:
        # Never ``with _lock`` here: the collector runs this in whichever
        # thread allocates when it triggers, which may be one inside ``open``
        # holding the lock, and it would wait for itself for ever (an unclosed
        # Cell collected so hung an Inspect conformance run, 3 runs in 6).
        held, self._held = self._held, []
        if held:
            _orphans.append(held)
            _drain_if_free()


def _let_go(held: list[tuple[str, _Shared]]) -> None:
    """Count one user less of each; close what nobody uses. Holds ``_lock``."""
    for path, shared in held:
        shared.users -= 1
        if shared.users == 0:
            # Unused: close it (a process that ran cells for many
            # workspaces must not keep one descriptor per past path).
            if _current.get(path) is shared:
                del _current[path]
            os.close(shared.fd)


def _drain() -> None:
    """Let go of what collected rulesets held. Holds ``_lock``."""
    while _orphans:
        _let_go(_orphans.popleft())


def _drain_if_free() -> None:
    # What a collection queued in another thread while this one held the lock.
    if _orphans and _lock.acquire(blocking=False):
        try:
            _drain()
        finally:
            _lock.release()


_FILTERS: dict[tuple[str, bool], tuple[tuple[bytes, bool], ...]] = {}


def _seccomp_filters(mode: str, setid: bool = False) -> tuple[tuple[bytes, bool], ...]:
    cached = _FILTERS.get((mode, setid))
    if cached is None:
        # The deny filter logs every refusal; the clone3 one must not (glibc
        # falls back from clone3 to clone on every thread it starts).
        deny, clone3 = _seccomp.build_filters("audit" if mode == "audit" else "enforce", setid=setid)
        cached = ((deny, True), (clone3, False))
        _FILTERS[(mode, setid)] = cached
    return cached
