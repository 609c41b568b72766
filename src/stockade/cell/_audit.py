"""The kernel audit reader: every Landlock and seccomp refusal becomes an event.

The kernel reports what Landlock and seccomp refuse as audit records. The
reader listens to them on a ``NETLINK_AUDIT`` socket bound to the read-only
multicast group (``AUDIT_NLGRP_READLOG``), so it coexists with auditd and never
registers as the audit daemon; it attributes each record to the cell it came
from and turns it into a ``stockade.record.Event``. Parsing and attribution live
in ``_audit_core`` (sans-I/O); this module owns the socket and the thread.

Auditing must be enabled for Landlock to log at all (``landlock_log_denial``
returns early while ``audit_enabled`` is 0; seccomp's ``SECCOMP_FILTER_FLAG_LOG``
records appear either way). The reader turns it on with ``AUDIT_SET`` if it is
off and **leaves it on** when it closes: another reader (a second stockade
process, a test run beside a daemon) may depend on it, and switching it off
under them would silently blind them. The cost of leaving it on without audit
rules is an audit context per new task. ``previous_enabled`` tells what it was.
For the same reason it raises the kernel's ``backlog_limit`` (64 at boot) to
8192, auditd's usual value, and leaves it there: Landlock's records are
allocated atomically and are dropped, not waited for, when the backlog is full.

The refusals of the mount layer and of file permissions (a write to a
protected file, a rename of a mount point, a connect to a decoy socket, an
overwrite of a root-owned file) happen before Landlock looks, so it logs
nothing for them; the reader installs the kernel audit rules of
``_audit_mount`` that do. Unlike auditing, they do not stay: they go a few
seconds after the last reader of the host closes (``RULES_LEASE``; a detached
remover of ``_audit_lease`` takes them away, so that no closing process waits
for it), since while they are loaded the host pays for them. While the host
has no audit rule but stockade's, one more rule (``_audit_mount.task_rule``)
spares every task outside a cell that cost.

Nothing is lost silently: a socket overrun, a rise of the kernel's ``lost``
counter, or a Landlock domain that counted more denials than were logged each
become a ``cell.audit_lost`` event for the cells concerned.

See docs/EVENTS.md for the events and the raw record formats.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from stockade._netns import initial, inside_path
from stockade._slots import Frozen
from stockade.cell._audit_core import AUDIT_SYSCALL, AUDIT_USER_AVC, AuditCorrelator
from stockade.cell._audit_mount import (
    AUDIT_ADD_RULE,
    AUDIT_DEL_RULE,
    KEY_FIELD,
    decoy_rule,
    ensure_dir_decoy,
    ensure_proc_decoy,
    foreign_rules,
    is_stockade_rule,
    rule_payloads,
    task_rule,
)
from stockade.errors import HostError
from stockade.record._event import Event

if TYPE_CHECKING:
    import logging

    from stockade.cell._attempts import Places


def _log() -> logging.Logger:
    # logging costs ~5 ms to import and is needed only when something goes wrong.
    import logging

    return logging.getLogger(__name__)


__all__ = ["AuditReader", "AuditStats"]


NETLINK_AUDIT: Final = 9
"""<linux/netlink.h>."""
AUDIT_NLGRP_READLOG: Final = 1
"""<linux/audit.h>: the multicast group of read-only log listeners (Linux 3.16+)."""
AUDIT_GET: Final = 1000
AUDIT_SET: Final = 1001
AUDIT_LIST_RULES: Final = 1013
NLMSG_DONE: Final = 3
AUDIT_STATUS_ENABLED: Final = 0x0001
AUDIT_STATUS_BACKLOG_LIMIT: Final = 0x0010
NLMSG_ERROR: Final = 2
NLM_F_REQUEST: Final = 0x1
NLM_F_ACK: Final = 0x4
SO_RCVBUFFORCE: Final = 33
"""<asm-generic/socket.h>: like SO_RCVBUF but past ``net.core.rmem_max`` (needs CAP_NET_ADMIN)."""

_NLMSGHDR = struct.Struct("=IHHII")
_STATUS = struct.Struct("=11I")
"""``struct audit_status`` (Linux 5.10+ layout, 44 bytes); older kernels send
fewer fields, which are read as zero."""

SELF_TEST_TIMEOUT: Final = 2.0
"""Seconds the reader waits at open for its marker to come back through the
audit log (it takes well under a millisecond here; the bound only matters
where it never comes)."""
SELF_TEST_QUICK: Final = 0.25
"""The first, brief wait, when another namespace may be the host's."""
BLIND: Final = (
    "this process is not in the host's network namespace and cannot enter it, and the kernel "
    "multicasts its audit records there only (a marker sent through the audit log did not come "
    "back), so Landlock and seccomp refusals would go unrecorded; run stockade in the host's "
    "network namespace (docker run --network=host, or --pid=host so that it can enter pid 1's; "
    "Kubernetes hostNetwork: true), see `stockade doctor` and docs/RECIPES.md, or choose to run "
    "without kernel refusal records (`stockade exec --without-kernel-records`)"
)
RULE_ATTEMPTS: Final = 4
"""How many times the reader sends an audit rule whose ack does not come
(waiting 1, 2, 3 and 4 times ``timeout``): under load an ack can be late, or
lost when the socket overruns, and a rule missing would leave a layer of
every cell's record out."""
_MOUNT_KEY: Final = KEY_FIELD.encode()
_INTERESTING: Final = frozenset({1107, 1300, 1302, 1307, 1320, 1326, 1423, 1424})
_FIX = (
    "run stockade as root on the host, not inside a container (it needs CAP_AUDIT_READ and CAP_AUDIT_CONTROL)"
)


