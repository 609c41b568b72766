"""The SQLite event store, on real files under tmp_path.

Tampering is done the way an intruder would: with sqlite3 on the file. A full
disk is a real one (a 256 KiB tmpfs), a file that stops accepting writes is an
immutable WAL (chattr +i), a read-only store is a read-only bind mount.
"""

from __future__ import annotations

import itertools
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stockade.errors import StoreError
from stockade.record import GENESIS, Event, EventStore, SqliteStore, canonical_json, chain_hash, open_store
from stockade.record._store import APPLICATION_ID
from tests.record.test_chain import event_strategy, make_event

# -- helpers ------------------------------------------------------------------


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "events.db")


@pytest.fixture
def store(db: str) -> Iterator[SqliteStore]:
    with open_store(db) as s:
        yield s


def _fill(store: SqliteStore, n: int, **kw: object) -> None:
    store.append([make_event(i, **kw) for i in range(n)])


def _sql(db: str, statement: str, params: tuple[object, ...] = ()) -> None:
    """Change the file behind the store's back, as an intruder would."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute(statement, params)
    finally:
        conn.close()


def _mount(*args: str) -> str | None:
    """Run mount; the reason it failed, or None."""
    if os.geteuid() != 0:
        return "mounting needs root"
    done = subprocess.run(["mount", *args], capture_output=True, text=True)
    return None if done.returncode == 0 else f"mount {' '.join(args)} failed: {done.stderr.strip()}"


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], check=True)


# -- the file -----------------------------------------------------------------


def test_the_file_is_0600_in_wal_mode_with_full_sync(store: SqliteStore, db: str) -> None:
    _fill(store, 1)
    for name in (db, db + "-wal", db + "-shm"):
        assert stat.S_IMODE(os.stat(name).st_mode) == 0o600, name
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    finally:
        conn.close()
    assert store._conn is not None
    assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_the_file_is_0600_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        with open_store(str(tmp_path / "e.db")):
            pass
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "e.db").st_mode) == 0o600


def test_a_sqlite_store_is_an_event_store(store: SqliteStore) -> None:
    assert isinstance(store, EventStore)


def test_each_row_holds_the_columns_the_json_and_the_chain(store: SqliteStore, db: str) -> None:
    event = make_event(1, detail={"path": "/tmp/café"})
    [stored] = store.append([event])
    conn = sqlite3.connect(db)
    try:
        row = conn.execute(
            "SELECT seq, time, run, cell, kind, layer, outcome, json, prev, hash FROM events"
        ).fetchone()
    finally:
        conn.close()
    assert row == (
        1,
        event.time,
        event.run,
        event.cell,
        event.kind,
        event.layer,
        event.outcome,
        canonical_json(event.to_dict()),
        GENESIS,
        chain_hash(GENESIS, 1, event),
    )
    assert (stored.seq, stored.prev, stored.hash, stored.event) == (1, GENESIS, row[-1], event)


def test_indexes_serve_since_and_run_queries(store: SqliteStore, db: str) -> None:
    conn = sqlite3.connect(db)
    try:
        plans = {
            q: " ".join(str(r[-1]) for r in conn.execute("EXPLAIN QUERY PLAN " + q))
            for q in (
                "SELECT min(seq) FROM events INDEXED BY events_time WHERE time >= 1",
                "SELECT * FROM events WHERE seq > 0 AND run = 'r' ORDER BY seq",
                "SELECT * FROM events WHERE seq > 0 AND cell = 'c' ORDER BY seq",
            )
        }
    finally:
        conn.close()
    assert [("INDEX" in plan and "SCAN" not in plan) for plan in plans.values()] == [True] * 3, plans


# -- appending ----------------------------------------------------------------


def test_seq_counts_from_one_without_gaps_and_each_event_chains_to_the_last(store: SqliteStore) -> None:
    stored = store.append([make_event(0)]) + store.append([make_event(i) for i in range(1, 5)])
    stored += store.append([make_event(5)])
    assert [s.seq for s in stored] == [1, 2, 3, 4, 5, 6]
    assert stored[0].prev == GENESIS
    for before, after in itertools.pairwise(stored):
        assert after.prev == before.hash
    for s in stored:
        assert s.hash == chain_hash(s.prev, s.seq, s.event)
    assert store.last_seq() == 6


def test_an_empty_append_stores_nothing(store: SqliteStore) -> None:
    assert store.append([]) == []
    assert store.last_seq() == 0


def test_the_chain_continues_across_reopening(db: str) -> None:
    with open_store(db) as s:
        first = s.append([make_event(0), make_event(1)])
    with open_store(db) as s:
        [third] = s.append([make_event(2)])
        assert (third.seq, third.prev) == (3, first[-1].hash)
        assert s.verify().ok


def test_an_event_that_cannot_be_stored_stores_none_of_its_batch(store: SqliteStore) -> None:
    _fill(store, 2)
    bad = [
        make_event(9, detail={"s": {1, 2}}),
        make_event(9, time=float("nan")),
        make_event(9, time=float("inf")),
        make_event(9, cell=7),
        make_event(9, summary="\ud800"),
        make_event(9, detail={"ratio": float("nan")}),  # not JSON: no export reader would take it
        make_event(9, detail={"n": [float("-inf")]}),
    ]
    for event in bad:
        with pytest.raises(ValueError, match="cannot be stored"):
            store.append([make_event(3), event])
    assert store.last_seq() == 2
    assert store.verify().ok


def test_an_append_is_on_disk_when_it_returns(tmp_path: Path) -> None:
    """A process killed right after appends returned loses none of them."""
    db = tmp_path / "events.db"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys\n"
            "from stockade.record import open_store\n"
            "from tests.record.test_chain import make_event\n"
            "store = open_store(sys.argv[1])\n"
            "i = 0\n"
            "while True:\n"
            "    i += 1\n"
            "    [s] = store.append([make_event(i)])\n"
            "    print(s.seq, flush=True)\n",
            str(db),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    assert child.stdout is not None
    acknowledged = [int(child.stdout.readline()) for _ in range(200)]
    child.send_signal(signal.SIGKILL)
    child.wait()
    child.stdout.close()
    with open_store(str(db), readonly=True) as s:
        assert s.last_seq() >= acknowledged[-1] == 200
        result = s.verify()
    assert result.ok and result.checked >= 200


# -- reading ------------------------------------------------------------------


def test_query_filters_by_time_run_cell_seq_and_limit(store: SqliteStore) -> None:
    events = [
        make_event(0, time=100.0, run="r-a", cell="c-1"),
        make_event(1, time=200.0, run="r-b", cell="c-2"),
        make_event(2, time=300.0, run="r-a", cell="c-2"),
        make_event(3, time=150.0, run="r-a", cell="c-1"),  # an older stamp stored later
        make_event(4, time=400.0, run="", cell="c-3"),
    ]
    store.append(events)

    def seqs(**kw: object) -> list[int]:
        return [s.seq for s in store.query(**kw)]  # type: ignore[arg-type]

    assert seqs() == [1, 2, 3, 4, 5]
    assert seqs(since=150.0) == [2, 3, 4, 5]
    assert seqs(since=250.0) == [3, 5]
    assert seqs(since=1000.0) == []
    assert seqs(run="r-a") == [1, 3, 4]
    assert seqs(run="") == [5]
    assert seqs(cell="c-2") == [2, 3]
    assert seqs(run="r-a", since=150.0) == [3, 4]
    assert seqs(after_seq=2) == [3, 4, 5]
    assert seqs(after_seq=1, limit=2) == [2, 3]
    assert seqs(run="r-a", after_seq=1, limit=1) == [3]
    assert seqs(limit=0) == []
    assert [s.event for s in store.query()] == events


def test_query_rejects_bad_arguments(store: SqliteStore) -> None:
    with pytest.raises(ValueError, match="finite"):
        store.query(since=float("nan"))
    with pytest.raises(ValueError, match="limit"):
        store.query(limit=-1)


def test_a_query_reads_one_snapshot_while_the_writer_appends(store: SqliteStore) -> None:
    _fill(store, 3000)
    rows = store.query()
    first = next(rows)
    _fill(store, 10)  # after the query began: not in it
    assert [first.seq, *(s.seq for s in rows)] == list(range(1, 3001))
    assert store.last_seq() == 3010


def test_a_stored_event_that_is_not_an_event_is_named_when_read(store: SqliteStore, db: str) -> None:
    """Events are parsed when first read (an export of JSON lines copies the
    stored text); one that is not an event says which when it is."""
    _fill(store, 3)
    _sql(db, "UPDATE events SET json = '{not json' WHERE seq = 2")
    rows = list(store.query())
    assert [r.raw for r in rows][1] == "{not json"
    assert rows[0].event == make_event(0)
    with pytest.raises(ValueError, match="stored event 2 is not a valid event"):
        _ = rows[1].event
    # A line break would split a JSON line in two: refused at once.
    _sql(db, "UPDATE events SET json = ? WHERE seq = 2", ('{"kind":\n"x"}',))
    with pytest.raises(StoreError, match=r"event 2 .* is not a valid event .*; run `stockade verify"):
        list(store.query())


def test_a_stored_event_reads_back_equal(store: SqliteStore) -> None:
    [appended] = store.append([make_event(0, detail={"n": [1, 2.5, None, "é"]})])
    [read] = store.query()
    assert read == appended and read.event == appended.event and read.raw == appended.raw
    assert "event=Event(" in repr(read)


def test_threads_append_and_read_at_once(store: SqliteStore) -> None:
    """Four appending threads and a reading one: every snapshot a reader sees
    is a gapless prefix, and at the end every event is there once."""
    writers, per_writer = 4, 100
    start = threading.Barrier(writers + 1)
    stop = threading.Event()
    seen: list[list[int]] = []
    errors: list[BaseException] = []

    def write(w: int) -> None:
        try:
            start.wait()
            for i in range(per_writer):
                store.append([make_event(i, cell=f"c-{w}", detail={"i": i})])
        except BaseException as exc:
            errors.append(exc)

    def read() -> None:
        try:
            start.wait()
            while not stop.is_set():
                seen.append([s.seq for s in store.query()])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    reader = threading.Thread(target=read)
    for t in [*threads, reader]:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    reader.join()
    assert errors == []
    assert seen and all(s == list(range(1, len(s) + 1)) for s in seen)
    assert store.last_seq() == writers * per_writer
    for w in range(writers):
        assert [s.event.detail["i"] for s in store.query(cell=f"c-{w}")] == list(range(per_writer))
    assert store.verify().ok


def test_a_closed_store_refuses_everything(db: str) -> None:
    s = open_store(db)
    s.close()
    s.close()
    for call in (lambda: s.append([make_event(0)]), s.last_seq, s.verify, lambda: s.query()):
        with pytest.raises(StoreError, match="is closed"):
            call()


def test_a_read_only_store_reads_and_refuses_to_append(db: str) -> None:
    with open_store(db) as writer:
        _fill(writer, 3)
        with open_store(db, readonly=True) as reader:
            assert reader.last_seq() == 3
            _fill(writer, 1)
            assert reader.last_seq() == 4
            assert [s.seq for s in reader.query()] == [1, 2, 3, 4]
            assert reader.verify().checked == 4
            with pytest.raises(StoreError, match="read-only"):
                reader.append([make_event(0)])


def test_opening_what_is_not_a_store_fails_clearly(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="there is no event store at"):
        open_store(str(tmp_path / "none.db"), readonly=True)
    with pytest.raises(StoreError, match="does not exist; create it"):
        open_store(str(tmp_path / "no" / "such" / "dir" / "events.db"))
    other = tmp_path / "other.db"
    _sql(str(other), "CREATE TABLE notes (text)")
    with pytest.raises(StoreError, match="is not a stockade event store"):
        open_store(str(other))
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(os.urandom(8192))
    with pytest.raises(StoreError, match="is corrupt"):
        open_store(str(garbage))
    newer = tmp_path / "newer.db"
    open_store(str(newer)).close()
    _sql(str(newer), "PRAGMA user_version = 99")
    with pytest.raises(StoreError, match="newer stockade"):
        open_store(str(newer))
    assert issubclass(StoreError, Exception) and StoreError("x").exit_code == 5


# -- tampering ------------------------------------------------------------------


@pytest.fixture
def ten(db: str) -> str:
    """A closed store of 10 events: the intruder's target."""
    with open_store(db) as s:
        _fill(s, 10)
    return db


