"""The AgentOS project's example manifests run unchanged, and do what they say.

The manifests are read from ../shared/agentos (never copied here). Every one
that AgentOS accepts runs with ``stockade run -f ../shared/agentos/X`` under a
daemon the test started in a network namespace of its own (see
test_examples.py): several try to reach 1.1.1.1, api.openai.com or
example.com, and there those live on the namespace's ``lo``, with a DNS server
that names them and servers that count what reaches them. Nothing can leave
the machine. The ones without network also run with ``stockade exec``.

Where a manifest cannot do here what it does under AgentOS, its row says why
and asserts the clear error or outcome it gives instead:

- ``allowed_hosts`` is enforced by the gateway: a program that connects
  directly, ignoring ``HTTP_PROXY`` (allowed-net, blocked-net), is refused by
  Landlock whatever the manifest allows; through the proxy, allowed-net's
  1.1.1.1:80 is allowed (``test_allowed_net_is_allowed_through_the_gateway``).
- The test's HTTPS hosts present certificates of a test CA, which the gateway
  trusts but the contained curl or Python does not (a plain tunnel is the
  client's own TLS): the gateway lets the connection through to the host the
  manifest names, and the client then fails on the certificate. On a machine
  with internet access the real host answers.
- llm-agent, its testdata twin and shell-runner start in a ``working_dir``
  (/opt/agents, /tmp/work) that this host does not have; orchestrator's
  ``python`` is not installed here (Debian has ``python3`` only).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests._agentos import BAD, GOOD, manifest, require
from tests._netns import TestNetns
from tests.examples.test_examples import LoopIn, daemon_flags, daemon_in, export, stockade
from tests.gateway._dns import TestDns
from tests.gateway._servers import HttpServer, Reply
from tests.gateway._tls import TestPki

ENV = {"ANTHROPIC_API_KEY": "sk-ant-test", "TEST_API_KEY": "sk-test"}
CLOUDFLARE = "1.1.1.1"
PUBLIC = "93.184.216.34"
HTTPS_HOSTS = ["example.com", "api.openai.com"]

VIA_PROXY = (
    "import urllib.request, urllib.error\n"
    "try:\n"
    "    with urllib.request.urlopen('http://1.1.1.1/', timeout=10) as r:\n"
    "        print(r.status, r.read().decode())\n"
    "except urllib.error.HTTPError as e:\n"
    "    print(e.code, e.read().decode())\n"
)
UNSHARE = (
    "import ctypes; libc = ctypes.CDLL(None, use_errno=True); "
    "print(libc.unshare(0x10000000), ctypes.get_errno())"  # CLONE_NEWUSER
)


@dataclass(frozen=True)
class Expect:
    """What running a manifest gives here."""

    exit_code: int
    out: str = ""
    """Text the run's stdout holds."""
    err: str = ""
    """Text the run's stderr holds."""
    events: tuple[tuple[str, str, str], ...] = ()
    """(kind, outcome, text in the summary) the record holds for the run."""
    argv: tuple[str, ...] = ()
    """The command, for a policy that has none (AgentOS policies carry no command)."""
    why: str = ""
    """Why this is not what AgentOS does, where it is not."""


NO_WORKDIR = "cell setup failed while entering the workdir: workdir {}: No such file or directory"
CERT = "the test's HTTPS server has a certificate of a test CA the contained client does not trust"
LANDLOCK_CONNECT = (
    "cell.denied",
    "denied",
    "TCP connect to 1.1.1.1 port 80 refused by landlock (net.connect_tcp)",
)

EXPECTED: dict[str, Expect] = {
    "allowed-net.yaml": Expect(
        1,
        out="FAIL: connect() denied unexpectedly (errno=13)",
        events=(LANDLOCK_CONNECT,),
        why="its direct connect ignores the proxy; allowed_hosts is the gateway's list",
    ),
    "blocked-net.yaml": Expect(
        0, out="OK: kernel denied connect() with errno=13 (Permission denied)", events=(LANDLOCK_CONNECT,)
    ),
    "curl-blocked.json": Expect(
        0,  # curl without -f exits 0 on the gateway's 403 answer, which it prints
        out="stockade: GET http://1.1.1.1/ refused: no network.allow rule matches 1.1.1.1:80",
        events=(("http.request", "denied", "1.1.1.1"),),
    ),
    "demo-agent.yaml": Expect(
        1, err="CERTIFICATE_VERIFY_FAILED", events=(("http.request", "allowed", "api.openai.com"),), why=CERT
    ),
    "file-reader.yaml": Expect(0, out="stockade\n"),  # the cell's own /etc/hostname (docs/CELL.md)
    "internal_manifest_testdata_ok-llm-agent.yaml": Expect(
        5, err=NO_WORKDIR.format("/opt/agents"), why="/opt/agents does not exist on this host"
    ),
    "internal_manifest_testdata_ok-web-fetcher.yaml": Expect(
        60, err="SSL certificate problem", events=(("http.request", "allowed", "api.openai.com"),), why=CERT
    ),
    "llm-agent.yaml": Expect(
        5, err=NO_WORKDIR.format("/opt/agents"), why="/opt/agents does not exist on this host"
    ),
    "orchestrator_demo_agent.yaml": Expect(
        127, err="python: No such file or directory", why="this host has python3, not python"
    ),
    "policies_default.yaml": Expect(
        0,
        out="0 0",  # audit mode: the refused syscall is recorded, and happens
        events=(("cell.audited", "audited", "unshare would be refused by seccomp (audit mode: allowed)"),),
        argv=("/usr/bin/python3", "-c", UNSHARE),
    ),
    "policies_strict-llm-agent.yaml": Expect(
        0, out="strict ok", argv=("/usr/bin/python3", "-c", "import ssl; print('strict ok')")
    ),
    "shell-runner.yaml": Expect(
        5, err=NO_WORKDIR.format("/tmp/work"), why="/tmp/work does not exist on this host"
    ),
    "web-fetcher.yaml": Expect(
        60, err="SSL certificate problem", events=(("http.request", "allowed", "example.com"),), why=CERT
    ),
}


