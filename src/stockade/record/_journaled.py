"""The daemon's store: durable in one journal write, indexed in SQLite behind.

``JournaledStore`` is a ``SqliteStore`` whose ``append`` is durable as soon as
its events are in the journal (``_journal``: one ``O_DSYNC`` write of a
preallocated file, the cheapest durable write the disk offers), instead of
after a durable SQLite commit (two or three flushes). A thread of its own
(the indexer) then inserts them into SQLite with ``synchronous=NORMAL``:
committed in order, flushed by SQLite at its checkpoints and by this module
before the journal is reused. Reads through this object first wait for the
indexer to have everything appended so far, so they never miss an event
``append`` returned; other processes reading the file (``stockade export``)
see it a moment later (the indexer's lag, well under a millisecond).

Opening copies into SQLite whatever the journal holds beyond SQLite's last
event (after a crash: events that were acknowledged but not yet indexed),
checking that each continues the chain, then flushes SQLite and resets the
journal. A store whose indexer fails (a full disk) refuses every later append
with that error until a retry finds SQLite writable again; nothing
acknowledged is lost meanwhile: it is in the journal, and the next open or
retry indexes it.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from stockade.errors import StoreError
from stockade.record._chain import GENESIS, StoredEvent, VerifyResult, chain_rows, hash_payload
from stockade.record._event import Event
from stockade.record._head import Head, head_path, write_head
from stockade.record._journal import DEFAULT_SIZE, SUFFIX, Journal
from stockade.record._store import SqliteStore, _prepare, insert_rows

Row = tuple[Any, ...]

INDEX_ROWS = 512
"""Rows the indexer lets pile up before it inserts them at once ..."""
INDEX_DELAY = 0.02
"""... or seconds it lets the first of them wait (readers never wait that long:
they make it go at once)."""
STORE_RESERVE = 64 * 1024 * 1024
"""Bytes kept for the daemon's own events (``room_for_agents``): below the
quota by this much, or with this little free on the store's filesystem, what
agents supply (``tool.record``) is refused while the daemon's events go on."""
_SIZE_EVERY = 1.0
_SIZE_BYTES = 1024 * 1024
"""``room_for_agents`` looks at the files again after this many seconds or
bytes appended, whichever comes first (a stat and a statvfs, not one per call)."""
HEAD_INTERVAL = 1.0
"""Seconds between two publications of the head (``_head``) while events come:
one small durable file write a second, against none per intent."""


