"""Kernel audit records in, stockade events out: the sans-I/O core of the audit reader.

This module never touches a socket. :class:`AuditCorrelator` is fed the text of
each netlink audit message (``feed``) and answers with the events it could
attribute to a watched cell; ``stockade.cell._audit`` owns the socket and the
thread. Splitting them this way lets the parsing and attribution rules be tested
from recorded kernel lines, table-driven, without a kernel.

What the kernel sends (Linux 6.18, seen on this project's host; docs/EVENTS.md
has full examples):

* ``1326 AUDIT_SECCOMP``: one record, no EOE, carries ``ses``: attributed by session.
* ``1423 AUDIT_LANDLOCK_ACCESS``: ``domain=<hex id> blockers=<a,b> <object fields>``,
  followed in the same event (same ``audit(…:serial)`` stamp) by
  ``1424 AUDIT_LANDLOCK_DOMAIN status=allocated … pid=<creator pid>`` the first
  time the domain shows, then, when the task has an audit context, by
  ``1300 AUDIT_SYSCALL`` (pid, comm, exe, ses of the denied task), ``1327
  PROCTITLE`` and ``1320 EOE``. Attributed by domain id, learnt from the
  ``allocated`` record whose ``pid`` is a watched cell's pid-1, or by the
  ``ses`` of the grouped SYSCALL record.
* ``1424 … status=deallocated denials=N``: the domain is gone; N counts every
  denial, logged or not, which lets the reader see records that went missing.

PROCTITLE is never parsed: an agent's command line may hold a token.
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict, deque
from collections.abc import Iterable
from typing import Any, Final, Literal

from stockade._slots import Frozen, Mutable
from stockade.cell._audit_mount import (
    AUDIT_CWD,
    AUDIT_PATH,
    KEY_FIELD,
    MountRefusal,
    mount_event_detail,
    refusal_layer,
)
from stockade.cell._audit_mount import int_field as _int
from stockade.cell._syscall_table import AUDIT_ARCH_X86_64, SYSCALL_NAMES, X32_SYSCALL_BIT
from stockade.record._event import Event, Outcome

# Message types, from <linux/audit.h>.
AUDIT_SYSCALL: Final = 1300
AUDIT_EOE: Final = 1320
AUDIT_SECCOMP: Final = 1326
AUDIT_PROCTITLE: Final = 1327
AUDIT_LANDLOCK_ACCESS: Final = 1423
AUDIT_LANDLOCK_DOMAIN: Final = 1424
AUDIT_USER_AVC: Final = 1107
"""The user message type the barrier uses: the kernel logs ``AUDIT_USER_AVC``
even while auditing is disabled (kernel/audit.c, ``audit_receive_msg``), unlike
the rest of the 1100-1199 range."""

AUDIT_SID_UNSET: Final = 0xFFFFFFFF
"""``ses`` of a task whose loginuid was never set: never a cell's."""

# Seccomp actions as they appear in ``code=`` (the action bits of the filter's
# return value, <linux/seccomp.h>; the errno data is masked out by the kernel).
SECCOMP_RET_LOG: Final = 0x7FFC0000
_SECCOMP_ACTIONS: Final = {
    0x80000000: "kill_process",
    0x00000000: "kill_thread",
    0x00030000: "trap",
    0x00050000: "errno",
    0x7FC00000: "user_notif",
    0x7FF00000: "trace",
    SECCOMP_RET_LOG: "log",
    0x7FFF0000: "allow",
}

_UNTRUSTED: Final = frozenset({"comm", "exe", "path", "ocomm", "name", "cwd", "proctitle"})
"""Fields the kernel writes with ``audit_log_untrustedstring``: quoted when plain,
otherwise unquoted upper-case hex (a space, a quote, a control byte or a byte
above 0x7e forces hex)."""

_STAMP = re.compile(r"audit\((\d+)\.(\d+):(\d+)\): ?")
_FIELD = re.compile(r'([A-Za-z_][\w-]*)=(?:"([^"]*)"|(\S*))')
_SYSCALL_FIELDS = re.compile(r"\barch=(\S+) syscall=(\d+) .*? pid=(\d+) .*? ses=(\d+) comm=(\S+) exe=(\S+)")
"""The fields of an AUDIT_SYSCALL record that an event uses, in the kernel's order
(``audit_log_exit``); a regular expression instead of a dict of all thirty is
the reader's hottest path in a denial storm."""
_HEX = re.compile(r"(?:[0-9A-Fa-f]{2})+")
_MARKER = re.compile(r"msg='stockade-barrier ([0-9a-f]+):(\d+)")

