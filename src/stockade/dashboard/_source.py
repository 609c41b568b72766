"""Where the dashboard's events come from: the live daemon, or a recorded run.

``Source`` is what the web app (``_app``) asks; it never touches the daemon
or a file itself. Two kinds:

- ``LiveSource``: inside the daemon's process, on its loop. Events are read
  from the daemon's store (in a worker thread: the store is safe to read from
  any thread while the loop writes) and followed live on its ``EventBus``;
  approvals are the daemon's own, decided through its intent path, so the
  agent gets its answer in the same turn of the loop.
- ``ReplaySource``: a bundle or an export read into memory (``load_replay``):
  no daemon, no kernel feature, nothing live, nothing to decide.

Events travel as the dicts of a JSONL export (``{"seq", "hash", "prev",
"event"}``), and live ones as the JSONL line itself (``StoredEvent.to_json``),
which the bus already made for its other subscribers.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import io
import json
import os
import tarfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from stockade.dashboard._summary import RunIndex, check_chain
from stockade.errors import ReplayError, RequestError

if TYPE_CHECKING:
    from stockade.daemon._server import Daemon

Send = Callable[[int, str], bool]
"""The bus's ``Send``: one stored event's JSON line; True (a dashboard feed never refuses)."""

TRANSCRIPT_MAX = 512 * 1024
"""Bytes of a run's transcript the page gets at most (its end), as ``run.logs`` answers."""


class DecideError(Exception):
    """An approval could not be decided; ``code`` is the protocol's (``not_found``, ``conflict``…)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Source(Protocol):
    mode: Literal["live", "replay"]
    label: str

    async def events(self, *, run: str | None, after: int, limit: int) -> list[dict[str, Any]]: ...

    async def runs(self) -> list[dict[str, Any]]: ...

    async def verify(self, run: str | None) -> dict[str, Any]: ...

    async def approvals(self) -> list[dict[str, Any]]: ...

    async def decide(self, approval: str, decision: str, *, by: str, reason: str) -> dict[str, Any]: ...

    def subscribe(self, run: str | None, send: Send) -> Callable[[], None] | None: ...

    async def transcript(self, run: str) -> dict[str, Any]: ...

    async def run_info(self, run: str) -> dict[str, Any] | None: ...


# --------------------------------------------------------------------------- live


class LiveSource:
    """The daemon's own record, runs and approvals (see the module docstring)."""

    mode: Literal["live", "replay"] = "live"

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.label = f"daemon at {daemon.socket_path}"
        self._index = RunIndex()
        self._lock = threading.Lock()

    def _store(self) -> Any:
        recorder = self.daemon.recorder
        assert recorder is not None
        return recorder.store

    async def events(self, *, run: str | None, after: int, limit: int) -> list[dict[str, Any]]:
        store = self._store()

        def read() -> list[dict[str, Any]]:
            return [s.to_dict() for s in store.query(run=run, after_seq=after, limit=limit)]

        return await asyncio.to_thread(read)

    async def runs(self) -> list[dict[str, Any]]:
        store = self._store()

        def fold() -> list[dict[str, Any]]:
            # Only what came since the last call is read: the index keeps the rest.
            with self._lock:
                while True:
                    page = [s.to_dict() for s in store.query(after_seq=self._index.last_seq, limit=2000)]
                    self._index.add(page)
                    if len(page) < 2000:
                        return self._index.listing()

        folded = await asyncio.to_thread(fold)
        runs = self.daemon.runs
        live = {r["id"]: r for r in runs.listing(include_past=True)} if runs is not None else {}
        for item in folded:
            info = live.get(item["id"])
            if info is None:
                continue
            # The daemon's own view is the truth while a run lives: its state
            # (stopping…) and the tripwire's count, which the record only
            # states at the end.
            item["state"] = info.get("state", item["state"])
            if isinstance(info.get("denials"), int):
                item["tripwire"], item["tripwire_exact"] = info["denials"], True
            item["children"] = list(info.get("children") or [])
        return folded

    async def verify(self, run: str | None) -> dict[str, Any]:
        store = self._store()
        expect: dict[int, str] = {}
        if run is not None:
            info = await self.run_info(run)
            head = (info or {}).get("record")
            if isinstance(head, Mapping) and isinstance(head.get("seq"), int):
                expect[int(head["seq"])] = str(head.get("hash"))
        result = await asyncio.to_thread(store.verify, expect or None)
        return {
            "ok": bool(result.ok and not result.anchor),
            "checked": result.checked,
            "first_bad_seq": result.first_bad_seq,
            "reason": result.anchor or result.reason,
            "head": f"{result.checked}:{result.last_hash}" if result.ok and result.checked else "",
            "expected": [f"{s}:{h}" for s, h in expect.items()],
            "scope": "the whole store, every event of every run, and the run's own head (run.json)",
        }

    async def approvals(self) -> list[dict[str, Any]]:
        runs = self.daemon.runs
        return [a.to_dict() for a in runs.approvals.pending()] if runs is not None else []

    async def decide(self, approval: str, decision: str, *, by: str, reason: str) -> dict[str, Any]:
        runs = self.daemon.runs
        if runs is None:
            raise DecideError("unavailable", "the daemon is not serving runs; try again once it is")
        try:
            return runs.intents.decide(approval, decision, by=by, reason=reason).to_dict()
        except RequestError as exc:
            raise DecideError(exc.code, str(exc)) from exc

    def subscribe(self, run: str | None, send: Send) -> Callable[[], None] | None:
        bus = self.daemon.bus
        owner = object()
        sub = bus.subscribe(send, run=run, owner=owner)
        return lambda: bus.unsubscribe(sub.id)

    async def transcript(self, run: str) -> dict[str, Any]:
        from stockade.daemon import _paths

        if not _paths.RUN_ID.match(run):
            return {"text": "", "bytes": 0, "truncated": False}
        return await asyncio.to_thread(_read_tail, _paths.transcript_path(self.daemon.state, run))

    async def run_info(self, run: str) -> dict[str, Any] | None:
        from stockade.daemon import _paths

        if not _paths.RUN_ID.match(run):
            return None
        path = os.path.join(_paths.runs_dir(self.daemon.state), run, "run.json")

        def read() -> dict[str, Any] | None:
            try:
                with open(path, encoding="utf-8") as f:
                    data = json.load(f)
            except (OSError, ValueError):
                return None
            return data if isinstance(data, dict) else None

        return await asyncio.to_thread(read)


