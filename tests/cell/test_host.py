"""The host probe, a policy's requirements, and ``check``.

``probe`` is checked against this host (the facts in /work/shared/HOST.md) and
against what the kernel shows by other means; ``check`` is checked on synthetic
facts, one missing feature at a time, so that it names each.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stockade.cell import _host
from stockade.cell._host import Fact, HostFacts, assess, check, probe, requirements
from stockade.errors import HostError
from stockade.policy import Limits, Policy, default_policy

ALL_ACTIONS = (
    "kill_process",
    "kill_thread",
    "trap",
    "errno",
    "user_notif",
    "trace",
    "log",
    "allow",
)


def _mounts(fstype: str) -> list[list[str]]:
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        sep = fields.index("-")
        if fields[sep + 1] == fstype:
            out.append(fields)
    return out


def _is_documented_host() -> bool:
    # The development and CI host of HOST.md: cgroup2 at /sys/fs/cgroup/unified
    # next to the v1 hierarchies, Linux 6.18.
    return os.uname().release.startswith("6.18") and any(
        f[4] == "/sys/fs/cgroup/unified" for f in _mounts("cgroup2")
    )


# --------------------------------------------------------------------------- probe on this host


@pytest.mark.skipif(not _is_documented_host(), reason="not the host HOST.md describes")
def test_probe_matches_host_md() -> None:
    facts = probe(deep=True)
    assert facts.landlock_abi.value == 7
    assert facts.seccomp.value
    assert set(facts.seccomp_actions.value) == set(ALL_ACTIONS)
    assert facts.namespaces.value == _host.NAMESPACES
    assert facts.userns.value
    assert facts.userns_tested is not None and facts.userns_tested.value
    assert not facts.userns_apparmor.value
    assert facts.cgroup_v2.value is not None
    assert facts.cgroup_v2.value.startswith("/sys/fs/cgroup/unified")
    assert not {"memory", "pids", "cpu"} & set(facts.cgroup_v2_controllers.value)
    assert {"memory", "pids", "cpu", "freezer"} <= set(facts.cgroup_v1.value)
    assert (facts.cgroup_memory.value, facts.cgroup_pids.value, facts.cgroup_cpu.value) == (
        "v1",
        "v1",
        "v1",
    )
    assert facts.cgroup_kill.value == "cgroup.kill"
    assert facts.root.value
    assert facts.audit.value  # as root, with CAP_AUDIT_READ
    assert facts.audit_enabled is not None
    assert facts.bwrap_version is not None and facts.bwrap_version.value == "0.8.0"


def test_probe_agrees_with_the_kernel_seen_otherwise() -> None:
    facts = probe()
    assert facts.kernel.value == os.uname().release
    assert facts.root.value == (os.geteuid() == 0)
    avail = Path("/proc/sys/kernel/seccomp/actions_avail")
    if avail.exists():
        assert set(facts.seccomp_actions.value) == set(avail.read_text().split())
    v1 = {o for f in _mounts("cgroup") for o in f[-1].split(",")}
    assert set(facts.cgroup_v1.value) <= v1
    assert (facts.cgroup_v2.value is None) == (not _mounts("cgroup2"))
    assert facts.namespaces.value == tuple(
        n for n in _host.NAMESPACES if os.path.exists(f"/proc/self/ns/{n}")
    )
    assert len(facts._fields) > 20
    for name in facts._fields:
        value = getattr(facts, name)
        assert value is None or (isinstance(value, Fact) and value.how), name


def test_probe_is_cached_and_deep_adds_the_costly_facts() -> None:
    cheap = probe()
    assert probe() is cheap
    assert cheap.userns_tested is None and cheap.audit_enabled is None
    deep = probe(deep=True)
    assert probe(deep=True) is deep
    assert deep.userns_tested is not None
    assert deep.kernel == cheap.kernel


def test_probe_stays_cheap_to_import_and_run() -> None:
    # The launch path must not pay for JSON, rich, click, pydantic or YAML here.
    code = (
        "import sys; from stockade.cell import _host; _host.probe(); "
        "print(' '.join(sorted({'json', 'rich', 'click', 'pydantic', 'yaml', 'subprocess', "
        "'shutil'} & set(sys.modules))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == ""


def test_check_passes_here_for_the_default_policy() -> None:
    if not _is_documented_host():
        pytest.skip("not the host HOST.md describes")
    check(default_policy())
    check(default_policy(), probe(deep=True))
    assert all(f.met for f in assess(default_policy()))


# --------------------------------------------------------------------------- requirements


def test_requirements_follow_the_policy() -> None:
    base = Policy(name="p")
    features = [r.feature for r in requirements(base)]
    assert features == [
        "namespaces",
        "userns",
        "landlock.fs",
        "landlock.net",
        "landlock.scope",
        "landlock.audit",
        "seccomp",
        "seccomp.log",
        "unix.guard",
        "audit",
        "cgroup",
    ]
    limited = dataclasses.replace(base, limits=Limits(memory=1 << 30, pids=10, cpu=0.5))
    assert [r.feature for r in requirements(limited)][-3:] == [
        "cgroup.memory",
        "cgroup.pids",
        "cgroup.cpu",
    ]
    audit = {r.feature: r for r in requirements(dataclasses.replace(base, mode="audit"))}
    assert "mode: audit" in audit["seccomp.log"].why
    assert audit["seccomp.log"].needs.endswith("log")


# ------------------------------------------------------------------- check on synthetic facts


def _full() -> HostFacts:
    """Facts of a host that has everything, independent of the real one."""
    return HostFacts(
        kernel=Fact("6.18.0", "test"),
        root=Fact(False, "test"),
        capabilities=Fact(("audit_control", "audit_read"), "test"),
        landlock_abi=Fact(7, "test"),
        seccomp=Fact(True, "test"),
        seccomp_actions=Fact(ALL_ACTIONS, "test"),
        seccomp_actions_logged=Fact(ALL_ACTIONS[:-1], "test"),
        namespaces=Fact(_host.NAMESPACES, "test"),
        userns=Fact(True, "test"),
        userns_apparmor=Fact(False, "test"),
        cgroup_v2=Fact("/sys/fs/cgroup/x", "test"),
        cgroup_v2_controllers=Fact(("cpu", "memory", "pids"), "test"),
        cgroup_v1=Fact((), "test"),
        cgroup_memory=Fact("v2", "test"),
        cgroup_pids=Fact("v2", "test"),
        cgroup_cpu=Fact("v2", "test"),
        cgroup_kill=Fact("cgroup.kill", "test"),
        audit=Fact(True, "test"),
        bwrap=Fact(None, "test"),
    )


LIMITED = dataclasses.replace(default_policy(), limits=Limits(memory=1 << 30, pids=100, cpu=1.0))

LACKING: list[tuple[str, dict[str, object], set[str]]] = [
    ("no user namespace kind", {"namespaces": Fact(("mnt", "pid"), "t", "fix ns")}, {"namespaces"}),
    ("userns refused", {"userns": Fact(False, "max_user_namespaces=0", "sysctl")}, {"userns"}),
    (
        "userns test failed",
        {"userns_tested": Fact(False, "unshare failed", "apparmor profile")},
        {"userns"},
    ),
    (
        "no landlock",
        {"landlock_abi": Fact(0, "ENOSYS", "build it")},
        {"landlock.fs", "landlock.net", "landlock.scope", "landlock.audit"},
    ),
    (
        "landlock 2",
        {"landlock_abi": Fact(2, "t")},
        {"landlock.fs", "landlock.net", "landlock.scope", "landlock.audit"},
    ),
    (
        "landlock 3",
        {"landlock_abi": Fact(3, "t")},
        {"landlock.net", "landlock.scope", "landlock.audit"},
    ),
    ("landlock 5", {"landlock_abi": Fact(5, "t")}, {"landlock.scope", "landlock.audit"}),
    ("landlock 6", {"landlock_abi": Fact(6, "t")}, {"landlock.audit"}),
    (
        "no seccomp",
        {
            "seccomp": Fact(False, "t", "CONFIG_SECCOMP_FILTER"),
            "seccomp_actions": Fact((), "t"),
        },
        {"seccomp", "seccomp.log", "unix.guard"},
    ),
    ("linux 6.6", {"kernel": Fact("6.6.0-1-amd64", "t")}, {"unix.guard"}),
    (
        "no user notification",
        {"seccomp_actions": Fact(("kill_process", "errno", "log", "allow"), "t")},
        {"unix.guard"},
    ),
    (
        "errno refusals not logged",
        {"seccomp_actions_logged": Fact(("log",), "t", "echo")},
        {"seccomp.log"},
    ),
    ("no audit", {"audit": Fact(False, "no CAP_AUDIT_READ", "run as root")}, {"audit"}),
    (
        "audit off and no way to turn it on",
        {"audit_enabled": Fact(0, "t"), "capabilities": Fact(("audit_read",), "t")},
        {"audit"},
    ),
    ("no atomic kill", {"cgroup_kill": Fact("signals", "t", "5.14")}, {"cgroup"}),
    ("no memory controller", {"cgroup_memory": Fact(None, "t", "delegate")}, {"cgroup.memory"}),
    ("no pids controller", {"cgroup_pids": Fact(None, "t", "delegate")}, {"cgroup.pids"}),
    ("no cpu controller", {"cgroup_cpu": Fact(None, "t", "delegate")}, {"cgroup.cpu"}),
]


def test_check_passes_on_a_host_with_everything() -> None:
    check(LIMITED, _full())
    check(dataclasses.replace(LIMITED, mode="audit"), _full())


@pytest.mark.parametrize(("case", "changes", "missing"), LACKING, ids=[c[0] for c in LACKING])
def test_check_names_each_missing_feature(case: str, changes: dict[str, object], missing: set[str]) -> None:
    facts = _full()._replace(**changes)
    with pytest.raises(HostError) as info:
        check(LIMITED, facts)
    assert set(info.value.feature.split(",")) == missing
    message = str(info.value)
    for feature in missing:
        assert f"{feature} (" in message
    assert "stockade doctor" in message
    unmet = {f.requirement.feature: f for f in assess(LIMITED, facts) if not f.met}
    assert set(unmet) == missing
    assert all(f.fix for f in unmet.values()), "every missing feature says what to do"


def test_landlock_message_says_what_the_abi_lacks_and_which_kernel_has_it() -> None:
    facts = _full()._replace(landlock_abi=Fact(3, "t"))
    with pytest.raises(HostError, match=r"Landlock ABI 3 lacks TCP rules \(ABI 4, Linux ≥ 6\.7\)"):
        check(default_policy(), facts)


def test_limits_not_set_need_no_controller() -> None:
    facts = _full()._replace(
        cgroup_memory=Fact(None, "t", "fix"),
        cgroup_pids=Fact(None, "t", "fix"),
        cgroup_cpu=Fact(None, "t", "fix"),
    )
    check(dataclasses.replace(default_policy(), limits=Limits()), facts)
    with pytest.raises(HostError) as info:
        check(dataclasses.replace(default_policy(), limits=Limits(pids=5)), facts)
    assert info.value.feature == "cgroup.pids"


def test_audit_mode_needs_log_logged_and_enforce_does_not() -> None:
    facts = _full()._replace(seccomp_actions_logged=Fact(("kill_process", "errno"), "t", "echo log"))
    check(default_policy(), facts)
    with pytest.raises(HostError) as info:
        check(dataclasses.replace(default_policy(), mode="audit"), facts)
    assert info.value.feature == "seccomp.log"


def test_every_missing_feature_at_once_is_named() -> None:
    changes = {k: v for _, change, _ in LACKING for k, v in change.items()}
    changes["landlock_abi"] = Fact(0, "ENOSYS", "build it")  # the lowest of the table's ABIs
    facts = _full()._replace(**changes)
    with pytest.raises(HostError) as info:
        check(LIMITED, facts)
    named = set(info.value.feature.split(","))
    assert named == {f for _, _, missing in LACKING for f in missing}


def test_userns_facts_read_the_sysctls(monkeypatch: pytest.MonkeyPatch) -> None:
    values = {
        "/proc/sys/user/max_user_namespaces": "1000",
        "/proc/sys/kernel/unprivileged_userns_clone": None,
        "/proc/sys/kernel/apparmor_restrict_unprivileged_userns": "1",
    }
    monkeypatch.setattr(_host, "_read", lambda path: values.get(path))
    userns, apparmor = _host._userns(privileged=False)
    assert not userns.value and apparmor.value  # Ubuntu 24.04, unprivileged
    assert apparmor.fix is not None and "apparmor_restrict_unprivileged_userns" in apparmor.fix
    userns, apparmor = _host._userns(privileged=True)
    assert userns.value and not apparmor.value  # the restriction spares CAP_SYS_ADMIN
    values["/proc/sys/kernel/apparmor_restrict_unprivileged_userns"] = None
    values["/proc/sys/kernel/unprivileged_userns_clone"] = "0"
    userns, _ = _host._userns(privileged=False)
    assert not userns.value and userns.fix is not None and "unprivileged_userns_clone" in userns.fix
    values["/proc/sys/user/max_user_namespaces"] = "0"
    userns, _ = _host._userns(privileged=True)
    assert not userns.value and userns.fix is not None and "max_user_namespaces" in userns.fix
