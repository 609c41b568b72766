"""The head of the chain, kept outside the store: ``SEQ:HASH`` and the head file.

A hash chain shows an edited event, but not a tail cut off or a chain
rewritten from some event on by someone who can write the store: for that, a
copy of a head (an event's ``seq`` and hash) must be kept elsewhere and
checked later (``ChainVerifier(expect=…)``, ``stockade verify --expect``).

The daemon publishes its head in ``<store>.head`` (``events.db.head`` in the
state directory) about once a second while events come, and when it closes:
one JSON object ``{"seq": N, "hash": "…", "time": T}``, replaced atomically
and flushed, only ever naming an event that is already durable. ``stockade
verify`` checks the store against it when it is there. Someone who can write
the state directory can rewrite that file as well: it catches a store cut
short or replaced on its own (a restore from a backup, a copy, a truncation),
and a copy shipped off the host (a log, a ticket) catches the rest.
docs/RECORD.md says the same for the operator.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from dataclasses import dataclass

HEAD_SUFFIX = ".head"
"""The head file is the store's path and this."""

_HEAD = re.compile(r"(\d{1,19}):([0-9a-f]{64})\Z")


@dataclass(frozen=True, slots=True)
class Head:
    """One event's place in the chain: its ``seq`` and its hash."""

    seq: int
    hash: str

    def __str__(self) -> str:
        return f"{self.seq}:{self.hash}"

    def to_dict(self) -> dict[str, object]:
        return {"seq": self.seq, "hash": self.hash}


def parse_head(text: str) -> Head:
    """``SEQ:HASH`` (as ``stockade verify`` prints it) as a ``Head``.

    Raises:
        ValueError: ``text`` is not that; the message shows the form.
    """
    match = _HEAD.match(text.strip().lower())
    if match is None or int(match.group(1)) < 1:
        raise ValueError(
            f"{text!r} is not a head; give SEQ:HASH, an event's number (1 or more) and its 64 hex "
            "digits, as `stockade verify` prints them (e.g. 42:3a6459de…)"
        )
    return Head(int(match.group(1)), match.group(2))


def head_path(store_path: str) -> str:
    """The head file of the store at ``store_path``."""
    return store_path + HEAD_SUFFIX


def write_head(path: str, head: Head) -> None:
    """Replace the head file ``path`` with ``head``, atomically and durably
    (mode 0600). A reader sees the old head or the new one, never half of one.

    Raises:
        OSError: the file cannot be written (the temporary one is removed).
    """
    body = json.dumps({"seq": head.seq, "hash": head.hash, "time": round(time.time(), 3)}) + "\n"
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        try:
            os.write(fd, body.encode("ascii"))
            # The data before the rename: after a crash the file holds a whole head.
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_head(path: str) -> Head | None:
    """The head in the head file ``path``; None when there is no such file.

    Raises:
        ValueError: the file is there but holds no head (its message names the file).
        OSError: the file cannot be read.
    """
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            text = f.read(4096)
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
        seq, digest = data["seq"], data["hash"]
        if isinstance(seq, bool) or not isinstance(seq, int) or not isinstance(digest, str):
            raise TypeError("seq must be a number and hash a string")
        return parse_head(f"{seq}:{digest}")
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(
            f"the head file {path} holds no head ({exc}); it should be one JSON object "
            '{"seq": N, "hash": "<64 hex>"}: a damaged or altered anchor, keep it for inspection'
        ) from None


__all__ = ["HEAD_SUFFIX", "Head", "head_path", "parse_head", "read_head", "write_head"]