def _verify(db: str) -> tuple[bool, int, int | None, str]:
    with open_store(db, readonly=True) as s:
        r = s.verify()
    return r.ok, r.checked, r.first_bad_seq, r.reason


def test_an_intact_store_verifies(ten: str) -> None:
    assert _verify(ten) == (True, 10, None, "all 10 events are intact and in order")


def test_an_edited_event_is_named(ten: str) -> None:
    _sql(ten, "UPDATE events SET json = replace(json, '/etc/f4', '/etc/f5') WHERE seq = 5")
    assert _verify(ten) == (False, 4, 5, "event 5 was altered: its stored hash does not match its content")


def test_a_changed_hash_is_named(ten: str) -> None:
    _sql(ten, "UPDATE events SET hash = ? WHERE seq = 7", ("f" * 64,))
    assert _verify(ten)[:3] == (False, 6, 7)


def test_a_deleted_event_is_named(ten: str) -> None:
    _sql(ten, "DELETE FROM events WHERE seq = 4")
    assert _verify(ten) == (False, 3, 4, "event 4 is missing (the next stored event is 5)")


def test_a_deleted_first_event_is_named(ten: str) -> None:
    _sql(ten, "DELETE FROM events WHERE seq = 1")
    assert _verify(ten)[:3] == (False, 0, 1)


