"""Issue 11, "secrets stay secret", through the proxy: the whole class, tried for real.

The world of test_proxy.py (a namespace of its own, public-looking addresses on
its ``lo``, a DNS server in it). The secret API_KEY is for api.example.com.
An origin route, ``/reflect/<form>``, answers the Authorization value it got
(the secret's value, once the gateway put it in place) turned into ``form``:
what an agent would ask a host to do to read the value back. Each test checks
with decoders of its own (``recoverable``), not with the code under test, that
nothing the agent received gives the value back, and has a control: the
legitimate neighbour still works.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import html
import json
import re
import urllib.parse
import zlib
from pathlib import Path
from typing import Any

import httpx
import pytest

from stockade.policy._model import HostRule, SecretPolicy
from tests.gateway.test_proxy import PRIVATE, World, detail, exchange, in_world, rules

KEY = "sk-live-0123456789abcdef"
NETWORK = rules(
    HostRule("api.example.com", ports=(80, 443)),
    HostRule("other.example.com", ports=(80, 443)),
)
SECRETS = (SecretPolicy(name="API_KEY", env="THE_KEY", hosts=("api.example.com",)),)


def recoverable(data: bytes, value: str = KEY) -> bool:
    """Whether ``value`` can be read back from ``data`` by the usual decodings
    (written here independently of the gateway's own patterns)."""
    needle = value.encode()
    texts = [data]
    for _ in range(2):  # two layers: gzip of base64, JSON of URL-encoding...
        more: list[bytes] = []
        for text in texts:
            more.append(urllib.parse.unquote_to_bytes(text))
            more.append(html.unescape(text.decode("latin-1")).encode("latin-1", "replace"))
            # JSON's \uXXXX and \/ escapes
            unescaped = re.sub(rb"\\u00([0-9a-fA-F]{2})", lambda m: bytes([int(m.group(1), 16)]), text)
            more.append(unescaped.replace(b"\\/", b"/"))
            for run in re.findall(rb"[0-9A-Fa-f]{16,}", text):
                more.append(binascii.unhexlify(run[: len(run) // 2 * 2]))
            for run in re.findall(rb"[A-Za-z0-9+/=_\-\r\n]{16,}", text):
                run = run.replace(b"\r", b"").replace(b"\n", b"")
                for skip in range(4):
                    chunk = run[skip:].rstrip(b"=")
                    chunk = chunk[: len(chunk) - (len(chunk) % 4 == 1)]
                    chunk += b"=" * (-len(chunk) % 4)
                    for alt in (b"+/", b"-_"):
                        try:
                            more.append(base64.b64decode(chunk.translate(bytes.maketrans(b"-_+/", alt * 2))))
                        except (binascii.Error, ValueError):
                            pass
            for wbits in (16 + 15, 15, -15):
                try:
                    more.append(zlib.decompressobj(wbits).decompress(text))
                except zlib.error:
                    pass
        texts += more
    return any(needle.lower() in text.lower() for text in texts)


def _forms(value: bytes) -> dict[str, tuple[list[tuple[str, str]], bytes]]:
    """``/reflect/<form>``: (headers, body) of each form of ``value``."""
    quoted = "".join(f"%{b:02X}" for b in value).encode()
    return {
        "raw": ([], b"you sent " + value),
        "upper": ([], value.upper()),
        "b64-0": ([], base64.b64encode(value)),
        "b64-1": ([], base64.b64encode(b"a" + value + b"z")),
        "b64-2": ([], base64.b64encode(b"ab" + value)),
        "b64url-nopad": ([], base64.urlsafe_b64encode(b"\xfb\xff" + value).rstrip(b"=")),
        "b64-mime": ([], base64.encodebytes(b"q" * 70 + value + b"q" * 70)),
        "hex": ([], value.hex().encode()),
        "HEX": ([], value.hex().upper().encode()),
        "url": ([], b"k=" + quoted),
        "json-u": (
            [("content-type", "application/json")],
            json.dumps({"k": value.decode()}).encode().replace(b"sk", b"\\u0073\\u006b"),
        ),
        "html": ([], b"".join(b"&#%d;" % b for b in value)),
        "gzip": ([("content-encoding", "gzip")], gzip.compress(b"token=" + value)),
        "gzip-of-b64": ([("content-encoding", "gzip")], gzip.compress(base64.b64encode(value))),
        "deflate": ([("content-encoding", "deflate")], zlib.compress(json.dumps([value.decode()]).encode())),
        "gzip-file": ([("content-type", "application/gzip")], gzip.compress(b"x" * 100000 + value)),
        "header-b64": ([("x-echo", base64.b64encode(value).decode())], b"see the header"),
        "location": ([("location", "https://other.example.com/?t=" + value.hex())], b""),
    }


def _answer(seen: dict[str, Any]) -> tuple[list[tuple[str, str]], bytes]:
    headers = {k.lower(): v for k, v in seen["headers"]}
    value = headers.get("authorization", "").removeprefix("Bearer ").encode()
    return _forms(value)[seen["target"].split("?")[0].rsplit("/", 1)[1]]


def world(body: Any, tmp_path: Path, **kwargs: Any) -> None:
    kwargs.setdefault("network", NETWORK)
    kwargs.setdefault("secrets", SECRETS)
    in_world(body, tmp_path, environ={"THE_KEY": KEY}, **kwargs)


def events_text(w: World) -> str:
    return json.dumps([e.to_dict() for e in w.hooks.events])


# --------------------------------------------------------------------------- echoes


def test_the_recoverable_helper_sees_every_form() -> None:
    # The test's own decoders must find the value in every form the origin
    # produces, else the next test would prove nothing.
    for form, (headers, body) in _forms(KEY.encode()).items():
        text = body + b"".join(v.encode() for _, v in headers)
        assert recoverable(text), form
    assert not recoverable(b"an answer without it, " + base64.b64encode(b"other"))


def test_a_value_echoed_in_any_form_never_reaches_the_agent(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        w.tls_origin.answer = _answer
        placeholder = w.secrets.env()["API_KEY"]
        received: dict[str, bytes] = {}
        async with w.client() as client:
            for form in _forms(b"x"):
                try:
                    r = await client.get(
                        f"https://api.example.com/reflect/{form}",
                        headers={"Authorization": f"Bearer {placeholder}"},
                    )
                    received[form] = r.content + b"".join(v for _, v in r.headers.raw)
                except httpx.HTTPError:
                    received[form] = b""  # the gateway cut the answer off
            control = await client.get("https://api.example.com/echo")
        # The origin got the value every time (the placeholder was put in place).
        assert len(w.tls_origin.seen) == len(_forms(b"x")) + 1
        assert all(dict(s["headers"]).get("authorization") == f"Bearer {KEY}" for s in w.tls_origin.seen[:-1])
        for form, data in received.items():
            assert not recoverable(data), form
        # Where the value could be cut out, the answer still came, with the placeholder.
        for form in ("raw", "b64-0", "hex", "url", "gzip", "deflate", "header-b64"):
            assert received[form], form
        assert placeholder.encode() in received["raw"] and placeholder.encode() in received["gzip"]
        # Control: an answer without the value passes as it is.
        assert control.status_code == 200 and control.json()["target"] == "/echo"
        await w.hooks.wait_events(len(received) + 1)
        assert KEY not in events_text(w)

    world(body, tmp_path)


def test_an_answer_in_a_coding_the_gateway_cannot_read_is_refused(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        w.tls_origin.answer = lambda seen: ([("content-encoding", "br")], b"\x0b\x02\x80PAYLOAD")
        async with w.client() as client:
            r = await client.get("https://api.example.com/reflect/br")
            ok = await client.get("https://api.example.com/echo", headers={"Accept-Encoding": "br, gzip"})
        assert r.status_code == 502 and "'br'" in r.text and b"PAYLOAD" not in r.content
        # Control: the gateway asked the origin for identity, whatever the client said.
        assert (
            ok.status_code == 200 and dict(w.tls_origin.seen[-1]["headers"])["accept-encoding"] == "identity"
        )

    world(body, tmp_path)


# --------------------------------------------------------------------------- the value going out


def _carriers(value: str) -> dict[str, str]:
    raw = value.encode()
    return {
        "raw": value,
        "upper": value.upper(),
        "b64": base64.b64encode(b"x" + raw).decode(),
        "b64url": base64.urlsafe_b64encode(raw).decode().rstrip("="),
        "hex": raw.hex(),
        "url": "".join(f"%{b:02x}" for b in raw),
        "json": "\\u0073\\u006b" + value[2:],
    }


@pytest.mark.parametrize("scheme", ["https", "http"])
def test_the_value_is_refused_toward_any_host_in_any_part_and_form(tmp_path: Path, scheme: str) -> None:
    async def body(w: World) -> None:
        origin = w.tls_origin if scheme == "https" else w.origin
        refused: list[httpx.Response] = []
        async with w.client() as client:
            for carried in _carriers(KEY).values():
                url = f"{scheme}://other.example.com/echo"
                refused.append(await client.get(f"{url}?q={carried}"))
                refused.append(await client.get(url, headers={"X-Data": carried}))
                refused.append(await client.post(url, content=f'{{"d": "{carried}"}}'.encode()))
                # To the secret's own host too: the agent never sends the value itself.
                refused.append(
                    await client.post(f"{scheme}://api.example.com/echo", content=carried.encode())
                )
            # In a header's name, or as the method.
            refused.append(
                await client.get(
                    f"{scheme}://other.example.com/echo", headers={"X-" + KEY.encode().hex(): "1"}
                )
            )
            refused.append(
                await client.request(KEY.upper(), f"{scheme}://other.example.com/echo")
            )
            control = await client.post(f"{scheme}://other.example.com/echo", content=b'{"d": "harmless"}')
        for r in refused:
            assert r.status_code == 403, r.text
            assert "value of secret API_KEY" in r.text and not recoverable(r.content)
        assert origin.seen[-1]["body"] == '{"d": "harmless"}' and len(origin.seen) == 1
        assert control.status_code == 200
        events = await w.hooks.wait_events(len(refused) + 1)
        denied = [e for e in events if e.outcome == "denied"]
        assert len(denied) == len(refused) == w.hooks.denials
        assert all("API_KEY" in detail(e)["reason"] for e in denied)
        assert not recoverable(events_text(w).encode())

    world(body, tmp_path)


def test_the_value_in_a_streamed_body_is_refused_and_the_upstream_dropped(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        def chunked(payload: bytes) -> bytes:
            head = (
                b"POST http://other.example.com/echo HTTP/1.1\r\nHost: other.example.com\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            pieces = [payload[i : i + 7] for i in range(0, len(payload), 7)]  # the value cut across chunks
            return head + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"

        status, headers, text = await exchange(w, chunked(b"a" * 70000 + KEY.encode() + b"b" * 10))
        ok_status, _, _ = await exchange(w, chunked(b"a" * 70000 + b"harmless"))
        assert status == 403 and b"API_KEY" in text and headers["x-stockade-verdict"] == "deny"
        assert ok_status == 200
        # The origin never got a whole request carrying it: only the control.
        assert len(w.origin.seen) == 1 and w.origin.seen[0]["size"] == 70008

    world(body, tmp_path)


def test_a_placeholder_stands_only_where_its_policy_says(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        placeholder = w.secrets.env()["API_KEY"]
        basic = base64.b64encode(f"me:{placeholder}".encode()).decode()
        async with w.client() as client:
            bearer = await client.get(
                "https://api.example.com/echo", headers={"Authorization": f"Bearer {placeholder}"}
            )
            git = await client.get(
                "https://api.example.com/echo", headers={"Authorization": f"Basic {basic}"}
            )
            elsewhere = [
                await client.get("https://api.example.com/echo", headers={"X-Other": placeholder}),
                await client.post("https://api.example.com/echo", content=f"k={placeholder}".encode()),
                await client.get(f"https://api.example.com/echo?k={placeholder}"),
            ]
        assert bearer.status_code == 200 and git.status_code == 200
        sent = [dict(s["headers"])["authorization"] for s in w.tls_origin.seen]
        assert sent == [f"Bearer {KEY}", "Basic " + base64.b64encode(f"me:{KEY}".encode()).decode()]
        for r, where in zip(elsewhere, ("header x-other", "body", "URL"), strict=True):
            assert r.status_code == 403 and f"placeholder of secret API_KEY in its {where}" in r.text
        assert "secrets[].body: true" in elsewhere[1].text and "secrets[].url: true" in elsewhere[2].text
        assert w.hooks.denials == 3

    world(body, tmp_path)


def test_a_tunnel_in_a_run_with_secrets_is_opened_and_searched(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        async with w.client() as client:
            out = await client.get("https://other.example.com/echo", headers={"X-Data": KEY})
            ok = await client.get("https://other.example.com/echo")
        assert out.status_code == 403 and "API_KEY" in out.text
        assert ok.status_code == 200
        events = await w.hooks.wait_events(2)
        assert {detail(e)["scheme"] for e in events} == {"https"}  # terminated, not a tunnel

    world(body, tmp_path)


# --------------------------------------------------------------------------- address rules through names


BOUND = rules(
    HostRule("**.example.com", ports=(80, 443)),
    HostRule(PRIVATE, ports=(80, 443), methods=("GET",), paths=("/mirror/",)),
)


def test_an_address_rule_binds_methods_and_paths_when_reached_by_name(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        private = w.canaries[:2]  # 10.0.0.1:80 and :443 (they close every connection)
        async with w.client() as client:
            admin = await client.post("http://internal.example.com/admin/")
            get_admin = await client.get("http://internal.example.com/admin/")
            tls_admin = await client.post("https://internal.example.com/admin/")
            assert sum(c.hits for c in private) == 0
            mirror = await client.get("http://internal.example.com/mirror/x")
            tls_mirror = await client.get("https://internal.example.com/mirror/x")
        for r in (admin, get_admin, tls_admin):
            assert r.status_code == 403, r.text
            assert r.headers["x-stockade-rule"] == f"network.allow[1] ({PRIVATE})"
            assert f"internal.example.com resolves to {PRIVATE}" in r.text
        # Control: what the address rule allows gets there (the canary answers nothing: 502).
        assert mirror.status_code == 502 and tls_mirror.status_code == 502
        assert [c.hits for c in private] == [1, 1]
        assert w.hooks.denials == 3

    in_world(body, tmp_path, network=BOUND)
