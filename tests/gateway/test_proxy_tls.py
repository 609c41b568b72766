"""Terminated TLS: method and path rules inside CONNECT, secrets put in place of placeholders.

The same world as test_proxy.py (a namespace of its own, public-looking
addresses on its ``lo``, a DNS server in it); here the policy has rules with
methods and paths and a secret, so the proxy answers the client's TLS with a
leaf of the run's CA and forwards over TLS it verifies against the test PKI.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from pathlib import Path

import httpx

from stockade.policy._model import HostRule, SecretPolicy
from tests.gateway._tls import TestPki
from tests.gateway.test_proxy import PUBLIC4, Origin, World, detail, in_world, read_response, rules

KEY = "sk-live-0123456789abcdef"
NETWORK = rules(
    HostRule("api.example.com", ports=(443,), methods=("GET",), paths=("/v1/",)),
    HostRule("api.example.com", ports=(8443,), methods=("GET",)),
    HostRule("v6.example.com", ports=(443,), methods=("GET", "POST")),
    HostRule("other.example.com", ports=(80, 443)),
    HostRule("api.example.com", ports=(80,)),
)
SECRETS = (SecretPolicy(name="API_KEY", env="THE_KEY", hosts=("api.example.com",)),)
OPEN = (SecretPolicy(name="API_KEY", env="THE_KEY", hosts=("api.example.com",), body=True, url=True),)
"""The secret opted in to bodies and URLs (by default its placeholder stands in Authorization only)."""


def tls_world(body: object, tmp_path: Path) -> None:
    in_world(body, tmp_path, network=NETWORK, secrets=SECRETS, environ={"THE_KEY": KEY})  # type: ignore[arg-type]


def test_method_and_path_rules_apply_inside_tls(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        async with w.client() as client:
            ok = await client.get("https://api.example.com/v1/echo?a=1")
            post = await client.post("https://api.example.com/v1/echo", content=b"x")
            admin = await client.get("https://api.example.com/admin")
            dots = await client.get("https://api.example.com/v1/%2e%2e/admin")
            again = await client.get("https://api.example.com/v1/echo")
        assert ok.status_code == 200 and ok.json()["target"] == "/v1/echo?a=1"
        assert [post.status_code, admin.status_code, dots.status_code] == [403, 403, 403]
        assert post.headers["x-stockade-verdict"] == "deny"
        assert post.headers["x-stockade-rule"] == "network.allow[0] (api.example.com)"
        assert post.text.startswith("stockade: POST https://api.example.com/v1/echo refused: ")
        assert again.status_code == 200
        # The refused requests never left.
        assert [s["target"] for s in w.tls_origin.seen] == ["/v1/echo?a=1", "/v1/echo"]
        events = await w.hooks.wait_events(5)
        assert [e.outcome for e in events if e.outcome == "denied"] == ["denied"] * 3
        allowed = [detail(e) for e in events if e.outcome == "allowed"]
        assert {d["scheme"] for d in allowed} == {"https"} and {d["address"] for d in allowed} == {PUBLIC4}
        assert sorted(d["path"] for d in allowed) == ["/v1/echo", "/v1/echo?a=1"]
        assert w.hooks.denials == 3

    tls_world(body, tmp_path)


def test_secret_is_substituted_toward_its_host_and_never_recorded(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        placeholder = w.secrets.env()["API_KEY"]
        assert placeholder.startswith("stockade-secret-API_KEY-") and KEY not in placeholder
        payload = json.dumps({"key": placeholder}).encode()
        async with w.client() as client:
            r = await client.request(
                "GET",
                f"https://api.example.com/v1/echo?key={placeholder}",
                headers={"Authorization": f"Bearer {placeholder}", "Content-Type": "application/json"},
                content=payload,
            )
        assert r.status_code == 200
        seen = w.tls_origin.seen[0]
        headers = dict(seen["headers"])
        assert headers["authorization"] == f"Bearer {KEY}"
        assert seen["target"] == f"/v1/echo?key={KEY}"
        assert json.loads(seen["body"]) == {"key": KEY}
        assert headers["content-length"] == str(len(seen["body"])) == str(seen["size"])
        assert headers["accept-encoding"] == "identity"
        # The origin echoed the value back: the agent reads the placeholder instead.
        assert KEY not in r.text and r.json()["target"] == f"/v1/echo?key={placeholder}"
        (event,) = await w.hooks.wait_events(1)
        text = json.dumps(event.to_dict())
        assert KEY not in text and placeholder not in text
        assert "[placeholder API_KEY]" in detail(event)["path"]
        assert detail(event)["bytes_down"] == len(r.content)

    in_world(body, tmp_path, network=NETWORK, secrets=OPEN, environ={"THE_KEY": KEY})


def test_echoed_values_stay_visible_when_hiding_is_off(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        placeholder = w.secrets.env()["API_KEY"]
        async with w.client() as client:
            r = await client.get(f"https://api.example.com/v1/echo?key={placeholder}")
        assert r.json()["target"] == f"/v1/echo?key={KEY}"  # what the default does today

    in_world(
        body, tmp_path, network=NETWORK, secrets=OPEN, environ={"THE_KEY": KEY}, hide_echoed_secrets=False
    )


def test_placeholder_toward_another_host_is_refused(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        placeholder = w.secrets.env()["API_KEY"]
        async with w.client() as client:
            inside_tls = await client.post(
                "https://v6.example.com/echo", headers={"X-Key": placeholder}, content=b"{}"
            )
            in_body = await client.post("https://v6.example.com/echo", content=f"k={placeholder}".encode())
            plain = await client.get(f"http://other.example.com/echo?k={placeholder}")
        for r in (inside_tls, in_body, plain):
            assert r.status_code == 403, r.text
            assert "API_KEY" in r.text and "not meant for" in r.text
            assert placeholder not in r.text and KEY not in r.text
        assert w.tls_origin.seen == [] and w.origin.seen == []
        assert w.hooks.denials == 3
        text = json.dumps([e.to_dict() for e in w.hooks.events])
        assert placeholder not in text and KEY not in text
        assert all(e.outcome == "denied" for e in w.hooks.events)

    tls_world(body, tmp_path)


def test_placeholder_is_never_sent_in_plain_http_even_to_its_host(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        placeholder = w.secrets.env()["API_KEY"]
        async with w.client() as client:
            header = await client.get("http://api.example.com/echo", headers={"Authorization": placeholder})
            in_body = await client.post("http://api.example.com/echo", content=placeholder.encode())
            plain = await client.get("http://api.example.com/echo")
        for r in (header, in_body):
            assert r.status_code == 403 and "unencrypted" in r.text and "https://api.example.com" in r.text
        assert plain.status_code == 200
        assert [s["target"] for s in w.origin.seen] == ["/echo"]
        assert w.hooks.denials == 2

    in_world(body, tmp_path, network=NETWORK, secrets=OPEN, environ={"THE_KEY": KEY})


def test_large_transfers_through_terminated_tls_are_counted(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        upload = b"u" * 3_000_000
        async with w.client() as client:
            down = await client.get("https://v6.example.com/bytes/6000000")
            up = await client.post("https://v6.example.com/echo", content=upload)
        assert len(down.content) == 6_000_000 and up.json()["size"] == len(upload)
        events = await w.hooks.wait_events(2)
        counts = sorted((detail(e)["bytes_up"], detail(e)["bytes_down"]) for e in events)
        assert counts[0] == (0, 6_000_000)
        assert counts[1][0] == 3_000_000
        assert all(detail(e)["scheme"] == "https" for e in events)

    tls_world(body, tmp_path)


def test_upstream_that_fails_verification_gets_502(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        impostor = TestPki(tmp_path / "impostor")
        origin = await Origin(tls=impostor.server_context(["api.example.com"])).listen(PUBLIC4, 8443)
        async with w.client() as client:
            r = await client.get("https://api.example.com:8443/echo")
        await origin.close()
        assert r.status_code == 502 and "did not verify" in r.text
        (event,) = await w.hooks.wait_events(1)
        assert detail(event)["status"] == 502 and event.outcome == "allowed"
        assert origin.seen == []

    (tmp_path / "impostor").mkdir()
    tls_world(body, tmp_path)


def test_host_header_must_match_the_connect_host(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        reader, writer = await w.raw()
        writer.write(b"CONNECT v6.example.com:443 HTTP/1.1\r\nHost: v6.example.com:443\r\n\r\n")
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        assert w.ca is not None
        ctx = ssl.create_default_context(cadata=w.ca.cert_pem.decode())
        await writer.start_tls(ctx, server_hostname="v6.example.com")
        writer.write(b"GET /echo HTTP/1.1\r\nHost: api.example.com\r\n\r\n")
        status, headers, text = await read_response(reader)
        writer.close()
        assert status == 400 and b"Host header" in text and headers["x-stockade-verdict"] == "deny"
        assert w.tls_origin.seen == [] and w.hooks.denials == 1

    tls_world(body, tmp_path)


def test_client_that_does_not_trust_the_run_ca_is_recorded(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        verify = ssl.create_default_context(cadata=w.pki.ca_pem.decode())  # not the run's CA
        async with httpx.AsyncClient(proxy=w.url, verify=verify, trust_env=False) as client:
            try:
                await client.get("https://api.example.com/v1/echo")
            except httpx.ConnectError as exc:
                assert "CERTIFICATE_VERIFY_FAILED" in str(exc)
            else:
                raise AssertionError("the client trusted a leaf of a CA it does not know")
        (event,) = await w.hooks.wait_events(1)
        assert "trust the run's CA" in detail(event)["reason"] and w.tls_origin.seen == []

    tls_world(body, tmp_path)


def test_host_without_rules_on_methods_is_tunnelled_in_a_run_without_secrets(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        # other.example.com has no method rule, and the run no secret (whose value
        # could leave unseen in a tunnel): a plain tunnel, not terminated.
        reader, writer = await w.raw()
        writer.write(b"CONNECT other.example.com:443 HTTP/1.1\r\nHost: other.example.com:443\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")
        ctx = ssl.create_default_context(cadata=w.pki.ca_pem.decode())
        await writer.start_tls(ctx, server_hostname="other.example.com")  # the origin's own certificate
        writer.write(b"GET /echo HTTP/1.1\r\nHost: other.example.com\r\n\r\n")
        status, _, _ = await read_response(reader)
        writer.close()
        assert status == 200
        (event,) = await w.hooks.wait_events(1)
        assert detail(event)["scheme"] == "tunnel"

    in_world(body, tmp_path, network=NETWORK)


def test_curl_through_terminated_tls(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        assert w.ca is not None
        bundle = tmp_path / "bundle.pem"
        bundle.write_bytes(w.ca.cert_pem)
        code, out, err = await w.curl("--cacert", str(bundle), "https://api.example.com/v1/echo")
        assert code == 0, err
        assert json.loads(out)["target"] == "/v1/echo"
        code, out, err = await w.curl(
            "-i", "--cacert", str(bundle), "-X", "DELETE", "https://api.example.com/v1/x"
        )
        assert code == 0, err
        assert "HTTP/1.1 403 " in out and "x-stockade-rule: network.allow[0]" in out.lower()
        assert "refused" in out
        assert w.hooks.denials == 1
        # Nothing is waiting to be recorded once curl is done.
        async with asyncio.timeout(10):
            await w.hooks.wait_events(2)

    tls_world(body, tmp_path)


def test_value_that_cannot_stand_in_a_url_is_refused_without_showing_it(tmp_path: Path) -> None:
    spaced = "value with spaces"

    async def body(w: World) -> None:
        placeholder = w.secrets.env()["API_KEY"]
        async with w.client() as client:
            r = await client.get(f"https://api.example.com/v1/echo?k={placeholder}")
            ok = await client.get("https://api.example.com/v1/echo", headers={"X-Key": placeholder})
        assert r.status_code == 400 and "cannot stand where its placeholder is" in r.text
        assert spaced not in r.text
        assert ok.status_code == 200 and dict(w.tls_origin.seen[0]["headers"])["x-key"] == spaced
        text = json.dumps([e.to_dict() for e in await w.hooks.wait_events(2)])
        assert spaced not in text and placeholder not in text

    spec = SecretPolicy(
        name="API_KEY", env="THE_KEY", hosts=("api.example.com",), headers=("X-Key",), url=True
    )
    in_world(body, tmp_path, network=NETWORK, secrets=(spec,), environ={"THE_KEY": spaced})


def test_placeholder_in_a_host_name_is_not_recorded(tmp_path: Path) -> None:
    async def body(w: World) -> None:
        placeholder = w.secrets.env()["API_KEY"]
        host = f"{placeholder}.evil.example"
        async with w.client() as client:
            r = await client.get(f"http://{host}/x")
        assert r.status_code == 403
        (event,) = w.hooks.events
        text = json.dumps(event.to_dict())
        assert placeholder.lower() not in text.lower()
        assert detail(event)["host"] == "[placeholder API_KEY].evil.example"

    tls_world(body, tmp_path)