def test_two_swapped_events_are_named_by_the_first(ten: str) -> None:
    _sql(ten, "UPDATE events SET seq = -1 WHERE seq = 3")
    _sql(ten, "UPDATE events SET seq = 3 WHERE seq = 6")
    _sql(ten, "UPDATE events SET seq = 6 WHERE seq = -1")
    ok, checked, first, reason = _verify(ten)
    assert (ok, checked, first) == (False, 2, 3)
    assert "event 3 does not follow the event before it" in reason


def test_a_swap_of_contents_with_relinked_prevs_is_still_named(ten: str) -> None:
    """Swap the JSON of two events and patch the prev links: the hashes still break."""
    conn = sqlite3.connect(ten, isolation_level=None)
    try:
        (j3,), (j6,) = conn.execute("SELECT json FROM events WHERE seq IN (3, 6) ORDER BY seq").fetchall()
        conn.execute("UPDATE events SET json = ? WHERE seq = 3", (j6,))
        conn.execute("UPDATE events SET json = ? WHERE seq = 6", (j3,))
    finally:
        conn.close()
    assert _verify(ten)[:3] == (False, 2, 3)


def test_a_changed_indexed_column_is_named(ten: str) -> None:
    """Changing only the run column would hide an event from `export --run`."""
    _sql(ten, "UPDATE events SET run = 'r-elsewhere' WHERE seq = 8")
    assert _verify(ten) == (
        False,
        7,
        8,
        "event 8 was altered: its run column does not match its stored event",
    )
    _sql(ten, "UPDATE events SET run = ? WHERE seq = 8", (make_event(0).run,))
    _sql(ten, "UPDATE events SET time = 1.0 WHERE seq = 9")
    assert _verify(ten)[2:] == (9, "event 9 was altered: its time column does not match its stored event")


