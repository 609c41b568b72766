"""The event store: every event of every layer, in one SQLite file, hash-chained.

``EventStore`` is the interface (another store can follow it); ``SqliteStore``
is the one stockade ships, opened with ``open_store``. The file is in WAL mode
with ``synchronous=FULL``: ``append`` returns only once its events are on the
disk, one transaction per call, and readers (``query``, ``verify``, other
processes such as ``stockade export``) read a consistent snapshot on their own
connections while the daemon writes. docs/RECORD.md describes the file.

The daemon writes through ``_journaled.JournaledStore`` instead: an event is
acknowledged once it is in the journal ``<path>.journal`` and reaches SQLite
a moment later (after a crash, at the daemon's next start). So a read-only
store reads the journal too and serves the events it holds beyond SQLite's
last one after SQLite's rows; a writable one never does. Those reads live in
``_journal_tail`` (``rows_and_tail``, ``last_seq_with_tail``,
``verify_with_tail``), which ``SqliteStore`` calls with its connection and its
own readers of SQLite's rows (``_select``, ``_walk``).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import math
import os
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol, runtime_checkable
from urllib.parse import quote

from stockade.errors import StoreError
from stockade.record._chain import (
    GENESIS,
    ChainVerifier,
    StoredEvent,
    VerifyResult,
    canonical_json,
    chain_rows,
)
from stockade.record._event import Event
from stockade.record._journal_tail import (
    journal_records,
    last_seq_with_tail,
    rows_and_tail,
    sqlite_head,
    tail_after,
    verify_with_tail,
)

SCHEMA_VERSION = 1
APPLICATION_ID = 0x53544B44
"""``PRAGMA application_id`` of a stockade event store ("STKD"), so that no
other program's SQLite file is mistaken for one (``file`` shows it too)."""

_SCHEMA = """
CREATE TABLE events (
    seq     INTEGER PRIMARY KEY,   -- 1, 2, 3 ... no gaps
    time    REAL NOT NULL,         -- copies of the event's fields, for the indexes
    run     TEXT NOT NULL,
    cell    TEXT NOT NULL,
    kind    TEXT NOT NULL,
    layer   TEXT NOT NULL,
    outcome TEXT NOT NULL,
    json    TEXT NOT NULL,         -- canonical JSON of Event.to_dict(), as hashed
    prev    TEXT NOT NULL,         -- hash of event seq - 1
    hash    TEXT NOT NULL
);
CREATE INDEX events_time ON events (time);
CREATE INDEX events_run ON events (run, seq);
CREATE INDEX events_cell ON events (cell, seq);
"""

_INSERT_INTO = "INSERT INTO events (seq, time, run, cell, kind, layer, outcome, json, prev, hash) VALUES "
_INSERT_VALUES = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_INSERT_CHUNK = 64
"""Rows per INSERT statement in ``insert_rows``: 640 parameters, under the 999
of older SQLite builds."""
_COLUMNS = ("run", "cell", "kind", "layer", "outcome")
_VERIFY_SELECT = (
    "SELECT seq, prev, hash, CAST(json AS BLOB), "
    # SQLite compares the indexed columns with the JSON (in C: four times
    # faster than json.loads); a row that fails is looked at again in Python.
    "CASE WHEN json_valid(json) AND instr(json, '\\u0000') = 0 THEN time = json_extract(json, '$.time') "
    + "".join(f"AND {c} IS json_extract(json, '$.{c}') " for c in _COLUMNS)
    + "ELSE 0 END, time, run, cell, kind, layer, outcome FROM events "
)
_VERIFY = _VERIFY_SELECT + "ORDER BY seq"
_VERIFY_AFTER = _VERIFY_SELECT + "WHERE seq > ? ORDER BY seq"
"""The rows a read-only store has not walked yet when it looks again (see _journal_tail)."""
_BUSY_TIMEOUT = 10.0
"""Seconds a connection waits for another's lock (a second writer, or a
checkpoint) before giving up with SQLITE_BUSY."""
_FETCH = 1024