def _read_tail(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            start = max(0, size - TRANSCRIPT_MAX)
            f.seek(start)
            data = f.read()
    except FileNotFoundError:
        return {"text": "", "bytes": 0, "truncated": False}
    return {"text": data.decode("utf-8", "replace"), "bytes": size, "truncated": start > 0}


# --------------------------------------------------------------------------- replay


class ReplaySource:
    """A recorded run (or many) held in memory; nothing live, nothing to decide."""

    mode: Literal["live", "replay"] = "replay"

    def __init__(
        self,
        label: str,
        stored: list[dict[str, Any]],
        *,
        transcripts: Mapping[str, str] | None = None,
        infos: Mapping[str, dict[str, Any]] | None = None,
    ) -> None:
        self.label = label
        self.stored = sorted(stored, key=lambda s: int(s["seq"]))
        self.transcripts = dict(transcripts or {})
        self.infos = dict(infos or {})
        self._index = RunIndex()
        self._index.add(self.stored)
        self._chain = check_chain(self.stored)

    async def events(self, *, run: str | None, after: int, limit: int) -> list[dict[str, Any]]:
        found = []
        for s in self.stored:
            if s["seq"] <= after or (run is not None and s["event"].get("run") != run):
                continue
            found.append(s)
            if len(found) >= limit:
                break
        return found

    async def runs(self) -> list[dict[str, Any]]:
        return self._index.listing()

    async def verify(self, run: str | None) -> dict[str, Any]:
        expect = []
        info = self.infos.get(run or "")
        head = (info or {}).get("record")
        result = dict(self._chain)
        if isinstance(head, Mapping) and isinstance(head.get("seq"), int):
            expect.append(f"{head['seq']}:{head.get('hash')}")
            held = {s["seq"]: s["hash"] for s in self.stored}
            if held.get(head["seq"]) != head.get("hash"):
                result["ok"] = False
                result["reason"] = f"the run's head {expect[0]} is not in the replayed events"
        result["expected"] = expect
        result["scope"] = (
            "the replayed events only: each one's hash and the links between consecutive events "
            f"({result.get('gaps', 0)} gaps where other runs' events were left out of the file)"
        )
        return result

    async def approvals(self) -> list[dict[str, Any]]:
        return []

    async def decide(self, approval: str, decision: str, *, by: str, reason: str) -> dict[str, Any]:
        raise DecideError("conflict", "this is a replay of a recorded run: nothing in it can be decided")

    def subscribe(self, run: str | None, send: Send) -> Callable[[], None] | None:
        return None

    async def transcript(self, run: str) -> dict[str, Any]:
        text = self.transcripts.get(run, "")
        data = text.encode("utf-8")
        cut = len(data) > TRANSCRIPT_MAX
        shown = data[-TRANSCRIPT_MAX:].decode("utf-8", "replace") if cut else text
        return {"text": shown, "bytes": len(data), "truncated": cut}

    async def run_info(self, run: str) -> dict[str, Any] | None:
        return self.infos.get(run)


def load_replay(path: str | os.PathLike[str]) -> ReplaySource:
    """A bundle or an export as a ``ReplaySource``.

    Accepted: a JSONL export (``stockade export``), a JSON export (a list of
    stored events), a directory holding one (the demo's ``runs/<name>-<time>/``
    with ``record.json`` and ``transcript.jsonl``, a run directory with
    ``events.jsonl``), or a bundle the dashboard downloaded (``.tar.gz``
    with ``events.jsonl``, ``run.json``, ``transcript.log``).

    Raises:
        ReplayError: the path is none of those, or an event in it is malformed.
    """
    p = Path(path)
    if not p.exists():
        raise ReplayError(f"{p} does not exist; give a bundle or an export (stockade export --out FILE)")
    transcripts: dict[str, str] = {}
    infos: dict[str, dict[str, Any]] = {}
    if p.is_dir():
        # a run's export, the demo's run directory, a bench trial's bundle
        names = ("events.jsonl", "record.jsonl", "record.json", "events.json", "log.json")
        record = next((p / n for n in names if (p / n).is_file()), None)
        if record is None:
            raise ReplayError(
                f"{p} holds no record (events.jsonl, record.json); give a bundle or an export file"
            )
        stored = _parse(record.name, record.read_bytes(), str(record))
        transcript = next((p / n for n in ("transcript.log", "transcript.jsonl") if (p / n).is_file()), None)
        info = _json_file(p / "run.json")
        extra = {"transcript": transcript.read_text("utf-8", "replace") if transcript else None}
    elif p.name.endswith((".tar.gz", ".tgz", ".tar")):
        stored, extra, info = _untar(p)
    else:
        stored = _parse(p.name, p.read_bytes(), str(p))
        extra, info = {"transcript": None}, None
    runs = {s["event"].get("run") for s in stored if s["event"].get("run")}
    if len(runs) == 1:
        only = next(iter(runs))
        if extra.get("transcript") is not None:
            transcripts[only] = str(extra["transcript"])
        if info is not None:
            infos[only] = info
    return ReplaySource(f"replay of {p}", stored, transcripts=transcripts, infos=infos)


def _untar(p: Path) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any] | None]:
    try:
        with tarfile.open(p, "r:*") as tar:
            files: dict[str, bytes] = {}
            for member in tar.getmembers():
                if not member.isfile() or member.size > 512 * 1024 * 1024:
                    continue
                f = tar.extractfile(member)
                if f is not None:
                    files[os.path.basename(member.name)] = f.read()
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ReplayError(
            f"{p} is not a readable bundle ({exc}); give a .tar.gz the dashboard wrote"
        ) from exc
    record = files.get("events.jsonl")
    if record is None:
        raise ReplayError(f"{p} holds no events.jsonl; give a bundle the dashboard wrote, or an export")
    info = None
    if "run.json" in files:
        with contextlib.suppress(ValueError):
            loaded = json.loads(files["run.json"])
            info = loaded if isinstance(loaded, dict) else None
    transcript = files.get("transcript.log")
    return (
        _parse("events.jsonl", record, str(p)),
        {"transcript": transcript.decode("utf-8", "replace") if transcript is not None else None},
        info,
    )