def test_a_row_that_is_not_utf8_is_named_not_fatal(ten: str) -> None:
    _sql(ten, "UPDATE events SET json = ? WHERE seq = 2", (b"\xff\xfe{",))
    assert _verify(ten)[:3] == (False, 1, 2)


# -- when the store cannot write ------------------------------------------------


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "small"
    where.mkdir()
    reason = _mount("-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(where))
    if reason is not None:
        pytest.skip(f"this host cannot mount a small tmpfs for a full disk: {reason}")
    try:
        yield where
    finally:
        _umount(where)


def test_a_full_disk_raises_store_error_and_writes_nothing_half(small_tmpfs: Path) -> None:
    db = str(small_tmpfs / "events.db")
    filler = small_tmpfs / "filler"
    filler.write_bytes(b"\0" * 32768)
    with open_store(db) as s:
        batches = 0
        with pytest.raises(StoreError) as caught:
            while True:
                before = s.last_seq()
                s.append([make_event(batches * 50 + i, detail={"pad": "x" * 200}) for i in range(50)])
                batches += 1
                assert batches < 1000, "the 256k tmpfs never filled up"
        message = str(caught.value)
        assert message == (f"cannot write the event store {db}: its filesystem is full; free space on it")
        assert caught.value.path == db and caught.value.exit_code == 5
        assert isinstance(caught.value.__cause__, sqlite3.Error)
        # All or nothing: the failed batch left no trace, the chain holds.
        assert s.last_seq() == before == batches * 50
        assert s.verify().ok and s.verify().checked == before
        # Space again: the chain continues where it stopped.
        filler.unlink()
        [after] = s.append([make_event(0)])
        assert after.seq == before + 1
        result = s.verify()
    assert result.ok and result.checked == before + 1


def test_a_full_disk_at_creation_raises_store_error(small_tmpfs: Path) -> None:
    fd = os.open(small_tmpfs / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass  # full
    finally:
        os.close(fd)
    with pytest.raises(StoreError, match=r"full|cannot"):
        open_store(str(small_tmpfs / "events.db"))


def test_a_file_that_stops_taking_writes_raises_store_error(store: SqliteStore, db: str) -> None:
    _fill(store, 3)
    if subprocess.run(["chattr", "+i", db + "-wal"], capture_output=True).returncode != 0:
        pytest.skip("this filesystem has no immutable flag (chattr +i)")
    try:
        with pytest.raises(StoreError, match=r"the system refused the write .*read-only"):
            _fill(store, 2)
    finally:
        subprocess.run(["chattr", "-i", db + "-wal"], check=True)
    assert store.last_seq() == 3
    _fill(store, 1)
    assert store.verify().checked == 4


@pytest.fixture
def read_only_view(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(a directory, the same directory through a read-only bind mount)."""
    source, view = tmp_path / "rw", tmp_path / "ro"
    source.mkdir()
    view.mkdir()
    reason = _mount("--bind", str(source), str(view))
    if reason is not None:
        pytest.skip(f"this host cannot bind-mount: {reason}")
    try:
        reason = _mount("-o", "remount,ro,bind", str(view))
        if reason is not None:
            pytest.skip(f"this host cannot make a bind mount read-only: {reason}")
        yield source, view
    finally:
        _umount(view)


def test_a_read_only_store_cannot_be_opened_for_writing(read_only_view: tuple[Path, Path]) -> None:
    source, view = read_only_view
    with open_store(str(source / "events.db")) as s:
        _fill(s, 2)
    with pytest.raises(StoreError, match=r"read-only.*; make .* writable by the daemon"):
        open_store(str(view / "events.db"))
    with pytest.raises(StoreError, match=r"read-only.*; make .* writable by the daemon"):
        open_store(str(view / "new.db"))
    # Reading it is fine.
    with open_store(str(view / "events.db"), readonly=True) as s:
        assert s.verify().checked == 2


def test_a_corrupt_file_raises_store_error_on_append_and_verify(db: str) -> None:
    with open_store(db) as s:
        s.append([make_event(i, detail={"pad": "x" * 3000}) for i in range(300)])
    data = bytearray(Path(db).read_bytes())
    data[4096:] = b"\x5a" * (len(data) - 4096)  # every page but the header
    Path(db).write_bytes(bytes(data))
    with open_store(db) as s:
        with pytest.raises(StoreError, match=r"is corrupt .*move it aside"):
            s.append([make_event(0)])
        with pytest.raises(StoreError, match="is corrupt"):
            s.verify()


# -- properties -----------------------------------------------------------------


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(event_strategy, max_size=5), min_size=1, max_size=6))
def test_any_sequence_of_appends_verifies_and_reads_back(tmp_path: Path, batches: list[list[Event]]) -> None:
    with tempfile.TemporaryDirectory(dir=tmp_path) as where, open_store(os.path.join(where, "e.db")) as s:
        stored = [x for batch in batches for x in s.append(batch)]
        events = [e for batch in batches for e in batch]
        assert [x.seq for x in stored] == list(range(1, len(events) + 1))
        result = s.verify()
        assert (result.ok, result.checked) == (True, len(events))
        back = list(s.query())
        assert [x.event.to_dict() for x in back] == [e.to_dict() for e in events]
        assert [(x.seq, x.hash, x.prev) for x in back] == [(x.seq, x.hash, x.prev) for x in stored]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(event_strategy, min_size=1, max_size=6), st.data())
def test_any_single_byte_change_to_a_stored_event_is_detected(
    tmp_path: Path, events: list[Event], data: st.DataObject
) -> None:
    with tempfile.TemporaryDirectory(dir=tmp_path) as where:
        db = os.path.join(where, "e.db")
        with open_store(db) as s:
            stored = s.append(events)
        victim = data.draw(st.sampled_from(stored))
        payload = bytearray(victim.raw.encode())
        at = data.draw(st.integers(0, len(payload) - 1))
        payload[at] = data.draw(st.integers(0, 255).filter(lambda b: b != payload[at]))
        _sql(db, "UPDATE events SET json = ? WHERE seq = ?", (bytes(payload), victim.seq))
        ok, checked, first, _ = _verify(db)
        assert (ok, checked, first) == (False, victim.seq - 1, victim.seq)


def test_a_changed_column_is_found_even_after_an_escaped_nul(ten: str) -> None:
    """SQLite's JSON functions cut strings at a NUL; verify does not rely on them there."""
    with open_store(ten) as s:
        s.append([make_event(10, run="r-a\x00b")])
    assert _verify(ten)[0]
    _sql(ten, "UPDATE events SET run = 'r-a' WHERE seq = 11")
    assert _verify(ten)[2:] == (11, "event 11 was altered: its run column does not match its stored event")


def test_two_writers_on_one_file_keep_one_chain(db: str) -> None:
    """A second daemon on the same state directory must not fork the chain:
    the head is read inside each write transaction."""
    with open_store(db) as a, open_store(db) as b:
        for i in range(10):
            (a if i % 2 else b).append([make_event(i), make_event(i + 100)])
        assert a.last_seq() == b.last_seq() == 20
        result = a.verify()
    assert (result.ok, result.checked) == (True, 20)


def test_importing_the_record_does_not_import_the_store() -> None:
    """`stockade exec` imports the event model; sqlite3 and the chain are not on its path."""
    code = (
        "import sys, stockade.record\n"
        "print(sorted(m for m in ('sqlite3', 'stockade.record._store', 'stockade.record._chain',"
        " 'stockade.record._export') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
