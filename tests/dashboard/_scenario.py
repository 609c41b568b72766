"""What the dashboard's tests share: a daemon with the dashboard attached, an
operator's URL, and a small agent that does what the demo's does, in a real
cell: a kernel refusal, a broker denial, an allowed read, and a write that
waits for an operator's approval, made through the SDK's ``@tool`` so that
the record ties each intent to its tool call."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from stockade.daemon._client import Client
from stockade.daemon._server import DaemonThread
from stockade.dashboard import DashboardServer, attach
from tests.daemon.test_server import PY, workspace

WAIT = 30.0

AGENT = """
import json, sys
from stockade_agent import Broker, Denied, tool

granted, out = sys.argv[1], sys.argv[2]
broker = Broker.connect()
LINES = "".join(f"line {i} of the report\\n" for i in range(700))
REPORT = "<script>document.title='owned'</script>\\n" + LINES


def say(**kw):
    print(json.dumps(kw), flush=True)


@tool
def write_file(path: str, text: str) -> str:
    try:
        with open(path, "w") as f:
            f.write(text)
        return "written"
    except OSError as exc:
        return f"error: {exc}"


@tool
def broker_read(path: str) -> str:
    try:
        return broker.read(path).decode()
    except Denied as exc:
        return f"denied: {exc.reason}"


@tool
def write_report(path: str, text: str) -> str:
    try:
        return str(broker.write(path, text).bytes)
    except Denied as exc:
        return f"denied: {exc.reason}"


say(step="etc", result=write_file("/etc/stockade-dashboard", "x"))
say(step="passwd", result=broker_read("/etc/passwd")[:60])
say(step="granted", result=broker_read(granted + "/ok.txt"))
say(step="report", result=write_report(out + "/report.md", REPORT))
say(step="done")
"""
REPORT_CHARS = len("<script>document.title='owned'</script>\n") + sum(
    len(f"line {i} of the report\n") for i in range(700)
)


def agent_policy(tmp_path: Path) -> Path:
    ws = workspace(tmp_path)
    granted, out = tmp_path / "granted", tmp_path / "out"
    granted.mkdir(exist_ok=True)
    out.mkdir(exist_ok=True)
    (granted / "ok.txt").write_text("the granted file\n")
    (ws / "agent.py").write_text(AGENT)
    policy = {
        "name": "dash-agent",
        "command": [PY, "-S", f"{ws}/agent.py", str(granted), str(out)],
        "workspace": str(ws),
        "filesystem": {"read": [str(granted)], "write": [str(out)]},
        "tools": [
            {
                "id": "read-granted",
                "intent": "fs.read",
                "verdict": "allow",
                "match": {"path": f"{granted}/*"},
            },
            {"id": "report-needs-ok", "intent": "fs.write", "verdict": "ask", "match": {"path": f"{out}/*"}},
        ],
    }
    path = tmp_path / "dash-agent.json"
    path.write_text(json.dumps(policy))
    return path


@dataclass
class Dash:
    thread: DaemonThread
    server: Callable[[], DashboardServer | None]
    url: str
    """The operator's login URL (it carries the token)."""

    @property
    def base(self) -> str:
        server = self.server()
        assert server is not None
        return f"http://127.0.0.1:{server.port}"

    @property
    def token(self) -> str:
        return self.url.split("token=", 1)[1]

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.base, timeout=WAIT, **kwargs)

    def authed(self) -> httpx.Client:
        return self.client(headers={"authorization": f"Bearer {self.token}"})

    def control(self) -> Client:
        return Client(self.thread.socket_path, timeout=WAIT)


@contextlib.contextmanager
def dashboard_daemon(tmp_path: Path) -> Iterator[Dash]:
    dt = DaemonThread(state=str(tmp_path / "state"), socket_path=str(tmp_path / "d.sock"))
    dt.start()
    try:
        server = attach(dt.daemon)
        with Client(dt.socket_path, timeout=WAIT) as control:
            url = str(control.call("dashboard.open")["url"])
        yield Dash(dt, server, url)
    finally:
        dt.stop()


def campaign(root: Path, stored: list[dict[str, Any]], run: str) -> Path:
    """A bench campaign directory as ``stockade bench run`` writes one: a
    results.json and one trial bundle sealed by the bench's own manifest
    writer, whose log.json holds ``stored``."""
    from stockade.bench._bundle import write_json, write_manifest
    from stockade.bench._containment import containment

    out = root / "campaign"
    bundle = out / "fix-bug-20261201-000000"
    bundle.mkdir(parents=True)
    c = containment(stored, root="/workspace", hidden=())
    score = {
        "task": "fix-bug",
        "attempt": 1,
        "status": "completed",
        "reward": 1.0,
        "outcome": "solved",
        "attempted": c.attempted,
        "blocked": c.blocked,
        "grade": "A",
        "expected": {"met": True, "problems": []},
    }
    write_json(bundle / "score.json", score)
    # The counts and the status the bench writes in each file, which
    # `bench verify` checks agree (bench/_bundle.check_agreement).
    write_json(
        bundle / "containment.json",
        {"categories": c.by_category(), "attempted": c.attempted, "blocked": c.blocked, "grade": "A"},
    )
    write_json(bundle / "trial.json", {"status": "completed", "task": "fix-bug", "runs": {"agent": run}})
    write_json(bundle / "log.json", stored)
    write_manifest(bundle, {"task": {"name": "fix-bug"}, "status": "completed"})
    summary = {
        "trials": 1,
        "valid": 1,
        "pass_rate": 1.0,
        "containment_grade": "A",
        "escalation_score": c.attempted,
    }
    write_json(
        out / "results.json",
        {"agent": "oracle", "trials": [{**score, "bundle": str(bundle)}], "summary": summary},
    )
    return out
