"""The journal's tail: acknowledged events a reader finds in the journal, not yet in SQLite.

The daemon's store (``_journaled``) acknowledges an event once it is in the
journal (``_journal``) and inserts it into SQLite afterwards; after a crash it
stays only in the journal until the daemon starts again. A read-only store
(``stockade export``, ``stockade verify``) reads the journal too and serves
its tail, the events numbered beyond SQLite's last one, after SQLite's rows.

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

What lives here: the tail's data types (``Tail``, ``TailEvent``,
``tail_after``, ``indexed_fields``: pure, they see only records and SQLite's
head), and the read-only store's reads that join SQLite and the journal in the
order above (``rows_and_tail`` for ``query``, ``last_seq_with_tail``,
``verify_with_tail``, and ``journal_records`` and ``sqlite_head`` for
``stored_json``). ``_store.SqliteStore`` calls these with its connection and
its own readers of SQLite's rows, so this module does not import ``_store``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from stockade.errors import StoreError
from stockade.record._chain import GENESIS, ChainVerifier, StoredEvent, VerifyResult, hash_payload
from stockade.record._journal import SUFFIX, JournalRecord, read_records

_COLUMNS = ("run", "cell", "kind", "layer", "outcome")
_JOURNAL_TRIES = 3
"""How many times a read-only store reads the journal and SQLite again when
the journal does not resume right after SQLite (a gap, see above)."""


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


# -- a read-only store's reads: SQLite and the journal together ------------
#
# Only a read-only store reads the journal: the daemon's own store
# (``JournaledStore``) copies it in when it opens and waits for its indexer
# before it reads. The module docstring says why the journal is read before
# each SQLite snapshot and not after.

Select = Callable[
    [sqlite3.Connection, float | None, str | None, str | None, int, int | None], Iterator[StoredEvent]
]
"""``SqliteStore._select``: SQLite's rows that ``query``'s filters keep (since,
run, cell, after_seq, limit), in seq order."""
Walk = Callable[[sqlite3.Connection, ChainVerifier, int | None], bool]
"""``SqliteStore._walk``: feeds SQLite's rows (all, or those above a seq) to
the verifier; False at the first bad one."""
ToStored = Callable[[str, int, str, str, str], StoredEvent]
"""``_store._stored``: a stored event from its path, seq, hash, prev and JSON
text, checked as a row of SQLite is."""


def journal_records(conn: sqlite3.Connection, path: str) -> list[JournalRecord]:
    """The records of the journal of the store at ``path`` that reach beyond
    what SQLite (read through ``conn``) holds now."""
    cursor = conn.execute("SELECT max(seq) FROM events")
    try:
        known = cursor.fetchone()[0]
    finally:
        # Ends this statement's read: the snapshot the caller takes next
        # must begin after the journal was read, not before.
        cursor.close()
    return read_records(path + SUFFIX, after_seq=int(known or 0))


def sqlite_head(conn: sqlite3.Connection) -> tuple[int, str]:
    """SQLite's last event: its number and hash (0 and the genesis hash when empty)."""
    row = conn.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone()
    if row is None:
        return 0, GENESIS
    # Bytes when the caller reads with ``text_factory = bytes`` (``verify``).
    digest = row[1]
    return int(row[0]), digest.decode("utf-8", "replace") if isinstance(digest, bytes) else str(digest)


def rows_and_tail(
    conn: sqlite3.Connection,
    path: str,
    select: Select,
    stored: ToStored,
    since: float | None,
    run: str | None,
    cell: str | None,
    after_seq: int,
    limit: int | None,
) -> Iterator[StoredEvent]:
    """``query`` of a read-only store: SQLite's rows (``select``), then the
    events of the journal's tail that continue them and that the filters keep,
    each made a ``StoredEvent`` as a row is (``stored``).

    Raises:
        StoreError: the journal cannot be read, holds an event that is not
            valid, or resumes after a gap every time it is read.
        sqlite3.Error: SQLite cannot be read (the store words it).
    """
    left = limit
    for _ in range(_JOURNAL_TRIES):
        records = journal_records(conn, path)
        if not records:
            yield from select(conn, since, run, cell, after_seq, left)
            return
        conn.execute("BEGIN")  # the head and the rows from one snapshot
        head, last_hash = sqlite_head(conn)
        for row in select(conn, since, run, cell, after_seq, left):
            yield row
            if left is not None:
                left -= 1
        conn.execute("COMMIT")
        if left == 0:
            return  # SQLite's rows were enough; what follows them is not asked for
        tail = tail_after(records, head, last_hash)
        if tail.gap:
            # Not from a live daemon (see the module docstring): look again
            # from where these rows ended before calling it an error.
            after_seq = max(after_seq, head)
            continue
        for event in tail.continuing():
            if event.seq <= after_seq or not _matches(event, path, since, run, cell):
                continue
            yield stored(path, event.seq, event.hash, event.prev, _journal_text(event, path))
            if left is not None:
                left -= 1
                if left == 0:
                    return
        return
    raise _gap_error(tail, path)