@runtime_checkable
class EventStore(Protocol):
    """Where events go: append-only, hash-chained, readable while written.

    An implementation must be safe to use from several threads: one appends,
    others query and verify.
    """

    def append(self, events: Sequence[Event]) -> list[StoredEvent]:
        """Store ``events`` in order, as one transaction, and return them numbered and chained.

        Durable when it returns: a crash of the process or the machine after
        that loses none of them. All or nothing: when it raises, none of
        ``events`` was stored and the chain is as it was.

        Raises:
            StoreError: the store cannot write (full disk, read-only file or
                filesystem, corrupt file, locked by another process, closed).
            ValueError: an event cannot be stored as it is (its detail is not
                plain JSON, its time is not a finite number); nothing was written.
        """
        ...

    def query(
        self,
        *,
        since: float | None = None,
        run: str | None = None,
        cell: str | None = None,
        after_seq: int = 0,
        limit: int | None = None,
    ) -> Iterator[StoredEvent]:
        """The stored events that match, in ``seq`` order, read lazily from one snapshot.

        ``since`` keeps events whose ``time`` is at or after it (seconds since
        the epoch); ``run`` and ``cell`` keep one run's or cell's; ``after_seq``
        keeps those numbered above it (to resume); ``limit`` stops after that many.

        Raises:
            StoreError: the store cannot be read, or a stored event is not
                valid JSON (``verify`` says more).
            ValueError: a bad argument (a negative ``limit``, a non-finite ``since``).
        """
        ...

    def last_seq(self) -> int:
        """The number of the last stored event; 0 when the store is empty.

        Raises:
            StoreError: the store cannot be read.
        """
        ...

    def verify(self, expect: Mapping[int, str] | None = None) -> VerifyResult:
        """Walk every stored event in order and check the chain, in constant memory;
        and that it holds each head of ``expect`` (seq to hash) at its place
        (``VerifyResult.anchor``).

        Raises:
            StoreError: the store cannot be read (a tampered event is a result, not an error).
        """
        ...

    def close(self) -> None:
        """Release the store; later calls raise ``StoreError``. Closing twice is allowed."""
        ...


