"""What this host offers the cell, and what a policy needs of it.

``probe()`` looks at the kernel with cheap checks only (a few syscalls and file
reads, well under a millisecond once ``ctypes`` is loaded), so ``stockade exec``
can run it on every launch; ``probe(deep=True)`` adds the costly ones that only
``stockade doctor`` runs (forking a child that creates user namespaces, asking
the audit subsystem its status, running ``bwrap --version``).

``requirements(policy)`` lists the host features a policy needs, ``assess``
says which of them this host meets, and ``check`` raises one ``HostError``
naming every one it lacks: stockade never runs a cell with less protection than
its policy asked for.

Imports stay light on purpose (no ``re``, ``json`` or ``rich``): this module is on
the launch path.
"""

from __future__ import annotations

import os
from typing import Generic, TypeVar

from stockade._slots import Frozen
from stockade.errors import HostError
from stockade.policy._model import Policy

T = TypeVar("T")

# <linux/landlock.h>
SYS_LANDLOCK_CREATE_RULESET = 444
"""The same number on every architecture (added to the unified table in 5.13)."""
LANDLOCK_CREATE_RULESET_VERSION = 1 << 0

LANDLOCK_ABI_KERNEL = {1: "5.13", 2: "5.19", 3: "6.2", 4: "6.7", 5: "6.10", 6: "6.12", 7: "6.15"}
"""The first Linux release with each Landlock ABI (Documentation/userspace-api/landlock.rst)."""
LANDLOCK_ABI_BRINGS = {
    1: "filesystem access rules",
    2: "file reparenting (LANDLOCK_ACCESS_FS_REFER)",
    3: "truncate rules",
    4: "TCP bind/connect port rules",
    5: "device ioctl rules",
    6: "scoping of abstract unix sockets and signals",
    7: "audit records of denials",
}

# <linux/seccomp.h>
SECCOMP_GET_ACTION_AVAIL = 2
SECCOMP_ACTIONS = {
    "kill_process": 0x80000000,
    "kill_thread": 0x00000000,
    "trap": 0x00030000,
    "errno": 0x00050000,
    "user_notif": 0x7FC00000,
    "trace": 0x7FF00000,
    "log": 0x7FFC0000,
    "allow": 0x7FFF0000,
}
SYS_SECCOMP = {"x86_64": 317, "aarch64": 277, "riscv64": 277}
"""seccomp(2) by ``uname -m`` (arch/*/syscall tables); elsewhere the probe reads
/proc/sys/kernel/seccomp/actions_avail instead."""
SECCOMP_NEEDED = ("kill_process", "errno", "log", "allow")
"""The actions the cell's filters return (``stockade.cell._seccomp``)."""


def seccomp_logged_needed(mode: str) -> tuple[str, ...]:
    """The actions the kernel must log (``kernel.seccomp.actions_logged``) for the
    record to show what the filters of ``mode`` refuse: in ``enforce`` the refusals
    themselves, in ``audit`` the SECCOMP_RET_LOG that stands in for them."""
    return ("errno", "kill_process") if mode == "enforce" else ("log",)


# <linux/sched.h>
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

# <linux/capability.h>
CAP_SYS_ADMIN = 21
CAP_AUDIT_CONTROL = 30
CAP_AUDIT_READ = 37

# <linux/netlink.h>, <linux/audit.h>
AF_NETLINK = 16
NETLINK_AUDIT = 9
AUDIT_GET = 1000

NAMESPACES = ("user", "mnt", "pid", "net", "ipc", "uts", "cgroup")
"""The namespaces every cell gets, as named under /proc/self/ns."""


class Fact(Frozen, Generic[T]):
    """One thing seen about the host: its value, how it was seen and, when it
    falls short of what stockade can use, what to do about it."""

    _fields = ("value", "how", "fix")
    __slots__ = _fields
    value: T
    how: str
    fix: str | None

    def __init__(self, value: T, how: str, fix: str | None = None) -> None:
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "how", how)
        object.__setattr__(self, "fix", fix)


