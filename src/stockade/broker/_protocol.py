"""The wire protocol of the daemon's sockets, without I/O (docs/PROTOCOL.md).

Bytes in, requests out; replies in, bytes out. Nothing here reads or writes a
socket, so the daemon's server, the client and the tests drive the same code
(mitmproxy's sans-I/O core, h11's ``Connection``).

A frame is a 4-byte big-endian unsigned length, then that many bytes of UTF-8
JSON holding one object. Every message carries ``"v": 1``::

    request   {"v":1, "id":7, "method":"run.stop", "params":{"run":"r-…"}}
    response  {"v":1, "id":7, "ok":true,  "result":{…}}
              {"v":1, "id":7, "ok":false, "error":{"code":"not_found", "message":"…"}}
    push      {"v":1, "push":"event", "sub":1, "event":{…}}

``Connection`` is the daemon's side: ``receive`` never raises; whatever a peer
sends becomes a ``Request`` or a ``ProtocolViolation`` (one clear sentence and
an error code), and a violation that breaks the framing also closes the
connection. ``parse_reply`` is the client's side, and raises ``ProtocolError``.

JSON is parsed and written by pydantic-core (``from_json``/``to_json``): about
three times faster than the standard library's json here, it refuses lone
surrogates, ``NaN`` and ``Infinity`` itself, and it never recurses past 200
levels. On top of it, the limits a message must keep: nesting at most
``MAX_DEPTH`` levels, integers within 64 bits, finite floats.
"""

from __future__ import annotations

import codecs
import re
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, get_args

from pydantic_core import from_json, to_json

from stockade.errors import ProtocolError

VERSION: Final = 1
"""The protocol version every message carries as ``v``; anything else is refused."""

MAX_FRAME: Final = 1 << 20
"""The default limit on a frame's body, in bytes (1 MiB); configurable per connection."""

MAX_DEPTH: Final = 32
"""The deepest a message may nest objects and arrays; the message itself is level 1."""

MAX_ID: Final = 2**53 - 1
"""The largest request id: the largest integer every JSON implementation holds exactly."""

MAX_METHOD: Final = 64
"""The longest method name, in characters."""

ErrorCode = Literal[
    "bad_frame",
    "too_large",
    "bad_json",
    "bad_request",
    "unknown_method",
    "bad_params",
    "unauthorized",
    "denied",
    "not_found",
    "conflict",
    "internal",
    "unavailable",
]
"""Why a request failed; docs/PROTOCOL.md says when each is sent. The first four
come from this module, the rest from the daemon."""

ERROR_CODES: Final[tuple[ErrorCode, ...]] = get_args(ErrorCode)

_LENGTH = struct.Struct(">I")
_METHOD = re.compile(r"[a-z][a-z0-9_.]*\Z")
_REQUEST_KEYS: Final = frozenset(("v", "id", "method", "params"))
_INT_MIN: Final = -(2**63)
_INT_MAX: Final = 2**63 - 1
_INFINITIES: Final = (float("inf"), float("-inf"))
_ABSENT: Final = object()
_EXAMPLE: Final = '{"v": 1, "id": 1, "method": "status", "params": {}}'


@dataclass(frozen=True, slots=True)
class Request:
    """A well-formed request: the daemon still checks that it knows ``method``
    and that ``params`` suit it."""

    id: int
    method: str
    params: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ProtocolViolation:
    """What a peer sent that is not a well-formed request, to answer with
    ``Connection.fail(id, code, message)``. ``id`` is the request's id when it
    could be read, else 0."""

    id: int
    code: ErrorCode
    message: str


@dataclass(frozen=True, slots=True)
class Response:
    """A successful reply, as the client reads it."""

    id: int
    result: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Failure:
    """An error reply, as the client reads it. ``code`` is kept as sent: a newer
    daemon may send a code this module does not list."""

    id: int
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class Push:
    """An event the daemon sends on a subscription, unasked."""

    sub: int
    event: dict[str, Any]


class _Refused(Exception):
    """A message broke a rule: ``problem`` says how, ``fix`` what to send instead."""

    def __init__(self, code: ErrorCode, problem: str, fix: str, id: int = 0) -> None:
        super().__init__(problem)
        self.code = code
        self.problem = problem
        self.fix = fix
        self.id = id

    @property
    def message(self) -> str:
        return f"{self.problem}; {self.fix}"


