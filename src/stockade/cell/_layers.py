"""The cell's Landlock ruleset and seccomp filters, prepared in the parent.

Joins the plan (what the view shows) with the policy (ports, mode) into what
``_launch`` hands to the child. Kept apart from ``_plan`` so that planning
stays free of kernel specifics.
"""

from __future__ import annotations

from stockade.cell import _landlock, _seccomp
from stockade.cell._plan import CellPlan
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
    prepared = _landlock.PreparedLandlock(
        prepared.abi,
        prepared.ruleset_attr,
        prepared.paths + tuple(extra),
        prepared.ports,
        prepared.restrict_flags,
    )
    return prepared, _seccomp_filters(policy.mode)


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