class HostFacts(Frozen):
    """Everything ``probe`` saw. Facts of the deep probe are ``None`` when it did not run."""

    _fields = (
        "kernel",
        "root",
        "capabilities",
        "landlock_abi",
        "seccomp",
        "seccomp_actions",
        "seccomp_actions_logged",
        "namespaces",
        "userns",
        "userns_apparmor",
        "cgroup_v2",
        "cgroup_v2_controllers",
        "cgroup_v1",
        "cgroup_memory",
        "cgroup_pids",
        "cgroup_cpu",
        "cgroup_kill",
        "audit",
        "bwrap",
        "userns_tested",
        "audit_enabled",
        "bwrap_version",
        "workbench",
    )
    __slots__ = _fields
    kernel: Fact[str]
    root: Fact[bool]
    """Effective uid 0 (not the same as holding capabilities)."""
    capabilities: Fact[tuple[str, ...]]
    """The effective capabilities stockade cares about."""
    landlock_abi: Fact[int]
    """0 when Landlock is absent or disabled."""
    seccomp: Fact[bool]
    """seccomp filters (SECCOMP_SET_MODE_FILTER) are available."""
    seccomp_actions: Fact[tuple[str, ...]]
    """Actions a filter may return here (SECCOMP_GET_ACTION_AVAIL)."""
    seccomp_actions_logged: Fact[tuple[str, ...] | None]
    """Actions whose use the kernel logs (/proc/sys/kernel/seccomp/actions_logged)."""
    namespaces: Fact[tuple[str, ...]]
    """Of ``NAMESPACES``, the kinds this kernel has."""
    userns: Fact[bool]
    """This process may create a user namespace (and the others inside it)."""
    userns_apparmor: Fact[bool]
    """Ubuntu's AppArmor restriction of unprivileged user namespaces is in force."""
    cgroup_v2: Fact[str | None]
    """This process's own cgroup v2 directory; ``None`` without a v2 hierarchy."""
    cgroup_v2_controllers: Fact[tuple[str, ...]]
    """Controllers the v2 hierarchy offers this process's own cgroup."""
    cgroup_v1: Fact[tuple[str, ...]]
    """Controllers of the mounted cgroup v1 hierarchies."""
    cgroup_memory: Fact[str | None]
    """Which hierarchy would enforce a cell's memory limit: "v2", "v1" or ``None``."""
    cgroup_pids: Fact[str | None]
    cgroup_cpu: Fact[str | None]
    cgroup_kill: Fact[str]
    """How a cell's processes are all killed at once: "cgroup.kill", "cgroup.freeze",
    "freezer" (v1), or "signals" (a loop, not atomic)."""
    audit: Fact[bool]
    """The kernel audit log can be read over NETLINK_AUDIT (denial events)."""
    bwrap: Fact[str | None]
    """Path of bubblewrap, used only by benchmarks."""
    # -- deep probe only
    userns_tested: Fact[bool] | None
    """A forked child created a user namespace and the six others inside it."""
    audit_enabled: Fact[int | None] | None
    """The kernel's audit ``enabled`` (0 off, 1 on, 2 locked), from AUDIT_GET."""
    bwrap_version: Fact[str | None] | None
    workbench: Fact[str] | None
    """How a workbench's ``/`` is made here: "overlay" (overlayfs mounted in
    the cell's user namespace over the idmapped image) or "copy" (the image
    copied for each run); the cheap probe fills it in (``_workbench_layers``)."""

    def __init__(
        self,
        kernel: Fact[str],
        root: Fact[bool],
        capabilities: Fact[tuple[str, ...]],
        landlock_abi: Fact[int],
        seccomp: Fact[bool],
        seccomp_actions: Fact[tuple[str, ...]],
        seccomp_actions_logged: Fact[tuple[str, ...] | None],
        namespaces: Fact[tuple[str, ...]],
        userns: Fact[bool],
        userns_apparmor: Fact[bool],
        cgroup_v2: Fact[str | None],
        cgroup_v2_controllers: Fact[tuple[str, ...]],
        cgroup_v1: Fact[tuple[str, ...]],
        cgroup_memory: Fact[str | None],
        cgroup_pids: Fact[str | None],
        cgroup_cpu: Fact[str | None],
        cgroup_kill: Fact[str],
        audit: Fact[bool],
        bwrap: Fact[str | None],
        userns_tested: Fact[bool] | None = None,
        audit_enabled: Fact[int | None] | None = None,
        bwrap_version: Fact[str | None] | None = None,
        workbench: Fact[str] | None = None,
    ) -> None:
        object.__setattr__(self, "kernel", kernel)
        object.__setattr__(self, "root", root)
        object.__setattr__(self, "capabilities", capabilities)
        object.__setattr__(self, "landlock_abi", landlock_abi)
        object.__setattr__(self, "seccomp", seccomp)
        object.__setattr__(self, "seccomp_actions", seccomp_actions)
        object.__setattr__(self, "seccomp_actions_logged", seccomp_actions_logged)
        object.__setattr__(self, "namespaces", namespaces)
        object.__setattr__(self, "userns", userns)
        object.__setattr__(self, "userns_apparmor", userns_apparmor)
        object.__setattr__(self, "cgroup_v2", cgroup_v2)
        object.__setattr__(self, "cgroup_v2_controllers", cgroup_v2_controllers)
        object.__setattr__(self, "cgroup_v1", cgroup_v1)
        object.__setattr__(self, "cgroup_memory", cgroup_memory)
        object.__setattr__(self, "cgroup_pids", cgroup_pids)
        object.__setattr__(self, "cgroup_cpu", cgroup_cpu)
        object.__setattr__(self, "cgroup_kill", cgroup_kill)
        object.__setattr__(self, "audit", audit)
        object.__setattr__(self, "bwrap", bwrap)
        object.__setattr__(self, "userns_tested", userns_tested)
        object.__setattr__(self, "audit_enabled", audit_enabled)
        object.__setattr__(self, "bwrap_version", bwrap_version)
        object.__setattr__(self, "workbench", workbench)