class World:
    """The namespace, its DNS, 1.1.1.1:80 and the HTTPS hosts, and a daemon inside."""

    def __init__(self, ns: TestNetns, tmp_path: Path) -> None:
        self.ns = ns
        self.tmp_path = tmp_path
        self.pki = TestPki(tmp_path)
        self.dns = TestDns({host: [PUBLIC] for host in HTTPS_HOSTS})
        self.plain = HttpServer({"/": Reply(body=b"hello from 1.1.1.1")})
        self.tls = HttpServer({}, tls=self.pki.server_context(HTTPS_HOSTS))
        self.loop = LoopIn(ns)
        self.loop.run(self._start())

    async def _start(self) -> None:
        await self.dns.start()
        await self.plain.listen(CLOUDFLARE, 80)
        await self.tls.listen(PUBLIC, 443)

    async def _stop(self) -> None:
        await self.plain.close()
        await self.tls.close()
        await self.dns.close()

    def close(self) -> None:
        self.loop.run(self._stop())
        self.loop.close()

    def run(self, name: str, *argv: str) -> subprocess.CompletedProcess[str]:
        """``stockade run -f ../shared/agentos/NAME [-- ARGV]``, with the test's daemon."""
        args = ["run", "-f", str(manifest(name)), *daemon_flags(self.tmp_path)]
        return stockade(*args, *(["--", *argv] if argv else []), env=ENV)

    def runs(self) -> list[list[dict[str, Any]]]:
        """The record's events, one list per run, in the order the runs started."""
        events = export(self.tmp_path).events
        order = [e["run"] for e in events if e["kind"] == "run.start"]
        return [[e for e in events if e["run"] == run] for run in order]


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with TestNetns([CLOUDFLARE, PUBLIC]) as ns:
        world = World(ns, tmp_path)
        try:
            with daemon_in(ns, tmp_path, dns=world.dns.spec, upstream_ca=world.pki.ca_file):
                yield world
        finally:
            world.close()


def test_the_table_covers_every_accepted_manifest() -> None:
    require()
    assert sorted(EXPECTED) == GOOD and len(GOOD) == 13
    assert len(BAD) == 5


@pytest.mark.parametrize("name", GOOD)
def test_an_accepted_manifest_runs_unchanged(world: World, name: str) -> None:
    expect = EXPECTED[name]
    done = world.run(name, *expect.argv)
    assert done.returncode == expect.exit_code, (expect.why, done.stdout, done.stderr)
    assert expect.out in done.stdout, done.stdout
    assert expect.err in done.stderr, done.stderr
    runs = world.runs()
    if expect.exit_code == 5:  # the cell never started: the run failed, and says why
        assert [e["kind"] for e in runs[0] if e["kind"] in ("cell.start", "run.end")] == ["run.end"]
        return
    summaries = [(e["kind"], e["outcome"], e["summary"]) for e in runs[0]]
    for kind, outcome, text in expect.events:
        assert any(k == kind and o == outcome and text in s for k, o, s in summaries), (
            (kind, outcome, text),
            summaries,
        )
    # No more refusals than the row names: nothing else was in the way.
    denied = [s for s in summaries if s[1] == "denied"]
    assert len(denied) == sum(1 for _, o, _ in expect.events if o == "denied"), denied


def test_nothing_reached_1_1_1_1_but_through_the_gateway(world: World) -> None:
    for name in ("blocked-net.yaml", "allowed-net.yaml", "curl-blocked.json"):
        assert world.run(name).returncode == EXPECTED[name].exit_code
    assert world.plain.seen == [] and world.plain.connections == 0


