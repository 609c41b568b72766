"""The daemon's record and its live stream, and the events the daemon writes.

``Recorder`` is the one writer of the event store. It runs on the daemon's
loop: events handed to it during one pass of the loop are appended together,
in one durable write, at the start of the next pass (group commit), and each
caller gets its events back, stored, only after that write returned, so an
intent is never answered before its event is on disk. The write itself is
one ``O_DSYNC`` write of the store's journal (``record._journaled``): about
a tenth of a millisecond, cheaper done in the loop than handed to a thread
and back (two wake-ups and the GIL between them cost more than the write).
Once an append fails with ``StoreError`` the recorder refuses every later
write with the same error: the daemon never runs anything unrecorded.

``EventBus`` hands stored events, in ``seq`` order, to live subscribers
(``events.subscribe``) and a run's output to those following it (``run.logs
-f``). It never blocks: each subscriber's ``send`` says whether it could take
the message, and one that cannot (its bounded queue is full) is dropped and
reported to the caller, so one slow reader never stalls the others.

The ``*_event`` functions build the daemon's own events (docs/DAEMON.md,
"Events of the daemon"). Nothing here touches a socket.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import itertools
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from stockade import __version__
from stockade.daemon import _paths
from stockade.errors import StoreError
from stockade.record import Event, Outcome
from stockade.record._chain import StoredEvent
from stockade.record._journaled import JournaledStore, open_journaled_store
from stockade.record._store import EventStore

if TYPE_CHECKING:
    from stockade.broker._approvals import Approval
    from stockade.broker._rules import Decision
    from stockade.daemon._run import Run

MAX_BATCH = 1024
"""Events written in one journal write at most; more wait for the next."""

Then = Callable[[list[StoredEvent] | BaseException], None]
"""Called on the loop with the stored events once they are durable, or what
kept them from it (``StoreError``; another exception is a caller's bug, an
event that cannot be encoded). ``Recorder.record_then``."""
Waiter = asyncio.Future[list[StoredEvent]] | concurrent.futures.Future[list[StoredEvent]] | Then


@dataclass(eq=False, slots=True)
class _Append:
    events: Sequence[Event]
    waiter: Waiter


class Recorder:
    """The store's one writer, on the daemon's loop (see the module docstring)."""

    def __init__(
        self,
        path: str,
        loop: asyncio.AbstractEventLoop,
        *,
        on_stored: Callable[[list[StoredEvent]], None],
        on_failure: Callable[[StoreError], None],
    ) -> None:
        """
        Args:
            path: the store's file.
            loop: the daemon's event loop: appends, ``on_stored`` and
                ``on_failure`` happen there.
            on_stored: every batch of stored events, in order, before any of
                their callers is answered.
            on_failure: the first write that failed (called once).
        """
        self.path = path
        self._loop = loop
        self._on_stored = on_stored
        self._on_failure = on_failure
        self._pending: collections.deque[_Append] = collections.deque()
        self._scheduled = False
        # Held while appending: close() may come from another thread.
        self._lock = threading.Lock()
        self._store: JournaledStore | None = None
        self.failure: StoreError | None = None
        self.appended = 0
        self.commits = 0

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Open the store (copying in what a crash left in its journal); any thread.

        Raises:
            StoreError: the store cannot be opened or written.
        """
        self._store = open_journaled_store(self.path, on_failure=self._indexer_failed)

    def close(self) -> None:
        """Write what is queued, close the store; any thread. Idempotent."""
        with self._lock:
            store, self._store = self._store, None
            pending, self._pending = list(self._pending), collections.deque()
            if store is None:
                return
            if pending:
                self._append(store, pending)
            store.close()

    # ----------------------------------------------------------------- writing

    def record_soon(self, events: Sequence[Event]) -> asyncio.Future[list[StoredEvent]]:
        """From the loop: a future of the stored events, set once they are durable.

        The future's exception is ``StoreError`` when they could not be written.
        """
        waiter: asyncio.Future[list[StoredEvent]] = self._loop.create_future()
        self._enqueue(events, waiter)
        return waiter

    def record_then(self, events: Sequence[Event], then: Then) -> None:
        """From the loop: call ``then`` with the stored events once they are
        durable (or with the exception that kept them from it, see ``Then``).

        ``record_soon`` without a future: the broker's fast path answers an
        intent from ``then``, in the same pass of the loop as the write, where a
        future would wake a task one pass later."""
        self._enqueue(events, then)

    async def retry(self, events: Sequence[Event]) -> list[StoredEvent]:
        """From the loop, after a failure: try the store again with ``events``.
        Once they are stored, writes are accepted again.

        Raises:
            StoreError: it still cannot write (``on_failure`` is called again).
        """
        self.failure = None
        return await self.record_soon(events)

    def record(self, events: Sequence[Event]) -> list[StoredEvent]:
        """From any thread but the loop's: store ``events`` and wait until durable.

        Raises:
            StoreError: they could not be written (or the daemon is ending).
        """
        if self.failure is not None:
            raise self.failure
        waiter: concurrent.futures.Future[list[StoredEvent]] = concurrent.futures.Future()
        try:
            self._loop.call_soon_threadsafe(self._enqueue, events, waiter)
        except RuntimeError:  # the loop is closed
            raise StoreError(
                f"the daemon is ending; {len(events)} events were not recorded", path=self.path
            ) from None
        while True:
            try:
                return waiter.result(timeout=0.5)
            except concurrent.futures.TimeoutError:
                # A loop that stopped with our callback still queued never runs
                # it: say so rather than wait for ever.
                if self._loop.is_closed():
                    raise StoreError(
                        f"the daemon ended before {len(events)} events were recorded", path=self.path
                    ) from None

    @property
    def store(self) -> JournaledStore:
        """The store, for reading (``query``, ``verify``, ``last_seq``): it is
        safe to read from any thread while the loop writes."""
        if self._store is None:
            raise StoreError(f"the event store {self.path} is not open", path=self.path)
        return self._store

    # ----------------------------------------------------------------- on the loop

    def _enqueue(self, events: Sequence[Event], waiter: Waiter) -> None:
        if self.failure is not None:
            _settle(waiter, self.failure)
            return
        self._pending.append(_Append(events, waiter))
        if not self._scheduled:
            self._scheduled = True
            # After every callback already due: whatever else this pass of the
            # loop records joins the same write.
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        with self._lock:
            batch: list[_Append] = []
            count = 0
            while self._pending and count < MAX_BATCH:
                job = self._pending.popleft()
                batch.append(job)
                count += len(job.events)
            if self._pending and not self._scheduled:
                self._scheduled = True
                self._loop.call_soon(self._flush)
            store = self._store
            if store is None:
                error = StoreError(f"the event store {self.path} is closed", path=self.path)
                for job in batch:
                    self._answer(job.waiter, error)
                return
            self._append(store, batch)

    def _append(self, store: JournaledStore, batch: list[_Append]) -> None:
        if self.failure is not None:
            for job in batch:
                self._answer(job.waiter, self.failure)
            return
        events = [event for job in batch for event in job.events]
        try:
            stored = store.append(events) if events else []
        except StoreError as exc:
            self._fail(exc)
            for job in batch:
                self._answer(job.waiter, exc)
            return
        except Exception as exc:
            # Not the store's fault (an event that cannot be encoded, say):
            # write the jobs one by one, so only the bad one fails.
            if len(batch) == 1:
                self._answer(batch[0].waiter, exc)
                return
            for job in batch:
                self._append(store, [job])
            return
        self.commits += 1
        self.appended += len(stored)
        if stored:
            self._deliver(self._on_stored, stored)
        start = 0
        for job in batch:
            end = start + len(job.events)
            self._answer(job.waiter, stored[start:end])
            start = end

    def _fail(self, exc: StoreError) -> None:
        if self.failure is None:
            self.failure = exc
            self._deliver(self._on_failure, exc)

    def _answer(self, waiter: Waiter, result: list[StoredEvent] | BaseException) -> None:
        if isinstance(waiter, concurrent.futures.Future):
            _settle(waiter, result)  # a thread's: safe from anywhere, and it may outlive the loop
        else:
            self._deliver(_settle, waiter, result)

    def _deliver(self, fn: Callable[..., object], *args: Any) -> None:
        """Call ``fn`` on the loop: at once from the loop's own thread, else
        queued to it. ``close`` may write what is queued from any thread, and
        the callers' futures and callbacks, the live stream and the failure's
        handler belong to the loop (none of them is thread-safe). A loop
        already closed has nobody left to tell."""
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            fn(*args)
            return
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(fn, *args)

    def _indexer_failed(self, exc: StoreError) -> None:
        """From the store's indexer thread: SQLite cannot be written."""
        try:
            self._loop.call_soon_threadsafe(self._fail, exc)
        except RuntimeError:  # the loop is closed: the daemon is ending anyway
            pass


