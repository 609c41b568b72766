"""The store's journal, the daemon's journaled store, and read-only readers of both.

Real files under tmp_path throughout. A crash is what a SIGKILL leaves: the
store's files as they are at that moment (copied aside while the indexer is
held back, or a real SIGKILL of a child process). The indexer is held back
with a gate on its inserts, so that "acknowledged but not yet in SQLite" is a
state a test sets up, not a race it hopes to win. A full filesystem is a real
1 MiB tmpfs.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stockade.errors import StoreError
from stockade.record import (
    GENESIS,
    Event,
    SqliteStore,
    StoredEvent,
    VerifyResult,
    _journal_tail,
    chain_hash,
    open_store,
)
from stockade.record._journal import SUFFIX, Journal, JournalRecord, read_records
from stockade.record._journaled import JournaledStore, open_journaled_store
from tests.record.test_chain import make_event

_BOUND = 60.0
"""Seconds any wait on a thread may take before the test fails instead of hanging."""

# -- helpers ------------------------------------------------------------------


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "events.db")


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """While clear, every JournaledStore's indexer holds its rows back: what
    ``append`` acknowledges stays in the journal only. Set, it goes on."""
    gate = threading.Event()
    gate.set()
    insert = JournaledStore._insert

    def held_insert(self: JournaledStore, rows: Any) -> None:
        if threading.current_thread().name == "stockade-indexer" and not gate.wait(_BOUND):
            # A StoreError, not a hang: the store records it as the indexer's failure.
            raise StoreError("the test never let the indexer go", path=self.path)
        insert(self, rows)

    monkeypatch.setattr(JournaledStore, "_insert", held_insert)
    yield gate
    gate.set()


@contextlib.contextmanager
def journaled(db: str, gate: threading.Event, **kw: Any) -> Iterator[JournaledStore]:
    store = open_journaled_store(db, **kw)
    try:
        yield store
    finally:
        gate.set()  # close waits for the indexer
        store.close()


def crash_copy(db: str, where: Path) -> str:
    """The store's files as a SIGKILL would leave them now (the page cache
    survives a process's death): SQLite's file, its WAL and the journal."""
    where.mkdir()
    for suffix in ("", "-wal", SUFFIX):
        if os.path.exists(db + suffix):
            shutil.copyfile(db + suffix, where / (os.path.basename(db) + suffix))
    return str(where / os.path.basename(db))


def sqlite_seqs(db: str) -> list[int]:
    """The events SQLite itself holds, read past every stockade layer."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return [row[0] for row in conn.execute("SELECT seq FROM events ORDER BY seq")]
    finally:
        conn.close()


def events(n: int, start: int = 0, **kw: Any) -> list[Event]:
    return [make_event(i, **kw) for i in range(start, start + n)]


def fill(store: JournaledStore, gate: threading.Event, indexed: int, held: int) -> list[StoredEvent]:
    """``indexed`` events in SQLite, then ``held`` more acknowledged but only in the journal."""
    stored = store.append(events(indexed)) if indexed else []
    list(store.query())  # waits for the indexer: SQLite has them all
    gate.clear()
    for i in range(held):
        stored += store.append([make_event(indexed + i)])
    return stored


def rewrite_journal(path: str, first_seq: int, prev: str, payloads: list[bytes]) -> None:
    """Replace the journal at ``path`` by one valid record: an edited journal
    whose checksums are right (a garbled one is merely cut short)."""
    journal = Journal.open(path, os.path.getsize(path))
    try:
        journal.reset()
        journal.append(journal.encode(first_seq, prev, payloads))
    finally:
        journal.close()


def digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _mount(*args: str) -> str | None:
    """Run mount; the reason it failed, or None."""
    if os.geteuid() != 0:
        return "mounting needs root"
    done = subprocess.run(["mount", *args], capture_output=True, text=True)
    return None if done.returncode == 0 else f"mount {' '.join(args)} failed: {done.stderr.strip()}"


# -- the journal file -----------------------------------------------------------

_BATCHES = [
    (1, GENESIS, (b'{"a":1}',)),
    (2, "ab" * 32, (b'{"b":2}', '{"c":"é"}'.encode())),
    (4, "cd" * 32, (b"{}",)),
]


