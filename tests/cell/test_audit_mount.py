"""Refusals of read-only mounts from the kernel audit log: the rules' bytes and
the correlator's events, from records this kernel (6.18) sent (sans-I/O)."""

from __future__ import annotations

import os
import struct

from stockade.cell._audit_core import AUDIT_EOE, AUDIT_SYSCALL, AuditCorrelator
from stockade.cell._audit_mount import AUDIT_CWD, AUDIT_PATH, CELL_LOGINUID, RULE_KEY, rule_payloads

SERIAL = 14724090
SYSCALL = (
    f"audit(1795976400.720:{SERIAL}): arch=c000003e syscall=257 success=no exit=-30 a0=ffffff9c "
    "a1=7f1282d9f890 a2=80241 a3=1b6 items=1 ppid=15982 pid=15985 auid=54321 uid=0 gid=0 euid=0 "
    'suid=0 fsuid=0 egid=0 sgid=0 fsgid=0 tty=(none) ses=37084 comm="python" '
    f'exe="/usr/bin/python3.11" key="{RULE_KEY}"'
)
CWD = f'audit(1795976400.720:{SERIAL}): cwd="/work/ws"'
PATH_PARENT = (
    f'audit(1795976400.720:{SERIAL}): item=0 name=".git/hooks/" inode=2179075 dev=fe:00 mode=040755 '
    "ouid=0 ogid=0 rdev=00:00 nametype=PARENT cap_fp=0 cap_fi=0 cap_fe=0 cap_fver=0 cap_frootid=0"
)
PATH_NORMAL = (
    PATH_PARENT.replace("item=0", "item=1")
    .replace('name=".git/hooks/"', 'name=".git/hooks/pre-commit"')
    .replace("nametype=PARENT", "nametype=NORMAL")
)
EOE = f"audit(1795976400.720:{SERIAL}): "


def _feed(core: AuditCorrelator, records: list[tuple[int, str]], now: float = 100.0) -> list[object]:
    out: list[object] = []
    for msg_type, body in records:
        if core.wants(msg_type):
            out.extend(core.feed(msg_type, body, now)[0])
    return out


def test_a_refused_write_becomes_one_event_of_the_mount_layer() -> None:
    core = AuditCorrelator()
    core.watch("c1", session=37084, pid=15985, now=100.0)
    events = _feed(
        core,
        [
            (AUDIT_SYSCALL, SYSCALL),
            (AUDIT_CWD, CWD),
            (AUDIT_PATH, PATH_PARENT),
            (AUDIT_PATH, PATH_NORMAL),
            (AUDIT_EOE, EOE),
        ],
    )
    assert len(events) == 1
    event = events[0]
    assert (event.kind, event.layer, event.outcome, event.cell) == ("cell.denied", "mount", "denied", "c1")  # type: ignore[attr-defined]
    detail = event.detail  # type: ignore[attr-defined]
    assert detail["syscall"] == "openat" and detail["errno"] == "EROFS"
    assert detail["path"] == "/work/ws/.git/hooks/pre-commit" and detail["pid"] == 15985
    assert event.summary == "openat of /work/ws/.git/hooks/pre-commit refused: a read-only mount (EROFS)"  # type: ignore[attr-defined]
    assert core.take("c1") == events


def test_a_name_that_would_have_been_created_is_named_by_its_directory() -> None:
    core = AuditCorrelator()
    core.watch("c1", session=37084, pid=15985, now=100.0)
    (event,) = _feed(
        core, [(AUDIT_SYSCALL, SYSCALL), (AUDIT_CWD, CWD), (AUDIT_PATH, PATH_PARENT), (AUDIT_EOE, EOE)]
    )
    assert event.detail["path"] == "/work/ws/.git/hooks"  # type: ignore[attr-defined]


def test_records_of_other_sessions_and_without_the_key_make_nothing() -> None:
    core = AuditCorrelator()
    core.watch("c1", session=1, pid=2, now=100.0)
    assert (
        _feed(core, [(AUDIT_SYSCALL, SYSCALL), (AUDIT_CWD, CWD), (AUDIT_PATH, PATH_NORMAL), (AUDIT_EOE, EOE)])
        == []
    )
    other = SYSCALL.replace(f'key="{RULE_KEY}"', "key=(null)")
    assert _feed(core, [(AUDIT_SYSCALL, other), (AUDIT_EOE, EOE)]) == []
    # Nothing waits: the reader is told not to decode the records that follow.
    assert not core.wants(AUDIT_PATH) and not core.wants(AUDIT_EOE) and core.wants(AUDIT_SYSCALL)


def test_a_cell_watched_a_moment_later_still_gets_its_refusal() -> None:
    core = AuditCorrelator()
    assert _feed(core, [(AUDIT_SYSCALL, SYSCALL), (AUDIT_PATH, PATH_NORMAL), (AUDIT_EOE, EOE)]) == []
    late = core.watch("c1", session=37084, pid=15985, now=101.0)
    assert [e.layer for e in late] == ["mount"]