KIND_DENIED: Final = "cell.denied"
KIND_AUDITED: Final = "cell.audited"
KIND_LOST: Final = "cell.audit_lost"

LossReason = Literal["overrun", "kernel", "landlock_count", "cap", "rules", "off", "unsettled"]


class AuditRecord(Frozen):
    """One parsed audit record: its type, stamp and decoded ``key=value`` fields."""

    _fields = ("type", "time", "serial", "fields")
    __slots__ = _fields
    type: int
    time: float
    """Seconds since the epoch, from ``audit(SECONDS.MILLIS:SERIAL)``."""
    serial: int
    """Records with the same serial belong to one kernel event."""
    fields: dict[str, str]

    def __init__(self, type: int, time: float, serial: int, fields: dict[str, str]) -> None:
        object.__setattr__(self, "type", type)
        object.__setattr__(self, "time", time)
        object.__setattr__(self, "serial", serial)
        object.__setattr__(self, "fields", fields)


def decode_value(key: str, raw: str) -> str:
    """Decode one field value as the kernel wrote it.

    Quoted values lose their quotes. An unquoted value of an untrusted-string
    field (``comm``, ``exe``, ``path``…) is hex and is decoded; bytes that are not
    UTF-8 become ``\\xNN`` escapes, so that the result is always printable JSON.
    """
    if len(raw) >= 2 and raw[0] == '"' and raw[-1] == '"':
        return raw[1:-1]
    if key in _UNTRUSTED and _HEX.fullmatch(raw):
        return bytes.fromhex(raw).decode("utf-8", "backslashreplace")
    return raw


def parse_fields(text: str) -> dict[str, str]:
    """The ``key=value`` pairs of a record body (after its stamp), decoded."""
    fields = {}
    for key, quoted, bare in _FIELD.findall(text):
        if bare and key in _UNTRUSTED and _HEX.fullmatch(bare):
            fields[key] = bytes.fromhex(bare).decode("utf-8", "backslashreplace")
        else:
            fields[key] = bare or quoted
    return fields


def parse_syscall_fields(text: str) -> dict[str, str]:
    """The fields of an AUDIT_SYSCALL record body that events use: arch, syscall,
    pid, ses, comm, exe (never the arguments, never the proctitle)."""
    m = _SYSCALL_FIELDS.search(text)
    if m is None:
        fields = parse_fields(text)
        return {k: fields[k] for k in ("arch", "syscall", "pid", "ses", "comm", "exe") if k in fields}
    return {
        "arch": m[1],
        "syscall": m[2],
        "pid": m[3],
        "ses": m[4],
        "comm": decode_value("comm", m[5]),
        "exe": decode_value("exe", m[6]),
    }


def parse_record(msg_type: int, body: str) -> AuditRecord | None:
    """Parse one record; ``None`` when it has no ``audit(…)`` stamp."""
    stamp = _STAMP.match(body)
    if stamp is None:
        return None
    seconds, millis, serial = stamp.groups()
    return AuditRecord(
        type=msg_type,
        time=int(seconds) + int(millis) / 1000,
        serial=int(serial),
        fields=parse_fields(body[stamp.end() :]),
    )


def _syscall_name(arch: str | None, nr: int | None) -> str | None:
    """The name of a native x86-64 call; ``None`` for another ABI, whose numbers differ."""
    if nr is None or _int(arch, 16) != AUDIT_ARCH_X86_64 or nr & X32_SYSCALL_BIT:
        return None
    return SYSCALL_NAMES.get(nr)


# --- events -------------------------------------------------------------------------------


def seccomp_event(cell: str, rec: AuditRecord) -> Event:
    """The event for one ``AUDIT_SECCOMP`` record."""
    f = rec.fields
    code = _int(f.get("code"), 16) or 0
    action = _SECCOMP_ACTIONS.get(code, f"0x{code:x}")
    nr = _int(f.get("syscall"))
    name = _syscall_name(f.get("arch"), nr)
    audited = code == SECCOMP_RET_LOG
    detail: dict[str, Any] = {
        "syscall": name,
        "nr": nr,
        "arch": "x86_64" if _int(f.get("arch"), 16) == AUDIT_ARCH_X86_64 else f.get("arch"),
        "action": action,
        "pid": _int(f.get("pid")),
        "comm": f.get("comm"),
        "exe": f.get("exe"),
        "serial": rec.serial,
    }
    sig = _int(f.get("sig"))
    if sig:
        detail["signal"] = sig
    what = name or f"system call {nr} (arch {f.get('arch')})"
    if audited:
        summary = f"{what} would be refused by seccomp (audit mode: allowed)"
    elif action.startswith("kill"):
        summary = f"{what} refused by seccomp; the process was killed"
    else:
        summary = f"{what} refused by seccomp"
    outcome: Outcome = "audited" if audited else "denied"
    return Event(
        kind=KIND_AUDITED if audited else KIND_DENIED,
        cell=cell,
        layer="seccomp",
        outcome=outcome,
        detail=detail,
        time=rec.time,
        summary=summary,
    )


