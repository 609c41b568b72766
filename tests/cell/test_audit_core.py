"""The audit reader's sans-I/O core, driven by raw records recorded from this kernel (6.18)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stockade.cell._audit_core import (
    AuditCorrelator,
    decode_value,
    parse_fields,
    parse_record,
)

# Raw records as the kernel sent them here (netlink payloads), from
# /tmp experiments reproduced by tests/cell/test_audit.py.
SECCOMP_ERRNO = (
    'audit(1795958133.892:7): auid=0 uid=0 gid=0 ses=3 pid=4024 comm="python" '
    'exe="/usr/bin/python3.11" sig=0 arch=c000003e syscall=101 compat=0 '
    "ip=0x7fe51e71d34a code=0x50000"
)
SECCOMP_LOG = SECCOMP_ERRNO.replace("code=0x50000", "code=0x7ffc0000")
SECCOMP_KILL = (
    'audit(1795958313.616:42): auid=0 uid=0 gid=0 ses=3 pid=4611 comm="python" '
    'exe="/usr/bin/python3.11" sig=31 arch=c000003e syscall=39 compat=0 '
    "ip=0x7f2827af34e7 code=0x80000000"
)
SECCOMP_I386 = SECCOMP_ERRNO.replace(
    "arch=c000003e syscall=101 compat=0", "arch=40000003 syscall=26 compat=1"
)
LL_WRITE = (
    'audit(1795958133.888:4): domain=13ab41c70 blockers=fs.write_file path="/etc/passwd" dev="vda" ino=739'
)
LL_ALLOC = (
    "audit(1795958133.888:4): domain=13ab41c70 status=allocated mode=enforcing pid=4024 uid=0 "
    'exe="/usr/bin/python3.11" comm="python"'
)
LL_SYSCALL = (
    "audit(1795958133.888:4): arch=c000003e syscall=257 success=no exit=-13 a0=ffffff9c "
    "a1=7fe51e3cb080 a2=80441 a3=1b6 items=0 ppid=4023 pid=4025 auid=0 uid=0 gid=0 euid=0 "
    'suid=0 fsuid=0 egid=0 sgid=0 fsgid=0 tty=(none) ses=3 comm="python" '
    'exe="/usr/bin/python3.11" key=(null)'
)
# proctitle of "python -c TOKEN=s3cr3t": must never reach an event.
LL_PROCTITLE = "audit(1795958133.888:4): proctitle=707974686F6E002D6300544F4B454E3D733363723374"
LL_EOE = "audit(1795958133.888:4): "
LL_MAKE_REG = 'audit(1795958133.888:5): domain=13ab41c70 blockers=fs.make_reg path="/etc" dev="vda" ino=19'
LL_CONNECT = "audit(1795958133.892:6): domain=13ab41c70 blockers=net.connect_tcp daddr=127.0.0.1 dest=35675"
LL_CONNECT6 = "audit(1795958313.612:38): domain=13ab41c70 blockers=net.connect_tcp daddr=::1 dest=5998"
LL_BIND = "audit(1795958313.612:37): domain=13ab41c70 blockers=net.bind_tcp saddr=127.0.0.1"
LL_SIGNAL = 'audit(1795958133.892:8): domain=13ab41c70 blockers=scope.signal opid=1 ocomm="process_api"'
LL_ABSTRACT = (
    "audit(1795958133.892:9): domain=13ab41c70 blockers=scope.abstract_unix_socket "
    "path=0073746F636B6164652D657870"
)
LL_PTRACE = 'audit(1795958320.976:50): domain=13ab41c70 blockers=ptrace opid=4702 ocomm="python"'
LL_RENAME = (
    'audit(1795958313.616:41): domain=13ab41c70 blockers=fs.make_reg,fs.refer path="/var/tmp" '
    'dev="vda" ino=403231'
)
LL_HEX_PATH = (
    "audit(1795958320.976:48): domain=13ab41c70 blockers=fs.write_file "
    'path=2F7661722F746D702F636166C3A9 dev="vda" ino=15343618'
)
LL_DEALLOC = "audit(1795958133.944:10): domain=13ab41c70 status=deallocated denials=5"
LL_ALLOC_HEX_COMM = (
    "audit(1795958320.976:48): domain=13ab41c90 status=allocated mode=enforcing pid=4703 uid=0 "
    'exe="/usr/bin/python3.11" comm=6D7920636F6D6D'
)


def marker(serial: int, token: str = "abc:1") -> str:
    return (
        f"audit(1795958300.000:{serial}): pid=1 uid=0 auid=4294967295 ses=4294967295 "
        f"msg='stockade-barrier {token}'"
    )


# --- parsing ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "raw", "expected"),
    [
        ("path", '"/etc/passwd"', "/etc/passwd"),
        ("path", "2F7661722F746D702F612062", "/var/tmp/a b"),
        ("path", "2F636166C3A9", "/café"),
        ("path", "2F6FFF", "/o\\xff"),  # not UTF-8: escaped, still printable
        ("comm", "6D7920636F6D6D", "my comm"),
        ("ocomm", '"process_api"', "process_api"),
        ("exe", "(null)", "(null)"),
        ("path", "0073746F636B", "\x00stock"),
        ("ino", "739", "739"),  # a trusted field is never hex-decoded
        ("domain", "13ab41c70", "13ab41c70"),
        ("key", "(null)", "(null)"),
    ],
)
def test_decode_value(key: str, raw: str, expected: str) -> None:
    assert decode_value(key, raw) == expected


@given(st.binary(min_size=1, max_size=64))
def test_hex_encoded_untrusted_strings_round_trip(raw: bytes) -> None:
    # audit_log_n_untrustedstring: hex when any byte is '"', < 0x21 or > 0x7e, else quoted.
    needs_hex = any(b == 0x22 or b < 0x21 or b > 0x7E for b in raw)
    written = raw.hex().upper() if needs_hex else f'"{raw.decode()}"'
    fields = parse_fields(f'domain=1 blockers=fs.read_file path={written} dev="vda" ino=2')
    assert fields["path"] == raw.decode("utf-8", "backslashreplace")
    assert fields["ino"] == "2"


@pytest.mark.parametrize(
    ("msg_type", "body", "serial", "fields"),
    [
        (
            1326,
            SECCOMP_ERRNO,
            7,
            {"ses": "3", "syscall": "101", "code": "0x50000", "comm": "python"},
        ),
        (
            1423,
            LL_WRITE,
            4,
            {"domain": "13ab41c70", "blockers": "fs.write_file", "path": "/etc/passwd"},
        ),
        (1423, LL_CONNECT, 6, {"daddr": "127.0.0.1", "dest": "35675"}),
        (1423, LL_SIGNAL, 8, {"blockers": "scope.signal", "opid": "1", "ocomm": "process_api"}),
        (1423, LL_ABSTRACT, 9, {"path": "\x00stockade-exp"}),
        (1423, LL_HEX_PATH, 48, {"path": "/var/tmp/café", "ino": "15343618"}),
        (1424, LL_ALLOC, 4, {"status": "allocated", "mode": "enforcing", "pid": "4024"}),
        (1424, LL_ALLOC_HEX_COMM, 48, {"comm": "my comm"}),
        (1424, LL_DEALLOC, 10, {"status": "deallocated", "denials": "5"}),
        (
            1300,
            LL_SYSCALL,
            4,
            {"syscall": "257", "ses": "3", "pid": "4025", "exe": "/usr/bin/python3.11"},
        ),
    ],
)
def test_parse_record(msg_type: int, body: str, serial: int, fields: dict[str, str]) -> None:
    rec = parse_record(msg_type, body)
    assert rec is not None
    assert rec.serial == serial
    assert rec.time == pytest.approx(int(body[6:16]) + int(body[17:20]) / 1000)
    assert fields.items() <= rec.fields.items()


def test_parse_record_without_stamp() -> None:
    assert parse_record(1423, "domain=1 blockers=fs.read_file") is None


# --- attribution and events ----------------------------------------------------------------


def run(core: AuditCorrelator, *records: tuple[int, str], now: float = 0.0) -> list[str]:
    """Feed records; return the barrier markers seen."""
    markers = []
    for msg_type, body in records:
        _, m = core.feed(msg_type, body, now)
        if m is not None:
            markers.append(m)
    return markers


def watched(session: int = 3, pid: int = 4024) -> AuditCorrelator:
    core = AuditCorrelator()
    core.watch("cell-a", session=session, pid=pid, now=0.0)
    return core


LANDLOCK_GROUP = [
    (1423, LL_WRITE),
    (1424, LL_ALLOC),
    (1300, LL_SYSCALL),
    (1327, LL_PROCTITLE),
    (1320, LL_EOE),
]


def test_landlock_denial_with_its_syscall_record() -> None:
    core = watched()
    run(core, *LANDLOCK_GROUP)
    [event] = core.take("cell-a")
    assert (event.kind, event.layer, event.outcome) == ("cell.denied", "landlock", "denied")
    assert event.detail == {
        "blockers": ["fs.write_file"],
        "domain": "13ab41c70",
        "serial": 4,
        "path": "/etc/passwd",
        "dev": "vda",
        "ino": 739,
        "syscall": "openat",
        "nr": 257,
        "pid": 4025,
        "comm": "python",
        "exe": "/usr/bin/python3.11",
    }
    assert event.summary == "write to /etc/passwd refused by landlock (fs.write_file)"
    assert event.time == pytest.approx(1795958133.888)
    assert core.take("cell-a") == []  # taken means forgotten


def test_proctitle_never_reaches_an_event() -> None:
    core = watched()
    run(core, *LANDLOCK_GROUP)
    dumped = json.dumps([e.to_dict() for e in core.take("cell-a")])
    assert "s3cr3t" not in dumped
    assert "733363723374" not in dumped
    assert "proctitle" not in dumped


@pytest.mark.parametrize(
    ("body", "detail", "summary"),
    [
        (
            LL_CONNECT,
            {"daddr": "127.0.0.1", "port": 35675},
            "TCP connect to 127.0.0.1 port 35675 refused by landlock (net.connect_tcp)",
        ),
        (
            LL_CONNECT6,
            {"daddr": "::1", "port": 5998},
            "TCP connect to ::1 port 5998 refused by landlock (net.connect_tcp)",
        ),
        (
            LL_BIND,
            {"saddr": "127.0.0.1"},
            "TCP bind on 127.0.0.1 refused by landlock (net.bind_tcp)",
        ),
        (
            LL_SIGNAL,
            {"target_pid": 1, "target_comm": "process_api"},
            "signal to pid 1 (process_api) refused by landlock (scope.signal)",
        ),
        (
            LL_ABSTRACT,
            {"path": "@stockade-exp"},
            "connect to abstract unix socket @stockade-exp refused by landlock (scope.abstract_unix_socket)",
        ),
        (
            LL_PTRACE,
            {"target_pid": 4702, "target_comm": "python"},
            "ptrace of pid 4702 (python) refused by landlock (ptrace)",
        ),
        (
            LL_RENAME,
            {"blockers": ["fs.make_reg", "fs.refer"], "path": "/var/tmp"},
            "creation of a file in /var/tmp refused by landlock (fs.make_reg, fs.refer)",
        ),
        (
            LL_MAKE_REG,
            {"path": "/etc", "ino": 19},
            "creation of a file in /etc refused by landlock (fs.make_reg)",
        ),
        (
            LL_HEX_PATH,
            {"path": "/var/tmp/café"},
            "write to /var/tmp/café refused by landlock (fs.write_file)",
        ),
    ],
)
def test_landlock_object_fields(body: str, detail: dict[str, object], summary: str) -> None:
    core = watched()
    run(core, (1423, LL_WRITE), (1424, LL_ALLOC), (1320, LL_EOE))  # learn the domain
    core.take("cell-a")
    run(core, (1423, body), (1320, body[: body.index(")") + 3]))
    [event] = core.take("cell-a")
    assert detail.items() <= event.detail.items()
    assert event.summary == summary
    assert "pid" not in event.detail  # no SYSCALL record in this group: no pid invented


@pytest.mark.parametrize(
    ("body", "kind", "outcome", "detail", "summary"),
    [
        (
            SECCOMP_ERRNO,
            "cell.denied",
            "denied",
            {"syscall": "ptrace", "nr": 101, "action": "errno", "pid": 4024, "arch": "x86_64"},
            "ptrace refused by seccomp",
        ),
        (
            SECCOMP_LOG,
            "cell.audited",
            "audited",
            {"syscall": "ptrace", "action": "log"},
            "ptrace would be refused by seccomp (audit mode: allowed)",
        ),
        (
            SECCOMP_KILL,
            "cell.denied",
            "denied",
            {"syscall": "getpid", "action": "kill_process", "signal": 31},
            "getpid refused by seccomp; the process was killed",
        ),
        (
            SECCOMP_I386,
            "cell.denied",
            "denied",
            {"syscall": None, "nr": 26, "arch": "40000003"},
            "system call 26 (arch 40000003) refused by seccomp",
        ),
    ],
)
def test_seccomp_events(body: str, kind: str, outcome: str, detail: dict[str, object], summary: str) -> None:
    core = watched()
    run(core, (1326, body))
    [event] = core.take("cell-a")
    assert (event.kind, event.layer, event.outcome) == (kind, "seccomp", outcome)
    assert detail.items() <= event.detail.items()
    assert event.summary == summary


def test_other_sessions_and_domains_are_ignored() -> None:
    core = watched(session=99, pid=1)
    run(core, (1326, SECCOMP_ERRNO), *LANDLOCK_GROUP)
    assert core.take("cell-a") == []


def test_session_outranks_a_reused_pid() -> None:
    # The allocated record names the watched pid, but the SYSCALL record's session
    # is another one: the pid was reused by a process that is not the cell's.
    core = watched(session=99, pid=4024)
    run(core, *LANDLOCK_GROUP)
    assert core.take("cell-a") == []


def test_domain_learnt_by_pid_without_a_syscall_record() -> None:
    # A task without an audit context: no SYSCALL, no EOE; the marker finishes the group.
    core = watched()
    assert run(core, (1423, LL_WRITE), (1424, LL_ALLOC), (1107, marker(5))) == ["abc:1"]
    [event] = core.take("cell-a")
    assert event.detail["path"] == "/etc/passwd"
    assert "pid" not in event.detail


def test_nested_domain_attributed_by_session() -> None:
    # The agent made its own Landlock domain: its creator pid is not the cell's pid-1.
    nested_alloc = LL_ALLOC.replace("pid=4024", "pid=5000")
    core = watched()
    run(core, (1423, LL_WRITE), (1424, nested_alloc), (1300, LL_SYSCALL), (1320, LL_EOE))
    assert [e.detail["path"] for e in core.take("cell-a")] == ["/etc/passwd"]


def test_marker_finishes_only_earlier_groups() -> None:
    core = watched()
    later = LL_CONNECT.replace(":6)", ":900)")
    run(core, (1423, LL_WRITE), (1424, LL_ALLOC), (1423, later), (1107, marker(5)))
    assert [e.detail["blockers"] for e in core.take("cell-a")] == [["fs.write_file"]]
    run(core, (1320, "audit(1795958133.892:900): "))
    assert [e.detail["blockers"] for e in core.take("cell-a")] == [["net.connect_tcp"]]


def test_foreign_marker_is_not_a_barrier() -> None:
    core = watched()
    not_ours = "audit(1.000:5): pid=1 uid=0 auid=0 ses=1 msg='hello stockade'"
    assert run(core, (1107, not_ours)) == []


def test_late_watch_claims_recent_records() -> None:
    core = AuditCorrelator()
    run(core, *LANDLOCK_GROUP, (1326, SECCOMP_ERRNO), now=1.0)
    events = core.watch("late", session=3, pid=4024, now=2.0)
    assert [e.layer for e in events] == ["landlock", "seccomp"]
    assert [e.layer for e in core.take("late")] == ["landlock", "seccomp"]


def test_late_watch_does_not_claim_old_records() -> None:
    core = AuditCorrelator(limbo_ttl=10.0)
    run(core, *LANDLOCK_GROUP, (1326, SECCOMP_ERRNO), now=1.0)
    assert core.watch("late", session=3, pid=4024, now=20.0) == []


def test_group_without_end_expires() -> None:
    core = AuditCorrelator(group_ttl=0.5)
    core.watch("cell-a", session=3, pid=4024, now=0.0)
    run(core, (1423, LL_WRITE), (1424, LL_ALLOC), now=0.0)
    assert core.take("cell-a") == []
    run(core, (1326, SECCOMP_ERRNO.replace("ses=3", "ses=77")), now=1.0)  # any later record
    assert [e.layer for e in core.take("cell-a")] == ["landlock"]


def test_group_without_end_is_finished_at_its_deadline_with_no_later_record() -> None:
    # Nothing else comes from the host: the reader's timer finishes it (expire).
    core = AuditCorrelator(group_ttl=0.5)
    core.watch("cell-a", session=3, pid=4024, now=0.0)
    assert core.next_deadline() is None
    run(core, (1423, LL_WRITE), (1424, LL_ALLOC), now=10.0)
    assert core.next_deadline() == 10.5
    assert core.expire(10.4) == []
    [event] = core.expire(10.5)
    assert event.layer == "landlock" and event.detail["path"] == "/etc/passwd"
    assert core.next_deadline() is None
    assert [e.detail["path"] for e in core.take("cell-a")] == ["/etc/passwd"]


def test_a_complete_group_is_an_event_at_its_eoe_without_waiting() -> None:
    core = watched()
    out = [e for body in LANDLOCK_GROUP for e in core.feed(body[0], body[1], 0.0)[0]]
    assert [e.layer for e in out] == ["landlock"]
    assert core.next_deadline() is None


def test_deallocation_reports_unlogged_denials() -> None:
    core = watched()
    run(core, *LANDLOCK_GROUP, (1424, LL_DEALLOC))  # the kernel counted 5, one was logged
    events = core.take("cell-a")
    assert [e.kind for e in events] == ["cell.denied", "cell.audit_lost"]
    assert events[1].detail == {"reason": "landlock_count", "count": 4}
    assert events[1].outcome == "info"


def test_deallocation_with_every_denial_logged_is_silent() -> None:
    core = watched()
    run(core, *LANDLOCK_GROUP, (1424, LL_DEALLOC.replace("denials=5", "denials=1")))
    assert [e.kind for e in core.take("cell-a")] == ["cell.denied"]


def test_lost_records_reported_to_every_watched_cell() -> None:
    core = watched()
    core.watch("cell-b", session=4, pid=1, now=0.0)
    events = core.lost("overrun", None, 5.0)
    assert sorted(e.cell for e in events) == ["cell-a", "cell-b"]
    assert all(e.kind == "cell.audit_lost" and e.detail["reason"] == "overrun" for e in events)
    assert "may be missing" in events[0].summary


def test_unwatch_forgets_cell_and_domains() -> None:
    core = watched()
    run(core, *LANDLOCK_GROUP)
    core.unwatch("cell-a")
    assert core.take("cell-a") == []
    core.watch("cell-b", session=8, pid=8, now=0.0)
    run(core, (1423, LL_MAKE_REG), (1320, "audit(1795958133.888:5): "))
    assert core.take("cell-b") == []


@pytest.mark.parametrize("session", [0, -1, 4294967295])
def test_watch_rejects_unset_sessions(session: int) -> None:
    with pytest.raises(ValueError, match="sessionid"):
        AuditCorrelator().watch("c", session=session, pid=1, now=0.0)


def test_watch_rejects_a_session_of_another_cell() -> None:
    core = watched()
    with pytest.raises(ValueError, match="cell-a"):
        core.watch("cell-b", session=3, pid=2, now=0.0)
