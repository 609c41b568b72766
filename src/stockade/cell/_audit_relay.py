"""The audit relay: a second reader of the kernel's audit log that outlives the daemon.

The kernel multicasts each audit record once, to whoever is listening at
that instant, and never replays it. The daemon's own reader (``_audit``)
makes every refusal it attributes durable within milliseconds, but a daemon
SIGKILLed (or OOM-killed) loses what was in its socket queue, what was on
its way to the store, and everything its cells' refusals produced in the
moment between its death and theirs (their death signals). This process
closes that gap.

Why a process of its own, reading on its own socket, rather than the
daemon reading through it: the daemon's live path (syscall to event on the
stream in about a millisecond, docs/PERFORMANCE.md) keeps its one hop, and
the relay only has to be *complete*, not fast. Multicast hands both sockets
the same records, and the same sans-I/O correlator (``_audit_core``) turns
them into the same events, so a restarted daemon can tell which of the
relay's events its predecessor had already stored (``missing``).

What it does:

* The daemon starts it (``AuditRelay.start``) in a session of its own with
  no death signal, so neither SIGKILL of the daemon nor a terminal's Ctrl-C
  ends it, and tells it over a pipe (its stdin) each cell it watches: run,
  cell, audit session, host pid of the cell's pid 1, the cell's places
  (bounded: ``MAX_PLACES_BYTES``) and the spool file
  (``<state>/runs/<run>/kernel.spool``, in the run's 0700 directory).
* The daemon watches it: a relay that dies is started again at once and told
  the live cells anew, each with the time since which no relay watched it
  (``uncovered_since``); that window is in the spool, and a recovery names it.
* Each refusal it attributes (Landlock, seccomp, and those of the mount layer
  and of file permissions that ``_attempts.not_an_attempt`` keeps, judged by
  the cell's ``Places``, which the daemon sends with the cell) is appended to
  that cell's spool as one JSON line, and the spool is ``fdatasync``ed in batches
  (every ``FLUSH_INTERVAL``): a few flushes a second, however many refusals.
  A spool is bounded by the same cap the daemon's reader has per cell
  (``MAX_EVENTS``, 10,000); past it, refusals are counted, not kept, and
  one ``dropped`` line says how many when the cell is let go.
* The pipe's end without a ``stop`` is the daemon's death. The relay then
  waits, on each watched cell's pidfd, for the cell to die (bounded by
  ``DRAIN_TIMEOUT``), sends a barrier through the audit log and waits for
  it (``AuditReader.settle``, at most ``SETTLE_TIMEOUT``: everything the
  kernel emitted before it has been read and spooled, and the kernel's lost
  counter compared; past the bound, a ``lost`` line, reason ``unsettled``),
  writes an ``end`` line per cell
  saying whether it saw the cell die, flushes, and exits. It holds an
  ``flock`` on its lock file while it lives, so the next daemon waits for it
  (``wait_for_relay``) before it reads the spools.
* ``stop`` (a daemon ending cleanly: every run ended and recorded) ends it at once.

The spool format, one JSON object a line: ``{"watch": {run, cell, session,
pid, time, places, uncovered_since}}`` (again for each relay that watched
the cell), ``{"event": <Event.to_dict()>}``, ``{"dropped": N, "cell"}``,
``{"unjudged": N, "cell"}`` (EXDEV refusals not kept: no places),
``{"lost": {cell, reason, count, time}}`` (the relay's own reader lost
records: its socket overflowed, the kernel dropped some, a Landlock domain
counted more than were logged, its barrier did not come back in time) and
``{"end": {cell, time, died, barrier}}``. ``read_spool`` parses it, and
tolerates a last line cut short by a crash of the relay itself.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, Final

from stockade.cell._attempts import MAX_PLACES_BYTES, Places, needs_places, not_an_attempt
from stockade.errors import HostError
from stockade.record._event import Event

__all__ = [
    "DRAIN_TIMEOUT",
    "KERNEL_LAYERS",
    "MAX_EVENTS",
    "RELAY_ENV",
    "AuditRelay",
    "CellSpool",
    "event_key",
    "missing",
    "read_spool",
    "wait_for_relay",
]

MAX_EVENTS: Final = 10_000
"""Refusals spooled per cell: the daemon's reader keeps no more per cell
either (``AuditCorrelator(max_events_per_cell=…)``), so a recovered run
never holds more than the live one would have."""
FLUSH_INTERVAL: Final = 0.05
"""Seconds between the spool's batched flushes: 20 fdatasyncs a second at
most, and a refusal is on disk within 50 ms of its record."""
DRAIN_TIMEOUT: Final = 10.0
"""Seconds the relay waits, after the daemon died, for its cells to die
(their death signals take milliseconds; the bound is for a cell that
somehow survives, which the next daemon's cgroup sweep then kills)."""
SETTLE_TIMEOUT: Final = 10.0
"""Seconds the relay waits, once its cells are dead, for its marker to come
back through the audit log (and the kernel's status to answer). Nothing
hurries it then (the next daemon waits for it); 2 s, the bound it had,
passed on a host slowed by strace while 300 refusals were still queued."""
_LOSSES: Final = frozenset({"overrun", "kernel", "landlock_count", "unsettled"})
"""The reasons of a ``cell.audit_lost`` of the relay's own reader that make its spool short."""
BACKLOG_LIMIT: Final = 32_768
"""The kernel audit backlog (records queued for delivery) the relay asks for."""
START_TIMEOUT: Final = 15.0
"""Seconds the daemon waits for a new relay to have its audit socket open."""
KERNEL_LAYERS: Final = frozenset({"landlock", "seccomp", "mount", "dac"})
"""The refusals the relay keeps: every layer the kernel audit log reports,
those with no other witness. The mount layer's and file permissions'
(``_audit_mount``) are judged by the cell's places as ``Cell`` judges them
(``_attempts.not_an_attempt``): the launcher's own and an ordinary ``mv``
are not attempts."""
RELAY_ENV: Final = "STOCKADE_AUDIT_RELAY"
"""``off``: the daemon starts no relay (benchmarks measure its cost so;
docs/PERFORMANCE.md). Internal: a daemon so started loses the refusals in
flight when it is killed, and its recoveries say there was no relay."""


# --------------------------------------------------------------------------- the spool


@dataclass
class CellSpool:
    """What a relay spooled of one cell."""

    run: str
    cell: str
    events: list[Event] = field(default_factory=list)
    dropped: int = 0
    """Refusals past ``MAX_EVENTS``, counted and not kept."""
    ended: bool = False
    """The relay wrote its ``end`` line: it outlived the daemon and drained."""
    died: bool = False
    """The relay saw the cell's pid 1 die before it drained."""
    barrier: bool = False
    """Its last barrier came back: every record the kernel emitted before it was read."""
    gaps: list[tuple[float, float]] = field(default_factory=list)
    """Windows (wall-clock seconds, from, to) in which no relay watched the
    cell: its relay died (or had not started) and its successor had not been
    told of the cell yet."""
    unjudged: int = 0
    """EXDEV refusals not kept: the cell's places were past ``MAX_PLACES_BYTES``."""
    lost: list[str] = field(default_factory=list)
    """Why the relay's own reader lost records while it watched the cell
    (``overrun``, ``kernel``, ``landlock_count``, ``unsettled``): its spool may be short."""


def read_spool(path: str) -> dict[str, CellSpool]:
    """The cells of one spool file, by cell id; empty when there is none.
    A line cut short (the relay itself killed mid-write) ends the reading."""
    from stockade.record._chain import event_from_dict

    cells: dict[str, CellSpool] = {}
    last: CellSpool | None = None
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except FileNotFoundError:
        return {}
    for line in lines:
        if not line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            break
        if "watch" in entry:
            w = entry["watch"]
            last = cells.setdefault(str(w["cell"]), CellSpool(run=str(w["run"]), cell=str(w["cell"])))
            since = w.get("uncovered_since")
            if isinstance(since, (int, float)):
                last.gaps.append((float(since), float(w["time"])))
            # A later relay's watch: what an earlier one wrote at its end no longer holds.
            last.ended = last.died = last.barrier = False
        elif "event" in entry:
            event = event_from_dict(entry["event"])
            spool = cells.get(event.cell)
            if spool is not None:
                spool.events.append(event)
        elif "dropped" in entry:
            spool = cells.get(str(entry.get("cell", ""))) or last
            if spool is not None:
                spool.dropped += int(entry["dropped"])
        elif "lost" in entry:
            lost = entry["lost"]
            spool = cells.get(str(lost.get("cell", "")))
            if spool is not None:
                spool.lost.append(str(lost.get("reason")))
        elif "unjudged" in entry:
            spool = cells.get(str(entry.get("cell", "")))
            if spool is not None:
                spool.unjudged += int(entry["unjudged"])
        elif "end" in entry:
            end = entry["end"]
            spool = cells.get(str(end["cell"]))
            if spool is not None:
                spool.ended, spool.died, spool.barrier = True, bool(end["died"]), bool(end["barrier"])
    return cells


def event_key(event: Event) -> tuple[Any, ...]:
    """What makes two readers' events of one kernel record the same: the
    kernel's serial of the event and what it refused. Not the whole detail:
    the task's fields come from a SYSCALL record that one reader may have
    given up waiting for (``group_ttl``) while the other had it. Nor the
    kind: a Landlock domain a reader learnt by its audit session (a relay
    started after the cell made it) is taken as enforcing, so an audit-mode
    cell's refusal may be ``cell.denied`` there and ``cell.audited`` here.
    Nor a refused call's paths: they come from PATH and CWD records that
    one reader may have finished the call without (lost, or past
    ``group_ttl``); the call's SYSCALL record, which begins its event, names
    the call and its error, and one call makes one such event.
    Events stored before mount-layer events carried their serial fall back
    to their kernel time stamp and summary (a loop of equal refusals in one
    millisecond makes equal keys, which ``missing`` counts)."""
    d = event.detail
    serial = d.get("serial")
    if serial is None:  # an event from before serials were kept
        return (event.cell, event.kind, event.layer, round(event.time, 3), event.summary)
    if event.layer == "seccomp":  # its own record names the call
        what: tuple[Any, ...] = (d.get("nr"), d.get("action"))
    elif event.layer in ("mount", "dac"):
        what = (d.get("nr"), d.get("errno"))
    else:  # one system call may meet several Landlock refusals, one record each
        what = (tuple(d.get("blockers") or ()), d.get("path"), d.get("domain"))
    return (event.cell, event.layer, round(event.time, 3), serial, what)


def missing(spooled: Iterable[Event], stored: Iterable[Event]) -> list[Event]:
    """The spooled events the store does not hold, in spool order. A multiset
    difference: an agent looping on one refused call makes many equal events."""
    have = Counter(event_key(e) for e in stored)
    out = []
    for event in spooled:
        key = event_key(event)
        if have[key] > 0:
            have[key] -= 1
        else:
            out.append(event)
    return out


def wait_for_relay(lock_path: str, timeout: float = DRAIN_TIMEOUT + SETTLE_TIMEOUT + 5.0) -> bool:
    """Wait until no relay holds ``lock_path`` (one still draining after its
    daemon died); True when none does. Waits on the relay's pidfd, named in
    the lock file, never longer than ``timeout``."""
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pass
            else:
                fcntl.flock(fd, fcntl.LOCK_UN)
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                pid = int(os.pread(fd, 32, 0).split()[0])
                pidfd = os.pidfd_open(pid)
            except (ValueError, IndexError, OSError):
                # Between its flock and writing its pid: a moment; look again soon.
                select.select([], [], [], min(remaining, 0.01))
                continue
            try:
                select.select([pidfd], [], [], remaining)
            finally:
                os.close(pidfd)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- the daemon's side


class AuditRelay:
    """The daemon's handle on its relay process. Thread-safe.

    Raises (``start``):
        HostError: the relay could not open the audit log or did not say it had.
    """

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = proc
        self._lock = threading.Lock()

    @classmethod
    def start(cls, lock_path: str, *, timeout: float = START_TIMEOUT) -> AuditRelay:
        # A session of its own and no death signal: the point is to outlive us.
        proc = subprocess.Popen(
            [sys.executable, "-m", "stockade.cell._audit_relay", lock_path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,
            start_new_session=True,
            close_fds=True,
        )
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        line = proc.stdout.readline() if ready else b""
        if line != b"ready\n":
            proc.kill()
            proc.wait()
            raise HostError(
                f"the audit relay did not start ({line.decode(errors='replace').strip() or 'no answer'}); "
                "kernel refusals would be lost if the daemon were killed: see its stderr",
                feature="audit",
            )
        proc.stdout.close()
        # Room for many watches at once (a cell's places may take a few KiB):
        # a launch never waits on a relay busy with a barrier. pipe(7): the
        # unprivileged maximum is /proc/sys/fs/pipe-max-size, 1 MiB by default.
        assert proc.stdin is not None
        with contextlib.suppress(OSError):
            fcntl.fcntl(proc.stdin.fileno(), fcntl.F_SETPIPE_SZ, 1 << 20)
        return cls(proc)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def alive(self) -> bool:
        return self._proc.poll() is None

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the relay process to end; True when it has."""
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def watch(
        self,
        *,
        run: str,
        cell: str,
        session: int,
        pid: int,
        spool: str,
        places: Places | None = None,
        uncovered_since: float | None = None,
    ) -> bool:
        """Tell the relay of a cell just launched (or, after a relay died,
        still alive: ``uncovered_since`` says since when no relay watched
        it); False when it is gone. ``places`` past ``MAX_PLACES_BYTES`` are
        not sent: the relay then keeps none of the cell's EXDEV refusals."""
        msg: dict[str, Any] = {"op": "watch", "run": run, "cell": cell, "session": session, "pid": pid}
        msg["spool"] = spool
        if places is not None:
            sent = places.to_dict()
            if len(json.dumps(sent)) <= MAX_PLACES_BYTES:
                msg["places"] = sent
        if uncovered_since is not None:
            msg["uncovered_since"] = uncovered_since
        return self._send(msg)

    def unwatch(self, cell: str) -> bool:
        """The cell ended and the daemon collected its refusals."""
        return self._send({"op": "unwatch", "cell": cell})

    def stop(self, timeout: float = 5.0) -> None:
        """End the relay (the daemon stops cleanly: nothing is left to drain)."""
        self._send({"op": "stop"})
        with contextlib.suppress(OSError):
            assert self._proc.stdin is not None
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def _send(self, msg: dict[str, Any]) -> bool:
        data = json.dumps(msg).encode() + b"\n"
        with self._lock:
            stdin = self._proc.stdin
            if stdin is None or stdin.closed:
                return False
            try:
                stdin.write(data)
                stdin.flush()
            except (BrokenPipeError, ValueError, OSError):
                return False
        return True


# --------------------------------------------------------------------------- the relay process


@dataclass
class _Watched:
    run: str
    cell: str
    fd: int
    pidfd: int
    places: Places | None
    kept: int = 0
    dropped: int = 0
    unjudged: int = 0


class _Relay:
    def __init__(self) -> None:
        from stockade.cell._audit import AuditReader

        # A burst of refusals queues ~6 records each (LANDLOCK_ACCESS, SYSCALL,
        # CWD, PATH, PROCTITLE, EOE) for kauditd, which a loaded host starves:
        # 1,500 refusals at once passed the reader's default backlog of 8,192
        # here, and Landlock's records past it are dropped (GFP_ATOMIC). The
        # witness asks for four times that (a few tens of MiB at worst, and
        # only while a burst waits); the limit is the host's, only ever raised.
        self.reader = AuditReader(backlog_limit=BACKLOG_LIMIT)
        self.reader.start()
        self.lock = threading.Lock()
        self.cells: dict[str, _Watched] = {}
        self.pending: list[tuple[_Watched, bytes]] = []
        self.wake = threading.Event()
        self.done = False
        self.reader.on_event(self._on_event)
        self.writer = threading.Thread(target=self._write_loop, name="relay-writer", daemon=True)
        self.writer.start()

    def _on_event(self, event: Event) -> None:
        if event.kind == "cell.audit_lost" and event.detail.get("reason") in _LOSSES:
            self._lost(event)
            return
        if event.layer not in KERNEL_LAYERS or event.kind not in ("cell.denied", "cell.audited"):
            return
        with self.lock:
            w = self.cells.get(event.cell)
            if w is None:
                return
            if w.places is None and needs_places(event):
                w.unjudged += 1  # cannot tell an mv from an attempt; the recovery says so
                return
            if w.places is not None and not_an_attempt(event, w.places):
                return
            if w.kept >= MAX_EVENTS:
                w.dropped += 1  # counted; one line says how many when the cell is let go
                return
            w.kept += 1
            self.pending.append((w, json.dumps({"event": event.to_dict()}).encode() + b"\n"))

    def _lost(self, event: Event) -> None:
        """Its reader lost records: the spool says so, and a recovery will not call it complete."""
        line = {
            "lost": {
                "cell": event.cell,
                "reason": event.detail.get("reason"),
                "count": event.detail.get("count"),
                "time": event.time,
            }
        }
        with self.lock:
            w = self.cells.get(event.cell)
            if w is not None:
                self.pending.append((w, json.dumps(line).encode() + b"\n"))

    def _write_loop(self) -> None:
        while not self.done:
            self.wake.wait(FLUSH_INTERVAL)
            self.wake.clear()
            self.flush()

    def flush(self) -> None:
        with self.lock:
            batch, self.pending = self.pending, []
        touched: dict[int, None] = {}
        for w, data in batch:
            with contextlib.suppress(OSError):  # a full disk: the recovery says the spool is short
                os.write(w.fd, data)
                touched[w.fd] = None
        for fd in touched:
            with contextlib.suppress(OSError):
                os.fdatasync(fd)

    def watch(self, msg: dict[str, Any]) -> None:
        cell, run = str(msg["cell"]), str(msg["run"])
        fd = os.open(str(msg["spool"]), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            pidfd = os.pidfd_open(int(msg["pid"]))
        except OSError:
            pidfd = -1  # already gone: nothing to wait for
        sent = msg.get("places")
        places = Places.from_dict(sent) if isinstance(sent, dict) else None
        since = msg.get("uncovered_since")
        header = {
            "watch": {
                "run": run,
                "cell": cell,
                "session": msg["session"],
                "pid": msg["pid"],
                "time": time.time(),
                "places": places is not None,
                "uncovered_since": float(since) if isinstance(since, (int, float)) else None,
            }
        }
        os.write(fd, json.dumps(header).encode() + b"\n")
        with self.lock:
            self.cells[cell] = _Watched(run, cell, fd, pidfd, places)
        self.reader.watch(cell, session=int(msg["session"]), pid=int(msg["pid"]))

    def unwatch(self, cell: str) -> None:
        # The daemon has collected the cell (its barrier came back): so has
        # this reader, whose socket got the same records; one barrier here
        # makes sure before the cell is forgotten.
        self.reader.collect(cell, timeout=2.0)
        self.flush()
        with self.lock:
            w = self.cells.pop(cell, None)
        self.reader.unwatch(cell)
        if w is not None:
            self._close(w)

    def drain(self) -> None:
        """The daemon died: wait for the cells to die, read everything, say so."""
        deadline = time.monotonic() + DRAIN_TIMEOUT
        with self.lock:
            cells = dict(self.cells)
        died: dict[str, bool] = {}
        for cell, w in cells.items():
            if w.pidfd < 0:
                died[cell] = True
                continue
            ready, _, _ = select.select([w.pidfd], [], [], max(0.0, deadline - time.monotonic()))
            died[cell] = bool(ready)
        # One marker for all: every record the kernel emitted before it,
        # whichever cell's, has been read and spooled (via _on_event) when it
        # is back. If it is not back in time, the spool says so ("unsettled"),
        # and the recovery does not call itself complete.
        settle_by = time.monotonic() + SETTLE_TIMEOUT
        barrier = self.reader.settle(SETTLE_TIMEOUT)
        # The marker back is not enough: under strace a relay whose marker came
        # back had 39 refusals fewer than the agent met, with no overrun and no
        # rise of the kernel's lost counter. Landlock counts each denial of a
        # domain itself, logged or not, and logs the count when the domain is
        # freed (a workqueue after the last credential goes, so after the cell
        # died): the reader compares it with what it read (``landlock_count``).
        # Until every domain of the cells is freed and compared, nothing is proven.
        watched = list(cells)
        while barrier and self.reader.open_domains(watched):
            remaining = settle_by - time.monotonic()
            if remaining <= 0:
                barrier = False
                break
            select.select([], [], [], min(remaining, 0.02))
            barrier = self.reader.settle(max(0.0, settle_by - time.monotonic()))
        if not barrier:
            self.reader.mark_unsettled(watched, SETTLE_TIMEOUT)
        self.flush()
        for cell, w in cells.items():
            end = {"end": {"cell": cell, "time": time.time(), "died": died[cell], "barrier": barrier}}
            with contextlib.suppress(OSError):
                os.write(w.fd, json.dumps(end).encode() + b"\n")
                os.fdatasync(w.fd)
            self._close(w)

    def _close(self, w: _Watched) -> None:
        for what, n in (("dropped", w.dropped), ("unjudged", w.unjudged)):
            if n:
                with contextlib.suppress(OSError):
                    os.write(w.fd, json.dumps({what: n, "cell": w.cell}).encode() + b"\n")
                    os.fdatasync(w.fd)
        for fd in (w.fd, w.pidfd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def close(self) -> None:
        self.done = True
        self.wake.set()
        self.writer.join()
        self.flush()
        self.reader.close()


def _commands(stream: IO[bytes]) -> Iterator[dict[str, Any]]:
    for line in stream:
        with contextlib.suppress(ValueError):
            msg = json.loads(line)
            if isinstance(msg, dict):
                yield msg


def main(argv: list[str]) -> int:
    """``python -m stockade.cell._audit_relay LOCK_PATH`` (started by ``AuditRelay.start``)."""
    lock_path = argv[1]
    lock = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"another audit relay holds {lock_path}", flush=True)
        return 1
    os.ftruncate(lock, 0)
    os.pwrite(lock, f"{os.getpid()}\n".encode(), 0)
    # The OOM killer should take an agent's memory hog, or even the daemon,
    # before the witness of what they did (proc(5), oom_score_adj).
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
        f.write("-500")
    # Nor should a busy host starve it of the CPU it needs to keep its socket
    # from overflowing (setpriority(2); root may lower its nice value).
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, -5)
    sys.setswitchinterval(0.0005)
    try:
        relay = _Relay()
    except HostError as exc:
        print(str(exc), flush=True)
        return 1
    print("ready", flush=True)
    stopped = False
    for msg in _commands(sys.stdin.buffer):
        op = msg.get("op")
        try:
            if op == "watch":
                relay.watch(msg)
            elif op == "unwatch":
                relay.unwatch(str(msg["cell"]))
            elif op == "stop":
                stopped = True
                break
        except (KeyError, ValueError, OSError) as exc:
            print(f"stockade audit relay: {op}: {exc}", file=sys.stderr, flush=True)
    if not stopped:
        relay.drain()
    relay.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
