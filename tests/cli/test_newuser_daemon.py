"""The daemon's commands as a new user meets them (issue 13): status --json
without a daemon, stop --all, logs --timestamps/--json, logs -f when the daemon
dies, lost runs said aloud, run's id/summary/--json output, secrets from the
caller's shell, report, prune, init, completion, export's mistakes."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.cli.main import main
from stockade.daemon._server import DaemonThread
from stockade.exit_codes import ExitCode

WAIT = 30.0
STOCKADE = os.path.join(os.path.dirname(sys.executable), "stockade")


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


class Daemon:
    def __init__(self, tmp_path: Path) -> None:
        self.state = str(tmp_path / "state")
        self.socket_path = str(tmp_path / "d.sock")
        self.thread = DaemonThread(state=self.state, socket_path=self.socket_path)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path)
    d.thread.start()
    try:
        yield d
    finally:
        d.thread.stop()


def place(d: Daemon) -> tuple[str, ...]:
    return ("--state", d.state, "--socket", d.socket_path)


def policy(tmp_path: Path, name: str, command: str, extra: str = "") -> Path:
    ws = tmp_path / f"ws-{name}"
    ws.mkdir(exist_ok=True)
    file = tmp_path / f"{name}.yaml"
    file.write_text(f"name: {name}\nworkspace: {ws}\ncommand: [/bin/sh, -c, {json.dumps(command)}]\n{extra}")
    return file


def wait_for(predicate: object, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_status_json_without_a_daemon_is_json_and_exit_4(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, _ = cli(capsys, "status", "--json", "--socket", str(tmp_path / "none.sock"))
    assert code == ExitCode.DAEMON_UNREACHABLE
    body = json.loads(out)
    assert body["running"] is False and "not running" in body["error"]


def test_stop_all_stops_every_live_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, daemon: Daemon
) -> None:
    ids = []
    for name in ("one", "two"):
        code, out, err = cli(
            capsys, "run", "--detach", "-f", str(policy(tmp_path, name, "exec sleep 60")), *place(daemon)
        )
        assert code == 0, err
        ids.append(out.strip())
    code, _, err = cli(capsys, "stop", *place(daemon))
    assert code == ExitCode.USAGE and "or --all" in err
    code, out, err = cli(capsys, "stop", "--all", "--grace", "0s", *place(daemon))
    assert code == 0, err
    for run_id in ids:
        assert run_id in out
    code, out, _ = cli(capsys, "ps", "--json", *place(daemon))
    assert all(r["state"] not in ("running", "stopping") for r in json.loads(out))
    code, out, _ = cli(capsys, "stop", "--all", *place(daemon))
    assert code == 0 and "no run is live" in out


def test_logs_with_timestamps_and_as_json(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, daemon: Daemon
) -> None:
    file = policy(tmp_path, "talk", "echo out-line; echo err-line >&2; echo second")
    code, out, err = cli(capsys, "run", "-f", str(file), *place(daemon))
    assert code == 0, err
    run_line = next(line for line in err.splitlines() if "started" in line)
    run_id = run_line.split()[2]
    before = time.time()
    code, out, _ = cli(capsys, "logs", "--json", run_id, *place(daemon))
    assert code == 0
    items = [json.loads(line) for line in out.splitlines()]
    # Each stream in its order (the two pipes are read as they come).
    assert [i["line"] for i in items if i["stream"] == "stdout"] == ["out-line", "second"]
    assert [i["line"] for i in items if i["stream"] == "stderr"] == ["err-line"]
    assert all(before - 60 < i["time"] <= before for i in items)
    code, out, err = cli(capsys, "logs", "-t", run_id, *place(daemon))
    assert code == 0
    stamped = out.splitlines() + err.splitlines()
    assert len(stamped) == 3
    for line in stamped:
        stamp, _, text = line.partition(" ")
        assert stamp.endswith("Z") and stamp[4] == "-" and stamp[10] == "T", line
        assert text in ("out-line", "err-line", "second")


def test_a_foreground_run_says_its_id_and_its_refusals_and_json_has_the_output(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, daemon: Daemon
) -> None:
    file = policy(tmp_path, "nosy", "echo hi; cat /etc/shadow; exit 0")
    code, out, err = cli(capsys, "run", "-f", str(file), *place(daemon))
    assert code == 0
    assert out == "hi\n"
    assert "stockade: run r-" in err and "started" in err
    assert "refusal(s) in run r-" in err and "/etc/shadow" in err
    code, out, err = cli(capsys, "run", "--json", "-f", str(file), *place(daemon))
    body = json.loads(out)
    assert body["exit_code"] == 0 and "hi\n" in body["stdout"]


def test_report_shows_a_run_again_later(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, daemon: Daemon
) -> None:
    file = policy(tmp_path, "later", "cat /etc/shadow; exit 3")
    code, _, err = cli(capsys, "run", "-f", str(file), *place(daemon))
    assert code == 3
    run_id = next(line for line in err.splitlines() if "started" in line).split()[2]
    code, out, err = cli(capsys, "report", run_id, "--state", daemon.state)
    assert code == 0, err
    assert f"run {run_id}: ended, exit code 3" in out
    assert "/etc/shadow" in out and "refusal(s)" in out
    code, out, _ = cli(capsys, "report", "later", "--json", "--state", daemon.state)
    assert json.loads(out)["run"] == run_id and json.loads(out)["refusals"] >= 1
    code, _, err = cli(capsys, "report", "r-000000000000", "--state", daemon.state)
    assert code == ExitCode.NOT_FOUND and err.startswith("stockade: ")


def test_prune_removes_ended_runs_only_and_dry_run_removes_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, daemon: Daemon
) -> None:
    code, _, _ = cli(capsys, "run", "-f", str(policy(tmp_path, "done", "true")), *place(daemon))
    assert code == 0
    code, out, _ = cli(
        capsys, "run", "--detach", "-f", str(policy(tmp_path, "live", "exec sleep 60")), *place(daemon)
    )
    live = out.strip()
    runs = Path(daemon.state) / "runs"
    ended = [p.name for p in runs.iterdir() if p.name != live]
    assert len(ended) == 1
    code, out, _ = cli(capsys, "prune", "--dry-run", *place(daemon))
    assert code == 0 and f"would remove run {runs / ended[0]}" in out
    assert (runs / ended[0]).exists()
    code, out, err = cli(capsys, "prune", "--yes", *place(daemon))
    assert code == 0, err
    assert not (runs / ended[0]).exists()
    assert (runs / live).exists()
    assert (Path(daemon.state) / "events.db").exists()  # the record stays
    code, out, _ = cli(capsys, "report", ended[0], "--state", daemon.state)
    assert code == 0 and ended[0] in out


def test_prune_without_a_terminal_asks_for_yes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, daemon: Daemon
) -> None:
    cli(capsys, "run", "-f", str(policy(tmp_path, "gone", "true")), *place(daemon))
    code, _, err = cli(capsys, "prune", *place(daemon))
    assert code == ExitCode.USAGE and "--yes" in err
    assert len(list((Path(daemon.state) / "runs").iterdir())) == 1


def test_secrets_come_from_the_callers_shell(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A daemon of its own process, whose environment lacks the secret.
    state, sock = tmp_path / "state", tmp_path / "d.sock"
    env = {k: v for k, v in os.environ.items() if k != "STOCKADE_TEST_SECRET"}
    proc = subprocess.Popen(
        [STOCKADE, "daemon", "--state", str(state), "--socket", str(sock)], stderr=subprocess.PIPE, env=env
    )
    try:
        assert proc.stderr is not None
        ready, _, _ = select.select([proc.stderr], [], [], WAIT)
        assert ready and "listening on" in proc.stderr.readline().decode()
        extra = "secrets:\n  - {name: API_TOKEN, env: STOCKADE_TEST_SECRET, hosts: [api.example.com]}\n"
        file = policy(tmp_path, "keyed", 'test -n "$API_TOKEN" && echo placeholder-set', extra)
        monkeypatch.delenv("STOCKADE_TEST_SECRET", raising=False)
        code, _, err = cli(capsys, "run", "-f", str(file), "--socket", str(sock))
        assert code == ExitCode.POLICY, err
        assert "STOCKADE_TEST_SECRET" in err and "not set" in err
        monkeypatch.setenv("STOCKADE_TEST_SECRET", "s3cret-value")
        code, out, err = cli(capsys, "run", "-f", str(file), "--socket", str(sock))
        assert code == 0, err
        assert out == "placeholder-set\n" and "s3cret-value" not in out
    finally:
        proc.terminate()
        proc.wait(WAIT)
        assert proc.stderr is not None
        proc.stderr.close()


def test_the_llm_key_comes_from_the_callers_shell(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``OPENAI_API_KEY=… stockade run -f …`` with a daemon already running
    (whose environment lacks the key): the key is the caller's, as ``${VAR}``
    and secrets are. Unset in the caller's shell too, it is exit 3 naming it."""
    state, sock = tmp_path / "state", tmp_path / "d.sock"
    env = {k: v for k, v in os.environ.items() if k != "STOCKADE_TEST_LLM_KEY"}
    proc = subprocess.Popen(
        [STOCKADE, "daemon", "--state", str(state), "--socket", str(sock)], stderr=subprocess.PIPE, env=env
    )
    try:
        assert proc.stderr is not None
        ready, _, _ = select.select([proc.stderr], [], [], WAIT)
        assert ready and "listening on" in proc.stderr.readline().decode()
        extra = (
            "llm:\n  provider: openai\n  base_url: http://127.0.0.1:9/v1\n  model: m\n"
            "  api_key_env: STOCKADE_TEST_LLM_KEY\n"
        )
        file = policy(tmp_path, "llmkeyed", 'test -n "$OPENAI_BASE_URL" && echo endpoint-set', extra)
        monkeypatch.delenv("STOCKADE_TEST_LLM_KEY", raising=False)
        code, _, err = cli(capsys, "run", "-f", str(file), "--socket", str(sock))
        assert code == ExitCode.POLICY, err
        assert "STOCKADE_TEST_LLM_KEY" in err and "not set" in err
        monkeypatch.setenv("STOCKADE_TEST_LLM_KEY", "sk-callers-key")
        code, out, err = cli(capsys, "run", "-f", str(file), "--socket", str(sock))
        assert code == 0, err
        assert out == "endpoint-set\n" and "sk-callers-key" not in out + err
    finally:
        proc.terminate()
        proc.wait(WAIT)
        assert proc.stderr is not None
        proc.stderr.close()


