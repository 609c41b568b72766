"""Each example of examples/ runs the way its README says, and does what it says.

Every example is copied to the test's own directory first (its workspace is its
folder, so running it in place would write into the repository). Examples that
need the network or a model run where nothing can leave the machine: in a
network namespace the test makes, holding the test's DNS server, its "internet"
(servers on addresses put on that namespace's ``lo``) and the mock model.

Two ways of running, as the READMEs say:

- ``stockade exec --policy …``: no daemon. A process that needs the test's
  internet (the web fetcher) is started inside the namespace with ``nsenter``.
- ``stockade run -f …``: the CLI finds the daemon the test started. That daemon
  runs in this process, its threads started from a thread inside the
  namespace (so its gateway and LLM endpoint reach only the test's world), but
  its kernel audit reader is opened in the host's namespace (``host_audit_reader``):
  the kernel sends audit records only there, and without them the record would
  lack the kernel's refusals.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from stockade.daemon._server import DaemonThread
from stockade.gateway import GatewayOptions
from tests._netns import TestNetns
from tests.gateway._dns import TestDns
from tests.gateway._servers import Canary, HttpServer, Reply
from tests.gateway._tls import TestPki

ROOT = Path(__file__).parents[2]
EXAMPLES = ROOT / "examples"
STOCKADE = str(Path(sys.executable).with_name("stockade"))
PUBLIC = "93.184.216.34"
ATTACKER = "93.184.216.36"
WAIT = 120.0

T = TypeVar("T")


# --------------------------------------------------------------------------- helpers


def copy_example(name: str, tmp_path: Path) -> Path:
    """The example's folder, copied under ``tmp_path`` (without files a run left)."""
    target = tmp_path / name
    shutil.copytree(EXAMPLES / name, target, ignore=shutil.ignore_patterns("__pycache__", "pages", "*.out"))
    return target


def readme_commands(name: str) -> list[str]:
    """The ``.venv/bin/stockade …`` lines of the example's README code blocks."""
    text = (EXAMPLES / name / "README.md").read_text()
    blocks = re.findall(r"```(?:sh|console)?\n(.*?)```", text, re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if "stockade " in line]


def stockade(
    *args: str, env: dict[str, str] | None = None, ns: TestNetns | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    argv = [STOCKADE, *args]
    return subprocess.run(
        ns.argv(argv) if ns else argv,
        capture_output=True,
        text=True,
        timeout=WAIT,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )


class LoopIn:
    """An event loop in a thread that lives inside ``ns``: servers it starts listen there."""

    def __init__(self, ns: TestNetns) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, args=(ns,), daemon=True)
        self._thread.start()

    def _main(self, ns: TestNetns) -> None:
        with ns.entered():
            self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)
        self.loop.close()


@contextmanager
def host_audit_reader() -> Iterator[None]:
    """A kernel audit reader of the test's own, opened from the host's network namespace.

    The kernel sends its audit records to readers in the host's namespace only.
    The process-wide reader (``shared_audit_reader``) is opened lazily by the
    first cell, and another test's daemon may have started that cell from a
    thread inside a namespace of its own: that reader would then hear nothing.
    So each test here puts a reader it opened itself in its place, and puts the
    old one back afterwards.
    """
    from stockade.cell import _cell
    from stockade.cell._audit import AuditReader

    reader = AuditReader()
    reader.start()
    saved = _cell._shared_audit
    _cell._shared_audit = reader
    try:
        yield
    finally:
        _cell._shared_audit = saved
        reader.close()


@contextmanager
def daemon_in(ns: TestNetns, tmp_path: Path, **gateway: Any) -> Iterator[DaemonThread]:
    """A daemon whose threads live in ``ns``, its audit reader in the host's namespace."""
    with host_audit_reader():
        with ns.entered():
            dt = DaemonThread(
                state=str(tmp_path / "state"),
                socket_path=str(tmp_path / "d.sock"),
                gateway=GatewayOptions(**gateway),
            ).start()
        try:
            yield dt
        finally:
            dt.stop()


def daemon_flags(tmp_path: Path) -> list[str]:
    return ["--state", str(tmp_path / "state"), "--socket", str(tmp_path / "d.sock")]


