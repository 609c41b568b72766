"""The journal's tail: acknowledged events a reader finds in the journal, not yet in SQLite.

The daemon's store (``_journaled``) acknowledges an event once it is in the
journal (``_journal``) and inserts it into SQLite afterwards; after a crash it
stays only in the journal until the daemon starts again. A read-only store
(``stockade export``, ``stockade verify``) reads the journal too and serves
its tail, the events numbered beyond SQLite's last one, after SQLite's rows.
Pure: the store reads the files and hands the records and SQLite's head here.

Why the journal is read BEFORE the SQLite snapshot is taken, and not after:
the daemon reuses the journal (``Journal.reset``) only once SQLite holds
everything in it. So an event acknowledged before the reader started is, at
every moment, in SQLite or in the current epoch of the journal, and the
journal's records up to it do not change until a reset, which needs it in
SQLite. Read in this order, the journal holds it unless the later snapshot
does. Read in the other order, a reset in between (the journal is full, or a
daemon starts and copies in what a crash left) would hand the reader an empty
journal and a snapshot without those events, and nothing would show the loss.
The daemon also opens each new epoch with the event after the last one SQLite
has, so a tail that does not start right after the snapshot (a gap) cannot
come from a live daemon; the store reads both again a few times before it
calls it an error.

A tail is served only as far as it continues SQLite's chain: a journal of
another store, or an edited one, adds nothing to a query (``verify`` reports
it as a break instead). Events of the journal that SQLite already holds (an
older epoch, or a daemon that stopped cleanly) are left out.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

from stockade.record._chain import hash_payload
from stockade.record._journal import JournalRecord

_COLUMNS = ("run", "cell", "kind", "layer", "outcome")


@dataclass(frozen=True, slots=True)
class TailEvent:
    """One event of the journal beyond SQLite: its number, the hash before it
    (as the journal's record chains it), its own hash and its stored JSON."""

    seq: int
    prev: str
    hash: str
    payload: bytes


@dataclass(frozen=True, slots=True)
class Tail:
    """What the journal holds beyond SQLite's last event ``after`` (hash ``last_hash``)."""

    after: int
    last_hash: str
    events: tuple[TailEvent, ...]
    """Every event of the journal numbered above ``after``, in order, whether
    or not it continues the chain (``verify`` and ``stored_json`` show them all)."""

    @property
    def gap(self) -> bool:
        """The journal resumes after ``after + 1``: the events between are in neither file."""
        return bool(self.events) and self.events[0].seq != self.after + 1

    def continuing(self) -> tuple[TailEvent, ...]:
        """The events that continue SQLite's chain, up to the first that does not:
        the ones a reader may serve as stored."""
        seq, prev = self.after, self.last_hash
        for n, event in enumerate(self.events):
            if event.seq != seq + 1 or event.prev != prev:
                return self.events[:n]
            seq, prev = event.seq, event.hash
        return self.events


def tail_after(records: Sequence[JournalRecord], after: int, last_hash: str) -> Tail:
    """The tail of ``records`` (in the journal's order) beyond event ``after``,
    whose hash is ``last_hash``, each event hashed as the daemon hashed it."""
    events: list[TailEvent] = []
    for record in records:
        if record.first_seq + len(record.events) - 1 <= after:
            continue
        # A record names only the hash before its first event; the hashes of
        # the others follow from it, also across ``after`` (the check of the
        # first tail event against ``last_hash`` covers the record's head).
        running = record.prev
        for seq, payload in enumerate(record.events, record.first_seq):
            digest = hash_payload(running, seq, payload)
            if seq > after:
                events.append(TailEvent(seq, running, digest, payload))
            running = digest
    return Tail(after, last_hash, tuple(events))


@dataclass(frozen=True, slots=True)
class Indexed:
    """The fields of a tail event that SQLite would index and ``query`` filters on."""

    time: float
    run: str
    cell: str


def indexed_fields(payload: bytes) -> Indexed | str:
    """The indexed fields of the stored JSON ``payload``, or why it is not an event
    (as ``_store`` words a row whose columns do not match its JSON)."""
    try:
        d = json.loads(payload)
        when = d["time"]
        columns = [d[name] for name in _COLUMNS]
    except (ValueError, KeyError, TypeError):
        return "its stored event is not a valid event"
    if isinstance(when, bool) or not isinstance(when, int | float) or not math.isfinite(when):
        return "its time is not a finite number"
    for name, value in zip(_COLUMNS, columns, strict=True):
        if not isinstance(value, str):
            return f"its {name} is not a string"
    return Indexed(float(when), columns[0], columns[1])


__all__ = ["Indexed", "Tail", "TailEvent", "indexed_fields", "tail_after"]