_VERBS: Final = {
    "fs.execute": "execution of {path}",
    "fs.write_file": "write to {path}",
    "fs.read_file": "read of {path}",
    "fs.read_dir": "listing of {path}",
    "fs.remove_dir": "removal of a directory in {path}",
    "fs.remove_file": "removal of a file in {path}",
    "fs.make_char": "creation of a character device in {path}",
    "fs.make_dir": "creation of a directory in {path}",
    "fs.make_reg": "creation of a file in {path}",
    "fs.make_sock": "creation of a socket in {path}",
    "fs.make_fifo": "creation of a FIFO in {path}",
    "fs.make_block": "creation of a block device in {path}",
    "fs.make_sym": "creation of a symlink in {path}",
    "fs.refer": "link or rename into {path}",
    "fs.truncate": "truncation of {path}",
    "fs.ioctl_dev": "ioctl on {path}",
    "fs.change_topology": "mount change at {path}",
    "net.connect_tcp": "TCP connect to {daddr} port {port}",
    "net.bind_tcp": "TCP bind on {saddr}",
    "scope.signal": "signal to pid {target_pid} ({target_comm})",
    "scope.abstract_unix_socket": "connect to abstract unix socket {path}",
    "ptrace": "ptrace of pid {target_pid} ({target_comm})",
}


def landlock_event(
    cell: str, rec: AuditRecord, syscall: AuditRecord | None, *, enforcing: bool = True
) -> Event:
    """The event for one ``AUDIT_LANDLOCK_ACCESS`` record, with the denied task's
    pid, comm, exe and system call from the grouped ``AUDIT_SYSCALL`` record when
    there was one."""
    f = rec.fields
    blockers = [b for b in f.get("blockers", "").split(",") if b]
    # ``serial``: the kernel's own number of the event (``audit(…:SERIAL)``),
    # which tells two readers' copies of one refusal apart from a repeat.
    detail: dict[str, Any] = {"blockers": blockers, "domain": f.get("domain"), "serial": rec.serial}
    path = f.get("path")
    if path is not None:
        if "scope.abstract_unix_socket" in blockers and path.startswith("\x00"):
            path = "@" + path[1:]  # the usual notation for an abstract socket name
        detail["path"] = path
    for key in ("dev", "ioctlcmd", "saddr", "daddr"):
        if key in f:
            detail[key] = f[key]
    if "ino" in f:
        detail["ino"] = _int(f["ino"])
    port = _int(f.get("dest") or f.get("src"))
    if port is not None:
        detail["port"] = port
    if "opid" in f:
        detail["target_pid"] = _int(f["opid"])
        detail["target_comm"] = f.get("ocomm")
    if syscall is not None:
        s = syscall.fields
        nr = _int(s.get("syscall"))
        detail["syscall"] = _syscall_name(s.get("arch"), nr)
        detail["nr"] = nr
        detail["pid"] = _int(s.get("pid"))
        detail["comm"] = s.get("comm")
        detail["exe"] = s.get("exe")
    verb = _VERBS.get(blockers[0] if blockers else "", "access")
    try:
        what = verb.format_map({k: v for k, v in detail.items() if v is not None})
    except KeyError:  # an object field the kernel left out (e.g. no path)
        what = verb.split(" ", 1)[0] if blockers else "access"
    if enforcing:
        summary = f"{what} refused by landlock ({', '.join(blockers)})"
    else:
        summary = f"{what} would be refused by landlock ({', '.join(blockers)}; audit mode)"
    return Event(
        kind=KIND_DENIED if enforcing else KIND_AUDITED,
        cell=cell,
        layer="landlock",
        outcome="denied" if enforcing else "audited",
        detail=detail,
        time=rec.time,
        summary=summary,
    )