# --------------------------------------------------------------------------- reading


def _read(path: str) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, 65536).decode().strip()
    except OSError:
        return None
    finally:
        os.close(fd)


def _read_int(path: str) -> int | None:
    text = _read(path)
    try:
        return None if text is None else int(text.split()[0])
    except (ValueError, IndexError):
        return None


def _kernel_version(release: str) -> tuple[int, int]:
    parts = release.split(".")
    try:
        major = int(parts[0])
        minor = int("".join(c for c in parts[1].split("-")[0] if c.isdigit()) or 0)
    except (ValueError, IndexError):
        return (0, 0)
    return (major, minor)


def _cap_eff() -> int:
    status = _read("/proc/self/status") or ""
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def _syscall(nr: int, *args: object) -> tuple[int, int]:
    """(return value, errno) of a raw system call (``stockade.cell._syscall``)."""
    from stockade.cell._syscall import syscall

    try:
        return syscall(nr, *args), 0  # type: ignore[arg-type]
    except OSError as exc:
        return -1, exc.errno or 0


# --------------------------------------------------------------------------- the cheap probe


def _landlock() -> Fact[int]:
    how = "landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)"
    abi, err = _syscall(SYS_LANDLOCK_CREATE_RULESET, None, 0, LANDLOCK_CREATE_RULESET_VERSION)
    if abi > 0:
        return Fact(abi, f"{how} returned {abi}", None if abi >= 7 else _landlock_fix(abi))
    import errno

    if err == errno.EOPNOTSUPP:
        return Fact(
            0,
            f"{how} failed with EOPNOTSUPP: built into the kernel but not enabled",
            "add landlock to the lsm= kernel parameter (e.g. lsm=landlock,lockdown,yama,"
            "apparmor,bpf, keeping the rest of /sys/kernel/security/lsm) and reboot",
        )
    return Fact(
        0,
        f"{how} failed with {errno.errorcode.get(err, err)}: the kernel has no Landlock",
        "use a kernel built with CONFIG_SECURITY_LANDLOCK=y, Linux 6.15 or later for every "
        "Landlock feature stockade uses",
    )


def _landlock_fix(abi: int) -> str:
    missing = [f"{LANDLOCK_ABI_BRINGS[n]} (ABI {n})" for n in range(abi + 1, 8)]
    return (
        f"Landlock ABI {abi} lacks {', '.join(missing)}; upgrade the kernel to Linux "
        f"{LANDLOCK_ABI_KERNEL[7]} or later"
    )


def _seccomp() -> tuple[Fact[bool], Fact[tuple[str, ...]], Fact[tuple[str, ...] | None]]:
    import ctypes

    logged_text = _read("/proc/sys/kernel/seccomp/actions_logged")
    logged_all = tuple(logged_text.split()) if logged_text is not None else None
    unlogged = [a for a in ("kill_process", "errno", "log") if a not in (logged_all or ())]
    logged = Fact(
        logged_all,
        "/proc/sys/kernel/seccomp/actions_logged"
        + (" is missing (Linux < 4.14)" if logged_all is None else ""),
        None
        if not unlogged
        else "log them: echo '"
        + " ".join(dict.fromkeys([*(logged_all or ()), *unlogged]))
        + "' > /proc/sys/kernel/seccomp/actions_logged",
    )
    nr = SYS_SECCOMP.get(os.uname().machine)
    if nr is None:
        avail = _read("/proc/sys/kernel/seccomp/actions_avail")
        actions = tuple(avail.split()) if avail else ()
        how = "/proc/sys/kernel/seccomp/actions_avail (no seccomp(2) number for this machine)"
    else:
        actions_l: list[str] = []
        for name, value in SECCOMP_ACTIONS.items():
            action = ctypes.c_uint32(value)
            # 0 when available; EOPNOTSUPP when not; ENOSYS/EINVAL without seccomp(2)
            # or SECCOMP_GET_ACTION_AVAIL (Linux < 4.14).
            ret, _ = _syscall(nr, SECCOMP_GET_ACTION_AVAIL, 0, ctypes.byref(action))
            if ret == 0:
                actions_l.append(name)
        actions = tuple(actions_l)
        how = "seccomp(SECCOMP_GET_ACTION_AVAIL) for each action"
    ok = all(a in actions for a in SECCOMP_NEEDED)
    filt = Fact(
        ok,
        how,
        None if ok else "use a kernel built with CONFIG_SECCOMP_FILTER=y, Linux 4.14 or later",
    )
    lacking = [a for a in (*SECCOMP_NEEDED, "user_notif") if a not in actions]
    acts = Fact(
        actions,
        how,
        None
        if not lacking
        else f"this kernel lacks seccomp actions {', '.join(lacking)}; upgrade to Linux 5.0 "
        "or later (user_notif 5.0, log 4.14)",
    )
    return filt, acts, logged


