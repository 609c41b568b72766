"""A harness sample's record: its events into stockade's store, and the
containment report that goes into the harness's own log.

Where a daemon runs, a sample's sessions are the daemon's and their events
go to its store as they happen (``_hosted.DaemonHost``). Without one, the
sessions run in the harness's process and their events are collected there
and appended to the store at the end of the sample (``land``), through the
same journaled writer the daemon uses (``open_journaled_store``), which locks
the store's journal. Should a daemon have started meanwhile and hold that
lock, the store keeps one writer only (its hash chain depends on it): the
events are then kept in the run's directory as JSONL
(``<state>/runs/<run>/events.jsonl``) and the report says so, rather than
being lost or forking the chain.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from stockade.daemon import _paths
from stockade.record import Event

MAX_ATTEMPTS_LISTED = 50
"""Refusals listed one by one in a report; the counts cover all of them. A
sample whose agent hammers the kernel (the tripwire's floods) would otherwise
put thousands of lines into every eval log."""


class SampleRecord:
    """The events of one harness sample (one run id), collected from any thread."""

    def __init__(self, run_id: str, *, harness: str, task: str, sample: str = "") -> None:
        self.run_id = run_id
        self.harness = harness
        self.task = task
        self.sample = sample
        self._lock = threading.Lock()
        self._events: list[Event] = []
        self._seen: dict[int, Event] = {}
        """The events given, by id: kept alive so that an id is never reused."""
        self.started = time.time()

    def add(self, event: Event) -> None:
        """Keep ``event`` (once, whichever of the live sink and the end delivers it)."""
        with self._lock:
            if id(event) in self._seen:
                return
            self._seen[id(event)] = event
            self._events.append(_with_run(event, self.run_id))

    def extend(self, events: Iterable[Event]) -> None:
        for event in events:
            self.add(event)

    def replace(self, events: Iterable[Event]) -> None:
        """Make ``events`` the record (the store's copy of the sample, read back from a daemon)."""
        with self._lock:
            self._events = [_with_run(e, self.run_id) for e in events]
            self._seen.update((id(e), e) for e in self._events)

    def events(self) -> tuple[Event, ...]:
        with self._lock:
            return tuple(self._events)

    def harness_event(self, kind: str, summary: str, **detail: Any) -> Event:
        """A lifecycle event of the harness itself (``harness.sample.start``…)."""
        event = Event(
            kind=kind,
            cell="",
            layer="cell",
            outcome="info",
            summary=summary,
            run=self.run_id,
            detail={"harness": self.harness, "task": self.task, "sample": self.sample, **detail},
        )
        self.add(event)
        return event


def _with_run(event: Event, run_id: str) -> Event:
    if event.run == run_id:
        return event
    return Event(
        kind=event.kind,
        cell=event.cell,
        layer=event.layer,
        outcome=event.outcome,
        detail=event.detail,
        time=event.time,
        summary=event.summary,
        run=run_id,
    )


def containment_report(record: SampleRecord, *, landed: Mapping[str, Any]) -> dict[str, Any]:
    """What the sample's agent reached for and what stopped it, as plain JSON
    for a harness's log (Inspect's sample metadata, Harbor's trial files)."""
    events = record.events()
    refused = [e for e in events if e.outcome in ("denied", "audited")]
    limits = [e for e in events if e.kind == "cell.limit"]
    return {
        "run": record.run_id,
        "harness": record.harness,
        "task": record.task,
        "sample": record.sample,
        "cells": sorted({e.cell for e in events if e.cell}),
        "events": len(events),
        "refusals": len(refused),
        "refusals_by_layer": dict(sorted(Counter(e.layer for e in refused).items())),
        "attempts": [
            {"layer": e.layer, "kind": e.kind, "outcome": e.outcome, "summary": e.summary}
            for e in refused[:MAX_ATTEMPTS_LISTED]
        ],
        "attempts_left_out": max(0, len(refused) - MAX_ATTEMPTS_LISTED),
        "limits_hit": [e.summary for e in limits],
        "record": dict(landed),
    }


def land(record: SampleRecord, *, state: str | None = None) -> dict[str, Any]:
    """Append the sample's events to the store of ``state`` (the default state
    directory when None); where a daemon holds the store, keep them as JSONL in
    the run's directory instead. Returns where they are, for the report.

    Raises:
        StoreError: the store cannot be opened or written for another
            reason than a running daemon (a corrupt file, a full disk).
    """
    return Landing(state).land(record)


class Landing:
    """The store of ``state`` opened for one sample's record, ahead of it when
    ``ahead`` (in a thread of its own, while the sample's session closes:
    opening replays and flushes the journal, a few fsyncs): then ``land`` or
    ``abandon``, once. It holds this process's lock of that store meanwhile
    (``_landing_lock``): one writer at a time in this process too, since the
    journal's lock is an flock, which a second open in this process is
    refused as if it were another's (concurrent samples ending together
    raised StoreError)."""

    def __init__(self, state: str | None, *, ahead: bool = False) -> None:
        self._state = state or _paths.state_dir()
        self._path = _paths.store_path(self._state)
        self._store: Any = None
        self._held = False
        self._error: BaseException | None = None
        self._done = False
        self._ready = threading.Event()
        self._lock = _landing_lock(self._path)
        if ahead:
            threading.Thread(target=self._open, name="stockade-landing", daemon=True).start()
        else:
            self._open()

    def _open(self) -> None:
        from stockade.record._journaled import open_journaled_store

        self._lock.acquire()
        try:
            os.makedirs(self._state, mode=0o700, exist_ok=True)
            self._held = _held_by_another(self._path + ".journal")
            if not self._held:
                self._store = open_journaled_store(self._path)
        except BaseException as exc:  # raised again by land
            self._error = exc
        finally:
            self._ready.set()

    def land(
        self, record: SampleRecord, *, later: Callable[[Callable[[], None]], None] | None = None
    ) -> dict[str, Any]:
        """Append ``record``'s events; where they are, for the report (``land``'s).

        With ``later`` (``_pool.Later``), the store's close is handed to it:
        the events are durable and readable once the append returns (the
        journal's writes are ``O_DSYNC``, and a reader of the store reads
        what is only in the journal too), and what the close adds, their
        rows indexed into SQLite and its files flushed (~2-3 ms, two fsyncs),
        need not hold up the sample's end. This process's next landing in
        that store waits for it (``_landing_lock``)."""
        self._ready.wait()
        events = record.events()
        handed = False
        try:
            if self._error is not None:
                raise self._error
            if self._held:
                why = f"{self._path}.journal is locked by another process"
                return _keep_beside(record, events, self._state, why=why)
            stored = self._store.append(events)
            if later is not None:
                later(self._release)
                handed = True
        finally:
            if not handed:
                self._release()
        return {
            "store": self._path,
            "first_seq": stored[0].seq if stored else None,
            "last_seq": stored[-1].seq if stored else None,
            "verify": f"stockade verify --db {self._path}",
            "export": f"stockade export --db {self._path} --run {record.run_id}",
        }

    def abandon(self) -> None:
        """Let the store go unwritten (the sample's end failed before its record)."""
        self._ready.wait()
        self._release()

    def _release(self) -> None:
        if self._done:
            return
        self._done = True
        try:
            if self._store is not None:
                self._store.close()
        finally:
            self._store = None
            self._lock.release()


_LANDING: dict[str, threading.Lock] = {}
_LANDING_LOCK = threading.Lock()


def _landing_lock(path: str) -> threading.Lock:
    """The lock this process's lands into the store at ``path`` take."""
    key = os.path.realpath(path)
    with _LANDING_LOCK:
        return _LANDING.setdefault(key, threading.Lock())


def _held_by_another(journal: str) -> bool:
    """Whether a writer (a daemon) holds the store's journal lock now: the
    lock ``Journal.open`` takes, tried and let go at once."""
    try:
        fd = os.open(journal, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the lock, if it was taken
    return False


def _keep_beside(record: SampleRecord, events: tuple[Event, ...], state: str, *, why: str) -> dict[str, Any]:
    directory = _paths.run_dir(state, record.run_id)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    target = os.path.join(directory, "events.jsonl")
    with open(target, "w", encoding="utf-8") as out:
        for event in events:
            out.write(json.dumps(event.to_dict(), sort_keys=True) + "\n")
    return {
        "store": None,
        "events_file": target,
        "why": f"the store is held by a running daemon ({why}); the events are kept beside it",
    }


__all__ = ["SampleRecord", "containment_report", "land"]
