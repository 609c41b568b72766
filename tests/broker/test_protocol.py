"""Playbooks for the protocol core: bytes in, requests and violations out; no sockets.

A playbook is a list of steps, each the bytes of one read and what
``Connection.receive`` must return for them, and whether the connection ends
closed. Then the other direction: what ``respond``, ``fail`` and ``push`` write,
byte for byte, and what ``parse_reply`` makes of replies, good and bad.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

import pytest

from stockade.broker import (
    ERROR_CODES,
    MAX_DEPTH,
    MAX_FRAME,
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


def frame(body: bytes | object) -> bytes:
    """A frame around raw bytes, or around the JSON of anything else."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return struct.pack(">I", len(data)) + data


def req(id: int = 1, method: str = "status", **params: Any) -> dict[str, Any]:
    return {"v": 1, "id": id, "method": method, "params": params}


def nested(levels: int) -> dict[str, Any]:
    """A request whose JSON nests ``levels`` deep, the request itself counted."""
    inner: Any = 1
    for _ in range(levels - 2):  # the request is level 1, params level 2
        inner = {"a": inner}
    return req(7, "x", **({"a": inner} if levels > 2 else {}))


@dataclass(frozen=True)
class V:
    """An expected violation: its code, a fragment of its message, its id."""

    code: str
    fragment: str
    id: int = 0


Expected = Request | V
Step = tuple[bytes, list[Expected]]

PAD = MAX_FRAME - len(b'{"v":1,"id":1,"method":"a","params":{"s":""}}')
AT_LIMIT = b'{"v":1,"id":1,"method":"a","params":{"s":"' + b"x" * PAD + b'"}}'
HUGE = b'{"v":1,"id":5,"method":"a","params":{"n":' + b"1" * 5000 + b"}}"