def test_a_refusal_without_its_eoe_is_finished_by_the_readers_stop_or_by_time() -> None:
    core = AuditCorrelator(group_ttl=0.5)
    core.watch("c1", session=37084, pid=15985, now=100.0)
    assert _feed(core, [(AUDIT_SYSCALL, SYSCALL), (AUDIT_PATH, PATH_NORMAL)]) == []
    assert [e.layer for e in core.flush(100.1)] == ["mount"]
    assert _feed(core, [(AUDIT_SYSCALL, SYSCALL)], now=100.0) == []
    later = core.feed(1326, "audit(1795976401.000:1): ses=999", 101.0)[0]  # any record; the group aged out
    assert [e.layer for e in later] == ["mount"]


def test_a_marker_between_a_calls_records_does_not_cut_its_paths_off() -> None:
    """The kernel queues a call's records one by one as it exits: a barrier
    marker (this reader's or another's) or a Landlock domain's end may come
    between its SYSCALL and its PATH records with a later serial. The event
    still has its paths, so two readers' copies of it agree (the daemon's
    recovery matches them)."""
    core = AuditCorrelator()
    core.watch("c1", session=37084, pid=15985, now=100.0)
    marker = (
        f"audit(1795976400.721:{SERIAL + 1}): pid=1 uid=0 auid=4294967295 ses=4294967295 "
        "msg='stockade-barrier 0a1b2c:7'"
    )
    ended = f"audit(1795976400.721:{SERIAL + 2}): domain=1a2b3c status=deallocated denials=0"
    assert _feed(core, [(AUDIT_SYSCALL, SYSCALL), (1107, marker), (1424, ended), (AUDIT_CWD, CWD)]) == []
    (event,) = _feed(core, [(AUDIT_PATH, PATH_PARENT), (AUDIT_PATH, PATH_NORMAL), (AUDIT_EOE, EOE)])
    assert event.detail["paths"] == ["/work/ws/.git/hooks", "/work/ws/.git/hooks/pre-commit"]  # type: ignore[attr-defined]


