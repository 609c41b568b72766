"""The store's journal: events on disk in one write before SQLite has them.

An intent is answered only once its event is durable. A SQLite commit that
is durable costs two or three flushes of the disk (the WAL frames, then
their commit); on this project's machines one flush alone is about 100 µs.
So the daemon's store (``_journaled.JournaledStore``) makes each batch of
events durable with exactly one write to this file, answers, and lets SQLite
catch up behind (``synchronous=NORMAL``, no flush per commit). After a crash
the journal holds what SQLite may lack; opening the store copies it in.

The file is preallocated (``posix_fallocate``, then written with zeros
once) and opened with ``O_DSYNC``, so a write is a plain overwrite of
allocated, written blocks that returns once the device has it; appending to
a growing file would also have to make its size durable (measured here:
~145 µs a write instead of ~95 µs).

Records, written one after the other from offset 0::

    header  "SKJ1" | epoch u64 | first seq u64 | count u32 | length u32 | crc32 u32   (little-endian)
    payload the hash before the first event (64 hex) "\\n" event JSON "\\n" event JSON …

``crc32`` covers the header's first 28 bytes and the payload. A record is
valid when its magic, epoch and checksum are right and its first seq follows
the record before it. Reading stops at the first record that is not: the end,
a write torn by a crash (never acknowledged: a write is acknowledged only once
it returned), or what an older epoch left behind. Each ``reset`` (at every
open, and when the file is full and SQLite has been made durable) starts a
new random epoch at offset 0, so stale records can never be read as new ones.

Written by hand because it is the one thing no library here does: a
preallocated, checksummed, single-write log of the shape above.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from stockade.errors import StoreError

SUFFIX = ".journal"
"""The journal of the store ``events.db`` is ``events.db.journal`` (SQLite's
own files are ``-wal``, ``-shm`` and ``-journal``, with a dash)."""

DEFAULT_SIZE = 32 << 20
"""Bytes: about 60,000 intent events before the journal wraps (a wrap waits
for SQLite to catch up and flushes it once)."""

MAGIC = b"SKJ1"
_HEADER = struct.Struct("<4sQQIII")
_CHAIN_HEAD = 64
"""Length of a hash in hex: the payload starts with the one before its first event."""


@dataclass(frozen=True, slots=True)
class JournalRecord:
    """One record as read back: ``events`` are the stored JSON texts of the
    events numbered ``first_seq``, ``first_seq + 1`` …; ``prev`` is the chain
    hash of the event before the first."""

    first_seq: int
    prev: str
    events: tuple[bytes, ...]


class Journal:
    """The journal file of one store, open for writing by one process (see the module docstring)."""

    def __init__(self, path: str, fd: int, size: int) -> None:
        self.path = path
        self._fd = fd
        self.size = size
        self._epoch = 0
        self._offset = 0
        self._next_seq: int | None = None

    @classmethod
    def open(cls, path: str, size: int = DEFAULT_SIZE) -> Journal:
        """Open (creating, mode 0600) and lock the journal at ``path``; make it
        at least ``size`` bytes.

        Raises:
            StoreError: it cannot be created, locked (another process writes
                the store) or allocated (the filesystem is full).
        """
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_DSYNC, 0o600)
        except OSError as exc:
            raise _error(exc, path, "open") from exc
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise StoreError(
                    f"cannot write the event store's journal {path}: another process writes this store "
                    "(a second daemon?); stop it or give each daemon its own state directory",
                    path=path,
                ) from None
            have = os.fstat(fd).st_size
            if have < size:
                try:
                    os.posix_fallocate(fd, 0, size)  # all the room, or ENOSPC now
                    _write_zeros(path, have, size)
                except OSError as exc:
                    os.ftruncate(fd, have)
                    raise _error(exc, path, "allocate") from exc
                os.fsync(fd)  # the allocation (the file's size) itself
                _fsync_directory(os.path.dirname(os.path.abspath(path)))  # and its name
            return cls(path, fd, max(have, size))
        except BaseException:
            os.close(fd)
            raise

    # ----------------------------------------------------------------- reading

    def records(self) -> Iterator[JournalRecord]:
        """The valid records from offset 0, in order (see the module docstring)."""
        return _scan(lambda offset, n: os.pread(self._fd, n, offset), self.size)

    # ----------------------------------------------------------------- writing

    def reset(self) -> None:
        """Start a new epoch at offset 0: what the file holds is no longer read.

        Call it only once everything in the file is durable elsewhere (in SQLite).

        Raises:
            StoreError: the file cannot be written.
        """
        self._epoch = int.from_bytes(os.urandom(8), "little")
        self._offset = 0
        self._next_seq = None
        # Overwrite the first header too, so that a reader after a crash that
        # comes before any new record does not read the old epoch's records
        # again (harmless, they are in SQLite, but slow and confusing).
        self._write(bytes(_HEADER.size), 0)

    def encode(self, first_seq: int, prev: str, events: Sequence[bytes]) -> bytes:
        """The record of ``events`` (their stored JSON), numbered from ``first_seq``
        after the chain hash ``prev``."""
        payload = b"\n".join([prev.encode("ascii"), *events])
        header = struct.pack("<4sQQII", MAGIC, self._epoch, first_seq, len(events), len(payload))
        return header + struct.pack("<I", zlib.crc32(payload, zlib.crc32(header))) + payload

    def fits(self, record: bytes) -> bool:
        """Whether ``record`` fits after what was written since the last reset."""
        return self._offset + len(record) <= self.size

    def append(self, record: bytes) -> None:
        """Write ``record`` (from ``encode``) after the last one; durable when it returns.

        Raises:
            StoreError: the write failed; nothing counts as written (the next
                record goes to the same place).
            ValueError: it does not fit (check ``fits`` first).
        """
        if not self.fits(record):
            raise ValueError(f"a record of {len(record)} bytes does not fit in the journal {self.path}")
        self._write(record, self._offset)
        self._offset += len(record)

    def close(self) -> None:
        """Close (and unlock) the file. Idempotent."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def _write(self, data: bytes, offset: int) -> None:
        view = memoryview(data)
        try:
            while view:
                written = os.pwrite(self._fd, view, offset)
                view, offset = view[written:], offset + written
        except OSError as exc:
            raise _error(exc, self.path, "write") from exc


