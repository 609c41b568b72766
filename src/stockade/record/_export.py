"""Exports of stored events: JSON, JSON lines, or one human line per event.

Streaming: events are written as they come from the iterable (``query`` reads
them lazily), so an export of millions holds a few thousand lines in memory at
most. docs/RECORD.md shows each format.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import IO, Literal, get_args

from stockade.record._chain import StoredEvent

ExportFormat = Literal["json", "jsonl", "text"]
FORMATS: tuple[str, ...] = get_args(ExportFormat)

_BATCH = 1024
"""Lines joined into one write: a million small writes cost more than the formatting."""


def export(events: Iterable[StoredEvent], fmt: ExportFormat, out: IO[str]) -> int:
    """Write ``events`` to ``out`` in ``fmt`` and return how many were written.

    - ``jsonl``: one canonical JSON object per line, ``{"event":{…},"hash":…,"prev":…,"seq":…}``
      (the event as ``Event.to_dict()``, byte for byte as stored and hashed).
    - ``json``: the same objects as one JSON array, one per line.
    - ``text``: ``SEQ TIME RUN/CELL LAYER OUTCOME SUMMARY``, the time in ISO-8601
      UTC; control and other unprintable characters are escaped, so that an
      agent's path cannot forge a line or drive the terminal.

    Raises:
        ValueError: ``fmt`` is not one of ``json``, ``jsonl``, ``text``.
    """
    if fmt == "jsonl":
        return _write_lines(events, StoredEvent.to_json, out, sep="\n", end="\n")
    if fmt == "json":
        out.write("[\n")
        count = _write_lines(events, StoredEvent.to_json, out, sep=",\n", end="")
        out.write("\n]\n" if count else "]\n")
        return count
    if fmt == "text":
        return _write_lines(events, text_line, out, sep="\n", end="\n")
    raise ValueError(f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")


def _write_lines(
    events: Iterable[StoredEvent], render: Callable[[StoredEvent], str], out: IO[str], *, sep: str, end: str
) -> int:
    count = 0
    batch: list[str] = []
    first = True
    for stored in events:
        batch.append(render(stored))
        if len(batch) >= _BATCH:
            out.write(("" if first else sep) + sep.join(batch))
            count += len(batch)
            first = False
            batch.clear()
    if batch:
        out.write(("" if first else sep) + sep.join(batch))
        count += len(batch)
    if count:
        out.write(end)
    return count


def export_to_file(events: Iterable[StoredEvent], fmt: ExportFormat, path: str) -> int:
    """``export`` into the file ``path``, atomically: a reader sees the previous
    file (or none) until the whole export is on the disk, never half of it.

    The file is created with mode 0600 (an export holds what the store holds).

    Raises:
        OSError: the file cannot be written (the temporary file is removed).
        ValueError: ``fmt`` is not a known format.
    """
    target = os.path.abspath(path)
    directory = os.path.dirname(target)
    tmp = os.path.join(directory, f".{os.path.basename(target)}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        with open(fd, "w", encoding="utf-8", newline="\n", buffering=1 << 20) as f:
            count = export(events, fmt, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    # The rename is durable once the directory is.
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return count


def text_line(stored: StoredEvent) -> str:
    """One human line: ``SEQ TIME RUN/CELL LAYER OUTCOME SUMMARY`` (the kind when
    there is no summary), every field made printable."""
    event = stored.event
    who = f"{event.run or '-'}/{event.cell or '-'}"
    what = event.summary or event.kind
    return " ".join(
        (
            str(stored.seq),
            iso_utc(event.time),
            printable(who),
            printable(str(event.layer)),
            printable(str(event.outcome)),
            printable(what),
        )
    )


def iso_utc(when: float) -> str:
    """``2026-11-30T12:31:03.412Z``: ISO-8601, UTC, milliseconds."""
    try:
        whole, millis = divmod(round(when * 1000), 1000)
        return f"{_second(whole)}.{millis:03d}Z"
    except (OverflowError, OSError, ValueError):
        return repr(when)


@functools.lru_cache(maxsize=4096)
def _second(whole: int) -> str:
    # Events come many to a second: format each second once.
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))


_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: str) -> str:
    """``text`` with every unprintable character (controls, escape sequences,
    line and paragraph separators, bidi overrides) written as a Python escape."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in text)


def _escape(ch: str) -> str:
    if ch in _ESCAPES:
        return _ESCAPES[ch]
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


_DATEISH = re.compile(r"\d{4}-\d{2}-\d{2}")


def parse_since(text: str, *, now: float | None = None) -> float:
    """Seconds since the epoch for ``--since``: an ISO-8601 time
    (``2026-11-30T12:00:00Z``, ``2026-11-30T13:00+01:00``, ``2026-11-30``; UTC when
    it has no offset) or a duration back from ``now`` (``90s``, ``10m``, ``2h``,
    ``7d``, ``1w``).

    Raises:
        ValueError: ``text`` is neither; the message shows both forms.
    """
    stripped = text.strip()
    # Durations in the one grammar of them (the policy's: 90s, 1h30m, 1d2h, 2w).
    from stockade.policy._units import parse_duration

    try:
        back = None if _DATEISH.match(stripped) else parse_duration(stripped)
    except ValueError:
        back = None
    if back is not None:
        current = time.time() if now is None else now
        return current - back
    try:
        moment = datetime.fromisoformat(stripped)
    except ValueError:
        raise ValueError(
            f"{text!r} is neither an ISO-8601 time (2026-11-30T12:00:00Z) nor a duration (90s, 10m, 1d2h, 7d)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()