def _json_file(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _parse(name: str, data: bytes, where: str) -> list[dict[str, Any]]:
    if name.endswith(".gz"):
        data = gzip.decompress(data)
    text = data.decode("utf-8", "replace")
    items: list[Any]
    if text.lstrip().startswith("["):
        try:
            loaded = json.loads(text)
        except ValueError as exc:
            raise ReplayError(f"{where} is not valid JSON ({exc}); give a JSON or JSONL export") from exc
        items = loaded if isinstance(loaded, list) else []
    else:
        items = []
        for number, line in enumerate(io.StringIO(text), 1):
            if not line.strip():
                continue
            try:
                items.append(json.loads(line))
            except ValueError as exc:
                raise ReplayError(
                    f"{where}:{number} is not a JSON line ({exc}); give a JSONL export (stockade export)"
                ) from exc
    stored = []
    for number, item in enumerate(items, 1):
        if (
            not isinstance(item, dict)
            or not isinstance(item.get("seq"), int)
            or not isinstance(item.get("event"), dict)
        ):
            raise ReplayError(
                f"{where}: item {number} is not a stored event (no seq or event); "
                "give an export of stockade's record (stockade export --format jsonl)"
            )
        stored.append(item)
    return stored


__all__ = ["DecideError", "LiveSource", "ReplayError", "ReplaySource", "Source", "load_replay"]