def lost_event(cell: str, reason: LossReason, count: int | None, when: float) -> Event:
    """The event that says kernel records were lost, so this cell's record may be incomplete."""
    n = "some" if count is None else str(count)
    why = {
        "overrun": "the reader's socket overflowed",
        "kernel": "the kernel's audit backlog or rate limit dropped them",
        "landlock_count": "the Landlock domain counted more denials than were logged",
        "cap": "the cell passed the limit of denials kept per run; they were counted, not kept",
        "rules": "the kernel audit rules that record refusals of read-only mounts could not be added",
        "off": "the cell ran without the kernel audit log, as chosen",
        "unsettled": "the reader could not prove it had read the audit log to the end in time: "
        "the kernel delivers records late on a loaded host",
    }[reason]
    return Event(
        kind=KIND_LOST,
        cell=cell,
        layer="cell",
        outcome="info",
        detail={"reason": reason, "count": count},
        time=when,
        summary=f"{n} kernel audit records were lost ({why}); denials of this cell may be missing",
    )


def unrecorded_event(cell: str, when: float) -> Event:
    """The event that says this cell runs without kernel refusal records, as
    the operator chose (``--without-kernel-records``) where the audit log
    cannot be read: its refusals still happen, unrecorded."""
    return Event(
        kind=KIND_LOST,
        cell=cell,
        layer="cell",
        outcome="info",
        detail={"reason": "off", "count": None},
        time=when,
        summary="kernel refusals of this cell are not recorded (run without the kernel audit log, "
        "as chosen); Landlock and seccomp still refuse, but nothing says what was tried",
    )


def mount_event(cell: str, refusal: MountRefusal) -> Event:
    """The event for a system call a read-only mount (or a mount point) refused."""
    detail, summary = mount_event_detail(refusal)
    return Event(
        kind=KIND_DENIED,
        cell=cell,
        layer="dac" if refusal_layer(refusal) == "dac" else "mount",
        outcome="denied",
        detail=detail,
        time=refusal.time,
        summary=summary,
    )


# --- attribution --------------------------------------------------------------------------


class _Group(Mutable):
    """Landlock records of one kernel event, waiting for their SYSCALL record."""

    _fields = ("arrived", "records", "syscall")
    __slots__ = _fields

    def __init__(
        self, arrived: float, records: list[AuditRecord] | None = None, syscall: AuditRecord | None = None
    ) -> None:
        self.arrived = arrived
        self.records: list[AuditRecord] = [] if records is None else records
        self.syscall = syscall


class _Domain(Mutable):
    _fields = ("cell", "enforcing", "logged")
    __slots__ = _fields

    def __init__(self, cell: str, enforcing: bool, logged: int = 0) -> None:
        self.cell = cell
        self.enforcing = enforcing
        self.logged = logged


class _Watch(Frozen):
    _fields = ("session", "pid")
    __slots__ = _fields
    session: int
    pid: int

    def __init__(self, session: int, pid: int) -> None:
        object.__setattr__(self, "session", session)
        object.__setattr__(self, "pid", pid)


def _hints_of(rec: AuditRecord, syscall: AuditRecord | None) -> list[tuple[str, object]]:
    """The keys by which a record in limbo may later be claimed: its
    session (its SYSCALL record's, or a seccomp record's own), the pid that
    allocated a domain, the domain an access record names."""
    hints: list[tuple[str, object]] = []
    ses = _int((syscall if syscall is not None else rec).fields.get("ses"))
    if ses is not None:
        hints.append(("ses", ses))
    if rec.type == AUDIT_LANDLOCK_DOMAIN:
        pid = _int(rec.fields.get("pid"))
        if pid is not None:
            hints.append(("pid", pid))
    domain = rec.fields.get("domain")
    if domain is not None:
        hints.append(("dom", domain))
    return hints


