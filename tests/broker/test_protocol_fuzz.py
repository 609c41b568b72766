"""Hypothesis against the protocol core.

Whatever bytes arrive, in whatever pieces, ``receive`` never raises and says
something about every complete frame; and every valid message, written by
``encode`` and cut anywhere, is read back exactly.
"""

from __future__ import annotations

import itertools
import json
import struct
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stockade.broker import (
    ERROR_CODES,
    MAX_DEPTH,
    MAX_ID,
    Connection,
    Failure,
    FrameDecoder,
    ProtocolViolation,
    Push,
    Request,
    Response,
    encode,
    parse_reply,
)
from stockade.errors import ProtocolError

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# JSON values the protocol carries: 64-bit integers, finite floats, any text
# (Hypothesis never makes lone surrogates), shallow enough for MAX_DEPTH.
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
params = st.dictionaries(st.text(max_size=12), json_values, max_size=5)
methods = st.from_regex(r"[a-z][a-z0-9_.]{0,63}", fullmatch=True)
requests = st.builds(Request, st.integers(1, MAX_ID), methods, params)

# Any JSON at all, including what the protocol refuses.
any_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30,
)


def cut(data: bytes, points: list[int]) -> list[bytes]:
    """``data`` cut at ``points`` (any integers; taken modulo its length)."""
    if not data:
        return [data]
    marks = sorted({p % len(data) for p in points} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(marks)]


def strict_json(body: bytes) -> bool:
    def refuse(word: str) -> None:
        raise ValueError(word)

    try:
        json.loads(body, parse_constant=refuse)
    except ValueError:
        return False
    return True


def depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


@SETTINGS
@given(st.lists(st.binary(max_size=64), max_size=20))
def test_arbitrary_bytes_never_raise(chunks: list[bytes]) -> None:
    conn = Connection(max_frame=256)
    for chunk in chunks:
        was_closed = conn.closed
        out = conn.receive(chunk)
        assert all(isinstance(o, Request | ProtocolViolation) for o in out)
        if was_closed:
            assert out == []
        for o in out:
            if isinstance(o, ProtocolViolation):
                assert o.code in ERROR_CODES and "; " in o.message


@SETTINGS
@given(st.lists(st.binary(max_size=300), max_size=10), st.lists(st.integers(), max_size=10))
def test_every_frame_gets_exactly_one_answer(bodies: list[bytes], points: list[int]) -> None:
    stream = b"".join(struct.pack(">I", len(b)) + b for b in bodies)
    conn = Connection()
    out = [o for piece in cut(stream, points) for o in conn.receive(piece)]
    assert len(out) == len(bodies)
    assert not conn.closed and conn.buffered == 0


@SETTINGS
@given(any_json)
def test_any_json_gets_one_answer(value: Any) -> None:
    try:
        body = json.dumps(value).encode()
    except ValueError:  # a lone surrogate cannot be UTF-8; not this test's business
        return
    (out,) = Connection().receive(struct.pack(">I", len(body)) + body)
    if isinstance(out, Request):
        assert isinstance(value, dict) and value.get("v") == 1 and depth(value) <= MAX_DEPTH


@SETTINGS
@given(st.builds(dict, v=st.just(1), id=st.integers(1, MAX_ID), method=methods, params=any_json))
def test_any_params_get_one_answer(message: dict[str, Any]) -> None:
    body = json.dumps(message).encode()
    (out,) = Connection().receive(struct.pack(">I", len(body)) + body)
    if isinstance(out, Request):
        assert out == Request(message["id"], message["method"], message["params"])
    elif not strict_json(body):  # NaN or Infinity: not JSON, so the id cannot be read
        assert (out.id, out.code) == (0, "bad_json")
    else:  # JSON, but params are not an object or break a limit: the id is known
        assert out.id == message["id"] and out.code in ("bad_json", "bad_request")


@SETTINGS
@given(st.lists(requests, min_size=1, max_size=5), st.lists(st.integers(), max_size=12))
def test_valid_requests_survive_any_cutting(reqs: list[Request], points: list[int]) -> None:
    stream = b"".join(encode({"v": 1, "id": r.id, "method": r.method, "params": r.params}) for r in reqs)
    conn = Connection()
    out = [o for piece in cut(stream, points) for o in conn.receive(piece)]
    assert out == reqs


replies = st.one_of(
    st.builds(Response, st.integers(0, MAX_ID), params),
    st.builds(Failure, st.integers(0, MAX_ID), st.sampled_from(ERROR_CODES), st.text(max_size=80)),
    st.builds(Push, st.integers(0, 2**31), params),
)


@SETTINGS
@given(st.lists(replies, min_size=1, max_size=5), st.lists(st.integers(), max_size=12))
def test_replies_survive_any_cutting(sent: list[Response | Failure | Push], points: list[int]) -> None:
    conn = Connection()
    frames = []
    for r in sent:
        if isinstance(r, Response):
            frames.append(conn.respond(r.id, r.result))
        elif isinstance(r, Failure):
            frames.append(conn.fail(r.id, r.code, r.message))  # type: ignore[arg-type]
        else:
            frames.append(conn.push(r.sub, r.event))
    decoder = FrameDecoder()
    got = [parse_reply(body) for piece in cut(b"".join(frames), points) for body in decoder.feed(piece)]
    assert got == sent


@SETTINGS
@given(st.binary(max_size=200))
def test_parse_reply_raises_only_protocol_error(body: bytes) -> None:
    try:
        assert isinstance(parse_reply(body), Response | Failure | Push)
    except ProtocolError as exc:
        assert str(exc).startswith("the daemon")