def _kind(value: object) -> str:
    """The JSON name of a value's type, with its article."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    return "a number"


def _show(value: object) -> str:
    """A short rendering of an offending value: never the whole of a large one."""
    if isinstance(value, str):
        return repr(value[:40]) + ("…" if len(value) > 40 else "")
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        text = str(value)
        return text if len(text) <= 24 else f"{text[:20]}… ({len(text)} digits)"
    return _kind(value)


# --- encoding -------------------------------------------------------------------------


def _to_json(message: Mapping[str, Any]) -> bytes:
    try:
        body = to_json(message)
    except (ValueError, RecursionError) as exc:
        raise _Refused(
            "internal",
            f"the message cannot be written as JSON ({exc})",
            "send only str, int, float, bool, None, lists and dicts",
        ) from exc
    # to_json writes NaN and Infinity as bare words, which no JSON parser takes:
    # when one of them may be there (the word can also be inside a string),
    # parse the output back to tell which.
    if b"NaN" in body or b"Infinity" in body:
        try:
            from_json(body, allow_inf_nan=False)
        except ValueError:
            raise _Refused(
                "internal",
                "the message holds NaN or Infinity, which JSON cannot carry",
                "send null or a string",
            ) from None
    return body


def encode(message: Mapping[str, Any], *, max_frame: int = MAX_FRAME) -> bytes:
    """One frame holding ``message``: its length, then its JSON in UTF-8.

    The message is written as given (pydantic-core serialises it: tuples and
    sets become arrays); this does not check that it is a valid request or reply.

    Raises:
        ProtocolError: the message cannot be written as JSON (an unknown type, a
            lone surrogate, NaN or Infinity, a cycle), or its JSON is longer than
            ``max_frame`` bytes.
    """
    try:
        body = _to_json(message)
    except _Refused as exc:
        raise ProtocolError(exc.message) from exc.__cause__
    if len(body) > max_frame:
        raise ProtocolError(
            f"the message is {len(body)} bytes, over the frame limit of {max_frame}; send less"
        )
    return _LENGTH.pack(len(body)) + body


# --- framing --------------------------------------------------------------------------


class FrameDecoder:
    """Splits a byte stream into frame bodies; no I/O, no JSON.

    ``feed`` takes bytes as they arrive, in pieces of any size, and returns the
    bodies of the frames they complete. A length prefix over ``max_frame``
    stops it: its body is not buffered, ``oversized`` holds the length, and
    every later ``feed`` returns nothing, since the stream cannot be resynced.
    """

    def __init__(self, *, max_frame: int = MAX_FRAME) -> None:
        self.max_frame = max_frame
        self.oversized: int | None = None
        self._buffer = bytearray()

    @property
    def buffered(self) -> int:
        """How many bytes of an incomplete frame are held: nonzero at the end of
        the stream means the peer stopped in the middle of a frame."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[bytes]:
        if self.oversized is not None:
            return []
        buffer = self._buffer
        if not buffer and len(data) >= 4 and _LENGTH.unpack_from(data)[0] == len(data) - 4 <= self.max_frame:
            return [data[4:]]  # the common case: one read, one whole frame
        if buffer:
            buffer += data
            view: bytes | bytearray = buffer
        else:
            view = data
        frames: list[bytes] = []
        pos, end = 0, len(view)
        while end - pos >= 4:
            (length,) = _LENGTH.unpack_from(view, pos)
            if length > self.max_frame:
                self.oversized = length
                self._buffer = bytearray()
                return frames
            if end - pos - 4 < length:
                break
            frames.append(bytes(view[pos + 4 : pos + 4 + length]))
            pos += 4 + length
        if buffer:
            del buffer[:pos]
        elif pos < end:
            buffer += view[pos:]
        return frames


def _too_large_message(length: int, limit: int) -> str:
    prefix = length.to_bytes(4, "big")
    if all(0x20 <= byte < 0x7F for byte in prefix):
        # b"GET " or b'{"v"': someone sent text (HTTP, bare JSON) to a framed socket.
        return (
            f"the frame length {length} (the bytes {prefix.decode()!r}) is over the limit of {limit} bytes,"
            " and looks like text; this socket speaks length-prefixed JSON: start each message"
            " with its length as 4 big-endian bytes (docs/PROTOCOL.md)"
        )
    return (
        f"the frame length {length} is over the limit of {limit} bytes; send smaller messages,"
        " and start each with its length as 4 big-endian bytes"
    )