class JournaledStore(SqliteStore):
    """See the module docstring. Open with ``open_journaled_store``."""

    def __init__(
        self,
        path: str,
        *,
        journal_size: int = DEFAULT_SIZE,
        on_failure: Callable[[StoreError], None] | None = None,
        publish_head: bool = True,
    ) -> None:
        super().__init__(path)
        self._on_failure = on_failure
        self.head_file = head_path(self.path) if publish_head else None
        """Where the head is published (``_head``), or None."""
        self._published = -1
        self._published_at = 0.0
        self.head_error: OSError | None = None
        """Why the head file could not be written last time, until it can."""
        self.quota: int | None = None
        """Bytes the store's files (SQLite's and its WAL) may hold before agents'
        data is refused (``room_for_agents``); None: only the disk's free space counts."""
        self.reserve = STORE_RESERVE
        self._sized_at = -_SIZE_EVERY
        self._size = 0
        self._free = 0
        self._appended_bytes = 0
        self._append_lock = threading.Lock()
        self._cond = threading.Condition()
        self._backlog: collections.deque[list[Row]] = collections.deque()
        self._failure: StoreError | None = None
        self._closing = False
        self._urgent = False
        self._backlog_rows = 0
        self._backlog_since = 0.0
        self._thread: threading.Thread | None = None
        try:
            self.journal = Journal.open(self.path + SUFFIX, journal_size)
            try:
                self._head_seq, self._head_hash = self._recover()
                self.journal.reset()
            except BaseException:
                self.journal.close()
                raise
        except BaseException:
            super().close()
            raise
        self._indexed = self._head_seq
        self._indexed_hash = self._head_hash
        self._publish_head()
        self._writer().execute("PRAGMA synchronous = NORMAL")
        self._thread = threading.Thread(target=self._index, name="stockade-indexer", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ writing

    def append(self, events: Sequence[Event]) -> list[StoredEvent]:
        prepared = [_prepare(event) for event in events]  # ValueError before anything is written
        if not prepared:
            return []
        with self._append_lock:
            self._check_open()
            if self._failure is not None:
                self._retry()
            first_prev = self._head_hash
            rows, stored = chain_rows(prepared, self._head_seq, first_prev)
            seq, prev = rows[-1][0], rows[-1][-1]
            payloads = [payload for _event, _d, _raw, payload in prepared]
            self._appended_bytes += sum(map(len, payloads))
            record = self.journal.encode(rows[0][0], first_prev, payloads)
            if not self.journal.fits(record):
                # Full: SQLite gets everything and is flushed; then the file is
                # free to be written from its start again.
                self._drain()
                self._flush_sqlite()
                self.journal.reset()
                record = self.journal.encode(rows[0][0], first_prev, payloads)
            if self.journal.fits(record):
                self.journal.append(record)
                with self._cond:
                    if not self._backlog:
                        self._backlog_since = time.monotonic()
                    self._backlog.append(rows)
                    self._backlog_rows += len(rows)
                    if self._backlog_rows >= INDEX_ROWS or len(self._backlog) == 1:
                        self._cond.notify_all()
            else:
                # Bigger than the whole journal: straight into SQLite, flushed.
                # In order: the failed ``fits`` above drained the indexer first.
                self._insert(rows)
                self._flush_sqlite()
                with self._cond:
                    self._indexed, self._indexed_hash = seq, prev
            self._head_seq, self._head_hash = seq, prev
        return stored

    def _retry(self) -> None:
        """After the indexer failed: let it try its backlog again and wait;
        raise its error when it still cannot write."""
        with self._cond:
            self._failure = None
            self._cond.notify_all()
        self._drain()

    def _drain(self) -> None:
        """Wait until SQLite holds every appended event.

        Raises:
            StoreError: the indexer cannot write SQLite.
        """
        with self._cond:
            self._urge()
            while self._indexed < self._head_seq and self._failure is None:
                self._cond.wait()
            if self._failure is not None:
                # A new exception each time: re-raising one object would grow its traceback.
                raise StoreError(str(self._failure), path=self.path) from self._failure

    def _urge(self) -> None:
        """Someone waits for the indexer (under ``_cond``): it goes at once."""
        self._urgent = True
        self._cond.notify_all()

    def _flush_sqlite(self) -> None:
        """Make every committed transaction durable: fsync the database and its
        WAL (``synchronous=NORMAL`` commits do not; a checkpoint syncs the WAL
        before copying and the database after, so these two cover all)."""
        for name in (self.path, self.path + "-wal"):
            try:
                fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise StoreError(
                    f"cannot flush the event store {name}: {exc.strerror}", path=self.path
                ) from exc

    def _insert(self, rows: Sequence[Row]) -> None:
        with self._transaction() as conn:
            insert_rows(conn, rows)

    # ------------------------------------------------------------------ the indexer

    def _index(self) -> None:
        while True:
            with self._cond:
                while not self._ready_to_index():
                    if self._closing and (not self._backlog or self._failure is not None):
                        return
                    if self._head_due():
                        break
                    self._cond.wait(self._index_wait())
                batches = list(self._backlog) if self._ready_to_index() else []
            if not batches:
                self._publish_head()
                continue
            rows = [row for batch in batches for row in batch]
            try:
                self._insert(rows)
            except Exception as exc:  # whatever it is, the indexer must not die silently
                if not isinstance(exc, StoreError):
                    exc = StoreError(
                        f"cannot write the event store {self.path}: the indexer failed ({exc!r})",
                        path=self.path,
                    )
                with self._cond:
                    self._failure = exc
                    self._cond.notify_all()
                if self._on_failure is not None:
                    with contextlib.suppress(Exception):
                        self._on_failure(exc)
                continue
            with self._cond:
                for _ in batches:
                    self._backlog.popleft()
                self._backlog_rows -= len(rows)
                self._indexed, self._indexed_hash = rows[-1][0], rows[-1][-1]
                if not self._backlog:
                    self._urgent = False
                self._cond.notify_all()
            if self._head_due():
                self._publish_head()

    def _ready_to_index(self) -> bool:
        """Whether the indexer goes now (under ``_cond``). It waits for a
        batch to grow (``INDEX_ROWS``) or age (``INDEX_DELAY``) unless a reader,
        a wrap or ``close`` waits for it: many rows per transaction cost less
        each, and the daemon's loop is not slowed down by the indexer's share
        of the interpreter after every single intent."""
        if not self._backlog or self._failure is not None:
            return False
        if self._urgent or self._closing or self._backlog_rows >= INDEX_ROWS:
            return True
        return time.monotonic() >= self._backlog_since + INDEX_DELAY

    def _index_wait(self) -> float | None:
        head = self._head_wait()
        if not self._backlog or self._failure is not None:
            return head
        wait = max(0.0, self._backlog_since + INDEX_DELAY - time.monotonic())
        return wait if head is None else min(wait, head)

    # ------------------------------------------------------------------ the quota

    def room_for_agents(self) -> str | None:
        """None while agents may make the store grow; else why not, in one
        sentence: the store is within ``reserve`` of its ``quota``, or its
        filesystem has less than ``reserve`` free. The daemon's own events are
        never refused here: the reserve is theirs (a disk that does fill is a
        store failure, as before). Any thread."""
        now = time.monotonic()
        if now - self._sized_at >= _SIZE_EVERY or self._appended_bytes >= _SIZE_BYTES:
            self._measure(now)
        if self.quota is not None and self._size + self._appended_bytes + self.reserve > self.quota:
            return (
                f"the event store holds {_mib(self._size + self._appended_bytes)} of its quota of "
                f"{_mib(self.quota)}, and the last {_mib(self.reserve)} are kept for the daemon's own events"
            )
        if self._free - self._appended_bytes < self.reserve:
            return (
                f"the filesystem of the event store has {_mib(max(0, self._free - self._appended_bytes))} "
                f"free, under the {_mib(self.reserve)} kept for the daemon's own events"
            )
        return None

    def _measure(self, now: float) -> None:
        size = 0
        for name in (self.path, self.path + "-wal"):
            with contextlib.suppress(OSError):
                size += os.stat(name).st_size
        try:
            st = os.statvfs(os.path.dirname(self.path))
            free = st.f_bavail * st.f_frsize
        except OSError:
            free = 0
        self._size, self._free, self._appended_bytes, self._sized_at = size, free, 0, now

    # ------------------------------------------------------------------ the head

    def _head_due(self) -> bool:
        """Whether the head file lags SQLite and its interval has passed."""
        wait = self._head_wait()
        return wait is not None and wait <= 0

    def _head_wait(self) -> float | None:
        if self.head_file is None or self._indexed <= self._published:
            return None
        return self._published_at + HEAD_INTERVAL - time.monotonic()

    def _publish_head(self) -> None:
        """Write the head file: the last event SQLite holds (durable already,
        in the journal or flushed). A failure is kept in ``head_error`` and
        tried again at the next interval: the head is a copy, the events are safe."""
        if self.head_file is None:
            return
        with self._cond:
            seq, digest = self._indexed, self._indexed_hash
        self._published_at = time.monotonic()
        if seq == 0 or seq == self._published:
            return
        try:
            write_head(self.head_file, Head(seq, digest))
        except OSError as exc:
            self.head_error = exc
            return
        self.head_error = None
        self._published = seq

    def head(self) -> Head | None:
        """The last event appended (seq and hash), or None when the store is empty."""
        with self._append_lock:
            return Head(self._head_seq, self._head_hash) if self._head_seq else None

    @property
    def unindexed(self) -> int:
        """Events durable in the journal that SQLite does not hold yet (the indexer's lag)."""
        with self._cond:
            return self._head_seq - self._indexed

    @property
    def failure(self) -> StoreError | None:
        """The indexer's last error, until an append retries successfully."""
        return self._failure

    # ------------------------------------------------------------------ opening

    def _recover(self) -> tuple[int, str]:
        """Copy into SQLite what the journal holds beyond it; SQLite's head after.

        Raises:
            StoreError: the journal does not continue SQLite's chain.
        """
        conn = self._writer()
        row = conn.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone()
        seq, prev = (int(row[0]), str(row[1])) if row else (0, GENESIS)
        rows: list[Row] = []
        for record in self.journal.records():
            if record.first_seq + len(record.events) - 1 <= seq:
                continue
            if record.first_seq > seq + 1:
                raise StoreError(
                    f"the journal {self.journal.path} does not continue the event store {self.path} "
                    f"(it resumes at event {record.first_seq}, the store ends at {seq}); keep both files "
                    "for inspection and move the journal aside to open the store without it",
                    path=self.path,
                )
            running = record.prev
            for number, payload in enumerate(record.events, record.first_seq):
                digest = hash_payload(running, number, payload)
                if number > seq:
                    if running != prev:
                        raise StoreError(
                            f"event {number} in the journal {self.journal.path} does not continue the chain "
                            f"of the event store {self.path}; keep both files and run `stockade verify`",
                            path=self.path,
                        )
                    rows.append(_row(number, payload, running, digest, self.journal.path))
                    seq, prev = number, digest
                running = digest
        if rows:
            self._insert(rows)
            self._flush_sqlite()
        return seq, prev

    # ------------------------------------------------------------------ reading

    def _caught_up(self) -> None:
        """Wait (briefly) until SQLite holds every event appended so far, so a
        read never misses one that ``append`` returned; not on failure."""
        with self._cond:
            target = self._head_seq
            if self._indexed < target:
                self._urge()
            while self._indexed < target and self._failure is None and not self._closing:
                self._cond.wait()

    def query(self, **kwargs: Any) -> Iterator[StoredEvent]:
        self._caught_up()
        return super().query(**kwargs)

    def last_seq(self) -> int:
        self._check_open()
        return self._head_seq

    def verify(self, expect: Mapping[int, str] | None = None) -> VerifyResult:
        self._caught_up()
        return super().verify(expect)

    def stored_json(self, seq: int) -> str | None:
        self._caught_up()
        return super().stored_json(seq)

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """Index what is left, flush SQLite, close everything. Idempotent."""
        with self._append_lock:
            thread, self._thread = self._thread, None
            if thread is not None:
                with self._cond:
                    self._closing = True
                    self._cond.notify_all()
                thread.join()
                with contextlib.suppress(StoreError):
                    if self._failure is None:
                        self._flush_sqlite()
                        self._publish_head()
                self.journal.close()
        super().close()


def _mib(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MiB"


def _row(seq: int, payload: bytes, prev: str, digest: str, where: str) -> Row:
    try:
        raw = payload.decode("utf-8")
        d = json.loads(raw)
        return (
            seq,
            float(d["time"]),
            d["run"],
            d["cell"],
            d["kind"],
            d["layer"],
            d["outcome"],
            raw,
            prev,
            digest,
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreError(
            f"event {seq} in the journal {where} is not a valid event ({exc})", path=where
        ) from exc


def open_journaled_store(
    path: str,
    *,
    journal_size: int = DEFAULT_SIZE,
    on_failure: Callable[[StoreError], None] | None = None,
) -> JournaledStore:
    """Open the store at ``path`` for the daemon: created like ``open_store``'s,
    with its journal ``path + ".journal"`` (see the module docstring).

    ``on_failure`` is called from the indexer's thread when SQLite cannot be
    written (appends raise the same error from then on).

    Raises:
        StoreError: as ``open_store``; or the journal cannot be created,
            locked (another process writes the store) or does not continue
            the store's chain.
    """
    return JournaledStore(path, journal_size=journal_size, on_failure=on_failure)


__all__ = ["JournaledStore", "open_journaled_store"]