def _settle(waiter: Waiter, result: list[StoredEvent] | BaseException) -> None:
    """Resolve an asyncio future (on the loop), a thread's future or a callback."""
    if isinstance(waiter, asyncio.Future | concurrent.futures.Future):
        if waiter.done():
            return
        if isinstance(result, BaseException):
            waiter.set_exception(result)
        else:
            waiter.set_result(result)
        return
    try:
        waiter(result)
    except Exception as exc:  # a bug in the callback: the batch's other callers still get theirs
        print(f"stockade: internal error answering a recorded intent: {exc!r}", file=sys.stderr)


# --------------------------------------------------------------------------- the bus


Send = Callable[[int, str], bool]
"""Hands one stored event, as its JSON line (``StoredEvent.to_json``), to
subscription ``id``; False when its queue is full."""
SendOutput = Callable[[int, int, int, bytes], bool]
"""Hands (id, stream, offset, data) of a run's transcript to a follower; False when its queue is full."""
EndOutput = Callable[[int, dict[str, Any]], None]
"""Tells follower ``id`` that the run ended, and how (the run's info)."""


@dataclass(eq=False, slots=True)
class Subscription:
    id: int
    run: str | None
    """Only this run's events (``None``: every event)."""
    send: Send
    owner: object
    """Who asked (the connection), so that all of its subscriptions end with it."""