# --- JSON -----------------------------------------------------------------------------

_FIX_JSON: Final = "send one JSON object per frame, in UTF-8"
_FIX_DEPTH: Final = "flatten the params"
_FIX_NUMBER: Final = "send the number as a string"


def _too_deep() -> _Refused:
    return _Refused("bad_json", f"the JSON nests deeper than {MAX_DEPTH} levels", _FIX_DEPTH)


def _load(body: bytes) -> object:
    """The JSON value of a frame body; its limits are ``_check_tree``'s.

    Raises:
        _Refused: with code ``bad_frame`` or ``bad_json``.
    """
    if not body:
        raise _Refused("bad_frame", "the frame is empty (length 0)", "every frame holds one JSON object")
    try:
        return from_json(body, allow_inf_nan=False)
    except ValueError as exc:
        raise _json_error(body, str(exc)) from None


def _json_error(body: bytes, reason: str) -> _Refused:
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return _Refused(
            "bad_json",
            f"the frame is not UTF-8 (byte 0x{body[exc.start]:02x} at offset {exc.start})",
            "encode the JSON as UTF-8",
        )
    if body.startswith(codecs.BOM_UTF8):
        return _Refused("bad_json", "the frame starts with a byte order mark", "send the JSON without one")
    if reason.startswith("recursion limit exceeded"):
        return _too_deep()
    if reason.startswith("number out of range"):
        return _Refused(
            "bad_json", f"a number is too large ({reason}), over 64 bits", "send the number as a string"
        )
    if "surrogate" in reason or "hex escape" in reason:
        return _Refused(
            "bad_json",
            f"the frame holds a broken \\u escape ({reason})",
            "write a character beyond U+FFFF as a surrogate pair, or as plain UTF-8",
        )
    if reason.startswith(("expected value", "invalid number")) and (b"NaN" in body or b"Infinity" in body):
        return _Refused(
            "bad_json", f"the frame is not valid JSON ({reason}): NaN and Infinity are not JSON", "send null"
        )
    return _Refused("bad_json", f"the frame is not valid JSON ({reason})", _FIX_JSON)


def _check_tree(root: dict[str, Any] | list[Any], depth: int) -> None:
    """Refuse nesting deeper than ``MAX_DEPTH``, integers beyond 64 bits and
    infinite floats (``1e400`` parses as ``inf``) in ``root``, which sits at
    level ``depth``. Level by level, without recursion; pydantic-core has
    already refused anything deeper than 200 levels."""
    level: list[dict[str, Any] | list[Any]] = [root]
    while level:
        below: list[dict[str, Any] | list[Any]] = []
        for node in level:
            children: Iterable[Any] = node.values() if type(node) is dict else node
            for value in children:
                kind = type(value)
                if kind is str:
                    continue
                if kind is dict or kind is list:
                    below.append(value)
                elif kind is int:
                    if not _INT_MIN <= value <= _INT_MAX:
                        raise _Refused(
                            "bad_json", f"the integer {_show(value)} is outside the 64-bit range", _FIX_NUMBER
                        )
                elif kind is float and value in _INFINITIES:
                    raise _Refused("bad_json", "a number overflows a 64-bit float", _FIX_NUMBER)
        if below and depth >= MAX_DEPTH:
            raise _too_deep()
        level = below
        depth += 1


# --- requests (the daemon's side) -----------------------------------------------------