def test_logs_follow_says_when_the_daemon_dies_and_the_next_daemon_names_lost_runs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    state, sock = tmp_path / "state", tmp_path / "d.sock"
    cmd = [STOCKADE, "daemon", "--state", str(state), "--socket", str(sock)]
    first = subprocess.Popen(cmd, stderr=subprocess.PIPE)
    try:
        assert first.stderr is not None
        ready, _, _ = select.select([first.stderr], [], [], WAIT)
        assert ready and "listening on" in first.stderr.readline().decode()
        file = policy(tmp_path, "longrun", "echo begun; exec sleep 120")
        code, out, err = cli(capsys, "run", "--detach", "-f", str(file), "--socket", str(sock))
        assert code == 0, err
        run_id = out.strip()
        follower = subprocess.Popen(
            [STOCKADE, "logs", "-f", run_id, "--socket", str(sock)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert follower.stdout is not None
        assert follower.stdout.readline() == "begun\n"  # it follows
        first.send_signal(signal.SIGKILL)
        first.wait(WAIT)
        _out, err = follower.communicate(timeout=WAIT)
        assert follower.returncode == ExitCode.DAEMON_UNREACHABLE
        assert f"the daemon went away while run {run_id} was still running" in err
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(WAIT)
        assert first.stderr is not None
        first.stderr.close()
    second = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        assert second.stderr is not None
        lines: list[str] = []

        def read() -> None:
            assert second.stderr is not None
            for line in second.stderr:
                lines.append(line)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        wait_for(lambda: any("marked lost" in line for line in lines), "the lost-runs line")
        assert any(run_id in line and "stockade report RUN" in line for line in lines), lines
        code, out, err = cli(capsys, "ps", "--socket", str(sock))
        assert code == 0 and run_id not in out
        assert f"were lost when it ended ({run_id})" in err
    finally:
        second.terminate()
        second.wait(WAIT)
        reader.join(WAIT)
        second.stderr.close()


def test_init_writes_a_policy_that_validates(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "My Project"
    project.mkdir()
    monkeypatch.chdir(project)
    code, _, err = cli(capsys, "init")
    assert code == 0, err
    text = (project / "stockade.yaml").read_text()
    assert text.startswith("# A starter policy for")
    code, out, _ = cli(capsys, "validate", "stockade.yaml")
    assert code == 0
    assert "valid stockade policy 'my-project'" in out and f"workspace    '{project}' (read-write)" in out
    code, _, err = cli(capsys, "init")
    assert code == ExitCode.USAGE and "--force" in err
    assert (project / "stockade.yaml").read_text() == text


def test_completion_scripts_for_three_shells(capsys: pytest.CaptureFixture[str]) -> None:
    for shell in ("bash", "zsh", "fish"):
        code, out, _ = cli(capsys, "completion", shell)
        assert code == 0 and "_STOCKADE_COMPLETE" in out
    done = subprocess.run(
        [STOCKADE],
        env={
            **os.environ,
            "_STOCKADE_COMPLETE": "bash_complete",
            "COMP_WORDS": "stockade sto",
            "COMP_CWORD": "1",
        },
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    assert "plain,stop" in done.stdout.splitlines()


def test_export_mistakes_are_messages_with_their_codes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, daemon: Daemon
) -> None:
    db = str(Path(daemon.state) / "events.db")
    code, out, err = cli(capsys, "export", "--run", "r-000000000000", "--db", db)
    assert code == ExitCode.NOT_FOUND and out == ""
    assert "holds no event of run 'r-000000000000'" in err
    code, _, err = cli(capsys, "export", "--out", str(tmp_path / "no" / "f"), "--db", db)
    assert code == ExitCode.USAGE and "does not exist; create it first" in err
    assert "Traceback" not in err


def test_a_state_directory_made_beforehand_becomes_owner_only(tmp_path: Path) -> None:
    state = tmp_path / "made-before"
    state.mkdir(mode=0o755)
    os.chmod(state, 0o755)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # sticky, as /tmp: never tightened
    for where, expected in ((state, 0o700), (shared, 0o1777)):
        dt = DaemonThread(state=str(where), socket_path=str(tmp_path / f"{where.name}.sock"))
        dt.start()
        try:
            assert (os.stat(where).st_mode & 0o7777) == expected
        finally:
            dt.stop()


AGENT = """
import sys, stockade_agent as sa
b = sa.Broker.connect()
for step in sys.argv[1:]:
    kind, _, arg = step.partition("=")
    try:
        if kind == "ask":
            print("answer:", b.ask(arg), flush=True)
        else:
            b.write(arg, "x")
            print("written", arg, flush=True)
    except sa.NoAnswer:
        print("NoAnswer", flush=True)
    except sa.Denied as exc:
        print("Denied", exc.reason, flush=True)
"""


def start_agent(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, d: Daemon, tools: str, *steps: str, extra: str = ""
) -> str:
    ws = tmp_path / "ws-agent"
    ws.mkdir(exist_ok=True)
    file = tmp_path / "agent.yaml"
    file.write_text(
        f"name: asker\nworkspace: {ws}\ncommand: {json.dumps(['python3', '-c', AGENT, *steps])}\n"
        f"tools:\n{tools}{extra}"
    )
    code, out, err = cli(capsys, "run", "--detach", "-f", str(file), *place(d))
    assert code == 0, err
    return out.strip()


def pending(d: Daemon) -> list[dict[str, object]]:
    from stockade.daemon._client import Client

    with Client(d.socket_path) as client:
        result: list[dict[str, object]] = client.call("approvals.list")["approvals"]
    return result


def finish(capsys: pytest.CaptureFixture[str], d: Daemon, run_id: str) -> tuple[str, list[dict[str, object]]]:
    from stockade.cli._daemon_cmds import run_events
    from stockade.daemon._client import Client

    code, out, err = cli(capsys, "logs", "-f", run_id, *place(d))
    assert code == 0, err
    with Client(d.socket_path) as client:
        return out, run_events(client, run_id)


def test_an_ask_under_an_ask_rule_is_one_approval_and_its_answer_arrives(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, daemon: Daemon
) -> None:
    run_id = start_agent(capsys, tmp_path, daemon, "  - {id: q, intent: ask, verdict: ask}\n", "ask=colour?")
    wait_for(lambda: pending(daemon), "the question")
    [question] = pending(daemon)
    code, _, err = cli(capsys, "approve", str(question["id"]), "--reason", "blue", *place(daemon))
    assert code == 0, err
    out, events = finish(capsys, daemon, run_id)
    assert out == "answer: blue\n"
    assert [e["kind"] for e in events].count("approval.asked") == 1


def test_a_question_nobody_answers_is_no_answer_not_denied(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    d = Daemon(tmp_path)
    d.thread = DaemonThread(state=d.state, socket_path=d.socket_path, approval_timeout=0.5)
    d.thread.start()
    try:
        run_id = start_agent(capsys, tmp_path, d, "  - {id: q, intent: ask, verdict: ask}\n", "ask=anyone?")
        out, events = finish(capsys, d, run_id)
    finally:
        d.thread.stop()
    assert out == "NoAnswer\n"
    assert [e["kind"] for e in events].count("approval.asked") == 1


def test_a_write_outside_the_grants_is_refused_before_anyone_is_asked(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, daemon: Daemon
) -> None:
    granted = tmp_path / "granted"
    outside = tmp_path / "outside"
    granted.mkdir()
    outside.mkdir()
    rules = (
        f'  - {{id: out, intent: fs.write, verdict: ask, match: {{path: "{outside}/*"}}}}\n'
        f'  - {{id: in, intent: fs.write, verdict: ask, match: {{path: "{granted}/*"}}}}\n'
    )
    extra = f"filesystem: {{write: [{granted}]}}\n"
    run_id = start_agent(
        capsys, tmp_path, daemon, rules, f"write={outside}/x", f"write={granted}/y", extra=extra
    )
    # The write outside is refused at once; the one inside a grant (the control) is asked.
    wait_for(lambda: pending(daemon), "the control's approval")
    [asked] = pending(daemon)
    assert str(granted / "y") in json.dumps(asked["args"])
    code, _, _ = cli(capsys, "approve", str(asked["id"]), *place(daemon))
    assert code == 0
    out, events = finish(capsys, daemon, run_id)
    lines = out.splitlines()
    assert lines[0].startswith("Denied refused before asking:") and str(outside) in lines[0]
    assert lines[1] == f"written {granted / 'y'}"
    assert not (outside / "x").exists() and (granted / "y").read_text() == "x"
    assert [e["kind"] for e in events].count("approval.asked") == 1


def test_prune_workspaces_spares_those_in_use_and_recent(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import stockade.cell._cell as cell_module

    root = tmp_path / "workspaces"
    for name in ("ws-old", "ws-busy", "ws-new"):
        (root / name).mkdir(parents=True)
    week_ago = time.time() - 7 * 86400
    for name in ("ws-old", "ws-busy"):
        os.utime(root / name, (week_ago, week_ago))
    monkeypatch.setattr(cell_module, "WORKSPACES_ROOT", str(root))
    sock = str(tmp_path / "none.sock")
    with subprocess.Popen(["sleep", "60"], cwd=root / "ws-busy") as busy:
        try:
            code, out, err = cli(
                capsys,
                "prune",
                "--workspaces",
                "--older-than",
                "1d",
                "--yes",
                "--state",
                str(tmp_path / "st"),
                "--socket",
                sock,
            )
        finally:
            busy.kill()
    assert code == 0, err
    assert f"removing workspace {root / 'ws-old'}" in out
    assert not (root / "ws-old").exists()
    assert (root / "ws-busy").exists() and (root / "ws-new").exists()