@dataclass(eq=False, slots=True)
class OutputTap:
    """Someone following a run's transcript from byte ``start`` on."""

    id: int
    run: str
    start: int
    send: SendOutput
    end: EndOutput
    owner: object


@dataclass(slots=True)
class EventBus:
    """Live subscribers to stored events and to runs' output (see the module docstring)."""

    _subs: dict[int, Subscription] = field(default_factory=dict)
    _taps: dict[str, dict[int, OutputTap]] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    dropped: int = 0

    def subscribe(self, send: Send, *, run: str | None, owner: object) -> Subscription:
        sub = Subscription(next(self._ids), run, send, owner)
        self._subs[sub.id] = sub
        return sub

    def tap(self, run: str, start: int, send: SendOutput, end: EndOutput, *, owner: object) -> OutputTap:
        tap = OutputTap(next(self._ids), run, start, send, end, owner)
        self._taps.setdefault(run, {})[tap.id] = tap
        return tap

    def unsubscribe(self, sub_id: int) -> None:
        self._subs.pop(sub_id, None)
        for taps in self._taps.values():
            taps.pop(sub_id, None)

    def drop_owner(self, owner: object) -> None:
        """End every subscription of ``owner`` (a connection that closed)."""
        for sub_id in [s.id for s in self._subs.values() if s.owner is owner]:
            del self._subs[sub_id]
        for run, taps in list(self._taps.items()):
            for tap_id in [t.id for t in taps.values() if t.owner is owner]:
                del taps[tap_id]
            if not taps:
                del self._taps[run]

    @property
    def subscribers(self) -> int:
        return len(self._subs) + sum(len(t) for t in self._taps.values())

    def publish(self, stored: Sequence[StoredEvent]) -> list[Subscription]:
        """Hand ``stored`` to every subscriber; return (and forget) the ones that overflowed."""
        if not self._subs:
            return []
        overflowed: list[Subscription] = []
        for item in stored:
            line: str | None = None
            for sub in list(self._subs.values()):
                if sub.run is not None and sub.run != item.event.run:
                    continue
                if line is None:
                    line = item.to_json()
                if not sub.send(sub.id, line):
                    del self._subs[sub.id]
                    overflowed.append(sub)
        self.dropped += len(overflowed)
        return overflowed

    def output(self, run: str, stream: int, offset: int, data: bytes) -> list[OutputTap]:
        """Hand a chunk of ``run``'s transcript (at byte ``offset``) to its followers."""
        taps = self._taps.get(run)
        if not taps:
            return []
        overflowed: list[OutputTap] = []
        end = offset + len(data)
        for tap in list(taps.values()):
            if end <= tap.start:
                continue  # already sent from the file
            chunk = data[max(0, tap.start - offset) :]
            if not tap.send(tap.id, stream, max(offset, tap.start), chunk):
                del taps[tap.id]
                overflowed.append(tap)
        self.dropped += len(overflowed)
        return overflowed

    def end_output(self, run: str, info: dict[str, Any]) -> None:
        """The run ended: tell its followers how, and forget them."""
        for tap in self._taps.pop(run, {}).values():
            tap.end(tap.id, info)