class AuditCorrelator:
    """Attributes parsed audit records to watched cells and turns them into events.

    Not thread-safe: the reader serialises every call under its lock.

    A record that no watched cell claims is kept for a while in a bounded limbo
    (``limbo_size`` records, ``limbo_ttl`` seconds), so that a cell registered a
    moment after its first denial still gets it; after that it is forgotten: it
    belongs to another process of this host. Ten seconds: every ``watch``
    and every newly learnt domain scans the whole limbo, so a longer stay
    (sixty seconds was tried for five hundred cells started at once) filled
    it with a busy host's other records and made each launch ~100 ms slower
    (issue 18); ``Cell.run`` watches a cell as soon as its launch returns.
    """

    def __init__(
        self,
        *,
        group_ttl: float = 0.5,
        limbo_size: int = 4096,
        limbo_ttl: float = 10.0,
        max_groups: int = 4096,
        max_events_per_cell: int = 10_000,
    ) -> None:
        self._group_ttl = group_ttl
        # A cell that loops on a denied call must not make this process hold
        # an event per attempt for as long as it runs: past the cap, denials
        # are counted and reported as one event when taken.
        self._max_events = max_events_per_cell
        self._overflow: dict[str, int] = {}
        self._limbo_ttl = limbo_ttl
        self._max_groups = max_groups
        self._watches: dict[str, _Watch] = {}
        self._by_session: dict[int, str] = {}
        self._by_pid: dict[int, str] = {}
        self._domains: dict[str, _Domain] = {}
        self._groups: OrderedDict[int, _Group] = OrderedDict()
        self._limbo: deque[tuple[float, AuditRecord, AuditRecord | None]] = deque(maxlen=limbo_size)
        # Refusals of read-only mounts (``_audit_mount``): gathered by serial,
        # and kept a while for a cell not watched yet, like the limbo above.
        self._mount: OrderedDict[int, MountRefusal] = OrderedDict()
        self._mount_limbo: deque[tuple[float, MountRefusal, int]] = deque(maxlen=limbo_size)
        """(arrived, refusal, its session): the session read once, not at every replay."""
        # What limbo may hold, by the keys that let a record be claimed
        # (("ses", n), ("pid", n), ("dom", id)): a watch or a learnt domain
        # that matches none of them leaves limbo unread. Without them every
        # launch scanned all 4,096 records a busy host keeps there: ~110 ms
        # a watch under load (issue 18). A superset, never less: entries
        # dropped from a full limbo stay in it until the next full scan.
        self._hints: set[tuple[str, object]] = set()
        self._learnt: list[tuple[str, object]] = []
        """Domains ``_access`` learnt by session since the last replay."""
        self._mount_hints: set[int] = set()
        self._events: dict[str, list[Event]] = {}
        self.mount_rules_missing: str | None = None
        """Set by the reader when the rules of ``_audit_mount`` are not in
        place: each cell's events then say so once."""
        self._told: set[str] = set()

    # -- cells --

    def watch(self, cell: str, *, session: int, pid: int, now: float) -> list[Event]:
        """Register a cell; returns the events of records already in limbo that are its."""
        if session <= 0 or session >= AUDIT_SID_UNSET:
            raise ValueError(f"audit session {session} is not a session id; read it from /proc/PID/sessionid")
        owner = self._by_session.get(session)
        if owner is not None and owner != cell:
            raise ValueError(f"audit session {session} is already watched for cell {owner!r}")
        self.unwatch(cell)
        self._watches[cell] = _Watch(session, pid)
        self._by_session[session] = cell
        self._by_pid[pid] = cell
        self._events.setdefault(cell, [])
        return self._replay_limbo(now, keys=(("ses", session), ("pid", pid)), session=session)

    def unwatch(self, cell: str) -> None:
        """Forget a cell, its domains and any events not yet taken."""
        w = self._watches.pop(cell, None)
        if w is not None:
            if self._by_session.get(w.session) == cell:
                del self._by_session[w.session]
            if self._by_pid.get(w.pid) == cell:
                del self._by_pid[w.pid]
        for dom in [d for d, info in self._domains.items() if info.cell == cell]:
            del self._domains[dom]
        self._events.pop(cell, None)
        self._overflow.pop(cell, None)
        self._told.discard(cell)

    def take(self, cell: str) -> list[Event]:
        """The cell's events so far, oldest first; they are forgotten."""
        events = self._events.get(cell)
        dropped = self._overflow.pop(cell, 0)
        if dropped:
            events = [*(events or []), lost_event(cell, "cap", dropped, time.time())]
        if self.mount_rules_missing is not None and cell not in self._told and cell in self._watches:
            self._told.add(cell)
            events = [*(events or []), lost_event(cell, "rules", None, time.time())]
        if not events:
            return []
        self._events[cell] = []
        return events

    # -- records --

    def wants(self, msg_type: int) -> bool:
        """False for an EOE, PATH or CWD record while no Landlock record nor
        refused system call waits for one: the reader then skips decoding it.
        A SYSCALL record is always wanted: it may begin a mount refusal."""
        if msg_type in (AUDIT_EOE, AUDIT_PATH, AUDIT_CWD):
            return bool(self._groups) or bool(self._mount)
        return True

    def awaits_syscall(self) -> bool:
        """Whether a Landlock record waits for its SYSCALL record: otherwise a
        SYSCALL record matters only if it carries the key of ``_audit_mount``'s
        rules, which the reader can see in the raw bytes without decoding."""
        return bool(self._groups)

    def feed(self, msg_type: int, body: str, now: float) -> tuple[list[Event], str | None]:
        """Process one netlink audit message.

        Returns the events newly attributed, and the barrier marker this message
        carried (``"<nonce>:<n>"``) if it was one; every group begun before a
        marker is finished when the marker is seen.
        """
        out: list[Event] = []
        marker = None
        if msg_type == AUDIT_USER_AVC:
            m = _MARKER.search(body)
            stamp = _STAMP.match(body)
            if m is not None and stamp is not None:
                marker = f"{m[1]}:{m[2]}"
                self._finish_before(int(stamp[3]), out)
        elif msg_type in (AUDIT_SYSCALL, AUDIT_EOE, AUDIT_PATH, AUDIT_CWD):
            stamp = _STAMP.match(body)
            if stamp is not None:
                self._syscall_part(msg_type, body, stamp, now, out)
        elif msg_type == AUDIT_SECCOMP:
            rec = parse_record(msg_type, body)
            if rec is not None:
                cell = self._by_session.get(_int(rec.fields.get("ses")) or AUDIT_SID_UNSET)
                if cell is None:
                    self._to_limbo(now, rec, None)
                else:
                    self._emit(seccomp_event(cell, rec), out)
        elif msg_type in (AUDIT_LANDLOCK_ACCESS, AUDIT_LANDLOCK_DOMAIN):
            rec = parse_record(msg_type, body)
            if rec is not None:
                if rec.fields.get("status") == "deallocated":
                    self._finish_before(rec.serial, out)
                    self._deallocated(rec, out)
                else:
                    group = self._groups.get(rec.serial)
                    if group is None:
                        group = self._groups[rec.serial] = _Group(now)
                    group.records.append(rec)
        self._expire(now, out)
        return out, marker

    def lost(self, reason: LossReason, count: int | None, when: float) -> list[Event]:
        """Record that records were lost: every watched cell gets an event saying so."""
        out: list[Event] = []
        for cell in self._watches:
            self._emit(lost_event(cell, reason, count, when), out)
        return out

    def open_domains(self, cells: Iterable[str]) -> int:
        """How many Landlock domains of ``cells`` have not been logged as
        deallocated yet: until they are, the kernel's own count of their
        denials (``status=deallocated denials=N``) has not been compared."""
        wanted = set(cells)
        return sum(1 for info in self._domains.values() if info.cell in wanted)

    def unsettled(self, cells: Iterable[str], waited: float, when: float) -> list[Event]:
        """Record that the reader's barrier did not come back within ``waited``
        seconds (or could not be sent): each of the watched ``cells`` gets an
        event saying its refusals may be missing."""
        out: list[Event] = []
        for cell in cells:
            if cell in self._watches:
                event = lost_event(cell, "unsettled", None, when)
                detail = {**event.detail, "waited": round(waited, 3)}
                self._emit(event._replace(detail=detail), out)
        return out

    def next_deadline(self) -> float | None:
        """When the oldest record set still waiting for its SYSCALL or EOE
        record is given up on and finished as it is (``now`` of ``feed``'s
        clock), or None when none waits.

        A task without an audit context never sends them, and nothing else
        would finish its refusal until the next record came: the reader wakes
        at this time to ``expire`` it, so that a refusal is an event within
        ``group_ttl`` of its record, not whenever the host next logs."""
        oldest = [d.arrived for d in (next(iter(self._groups.values()), None),) if d is not None]
        oldest += [r.arrived for r in (next(iter(self._mount.values()), None),) if r is not None]
        return min(oldest) + self._group_ttl if oldest else None

    def expire(self, now: float) -> list[Event]:
        """Finish the record sets that waited ``group_ttl`` (see ``next_deadline``)."""
        out: list[Event] = []
        self._expire(now, out)
        return out

    def flush(self, now: float) -> list[Event]:
        """Finish every pending group now (used when the reader stops)."""
        out: list[Event] = []
        self._finish_before(None, out)
        return out

    # -- internals --

    def _syscall_part(
        self, msg_type: int, body: str, stamp: re.Match[str], now: float, out: list[Event]
    ) -> None:
        """A SYSCALL, EOE, PATH or CWD record: the end of a Landlock group, or a
        part of a refused system call (``_audit_mount``)."""
        serial = int(stamp[3])
        group = self._groups.get(serial)
        if group is not None:
            if msg_type == AUDIT_SYSCALL:
                fields = parse_syscall_fields(body[stamp.end() :])
                group.syscall = AuditRecord(msg_type, 0.0, 0, fields)
            if msg_type in (AUDIT_SYSCALL, AUDIT_EOE):
                del self._groups[serial]
                self._finish(group, now, out)
            return
        if msg_type == AUDIT_SYSCALL:
            if KEY_FIELD in body:
                when = int(stamp[1]) + int(stamp[2]) / 1000
                fields = parse_fields(body[stamp.end() :])
                self._mount[serial] = MountRefusal(now, when, fields, serial=serial)
            return
        refusal = self._mount.get(serial)
        if refusal is None:
            return
        if msg_type == AUDIT_EOE:
            del self._mount[serial]
            self._finish_mount(refusal, now, out)
        elif msg_type == AUDIT_CWD:
            refusal.cwd = parse_fields(body[stamp.end() :]).get("cwd")
        else:
            fields = parse_fields(body[stamp.end() :])
            refusal.paths.append((fields.get("name", ""), fields.get("nametype", "")))

    def _finish_mount(self, refusal: MountRefusal, now: float, out: list[Event]) -> None:
        if not refusal.paths and refusal.syscall.get("exit") == "-111":
            return  # a refused connect that named no path: TCP, not a decoy
        cell = self._by_session.get(refusal.session or AUDIT_SID_UNSET)
        if cell is None:
            ses = refusal.session or AUDIT_SID_UNSET
            self._mount_limbo.append((now, refusal, ses))
            self._mount_hints.add(ses)
        else:
            self._emit(mount_event(cell, refusal), out)

    def _to_limbo(self, now: float, rec: AuditRecord, syscall: AuditRecord | None) -> None:
        self._limbo.append((now, rec, syscall))
        self._hints.update(_hints_of(rec, syscall))

    def _emit(self, event: Event, out: list[Event]) -> None:
        bucket = self._events.get(event.cell)
        if bucket is not None:
            if len(bucket) >= self._max_events and event.kind != KIND_LOST:
                # Counted, not delivered either: live subscribers record what
                # they get (the daemon), and a loop on a refused call in audit
                # mode (nothing halts it) would fill the record. ``take`` says
                # how many as one ``cap`` event.
                self._overflow[event.cell] = self._overflow.get(event.cell, 0) + 1
                return
            bucket.append(event)
            out.append(event)

    def _expire(self, now: float, out: list[Event]) -> None:
        while self._mount:
            serial, refusal = next(iter(self._mount.items()))
            if now - refusal.arrived < self._group_ttl and len(self._mount) <= self._max_groups:
                break
            del self._mount[serial]
            self._finish_mount(refusal, now, out)
        # A group whose task has no audit context never gets SYSCALL or EOE.
        while self._groups:
            serial, group = next(iter(self._groups.items()))
            if now - group.arrived < self._group_ttl and len(self._groups) <= self._max_groups:
                break
            del self._groups[serial]
            self._finish(group, now, out)

    def _finish_before(self, serial: int | None, out: list[Event]) -> None:
        """Finish the Landlock groups begun before ``serial`` (a marker's or a
        domain's end), or every group when None (the reader stops).

        A refused call's records (``_mount``) are left to their EOE: the kernel
        queues a call's records one by one as the call exits, so a marker or a
        record of another task may come between its SYSCALL and its PATH
        records with a higher serial. Finished there, the event would lack its
        paths, and two readers' copies of one refusal would differ (the
        daemon's recovery then stored it twice). A call that sent a SYSCALL
        record always sends its EOE; when that is lost, the loss is recorded
        and ``group_ttl`` finishes the refusal. A Landlock group may never get
        its SYSCALL record (a task without an audit context), so the marker is
        what finishes it."""
        for s in [s for s in self._groups if serial is None or s < serial]:
            group = self._groups.pop(s)
            self._finish(group, group.arrived, out)
        if serial is None:
            for s in list(self._mount):
                refusal = self._mount.pop(s)
                self._finish_mount(refusal, refusal.arrived, out)

    def _finish(self, group: _Group, now: float, out: list[Event]) -> None:
        # The domain record follows the access record that first showed it: learn first.
        learnt: list[tuple[str, object]] = []
        for rec in group.records:
            if rec.type == AUDIT_LANDLOCK_DOMAIN:
                if self._learn(rec, group.syscall):
                    learnt.append(("dom", rec.fields.get("domain")))
                else:
                    self._to_limbo(now, rec, group.syscall)
        for rec in group.records:
            if rec.type == AUDIT_LANDLOCK_ACCESS and not self._access(rec, group.syscall, out):
                self._to_limbo(now, rec, group.syscall)
        learnt += self._learnt
        self._learnt.clear()
        if learnt:
            self._replay_limbo(now, out, keys=learnt)

    def _session_cell(self, syscall: AuditRecord | None) -> str | None:
        if syscall is None:
            return None
        return self._by_session.get(_int(syscall.fields.get("ses")) or AUDIT_SID_UNSET)

    def _learn(self, rec: AuditRecord, syscall: AuditRecord | None) -> bool:
        """Learn which cell a newly allocated domain belongs to; False if none."""
        dom = rec.fields.get("domain")
        if dom is None:
            return False
        if syscall is not None:
            # ses is immutable inside a cell and unique: it outranks a pid, which may be reused.
            cell = self._session_cell(syscall)
        else:
            cell = self._by_pid.get(_int(rec.fields.get("pid")) or -1)
        if cell is None:
            return False
        enforcing = rec.fields.get("mode", "enforcing") == "enforcing"
        self._domains.setdefault(dom, _Domain(cell, enforcing))
        return True

    def _access(self, rec: AuditRecord, syscall: AuditRecord | None, out: list[Event]) -> bool:
        """Attribute one access record; False if no watched cell claims it."""
        dom = rec.fields.get("domain", "")
        info = self._domains.get(dom)
        if info is None:
            by_ses = self._session_cell(syscall)
            if by_ses is None:
                return False
            # A domain the cell's own processes made (nested Landlock): learnt by session.
            info = self._domains[dom] = _Domain(by_ses, True)
            self._learnt.append(("dom", dom))  # its records waiting in limbo are claimed
        info.logged += 1
        self._emit(landlock_event(info.cell, rec, syscall, enforcing=info.enforcing), out)
        return True

    def _deallocated(self, rec: AuditRecord, out: list[Event]) -> None:
        info = self._domains.pop(rec.fields.get("domain", ""), None)
        denials = _int(rec.fields.get("denials"))
        if info is None or denials is None or denials <= info.logged:
            return
        self._emit(lost_event(info.cell, "landlock_count", denials - info.logged, rec.time), out)

    def _replay_mount_limbo(self, now: float, out: list[Event], session: int | None) -> None:
        while self._mount_limbo and now - self._mount_limbo[0][0] > self._limbo_ttl:
            self._mount_limbo.popleft()
        if session is None or session not in self._mount_hints:
            return  # only a newly watched session can claim a mount refusal
        # Only the newly watched session can claim anything: the others stay
        # as they are, in order (a busy host keeps hundreds here).
        waiting = list(self._mount_limbo)
        self._mount_limbo = deque((e for e in waiting if e[2] != session), maxlen=self._mount_limbo.maxlen)
        self._mount_hints.discard(session)
        cell = self._by_session.get(session)
        for _arrived, refusal, ses in waiting:
            if ses == session and cell is not None:
                self._emit(mount_event(cell, refusal), out)

    def _replay_limbo(
        self,
        now: float,
        out: list[Event] | None = None,
        *,
        keys: Iterable[tuple[str, object]],
        session: int | None = None,
    ) -> list[Event]:
        """Attribute what limbo holds that a newly watched cell (its ``session``)
        or learnt domain claims; read only when ``keys`` may match something."""
        out = [] if out is None else out
        self._replay_mount_limbo(now, out, session)
        while self._limbo and now - self._limbo[0][0] > self._limbo_ttl:
            self._limbo.popleft()
        if not self._limbo:
            self._hints.clear()
            return out
        if not any(key in self._hints for key in keys):
            return out
        pending = list(self._limbo)
        self._limbo.clear()
        # Domains first, so that access records of the same cell find them.
        keep = [e for e in pending if e[1].type == AUDIT_LANDLOCK_DOMAIN and not self._learn(e[1], e[2])]
        for entry in pending:
            _, rec, syscall = entry
            if rec.type == AUDIT_SECCOMP:
                cell = self._by_session.get(_int(rec.fields.get("ses")) or AUDIT_SID_UNSET)
                if cell is None:
                    keep.append(entry)
                else:
                    self._emit(seccomp_event(cell, rec), out)
            elif rec.type == AUDIT_LANDLOCK_ACCESS and not self._access(rec, syscall, out):
                keep.append(entry)
        keep.sort(key=lambda e: e[0])
        self._limbo.extend(keep)
        self._hints = {hint for _, rec, syscall in keep for hint in _hints_of(rec, syscall)}
        return out