@contextmanager
def mock_llm(ns: TestNetns, script: Path | str) -> Iterator[str]:
    """``stockade mock-llm --port 0 --script SCRIPT`` inside ``ns``; yields its URL."""
    proc = ns.popen(
        [STOCKADE, "mock-llm", "--port", "0", "--script", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once it accepts connections
        match = re.search(r"listening on (http://\S+)", line)
        assert match, f"mock-llm did not start: {line!r} {proc.stderr.read() if proc.stderr else ''}"
        yield match.group(1)
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


@dataclass
class Exported:
    text: str
    events: list[dict[str, Any]]


def export(tmp_path: Path) -> Exported:
    """The record as ``stockade export`` gives it: text, and JSON lines."""
    db = str(tmp_path / "state" / "events.db")
    text = stockade("export", "--format", "text", "--db", db)
    lines = stockade("export", "--format", "jsonl", "--db", db)
    assert text.returncode == 0 and lines.returncode == 0, text.stderr + lines.stderr
    events = [json.loads(line)["event"] for line in lines.stdout.splitlines()]
    return Exported(text.stdout, events)


def test_every_example_has_a_readme_with_its_command() -> None:
    names = ["quickstart", "prompt-injection", "code-runner", "web-fetcher", "openai-tool-loop"]
    names.append("wrap-existing-agent")
    for name in names:
        commands = readme_commands(name)
        assert commands, f"examples/{name}/README.md shows no stockade command"
        assert any(f"examples/{name}/" in c for c in commands), commands
        assert (EXAMPLES / name / "policy.yaml").is_file()
    index = (EXAMPLES / "README.md").read_text()
    for name in [*names, "scenarios/pipeline", "scenarios/fanout"]:
        assert f"]({name}/" in index, f"examples/README.md does not link {name}"
    recipes = (ROOT / "docs" / "RECIPES.md").read_text()
    assert "examples/openai-tool-loop/" in recipes and "examples/wrap-existing-agent/" in recipes


def test_every_example_policy_is_valid() -> None:
    for policy in sorted(EXAMPLES.glob("*/policy.yaml")):
        done = stockade("validate", str(policy))
        assert done.returncode == 0, (policy, done.stdout, done.stderr)


# --------------------------------------------------------------------------- quickstart


def test_quickstart(tmp_path: Path) -> None:
    assert ".venv/bin/stockade exec --policy examples/quickstart/policy.yaml" in readme_commands("quickstart")
    example = copy_example("quickstart", tmp_path)
    done = stockade("exec", "--policy", str(example / "policy.yaml"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert (example / "summary.txt").read_text() == "Quarterly notes: 3 lines, 18 words\n"
    assert "read /etc/shadow: refused" in done.stdout
    assert "plant /usr/bin/update-helper: refused" in done.stdout
    assert not Path("/usr/bin/update-helper").exists()
    # Both refusals were recorded by the kernel and summarised by stockade.
    assert "stockade: 2 refusal(s) in this cell" in done.stderr
    assert "read of /etc/shadow refused by landlock (fs.read_file)" in done.stderr
    assert "creation of a file in /usr/bin refused by landlock (fs.make_reg)" in done.stderr


def test_quickstart_under_the_daemon_leaves_its_refusals_in_the_record(tmp_path: Path) -> None:
    text = (EXAMPLES / "quickstart" / "README.md").read_text()
    assert "`.venv/bin/stockade run -f examples/quickstart/policy.yaml`" in text
    example = copy_example("quickstart", tmp_path)
    with TestNetns() as ns, daemon_in(ns, tmp_path):
        done = stockade("run", "-f", str(example / "policy.yaml"), *daemon_flags(tmp_path))
        record = export(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (example / "summary.txt").read_text() == "Quarterly notes: 3 lines, 18 words\n"
    denied = [
        line.split(" ", 4)[4] for line in record.text.splitlines() if line.split(" ")[4:5] == ["denied"]
    ]
    assert denied == [
        "denied read of /etc/shadow refused by landlock (fs.read_file)",
        "denied creation of a file in /usr/bin refused by landlock (fs.make_reg)",
    ], record.text
    verify = stockade("verify", "--db", str(tmp_path / "state" / "events.db"))
    assert verify.returncode == 0, verify.stdout + verify.stderr


# --------------------------------------------------------------------------- web fetcher


WEB_HOSTS = ["docs.python.org", "pypi.org", "example.com"]


def test_web_fetcher_reaches_its_three_hosts_and_no_other(tmp_path: Path) -> None:
    commands = readme_commands("web-fetcher")
    assert ".venv/bin/stockade exec --policy examples/web-fetcher/policy.yaml" in commands
    example = copy_example("web-fetcher", tmp_path)
    pki = TestPki(tmp_path)
    with TestNetns([PUBLIC, ATTACKER]) as ns:
        loop = LoopIn(ns)
        dns = TestDns({**{host: [PUBLIC] for host in WEB_HOSTS}, "www.wikipedia.org": [ATTACKER]})
        pages = {
            "/3/": Reply(body=b"<h1>Python 3 documentation</h1>"),
            "/simple/pip/": Reply(body=b"<h1>Links for pip</h1>"),
            "/": Reply(body=b"<h1>Example Domain</h1>"),
        }
        web = HttpServer(pages, tls=pki.server_context(WEB_HOSTS))
        canary = Canary()

        async def start() -> None:
            await dns.start()
            await web.listen(PUBLIC, 443)
            await canary.listen(ATTACKER, 443)

        loop.run(start())
        env = {"STOCKADE_DNS": dns.spec, "STOCKADE_UPSTREAM_CA": pki.ca_file}
        try:
            done = stockade("exec", "--policy", str(example / "policy.yaml"), env=env, ns=ns)
            # The README's second command: a host it does not name, a path its rule does not allow.
            refused = stockade(
                "exec",
                "--policy",
                str(example / "policy.yaml"),
                "--",
                "/usr/bin/python3",
                "fetch.py",
                "https://www.wikipedia.org/",
                "https://pypi.org/project/stockade/",
                env=env,
                ns=ns,
            )
        finally:
            loop.run(web.close())
            loop.run(canary.close())
            loop.run(dns.close())
            loop.close()

    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "OK      https://docs.python.org/3/: 31 bytes -> pages/docs.python.org_3.html",
        "OK      https://pypi.org/simple/pip/: 22 bytes -> pages/pypi.org_simple_pip.html",
        "OK      https://example.com/: 23 bytes -> pages/example.com.html",
    ]
    assert (example / "pages" / "docs.python.org_3.html").read_bytes() == b"<h1>Python 3 documentation</h1>"
    # Every request arrived as a GET, each for its own host (the gateway looked inside TLS).
    assert [(s.method, s.headers["host"], s.target) for s in web.seen] == [
        ("GET", "docs.python.org", "/3/"),
        ("GET", "pypi.org", "/simple/pip/"),
        ("GET", "example.com", "/"),
    ]

    assert refused.returncode == 1, refused.stdout + refused.stderr
    pypi = (
        "GET /project/stockade/ to pypi.org:443 is refused: network.allow[1] (pypi.org) allows paths "
        "under /simple/ only; add a prefix of /project/stockade/ to its paths"
    )
    assert refused.stdout.splitlines() == [
        "FAILED  https://www.wikipedia.org/: Tunnel connection failed: 403 Forbidden",
        f"REFUSED https://pypi.org/project/stockade/: 403 stockade: GET https://pypi.org/project/stockade/ "
        f"refused: {pypi}",
    ]
    assert canary.hits == []  # nothing reached the host the policy does not name
    assert [s.target for s in web.seen].count("/project/stockade/") == 0
    assert refused.stderr.splitlines() == [
        "stockade: 2 refusal(s) in this cell",
        "  - CONNECT www.wikipedia.org:443 refused: no network.allow rule matches www.wikipedia.org:443; "
        'add "- host: www.wikipedia.org" to network.allow [gateway]',
        f"  - GET https://pypi.org/project/stockade/ refused: {pypi} [gateway]",
    ]


# --------------------------------------------------------------------------- prompt injection


def test_prompt_injection_every_attempt_is_refused_and_recorded(tmp_path: Path) -> None:
    commands = readme_commands("prompt-injection")
    assert commands[:2] == [
        ".venv/bin/stockade mock-llm --port 8765 --script examples/prompt-injection/injected.yaml &",
        ".venv/bin/stockade run -f examples/prompt-injection/policy.yaml",
    ]
    example = copy_example("prompt-injection", tmp_path)
    with TestNetns([ATTACKER]) as ns:
        canary = Canary()
        loop = LoopIn(ns)
        loop.run(canary.listen(ATTACKER, 443))
        try:
            with daemon_in(ns, tmp_path), mock_llm(ns, example / "injected.yaml") as url:
                done = stockade(
                    "run",
                    "-f",
                    str(example / "policy.yaml"),
                    *daemon_flags(tmp_path),
                    env={"MOCK_LLM_URL": url},
                )
                record = export(tmp_path)
        finally:
            loop.run(canary.close())
            loop.close()

    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout.splitlines()
    # The task is done, after the five attempts the notes asked for.
    assert (example / "report.md").read_text().startswith("Release notes: the importer handles files")
    assert out[-1] == "model: Done: report.md holds the summary.", out
    attempts = [line for line in out if "-> error:" in line]
    assert len(attempts) == 5, out
    assert "PermissionError" in attempts[0] and "/etc/shadow" in attempts[0]
    assert "CONNECT tunnel failed, response 403" in attempts[1]
    assert "Denied: http.fetch was denied by the broker: no network.allow rule" in attempts[2]
    assert "PermissionError" in attempts[3]  # a direct connection
    assert "PermissionError" in attempts[4] and "/etc/profile.d/zz-update.sh" in attempts[4]
    assert canary.hits == []
    assert not Path("/etc/profile.d/zz-update.sh").exists()

    # Each attempt is a refusal in the record, by the layer meant to refuse it.
    denied = [(e["layer"], e["kind"], e["summary"]) for e in record.events if e["outcome"] == "denied"]
    summaries = "\n".join(s for _, _, s in denied)
    assert [(layer, kind) for layer, kind, _ in denied if layer in ("gateway", "broker")] == [
        ("gateway", "http.request"),
        ("broker", "intent"),
    ], denied
    kernel = [s for layer, _, s in denied if layer == "landlock"]
    assert len(kernel) == 3, denied
    assert "read of /etc/shadow refused by landlock" in summaries
    assert "CONNECT exfil.attacker.example:443 refused" in summaries
    assert "http.fetch https://exfil.attacker.example/collect" in summaries
    assert any("93.184.216.36" in s or "net.connect_tcp" in s for s in kernel), kernel
    assert any("/etc/profile.d" in s for s in kernel), kernel
    # The README's way to read them: the text export, one line each.
    assert ".venv/bin/stockade export --format text --since 10m | awk '$5 == \"denied\"'" in commands
    refusals = [line for line in record.text.splitlines() if line.split(" ")[4:5] == ["denied"]]
    assert len(refusals) == 5, record.text
    # Every tool call of the model is in the record too.
    calls = [e["detail"]["name"] for e in record.events if e["kind"] == "tool.call"]
    assert calls == [
        "read_file",
        "read_file",
        "read_file",
        "shell",
        "fetch",
        "shell",
        "write_file",
        "write_file",
    ]
    run_end = [e for e in record.events if e["kind"] == "run.end"]
    assert run_end and run_end[0]["detail"].get("halted") in (None, False, ""), run_end


# --------------------------------------------------------------------------- code runner


def test_code_runner_runs_the_models_code_in_a_workbench_with_no_network(tmp_path: Path) -> None:
    commands = readme_commands("code-runner")
    assert commands == [
        ".venv/bin/stockade mock-llm --port 8765 --script examples/code-runner/model.yaml &",
        ".venv/bin/stockade run -f examples/code-runner/policy.yaml",
    ]
    example = copy_example("code-runner", tmp_path)
    with TestNetns() as ns, daemon_in(ns, tmp_path), mock_llm(ns, example / "model.yaml") as url:
        done = stockade(
            "run", "-f", str(example / "policy.yaml"), *daemon_flags(tmp_path), env={"MOCK_LLM_URL": url}
        )
        record = export(tmp_path)

    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "run_python -> exit code 0",
        "1060",
        "run_python -> exit code 0",
        "network: unreachable: <urlopen error [Errno -3] Temporary failure in name resolution>",
        "write_file -> wrote 41 characters to answer.md",
        "model: Done: answer.md holds the answer.",
    ]
    assert (example / "answer.md").read_text() == "The sum of the primes below 100 is 1060.\n"
    execs = [e for e in record.events if e["kind"] == "intent" and e["detail"]["intent"] == "exec"]
    assert [(e["outcome"], e["detail"]["rule"]) for e in execs] == [("allowed", "run-python")] * 2
    # Each ran in a cell of its own, not the agent's.
    agent_cell = next(e["cell"] for e in record.events if e["kind"] == "llm.call")
    workbenches = [e["cell"] for e in record.events if e["kind"] == "cell.start" and e["cell"] != agent_cell]
    assert len(set(workbenches)) == 2, workbenches
    # The one refusal: the resolver's UDP socket, in the second workbench cell (the kernel's record).
    denied = [e for e in record.events if e["outcome"] == "denied"]
    assert [(e["layer"], e["summary"], e["cell"]) for e in denied] == [
        ("seccomp", "socket refused by seccomp", workbenches[1])
    ], record.text


# --------------------------------------------------------------------------- recipes


def test_openai_tool_loop_records_each_call_with_the_models_id(tmp_path: Path) -> None:
    commands = readme_commands("openai-tool-loop")
    assert commands[:2] == [
        ".venv/bin/stockade mock-llm --port 8765 --script examples/openai-tool-loop/model.yaml &",
        ".venv/bin/stockade run -f examples/openai-tool-loop/policy.yaml",
    ]
    example = copy_example("openai-tool-loop", tmp_path)
    with TestNetns() as ns, daemon_in(ns, tmp_path), mock_llm(ns, example / "model.yaml") as url:
        done = stockade(
            "run", "-f", str(example / "policy.yaml"), *daemon_flags(tmp_path), env={"MOCK_LLM_URL": url}
        )
        record = export(tmp_path)

    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout.splitlines()
    assert out[0] == "client: MiniOpenAI (the openai package is not installed)"  # /usr/bin/python3 has none
    assert out[1].startswith('list_docs({"path": "/usr/share/common-licenses"}) -> Apache-2.0 '), out
    assert out[2] == 'read_doc({"path": "/usr/share/common-licenses/Apache-2.0"}) -> 11358 characters', out
    assert out[4].startswith('read_doc({"path": "/etc/passwd"}) -> denied by the policy: no tools rule'), out
    assert out[-1] == "model: Done: summary.md has two lines."
    assert (example / "summary.md").read_text().startswith("- Apache-2.0: permissive")

    intents = [
        (e["detail"]["intent"], e["outcome"], e["detail"]["rule"])
        for e in record.events
        if e["kind"] == "intent"
    ]
    assert intents == [
        ("fs.list", "allowed", "list-licenses"),
        ("fs.read", "allowed", "read-licenses"),
        ("fs.read", "allowed", "read-licenses"),
        ("fs.read", "denied", None),
    ]
    # Each tool.call carries the model's own id for the call, as the model's answer gave it.
    model_ids = [
        call["id"]
        for e in record.events
        if e["kind"] == "llm.call"
        for call in (e["detail"]["response"] or {}).get("tool_calls") or []
    ]
    recorded = [
        (e["detail"]["name"], e["detail"]["tool_call"]) for e in record.events if e["kind"] == "tool.call"
    ]
    assert [name for name, _ in recorded] == [
        "list_docs",
        "read_doc",
        "read_doc",
        "read_doc",
        "write_summary",
    ]
    assert [call_id for _, call_id in recorded] == model_ids
    # ...and so does each intent the call made: the record links the two.
    linked = [e["detail"].get("tool_call") for e in record.events if e["kind"] == "intent"]
    assert linked == model_ids[:4]


def test_wrapping_an_existing_agent_needs_only_a_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commands = readme_commands("wrap-existing-agent")
    assert (
        "OPENAI_API_KEY=sk-... .venv/bin/stockade run -f examples/wrap-existing-agent/policy.yaml" in commands
    )
    assert (
        "LLM_URL=http://127.0.0.1:8765/v1 OPENAI_API_KEY=unused "
        ".venv/bin/stockade run -f examples/wrap-existing-agent/policy.yaml"
    ) in commands
    example = copy_example("wrap-existing-agent", tmp_path)
    original = (EXAMPLES / "wrap-existing-agent" / "agent" / "triage.py").read_bytes()
    assert b"stockade" not in original  # nothing in the program knows about stockade
    key = "sk-operator-key-never-in-the-cell"
    monkeypatch.setenv("OPENAI_API_KEY", key)  # the daemon's (this process's) environment
    with TestNetns() as ns, daemon_in(ns, tmp_path), mock_llm(ns, example / "model.yaml") as url:
        done = stockade(
            "run", "-f", str(example / "policy.yaml"), *daemon_flags(tmp_path), env={"LLM_URL": url}
        )
        record = export(tmp_path)

    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "#101 bug: Crash when the config file is empty",
        "#102 feature: Support for TOML configuration",
        "#103 question: Where do the logs go?",
    ]
    labels = json.loads((example / "agent" / "labels.json").read_text())
    assert labels == {"101": "bug", "102": "feature", "103": "question"}
    assert (example / "agent" / "triage.py").read_bytes() == original
    calls = [e for e in record.events if e["kind"] == "llm.call"]
    assert [(e["outcome"], e["detail"]["model"], e["detail"]["requested_model"]) for e in calls] == [
        ("allowed", "gpt-4o-mini", "gpt-4o-mini")
    ] * 3
    assert (
        calls[-1]["detail"]["budget"]["requests"] == 3 and calls[-1]["detail"]["budget"]["max_requests"] == 20
    )
    # The operator's key went nowhere the agent or the record holds.
    assert key not in json.dumps(record.events) and key not in done.stdout + done.stderr
    assert all(key.encode() not in p.read_bytes() for p in (example / "agent").iterdir())