def _write_batches(path: str) -> tuple[Journal, list[bytes]]:
    journal = Journal.open(path, 1 << 16)
    journal.reset()
    encoded = [journal.encode(first, prev, list(payloads)) for first, prev, payloads in _BATCHES]
    for record in encoded:
        journal.append(record)
    return journal, encoded


def test_records_read_back_as_written(tmp_path: Path) -> None:
    path = str(tmp_path / "j")
    journal, _ = _write_batches(path)
    try:
        expected = [JournalRecord(first, prev, payloads) for first, prev, payloads in _BATCHES]
        assert list(journal.records()) == expected
        assert read_records(path) == expected
        # Records whose events the caller already has are left out, not the rest.
        assert read_records(path, after_seq=3) == expected[2:]
        assert read_records(path, after_seq=2) == expected[1:]
    finally:
        journal.close()


@pytest.mark.parametrize("damage", ["garbled", "truncated"])
def test_a_torn_last_record_ends_reading_there(tmp_path: Path, damage: str) -> None:
    path = str(tmp_path / "j")
    journal, encoded = _write_batches(path)
    try:
        middle = len(encoded[0]) + len(encoded[1]) + len(encoded[2]) // 2
        if damage == "garbled":
            fd = os.open(path, os.O_WRONLY)
            try:
                os.pwrite(fd, b"\xff\x00\xff\x00", middle)
            finally:
                os.close(fd)
        else:
            os.truncate(path, middle)
        expected = [JournalRecord(first, prev, payloads) for first, prev, payloads in _BATCHES[:2]]
        assert list(journal.records()) == expected
        assert read_records(path) == expected
    finally:
        journal.close()


def test_a_record_of_an_older_epoch_after_the_current_ones_is_not_read(tmp_path: Path) -> None:
    path = str(tmp_path / "j")
    journal = Journal.open(path, 1 << 16)
    try:
        journal.reset()
        first = journal.encode(1, GENESIS, [b'{"n":1}'])
        second = journal.encode(2, "ab" * 32, [b'{"n":2}'])
        journal.append(first)
        journal.append(second)
        journal.reset()
        # The same first record again, in the new epoch: the old second one
        # now follows it, intact, with the seq that would come next.
        journal.append(journal.encode(1, GENESIS, [b'{"n":1}']))
        with open(path, "rb") as f:
            f.seek(len(first))
            assert f.read(len(second)) == second
        assert list(journal.records()) == [JournalRecord(1, GENESIS, (b'{"n":1}',))]
        assert read_records(path) == [JournalRecord(1, GENESIS, (b'{"n":1}',))]
    finally:
        journal.close()


def test_reset_makes_the_old_records_unreadable(tmp_path: Path) -> None:
    path = str(tmp_path / "j")
    journal, encoded = _write_batches(path)
    try:
        assert len(list(journal.records())) == 3
        journal.reset()
        assert list(journal.records()) == []
        assert read_records(path) == []
        # Unreadable, not erased: the second record's bytes are still there.
        with open(path, "rb") as f:
            f.seek(len(encoded[0]))
            assert f.read(len(encoded[1])) == encoded[1]
    finally:
        journal.close()


def test_a_second_open_while_one_is_open_names_another_process(tmp_path: Path) -> None:
    path = str(tmp_path / "j")
    journal = Journal.open(path, 4096)
    try:
        with pytest.raises(StoreError, match="another process writes this store"):
            Journal.open(path, 4096)
    finally:
        journal.close()
    Journal.open(path, 4096).close()  # the lock went with the first one


def test_a_reader_neither_locks_nor_writes_the_journal(tmp_path: Path) -> None:
    path = str(tmp_path / "j")
    journal, _ = _write_batches(path)
    try:
        before = digest(path)
        assert read_records(path) == list(journal.records())  # while the writer holds its lock
        assert digest(path) == before
    finally:
        journal.close()
    missing = str(tmp_path / "none")
    assert read_records(missing) == []
    assert not os.path.exists(missing)