# (name, steps, closed at the end)
PLAYBOOKS: list[tuple[str, list[Step], bool]] = [
    # --- framing
    ("one-request", [(frame(req()), [Request(1, "status", {})])], False),
    (
        "params-absent-means-empty",
        [(frame({"v": 1, "id": 3, "method": "run.list"}), [Request(3, "run.list", {})])],
        False,
    ),
    (
        "two-frames-one-read",
        [
            (
                frame(req(1)) + frame(req(2, "run.stop", run="r-1")),
                [Request(1, "status", {}), Request(2, "run.stop", {"run": "r-1"})],
            )
        ],
        False,
    ),
    (
        "hundred-frames-one-read",
        [(b"".join(frame(req(i)) for i in range(1, 101)), [Request(i, "status", {}) for i in range(1, 101)])],
        False,
    ),
    (
        "byte-by-byte",
        [(bytes([b]), []) for b in frame(req(9))[:-1]] + [(frame(req(9))[-1:], [Request(9, "status", {})])],
        False,
    ),
    (
        "prefix-split-then-body-in-two",
        [
            (frame(req(4))[:2], []),
            (frame(req(4))[2:10], []),
            (frame(req(4))[10:], [Request(4, "status", {})]),
        ],
        False,
    ),
    (
        "a-frame-and-half-of-the-next",
        [
            (frame(req(1)) + frame(req(2))[:7], [Request(1, "status", {})]),
            (frame(req(2))[7:] + frame(req(3)), [Request(2, "status", {}), Request(3, "status", {})]),
        ],
        False,
    ),
    ("empty-read", [(b"", [])], False),
    (
        "empty-frame-is-refused-and-the-stream-goes-on",
        [
            (
                frame(b"") + frame(req(2)),
                [V("bad_frame", "the frame is empty (length 0)"), Request(2, "status", {})],
            )
        ],
        False,
    ),
    (
        "too-large-closes",
        [
            (
                struct.pack(">I", MAX_FRAME + 1),
                [V("too_large", f"the frame length {MAX_FRAME + 1} is over the limit of {MAX_FRAME} bytes")],
            )
        ],
        True,
    ),
    (
        "frames-before-the-too-large-one-still-come-out",
        [
            (
                frame(req(1)) + struct.pack(">I", 2**32 - 1) + b"x" * 100,
                [Request(1, "status", {}), V("too_large", "4294967295")],
            )
        ],
        True,
    ),
    (
        "nothing-after-closing",
        [(struct.pack(">I", 2**31), [V("too_large", "over the limit")]), (frame(req(2)), [])],
        True,
    ),
    (
        "http-is-named",
        [(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", [V("too_large", "(the bytes 'GET ') is over the limit")])],
        True,
    ),
    (
        "bare-json-is-named",
        [
            (
                json.dumps(req()).encode(),
                [V("too_large", "looks like text; this socket speaks length-prefixed JSON")],
            )
        ],
        True,
    ),
    ("exactly-the-limit-is-fine", [(frame(AT_LIMIT), [Request(1, "a", {"s": "x" * PAD})])], False),
    ("one-over-the-limit-is-refused", [(frame(AT_LIMIT + b" "), [V("too_large", "1048577")])], True),
    # --- JSON
    (
        "not-utf8",
        [(frame(b'{"v":1,"id":1,"method":"\xff"}'), [V("bad_json", "not UTF-8 (byte 0xff at offset 24)")])],
        False,
    ),
    (
        "utf8-overlong",
        [(frame(b'{"a":"\xc0\xaf"}'), [V("bad_json", "not UTF-8 (byte 0xc0 at offset 6)")])],
        False,
    ),
    (
        "utf8-encoded-surrogate",
        [(frame(b'{"a":"\xed\xa0\x80"}'), [V("bad_json", "not UTF-8 (byte 0xed")])],
        False,
    ),
    (
        "byte-order-mark",
        [(frame(b"\xef\xbb\xbf" + json.dumps(req()).encode()), [V("bad_json", "byte order mark")])],
        False,
    ),
    (
        "not-json",
        [(frame(b"{]"), [V("bad_json", "the frame is not valid JSON (key must be a string")])],
        False,
    ),
    (
        "trailing-garbage",
        [(frame(json.dumps(req()).encode() + b" x"), [V("bad_json", "trailing characters")])],
        False,
    ),
    ("two-objects-one-frame", [(frame(b"{}{}"), [V("bad_json", "trailing characters")])], False),
    ("whitespace-only", [(frame(b"   "), [V("bad_json", "EOF while parsing")])], False),
    ("raw-control-character", [(frame(b'{"a":"x\x01"}'), [V("bad_json", "control character")])], False),
    ("lone-high-surrogate", [(frame(b'{"a":"\\ud800"}'), [V("bad_json", "broken \\u escape")])], False),
    ("lone-low-surrogate", [(frame(b'{"a":"\\udc00"}'), [V("bad_json", "broken \\u escape")])], False),
    (
        "surrogate-pair-is-fine",
        [
            (
                frame(b'{"v":1,"id":1,"method":"a","params":{"s":"\\ud83d\\ude00 \\u0000"}}'),
                [Request(1, "a", {"s": "\U0001f600 \x00"})],
            )
        ],
        False,
    ),
    (
        "nan",
        [
            (
                frame(b'{"v":1,"id":1,"method":"a","params":{"n":NaN}}'),
                [V("bad_json", "NaN and Infinity are not JSON")],
            )
        ],
        False,
    ),
    (
        "infinity",
        [
            (
                frame(b'{"v":1,"id":1,"method":"a","params":{"n":-Infinity}}'),
                [V("bad_json", "NaN and Infinity are not JSON")],
            )
        ],
        False,
    ),
    (
        "float-overflow",
        [
            (
                frame(b'{"v":1,"id":8,"method":"a","params":{"n":[1e309]}}'),
                [V("bad_json", "overflows a 64-bit float", 8)],
            )
        ],
        False,
    ),
    (
        "negative-float-overflow",
        [
            (
                frame(b'{"v":1,"id":8,"method":"a","params":{"n":-1e400}}'),
                [V("bad_json", "overflows a 64-bit float", 8)],
            )
        ],
        False,
    ),
    (
        "float-limits-are-fine",
        [
            (
                frame(
                    b'{"v":1,"id":1,"method":"a","params":{"a":1.7976931348623157e308,"b":1e-400,"c":-0.0}}'
                ),
                [Request(1, "a", {"a": 1.7976931348623157e308, "b": 0.0, "c": -0.0})],
            )
        ],
        False,
    ),
    (
        "int-over-64-bits",
        [
            (
                frame(req(2, "a", n=2**63)),
                [V("bad_json", "the integer 9223372036854775808 is outside the 64-bit range", 2)],
            )
        ],
        False,
    ),
    (
        "int-under-64-bits",
        [(frame(req(2, "a", n={"m": -(2**63) - 1})), [V("bad_json", "outside the 64-bit range", 2)])],
        False,
    ),
    ("int-of-5000-digits", [(frame(HUGE), [V("bad_json", "a number is too large")])], False),
    (
        "int-limits-are-fine",
        [(frame(req(1, "a", n=[2**63 - 1, -(2**63)])), [Request(1, "a", {"n": [2**63 - 1, -(2**63)]})])],
        False,
    ),
    (
        f"nesting-{MAX_DEPTH}-is-fine",
        [(frame(nested(MAX_DEPTH)), [Request(7, "x", nested(MAX_DEPTH)["params"])])],
        False,
    ),
    (
        f"nesting-{MAX_DEPTH + 1}-is-refused",
        [
            (
                frame(nested(MAX_DEPTH + 1)),
                [V("bad_json", "nests deeper than 32 levels; flatten the params", 7)],
            )
        ],
        False,
    ),
    (
        "nesting-in-arrays",
        [
            (
                frame(req(3, "a", n=[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]])),
                [V("bad_json", "nests deeper", 3)],
            )
        ],
        False,
    ),
    (
        "nesting-200",
        [
            (
                frame(b'{"v":1,"id":2,"method":"a","params":' + b'{"a":' * 199 + b"1" + b"}" * 200),
                [V("bad_json", "nests deeper than 32 levels", 2)],
            )
        ],
        False,
    ),
    (
        "nesting-half-a-million",
        [(frame(b"[" * 500_000 + b"]" * 500_000), [V("bad_json", "nests deeper than 32 levels")])],
        False,
    ),
    # --- the envelope
    (
        "array",
        [
            (
                frame([1, 2]),
                [V("bad_request", "the frame holds an array, not an object; send a request such as")],
            )
        ],
        False,
    ),
    ("string", [(frame("status"), [V("bad_request", "the frame holds a string, not an object")])], False),
    ("null", [(frame(None), [V("bad_request", "the frame holds null, not an object")])], False),
    ("number", [(frame(3), [V("bad_request", "the frame holds a number, not an object")])], False),
    (
        "no-version",
        [
            (
                frame({"id": 4, "method": "status"}),
                [V("bad_request", 'the request has no version; add "v": 1', 4)],
            )
        ],
        False,
    ),
    (
        "version-2",
        [
            (
                frame({"v": 2, "id": 4, "method": "status", "params": {}, "new": 1}),
                [
                    V(
                        "bad_request",
                        "the request is protocol version 2, and this daemon speaks version 1;"
                        " use a stockade client of the same version",
                        4,
                    )
                ],
            )
        ],
        False,
    ),
    (
        "version-0",
        [(frame({"v": 0, "id": 4, "method": "status"}), [V("bad_request", "protocol version 0", 4)])],
        False,
    ),
    (
        "version-string",
        [
            (
                frame({"v": "1", "id": 4, "method": "status"}),
                [V("bad_request", "the version '1' is not an integer", 4)],
            )
        ],
        False,
    ),
    (
        "version-true",
        [
            (
                frame({"v": True, "id": 4, "method": "status"}),
                [V("bad_request", "the version true is not an integer", 4)],
            )
        ],
        False,
    ),
    (
        "version-float",
        [
            (
                frame({"v": 1.0, "id": 4, "method": "status"}),
                [V("bad_request", "the version 1.0 is not an integer", 4)],
            )
        ],
        False,
    ),
    ("no-id", [(frame({"v": 1, "method": "status"}), [V("bad_request", "the request has no id")])], False),
    (
        "id-0",
        [(frame(req(0)), [V("bad_request", "the id 0 is not an integer from 1 to 9007199254740991")])],
        False,
    ),
    ("id-negative", [(frame(req(-1)), [V("bad_request", "the id -1 is not")])], False),
    (
        "id-string",
        [(frame({"v": 1, "id": "1", "method": "status"}), [V("bad_request", "the id '1' is not")])],
        False,
    ),
    (
        "id-float",
        [(frame({"v": 1, "id": 1.0, "method": "status"}), [V("bad_request", "the id 1.0 is not")])],
        False,
    ),
    (
        "id-true",
        [(frame({"v": 1, "id": True, "method": "status"}), [V("bad_request", "the id true is not")])],
        False,
    ),
    (
        "id-null",
        [(frame({"v": 1, "id": None, "method": "status"}), [V("bad_request", "the id null is not")])],
        False,
    ),
    ("id-over-2-53", [(frame(req(MAX_ID + 1)), [V("bad_request", "the id 9007199254740992 is not")])], False),
    ("id-2-53-minus-1-is-fine", [(frame(req(MAX_ID)), [Request(MAX_ID, "status", {})])], False),
    (
        "unknown-key",
        [
            (
                frame({**req(5), "parmas": {}}),
                [
                    V(
                        "bad_request",
                        "the request has an unknown key 'parmas';"
                        " a request holds only v, id, method and params",
                        5,
                    )
                ],
            )
        ],
        False,
    ),
    (
        "unknown-keys",
        [
            (
                frame({**req(5), "ok": True, "result": {}}),
                [V("bad_request", "unknown keys 'ok', 'result';", 5)],
            )
        ],
        False,
    ),
    (
        "many-unknown-keys",
        [
            (
                frame({**req(5), "a": 1, "b": 2, "c": 3, "d": 4}),
                [V("bad_request", "unknown keys 'a', 'b', 'c', …;", 5)],
            )
        ],
        False,
    ),
    ("no-method", [(frame({"v": 1, "id": 6}), [V("bad_request", "the request has no method", 6)])], False),
    (
        "method-number",
        [(frame({"v": 1, "id": 6, "method": 5}), [V("bad_request", "the method 5 is a number", 6)])],
        False,
    ),
    (
        "method-object",
        [
            (
                frame({"v": 1, "id": 6, "method": {}}),
                [V("bad_request", "the method an object is an object", 6)],
            )
        ],
        False,
    ),
    (
        "method-empty",
        [(frame(req(6, "")), [V("bad_request", "the method name '' is not a valid name", 6)])],
        False,
    ),
    (
        "method-capital",
        [
            (
                frame(req(6, "Run.start")),
                [V("bad_request", "'Run.start' is not a valid name; name a method in lowercase", 6)],
            )
        ],
        False,
    ),
    ("method-digit-first", [(frame(req(6, "1run")), [V("bad_request", "'1run'", 6)])], False),
    ("method-dash", [(frame(req(6, "run-start")), [V("bad_request", "'run-start'", 6)])], False),
    ("method-space", [(frame(req(6, "run start")), [V("bad_request", "'run start'", 6)])], False),
    ("method-newline", [(frame(req(6, "run\n")), [V("bad_request", "'run\\n'", 6)])], False),
    ("method-unicode", [(frame(req(6, "rün")), [V("bad_request", "'rün'", 6)])], False),
    (
        "method-65",
        [
            (
                frame(req(6, "a" * 65)),
                [V("bad_request", "'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa'… is not a valid name", 6)],
            )
        ],
        False,
    ),
    ("method-64-is-fine", [(frame(req(6, "a" * 64)), [Request(6, "a" * 64, {})])], False),
    (
        "method-names-that-are-fine",
        [
            (
                b"".join(
                    frame(req(i, m))
                    for i, m in enumerate(["a", "run.start", "approvals.decide", "a_b.c9", "x.."], 1)
                ),
                [
                    Request(i, m, {})
                    for i, m in enumerate(["a", "run.start", "approvals.decide", "a_b.c9", "x.."], 1)
                ],
            )
        ],
        False,
    ),
    (
        "params-array",
        [
            (
                frame({**req(8), "params": [1]}),
                [V("bad_request", "the params are an array, not an object; send named params", 8)],
            )
        ],
        False,
    ),
    (
        "params-string",
        [(frame({**req(8), "params": "x"}), [V("bad_request", "the params are a string", 8)])],
        False,
    ),
    (
        "params-null",
        [(frame({**req(8), "params": None}), [V("bad_request", "the params are null", 8)])],
        False,
    ),
    (
        "params-keep-their-types",
        [
            (
                frame(req(8, "a", s="x", i=-3, f=0.5, b=False, n=None, l=[1, "2"], o={"k": []})),
                [
                    Request(
                        8,
                        "a",
                        {"s": "x", "i": -3, "f": 0.5, "b": False, "n": None, "l": [1, "2"], "o": {"k": []}},
                    )
                ],
            )
        ],
        False,
    ),
    (
        "a-violation-does-not-stop-the-stream",
        [
            (
                frame(b"nope") + frame(req(0)) + frame(req(2)),
                [V("bad_json", "not valid JSON"), V("bad_request", "the id 0"), Request(2, "status", {})],
            )
        ],
        False,
    ),
]


def run(conn: Connection, steps: list[Step]) -> None:
    for i, (data, expected) in enumerate(steps):
        got = conn.receive(data)
        assert len(got) == len(expected), f"step {i}: {got!r}"
        for out, want in zip(got, expected, strict=True):
            if isinstance(want, Request):
                assert out == want, f"step {i}"
            else:
                assert isinstance(out, ProtocolViolation), f"step {i}: {out!r}"
                assert (out.code, out.id) == (want.code, want.id), out
                assert want.fragment in out.message, out.message
                assert_one_sentence_with_a_fix(out.message)


def assert_one_sentence_with_a_fix(message: str) -> None:
    assert "\n" not in message and len(message) < 400, message
    problem, _, fix = message.partition("; ")
    assert problem and fix, f"no '; fix' in {message!r}"
    assert not message.endswith("."), message


@pytest.mark.parametrize(
    ("steps", "closed"), [(s, c) for _, s, c in PLAYBOOKS], ids=[n for n, _, _ in PLAYBOOKS]
)
def test_playbook(steps: list[Step], closed: bool) -> None:
    conn = Connection()
    run(conn, steps)
    assert conn.closed is closed


def test_too_large_is_refused_from_the_prefix_without_buffering_the_body() -> None:
    conn = Connection(max_frame=100)
    assert conn.receive(struct.pack(">I", 100) + b"x" * 50) == []
    assert conn.buffered == 54  # a frame within the limit is held until complete
    conn = Connection(max_frame=100)
    (violation,) = conn.receive(struct.pack(">I", 101) + b"x" * 50)
    assert violation == ProtocolViolation(
        0,
        "too_large",
        "the frame length 101 is over the limit of 100 bytes; send smaller messages,"
        " and start each with its length as 4 big-endian bytes",
    )
    assert conn.closed and conn.buffered == 0
    assert conn.receive(b"x" * 1000) == [] and conn.buffered == 0


def test_the_limit_is_per_connection() -> None:
    small, large = Connection(max_frame=64), Connection(max_frame=4 * MAX_FRAME)
    body = json.dumps(req(1, "a", s="x" * 100)).encode()
    assert [v.code for v in small.receive(frame(body)) if isinstance(v, ProtocolViolation)] == ["too_large"]
    big = req(1, "a", s="x" * (2 * MAX_FRAME))
    assert large.receive(frame(big)) == [Request(1, "a", big["params"])]


def test_buffered_tells_a_cut_frame() -> None:
    conn = Connection()
    conn.receive(frame(req())[:10])
    assert conn.buffered == 10
    conn.receive(frame(req())[10:])
    assert conn.buffered == 0


def test_frame_decoder_alone() -> None:
    decoder = FrameDecoder(max_frame=8)
    assert decoder.feed(b"\x00\x00") == []
    assert decoder.feed(b"\x00\x03abc\x00\x00\x00\x00\x00\x00") == [b"abc", b""]
    assert decoder.buffered == 2 and decoder.oversized is None
    assert decoder.feed(b"\x00\x09") == []
    assert decoder.oversized == 9 and decoder.buffered == 0
    assert decoder.feed(b"\x00\x00\x00\x01a") == []


# --- writing ------------------------------------------------------------------------


def test_respond_fail_push_bytes() -> None:
    conn = Connection()
    assert conn.respond(1, {}) == frame(b'{"v":1,"id":1,"ok":true,"result":{}}')
    assert conn.respond(2, {"é": "\u2028", "n": [1, 2.5, None, True]}) == frame(
        '{"v":1,"id":2,"ok":true,"result":{"é":"\u2028","n":[1,2.5,null,true]}}'.encode()
    )
    assert conn.fail(0, "bad_json", "x; y") == frame(
        b'{"v":1,"id":0,"ok":false,"error":{"code":"bad_json","message":"x; y"}}'
    )
    assert conn.push(3, {"kind": "run.start"}) == frame(
        b'{"v":1,"push":"event","sub":3,"event":{"kind":"run.start"}}'
    )


def test_a_result_over_the_limit_becomes_a_too_large_failure() -> None:
    conn = Connection(max_frame=1000)
    reply = parse_reply(conn.respond(4, {"content": "x" * 2000})[4:])
    assert isinstance(reply, Failure)
    assert (reply.id, reply.code) == (4, "too_large")
    size = len(b'{"v":1,"id":4,"ok":true,"result":{"content":""}}') + 2000
    assert reply.message.startswith(f"the result is {size} bytes, over the frame limit of 1000; ask for less")


def test_a_failure_always_goes_out() -> None:
    conn = Connection(max_frame=10)
    assert parse_reply(conn.fail(1, "internal", "m" * 100)[4:]) == Failure(1, "internal", "m" * 100)


@pytest.mark.parametrize(
    ("message", "fragment"),
    [
        ({"n": float("nan")}, "holds NaN or Infinity, which JSON cannot carry; send null or a string"),
        ({"n": [float("-inf")]}, "holds NaN or Infinity"),
        ({"s": "\ud800"}, "cannot be written as JSON"),
        ({"o": object()}, "cannot be written as JSON"),
        (
            {"s": "x" * MAX_FRAME},
            f"the message is {MAX_FRAME + 8} bytes, over the frame limit of {MAX_FRAME}; send less",
        ),
    ],
    ids=["nan", "infinity", "surrogate", "object", "too-large"],
)
def test_encode_refuses(message: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ProtocolError, match=None) as info:
        encode(message)
    assert fragment in str(info.value)
    assert_one_sentence_with_a_fix(str(info.value))


def test_encode_keeps_nan_and_infinity_inside_strings() -> None:
    assert encode({"s": "NaN Infinity"}) == frame(b'{"s":"NaN Infinity"}')


def test_respond_with_an_unwritable_result_raises() -> None:
    with pytest.raises(ProtocolError, match="NaN"):
        Connection().respond(1, {"n": float("nan")})


def test_error_codes_are_the_contracts() -> None:
    assert ERROR_CODES == (
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
    )


# --- reading replies ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"v":1,"id":1,"ok":true,"result":{"a":1}}', Response(1, {"a": 1})),
        (b'{"v":1,"id":0,"ok":false,"error":{"code":"bad_json","message":"m"}}', Failure(0, "bad_json", "m")),
        (
            b'{"v":1,"id":2,"ok":false,"error":{"code":"new_code","message":"m","hint":1}}',
            Failure(2, "new_code", "m"),
        ),
        (b'{"v":1,"push":"event","sub":4,"event":{"seq":1}}', Push(4, {"seq": 1})),
        (b'{"v":1,"id":1,"ok":true,"result":{},"later":"field"}', Response(1, {})),
    ],
    ids=["result", "failure", "unknown-code-kept", "push", "unknown-key-ignored"],
)
def test_parse_reply(body: bytes, expected: object) -> None:
    assert parse_reply(body) == expected


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"", "the daemon sent a malformed reply: the frame is empty"),
        (b"[]", "malformed reply: it is an array, not an object"),
        (b"{nope", "malformed reply: the frame is not valid JSON"),
        (
            b'{"v":2,"id":1,"ok":true,"result":{}}',
            "the daemon speaks protocol version 2, and this client version 1; use",
        ),
        (b'{"id":1,"ok":true,"result":{}}', "protocol version null"),
        (b'{"v":1,"id":"1","ok":true,"result":{}}', "the id '1' is not an integer"),
        (b'{"v":1,"id":-1,"ok":true,"result":{}}', "the id -1 is not an integer"),
        (b'{"v":1,"id":1,"ok":1,"result":{}}', "ok is 1, not true or false"),
        (b'{"v":1,"id":1,"ok":true,"result":[]}', "the result is an array, not an object"),
        (b'{"v":1,"id":1,"ok":false,"error":"boom"}', "an error reply needs an error object"),
        (b'{"v":1,"id":1,"ok":false,"error":{"code":1,"message":"m"}}', "an error reply needs"),
        (b'{"v":1,"push":"other","sub":1,"event":{}}', "the push kind 'other' is unknown"),
        (b'{"v":1,"push":"event","sub":"1","event":{}}', "a push needs an integer sub and an object event"),
        (b'{"v":1,"id":1,"ok":true,"result":{"n":1e999}}', "overflows a 64-bit float"),
        (b'{"v":1,"id":1,"ok":true,"result":' + b'{"a":' * 40 + b"1" + b"}" * 41, "nests deeper"),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 30 else None,
)
def test_parse_reply_refuses(body: bytes, fragment: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_reply(body)
    assert fragment in str(info.value)
    assert_one_sentence_with_a_fix(str(info.value))