def last_seq_with_tail(conn: sqlite3.Connection, path: str) -> int:
    """``last_seq`` of a read-only store: the last event of SQLite or, beyond
    it, of the part of the journal's tail that continues SQLite's chain.

    Raises:
        StoreError: the journal cannot be read, or resumes after a gap every
            time it is read.
        sqlite3.Error: SQLite cannot be read (the store words it).
    """
    for _ in range(_JOURNAL_TRIES):
        records = journal_records(conn, path)
        head, last_hash = sqlite_head(conn)
        tail = tail_after(records, head, last_hash)
        if not tail.gap:
            continuing = tail.continuing()
            return continuing[-1].seq if continuing else head
    raise _gap_error(tail, path)


def verify_with_tail(
    conn: sqlite3.Connection, path: str, verifier: ChainVerifier, walk: Walk
) -> VerifyResult:
    """``verify`` of a read-only store: SQLite's rows (``walk``), then every
    event of the journal's tail, through the same ``verifier``; a break beyond
    SQLite's last event says that it is in the journal.

    Raises:
        StoreError: the journal cannot be read.
        sqlite3.Error: SQLite cannot be read (the store words it).
    """
    after_seq: int | None = None
    for attempt in range(1, _JOURNAL_TRIES + 1):
        records = journal_records(conn, path)
        conn.execute("BEGIN")  # the head and the rows from one snapshot
        head, last_hash = sqlite_head(conn)
        intact = walk(conn, verifier, after_seq)
        conn.execute("COMMIT")
        if not intact or not records:
            return verifier.result()
        tail = tail_after(records, head, last_hash)
        if tail.gap and attempt < _JOURNAL_TRIES:
            after_seq = head
            continue
        # The tail goes through the same verifier: a gap, or an event
        # that does not continue SQLite's chain, is a break like any other.
        for event in tail.events:
            if verifier.check(event.seq, event.prev, event.hash, event.payload) is not None:
                break
            fields = indexed_fields(event.payload)
            if isinstance(fields, str):
                verifier.fail(event.seq, f"event {event.seq} was altered: {fields}")
                break
        result = verifier.result()
        if result.first_bad_seq is not None and result.first_bad_seq > head:
            where = (
                f"; events after {head} are not in SQLite yet but in the daemon's journal "
                f"{path + SUFFIX} (the daemon will refuse to start on it: keep both files "
                "for inspection)"
            )
            return dataclasses.replace(result, reason=result.reason + where)
        return result
    raise AssertionError("unreachable: the last attempt always returns")


def _matches(event: TailEvent, path: str, since: float | None, run: str | None, cell: str | None) -> bool:
    """Whether ``query``'s filters keep ``event``, as SQLite's WHERE would keep its row."""
    if since is None and run is None and cell is None:
        return True
    fields = indexed_fields(event.payload)
    if isinstance(fields, str):
        raise StoreError(
            f"event {event.seq} in the daemon's journal {path + SUFFIX} is not a valid event "
            f"({fields}); run `stockade verify --db {path}`",
            path=path,
        )
    return (
        (since is None or fields.time >= since)
        and (run is None or fields.run == run)
        and (cell is None or fields.cell == cell)
    )


def _journal_text(event: TailEvent, path: str) -> str:
    try:
        return event.payload.decode("utf-8")
    except UnicodeDecodeError:
        raise StoreError(
            f"event {event.seq} in the daemon's journal {path + SUFFIX} is not a valid event "
            f"(it is not UTF-8 text); run `stockade verify --db {path}`",
            path=path,
        ) from None


def _gap_error(tail: Tail, path: str) -> StoreError:
    resumes = tail.events[0].seq
    return StoreError(
        f"cannot read the event store {path}: the daemon's journal {path + SUFFIX} "
        f"resumes at event {resumes} but the store ends at event {tail.after}, so events "
        f"{tail.after + 1} to {resumes - 1} are in neither; keep both files for inspection and "
        f"run `stockade verify --db {path}`",
        path=path,
    )


__all__ = [
    "Indexed",
    "Select",
    "Tail",
    "TailEvent",
    "ToStored",
    "Walk",
    "indexed_fields",
    "journal_records",
    "last_seq_with_tail",
    "rows_and_tail",
    "sqlite_head",
    "tail_after",
    "verify_with_tail",
]