def _request(body: bytes) -> Request:
    """The request in a frame body.

    Raises:
        _Refused: the body is not a well-formed request.
    """
    msg = _load(body)
    if type(msg) is not dict:
        raise _Refused(
            "bad_request",
            f"the frame holds {_kind(msg)}, not an object",
            f"send a request such as {_EXAMPLE}",
        )
    # The id comes first, so that even a refusal names the request it answers.
    rid = msg.get("id", _ABSENT)
    reply_id = rid if type(rid) is int and 1 <= rid <= MAX_ID else 0

    v = msg.get("v", _ABSENT)
    if type(v) is not int or v != VERSION:
        if v is _ABSENT:
            raise _Refused("bad_request", "the request has no version", 'add "v": 1', reply_id)
        if type(v) is int:
            raise _Refused(
                "bad_request",
                f"the request is protocol version {_show(v)}, and this daemon speaks version {VERSION}",
                "use a stockade client of the same version as the daemon",
                reply_id,
            )
        raise _Refused("bad_request", f"the version {_show(v)} is not an integer", 'send "v": 1', reply_id)
    if not reply_id:
        if rid is _ABSENT:
            raise _Refused("bad_request", "the request has no id", 'add "id": 1, then 2, 3… for the next')
        raise _Refused(
            "bad_request",
            f"the id {_show(rid)} is not an integer from 1 to {MAX_ID}",
            "number requests 1, 2, 3…",
        )
    if not msg.keys() <= _REQUEST_KEYS:
        extra = sorted(msg.keys() - _REQUEST_KEYS)
        names = ", ".join(_show(key) for key in extra[:3]) + (", …" if len(extra) > 3 else "")
        raise _Refused(
            "bad_request",
            f"the request has {'an unknown key' if len(extra) == 1 else 'unknown keys'} {names}",
            "a request holds only v, id, method and params",
            reply_id,
        )
    method = msg.get("method", _ABSENT)
    if type(method) is not str or len(method) > MAX_METHOD or _METHOD.match(method) is None:
        if method is _ABSENT:
            raise _Refused(
                "bad_request", "the request has no method", 'add "method", such as "status"', reply_id
            )
        if type(method) is str:
            what = f"the method name {_show(method)} is not a valid name"
        else:
            what = f"the method {_show(method)} is {_kind(method)}"
        raise _Refused(
            "bad_request",
            what,
            f"name a method in lowercase letters, digits, '_' and '.', starting with a letter"
            f" and at most {MAX_METHOD} characters, such as 'run.start'",
            reply_id,
        )
    params = msg.get("params", _ABSENT)
    if params is _ABSENT:
        params = {}
    elif type(params) is not dict:
        raise _Refused(
            "bad_request",
            f"the params are {_kind(params)}, not an object",
            'send named params, such as {"run": "r-0123456789ab"}, or {}',
            reply_id,
        )
    elif params:
        try:
            _check_tree(params, 2)
        except _Refused as exc:
            exc.id = reply_id
            raise
    return Request(reply_id, method, params)