class AuditStats(Frozen):
    """Counters since the reader opened."""

    _fields = ("records", "events", "overruns", "kernel_lost", "barrier_timeouts")
    __slots__ = _fields
    records: int
    """Netlink messages read."""
    events: int
    """Events attributed to watched cells."""
    overruns: int
    """Times the socket overflowed (``ENOBUFS``) and records were dropped."""
    kernel_lost: int
    """Records the kernel says it dropped since the reader opened (all of the host's)."""
    barrier_timeouts: int
    """``collect`` calls whose barrier did not come back in time."""

    def __init__(
        self,
        records: int,
        events: int,
        overruns: int,
        kernel_lost: int,
        barrier_timeouts: int,
    ) -> None:
        object.__setattr__(self, "records", records)
        object.__setattr__(self, "events", events)
        object.__setattr__(self, "overruns", overruns)
        object.__setattr__(self, "kernel_lost", kernel_lost)
        object.__setattr__(self, "barrier_timeouts", barrier_timeouts)


class _Waiter:
    """One outstanding request, or one barrier marker on its way round."""

    __slots__ = ("done", "error", "linked", "payload", "reply", "resend")

    def __init__(self, *, reply: bool = False, linked: _Waiter | None = None) -> None:
        self.done = threading.Event()
        self.error = 0
        self.payload = b""
        self.reply = reply
        """True: done when the reply comes (AUDIT_GET); False: done at the ack."""
        self.linked = linked
        """A barrier that fails when this request fails."""
        self.resend = False
        """A barrier whose marker may have been lost in an overrun."""

    def fail(self, error: int) -> None:
        self.error = error
        self.done.set()
        if self.linked is not None:
            self.linked.fail(error)


class Settling:
    """A barrier on its way round (``AuditReader.begin_settle``): its
    markers, the requests that sent them, and until when it is waited for."""

    __slots__ = ("barrier", "deadline", "markers", "sent")

    def __init__(self, deadline: float) -> None:
        self.barrier = _Waiter()
        self.deadline = deadline
        self.markers: list[str] = []
        self.sent: list[_Waiter] = []


