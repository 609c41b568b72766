"""The gateway end to end: a daemon run's cell uses it with curl and Python as
they come, and the record holds every request.

The daemon, the test's DNS server and its "internet" (docs.example.com and
api.example.com at 93.184.216.34, an internal host at 10.0.0.1, the metadata
address) all live in a network namespace the test made: the daemon's threads
are started from a thread inside it, so every connection the gateway makes
stays there. The cell has its own namespace, holding only the gateway's two
listeners on its 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stockade.gateway import GatewayOptions
from stockade.llm._mock import MockLlm
from stockade.llm._scripts import solver
from stockade.llm._serve import AppServer
from tests._netns import TestNetns
from tests.daemon.test_server import Wire, close_wires, daemon_at, kind_is, stored_events  # noqa: F401
from tests.gateway._dns import TestDns
from tests.gateway._servers import Canary, HttpServer, Reply, Seen
from tests.gateway._tls import TestPki

PUBLIC = "93.184.216.34"
INTERNAL = "10.0.0.1"
METADATA = "169.254.169.254"
SECRET_VALUE = "ghp_the-real-secret-value"
PY = "/usr/bin/python3"


class World:
    """The test's internet, on a loop of its own inside the namespace."""

    def __init__(self, tmp_path: Path) -> None:
        self.pki = TestPki(tmp_path)
        self.dns = TestDns(
            {
                "docs.example.com": [PUBLIC],
                "api.example.com": [PUBLIC],
                "internal.example.com": [INTERNAL],
            }
        )
        self.web = HttpServer(
            {
                "/hello": Reply(body=b"hello from docs\n"),
                "/v1/whoami": lambda seen: Reply(body=seen.headers.get("authorization", "none").encode()),
                "/v2/other": Reply(body=b"v2\n"),
                "/to-metadata": Reply(302, headers=[("Location", f"http://{METADATA}/latest/meta-data/")]),
            }
        )
        self.tls_web = HttpServer(
            self.web.routes, tls=self.pki.server_context(["docs.example.com", "api.example.com"])
        )
        self.canaries = Canary()
        self.llm: AppServer | None = None
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self) -> None:
        await self.dns.start()
        await self.web.listen(PUBLIC, 80)
        await self.tls_web.listen(PUBLIC, 443)
        await self.canaries.listen(INTERNAL, 80)
        await self.canaries.listen(METADATA, 80)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        sock.setblocking(False)
        self.mock = MockLlm(solver)
        self.llm = AppServer(self.mock.app(), sock)
        await self.llm.start()

    @property
    def llm_url(self) -> str:
        assert self.llm is not None
        host, port = self.llm.address
        return f"http://{host}:{port}/v1"

    def stop(self) -> None:
        async def stop() -> None:
            await self.web.close()
            await self.tls_web.close()
            await self.canaries.close()
            await self.dns.close()
            if self.llm is not None:
                await self.llm.close()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()

    @property
    def seen(self) -> list[Seen]:
        return [*self.web.seen, *self.tls_web.seen]


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[World, Any]]:
    with TestNetns([PUBLIC, INTERNAL, METADATA]) as ns, ns.entered():
        world = World(tmp_path)
        world.start()
        options = GatewayOptions(dns=world.dns.spec, upstream_ca=world.pki.ca_file)
        try:
            with daemon_at(tmp_path, gateway=options) as dt:
                yield world, dt
        finally:
            world.stop()


def _run(
    dt: Any, tmp_path: Path, name: str, script: str, **policy: Any
) -> tuple[dict[str, Any], str, list[dict[str, Any]]]:
    ws = tmp_path / f"ws-{name}"
    ws.mkdir()
    body = {"name": name, "command": ["/bin/sh", "-c", script], "workspace": str(ws), **policy}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(body))
    wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
    events.call("events.subscribe")
    info = wire.call("run.start", {"policy_path": str(path)})
    events.until(kind_is("run.end", info["id"]), timeout=60)
    out = wire.call("run.logs", {"run": info["id"]})["data"]
    final = next(r for r in wire.call("run.list")["runs"] if r["id"] == info["id"])
    return final, out, [e["event"] for e in stored_events(wire, info["id"])]