def test_allocating_on_a_full_filesystem_says_it_is_full(tmp_path: Path) -> None:
    where = tmp_path / "small"
    where.mkdir()
    reason = _mount("-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(where))
    if reason:
        pytest.skip(f"this host cannot mount a small tmpfs for a full filesystem: {reason}")
    try:
        path = str(where / "events.db.journal")
        with pytest.raises(StoreError, match="filesystem is full") as info:
            Journal.open(path, 4 << 20)
        assert path in str(info.value)
        assert os.path.getsize(path) == 0  # the allocation was undone
        Journal.open(path, 256 << 10).close()  # what fits still opens
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


# -- the journaled store --------------------------------------------------------


def test_appends_are_in_the_journal_when_they_return_and_chain(db: str, gate: threading.Event) -> None:
    with journaled(db, gate) as store:
        gate.clear()
        stored = store.append(events(3)) + store.append(events(2, start=3))
        assert [s.seq for s in stored] == [1, 2, 3, 4, 5]
        prev = GENESIS
        for s in stored:
            assert (s.prev, s.hash) == (prev, chain_hash(prev, s.seq, s.event))
            prev = s.hash
        # Durable while SQLite has none of them: the journal holds them all.
        assert sqlite_seqs(db) == []
        in_journal = [e for r in read_records(db + SUFFIX) for e in r.events]
        assert in_journal == [s.raw.encode() for s in stored]
        gate.set()
        result = store.verify()
        assert (result.ok, result.checked, result.last_hash) == (True, 5, stored[-1].hash)
    assert sqlite_seqs(db) == [1, 2, 3, 4, 5]


def test_opening_copies_in_what_a_crash_left_in_the_journal(
    db: str, gate: threading.Event, tmp_path: Path
) -> None:
    with journaled(db, gate) as store:
        stored = fill(store, gate, indexed=4, held=6)
        copy = crash_copy(db, tmp_path / "crashed")
    assert sqlite_seqs(copy) == [1, 2, 3, 4]
    with journaled(copy, gate) as reopened:
        assert reopened.last_seq() == 10
        assert [s.raw for s in reopened.query()] == [s.raw for s in stored]
        result = reopened.verify()
        assert (result.ok, result.checked, result.last_hash) == (True, 10, stored[-1].hash)
        assert sqlite_seqs(copy) == list(range(1, 11))
        # And the chain goes on from there.
        assert reopened.append([make_event(10)])[0].prev == stored[-1].hash


@pytest.mark.parametrize("edit", ["another chain", "a gap"])
def test_a_journal_that_does_not_continue_the_store_refuses_to_open(
    db: str, gate: threading.Event, tmp_path: Path, edit: str
) -> None:
    with journaled(db, gate) as store:
        stored = fill(store, gate, indexed=4, held=6)
        copy = crash_copy(db, tmp_path / "crashed")
    payloads = [s.raw.encode() for s in stored]
    if edit == "another chain":
        rewrite_journal(copy + SUFFIX, 5, "f" * 64, payloads[4:])
    else:
        rewrite_journal(copy + SUFFIX, 7, stored[5].hash, payloads[6:])
    with pytest.raises(StoreError, match="does not continue the"):
        open_journaled_store(copy)
    assert sqlite_seqs(copy) == [1, 2, 3, 4]  # nothing copied in


def test_a_tiny_journal_wraps_and_loses_nothing(db: str) -> None:
    stored: list[StoredEvent] = []
    written = 0
    with open_journaled_store(db, journal_size=4096) as store, open_store(db, readonly=True) as reader:
        for i in range(120):
            batch = store.append(events(1 + i % 3, start=len(stored)))
            stored += batch
            written += len(store.journal.encode(1, GENESIS, [s.raw.encode() for s in batch]))
            # Read right after each append: at every point of a wrap the
            # reader sees every acknowledged event, once, in order.
            assert [s.seq for s in reader.query()] == list(range(1, len(stored) + 1))
            assert reader.last_seq() == len(stored)
        assert written > 10 * 4096  # it did wrap, many times
    assert sqlite_seqs(db) == list(range(1, len(stored) + 1))
    with open_store(db, readonly=True) as reader:
        assert [s.raw for s in reader.query()] == [s.raw for s in stored]
        result = reader.verify()
        assert (result.ok, result.checked, result.last_hash) == (True, len(stored), stored[-1].hash)


def test_readers_in_another_thread_miss_nothing_while_the_journal_wraps(db: str) -> None:
    acknowledged = 0
    done = threading.Event()
    first_read = threading.Event()
    problems: list[str] = []
    reads = 0

    def read() -> None:
        nonlocal reads
        with open_store(db, readonly=True) as reader:
            while True:
                finished = done.is_set()
                before = acknowledged
                seqs = [s.seq for s in reader.query()]
                if seqs != list(range(1, len(seqs) + 1)) or len(seqs) < before:
                    problems.append(f"read {len(seqs)} events after {before} were acknowledged: {seqs[:3]}…")
                result = reader.verify()
                if not result.ok or result.checked < before:
                    problems.append(f"verify after {before} acknowledged: {result}")
                reads += 1
                first_read.set()
                if finished or problems:
                    return

    with open_journaled_store(db, journal_size=4096) as store:
        store.append(events(1))
        acknowledged = 1
        thread = threading.Thread(target=read)
        thread.start()
        try:
            assert first_read.wait(_BOUND)
            for i in range(1, 300):
                store.append([make_event(i)])
                acknowledged = i + 1
        finally:
            done.set()
            thread.join(_BOUND)
    assert not thread.is_alive()
    assert problems == []
    assert reads >= 2


def test_a_record_bigger_than_the_whole_journal_is_stored_durably(
    db: str, gate: threading.Event, tmp_path: Path
) -> None:
    with journaled(db, gate, journal_size=4096) as store:
        small = store.append(events(2))
        big = store.append([make_event(2, detail={"blob": "x" * 10_000})])
        # Not in the journal (it cannot be), so SQLite has it, flushed, already.
        assert sqlite_seqs(db) == [1, 2, 3]
        assert all(r.first_seq + len(r.events) - 1 < 3 for r in read_records(db + SUFFIX))
        gate.clear()
        after = store.append([make_event(3)])
        copy = crash_copy(db, tmp_path / "crashed")
    assert sqlite_seqs(copy) == [1, 2, 3]
    with open_journaled_store(copy, journal_size=4096) as reopened:
        assert [s.raw for s in reopened.query()] == [s.raw for s in small + big + after]
        assert reopened.verify().ok


def test_an_indexer_failure_refuses_appends_until_its_cause_is_gone(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = threading.Event()
    broken.set()
    failed = threading.Event()
    failures: list[StoreError] = []
    insert = JournaledStore._insert

    def failing_insert(self: JournaledStore, rows: Any) -> None:
        if threading.current_thread().name == "stockade-indexer" and broken.is_set():
            raise StoreError(f"cannot write the event store {self.path}: its filesystem is full", path=db)
        insert(self, rows)

    def on_failure(exc: StoreError) -> None:
        failures.append(exc)
        failed.set()

    monkeypatch.setattr(JournaledStore, "_insert", failing_insert)
    with open_journaled_store(db, on_failure=on_failure) as store:
        first = store.append([make_event(0)])
        assert failed.wait(_BOUND)
        assert store.failure is failures[0]
        failed.clear()
        with pytest.raises(StoreError, match="filesystem is full"):
            store.append([make_event(1)])
        assert failed.wait(_BOUND)  # the refused append let the indexer try again first
        assert len(failures) == 2
        # The refused event was not written anywhere.
        assert [e for r in read_records(db + SUFFIX) for e in r.events] == [first[0].raw.encode()]
        broken.clear()
        third = store.append([make_event(2)])
        assert (third[0].seq, third[0].prev) == (2, first[0].hash)
        assert store.failure is None
        assert [s.raw for s in store.query()] == [first[0].raw, third[0].raw]
        assert store.verify().ok
    assert sqlite_seqs(db) == [1, 2]


def test_an_indexer_bug_is_a_store_failure_not_a_hang(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any exception in the indexer (not only StoreError) becomes the store's
    failure: appends and drains are refused with it instead of waiting for a
    thread that died."""
    broken = threading.Event()
    broken.set()
    failures: list[StoreError] = []
    insert = JournaledStore._insert

    def buggy_insert(self: JournaledStore, rows: Any) -> None:
        if threading.current_thread().name == "stockade-indexer" and broken.is_set():
            raise AssertionError("a bug in the indexer")
        insert(self, rows)

    monkeypatch.setattr(JournaledStore, "_insert", buggy_insert)
    with open_journaled_store(db, journal_size=4096, on_failure=failures.append) as store:
        store.append([make_event(0)])
        with pytest.raises(StoreError, match=r"the indexer failed .*a bug in the indexer"):
            for n in range(1, 200):  # the wrap drains: it must raise, not hang
                store.append([make_event(n)])
        assert failures and "a bug in the indexer" in str(failures[0])
        broken.clear()
        store.append([make_event(999)])
        assert store.verify().ok


# -- read-only readers ----------------------------------------------------------


def test_a_reader_sees_acknowledged_events_the_indexer_has_not_inserted(
    db: str, gate: threading.Event
) -> None:
    with journaled(db, gate) as store:
        stored = fill(store, gate, indexed=4, held=6)
        assert sqlite_seqs(db) == [1, 2, 3, 4]
        with open_store(db, readonly=True) as reader:
            assert [(s.seq, s.hash, s.prev, s.raw) for s in reader.query()] == [
                (s.seq, s.hash, s.prev, s.raw) for s in stored
            ]
            assert [s.event for s in reader.query(after_seq=4)] == [s.event for s in stored[4:]]
            assert reader.last_seq() == 10
            result = reader.verify()
            assert (result.ok, result.checked, result.last_hash) == (True, 10, stored[-1].hash)
            assert reader.stored_json(8) == stored[7].raw
            assert reader.stored_json(3) == stored[2].raw
            assert reader.stored_json(11) is None


_T = 1795959063.0


def _mixed(i: int) -> Event:
    # Times out of seq order, as kernel stamps can be.
    return make_event(
        i, run=f"r-{'ab'[i % 2]}", cell=f"c-{i % 3}", time=_T + (i * 7) % 10 + (0.5 if i % 4 == 0 else 0.0)
    )


@pytest.mark.parametrize(
    "filters",
    [
        {},
        {"run": "r-b"},
        {"cell": "c-2"},
        {"since": _T + 5.5},
        {"since": _T + 100.0},
        {"after_seq": 3},
        {"after_seq": 6},
        {"after_seq": 10},
        {"limit": 0},
        {"limit": 3},
        {"limit": 4},
        {"limit": 7},
        {"run": "r-a", "after_seq": 1, "limit": 3},
        {"since": _T + 3.0, "cell": "c-1"},
    ],
    ids=repr,
)
def test_query_filters_the_same_across_sqlite_and_the_journal(
    db: str, gate: threading.Event, filters: dict[str, Any]
) -> None:
    every = [_mixed(i) for i in range(10)]

    def keep(seq: int, event: Event) -> bool:
        return (
            seq > filters.get("after_seq", 0)
            and event.time >= filters.get("since", 0.0)
            and filters.get("run", event.run) == event.run
            and filters.get("cell", event.cell) == event.cell
        )

    expected = [seq for seq, event in enumerate(every, 1) if keep(seq, event)][: filters.get("limit")]
    with journaled(db, gate) as store:
        store.append(every[:5])
        list(store.query())
        gate.clear()
        for event in every[5:]:
            store.append([event])
        assert sqlite_seqs(db) == [1, 2, 3, 4, 5]
        with open_store(db, readonly=True) as reader:
            found = list(reader.query(**filters))
    assert [s.seq for s in found] == expected
    assert [s.event for s in found] == [every[seq - 1] for seq in expected]
    # The same as SQLite answers once it has them all.
    with open_store(db, readonly=True) as reader:
        assert [s.seq for s in reader.query(**filters)] == expected


def test_after_a_crash_a_reader_sees_the_journal_and_changes_nothing(
    db: str, gate: threading.Event, tmp_path: Path
) -> None:
    with journaled(db, gate) as store:
        stored = fill(store, gate, indexed=4, held=6)
        copy = crash_copy(db, tmp_path / "crashed")
    journal_before = digest(copy + SUFFIX)
    with open_store(copy, readonly=True) as reader:
        assert [s.raw for s in reader.query()] == [s.raw for s in stored]
        assert reader.last_seq() == 10
        result = reader.verify()
        assert (result.ok, result.checked, result.last_hash) == (True, 10, stored[-1].hash)
    assert digest(copy + SUFFIX) == journal_before
    assert sqlite_seqs(copy) == [1, 2, 3, 4]


def test_after_a_sigkill_a_reader_and_the_next_open_see_every_acknowledged_event(db: str) -> None:
    # A daemon stand-in whose indexer never inserts, killed once it has
    # acknowledged its events: they exist in the journal only.
    child = f"""
import sys, threading
from stockade.record._journaled import JournaledStore, open_journaled_store
from tests.record.test_chain import make_event
insert = JournaledStore._insert
def never(self, rows):
    if threading.current_thread().name == "stockade-indexer":
        threading.Event().wait()
    insert(self, rows)
JournaledStore._insert = never
store = open_journaled_store({db!r})
for i in range(7):
    print(store.append([make_event(i)])[0].hash, flush=True)
print("acknowledged", flush=True)
threading.Event().wait()
"""
    with subprocess.Popen(
        [sys.executable, "-c", child], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2]
    ) as proc:
        try:
            assert proc.stdout is not None
            hashes = [proc.stdout.readline().strip() for _ in range(7)]
            assert proc.stdout.readline().strip() == "acknowledged"
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(_BOUND)
    assert proc.returncode == -signal.SIGKILL
    assert sqlite_seqs(db) == []
    with open_store(db, readonly=True) as reader:
        assert [s.hash for s in reader.query()] == hashes
        assert reader.verify().last_hash == hashes[-1]
    with open_journaled_store(db) as reopened:
        assert [s.hash for s in reopened.query()] == hashes
    assert sqlite_seqs(db) == list(range(1, 8))


@pytest.mark.parametrize("journal", ["of the same epoch", "of an earlier epoch"])
def test_a_journal_sqlite_already_holds_adds_nothing(db: str, tmp_path: Path, journal: str) -> None:
    with open_journaled_store(db) as store:
        stored = store.append(events(3))
    old = tmp_path / "old.journal"
    shutil.copyfile(db + SUFFIX, old)
    with open_journaled_store(db) as store:
        stored += store.append(events(5, start=3))
    if journal == "of an earlier epoch":
        shutil.copyfile(old, db + SUFFIX)
    assert read_records(db + SUFFIX) != []  # there is something to (not) add
    with open_store(db, readonly=True) as reader:
        assert [s.raw for s in reader.query()] == [s.raw for s in stored]
        assert reader.last_seq() == 8
        assert reader.verify().checked == 8


def test_a_journal_of_another_chain_is_not_served_and_verify_reports_it(
    db: str, gate: threading.Event, tmp_path: Path
) -> None:
    with journaled(db, gate) as store:
        stored = fill(store, gate, indexed=4, held=6)
        copy = crash_copy(db, tmp_path / "crashed")
    rewrite_journal(copy + SUFFIX, 5, "f" * 64, [s.raw.encode() for s in stored[4:]])
    with open_store(copy, readonly=True) as reader:
        assert [s.seq for s in reader.query()] == [1, 2, 3, 4]
        assert reader.last_seq() == 4
        result = reader.verify()
        assert (result.ok, result.checked, result.first_bad_seq) == (False, 4, 5)
        assert "does not follow" in result.reason
        assert copy + SUFFIX in result.reason
        assert reader.stored_json(5) == stored[4].raw  # to show what is wrong


def test_a_journal_that_resumes_after_a_gap_is_an_error_to_read_and_a_break_to_verify(
    db: str, gate: threading.Event, tmp_path: Path
) -> None:
    with journaled(db, gate) as store:
        stored = fill(store, gate, indexed=4, held=6)
        copy = crash_copy(db, tmp_path / "crashed")
    rewrite_journal(copy + SUFFIX, 7, stored[5].hash, [s.raw.encode() for s in stored[6:]])
    with open_store(copy, readonly=True) as reader:
        seen: list[int] = []
        with pytest.raises(StoreError, match="resumes at event 7 but the store ends at event 4"):
            for s in reader.query():
                seen.append(s.seq)
        assert seen == [1, 2, 3, 4]  # each once, though it looked again
        # A query that SQLite's rows answer whole does not need the journal.
        assert [s.seq for s in reader.query(limit=4)] == [1, 2, 3, 4]
        with pytest.raises(StoreError, match="events 5 to 6 are in neither"):
            reader.last_seq()
        result = reader.verify()
        assert (result.ok, result.checked, result.first_bad_seq) == (False, 4, 5)
        assert "events 5 to 6 are missing" in result.reason


def test_a_writable_store_does_not_read_the_journal(db: str, gate: threading.Event, tmp_path: Path) -> None:
    with journaled(db, gate) as store:
        fill(store, gate, indexed=4, held=6)
        copy = crash_copy(db, tmp_path / "crashed")
    with open_store(copy) as writable, open_store(copy, readonly=True) as reader:
        assert (writable.last_seq(), reader.last_seq()) == (4, 10)
        assert [s.seq for s in writable.query()] == [1, 2, 3, 4]
        assert writable.verify().checked == 4
        assert writable.stored_json(5) is None


def _outcome(reader: SqliteStore, read: str) -> list[int] | int | VerifyResult:
    if read == "query":
        return [s.seq for s in reader.query()]
    return reader.last_seq() if read == "last_seq" else reader.verify()


def _sees_at_least(outcome: list[int] | int | VerifyResult, acknowledged: int) -> None:
    if isinstance(outcome, list):
        assert outcome == list(range(1, len(outcome) + 1))
        assert len(outcome) >= acknowledged
    elif isinstance(outcome, int):
        assert outcome >= acknowledged
    else:
        assert outcome.ok
        assert outcome.checked >= acknowledged


@pytest.mark.parametrize("read", ["query", "last_seq", "verify"])
def test_a_wrap_just_after_the_reader_read_the_journal_loses_nothing(
    db: str, gate: threading.Event, monkeypatch: pytest.MonkeyPatch, read: str
) -> None:
    """The daemon indexes everything, resets the journal and writes a new
    epoch after the reader read the journal and before its SQLite snapshot."""
    with journaled(db, gate, journal_size=4096) as store:
        fill(store, gate, indexed=3, held=3)
        real = _journal_tail.read_records
        wrapped: list[bool] = []

        def then_the_daemon_wraps(path: str, *, after_seq: int = 0) -> list[JournalRecord]:
            records = real(path, after_seq=after_seq)
            if not wrapped:
                gate.set()
                for i in range(12):  # more than 4096 bytes: a wrap, which drains first
                    store.append([make_event(100 + i)])
                wrapped.append(real(path)[0].first_seq > 6)
            return records

        monkeypatch.setattr(_journal_tail, "read_records", then_the_daemon_wraps)
        with open_store(db, readonly=True) as reader:
            outcome = _outcome(reader, read)
    assert wrapped == [True]
    _sees_at_least(outcome, 6)


@pytest.mark.parametrize("read", ["query", "last_seq", "verify"])
def test_a_daemon_restart_just_before_the_reader_reads_the_journal_loses_nothing(
    db: str, gate: threading.Event, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read: str
) -> None:
    """After a crash, a new daemon copies the journal into SQLite and resets
    it (an empty journal) just as the reader comes to read it: a reader that
    took its SQLite snapshot first would miss the crashed daemon's events."""
    with journaled(db, gate) as store:
        fill(store, gate, indexed=4, held=6)
        copy = crash_copy(db, tmp_path / "crashed")
    real = _journal_tail.read_records
    restarted: list[list[JournalRecord]] = []

    def after_a_daemon_restart(path: str, *, after_seq: int = 0) -> list[JournalRecord]:
        if not restarted:
            open_journaled_store(copy).close()
            restarted.append(real(path))
        return real(path, after_seq=after_seq)

    monkeypatch.setattr(_journal_tail, "read_records", after_a_daemon_restart)
    with open_store(copy, readonly=True) as reader:
        outcome = _outcome(reader, read)
    assert restarted == [[]]  # the reader found an empty journal
    _sees_at_least(outcome, 10)


def test_an_altered_row_in_sqlite_is_reported_there_though_a_journal_follows(
    db: str, gate: threading.Event
) -> None:
    with journaled(db, gate) as store:
        fill(store, gate, indexed=4, held=6)
        conn = sqlite3.connect(db, isolation_level=None)
        try:
            changed = conn.execute(
                """UPDATE events SET json = replace(json, '"ino":2', '"ino":22') WHERE seq = 3"""
            ).rowcount
        finally:
            conn.close()
        assert changed == 1
        with open_store(db, readonly=True) as reader:
            result = reader.verify()
            assert (result.ok, result.checked, result.first_bad_seq) == (False, 2, 3)
            assert "journal" not in result.reason
            assert reader.last_seq() == 10  # the journal still continues SQLite's last hash