class Connection:
    """The daemon's side of one connection; no I/O.

    Feed ``receive`` the bytes read from the socket, and write what
    ``respond``, ``fail`` and ``push`` return. Answer each violation with
    ``fail(v.id, v.code, v.message)``; when ``closed`` turns true, send that
    answer and close the socket: the stream cannot be read further.
    """

    def __init__(self, *, max_frame: int = MAX_FRAME) -> None:
        self.max_frame = max_frame
        self.closed = False
        self._decoder = FrameDecoder(max_frame=max_frame)

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete frame held; nonzero at EOF means the peer
        stopped in the middle of a frame."""
        return self._decoder.buffered

    def receive(self, data: bytes) -> list[Request | ProtocolViolation]:
        """The requests and violations in ``data`` and what came before it, in
        order. Never raises; returns nothing once ``closed``."""
        if self.closed:
            return []
        out: list[Request | ProtocolViolation] = []
        for body in self._decoder.feed(data):
            try:
                out.append(_request(body))
            except _Refused as exc:
                out.append(ProtocolViolation(exc.id, exc.code, exc.message))
        if self._decoder.oversized is not None:
            self.closed = True
            out.append(
                ProtocolViolation(0, "too_large", _too_large_message(self._decoder.oversized, self.max_frame))
            )
        return out

    def respond(self, request_id: int, result: Mapping[str, Any]) -> bytes:
        """The frame answering request ``request_id`` with ``result``. A result
        over the frame limit is answered with a ``too_large`` error instead.

        Raises:
            ProtocolError: the result cannot be written as JSON (a bug in the caller).
        """
        try:
            body = _to_json({"v": VERSION, "id": request_id, "ok": True, "result": result})
        except _Refused as exc:
            raise ProtocolError(exc.message) from exc.__cause__
        if len(body) > self.max_frame:
            return self.fail(
                request_id,
                "too_large",
                f"the result is {len(body)} bytes, over the frame limit of {self.max_frame};"
                " ask for less (a smaller tail, a narrower filter)",
            )
        return _LENGTH.pack(len(body)) + body

    def fail(self, request_id: int, code: ErrorCode, message: str) -> bytes:
        """The frame refusing request ``request_id`` (0 when it is unknown).
        ``message`` is one sentence: what went wrong, then the fix.

        The frame is not held to the frame limit: an error always goes out.

        Raises:
            ProtocolError: the message cannot be written (a lone surrogate).
        """
        try:
            body = _to_json(
                {"v": VERSION, "id": request_id, "ok": False, "error": {"code": code, "message": message}}
            )
        except _Refused as exc:
            raise ProtocolError(exc.message) from exc.__cause__
        return _LENGTH.pack(len(body)) + body

    def push_json(self, sub: int, event_json: str) -> bytes:
        """The frame pushing a stored event to subscription ``sub``, around
        ``event_json``, its JSON text as the store made it
        (``StoredEvent.to_json``: valid JSON, never NaN), which is not encoded again.

        Raises:
            ProtocolError: the frame would be over the frame limit.
        """
        body = b'{"v":%d,"push":"event","sub":%d,"event":%s}' % (VERSION, sub, event_json.encode("utf-8"))
        if len(body) > self.max_frame:
            raise ProtocolError(
                f"the pushed event is {len(body)} bytes, over the frame limit of {self.max_frame}"
            )
        return _LENGTH.pack(len(body)) + body

    def push(self, sub: int, event: Mapping[str, Any]) -> bytes:
        """The frame pushing ``event`` to subscription ``sub``.

        Raises:
            ProtocolError: the event cannot be written as JSON, or is over the frame limit.
        """
        return encode({"v": VERSION, "push": "event", "sub": sub, "event": event}, max_frame=self.max_frame)


# --- replies (the client's side) ------------------------------------------------------

_FIX_REPLY: Final = "check that the daemon and this client are the same stockade version"


def parse_reply(body: bytes) -> Response | Failure | Push:
    """The reply or push in a frame body from the daemon.

    Keys this version does not know are ignored, so that a daemon may add one
    to a v1 reply without breaking older clients.

    Raises:
        ProtocolError: the body is not a well-formed reply or push.
    """
    try:
        msg = _load(body)
    except _Refused as exc:
        raise ProtocolError(f"the daemon sent a malformed reply: {exc.problem}; {_FIX_REPLY}") from None
    if type(msg) is not dict:
        raise _malformed(f"it is {_kind(msg)}, not an object")
    try:
        _check_tree(msg, 1)
    except _Refused as exc:
        raise _malformed(exc.problem) from None
    v = msg.get("v")
    if type(v) is not int or v != VERSION:
        raise ProtocolError(
            f"the daemon speaks protocol version {_show(v)}, and this client version {VERSION};"
            " use a stockade client of the same version as the daemon"
        )
    if "push" in msg:
        sub, event = msg.get("sub"), msg.get("event")
        if msg["push"] != "event":
            raise _malformed(f"the push kind {_show(msg['push'])} is unknown")
        if type(sub) is not int or type(event) is not dict:
            raise _malformed("a push needs an integer sub and an object event")
        return Push(sub, event)
    rid, ok = msg.get("id"), msg.get("ok")
    if type(rid) is not int or rid < 0:
        raise _malformed(f"the id {_show(rid)} is not an integer")
    if ok is True:
        result = msg.get("result")
        if type(result) is not dict:
            raise _malformed(f"the result is {_kind(result)}, not an object")
        return Response(rid, result)
    if ok is False:
        error = msg.get("error")
        if type(error) is dict and type(error.get("code")) is str and type(error.get("message")) is str:
            return Failure(rid, error["code"], error["message"])
        raise _malformed("an error reply needs an error object with a string code and message")
    raise _malformed(f"ok is {_show(ok)}, not true or false")


def _malformed(problem: str) -> ProtocolError:
    return ProtocolError(f"the daemon sent a malformed reply: {problem}; {_FIX_REPLY}")


__all__ = [
    "ERROR_CODES",
    "MAX_DEPTH",
    "MAX_FRAME",
    "MAX_ID",
    "MAX_METHOD",
    "VERSION",
    "Connection",
    "ErrorCode",
    "Failure",
    "FrameDecoder",
    "ProtocolViolation",
    "Push",
    "Request",
    "Response",
    "encode",
    "parse_reply",
]