def _requests(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"] == "http.request"]


def test_curl_through_the_proxy_reaches_allowed_hosts_only(world: tuple[World, Any], tmp_path: Path) -> None:
    w, dt = world
    script = (
        'curl -s http://docs.example.com/hello; echo "[$?]"; '
        "curl -s -o /dev/null -w '%{http_code}\\n' http://evil.example.org/x; "
        "curl -s http://evil.example.org/x | head -c 300 | tr -d '\\n'; echo; "
        "curl -s -o /dev/null -w '%{http_code}\\n' http://internal.example.com/; "
        f"curl -s -o /dev/null -w '%{{http_code}}\\n' http://{METADATA}/latest/meta-data/"
    )
    info, out, events = _run(
        dt, tmp_path, "curl", script, network={"allow": ["docs.example.com:80", "internal.example.com:80"]}
    )
    lines = out.splitlines()
    assert lines[0] == "hello from docs" and lines[1] == "[0]", out
    assert lines[2] == "403", out
    assert "network.allow" in lines[3] and "evil.example.org" in lines[3], out
    assert lines[4] in ("403", "502"), out  # a name that leads to a private address
    assert lines[5] == "403", out
    assert w.canaries.hits == []
    requests = _requests(events)
    allowed = [e for e in requests if e["outcome"] == "allowed"]
    assert [(e["detail"]["host"], e["detail"]["path"], e["detail"]["status"]) for e in allowed] == [
        ("docs.example.com", "/hello", 200)
    ]
    assert allowed[0]["detail"]["rule"].startswith("network.allow[0]")
    assert allowed[0]["detail"]["bytes_down"] > 0
    denied = [e["detail"]["host"] for e in requests if e["outcome"] == "denied"]
    assert denied.count("evil.example.org") == 2
    assert "internal.example.com" in denied and METADATA in denied
    assert info["denials"] >= 4


def test_a_tunnel_goes_to_the_checked_host_and_no_other(world: tuple[World, Any], tmp_path: Path) -> None:
    w, dt = world
    # The cell does not trust the test's CA (a plain tunnel is the client's own
    # TLS): curl checks the certificate against the CA file it is given.
    ca = tmp_path / "ca-for-cell"
    ca.mkdir()
    (ca / "ca.pem").write_bytes(w.pki.ca_pem)
    script = (
        f'curl -s --cacert {ca}/ca.pem https://docs.example.com/hello; echo "[$?]"; '
        f'curl -s --cacert {ca}/ca.pem https://api.example.com/hello; echo "[$?]"'
    )
    _info, out, events = _run(
        dt,
        tmp_path,
        "tunnel",
        script,
        network={"allow": ["docs.example.com"]},
        filesystem={"read": [str(ca)]},
    )
    lines = out.splitlines()
    assert lines[:2] == ["hello from docs", "[0]"], out
    assert lines[2] != "hello from docs" and lines[-1] != "[0]", out  # api.example.com is not allowed
    requests = _requests(events)
    assert [(e["detail"]["scheme"], e["detail"]["host"], e["outcome"]) for e in requests] == [
        ("tunnel", "docs.example.com", "allowed"),
        ("tunnel", "api.example.com", "denied"),
    ]


def test_a_secret_goes_only_to_its_host_and_rules_see_inside_tls(
    world: tuple[World, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w, dt = world
    monkeypatch.setenv("STOCKADE_TEST_GH", SECRET_VALUE)
    script = (
        'echo "token in the cell: $GH_TOKEN"; '
        'curl -s -H "Authorization: Bearer $GH_TOKEN" https://api.example.com/v1/whoami; echo; '
        "curl -s -o /dev/null -w '%{http_code}\\n' -X POST https://api.example.com/v1/whoami; "
        "curl -s -o /dev/null -w '%{http_code}\\n' https://api.example.com/v2/other; "
        "curl -s -o /dev/null -w '%{http_code}\\n' -H \"Authorization: Bearer $GH_TOKEN\" http://docs.example.com/hello"
    )
    policy = {
        "network": {
            "allow": [
                {"host": "api.example.com", "methods": ["GET"], "paths": ["/v1/"]},
                "docs.example.com:80",
            ]
        },
        "secrets": [{"name": "GH_TOKEN", "env": "STOCKADE_TEST_GH", "hosts": ["api.example.com"]}],
    }
    _info, out, events = _run(dt, tmp_path, "secret", script, **policy)
    lines = out.splitlines()
    assert lines[0].startswith("token in the cell: stockade-secret-GH_TOKEN-"), out
    assert SECRET_VALUE not in lines[0]
    # The upstream got the value, over verified TLS; its echo of it came back
    # to the agent as the placeholder again.
    whoami = [s for s in w.tls_web.seen if s.target == "/v1/whoami" and s.method == "GET"]
    assert [s.headers["authorization"] for s in whoami] == [f"Bearer {SECRET_VALUE}"]
    assert lines[1].startswith("Bearer stockade-secret-GH_TOKEN-") and SECRET_VALUE not in out, out
    assert lines[2:5] == ["403", "403", "403"], out
    # The docs host never saw the placeholder or the value.
    docs = [s for s in w.web.seen if s.target == "/hello"]
    assert docs == []
    schemes = {(e["detail"]["scheme"], e["detail"]["path"], e["outcome"]) for e in _requests(events)}
    assert ("https", "/v1/whoami", "allowed") in schemes and ("https", "/v2/other", "denied") in schemes
    text = json.dumps(events)
    assert SECRET_VALUE not in text


def test_http_fetch_follows_redirects_only_to_allowed_places(
    world: tuple[World, Any], tmp_path: Path
) -> None:
    w, dt = world
    agent = (
        "import json, stockade_agent as sa\n"
        "b = sa.Broker.connect()\n"
        "r = b.fetch('http://docs.example.com/hello')\n"
        "print(json.dumps({'status': r.status, 'body': r.body.decode()}))\n"
        "try:\n"
        "    b.fetch('http://docs.example.com/to-metadata')\n"
        "    print(json.dumps({'redirect': 'followed'}))\n"
        "except sa.Denied as e:\n"
        "    print(json.dumps({'redirect': 'refused', 'reason': str(e)}))\n"
        "try:\n"
        "    b.fetch('https://docs.example.com:8443/nothing-listens')\n"
        "except sa.IntentFailed as e:\n"
        "    print(json.dumps({'unreachable': e.code}))\n"
    )
    script_file = tmp_path / "fetch_agent.py"
    script_file.write_text(agent)
    policy = {
        "network": {"allow": ["docs.example.com:80", "docs.example.com:8443"], "fetch_plain_http": True},
        "filesystem": {"read": [str(tmp_path / "fetch_agent.py")]},
    }
    info, out, events = _run(dt, tmp_path, "fetch", f"{PY} {script_file}", **policy)
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert lines[0] == {"status": 200, "body": "hello from docs\n"}, out
    assert lines[1]["redirect"] == "refused", out
    assert lines[2] == {"unreachable": "failed"}, out
    assert w.canaries.hits == []
    vias = [e["detail"]["via"] for e in _requests(events)]
    assert vias and all(v == "http.fetch" for v in vias)
    intents = [e for e in events if e["kind"] == "intent" and e["detail"]["intent"] == "http.fetch"]
    assert any(e["outcome"] == "denied" for e in intents)
    assert info["requests"] >= 2


LLM_AGENT = """
import json, os, urllib.request, urllib.error
def chat(key):
    body = json.dumps({"model": "any", "messages": [{"role": "user", "content": "hello"}]}).encode()
    headers = {"Authorization": "Bearer " + key, "Content-Type": "application/json"}
    url = os.environ["OPENAI_BASE_URL"] + "/chat/completions"
    req = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)
status, answer = chat(os.environ["OPENAI_API_KEY"])
print(json.dumps({"status": status, "model": answer.get("model"), "choices": len(answer.get("choices", []))}))
status, answer = chat("sk-guessed")
print(json.dumps({"status": status, "error": answer.get("error", {}).get("type")}))
"""


def test_the_llm_endpoint_in_the_cell_forwards_with_the_daemons_key(
    world: tuple[World, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w, dt = world
    monkeypatch.setenv("STOCKADE_TEST_LLM_KEY", "sk-daemon-only-key")
    agent = tmp_path / "llm_agent.py"
    agent.write_text(LLM_AGENT)
    policy = {
        "filesystem": {"read": [str(agent)]},
        "llm": {"base_url": w.llm_url, "model": "mock-model", "api_key_env": "STOCKADE_TEST_LLM_KEY"},
    }
    _info, out, events = _run(dt, tmp_path, "llm", f"{PY} {agent}", **policy)
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert lines[0] == {"status": 200, "model": "mock-model", "choices": 1}, out
    assert lines[1]["status"] == 401, out
    calls = [e for e in events if e["kind"] == "llm.call"]
    assert calls and calls[0]["outcome"] == "allowed" and calls[0]["detail"]["model"] == "mock-model"
    assert "sk-daemon-only-key" not in json.dumps(events)
    assert "sk-daemon-only-key" not in out
    # Only the allowed call went upstream, with the daemon's key and the policy's model.
    (seen,) = list(w.mock.seen)
    assert seen.headers["authorization"] == "Bearer sk-daemon-only-key"
    assert seen.body["model"] == "mock-model"


def test_git_uses_the_proxy_as_it_comes(world: tuple[World, Any], tmp_path: Path) -> None:
    """git reads $HTTP_PROXY like curl: its smart-HTTP probe reaches the allowed
    host through the gateway (the test's server has no repository: git then says so)."""
    w, dt = world
    script = "git ls-remote http://docs.example.com/repo.git 2>&1 | head -c 300; echo"
    _info, out, events = _run(dt, tmp_path, "git", script, network={"allow": ["docs.example.com:80"]})
    probes = [s.target for s in w.web.seen if s.target.startswith("/repo.git/info/refs")]
    assert probes, out
    requests = _requests(events)
    assert any(
        e["detail"]["path"].startswith("/repo.git/info/refs") and e["outcome"] == "allowed" for e in requests
    ), requests


def test_a_secret_read_back_encoded_stays_hidden_and_its_value_cannot_leave(
    world: tuple[World, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import base64
    import gzip

    w, dt = world
    monkeypatch.setenv("STOCKADE_TEST_GH", SECRET_VALUE)
    w.tls_web.routes["/v1/b64"] = lambda seen: Reply(
        body=base64.b64encode(seen.headers["authorization"].encode())
    )
    w.tls_web.routes["/v1/gz"] = lambda seen: Reply(
        headers=[("Content-Encoding", "gzip")], body=gzip.compress(seen.headers["authorization"].encode())
    )
    # As if the value had leaked to the agent some other way: it tries to send it out.
    leaked = base64.b64encode(SECRET_VALUE.encode()).decode()
    auth = '-H "Authorization: Bearer $GH_TOKEN"'
    code = "curl -s -o /dev/null -w '%{http_code}\\n'"
    script = (
        f'echo "b64: $(curl -s {auth} https://api.example.com/v1/b64 | base64 -d 2>/dev/null)"; '
        f'echo "gz: $(curl -s --compressed {auth} https://api.example.com/v1/gz)"; '
        f"{code} 'http://docs.example.com/hello?k={leaked}'; "
        f"{code} -d 'k={SECRET_VALUE.encode().hex()}' http://docs.example.com/hello; "
        f"{code} 'http://docs.example.com/hello?k=harmless'"
    )
    policy = {
        "network": {"allow": [{"host": "api.example.com", "paths": ["/v1/"]}, "docs.example.com:80"]},
        "secrets": [{"name": "GH_TOKEN", "env": "STOCKADE_TEST_GH", "hosts": ["api.example.com"]}],
    }
    _info, out, events = _run(dt, tmp_path, "readback", script, **policy)
    lines = out.splitlines()
    # The upstream got the value twice; the agent read back only the placeholder.
    assert [s.headers["authorization"] for s in w.tls_web.seen if s.target.startswith("/v1/")] == [
        f"Bearer {SECRET_VALUE}"
    ] * 2
    # The base64 answer's core became the placeholder's text: it no longer decodes to the value.
    assert lines[0].startswith("b64: ") and "ghp_" not in lines[0], out
    assert lines[1].startswith("gz: Bearer stockade-secret-GH_TOKEN-"), out
    assert SECRET_VALUE not in out
    # The value itself, base64 in a URL or hex in a body, is refused toward another host.
    assert lines[2:] == ["403", "403", "200"], out
    assert [s.target for s in w.web.seen] == ["/hello?k=harmless"]
    requests = _requests(events)
    refused = [e for e in requests if e["outcome"] == "denied"]
    assert len(refused) == 2 and all("secret GH_TOKEN" in e["detail"]["reason"] for e in refused)
    assert SECRET_VALUE not in json.dumps(requests) and leaked not in json.dumps(requests)