def _userns(privileged: bool) -> tuple[Fact[bool], Fact[bool]]:
    max_ns = _read_int("/proc/sys/user/max_user_namespaces")
    clone = _read_int("/proc/sys/kernel/unprivileged_userns_clone")
    restrict = _read_int("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
    seen = [
        f"user.max_user_namespaces={max_ns}",
        f"kernel.unprivileged_userns_clone={clone if clone is not None else 'absent'}",
        "kernel.apparmor_restrict_unprivileged_userns="
        + (str(restrict) if restrict is not None else "absent"),
        "CAP_SYS_ADMIN " + ("held" if privileged else "not held"),
    ]
    how = ", ".join(seen)
    apparmor_on = restrict == 1 and not privileged
    apparmor = Fact(
        apparmor_on,
        how,
        "AppArmor denies capabilities in user namespaces created without a profile that allows "
        "them (Ubuntu 24.04); install an AppArmor profile granting 'userns,' to the stockade "
        "interpreter (see docs/DOCTOR.md), or run sysctl -w "
        "kernel.apparmor_restrict_unprivileged_userns=0"
        if apparmor_on
        else None,
    )
    if max_ns == 0:
        return Fact(False, how, "sysctl -w user.max_user_namespaces=15000"), apparmor
    if not privileged and clone == 0:
        return Fact(False, how, "sysctl -w kernel.unprivileged_userns_clone=1 (Debian)"), apparmor
    if apparmor_on:
        return Fact(False, how, apparmor.fix), apparmor
    if not os.path.exists("/proc/self/ns/user"):
        return Fact(False, how, "use a kernel built with CONFIG_USER_NS=y"), apparmor
    return Fact(True, how), apparmor


def _cgroups(
    release: str,
) -> tuple[
    Fact[str | None],
    Fact[tuple[str, ...]],
    Fact[tuple[str, ...]],
    dict[str, Fact[str | None]],
    Fact[str],
]:
    from stockade.cell._cgroup import discover_layout

    lay = discover_layout()
    v2 = lay.v2
    limits = ("memory", "pids", "cpu")
    if v2 is None:
        v2_dir: Fact[str | None] = Fact(
            None, "no cgroup2 mount in /proc/self/mountinfo", "mount cgroup2 at /sys/fs/cgroup"
        )
        v2_ctl: Fact[tuple[str, ...]] = Fact((), "no cgroup v2 hierarchy")
        usable: tuple[str, ...] = ()
    else:
        v2_dir = Fact(v2.own, f"cgroup2 mounted at {v2.mount}; own cgroup from /proc/self/cgroup")
        # A non-root cgroup holding processes cannot enable controllers for its
        # children; stockade moves itself to a leaf when it is the only one
        # there (a systemd unit or scope with Delegate=yes), so a controller
        # counts when it is enabled already or could be enabled that way.
        procs = (_read(f"{v2.own}/cgroup.procs") or "").split()
        alone = v2.is_root or procs == [str(os.getpid())]
        usable = tuple(c for c in v2.controllers if c in v2.enabled or alone)
        v2_ctl = Fact(
            v2.controllers,
            f"{v2.own}/cgroup.controllers; subtree_control enables "
            + (", ".join(v2.enabled) or "none")
            + (" (root cgroup: can enable any)" if v2.is_root else "")
            + (" (this process alone in it: can enable any)" if alone and not v2.is_root else ""),
        )
    v1_names = tuple(sorted(lay.v1))
    v1 = Fact(v1_names, "cgroup v1 mounts in /proc/self/mountinfo" if v1_names else "none mounted")
    per: dict[str, Fact[str | None]] = {}
    for c in limits:
        if c in usable:
            assert v2 is not None
            per[c] = Fact("v2", f"{c} controller delegated in {v2.own}")
        elif c in lay.v1:
            per[c] = Fact("v1", f"cgroup v1 {c} hierarchy at {lay.v1[c].mount}")
        else:
            why = (
                "no cgroup v2 hierarchy"
                if v2 is None
                else f"{c} not in {v2.own}/cgroup.controllers"
                if c not in v2.controllers
                else f"{c} available but not enabled in {v2.own}/cgroup.subtree_control, "
                "and other processes share that cgroup (so it cannot be enabled)"
            )
            per[c] = Fact(
                None,
                f"{why}; no cgroup v1 {c} hierarchy",
                f"delegate the {c} controller to stockade's cgroup (systemd: run it in a unit "
                f"or scope with Delegate=yes, e.g. systemd-run --scope -p Delegate=yes) or "
                f"mount the cgroup v1 {c} hierarchy",
            )
    kill: Fact[str]
    if v2 is not None and _v2_has(v2.own, v2.is_root, "cgroup.kill", release, (5, 14)):
        kill = Fact("cgroup.kill", "cgroup.kill in the cgroup v2 hierarchy (Linux 5.14)")
    elif v2 is not None and _v2_has(v2.own, v2.is_root, "cgroup.freeze", release, (5, 2)):
        kill = Fact("cgroup.freeze", "cgroup.freeze in the cgroup v2 hierarchy (Linux 5.2)")
    elif "freezer" in lay.v1:
        kill = Fact("freezer", f"cgroup v1 freezer at {lay.v1['freezer'].mount}")
    else:
        kill = Fact(
            "signals",
            "neither cgroup.kill, cgroup.freeze nor a v1 freezer",
            "use Linux 5.14 or later with cgroup2 mounted, so that a cell's processes can "
            "all be killed at once",
        )
    return v2_dir, v2_ctl, v1, per, kill


def _v2_has(own: str, is_root: bool, name: str, release: str, since: tuple[int, int]) -> bool:
    # The root cgroup has neither cgroup.kill nor cgroup.freeze: look in a child.
    if not is_root:
        return os.path.exists(f"{own}/{name}")
    try:
        with os.scandir(own) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    return os.path.exists(f"{entry.path}/{name}")
    except OSError:
        pass
    return _kernel_version(release) >= since


def _audit(caps: int) -> Fact[bool]:
    import _socket

    try:
        sock = _socket.socket(AF_NETLINK, _socket.SOCK_RAW, NETLINK_AUDIT)
    except OSError as exc:
        return Fact(
            False,
            f"socket(AF_NETLINK, SOCK_RAW, NETLINK_AUDIT) failed: {exc.strerror}",
            "use a kernel built with CONFIG_AUDIT=y, and run stockade in the initial network namespace",
        )
    sock.close()
    read = bool(caps >> CAP_AUDIT_READ & 1)
    control = bool(caps >> CAP_AUDIT_CONTROL & 1)
    how = (
        "NETLINK_AUDIT socket opened; CapEff "
        + ("has" if read else "lacks")
        + " CAP_AUDIT_READ, "
        + ("has" if control else "lacks")
        + " CAP_AUDIT_CONTROL"
    )
    if not read:
        return Fact(
            False,
            how,
            "reading the kernel's denial records needs CAP_AUDIT_READ: run the stockade daemon "
            "as root, or grant it CAP_AUDIT_READ and CAP_AUDIT_CONTROL (setcap or systemd "
            "AmbientCapabilities=)",
        )
    return Fact(True, how)


def _which(name: str) -> str | None:
    # shutil.which would import fnmatch and re on the launch path.
    for d in os.environ.get("PATH", os.defpath).split(os.pathsep):
        path = f"{d or '.'}/{name}"
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


_CAP_NAMES = {CAP_SYS_ADMIN: "sys_admin", CAP_AUDIT_CONTROL: "audit_control", 37: "audit_read"}


def _workbench_layers(release: str) -> Fact[str]:
    """Overlay for a workbench where the kernel has overlayfs that mounts in a
    user namespace over idmapped layers (Linux 5.19), else a copy per run."""
    listed = _read("/proc/filesystems") or ""
    has = any(line.split()[-1:] == ["overlay"] for line in listed.splitlines())
    new_enough = _kernel_version(release) >= (5, 19)
    if has and new_enough:
        return Fact("overlay", "overlay in /proc/filesystems, Linux >= 5.19 (idmapped layers in a userns)")
    why = "no overlay in /proc/filesystems" if not has else f"Linux {release} < 5.19"
    return Fact(
        "copy",
        f"{why}: each workbench run copies its image",
        "modprobe overlay, or run Linux 5.19 or later, for workbenches that start without a copy",
    )


def _cheap() -> HostFacts:
    release = os.uname().release
    caps = _cap_eff()
    privileged = bool(caps >> CAP_SYS_ADMIN & 1)
    euid = os.geteuid()
    seccomp, actions, logged = _seccomp()
    userns, apparmor = _userns(privileged)
    v2_dir, v2_ctl, v1, per, kill = _cgroups(release)
    present = tuple(n for n in NAMESPACES if os.path.exists(f"/proc/self/ns/{n}"))
    absent = [n for n in NAMESPACES if n not in present]
    bwrap = _which("bwrap")
    return HostFacts(
        kernel=Fact(release, "uname -r"),
        root=Fact(euid == 0, f"geteuid() = {euid}"),
        capabilities=Fact(
            tuple(name for bit, name in sorted(_CAP_NAMES.items()) if caps >> bit & 1),
            f"CapEff {caps:#x} in /proc/self/status",
        ),
        landlock_abi=_landlock(),
        seccomp=seccomp,
        seccomp_actions=actions,
        seccomp_actions_logged=logged,
        namespaces=Fact(
            present,
            "/proc/self/ns",
            None
            if not absent
            else f"use a kernel built with the {', '.join(absent)} namespaces "
            "(CONFIG_USER_NS, CONFIG_PID_NS, CONFIG_NET_NS, CONFIG_IPC_NS, CONFIG_UTS_NS, "
            "CONFIG_CGROUPS)",
        ),
        userns=userns,
        userns_apparmor=apparmor,
        cgroup_v2=v2_dir,
        cgroup_v2_controllers=v2_ctl,
        cgroup_v1=v1,
        cgroup_memory=per["memory"],
        cgroup_pids=per["pids"],
        cgroup_cpu=per["cpu"],
        cgroup_kill=kill,
        audit=_audit(caps),
        workbench=_workbench_layers(release),
        bwrap=Fact(
            bwrap,
            "bwrap on PATH",
            None if bwrap else "optional, for benchmarks only: apt-get install bubblewrap",
        ),
    )


# --------------------------------------------------------------------------- the deep probe


def _userns_test() -> Fact[bool]:
    """Fork a child that creates a user namespace and, inside it, the six others."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    others = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    others |= CLONE_NEWCGROUP
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only async-signal-safe work, then _exit
        code = 0
        try:
            os.close(r)
            if libc.unshare(CLONE_NEWUSER) != 0:
                code = 1
            elif libc.unshare(others) != 0:
                code = 2
            os.write(w, str(ctypes.get_errno() if code else 0).encode())
        finally:
            os._exit(code)
    os.close(w)
    try:
        err = int(os.read(r, 16) or b"0")
    finally:
        os.close(r)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code == 0:
        return Fact(True, "a forked child unshared a user namespace, then the other six in it")
    step = "unshare(CLONE_NEWUSER)" if code == 1 else "unshare of mnt/pid/net/ipc/uts/cgroup"
    return Fact(
        False,
        f"in a forked child, {step} failed: {os.strerror(err) if err else f'exit {code}'}",
        "see the user namespace fact above; on Ubuntu 24.04 the AppArmor restriction lets "
        "unshare(CLONE_NEWUSER) succeed but denies what follows",
    )


def _audit_status() -> Fact[int | None]:
    import _socket
    import struct

    try:
        sock = _socket.socket(AF_NETLINK, _socket.SOCK_RAW, NETLINK_AUDIT)
    except OSError as exc:
        return Fact(None, f"NETLINK_AUDIT socket: {exc.strerror}")
    try:
        sock.settimeout(1.0)
        sock.bind((0, 0))
        # struct nlmsghdr: len, type, flags (NLM_F_REQUEST), seq, pid
        sock.send(struct.pack("=IHHII", 16, AUDIT_GET, 0x1, 1, 0))
        reply = sock.recv(8192)
    except OSError as exc:
        return Fact(
            None,
            f"AUDIT_GET failed: {exc.strerror or exc}",
            "AUDIT_GET needs CAP_AUDIT_CONTROL in the initial user namespace",
        )
    finally:
        sock.close()
    _length, kind = struct.unpack_from("=IH", reply)
    if kind == 2:  # NLMSG_ERROR: int error, then the request
        (error,) = struct.unpack_from("=i", reply, 16)
        return Fact(None, f"AUDIT_GET answered {os.strerror(-error)}")
    # struct audit_status: mask, enabled, failure, pid, ...
    enabled = struct.unpack_from("=II", reply, 16)[1]
    return Fact(
        enabled,
        f"AUDIT_GET: enabled={enabled}",
        None
        if enabled
        else "the daemon turns audit on with AUDIT_SET (needs CAP_AUDIT_CONTROL), or run auditctl -e 1",
    )


def _bwrap_version(path: str | None) -> Fact[str | None]:
    if path is None:
        return Fact(None, "no bwrap on PATH")
    import subprocess

    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Fact(None, f"{path} --version failed: {exc}")
    return Fact(out.stdout.strip().removeprefix("bubblewrap ") or None, f"{path} --version")


_cache: dict[bool, HostFacts] = {}


def probe(*, deep: bool = False) -> HostFacts:
    """What this host offers, cached for the life of the process.

    The cheap probe costs a few syscalls and file reads; ``deep`` adds a forked
    user-namespace test, an AUDIT_GET request and ``bwrap --version``.
    """
    facts = _cache.get(deep)
    if facts is None:
        facts = _cache.get(False) or _cheap()
        _cache[False] = facts
        if deep:
            facts = facts._replace(
                userns_tested=_userns_test(),
                audit_enabled=_audit_status(),
                bwrap_version=_bwrap_version(facts.bwrap.value),
            )
            _cache[True] = facts
    return facts


# --------------------------------------------------------------------------- requirements


class Requirement(Frozen):
    """A host feature a policy needs."""

    _fields = ("feature", "needs", "why")
    __slots__ = _fields
    feature: str
    """Stable key, as in ``HostError.feature``: ``landlock.net``, ``cgroup.memory``, ..."""
    needs: str
    """What the host must offer."""
    why: str
    """What in the policy (or in every cell) needs it."""

    def __init__(self, feature: str, needs: str, why: str) -> None:
        object.__setattr__(self, "feature", feature)
        object.__setattr__(self, "needs", needs)
        object.__setattr__(self, "why", why)


class Finding(Frozen):
    """Whether this host meets one requirement."""

    _fields = ("requirement", "met", "have", "fix")
    __slots__ = _fields
    requirement: Requirement
    met: bool
    have: str
    """What the host offers instead, or in full."""
    fix: str | None
    """What to do when it is not met."""

    def __init__(self, requirement: Requirement, met: bool, have: str, fix: str | None) -> None:
        object.__setattr__(self, "requirement", requirement)
        object.__setattr__(self, "met", met)
        object.__setattr__(self, "have", have)
        object.__setattr__(self, "fix", fix)


def requirements(policy: Policy) -> list[Requirement]:
    """The host features ``policy`` needs, in the order the cell sets them up."""
    reqs = [
        Requirement(
            "namespaces",
            "user, mount, pid, net, ipc, uts and cgroup namespaces",
            "every cell runs in its own namespaces",
        ),
        Requirement(
            "userns",
            "permission to create user namespaces (and the others inside them)",
            "the cell's root is an unprivileged user outside it",
        ),
        Requirement(
            "landlock.fs",
            "Landlock ABI 3 (Linux 6.2): filesystem rules including truncate",
            "the cell's filesystem view",
        ),
        Requirement(
            "landlock.net",
            "Landlock ABI 4 (Linux 6.7): TCP bind/connect port rules",
            "the cell's TCP rules (only the gateway and loopback_ports)",
        ),
        Requirement(
            "landlock.scope",
            "Landlock ABI 6 (Linux 6.12): scoping of abstract unix sockets and signals",
            "a cell must not signal or reach abstract sockets outside it",
        ),
        Requirement(
            "landlock.audit",
            "Landlock ABI 7 (Linux 6.15): audit records of Landlock denials",
            "the record shows every filesystem and network refusal of the kernel",
        ),
        Requirement(
            "seccomp",
            "seccomp filters with actions " + ", ".join(SECCOMP_NEEDED),
            "the cell's syscall filter",
        ),
        Requirement(
            "seccomp.log",
            "kernel.seccomp.actions_logged holding " + " and ".join(seccomp_logged_needed(policy.mode)),
            "mode: audit lets refused syscalls through with SECCOMP_RET_LOG"
            if policy.mode == "audit"
            else "refused syscalls reach the record",
        ),
        Requirement(
            "unix.guard",
            "seccomp user notification (Linux 5.0) and cgroup/connect_unix BPF programs (Linux 6.7)",
            "no host unix socket is reachable from a cell (the connect supervisor, docs/CELL.md)",
        ),
        Requirement(
            "audit",
            "the kernel audit log over NETLINK_AUDIT (CAP_AUDIT_READ)",
            "the kernel's denials become events",
        ),
        Requirement(
            "cgroup",
            "a cgroup hierarchy that kills or freezes a whole cell (cgroup.kill, "
            "cgroup.freeze or the v1 freezer)",
            "when a cell ends, every process in it ends too",
        ),
    ]
    if policy.image is not None or policy.user is not None:
        reqs.append(
            Requirement(
                "workbench",
                "root, to map a range of ids (root inside, never the host's); overlayfs in user "
                "namespaces over idmapped layers (Linux 5.19), or else a copy of the image per run",
                f"image: {policy.image}" if policy.image is not None else f"user: {policy.user}",
            )
        )
    limits = policy.limits
    if limits.memory is not None:
        reqs.append(
            Requirement(
                "cgroup.memory",
                "a memory controller (cgroup v2 delegated, or v1)",
                f"limits.memory: {limits.memory} bytes",
            )
        )
    if limits.pids is not None:
        reqs.append(
            Requirement(
                "cgroup.pids",
                "a pids controller (cgroup v2 delegated, or v1)",
                f"limits.pids: {limits.pids}",
            )
        )
    if limits.cpu is not None:
        reqs.append(
            Requirement(
                "cgroup.cpu",
                "a cpu controller with CFS bandwidth (cgroup v2 delegated, or v1)",
                f"limits.cpu: {limits.cpu}",
            )
        )
    return reqs


def _landlock_finding(req: Requirement, facts: HostFacts, abi: int, lacks: str) -> Finding:
    have = facts.landlock_abi.value
    if have >= abi:
        return Finding(req, True, f"Landlock ABI {have}", None)
    if have == 0:
        return Finding(req, False, "no Landlock", facts.landlock_abi.fix)
    return Finding(
        req,
        False,
        f"Landlock ABI {have} lacks {lacks} (ABI {abi}, Linux ≥ {LANDLOCK_ABI_KERNEL[abi]})",
        f"upgrade the kernel to Linux {LANDLOCK_ABI_KERNEL[abi]} or later",
    )


def _seccomp_log_finding(req: Requirement, facts: HostFacts, mode: str) -> Finding:
    needed = seccomp_logged_needed(mode)
    absent = [a for a in needed if a not in facts.seccomp_actions.value]
    if absent:
        return Finding(
            req,
            False,
            f"no seccomp action {', '.join(absent)}",
            "upgrade the kernel to Linux 4.14 or later",
        )
    logged = facts.seccomp_actions_logged.value
    if logged is None:
        return Finding(req, False, "no kernel.seccomp.actions_logged", "upgrade to Linux 4.14")
    unlogged = [a for a in needed if a not in logged]
    if unlogged:
        return Finding(
            req,
            False,
            f"{', '.join(unlogged)} not in kernel.seccomp.actions_logged ({' '.join(logged)})",
            facts.seccomp_actions_logged.fix,
        )
    return Finding(req, True, f"actions_logged: {' '.join(logged)}", None)


def _finding(req: Requirement, facts: HostFacts, mode: str) -> Finding:
    f = req.feature
    if f == "namespaces":
        missing = [n for n in NAMESPACES if n not in facts.namespaces.value]
        return Finding(
            req,
            not missing,
            "all seven" if not missing else f"no {', '.join(missing)} namespace",
            facts.namespaces.fix,
        )
    if f == "userns":
        tested = facts.userns_tested
        if tested is not None and not tested.value:
            return Finding(req, False, tested.how, tested.fix or facts.userns.fix)
        ok = facts.userns.value
        return Finding(req, ok, "yes" if ok else facts.userns.how, facts.userns.fix)
    if f == "landlock.fs":
        return _landlock_finding(req, facts, 3, "truncate rules")
    if f == "landlock.net":
        return _landlock_finding(req, facts, 4, "TCP rules")
    if f == "landlock.scope":
        return _landlock_finding(req, facts, 6, "scoping of abstract sockets and signals")
    if f == "landlock.audit":
        return _landlock_finding(req, facts, 7, "audit records")
    if f == "seccomp":
        acts = facts.seccomp_actions.value
        ok = facts.seccomp.value
        return Finding(
            req,
            ok,
            f"actions: {' '.join(acts)}" if acts else "no seccomp filters",
            facts.seccomp.fix,
        )
    if f == "seccomp.log":
        return _seccomp_log_finding(req, facts, mode)
    if f == "unix.guard":
        notif = "user_notif" in facts.seccomp_actions.value
        new_enough = _kernel_version(facts.kernel.value) >= (6, 7)
        ok = notif and new_enough
        have = ", ".join(
            [
                "user notification" if notif else "no seccomp user notification",
                f"Linux {facts.kernel.value}",
            ]
        )
        return Finding(req, ok, have, None if ok else "run on Linux 6.7 or later, as root")
    if f == "audit":
        a = facts.audit
        enabled = facts.audit_enabled
        if a.value and enabled is not None and enabled.value == 0:
            caps = facts.capabilities.value
            if "audit_control" not in caps:
                return Finding(
                    req,
                    False,
                    "audit is off and CAP_AUDIT_CONTROL is missing to turn it on",
                    "run auditctl -e 1, or give the daemon CAP_AUDIT_CONTROL",
                )
        return Finding(req, a.value, a.how, a.fix)
    if f == "workbench":
        layers = facts.workbench or _workbench_layers(facts.kernel.value)
        if not facts.root.value:
            return Finding(req, False, "not root", "run stockade as root (a workbench maps 65535 ids)")
        return Finding(req, True, f"root; {layers.value} ({layers.how})", layers.fix)
    if f == "cgroup":
        k = facts.cgroup_kill
        return Finding(req, k.value != "signals", k.value, k.fix)
    per = {"cgroup.memory": facts.cgroup_memory, "cgroup.pids": facts.cgroup_pids}
    fact = per.get(f, facts.cgroup_cpu)
    ok = fact.value is not None
    return Finding(req, ok, fact.how, fact.fix)


def assess(policy: Policy, facts: HostFacts | None = None) -> list[Finding]:
    """Each requirement of ``policy``, and whether ``facts`` (default: ``probe()``) meet it."""
    facts = probe() if facts is None else facts
    return [_finding(r, facts, policy.mode) for r in requirements(policy)]


def check(policy: Policy, facts: HostFacts | None = None) -> None:
    """Make sure this host can run ``policy``'s cells with all the protection it asks for.

    Raises:
        HostError: naming every feature the host lacks and what to do about each;
            ``feature`` holds their keys, joined by commas.
    """
    missing = [f for f in assess(policy, facts) if not f.met]
    if not missing:
        return
    parts = [f"{m.requirement.feature} ({m.have}" + (f"; {m.fix}" if m.fix else "") + ")" for m in missing]
    raise HostError(
        f"this host lacks what policy {policy.name!r} needs: {'; '.join(parts)}; "
        "run `stockade doctor` for details",
        feature=",".join(m.requirement.feature for m in missing),
    )


__all__ = [
    "Fact",
    "Finding",
    "HostFacts",
    "Requirement",
    "assess",
    "check",
    "probe",
    "requirements",
]