def _write_zeros(path: str, start: int, end: int) -> None:
    """Write zeros over ``[start, end)`` of the file, through a descriptor
    without ``O_DSYNC`` (one flush at the end, by the caller).

    ``posix_fallocate`` leaves the blocks *unwritten* (ext4, xfs): the first
    durable write into each then also converts it in the filesystem's own
    journal, which made about one journal write in a hundred wait a
    millisecond or more (measured here: p99 1.7 ms instead of 0.26 ms for
    1,500-byte ``O_DSYNC`` writes). Written once, they are plain overwrites."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        chunk = bytes(1 << 20)
        offset = start
        while offset < end:
            offset += os.pwrite(fd, chunk[: min(len(chunk), end - offset)], offset)
    finally:
        os.close(fd)


def read_records(path: str, *, after_seq: int = 0) -> list[JournalRecord]:
    """The valid records of the journal at ``path``, for a reader of the store.

    Unlike ``Journal.open`` this opens the file read-only and neither locks,
    allocates nor writes it, so it is safe while the daemon writes: a record
    the daemon is writing at that moment reads as torn and ends the list
    (it was not acknowledged yet). Every record is checked as ``Journal.records``
    checks it; those whose events are all numbered ``after_seq`` or less are
    then left out (the caller has them). No file, no records.

    Raises:
        StoreError: the file exists but cannot be read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise _read_error(exc, path) from exc
    try:
        size = os.fstat(fd).st_size
        return list(_scan(_Window(fd).read, size, after_seq))
    except OSError as exc:
        raise _read_error(exc, path) from exc
    finally:
        os.close(fd)


def _scan(read: Callable[[int, int], bytes], size: int, after_seq: int = 0) -> Iterator[JournalRecord]:
    """The valid records of a file of ``size`` bytes read with ``read(offset, n)``
    (see the module docstring), without those wholly at or before ``after_seq``."""
    offset, epoch, expected = 0, None, None
    while offset + _HEADER.size <= size:
        header = read(offset, _HEADER.size)
        if len(header) < _HEADER.size:
            return
        magic, rec_epoch, first, count, length, crc = _HEADER.unpack(header)
        if magic != MAGIC or (epoch is not None and rec_epoch != epoch) or count == 0:
            return
        if expected is not None and first != expected:
            return
        if offset + _HEADER.size + length > size or length < _CHAIN_HEAD + 1:
            return
        payload = read(offset + _HEADER.size, length)
        if len(payload) != length or zlib.crc32(payload, zlib.crc32(header[:28])) != crc:
            return
        # The events are split only for a record the caller wants; the count
        # of separators is the same test as the number of parts a split gives.
        if (
            payload[_CHAIN_HEAD : _CHAIN_HEAD + 1] != b"\n"
            or payload.count(b"\n", _CHAIN_HEAD + 1) != count - 1
        ):
            return
        if first + count - 1 > after_seq:
            prev = payload[:_CHAIN_HEAD].decode("ascii", "replace")
            yield JournalRecord(first, prev, tuple(payload[_CHAIN_HEAD + 1 :].split(b"\n")))
        epoch, expected = rec_epoch, first + count
        offset += _HEADER.size + length


_WINDOW = 1 << 20
"""Bytes a reader reads at once: a scan makes two small reads per record, which
would otherwise be two system calls each (60,000 records in a full journal)."""


class _Window:
    """Reads of one file served from a buffer of ``_WINDOW`` bytes that moves forward."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._start = 0
        self._buffer = b""

    def read(self, offset: int, n: int) -> bytes:
        start = offset - self._start
        if start < 0 or start + n > len(self._buffer):
            self._buffer = os.pread(self._fd, max(n, _WINDOW), offset)
            self._start, start = offset, 0
        return self._buffer[start : start + n]


def _read_error(exc: OSError, path: str) -> StoreError:
    if exc.errno in (errno.EACCES, errno.EPERM):
        why = f"{str(exc.strerror).lower()}; read the store as the daemon's user (or root)"
    else:
        why = f"{exc.strerror} (errno {exc.errno}); check the disk"
    return StoreError(f"cannot read the event store's journal {path}: {why}", path=path)


def _fsync_directory(directory: str) -> None:
    """Make a new file's directory entry durable: without it, a power loss
    could take the whole journal, and every record in it, away."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise _error(exc, directory, "open") from exc
    try:
        os.fsync(fd)
    except OSError as exc:
        raise _error(exc, directory, "flush") from exc
    finally:
        os.close(fd)


def _error(exc: OSError, path: str, doing: str) -> StoreError:
    directory = os.path.dirname(path)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        why = "its filesystem is full; free space on it"
    elif exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        why = f"{str(exc.strerror).lower()}; make {directory} and the store's files writable by the daemon"
    elif exc.errno == errno.ENOENT:
        why = f"{directory} does not exist; create it (mode 0700)"
    else:
        why = f"{exc.strerror} (errno {exc.errno}); check the disk"
    return StoreError(f"cannot {doing} the event store's journal {path}: {why}", path=path)


__all__ = ["DEFAULT_SIZE", "SUFFIX", "Journal", "JournalRecord", "read_records"]