def test_the_rules_are_exit_filters_for_the_mount_layers_errors_of_cells_only() -> None:
    erofs, ebusy, exdev, refused, *permissions = rule_payloads()
    assert len(permissions) == 5
    for rule, code in ((erofs, 30), (ebusy, 16), (exdev, 18), (refused, 111)):
        flags, action, count = struct.unpack_from("=III", rule)
        assert (flags, action, count) == (0x04, 2, 4)
        fields = struct.unpack_from("=4I", rule, 12 + 64 * 4)
        values = struct.unpack_from("=4I", rule, 12 + 64 * 4 + 64 * 4)
        assert fields == (11, 103, 9, 210)  # arch, exit, loginuid, filterkey
        assert values[:3] == (0xC000003E, (-code) & 0xFFFFFFFF, CELL_LOGINUID)
        assert rule.endswith(RULE_KEY.encode()) and values[3] == len(RULE_KEY)
    writing = struct.unpack_from("=64I", erofs, 12)

    def has(mask: tuple[int, ...], nr: int) -> bool:
        return bool(mask[nr // 32] & (1 << (nr % 32)))

    assert has(writing, 257) and has(writing, 82) and has(writing, 90)  # openat, rename, chmod
    assert not has(writing, 21) and not has(writing, 269) and not has(writing, 0)  # access, faccessat, read
    # rename, renameat, renameat2 and unlink, unlinkat, rmdir; and link, linkat
    assert sum(bin(m).count("1") for m in struct.unpack_from("=64I", ebusy, 12)) == 6
    assert sum(bin(m).count("1") for m in struct.unpack_from("=64I", exdev, 12)) == 5
    connect = struct.unpack_from("=64I", refused, 12)
    assert sum(bin(m).count("1") for m in connect) == 1 and connect[42 // 32] & (1 << (42 % 32))


def test_a_refused_connect_is_kept_only_when_it_named_a_path() -> None:
    """A unix connect to a decoy names its path; a TCP connect with nothing
    listening names none and is no decoy: no event."""
    core = AuditCorrelator()
    core.watch("c1", session=37084, pid=15985, now=100.0)
    tcp = SYSCALL.replace("syscall=257", "syscall=42").replace("exit=-30", "exit=-111")
    assert _feed(core, [(AUDIT_SYSCALL, tcp), (AUDIT_EOE, EOE)]) == []
    unix_path = PATH_NORMAL.replace('name=".git/hooks/pre-commit"', 'name="/run/docker.sock"')
    (event,) = _feed(core, [(AUDIT_SYSCALL, tcp), (AUDIT_PATH, unix_path), (AUDIT_EOE, EOE)])
    assert event.detail["errno"] == "ECONNREFUSED" and event.detail["path"] == "/run/docker.sock"  # type: ignore[attr-defined]
    assert "a decoy" in event.summary  # type: ignore[attr-defined]


def test_the_permission_rules_take_opens_only_when_they_would_write() -> None:
    openat_rule, open_rule, changing, eperm, _reaching = rule_payloads()[4:]
    for rule, arg in ((openat_rule, 2), (open_rule, 1)):
        assert struct.unpack_from("=III", rule)[2] == 5
        fields = struct.unpack_from("=5I", rule, 12 + 64 * 4)
        values = struct.unpack_from("=5I", rule, 12 + 64 * 4 + 64 * 4)
        ops = struct.unpack_from("=5I", rule, 12 + 64 * 4 * 3)
        assert fields[:4] == (11, 103, 9, 200 + arg) and values[1] == (-13) & 0xFFFFFFFF
        assert values[3] == 0o1 | 0o2 | 0o100 | 0o1000 and ops[3] == 0x08000000  # a write flag set
    for rule, code in ((changing, 13), (eperm, 1)):
        values = struct.unpack_from("=4I", rule, 12 + 64 * 4 + 64 * 4)
        assert values[1] == (-code) & 0xFFFFFFFF
        mask = struct.unpack_from("=64I", rule, 12)
        assert not mask[257 // 32] & (1 << (257 % 32))  # not openat: it has its own rule
        assert mask[90 // 32] & (1 << (90 % 32))  # chmod


def test_a_refusal_by_file_permissions_is_of_the_dac_layer() -> None:
    core = AuditCorrelator()
    core.watch("c1", session=37084, pid=15985, now=100.0)
    denied = SYSCALL.replace("exit=-30", "exit=-13")
    (event,) = _feed(
        core, [(AUDIT_SYSCALL, denied), (AUDIT_CWD, CWD), (AUDIT_PATH, PATH_NORMAL), (AUDIT_EOE, EOE)]
    )
    assert event.layer == "dac" and event.detail["errno"] == "EACCES"  # type: ignore[attr-defined]
    assert event.summary.endswith("refused: file permissions (EACCES)")  # type: ignore[attr-defined]


def test_the_decoy_rule_takes_every_refused_open_of_one_file() -> None:
    """/proc's decoys: any open (reads too) refused with EACCES of the one
    decoy inode on its device, by a cell, keyed as the others."""
    from stockade.cell._audit_mount import decoy_rule

    dev = os.makedev(259, 3)
    rule = decoy_rule(123456, dev)
    assert struct.unpack_from("=III", rule) == (0x04, 2, 7)
    fields = struct.unpack_from("=7I", rule, 12 + 64 * 4)
    values = struct.unpack_from("=7I", rule, 12 + 64 * 4 + 64 * 4)
    ops = struct.unpack_from("=7I", rule, 12 + 64 * 4 * 3)
    assert fields == (11, 103, 9, 102, 100, 101, 210)  # arch, exit, loginuid, inode, devmajor, devminor, key
    assert values[1:6] == ((-13) & 0xFFFFFFFF, CELL_LOGINUID, 123456, 259, 3)
    assert set(ops) == {0x40000000} and rule.endswith(RULE_KEY.encode())
    mask = struct.unpack_from("=64I", rule, 12)
    assert sum(bin(m).count("1") for m in mask) == 3  # open, openat, openat2: no write flag asked


def test_the_rule_on_reaches_takes_lookups_that_change_nothing() -> None:
    """A walk into a decoy directory (DIR_DECOY, mode 0000) fails with EACCES
    in stat, open for reading, execve…: one rule takes them, and its events
    say ``reach`` (kept by a cell only inside its decoys)."""
    reaching = rule_payloads()[-1]
    values = struct.unpack_from("=4I", reaching, 12 + 64 * 4 + 64 * 4)
    assert values[1] == (-13) & 0xFFFFFFFF
    mask = struct.unpack_from("=64I", reaching, 12)
    for nr in (257, 332, 262, 59, 80, 21):  # openat, statx, newfstatat, execve, chdir, access
        assert mask[nr // 32] & (1 << (nr % 32)), nr
    assert not mask[83 // 32] & (1 << (83 % 32))  # mkdir: a change, on record by another rule
    core = AuditCorrelator()
    core.watch("c1", session=37084, pid=15985, now=100.0)
    path = PATH_NORMAL.replace('name=".git/hooks/pre-commit"', 'name="/tests/test_outputs.py"')
    for syscall, reach in (("syscall=257", True), ("syscall=332", True), ("syscall=83", False)):
        read = SYSCALL.replace("exit=-30", "exit=-13").replace("a2=80241", "a2=80000")
        read = read.replace("syscall=257", syscall)
        (event,) = _feed(core, [(AUDIT_SYSCALL, read), (AUDIT_PATH, path), (AUDIT_EOE, EOE)])
        assert event.detail.get("reach", False) is reach, syscall  # type: ignore[attr-defined]
        assert event.detail["path"] == "/tests/test_outputs.py"  # type: ignore[attr-defined]
        if reach:
            assert "a decoy" in event.summary  # type: ignore[attr-defined]
    # An open for writing is no reach: on record wherever it is.
    write = SYSCALL.replace("exit=-30", "exit=-13")
    (event,) = _feed(core, [(AUDIT_SYSCALL, write), (AUDIT_PATH, path), (AUDIT_EOE, EOE)])
    assert "reach" not in event.detail  # type: ignore[attr-defined]