# --------------------------------------------------------------------------- the daemon's events


def daemon_event(kind: str, summary: str, *, socket: str, state: str) -> Event:
    """``daemon.start`` or ``daemon.stop``."""
    detail = {"pid": os.getpid(), "version": __version__, "socket": socket, "state": state}
    return Event(kind=kind, cell="", layer="broker", outcome="info", summary=summary, detail=detail)


def run_start_event(run: Run) -> Event:
    return Event(
        kind="run.start",
        cell="",
        layer="cell",
        outcome="info",
        run=run.id,
        summary=f"run {run.id} started for policy {run.name!r}: {' '.join(run.argv)[:200]}",
        detail={
            "name": run.name,
            "policy": run.policy.source,
            "argv": list(run.argv),
            "workspace": run.workspace,
            "detach": run.detach,
            "unattended": run.unattended,
            "denial_limit": run.tripwire.limit,
            "parent": run.parent,
        },
    )


def run_end_event(run: Run, cell: str) -> Event:
    """``run.end`` of a run whose ``state``, ``exit_code`` and ``error`` are final."""
    how = f"with exit code {run.exit_code}" if run.exit_code is not None else f"without a cell: {run.error}"
    return Event(
        kind="run.end",
        cell=cell,
        layer="cell",
        outcome="info",
        run=run.id,
        summary=f"run {run.id} ended {how}"
        + (f" (halted: {run.halted})" if run.halted else "")
        + (f" (stopped by {run.stopped_by})" if run.stopped_by else ""),
        detail={
            "state": run.state,
            "exit_code": run.exit_code,
            "error": run.error,
            "halted": run.halted,
            "stopped_by": run.stopped_by,
            "duration": round((run.ended or time.time()) - run.created, 6),
            "intents": run.intents,
            "denials": run.denials,
            "unattended_denials": run.unattended_denials,
            "cells": list(run.cells),
            "transcript_bytes": run.transcript_bytes,
            "transcript_truncated": run.transcript_truncated,
        },
    )


def run_lost_event(run_id: str, reason: str) -> Event:
    """``run.end`` of a run an earlier daemon did not see end."""
    return Event(
        kind="run.end",
        cell="",
        layer="cell",
        outcome="info",
        run=run_id,
        summary=f"run {run_id} was lost: its daemon ended before it (killed?)",
        detail={"exit_code": None, "state": "lost", "reason": reason},
    )


KERNEL_LAYERS = frozenset({"landlock", "seccomp", "mount", "dac"})
"""The layers whose refusals the kernel reports through the audit log."""


