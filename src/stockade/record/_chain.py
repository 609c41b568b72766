"""The hash chain: each stored event carries the hash of the one before it.

Pure: no files, no SQLite. The store (``_store``) feeds rows to
``ChainVerifier``; anyone holding a JSONL export can do the same.

The hash of event ``seq`` is::

    sha256(prev.encode("ascii") + b"\\n" + canonical_json({"event": event.to_dict(), "seq": seq}).encode())

as lowercase hex, where ``prev`` is the hash of event ``seq - 1`` (``GENESIS``,
64 zeros, for event 1) and ``canonical_json`` is
``json.dumps(…, sort_keys=True, separators=(",", ":"), ensure_ascii=False)``.
Because keys are sorted, the hashed text is ``{"event":<event JSON>,"seq":<n>}``:
the stored event JSON is hashed as stored, byte for byte, and a JSONL export
line (``{"event":…,"hash":…,"prev":…,"seq":…}``) carries everything needed to
check it. See docs/RECORD.md.

A chain shows tampering by anyone who does not recompute it: an edited,
removed, inserted or reordered event breaks it from that event on. Someone who
can write the store can also rewrite every hash after an edit, and can cut
events off the end; only a copy of a head (``seq`` and hash) kept elsewhere
shows that: ``stockade verify`` prints the head, the daemon publishes it
(``_head``), and ``ChainVerifier(expect=…)`` checks that the chain still holds
it at its place.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from json.encoder import encode_basestring
from typing import TYPE_CHECKING, Any

from stockade.record._event import Event

GENESIS = "0" * 64
"""The ``prev`` of event 1."""

_json_string: Any = encode_basestring
"""A str as a JSON string, as ``canonical_json`` writes it (C, and fast)."""


def canonical_json(value: Any) -> str:
    """The one JSON text of ``value`` that stockade hashes and stores."""
    return _CANONICAL.encode(value)


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
"""``canonical_json``'s encoder, made once (``json.dumps`` with options makes
one per call). allow_nan=False: NaN and Infinity are not JSON; an event holding
one is refused when stored rather than written where no JSON reader takes it."""


def hash_payload(prev: str, seq: int, event_json: bytes) -> str:
    """The chain hash of an event whose canonical JSON is ``event_json`` (UTF-8).

    Equal to hashing ``canonical_json({"event": event_dict, "seq": seq})``
    after ``prev`` and a newline, without parsing or re-encoding the event.
    """
    h = hashlib.sha256(prev.encode("ascii", "replace"))
    h.update(b'\n{"event":')
    h.update(event_json)
    h.update(b',"seq":%d}' % seq)
    return h.hexdigest()


def chain_hash(prev: str, seq: int, event: Event | dict[str, Any]) -> str:
    """The chain hash of ``event`` stored as number ``seq`` after the hash ``prev``."""
    data = event.to_dict() if isinstance(event, Event) else event
    return hash_payload(prev, seq, canonical_json(data).encode("utf-8"))


def event_from_dict(d: dict[str, Any]) -> Event:
    """The ``Event`` whose ``to_dict()`` is ``d``.

    Raises:
        KeyError, TypeError: ``d`` is not an event's dict.
    """
    return Event(
        kind=d["kind"],
        cell=d["cell"],
        layer=d["layer"],
        outcome=d["outcome"],
        detail=d["detail"],
        time=d["time"],
        summary=d["summary"],
        run=d.get("run", ""),
    )


_set = object.__setattr__


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """An event as the store holds it: its place in the chain and the event.

    A store makes these with ``from_stored``, from the event's stored JSON
    (``raw``), and parses it into ``event`` only when ``event`` is first read:
    an export of JSON or JSON lines copies the stored text and never pays for
    parsing it (half the time of an export).
    """

    seq: int
    """1, 2, 3 … in append order, with no gaps."""
    hash: str
    """Hex sha256 of ``prev``, a newline and the canonical JSON of ``{"event": …, "seq": …}``."""
    prev: str
    """The hash of event ``seq - 1``; ``GENESIS`` for event 1."""
    event: Event
    raw: str = field(default="", compare=False, repr=False)
    """The canonical JSON of ``event.to_dict()`` as stored, when the store read
    it (exports reuse it instead of encoding the event again); empty otherwise."""

    @classmethod
    def from_stored(cls, seq: int, hash: str, prev: str, raw: str) -> StoredEvent:
        """A stored event whose ``event`` is parsed from ``raw`` when first read
        (reading it then raises ``ValueError`` if ``raw`` is not an event)."""
        self = object.__new__(cls)
        _set(self, "seq", seq)
        _set(self, "hash", hash)
        _set(self, "prev", prev)
        _set(self, "raw", raw)
        return self

    if not TYPE_CHECKING:

        def __getattr__(self, name: str) -> Any:
            # Only called for a slot that was never set: ``event`` of an
            # instance made by ``from_stored``.
            if name != "event":
                raise AttributeError(f"'StoredEvent' object has no attribute {name!r}")
            try:
                event = event_from_dict(json.loads(self.raw))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"stored event {self.seq} is not a valid event ({exc!r})") from None
            _set(self, "event", event)
            return event

    def event_json(self) -> str:
        """The canonical JSON of the event (the stored text when known)."""
        return self.raw or canonical_json(self.event.to_dict())

    def to_json(self) -> str:
        """One canonical JSON object: ``{"event":{…},"hash":…,"prev":…,"seq":…}``.

        Built around the stored event text, so a reader can check the hash from
        the line alone (see the module docstring).
        """
        return (
            f'{{"event":{self.event_json()},"hash":{_json_string(self.hash)},'
            f'"prev":{_json_string(self.prev)},"seq":{self.seq}}}'
        )

    def to_dict(self) -> dict[str, Any]:
        """``{"seq", "hash", "prev", "event"}``, the event as ``Event.to_dict()``."""
        return {"seq": self.seq, "hash": self.hash, "prev": self.prev, "event": self.event.to_dict()}


@dataclass(frozen=True, slots=True)
class VerifyResult:
    """What a walk of the chain found."""

    ok: bool
    """True when every stored event is intact and in order."""
    checked: int
    """How many events were found intact (all of them when ``ok``)."""
    first_bad_seq: int | None
    """The first event that was altered, is missing or is out of order; None when ``ok``."""
    reason: str
    """One sentence: what is wrong with ``first_bad_seq`` (or that the chain is intact)."""
    last_hash: str = GENESIS
    """The hash of the last intact event: keep a copy elsewhere to detect later
    truncation or a rewritten chain."""
    anchor: str = ""
    """Empty when every expected head (``ChainVerifier(expect=…)``) is in the
    chain at its place; else one sentence on the first that is not: its event
    holds another hash (the chain was rewritten), or the record ends before it
    (events were cut off its end). Not set when the chain itself is broken
    before the expected event: ``reason`` says what is wrong then."""

    @property
    def anchored(self) -> bool:
        """The chain is intact and holds every expected head."""
        return self.ok and not self.anchor


class ChainVerifier:
    """Checks events one at a time, in ``seq`` order, in constant memory.

    ``check`` returns None while the chain holds, and the reason for the first
    event that breaks it; after that the verifier is done (``result()``).
    """

    __slots__ = ("_anchor", "_before", "_expect", "_expected", "_last_hash", "_problem")

    def __init__(self, expect: Mapping[int, str] | None = None) -> None:
        """
        Args:
            expect: heads kept from earlier (``seq`` to hash, such as ``stockade
                verify`` printed or the daemon published): the chain must hold
                each at its place, or ``result().anchor`` says why not.
        """
        self._expected = 1
        self._last_hash = GENESIS
        self._before = GENESIS
        self._problem: tuple[int, str] | None = None
        self._expect = dict(expect or {})
        self._anchor = ""

    @property
    def broken(self) -> bool:
        return self._problem is not None

    def check(self, seq: int, prev: str, stored_hash: str, event_json: bytes) -> str | None:
        """Check the next stored event; ``event_json`` is its stored JSON, as bytes."""
        if self._problem is not None:
            return self._problem[1]
        expected = self._expected
        if seq != expected:
            if seq > expected:
                gone = (
                    f"event {expected} is missing"
                    if seq == expected + 1
                    else (f"events {expected} to {seq - 1} are missing")
                )
                reason = f"{gone} (the next stored event is {seq})"
            else:
                reason = f"event {seq} is stored out of order (after event {expected - 1})"
            return self._fail(expected, reason)
        if prev != self._last_hash:
            before = "the genesis hash" if seq == 1 else f"the hash of event {seq - 1}"
            return self._fail(
                seq,
                f"event {seq} does not follow the event before it: its prev is not {before} "
                "(an event was removed, inserted or reordered here)",
            )
        if hash_payload(prev, seq, event_json) != stored_hash:
            return self._fail(seq, f"event {seq} was altered: its stored hash does not match its content")
        self._expected = seq + 1
        self._before, self._last_hash = self._last_hash, stored_hash
        if self._expect and not self._anchor:
            wanted = self._expect.get(seq)
            if wanted is not None and wanted != stored_hash:
                self._anchor = (
                    f"event {seq} has the hash {stored_hash}, not the expected {wanted}: "
                    "the chain was rewritten at or before that event"
                )
        return None

    def fail(self, seq: int, reason: str) -> None:
        """Mark the event just checked as bad for a reason found by other means
        (a store's own consistency checks): it no longer counts as intact."""
        if self._problem is not None:
            return
        if seq == self._expected - 1:
            self._expected, self._last_hash = seq, self._before
        self._fail(seq, reason)

    def _fail(self, seq: int, reason: str) -> str:
        self._problem = (seq, reason)
        return reason

    def result(self) -> VerifyResult:
        checked = self._expected - 1
        if self._problem is not None:
            seq, reason = self._problem
            # Only heads before the break were judged; those after it cannot be.
            return VerifyResult(False, checked, seq, reason, self._last_hash, self._anchor)
        anchor = self._anchor
        beyond = [seq for seq in self._expect if seq > checked]
        if not anchor and beyond:
            seq = min(beyond)
            anchor = (
                f"the record ends at event {checked}, before the expected event {seq} "
                f"(hash {self._expect[seq]}): events were cut off its end"
            )
        if checked == 0:
            return VerifyResult(True, 0, None, "the record is empty", GENESIS, anchor)
        return VerifyResult(
            True, checked, None, f"all {checked} events are intact and in order", self._last_hash, anchor
        )


def chain_rows(
    prepared: Sequence[tuple[Event, dict[str, Any], str, bytes]], seq: int, prev: str
) -> tuple[list[tuple[Any, ...]], list[StoredEvent]]:
    """Number and chain events checked and encoded by the store (event, its
    dict, its canonical JSON, that JSON in UTF-8) after event ``seq`` whose
    hash is ``prev``: their rows (the store's columns: seq, time, run, cell,
    kind, layer, outcome, json, prev, hash) and their stored events."""
    rows: list[tuple[Any, ...]] = []
    stored: list[StoredEvent] = []
    for event, d, raw, payload in prepared:
        seq += 1
        digest = hash_payload(prev, seq, payload)
        rows.append(
            (seq, d["time"], d["run"], d["cell"], d["kind"], d["layer"], d["outcome"], raw, prev, digest)
        )
        stored.append(StoredEvent(seq, digest, prev, event, raw))
        prev = digest
    return rows, stored