class SqliteStore:
    """The SQLite implementation of ``EventStore``. Use ``open_store`` to get one."""

    def __init__(self, path: str, *, readonly: bool = False) -> None:
        self.path = os.path.abspath(path)
        self.readonly = readonly
        self._lock = threading.Lock()
        self._uri = f"file:{quote(self.path)}?mode=ro"
        self._conn: sqlite3.Connection | None = None
        try:
            self._conn = self._open_reader() if readonly else self._open_writer()
        except BaseException as exc:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            if isinstance(exc, sqlite3.Error):
                raise _store_error(exc, self.path, "open") from exc
            raise

    # -- opening -----------------------------------------------------------

    def _open_writer(self) -> sqlite3.Connection:
        _create_file(self.path)
        conn = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=_BUSY_TIMEOUT
        )
        self._conn = conn
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise StoreError(
                f"cannot use the event store {self.path}: SQLite refused WAL mode there (it stays "
                f"{mode!r}); put the state directory on a local filesystem",
                path=self.path,
            )
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA cache_size = -16384")
        # After a long reader held back checkpoints, shrink the WAL again.
        conn.execute("PRAGMA journal_size_limit = 67108864")
        conn.execute("BEGIN IMMEDIATE")
        try:
            if self._check_schema(conn, create=True):
                # Statement by statement: executescript would commit first.
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
            # Always write something: a file that opens but cannot be written
            # (a read-only mount) must fail here, before the daemon starts a run.
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise
        return conn

    def _open_reader(self) -> sqlite3.Connection:
        if not os.path.exists(self.path):
            raise StoreError(
                f"there is no event store at {self.path}; pass the right --db, or start the "
                "daemon once to create it",
                path=self.path,
            )
        conn = self._conn = self._connect_reader()
        try:
            self._check_schema(conn, create=False)
        except sqlite3.OperationalError:
            if os.path.exists(self.path + "-wal"):
                raise
            # A store on read-only media (a copy, a read-only mount) that no
            # writer has open: SQLite cannot create the -shm file it uses to
            # coordinate with writers, and there is none to coordinate with.
            conn.close()
            self._uri += "&immutable=1"
            conn = self._conn = self._connect_reader()
            self._check_schema(conn, create=False)
        return conn

    def _connect_reader(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self._uri, uri=True, isolation_level=None, check_same_thread=False, timeout=_BUSY_TIMEOUT
        )
        conn.execute("PRAGMA query_only = 1")
        return conn

    def _check_schema(self, conn: sqlite3.Connection, *, create: bool) -> bool:
        """True when the file is empty and the schema must be created."""
        app = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if app == 0 and not tables:
            if create:
                return True
            raise StoreError(
                f"{self.path} is an empty file, not a stockade event store; pass the right --db",
                path=self.path,
            )
        if app != APPLICATION_ID or "events" not in tables:
            raise StoreError(
                f"{self.path} is not a stockade event store (another program's SQLite file?); "
                "move it aside or choose another path",
                path=self.path,
            )
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"the event store {self.path} was written by a newer stockade (schema {version}, "
                f"this one knows {SCHEMA_VERSION}); upgrade stockade",
                path=self.path,
            )
        return False

    # -- writing -----------------------------------------------------------

    def append(self, events: Sequence[Event]) -> list[StoredEvent]:
        prepared = [_prepare(event) for event in events]
        if not prepared:
            return []
        with self._transaction() as conn:
            # Read the head inside the write transaction, not from memory:
            # correct even if another process appended (it should not).
            row = conn.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone()
            seq, prev = (int(row[0]), str(row[1])) if row else (0, GENESIS)
            rows, stored = chain_rows(prepared, seq, prev)
            insert_rows(conn, rows)
        return stored

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction under the writer's lock: committed when the
        block ends; rolled back when it raises (SQLite's errors as StoreError)."""
        with self._lock:
            conn = self._writer()
            try:
                conn.execute("BEGIN IMMEDIATE")
                yield conn
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                _rollback(conn)
                raise _store_error(exc, self.path, "write") from exc
            except BaseException:
                _rollback(conn)
                raise

    def _writer(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"the event store {self.path} is closed; open it again", path=self.path)
        if self.readonly:
            raise StoreError(
                f"the event store {self.path} was opened read-only; open it without readonly to append",
                path=self.path,
            )
        return self._conn

    # -- reading -----------------------------------------------------------

    def query(
        self,
        *,
        since: float | None = None,
        run: str | None = None,
        cell: str | None = None,
        after_seq: int = 0,
        limit: int | None = None,
    ) -> Iterator[StoredEvent]:
        if since is not None and not math.isfinite(since):
            raise ValueError(f"since must be a finite number of seconds, not {since!r}")
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be 0 or more, not {limit}")
        self._check_open()
        return self._rows(since, run, cell, int(after_seq), limit)

    def _rows(
        self, since: float | None, run: str | None, cell: str | None, after_seq: int, limit: int | None
    ) -> Iterator[StoredEvent]:
        # Its own connection: one SELECT is one snapshot, whatever the writer
        # does meanwhile, and the writer's lock is never held while we yield.
        try:
            conn = self._connect_reader()
        except sqlite3.Error as exc:
            raise _store_error(exc, self.path, "read") from exc
        try:
            if self.readonly:
                yield from rows_and_tail(
                    conn, self.path, self._select, _stored, since, run, cell, after_seq, limit
                )
            else:
                yield from self._select(conn, since, run, cell, after_seq, limit)
        except sqlite3.Error as exc:
            raise _store_error(exc, self.path, "read") from exc
        finally:
            conn.close()

    def _select(
        self,
        conn: sqlite3.Connection,
        since: float | None,
        run: str | None,
        cell: str | None,
        after_seq: int,
        limit: int | None,
    ) -> Iterator[StoredEvent]:
        clauses = ["seq > ?"]
        params: list[Any] = [after_seq]
        if since is not None:
            # Times are not in seq order (a kernel stamp can be older than
            # the event stored before it), so the time index cannot give
            # the rows in order; it gives the first seq that can match,
            # and the rows are then read in seq order from there.
            first = conn.execute(
                "SELECT min(seq) FROM events INDEXED BY events_time WHERE time >= ?", (since,)
            ).fetchone()[0]
            if first is None:
                return
            clauses += ["seq >= ?", "time >= ?"]
            params += [first, float(since)]
        if run is not None:
            clauses.append("run = ?")
            params.append(run)
        if cell is not None:
            clauses.append("cell = ?")
            params.append(cell)
        sql = f"SELECT seq, hash, prev, json FROM events WHERE {' AND '.join(clauses)} ORDER BY seq"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        cursor = conn.execute(sql, params)
        while rows := cursor.fetchmany(_FETCH):
            for seq, digest, prev, raw in rows:
                yield _stored(self.path, seq, digest, prev, raw)

    def last_seq(self) -> int:
        with self._lock:
            if self._conn is None:
                self._check_open()
            assert self._conn is not None
            try:
                if self.readonly:
                    return last_seq_with_tail(self._conn, self.path)
                row = self._conn.execute("SELECT max(seq) FROM events").fetchone()
            except sqlite3.Error as exc:
                raise _store_error(exc, self.path, "read") from exc
        return int(row[0] or 0)

    def verify(self, expect: Mapping[int, str] | None = None) -> VerifyResult:
        self._check_open()
        verifier = ChainVerifier(expect)
        try:
            conn = self._connect_reader()
        except sqlite3.Error as exc:
            raise _store_error(exc, self.path, "read") from exc
        try:
            # Bytes, not text: a tampered row need not even be valid UTF-8.
            conn.text_factory = bytes
            if self.readonly:
                return verify_with_tail(conn, self.path, verifier, self._walk)
            self._walk(conn, verifier, None)
        except sqlite3.Error as exc:
            raise _store_error(exc, self.path, "read") from exc
        finally:
            conn.close()
        return verifier.result()

    def _walk(self, conn: sqlite3.Connection, verifier: ChainVerifier, after_seq: int | None) -> bool:
        """Feed the rows to ``verifier`` (all of them, or those numbered above
        ``after_seq``); False at the first bad one."""
        # All of them means no WHERE: a row slipped in with a seq of 0 or
        # below must reach the verifier too.
        sql, params = (_VERIFY, ()) if after_seq is None else (_VERIFY_AFTER, (after_seq,))
        cursor = conn.execute(sql, params)
        try:
            while rows := cursor.fetchmany(_FETCH):
                for seq, prev, digest, payload, consistent, *columns in rows:
                    if verifier.check(seq, _text(prev), _text(digest), payload or b"") is not None:
                        return False
                    if not consistent:
                        # Python's reading is the reference: SQLite's JSON
                        # functions cut a string at an escaped NUL, so such
                        # rows always come here.
                        problem = _columns_problem(payload, columns)
                        if problem is not None:
                            verifier.fail(seq, f"event {seq} was altered: {problem}")
                            return False
        finally:
            cursor.close()  # a walk that stops early ends its read before the caller's COMMIT
        return True

    def stored_json(self, seq: int) -> str | None:
        """The stored JSON of event ``seq`` as it is in the file (even if it is
        not valid), or None when there is no such event: to show a bad event.
        A read-only store also looks in the daemon's journal beyond SQLite's
        last event, whether or not it continues the chain."""
        self._check_open()
        try:
            conn = self._connect_reader()
        except sqlite3.Error as exc:
            raise _store_error(exc, self.path, "read") from exc
        try:
            records = journal_records(conn, self.path) if self.readonly else []
            conn.execute("BEGIN")  # the row and the head from one snapshot
            row = conn.execute("SELECT CAST(json AS BLOB) FROM events WHERE seq = ?", (seq,)).fetchone()
            head, last_hash = sqlite_head(conn) if records else (0, GENESIS)
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise _store_error(exc, self.path, "read") from exc
        finally:
            conn.close()
        if row is not None:
            return bytes(row[0] or b"").decode("utf-8", "replace")
        for event in tail_after(records, head, last_hash).events:
            if event.seq == seq:
                return event.payload.decode("utf-8", "replace")
        return None

    # -- lifetime ----------------------------------------------------------

    def _check_open(self) -> None:
        if self._conn is None:
            raise StoreError(f"the event store {self.path} is closed; open it again", path=self.path)

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def __enter__(self) -> SqliteStore:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._conn is None else ("read-only" if self.readonly else "open")
        return f"<SqliteStore {self.path} {state}>"


def open_store(path: str, *, readonly: bool = False) -> SqliteStore:
    """Open the event store at ``path``, creating the file (mode 0600) and its
    schema when it does not exist (its directory must).

    ``readonly=True`` opens an existing store for reading only (``stockade
    verify`` and ``export``), safely while a daemon writes it; ``append`` then
    raises ``StoreError``. Its reads include the events the daemon acknowledged
    that are still only in its journal (``<path>.journal``, read, never
    written; see the module docstring), and raise ``StoreError`` when that
    journal cannot be read or resumes after a gap.

    Raises:
        StoreError: the file cannot be created or opened, cannot be written
            (unless ``readonly``), is corrupt, or is not a stockade event store.
    """
    return SqliteStore(path, readonly=readonly)


# -- helpers ---------------------------------------------------------------


def _create_file(path: str) -> None:
    """Create the store's file 0600 before SQLite does (SQLite would use 0644
    less the umask), and make its -wal and -shm files inherit that mode."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise _os_error(exc, path) from exc
    os.close(fd)


def insert_rows(conn: sqlite3.Connection, rows: Sequence[tuple[Any, ...]]) -> None:
    """Insert ``rows`` (``chain_rows``'s), in order, inside the caller's transaction.

    Many rows to a statement rather than ``executemany``'s one: Python's sqlite3
    releases the GIL for every step of a statement, and each time the daemon's
    loop thread had to win it back from the indexer (a few hundred hand-offs a
    batch, felt in every intent the loop served meanwhile).
    """
    for start in range(0, len(rows), _INSERT_CHUNK):
        chunk = rows[start : start + _INSERT_CHUNK]
        conn.execute(_insert_sql(len(chunk)), [value for row in chunk for value in row])


@functools.cache
def _insert_sql(count: int) -> str:
    return _INSERT_INTO + ",".join([_INSERT_VALUES] * count)


def _prepare(event: Event) -> tuple[Event, dict[str, Any], str, bytes]:
    d = event.to_dict()
    when = d["time"]
    if isinstance(when, bool) or not isinstance(when, int | float) or not math.isfinite(when):
        raise ValueError(
            f"event {event.kind!r} cannot be stored: its time {when!r} is not a finite number of "
            "seconds; stamp it with time.time()"
        )
    for key in _COLUMNS:
        if not isinstance(d[key], str):
            raise ValueError(f"event {event.kind!r} cannot be stored: its {key} {d[key]!r} is not a string")
    try:
        raw = canonical_json(d)
        payload = raw.encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"event {event.kind!r} cannot be stored: it is not plain JSON ({exc}); put only strings "
            "(valid Unicode), numbers, booleans, None, lists and dicts in its detail"
        ) from exc
    return event, d, raw, payload


def _stored(path: str, seq: int, digest: str, prev: str, raw: str | bytes) -> StoredEvent:
    # Parsed lazily (StoredEvent.from_stored); only what would break the framing
    # of an export is checked here. Anything else that is wrong with a stored
    # event is for ``verify`` to find.
    if isinstance(raw, bytes) or "\n" in raw:
        raise StoreError(
            f"event {seq} in the event store {path} is not a valid event (it is not canonical JSON text); "
            f"run `stockade verify --db {path}`",
            path=path,
        )
    return StoredEvent.from_stored(seq, digest, prev, raw)


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _columns_problem(payload: bytes | None, columns: list[Any]) -> str | None:
    """What differs between the indexed columns of a row and its (hashed) JSON.

    The columns are what ``query`` filters on: one changed alone would hide an
    event from ``export --run`` without touching the chain.
    """
    try:
        d = json.loads(payload or b"")
        when = d["time"]
    except (ValueError, KeyError, TypeError):
        return "its stored event is not a valid event"
    if not isinstance(columns[0], float) or not isinstance(when, int | float) or columns[0] != when:
        return "its time column does not match its stored event"
    for name, value in zip(_COLUMNS, columns[1:], strict=True):
        stored = d.get(name)
        if not isinstance(stored, str) or not isinstance(value, bytes) or value != stored.encode("utf-8"):
            return f"its {name} column does not match its stored event"
    return None


def _rollback(conn: sqlite3.Connection) -> None:
    try:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
    except sqlite3.Error:
        # SQLite rolls back by itself after some errors (a full disk, I/O);
        # the transaction is gone either way.
        pass


def _store_error(exc: sqlite3.Error, path: str, doing: str) -> StoreError:
    """One sentence for what SQLite reported: what, the path, the fix."""
    name = getattr(exc, "sqlite_errorname", "") or type(exc).__name__
    act = {"open": "cannot open", "write": "cannot write", "read": "cannot read"}[doing]
    directory = os.path.dirname(path)
    if name.startswith("SQLITE_FULL"):
        message = f"{act} the event store {path}: its filesystem is full; free space on it"
    elif name.startswith("SQLITE_READONLY"):
        message = (
            f"{act} the event store {path}: the file or its filesystem is read-only; make {directory} "
            "and the store's files writable by the daemon"
        )
    elif name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
        message = (
            f"the event store {path} is corrupt ({exc}); keep a copy for inspection and move it aside "
            "so that a new store is created"
        )
    elif name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        message = (
            f"{act} the event store {path}: another process holds its lock (a second daemon?); "
            "stop it or give each daemon its own state directory"
        )
    elif name.startswith("SQLITE_CANTOPEN"):
        message = f"{act} the event store {path}; check that {directory} exists and is writable"
    elif name.startswith("SQLITE_IOERR"):
        message = (
            f"{act} the event store {path}: the system refused the {doing} ({name}); check the disk, and "
            "whether the store's files or filesystem became read-only (immutable, remounted read-only)"
        )
    else:
        message = f"{act} the event store {path} ({name}: {exc}); run `stockade verify --db {path}`"
    return StoreError(message, path=path)


def _os_error(exc: OSError, path: str) -> StoreError:
    directory = os.path.dirname(path)
    if exc.errno == errno.ENOENT:
        message = f"cannot create the event store {path}: {directory} does not exist; create it (mode 0700)"
    elif exc.errno == errno.ENOSPC:
        message = f"cannot create the event store {path}: its filesystem is full; free space on it"
    elif exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        message = (
            f"cannot write the event store {path}: {str(exc.strerror).lower()}; make {directory} "
            "and the store's files writable by the daemon"
        )
    else:
        message = f"cannot open the event store {path}: {exc.strerror}; check {directory}"
    return StoreError(message, path=path)
