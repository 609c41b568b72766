"""Write events as JSON lines, atomically: a reader never sees half a file."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

from stockade.record._event import Event


def write_jsonl(path: str, events: Iterable[Event]) -> None:
    """Write ``events`` to ``path``, one JSON object per line.

    The file is written beside its destination and renamed into place, so an
    interrupted write leaves the previous file (or none), never a torn one.
    Mode 0600, as ``stockade export`` writes: events name the operator's files
    and the agent's arguments.

    Raises:
        OSError: the directory does not exist or cannot be written.
    """
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        for event in events:
            f.write(json.dumps(event.to_dict(), sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