class AuditReader:
    """Reads the kernel audit log and attributes Landlock and seccomp denials to cells.

    Thread-safe. Make one per process: every reader receives every record of the
    host. Use it as a context manager, or call :meth:`start` and :meth:`close`::

        with AuditReader() as audit:
            audit.watch("cell-1", session=ses, pid=pid1)
            ...                                   # the cell runs
            events = audit.collect("cell-1")      # every denial so far
            audit.unwatch("cell-1")

    Without :meth:`start`, records are read only while :meth:`collect` waits,
    and a long cell can overflow the socket: start the thread for anything but
    a short test.

    Args:
        rcvbuf: the socket receive buffer to ask for, in bytes (SO_RCVBUFFORCE;
            the kernel doubles it); the room for a burst the thread has not read.
        backlog_limit: raise the kernel's audit backlog to at least this (0:
            leave it alone).
        timeout: how long to wait for the kernel's answers while opening.

    Raises:
        HostError: (``feature="audit"``) the kernel has no audit support, or
            this process may not read the audit log or enable auditing.
    """

    def __init__(self, *, rcvbuf: int = 32 << 20, backlog_limit: int = 8192, timeout: float = 2.0) -> None:
        self._lock = threading.Lock()
        self._io_lock = threading.Lock()
        self._core = AuditCorrelator()
        self._callbacks: list[Callable[[Event], None]] = []
        self._waiters: dict[int, _Waiter] = {}
        self._barriers: dict[str, _Waiter] = {}
        self._seq = 0
        self._nonce = os.urandom(6).hex()
        self._buf = bytearray(1 << 16)  # an audit record is at most 8970 bytes
        self._view = memoryview(self._buf)
        self._thread: threading.Thread | None = None
        self._stop_r, self._stop_w = os.pipe()
        self._closed = False
        self._last_record = time.monotonic()
        self._records = self._events = self._overruns = self._timeouts = 0
        self._lost_base: int | None = None
        self._lost_seen = 0
        self._pending: list[Event] = []
        """Events attributed but not yet handed to the callbacks."""
        self._delivering = threading.RLock()
        """Held while events taken from ``_pending`` are handed to the
        callbacks, so that ``settle`` returns only once they all have been.
        Re-entrant: a callback may ``watch`` a cell."""
        self._congested = False
        self._audit_default = _booted_with_audit()
        self._lease = -1
        """A shared lock on ``RULES_LEASE`` while this reader needs the rules."""
        self._rule_payloads: list[bytes] = []
        self._control: socket.socket | None = None
        """A plain NETLINK_AUDIT socket (no multicast) for the rules' listing,
        handed to the remover at close."""
        self.rules_removed = False
        """Whether this reader, the last of the host, removed the rules itself
        at close (only when no remover could take them: ``_audit_lease``)."""
        self.rules_handed_over = False
        """Whether this reader's close left the rules to a detached remover,
        which removes them once no reader of the host needs them."""
        self.task_rule: bool | None = None
        """Whether the rule that spares tasks outside cells is loaded
        (``_audit_mount.task_rule``): False when the host has audit rules of
        its own, None when they could not be listed."""
        self.netns = "own"
        """Whose network namespace the socket is in: ``own`` (this process's,
        or the one it imported stockade in) or ``pid1`` (pid 1's, entered
        because this process's receives no audit records)."""
        self.path_tested: bool = False
        """Whether a marker sent through the audit log came back to the socket
        at open (False only when it could not be sent: no CAP_AUDIT_WRITE)."""
        # In the host's network namespace, whatever this thread's: the
        # kernel sends audit records to no other (see ``_netns.initial``).
        self._sock = self._socket(initial())
        try:
            self._open(rcvbuf, backlog_limit, timeout)
            # Briefly first: where another namespace is the host's, the wait
            # would only delay every start; the full wait comes back below.
            others = _other_netns()
            works = self._multicast_works(SELF_TEST_QUICK if others else SELF_TEST_TIMEOUT)
            for pid, path in others if works is False else ():
                # `unshare -n`, `ip netns exec`, a CI job in a namespace of its
                # own: an ancestor (or pid 1) is in the host's namespace, and
                # root may make the socket there. Proven by the marker, not assumed.
                try:
                    sock = self._socket(inside_path(path))
                except (HostError, OSError):
                    continue
                self._sock.close()
                self._sock = sock
                self._open(rcvbuf, backlog_limit, timeout)
                works = self._multicast_works(SELF_TEST_TIMEOUT)
                self.netns = f"pid {pid}'s"
                if works is not False:
                    break
            if works is False and others and self.netns != "own":
                # None of the others was the host's: perhaps ours is, and slow.
                self._sock.close()
                self._sock = self._socket(initial())
                self._open(rcvbuf, backlog_limit, timeout)
                works = self._multicast_works(SELF_TEST_TIMEOUT)
                self.netns = "own"
            elif works is False and others:
                works = self._multicast_works(SELF_TEST_TIMEOUT)
            if works is False:
                raise HostError(BLIND, feature="audit.netns")
            self.path_tested = works is True
        except BaseException:
            self._sock.close()
            if self._control is not None:
                self._control.close()
            self._close_pipe()
            if self._lease >= 0:
                os.close(self._lease)
            raise

    def _socket(self, where: contextlib.AbstractContextManager[None]) -> socket.socket:
        try:
            with where:
                return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_AUDIT)
        except OSError as exc:
            self._close_pipe()
            raise HostError(
                f"this kernel has no audit support ({exc.strerror}); stockade cannot record "
                "Landlock and seccomp denials without it: use a kernel built with CONFIG_AUDIT=y",
                feature="audit",
            ) from exc

    def _multicast_works(self, timeout: float) -> bool | None:
        """Whether a marker sent through the audit log comes back to this
        socket within ``timeout``: the kernel multicasts its records in the
        initial network namespace only, and a socket elsewhere hears nothing,
        without any error. None: the marker could not be sent (no
        CAP_AUDIT_WRITE), so this cannot tell."""
        barrier = _Waiter()
        overruns = self._overruns
        with self._lock:
            self._seq += 1
            marker = f"{self._nonce}:{self._seq}"
            self._barriers[marker] = barrier
        sent = self._send(AUDIT_USER_AVC, f"stockade-barrier {marker}".encode() + b"\0", linked=barrier)
        ok = self._wait(barrier.done, time.monotonic() + timeout)
        with self._lock:
            self._barriers.pop(marker, None)
            self._forget(sent)
        if barrier.error:
            return None
        # An overrun proves it as well: records came, more than the socket held
        # (the marker may have been dropped with them).
        return (ok and not barrier.resend) or self._overruns > overruns

    def _open(self, rcvbuf: int, backlog_limit: int, timeout: float) -> None:
        try:
            self._sock.bind((0, 1 << (AUDIT_NLGRP_READLOG - 1)))
        except OSError as exc:
            raise HostError(
                f"cannot join the kernel audit log's multicast group ({exc.strerror}); {_FIX}",
                feature="audit",
            ) from exc
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, rcvbuf)
        except OSError:  # no CAP_NET_ADMIN: as much as net.core.rmem_max allows
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.rcvbuf = self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        """The receive buffer the kernel granted, in bytes."""
        status = self._request(AUDIT_GET, b"", timeout, reply=True)
        if status.error:
            raise HostError(
                f"cannot read the kernel audit status ({os.strerror(status.error)}); {_FIX}",
                feature="audit",
            )
        fields = _status_fields(status.payload)
        self.previous_enabled: int = fields[1]
        """``enabled`` before the reader opened: 0 off, 1 on, 2 on and locked."""
        self._lost_base = fields[6]
        if self.previous_enabled == 0:
            reply = self._set(AUDIT_STATUS_ENABLED, enabled=1, timeout=timeout)
            if reply.error:
                raise HostError(
                    f"cannot enable kernel auditing ({os.strerror(reply.error)}), and Landlock "
                    f"logs nothing while it is off; {_FIX}, or enable it with 'auditctl -e 1'",
                    feature="audit",
                )
        self.previous_backlog_limit: int = fields[5]
        """``backlog_limit`` before the reader opened (0: unlimited)."""
        locked = self.previous_enabled == 2  # auditctl -e 2: no AUDIT_SET until reboot
        if backlog_limit and 0 < self.previous_backlog_limit < backlog_limit and not locked:
            # Landlock allocates its records with GFP_ATOMIC: past the backlog they
            # are dropped, not waited for, and the default (64) overflows as soon
            # as two cells are denied at once. Only ever raised, never lowered.
            reply = self._set(AUDIT_STATUS_BACKLOG_LIMIT, backlog_limit=backlog_limit, timeout=timeout)
            if reply.error:  # not fatal: bursts may lose records, and the record says so
                _log().warning(
                    "cannot raise the kernel audit backlog from %d to %d (%s); denial bursts "
                    "may lose records: raise it with 'auditctl -b %d'",
                    self.previous_backlog_limit,
                    backlog_limit,
                    os.strerror(reply.error),
                    backlog_limit,
                )

        self.rule_retries = 0
        """Rules whose ack did not come in time and that were sent again."""
        self.mount_rules_error: str | None = None
        """Why the rules that record refusals of read-only mounts could not be
        added (``_audit_mount``); None when they are in place. They stay when
        the reader closes while another reader of the host needs them."""
        payloads = list(rule_payloads())
        decoy = ensure_proc_decoy()
        if decoy is not None:  # the host files of a cell's /proc (PROC_DECOY)
            payloads.append(decoy_rule(decoy.st_ino, decoy.st_dev))
        ensure_dir_decoy()  # what a decoy directory binds (DIR_DECOY); its reaches: rule_payloads
        if self._lease < 0:
            self._lease = _take_lease()
        # Listed after the lease: a remover that held it exclusively is done.
        listed = self._listed_rules(timeout)
        foreign = None if listed is None else foreign_rules(listed)
        spare = task_rule()
        self.task_rule = None if foreign is None else foreign == 0
        if foreign == 0:
            payloads.append(spare)
        elif listed is not None and any(is_stockade_rule(r) and r[:4] == spare[:4] for r in listed):
            # The operator's own rules need every task's audit context: an
            # earlier reader's rule that spares tasks outside cells goes.
            self._add_rules([spare], timeout, kind=AUDIT_DEL_RULE)
        # Removed with the others whether added or not (ENOENT is no error).
        self._rule_payloads = [*payloads, spare] if foreign != 0 else payloads
        self.mount_rules_error = self._add_rules(payloads, timeout)
        if self.mount_rules_error is not None:
            # Not fatal: Landlock and seccomp are still recorded; every cell's
            # record says what it lacks (``cell.audit_lost``, reason "rules").
            why = "the audit configuration is locked (auditctl -e 2)" if locked else self.mount_rules_error
            self._core.mount_rules_missing = why
            _log().warning(
                "cannot add the kernel audit rules that record refusals of read-only mounts (%s); "
                "writes to protected files will be refused but not recorded",
                why,
            )

    def _listed_rules(self, timeout: float) -> list[bytes] | None:
        """The loaded audit rules (``AUDIT_LIST_RULES`` on a control socket
        of its own, so that no record is in the way); None when they cannot
        be listed."""
        try:
            if self._control is None:
                with initial():
                    self._control = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_AUDIT)
                self._control.bind((0, 0))
            return _list_rules(self._control, timeout)
        except OSError:
            return None

    def _add_rules(self, payloads: list[bytes], timeout: float, *, kind: int = AUDIT_ADD_RULE) -> str | None:
        """Add the kernel audit rules, all at once, and wait for their acks;
        returns why they could not all be added (None: they are in place).

        A rule that is already there answers ``EEXIST``, so a retry is safe:
        an ack that does not come in time (a busy host, or an ack dropped with
        records when the socket overran: acks and records share it) is asked
        for again, up to ``RULE_ATTEMPTS`` times with a longer wait each time,
        rather than leaving the cells of this process without that layer of
        their record. An error the kernel gives (``EPERM``, a locked
        configuration) is final."""
        pending = payloads
        error: str | None = None
        for attempt in range(1, RULE_ATTEMPTS + 1):
            # Sent before any ack is awaited: one round trip for all of them.
            sent = [(payload, self._send(kind, payload)) for payload in pending]
            deadline = time.monotonic() + timeout * attempt
            late: list[bytes] = []
            for payload, waiter in sent:
                if not self._wait(waiter.done, deadline):
                    late.append(payload)
                elif waiter.error and waiter.error not in (errno.EEXIST, errno.ENOENT) and error is None:
                    error = os.strerror(waiter.error)
            with self._lock:
                self._forget(*(waiter for _, waiter in sent))
            if not late:
                return error
            self.rule_retries += len(late)
            pending = late
        return error or f"{os.strerror(errno.ETIMEDOUT)}, {RULE_ATTEMPTS} times"

    def _set(self, mask: int, *, timeout: float, enabled: int = 0, backlog_limit: int = 0) -> _Waiter:
        """AUDIT_SET one field of ``struct audit_status`` (the others are ignored by mask)."""
        msg = _STATUS.pack(mask, enabled, 0, 0, 0, backlog_limit, 0, 0, 0, 0, 0)
        return self._request(AUDIT_SET, msg, timeout, reply=False)

    # -- lifecycle --

    def start(self) -> None:
        """Run a daemon thread that reads records as they come."""
        with self._lock:
            if self._closed:
                raise RuntimeError("AuditReader is closed")
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="stockade-audit", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop the thread and close the socket; the audit rules go a few
        seconds after the last reader of the host has closed (a detached
        remover takes them: ``_audit_lease``). Auditing stays enabled (see
        the module doc)."""
        with self._lock:
            if self._closed:
                return
        self._remove_rules_if_last()  # while the socket still reads the acks
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        if thread is not None:
            os.write(self._stop_w, b"x")
            thread.join()
        with self._io_lock:
            self._sock.close()
            self._close_pipe()

    def _remove_rules_if_last(self) -> None:
        """Let the kernel audit rules go: with any rule loaded, every system
        call of every process on the host pays for it (docs/PERFORMANCE.md),
        so they are there only while stockade runs. The lease goes to a
        detached remover (``_audit_lease``), which removes them once no
        reader of the host holds ``RULES_LEASE`` any more, so that this
        process does not wait for the kernel's 7-15 ms per rule. Only where
        none can be had does this reader remove them itself, when no other
        holds the lease; a reader that starts meanwhile waits for the lock,
        then adds them again."""
        lease, self._lease = self._lease, -1
        control, self._control = self._control, None
        if lease < 0:
            if control is not None:
                control.close()
            return
        try:
            if control is not None:
                from stockade.cell._audit_lease import hand_over

                if hand_over(lease, self._rule_payloads, control.fileno()):
                    self.rules_handed_over = True
                    return
            try:
                # Converting the shared lock may drop it first (flock(2)):
                # harmless, this reader is done with the rules either way.
                fcntl.flock(lease, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return  # another reader holds it: the rules stay, for it
            self.rules_removed = self._add_rules(self._rule_payloads, 0.5, kind=AUDIT_DEL_RULE) is None
        finally:
            os.close(lease)
            if control is not None:
                control.close()

    def __enter__(self) -> AuditReader:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("AuditReader is closed; open a new one")

    def _close_pipe(self) -> None:
        for fd in (self._stop_r, self._stop_w):
            os.close(fd)

    # -- cells --

    def watch(self, cell_id: str, *, session: int, pid: int, places: Places | None = None) -> None:
        """Attribute to ``cell_id`` the records of audit session ``session`` (read
        from ``/proc/<pid>/sessionid``) and of the Landlock domains that host pid
        ``pid`` (the cell's pid-1, which creates its domain) allocates.

        ``places`` (``_attempts``) is for a stand-in that judges the cell's
        mount-layer refusals itself (the daemon hands it to its audit relay);
        this reader attributes, and ``Cell`` judges what it delivers.

        Call it before the cell can be denied anything; records from the few
        seconds before are still matched.

        Raises:
            ValueError: ``session`` is not a session id, or another cell has it.
            RuntimeError: the reader is closed.
        """
        self._check_open()
        with self._lock:
            events = self._core.watch(cell_id, session=session, pid=pid, now=time.monotonic())
        self._deliver(events)

    def unwatch(self, cell_id: str) -> None:
        """Stop attributing records to ``cell_id``; its events not yet collected are dropped."""
        with self._lock:
            self._core.unwatch(cell_id)

    def collect(self, cell_id: str, *, timeout: float = 2.0, begun: Settling | None = None) -> list[Event]:
        """Return, and forget, the cell's events, oldest first.

        Before returning, makes sure that every record the kernel emitted before
        the call has been read (``settle``), or before ``begun`` was made
        (``begin_settle``). When that cannot be proven within ``timeout``
        seconds, the events end with a ``cell.audit_lost`` (reason
        ``unsettled``) that says the cell's refusals may be missing: a reader
        never calls a record complete on the strength of a quiet socket.

        Raises:
            RuntimeError: the reader is closed.
        """
        self._check_open()
        proven = self._barrier(timeout) if begun is None else self._barrier_end(begun)
        if not proven:
            self.mark_unsettled([cell_id], timeout)
        with self._lock:
            return self._core.take(cell_id)

    def begin_settle(self, timeout: float = 2.0) -> Settling:
        """Send ``settle``'s marker now, and return at once: ``collect(...,
        begun=)`` waits for it. The marker's way round the kernel's queue
        (~0.6 ms a cell) then passes while the caller ends the rest of its
        cell (its cgroups' figures and removal), where it was waited for
        after them. Whatever the kernel logs after this call is not proven
        read: call it once every process of the cell has ended.

        Raises:
            RuntimeError: the reader is closed.
        """
        self._check_open()
        return self._barrier_start(time.monotonic() + timeout)

    def abandon(self, settling: Settling) -> None:
        """Forget a ``begin_settle`` that no ``collect`` will finish (the
        caller failed before it)."""
        with self._lock:
            self._drop_settling(settling)

    def settle(self, timeout: float = 2.0) -> bool:
        """Read the audit log up to now; True when it is proven that every
        record the kernel emitted before the call has been read and handed to
        the ``on_event`` callbacks, and the kernel's ``lost`` counter has been
        compared since the last time (a rise is a ``cell.audit_lost``, reason
        ``kernel``, for every watched cell).

        The proof is a marker the reader sends through the audit log itself
        (``AUDIT_USER_AVC``): the kernel queues it behind every record emitted
        before it, on the one queue its kauditd thread multicasts in order, so
        its return means they all came. A dead cell and a socket with nothing
        to read prove nothing: kauditd delivers late on a loaded host (seconds
        under strace here). False when ``timeout`` passed first, when the marker
        could not be sent (no CAP_AUDIT_WRITE: the reader then waited for 50 ms
        without a record, which is not a proof), or when the kernel's status
        did not answer in time.

        Raises:
            RuntimeError: the reader is closed.
        """
        self._check_open()
        return self._barrier(timeout)

    def open_domains(self, cells: list[str]) -> int:
        """How many Landlock domains of ``cells`` the kernel has not logged as
        deallocated yet (``AuditCorrelator.open_domains``)."""
        with self._lock:
            return self._core.open_domains(cells)

    def mark_unsettled(self, cells: list[str], waited: float) -> None:
        """Say, in each of ``cells``' events (and to the callbacks), that its
        refusals may be missing: ``settle`` could not prove the log read."""
        with self._lock:
            events = self._core.unsettled(cells, waited, time.time())
            self._events += len(events)
        self._deliver(events)

    def on_event(self, callback: Callable[[Event], None]) -> Callable[[], None]:
        """Call ``callback(event)`` for every event attributed from now on, from
        the reading thread; it must be quick. Returns a function that unsubscribes."""
        with self._lock:
            self._callbacks.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._callbacks:
                    self._callbacks.remove(callback)

        return unsubscribe

    def stats(self) -> AuditStats:
        with self._lock:
            return AuditStats(
                records=self._records,
                events=self._events,
                overruns=self._overruns,
                kernel_lost=self._lost_seen,
                barrier_timeouts=self._timeouts,
            )

    # -- barrier --

    def _barrier(self, timeout: float) -> bool:
        """``settle``: the marker, the kernel's lost counter, the deliveries."""
        return self._barrier_end(self._barrier_start(time.monotonic() + timeout))

    def _barrier_start(self, deadline: float) -> Settling:
        settling = Settling(deadline)
        self._send_marker(settling)
        return settling

    def _send_marker(self, settling: Settling) -> None:
        with self._lock:
            self._seq += 1
            marker = f"{self._nonce}:{self._seq}"
            self._barriers[marker] = settling.barrier
            settling.markers.append(marker)
        text = f"stockade-barrier {marker}".encode() + b"\0"
        settling.sent.append(self._send(AUDIT_USER_AVC, text, linked=settling.barrier))

    def _barrier_end(self, settling: Settling) -> bool:
        barrier, deadline = settling.barrier, settling.deadline
        while True:
            ok = self._wait(barrier.done, deadline)
            if not (ok and barrier.resend):
                break
            # The socket overflowed while the marker was on its way and it may
            # have been dropped with the records (see _drained): send another.
            barrier.resend = False
            barrier.done.clear()
            self._send_marker(settling)
        proven = ok and not barrier.error
        if barrier.error:
            ok = self._quiesce(deadline)  # better than nothing, but no proof
        with self._lock:
            self._drop_settling(settling)
            if not ok:
                self._timeouts += 1
        # The kernel's count of dropped records, read after the barrier so that
        # it includes any drop before this call. Its reply comes from a kernel
        # thread of its own, not through the log: under load it takes a while,
        # and the rest of ``timeout`` is its bound (it was 0.5 s at most before,
        # and a late reply left a loss uncounted while the record said complete).
        # A reply lost in an overrun: that overrun is a loss event already.
        grace = max(0.0, deadline - time.monotonic())
        status = self._request(AUDIT_GET, b"", grace, reply=True)
        if status.error:
            proven = False
        else:
            with self._lock:
                self._check_kernel_lost(status.payload)
        # Every event of a record before the marker goes to the callbacks before
        # this returns: the reading thread may still be handing the marker's
        # batch to them (a relay that flushed then would lose the rest).
        if not self._deliver_pending(max(0.0, deadline - time.monotonic())):
            proven = False
        return proven

    def _drop_settling(self, settling: Settling) -> None:
        """Forget its markers and requests (under ``_lock``)."""
        for marker in settling.markers:
            self._barriers.pop(marker, None)
        self._forget(*settling.sent)

    def _quiesce(self, deadline: float) -> bool:
        """Wait until no record has come for 50 ms: the fallback barrier."""
        while time.monotonic() < deadline:
            if time.monotonic() - self._last_record >= 0.05:
                return True
            if self._reading_thread():
                time.sleep(0.01)
            else:
                self._pump_for(0.01)
        return False

    def _check_kernel_lost(self, payload: bytes) -> None:
        fields = _status_fields(payload)
        lost, auditd = fields[6], fields[3]
        if auditd == 0 and self._audit_default:
            # Booted with audit=1 and no auditd: the kernel holds records for an
            # auditd that never comes and counts every one past its hold queue as
            # lost (kauditd_hold_skb), though the multicast copy reached us. The
            # counter says nothing about our records then; follow it silently.
            self._lost_base = lost
            self._lost_seen = 0
            return
        base = self._lost_base if self._lost_base is not None else lost
        total = (lost - base) & 0xFFFFFFFF  # an atomic_t in the kernel: it wraps
        if total > self._lost_seen:
            events = self._core.lost("kernel", total - self._lost_seen, time.time())
            self._lost_seen = total
            self._events += len(events)
            self._pending.extend(events)

    # -- netlink --

    def _send(
        self, msg_type: int, payload: bytes, *, reply: bool = False, linked: _Waiter | None = None
    ) -> _Waiter:
        """Send one request; the returned waiter is done at its ack, or its reply if ``reply``.

        AUDIT_GET is sent without NLM_F_ACK: the kernel acks it before a kernel
        thread sends the reply, so the ack says nothing. Errors come either way.
        """
        with self._lock:
            self._seq += 1
            seq = self._seq
            waiter = self._waiters[seq] = _Waiter(reply=reply, linked=linked)
        flags = NLM_F_REQUEST if reply else NLM_F_REQUEST | NLM_F_ACK
        hdr = _NLMSGHDR.pack(_NLMSGHDR.size + len(payload), msg_type, flags, seq, 0)
        try:
            self._sock.send(hdr + payload)
        except OSError as exc:
            waiter.fail(exc.errno or errno.EIO)
        return waiter

    def _request(self, msg_type: int, payload: bytes, timeout: float, *, reply: bool) -> _Waiter:
        waiter = self._send(msg_type, payload, reply=reply)
        if not self._wait(waiter.done, time.monotonic() + timeout):
            waiter.error = errno.ETIMEDOUT
        with self._lock:
            self._forget(waiter)
        return waiter

    def _forget(self, *waiters: _Waiter) -> None:
        for seq in [s for s, w in self._waiters.items() if w in waiters]:
            del self._waiters[seq]

    def _reading_thread(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def _wait(self, event: threading.Event, deadline: float) -> bool:
        """Wait for ``event`` until ``deadline``, reading the socket meanwhile if no thread does."""
        while not event.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if self._reading_thread():
                event.wait(min(remaining, 0.1))
            else:
                self._pump_for(min(remaining, 0.05))
        return True

    def _pump_for(self, seconds: float) -> None:
        """Read what comes within ``seconds`` in the calling thread (no reader thread)."""
        if not self._io_lock.acquire(timeout=seconds):
            return
        try:
            if self._closed:
                return
            ready, _, _ = select.select([self._sock], [], [], seconds)
            if ready:
                self._read_batch()
        finally:
            self._io_lock.release()
        self._deliver_pending()

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._sock, select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        sock_fd = self._sock.fileno()
        wait_ms = -1
        while True:
            ready = poller.poll(wait_ms)
            if any(fd != sock_fd for fd, _ in ready):
                return
            with self._io_lock:
                try:
                    if ready:
                        self._read_batch()
                    wait_ms = self._expire()
                except Exception:  # a bug must not end the record: log it, read on
                    _log().exception("audit reader: unexpected error; reading on")
            self._deliver_pending()

    def _expire(self) -> int:
        """Finish what waited too long for the rest of its records; the
        milliseconds until the next such wait ends (-1: none). Holds ``_io_lock``."""
        with self._lock:
            now = time.monotonic()
            events = self._core.expire(now)
            if events:
                self._events += len(events)
                self._pending.extend(events)
            deadline = self._core.next_deadline()
        if deadline is None:
            return -1
        return max(1, int((deadline - now) * 1000) + 1)

    def _read_batch(self, limit: int = 256) -> None:
        """Read up to ``limit`` datagrams that are already queued. Holds ``_io_lock``."""
        recv_into, buf = self._sock.recv_into, self._buf
        with self._lock:
            now = time.monotonic()
            for _ in range(limit):
                try:
                    n = recv_into(buf, 0, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    self._drained()
                    break
                except OSError as exc:
                    if exc.errno != errno.ENOBUFS:
                        raise
                    self._overrun()
                    continue
                self._handle(n, now)
            self._last_record = now

    def _overrun(self) -> None:
        """The socket overflowed: the kernel dropped what did not fit. Holds ``_lock``."""
        self._overruns += 1
        self._congested = True
        events = self._core.lost("overrun", None, time.time())
        self._events += len(events)
        self._pending.extend(events)

    def _drained(self) -> None:
        """The receive queue is empty. Holds ``_lock``.

        Netlink reports ENOBUFS once, then drops silently until the queue has
        drained (``NETLINK_S_CONGESTED``, net/netlink/af_netlink.c): a marker
        sent meanwhile may be gone without a trace. Now that the queue is empty
        a new one gets through, so every barrier still waiting sends another.
        """
        if not self._congested:
            return
        self._congested = False
        for barrier in self._barriers.values():
            if not barrier.done.is_set():
                barrier.resend = True
                barrier.done.set()

    def _handle(self, n: int, now: float) -> None:
        """Process one datagram in ``_buf``. Holds ``_lock``."""
        buf, view, core = self._buf, self._view, self._core
        offset = 0
        while offset + _NLMSGHDR.size <= n:
            length, msg_type, _flags, seq, _pid = _NLMSGHDR.unpack_from(buf, offset)
            if length < _NLMSGHDR.size or offset + length > n:
                return
            self._records += 1
            start, offset = offset + _NLMSGHDR.size, offset + ((length + 3) & ~3)
            if msg_type in _INTERESTING:
                if not core.wants(msg_type):
                    continue  # EOE, PATH or CWD, and no record waits for one
                if (
                    msg_type == AUDIT_SYSCALL
                    and not core.awaits_syscall()
                    and buf.find(_MOUNT_KEY, start, start + length - _NLMSGHDR.size) < 0
                ):
                    continue  # another audit rule's record (auditd's): not decoded
                text = str(view[start : start + length - _NLMSGHDR.size], "utf-8", "replace")
                events, marker = core.feed(msg_type, text.rstrip("\0"), now)
                if events:
                    self._events += len(events)
                    self._pending.extend(events)
                if marker is not None and marker in self._barriers:
                    self._barriers[marker].done.set()
                continue
            waiter = self._waiters.get(seq)
            if waiter is None:
                continue
            payload = bytes(view[start : start + length - _NLMSGHDR.size])
            if msg_type == NLMSG_ERROR:
                code = -struct.unpack_from("=i", payload)[0]
                if code:
                    waiter.fail(code)
                elif not waiter.reply:
                    waiter.done.set()
            else:
                waiter.payload = payload
                waiter.done.set()

    def _deliver_pending(self, timeout: float = -1) -> bool:
        """Hand the attributed events to the callbacks, in order; False when
        another thread was still delivering after ``timeout`` seconds (-1: wait)."""
        if not self._delivering.acquire(timeout=timeout):
            return False
        try:
            with self._lock:
                events, self._pending = self._pending, []
            self._deliver(events)
        finally:
            self._delivering.release()
        return True

    def _deliver(self, events: list[Event]) -> None:
        if not events:
            return
        with self._lock:
            callbacks = list(self._callbacks)
        for event in events:
            for callback in callbacks:
                try:
                    callback(event)
                except Exception:
                    _log().exception("audit reader: an on_event callback failed")


def _other_netns(limit: int = 3) -> list[tuple[int, str]]:
    """Network namespaces other than this thread's where the host's may be:
    those of this process's ancestors, then pid 1's, at most ``limit``
    distinct ones, each as (pid, ``/proc/PID/ns/net``), nearest first."""
    try:
        mine = os.stat("/proc/thread-self/ns/net").st_ino
    except OSError:
        return []
    seen, found = {mine}, []
    pid = os.getppid()
    chain: list[int] = []
    while pid > 1 and len(chain) < 64:
        chain.append(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    for pid in (*chain, 1):
        path = f"/proc/{pid}/ns/net"
        try:
            ino = os.stat(path).st_ino
        except OSError:
            continue
        if ino not in seen:
            seen.add(ino)
            found.append((pid, path))
    return found[:limit]


RULES_LEASE: Final = "/run/stockade/audit-rules.lock"
"""Every reader of this host holds a shared ``flock`` on this file while it
needs the audit rules; a closing reader hands its lock to a remover
(``_audit_lease``), which removes them once it gets the lock exclusively. A
host without a writable ``/run`` keeps them, as before."""


LEASE_WAIT: Final = 10.0
"""Seconds a new reader waits for a closing one to finish removing the rules."""


def _take_lease() -> int:
    """A descriptor holding a shared lock on ``RULES_LEASE``, or -1 when it
    cannot be had (the rules then stay when the reader closes)."""
    try:
        os.makedirs(os.path.dirname(RULES_LEASE), mode=0o755, exist_ok=True)
        fd = os.open(RULES_LEASE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError:
        return -1
    # Waits only while a closing reader removes the rules (a few round
    # trips); they are added again right after. Bounded: a closer that is
    # stopped (SIGSTOP) with the lock must not stop every new reader, which
    # then goes on without a lease (and leaves the rules when it closes).
    deadline = time.monotonic() + LEASE_WAIT
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                break
            time.sleep(0.005)
        except OSError:
            break
    os.close(fd)
    return -1


def _list_rules(sock: socket.socket, timeout: float) -> list[bytes]:
    """The kernel's audit rules (``AUDIT_LIST_RULES``: one message a rule,
    then ``NLMSG_DONE``), on a socket that receives nothing else.

    Raises:
        OSError: the kernel refused (EPERM) or did not answer in time.
    """
    sock.settimeout(timeout)
    try:
        seq = int.from_bytes(os.urandom(4), "little") >> 1
        sock.send(_NLMSGHDR.pack(_NLMSGHDR.size, AUDIT_LIST_RULES, NLM_F_REQUEST | NLM_F_ACK, seq, 0))
        rules: list[bytes] = []
        while True:
            data = sock.recv(1 << 16)
            offset = 0
            while offset + _NLMSGHDR.size <= len(data):
                length, msg_type, _flags, got, _pid = _NLMSGHDR.unpack_from(data, offset)
                if length < _NLMSGHDR.size:
                    break
                body = data[offset + _NLMSGHDR.size : offset + length]
                offset += (length + 3) & ~3
                if got != seq:
                    continue
                if msg_type == NLMSG_DONE:
                    return rules
                if msg_type == NLMSG_ERROR:
                    code = -struct.unpack_from("=i", body)[0]
                    if code:
                        raise OSError(code, os.strerror(code))
                elif msg_type == AUDIT_LIST_RULES:
                    rules.append(body)
    finally:
        sock.settimeout(None)


def _booted_with_audit() -> bool:
    """True when the kernel command line turned auditing on at boot (``audit=1``)."""
    try:
        with open("/proc/cmdline") as f:
            return "audit=1" in f.read().split()
    except OSError:
        return False


def _status_fields(payload: bytes) -> tuple[int, ...]:
    """The fields of a ``struct audit_status``; missing trailing fields read as zero."""
    return _STATUS.unpack(payload[: _STATUS.size].ljust(_STATUS.size, b"\0"))