def _utc(t: float) -> str:
    """A wall-clock time to the millisecond, as the kernel stamps its records."""
    return time.strftime("%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}"


_RELAY_LOSSES: Final = {
    "overrun": "its socket overflowed",
    "kernel": "the kernel's backlog dropped records",
    "landlock_count": "a Landlock domain counted more denials than were logged",
    "unsettled": "its marker did not come back through the audit log in time, on a loaded host",
}
"""Why a relay's spool may be short (``cell._audit_relay``), in the words of ``cell.audit_lost``."""


def kernel_gap_event(
    store: EventStore,
    run_id: str,
    cell: str,
    now: float,
    *,
    recovered: int = 0,
    relayed_cells: int = 0,
    complete: bool = False,
    dropped: int = 0,
    gaps: Sequence[tuple[str, float, float]] = (),
    unjudged: int = 0,
    relay_lost: Sequence[str] = (),
) -> Event:
    """What a restarted daemon knows of the kernel refusals of a run its
    predecessor did not see end. ``cell.audit_lost``, reason ``daemon``.

    Those the dead daemon recorded are in the store (``kept``); those it had
    not, the audit relay had (``cell._audit_relay``): they are recorded with
    this event, just before it (``recovered``). ``complete``: the relay outlived the daemon,
    saw every cell of the run die and read the audit log to its end, so
    nothing the kernel reported for them is missing. Otherwise (no relay, or
    the relay itself was killed) any refusal after the last one recorded,
    until the cells died, could not be received: the kernel does not replay
    what it multicast. Refusals of the mount layer and of file permissions are
    relayed too, judged by each cell's places as the cell judges them.
    ``gaps``: windows in which no relay watched a cell (it died and the
    daemon started another): the daemon's own reader saw those live, and
    what of them it had not stored when it died is not known. ``unjudged``:
    EXDEV refusals the relay could not judge (places too big to send).
    ``relay_lost``: why the relay's own reader lost records (``overrun``:
    its socket overflowed; ``kernel``: the kernel dropped them), which makes
    it not complete."""
    kept = 0
    last = None
    for stored in store.query(run=run_id):
        event = stored.event
        last = event.time
        if event.kind in ("cell.denied", "cell.audited") and event.layer in KERNEL_LAYERS:
            kept += 1
    since = f"after {time.strftime('%H:%M:%S', time.gmtime(last))} UTC " if last is not None else ""
    total = kept + recovered
    head = (
        f"the daemon ended during run {run_id}: {total} kernel refusals of its cells are in the record "
        f"({kept} recorded by the daemon, {recovered} recovered from the audit relay)"
    )
    if complete:
        tail = (
            "; the relay saw every cell die and read the audit log to its end, so no Landlock, "
            "seccomp or mount-layer refusal is missing"
        )
        if gaps:
            tail += " outside the windows below"
    elif relayed_cells and relay_lost:
        why = ", ".join(f"{r}: {_RELAY_LOSSES.get(r, r)}" for r in relay_lost)
        tail = (
            f"; the relay's own reader lost records or could not prove it had them all ({why}): any the "
            f"kernel reported {since}until the cells died may be missing (the kernel does not replay them)"
        )
    elif relayed_cells:
        tail = (
            f"; the relay did not finish (killed too?): any the kernel reported {since}until the cells "
            "died could not be received (the kernel does not replay them)"
        )
    else:
        tail = (
            f"; there was no audit relay: any the kernel reported {since}until its cells died with "
            "the daemon could not be received (the kernel does not replay them)"
        )
    for gap_cell, start, end in gaps:
        tail += (
            f"; no relay watched cell {gap_cell} from {_utc(start)} to {_utc(end)} UTC (it died or had "
            "not started; the next one was told of the cell then): refusals of that window are those "
            "the daemon stored"
        )
    if unjudged:
        tail += f"; {unjudged} EXDEV refusals were not judged (the cell's places were too big to send)"
    if dropped:
        tail += f"; {dropped} past the per-cell cap were counted, not kept"
    return Event(
        kind="cell.audit_lost",
        cell=cell,
        layer="cell",
        outcome="info",
        run=run_id,
        summary=head + tail,
        detail={
            "reason": "daemon",
            "count": None if not complete else 0,
            "kept": kept,
            "recovered": recovered,
            "relay": "complete" if complete else "partial" if relayed_cells else "none",
            "dropped": dropped,
            "uncovered": [{"cell": c, "from": a, "to": b} for c, a, b in gaps],
            "unjudged": unjudged,
            "relay_lost": list(relay_lost),
            "last_recorded": last,
            "restarted": now,
        },
    )


def run_halted_event(run: Run, reason: str) -> Event:
    return Event(
        kind="run.halted",
        cell="",
        layer="broker",
        outcome="denied",
        run=run.id,
        summary=f"run {run.id} halted: {reason}",
        detail={"reason": reason, "denials": run.denials, "limit": run.tripwire.limit},
    )


_OUTCOMES: dict[str, Outcome] = {"allow": "allowed", "deny": "denied", "ask": "info"}
_WORDS = {"allow": "allowed", "deny": "denied", "ask": "asked"}


def intent_event(
    run: Run,
    cell: str,
    intent: str,
    args: Mapping[str, object],
    decision: Decision,
    *,
    tool_call: str | None = None,
) -> Event:
    """One broker decision; ``args`` already redacted. ``tool_call``: the agent's
    tool call that made the intent (the SDK's id), linking the two in the record."""
    target = args.get("path") or args.get("argv") or args.get("url") or args.get("question") or ""
    if isinstance(target, list):
        target = " ".join(str(a) for a in target)
    rule = f" by rule {decision.rule}" if decision.rule else ""
    return Event(
        kind="intent",
        cell=cell,
        layer="broker",
        outcome=_OUTCOMES[decision.verdict],
        run=run.id,
        summary=f"{intent} {str(target)[:200]}".strip() + f" {_WORDS[decision.verdict]}{rule}",
        detail={
            "intent": intent,
            "args": dict(args),
            "verdict": decision.verdict,
            "rule": decision.rule,
            "reason": decision.reason,
            **({"tool_call": tool_call} if tool_call is not None else {}),
        },
    )


def approval_event(kind: str, run: Run, approval: Approval) -> Event:
    """``approval.asked`` or ``approval.decided``."""
    asked = kind == "approval.asked"
    return Event(
        kind=kind,
        cell="",
        layer="broker",
        outcome="info" if asked or approval.state == "approved" else "denied",
        run=run.id,
        summary=(
            f"approval {approval.id} asked for {approval.intent} of run {run.id}"
            if asked
            else f"approval {approval.id} {approval.state} by {approval.by}"
            + (f": {approval.reason}" if approval.reason else "")
        ),
        detail=approval.to_dict(),
    )


def store_error_event(error: str, when: float, path: str) -> Event:
    return Event(
        kind="store.error",
        cell="",
        layer="broker",
        outcome="info",
        summary=f"the event store could not write from {time.ctime(when)} on, and runs were halted: {error}",
        detail={"error": error, "failed_at": when, "path": path},
    )


def noted_store_error(state: str) -> Event | None:
    """The ``store.error`` for a failure a daemon noted but could not record
    (``<state>/store-error.json``), or None."""
    try:
        with open(_paths.store_error_path(state), encoding="utf-8") as f:
            noted = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(noted, dict):
        return None
    error, path = str(noted.get("error", "")), str(noted.get("path", ""))
    return store_error_event(error, float(noted.get("time") or 0), path)


def dropped_event(stream: str, run: str | None, limit: int) -> Event:
    return Event(
        kind="subscriber.dropped",
        cell="",
        layer="broker",
        outcome="info",
        run=run or "",
        summary=f"a live {stream} subscriber fell behind by more than {limit} bytes and was dropped",
        detail={"stream": stream, "limit_bytes": limit},
    )


# --------------------------------------------------------------------------- export pages


EXPORT_PAGE = 1000
"""Events one ``events.export`` answer carries at most."""
EXPORT_PAGE_BYTES = 768 * 1024


def export_page(store: EventStore, params: Mapping[str, Any]) -> dict[str, Any]:
    """One page of ``events.export``, rendered (docs/DAEMON.md).

    Raises:
        ValueError: a bad parameter, said in one sentence.
    """
    from stockade.record._export import FORMATS, text_line

    fmt = params.get("format", "jsonl")
    since, run, after = params.get("since"), params.get("run"), params.get("after_seq", 0)
    limit = params.get("limit", EXPORT_PAGE)
    if fmt not in FORMATS:
        raise ValueError(f"'format' must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if since is not None and (isinstance(since, bool) or not isinstance(since, int | float)):
        raise ValueError("'since' must be seconds since the epoch")
    if run is not None and not isinstance(run, str):
        raise ValueError("'run' must be a run id")
    if isinstance(after, bool) or not isinstance(after, int) or after < 0:
        raise ValueError("'after_seq' must be a whole number, 0 or more")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= EXPORT_PAGE:
        raise ValueError(f"'limit' must be from 1 to {EXPORT_PAGE}")
    lines: list[str] = []
    size = 0
    last = after
    more = False
    for stored in store.query(since=since, run=run, after_seq=after, limit=limit + 1):
        if len(lines) >= limit or size >= EXPORT_PAGE_BYTES:
            more = True
            break
        line = text_line(stored) if fmt == "text" else stored.to_json()
        lines.append(line)
        size += len(line) + 2
        last = stored.seq
    if fmt == "json":
        data = "[\n" + ",\n".join(lines) + "\n]\n" if lines else "[]\n"
    else:
        data = "".join(line + "\n" for line in lines)
    return {"format": fmt, "data": data, "count": len(lines), "last_seq": last, "more": more}


__all__ = [
    "MAX_BATCH",
    "EventBus",
    "OutputTap",
    "Recorder",
    "Subscription",
    "approval_event",
    "daemon_event",
    "dropped_event",
    "export_page",
    "intent_event",
    "kernel_gap_event",
    "noted_store_error",
    "run_end_event",
    "run_halted_event",
    "run_lost_event",
    "run_start_event",
    "store_error_event",
]