def test_allowed_net_is_allowed_through_the_gateway(world: World) -> None:
    """The manifest's grant, used as stockade means it: through the proxy."""
    allowed = world.run("allowed-net.yaml", "/usr/bin/python3", "-c", VIA_PROXY)
    blocked = world.run("blocked-net.yaml", "/usr/bin/python3", "-c", VIA_PROXY)
    assert allowed.returncode == 0 and allowed.stdout == "200 hello from 1.1.1.1\n", allowed.stderr
    assert blocked.returncode == 0 and blocked.stdout.startswith(
        "403 stockade: GET http://1.1.1.1/ refused: no network.allow rule matches 1.1.1.1:80"
    ), blocked.stdout
    assert [(s.method, s.target) for s in world.plain.seen] == [("GET", "/")]
    first, second = world.runs()
    (request,) = [e for e in first if e["kind"] == "http.request"]
    assert request["outcome"] == "allowed" and request["detail"]["rule"].startswith("network.allow[0]")
    assert request["detail"]["host"] == CLOUDFLARE and request["detail"]["status"] == 200
    (refusal,) = [e for e in second if e["kind"] == "http.request"]
    assert refusal["outcome"] == "denied"


def test_the_gateway_lets_through_what_allowed_hosts_names_and_nothing_else(world: World) -> None:
    """demo-agent allows api.openai.com:443 only: asked for example.com, its gateway refuses."""
    code = "import urllib.request; urllib.request.urlopen('https://example.com/', timeout=10)"
    done = world.run("demo-agent.yaml", "/usr/bin/python3", "-c", code)
    assert done.returncode == 1 and "Tunnel connection failed: 403" in done.stderr, done.stderr
    (request,) = [e for e in world.runs()[0] if e["kind"] == "http.request"]
    assert request["outcome"] == "denied" and request["detail"]["host"] == "example.com"
    assert world.tls.connections == 0  # refused before any connection upstream


@pytest.mark.parametrize(
    ("name", "argv", "exit_code", "out", "refusal"),
    [
        ("file-reader.yaml", (), 0, "stockade\n", None),
        ("file-reader.yaml", ("/bin/cat", "/etc/shadow"), 1, "", "read of /etc/shadow refused by landlock"),
        ("policies_default.yaml", ("/usr/bin/python3", "-c", UNSHARE), 0, "0 0\n", None),
        ("policies_strict-llm-agent.yaml", ("/bin/sh", "-c", "true"), 126, "", "execution of /usr/bin/dash"),
    ],
)
def test_manifests_without_network_run_with_stockade_exec(
    tmp_path: Path, name: str, argv: tuple[str, ...], exit_code: int, out: str, refusal: str | None
) -> None:
    events = tmp_path / "events.jsonl"
    command = ["--", *argv] if argv else []
    done = stockade("exec", "--policy", str(manifest(name)), "--events", str(events), *command, env=ENV)
    assert done.returncode == exit_code, done.stderr
    assert done.stdout == out
    recorded = [json.loads(line) for line in events.read_text().splitlines()]
    denied = [e["summary"] for e in recorded if e["outcome"] == "denied"]
    if exit_code == 126:  # allowed_bins: only /usr/bin/python3 may run
        assert "stockade: /bin/sh: Permission denied" in done.stderr, done.stderr
        assert denied == [f"{refusal} refused by landlock (fs.execute)"], denied
        return
    assert denied == ([] if refusal is None else [f"{refusal} (fs.read_file)"]), denied
    if name == "policies_default.yaml":
        assert [e["outcome"] for e in recorded if e["layer"] == "seccomp"] == ["audited"]


# Where each bad manifest is wrong, and the start of what the loader says (tests/policy/test_agentos.py).
BAD_ERRORS = {
    "bad-cidr.yaml": ("5:5", "allowed_hosts[0] '10.0.0.0/33' is not a valid network"),
    "internal_manifest_testdata_bad-cidr.yaml": (
        "4:5",
        "allowed_hosts[0] '10.0.0.0/33' is not a valid network",
    ),
    "bad-paths.yaml": ("8:5", "allowed_paths[0] '/srv/**' uses '**', which paths do not support"),
    "internal_manifest_testdata_bad-paths.yaml": ("5:5", "allowed_paths[0] '/foo/**' uses '**'"),
    "internal_manifest_testdata_bad-typo.yaml": (
        "4:1",
        "allowed_pots is not a known key; did you mean 'allowed_paths'?",
    ),
}


@pytest.mark.parametrize("name", BAD)
@pytest.mark.parametrize("how", ["exec", "run"])
def test_a_refused_manifest_does_not_run(tmp_path: Path, name: str, how: str) -> None:
    where, message = BAD_ERRORS[name]
    witness = tmp_path / "ran"
    command = ["/bin/sh", "-c", f"touch {witness}"]
    if how == "exec":
        done = stockade("exec", "--policy", str(manifest(name)), "--", *command)
    else:  # no daemon is reached: the file is refused first
        done = stockade("run", "-f", str(manifest(name)), *daemon_flags(tmp_path), "--", *command)
    assert done.returncode == 3, done.stderr
    assert f"{manifest(name)}:{where}: {message}" in done.stderr, done.stderr
    assert done.stdout == "" and not witness.exists()
    assert not (tmp_path / "state").exists()
