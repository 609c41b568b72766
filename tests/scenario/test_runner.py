"""Scenarios, for real: a daemon on a loop in a thread of the test (as in
tests/daemon), tiny /bin/sh agents in real cells, and the scheduler's rules on
their own. No test sleeps to wait: the agents wait on files, the test on the
runner and on the daemon's answers, each with a bound.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from stockade.cell._cell import WORKSPACES_ROOT
from stockade.daemon._client import Client
from stockade.daemon._server import DaemonThread
from stockade.errors import StockadeError
from stockade.scenario import load_scenario, loads_scenario
from stockade.scenario._progress import Progress
from stockade.scenario._runner import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_STOPPED,
    Ended,
    ScenarioBusy,
    ScenarioRunner,
    Scheduler,
)

WAIT = 60.0
"""Seconds any wait in these tests may take before it fails."""

# An agent that waits for a file (at most ~30 s, then fails: never hangs a test).
WAIT_FOR = "i=0; until [ -e {f} ]; do i=$((i+1)); [ $i -gt 600 ] && exit 9; sleep 0.05; done"


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonThread]:
    dt = DaemonThread(state=str(tmp_path / "state"), socket_path=str(tmp_path / "d.sock"))
    dt.start()
    try:
        yield dt
    finally:
        dt.stop()


def scenario_file(tmp_path: Path, agents: list[dict[str, Any]], *, name: str = "sc") -> Path:
    """A scenario whose agents share one workspace, ``ws/``, through one policy."""
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    # Cells sharing a workspace at once used to race on the placeholders of
    # its protected paths; nothing is made or removed for them any more.
    (tmp_path / "shared.yaml").write_text(
        f"name: worker\nworkspace: {ws}\ncommand: [/bin/true]\n"
        "env:\n  pass: [STOCKADE_REPLICA, STOCKADE_REPLICAS, STOCKADE_ATTEMPT, STOCKADE_AGENT]\n"
    )
    for agent in agents:
        agent.setdefault("policy", "shared.yaml")
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps({"name": name, "agents": agents}))
    return path


def sh(script: str) -> list[str]:
    return ["/bin/sh", "-c", script]


def run_scenario(tmp_path: Path, daemon: DaemonThread, path: Path, **kw: Any) -> ScenarioRunner:
    runner = ScenarioRunner(
        load_scenario(path), socket_path=daemon.socket_path, state_dir=str(tmp_path / "state"), **kw
    )
    runner.code = runner.run()  # type: ignore[attr-defined]
    return runner


def states(runner: ScenarioRunner) -> dict[str, str]:
    return {name: unit.state for name, unit in runner.scheduler.units.items()}


def runs_of(daemon: DaemonThread) -> dict[str, dict[str, Any]]:
    with Client(daemon.socket_path) as client:
        return {r["id"]: r for r in client.call("run.list", all=True)["runs"]}


# --------------------------------------------------------------------------- the scheduler alone


def plan(text: str) -> Scheduler:
    return Scheduler(loads_scenario(textwrap.dedent(text), source="/x/s.yaml", check_policies=False))


def finish(sched: Scheduler, name: str, exit_code: int, **how: Any) -> None:
    unit = sched.units[name]
    sched.ended(unit.run_id, Ended(state=how.pop("state", "ended"), exit_code=exit_code, **how))


def start_all(sched: Scheduler) -> list[str]:
    started = sched.advance()
    for i, unit in enumerate(started):
        sched.started(unit, f"r-{unit.name}-{len(unit.runs)}-{i}")
    return [u.name for u in started]


@pytest.mark.parametrize(
    ("first_exit", "when", "starts", "reason"),
    [
        (0, "success", True, ""),
        (1, "success", False, "a failed (launch_when: success)"),
        (0, "failure", False, "no dependency failed (launch_when: failure)"),
        (1, "failure", True, ""),
        (0, "always", True, ""),
        (1, "always", True, ""),
    ],
)
def test_launch_when_decides_from_how_the_dependency_ended(
    first_exit: int, when: str, starts: bool, reason: str
) -> None:
    sched = plan(
        f"""
        name: s
        agents:
          - {{name: a, policy: p.yaml}}
          - {{name: b, policy: p.yaml, depends_on: [a], launch_when: {when}}}
        """
    )
    assert start_all(sched) == ["a"], "b waits for a"
    assert sched.units["b"].state == "waiting"
    finish(sched, "a", first_exit)
    assert start_all(sched) == (["b"] if starts else [])
    assert sched.units["b"].note == reason
    if not starts:
        assert sched.units["b"].state == "skipped" and sched.done


def test_a_skip_cascades_and_only_failures_make_the_exit_code() -> None:
    sched = plan(
        """
        name: s
        agents:
          - {name: a, policy: p.yaml}
          - {name: b, policy: p.yaml, depends_on: [a], launch_when: failure}
          - {name: c, policy: p.yaml, depends_on: [b]}
          - {name: d, policy: p.yaml, depends_on: [b], launch_when: always}
        """
    )
    start_all(sched)
    finish(sched, "a", 0)
    assert start_all(sched) == ["d"], "b is skipped, so c is too; d runs whatever b did"
    assert sched.units["c"].note == "b skipped (launch_when: success)"
    finish(sched, "d", 0)
    assert sched.done and sched.exit_code() == EXIT_OK


def test_a_crash_is_restarted_up_to_max_but_a_halt_a_stop_or_a_failed_start_is_not() -> None:
    sched = plan(
        """
        name: s
        agents:
          - {name: a, policy: p.yaml, restart: {max: 1}}
          - {name: h, policy: p.yaml, restart: {max: 5}}
          - {name: o, policy: p.yaml, restart: {max: 5}}
          - {name: f, policy: p.yaml, restart: {max: 5}}
        """
    )
    start_all(sched)
    finish(sched, "a", 137)
    finish(sched, "h", 137, halted="10 denials")
    finish(sched, "o", 143, stopped_by="alice")
    finish(sched, "f", 0, state="failed", error="the host lacks landlock")
    assert start_all(sched) == ["a"]
    assert sched.units["a"].restarts == 1 and "restart 1 of 1" in sched.units["a"].note
    assert sched.units["h"].state == "failed" and "halted by its tripwire" in sched.units["h"].note
    assert sched.units["o"].state == "failed" and sched.units["o"].note == "stopped by alice"
    assert sched.units["f"].state == "failed" and "landlock" in sched.units["f"].note
    finish(sched, "a", 2)
    assert start_all(sched) == [] and sched.units["a"].state == "failed"
    assert sched.units["a"].note == "exit code 2; restarts used up (1 of 1)"
    assert sched.done and sched.exit_code() == EXIT_FAILED


def test_a_stopped_scheduler_starts_nothing_and_says_so() -> None:
    sched = plan(
        "name: s\nagents:\n  - {name: a, policy: p.yaml}\n  - {name: b, policy: p.yaml, depends_on: [a]}\n"
    )
    start_all(sched)
    running = sched.stop("stopped by scenario stop")
    assert [u.name for u in running] == ["a"]
    assert sched.units["b"].state == "stopped" and "not started" in sched.units["b"].note
    finish(sched, "a", 143, stopped_by="root")
    assert sched.units["a"].state == "stopped" and sched.done and sched.exit_code() == EXIT_STOPPED


def test_a_run_that_succeeded_as_its_group_was_stopped_is_shown_succeeded() -> None:
    sched = plan("name: s\nagents:\n  - {name: a, policy: p.yaml}\n  - {name: b, policy: p.yaml}\n")
    start_all(sched)
    sched.stop("stopped by scenario stop")
    finish(sched, "a", 0)
    finish(sched, "b", 0, stopped_by="root")
    assert states_of(sched) == {"a": "succeeded", "b": "stopped"}
    assert sched.exit_code() == EXIT_STOPPED


def states_of(sched: Scheduler) -> dict[str, str]:
    return {name: unit.state for name, unit in sched.units.items()}


# --------------------------------------------------------------------------- for real


def test_each_launch_condition_against_a_daemon(tmp_path: Path, daemon: DaemonThread) -> None:
    mark = "touch ran-$STOCKADE_AGENT"
    path = scenario_file(
        tmp_path,
        [
            {"name": "good", "command": sh(mark)},
            {"name": "bad", "command": sh(f"{mark}; exit 4")},
            {"name": "after-good", "depends_on": ["good"], "command": sh(mark)},
            {"name": "after-bad", "depends_on": ["bad"], "command": sh(mark)},
            {"name": "on-failure", "depends_on": ["bad"], "launch_when": "failure", "command": sh(mark)},
            {"name": "on-no-failure", "depends_on": ["good"], "launch_when": "failure", "command": sh(mark)},
            {"name": "anyway", "depends_on": ["bad", "good"], "launch_when": "always", "command": sh(mark)},
        ],
    )
    runner = run_scenario(tmp_path, daemon, path)
    assert states(runner) == {
        "good": "succeeded",
        "bad": "failed",
        "after-good": "succeeded",
        "after-bad": "skipped",
        "on-failure": "succeeded",
        "on-no-failure": "skipped",
        "anyway": "succeeded",
    }
    assert runner.code == EXIT_FAILED  # type: ignore[attr-defined]
    assert runner.scheduler.units["bad"].exit_code == 4
    assert runner.scheduler.units["after-bad"].note == "bad failed (launch_when: success)"
    ran = sorted(p.name for p in (tmp_path / "ws").glob("ran-*"))
    assert ran == ["ran-after-good", "ran-anyway", "ran-bad", "ran-good", "ran-on-failure"]
    # Every run the scenario started is in its group file, and ended.
    group = json.loads((tmp_path / "state" / "scenarios" / "sc.json").read_text())
    assert group["exit_code"] == EXIT_FAILED and group["ended"] is not None
    daemon_runs = runs_of(daemon)
    assert len(group["runs"]) == 5
    assert all(daemon_runs[r["id"]]["state"] == "ended" for r in group["runs"])


def test_a_fan_out_runs_its_replicas_in_parallel(tmp_path: Path, daemon: DaemonThread) -> None:
    # Each replica announces itself, then waits until all three have: only
    # replicas running at the same time can all get past the wait.
    script = (
        "touch ready-$STOCKADE_REPLICA; i=0; "
        'while set -- ready-*; [ "$#" -lt "$STOCKADE_REPLICAS" ]; do '
        "i=$((i+1)); [ $i -gt 600 ] && exit 9; sleep 0.05; done; "
        "echo $STOCKADE_AGENT > done-$STOCKADE_REPLICA"
    )
    path = scenario_file(tmp_path, [{"name": "fan", "replicas": 3, "command": sh(script)}])
    runner = run_scenario(tmp_path, daemon, path)
    assert states(runner) == {"fan-1": "succeeded", "fan-2": "succeeded", "fan-3": "succeeded"}
    assert runner.code == EXIT_OK  # type: ignore[attr-defined]
    assert len({u.run_id for u in runner.scheduler.units.values()}) == 3
    ws = tmp_path / "ws"
    assert sorted((ws / f"done-{i}").read_text() for i in (1, 2, 3)) == ["fan-1\n", "fan-2\n", "fan-3\n"]


def test_a_crash_is_restarted_and_the_second_attempt_succeeds(tmp_path: Path, daemon: DaemonThread) -> None:
    script = 'n=$(cat count 2>/dev/null || echo 0); n=$((n+1)); echo $n > count; [ "$n" -ge 2 ]'
    path = scenario_file(tmp_path, [{"name": "flaky", "restart": {"max": 3}, "command": sh(script)}])
    runner = run_scenario(tmp_path, daemon, path)
    unit = runner.scheduler.units["flaky"]
    assert (unit.state, unit.restarts, unit.exit_code, len(unit.runs)) == ("succeeded", 1, 0, 2)
    assert (tmp_path / "ws" / "count").read_text() == "2\n"
    daemon_runs = runs_of(daemon)
    assert [daemon_runs[r]["exit_code"] for r in unit.runs] == [1, 0]
    assert runner.code == EXIT_OK  # type: ignore[attr-defined]


def test_restarts_stop_at_max(tmp_path: Path, daemon: DaemonThread) -> None:
    script = "n=$(cat count 2>/dev/null || echo 0); echo $((n+1)) > count; exit 3"
    path = scenario_file(
        tmp_path,
        [
            {"name": "doomed", "restart": {"max": 2}, "command": sh(script)},
            {"name": "next", "depends_on": ["doomed"], "command": sh("touch next-ran")},
        ],
    )
    runner = run_scenario(tmp_path, daemon, path)
    unit = runner.scheduler.units["doomed"]
    assert (unit.state, unit.restarts, unit.exit_code, len(unit.runs)) == ("failed", 2, 3, 3)
    assert (tmp_path / "ws" / "count").read_text() == "3\n", "one first attempt and two restarts"
    assert runner.scheduler.units["next"].state == "skipped"
    assert not (tmp_path / "ws" / "next-ran").exists()
    assert runner.code == EXIT_FAILED  # type: ignore[attr-defined]


def test_a_denial_is_counted_for_its_agent(tmp_path: Path, daemon: DaemonThread) -> None:
    agent = textwrap.dedent(
        """
        import json, os, socket, struct
        s = socket.socket(socket.AF_UNIX); s.connect(os.environ["STOCKADE_BROKER"])
        params = {"token": os.environ["STOCKADE_TOKEN"], "intent": "fs.read", "args": {"path": "/etc/shadow"}}
        body = json.dumps({"v": 1, "id": 1, "method": "intent", "params": params}).encode()
        s.sendall(struct.pack(">I", len(body)) + body)
        n = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))[0]
        print(json.loads(s.recv(n, socket.MSG_WAITALL))["result"]["verdict"])
        """
    )
    path = scenario_file(tmp_path, [{"name": "nosy", "command": ["/usr/bin/python3", "-c", agent]}])
    runner = run_scenario(tmp_path, daemon, path)
    unit = runner.scheduler.units["nosy"]
    assert (unit.state, unit.denials) == ("succeeded", 1)
    with Client(daemon.socket_path) as client:
        assert client.call("run.logs", run=unit.run_id)["data"] == "deny\n"


def test_a_second_runner_of_the_same_name_is_refused(tmp_path: Path, daemon: DaemonThread) -> None:
    release = tmp_path / "ws" / "release"
    path = scenario_file(tmp_path, [{"name": "hold", "command": sh(WAIT_FOR.format(f="release"))}])
    started = threading.Event()
    first = ScenarioRunner(
        load_scenario(path),
        socket_path=daemon.socket_path,
        state_dir=str(tmp_path / "state"),
        on_change=lambda s: s.units["hold"].state == "running" and started.set(),
    )
    result: dict[str, int] = {}
    thread = threading.Thread(target=lambda: result.setdefault("code", first.run()))
    thread.start()
    try:
        assert started.wait(WAIT)
        second = ScenarioRunner(
            load_scenario(path), socket_path=daemon.socket_path, state_dir=str(tmp_path / "state")
        )
        with pytest.raises(ScenarioBusy) as info:
            second.run()
        assert "already running" in str(info.value) and "scenario stop sc" in str(info.value)
        other = ScenarioRunner(
            load_scenario(path),
            socket_path=daemon.socket_path,
            state_dir=str(tmp_path / "state"),
            name="sc-2",
        )
        release.touch()  # lets both hold agents end
        assert other.run() == EXIT_OK, other.scheduler.units
    finally:
        release.touch()
        thread.join(WAIT)
    assert result["code"] == EXIT_OK


# --------------------------------------------------------------------------- stopping a group


def _processes_with(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            with contextlib.suppress(OSError):
                if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(int(pid))
    return found


def cli(*args: str) -> tuple[int, str, str]:
    """``stockade scenario …`` as ``run_app`` runs it (errors to exit codes)."""
    from stockade.cli._scenario_cmds import scenario

    holder: dict[str, int] = {}

    @click.command()
    def wrapper() -> None:
        try:
            code = scenario.main(args=list(args), prog_name="stockade scenario", standalone_mode=False)
        except StockadeError as exc:
            click.echo(f"stockade: {exc}", err=True)
            holder["code"] = exc.exit_code
            return
        except click.ClickException as exc:
            exc.show()
            holder["code"] = 2
            return
        holder["code"] = code if isinstance(code, int) else 0

    result = CliRunner().invoke(wrapper, [], catch_exceptions=False)
    return holder["code"], result.stdout, result.stderr


def test_scenario_stop_ends_every_run_and_everything_they_started(
    tmp_path: Path, daemon: DaemonThread
) -> None:
    marker = f"86{os.getpid()}"
    # Each agent starts a child of its own (a sleep in the background), says
    # so on a fifo, and waits for it: stopping the group must take the children
    # too. (The marker is spelt so that only the sleep's command line holds it.)
    forever = f"m=86; sleep ${{m}}{os.getpid()} & echo $STOCKADE_AGENT > ready; wait"
    path = scenario_file(
        tmp_path,
        [
            {"name": "server", "command": sh(forever)},
            {"name": "workers", "replicas": 2, "command": sh(forever)},
            {
                "name": "after",
                "depends_on": ["server"],
                "launch_when": "always",
                "command": sh("touch after-ran"),
            },
        ],
        name="long",
    )
    fifo = tmp_path / "ws" / "ready"
    os.mkfifo(fifo)
    os.chmod(fifo, 0o666)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    keep = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # so that the fifo never reads as closed
    runner = ScenarioRunner(
        load_scenario(path), socket_path=daemon.socket_path, state_dir=str(tmp_path / "state")
    )
    result: dict[str, int] = {}
    thread = threading.Thread(target=lambda: result.setdefault("code", runner.run()))
    thread.start()
    try:
        said = b""
        poller = select.poll()
        poller.register(reader, select.POLLIN)
        while said.count(b"\n") < 3:
            assert poller.poll(WAIT * 1000), f"the agents did not all start: {said!r}"
            said += os.read(reader, 4096)
        assert sorted(said.split()) == [b"server", b"workers-1", b"workers-2"]
        code, out, err = cli(
            "stop", "long", "--grace", "0", "--state", str(tmp_path / "state"), "--socket", daemon.socket_path
        )
        assert code == 0, err
        assert "scenario long stopped (3 run(s))" in out
    finally:
        thread.join(WAIT)
        os.close(reader)
        os.close(keep)
    assert not thread.is_alive()
    assert result["code"] == EXIT_STOPPED
    assert states(runner) == {
        "server": "stopped",
        "workers-1": "stopped",
        "workers-2": "stopped",
        "after": "stopped",
    }, "an 'always' dependent does not start once the group is stopped"
    assert not (tmp_path / "ws" / "after-ran").exists()
    daemon_runs = runs_of(daemon)
    ours = [u.run_id for u in runner.scheduler.units.values() if u.run_id]
    assert len(ours) == 3 and all(daemon_runs[r]["state"] == "ended" for r in ours)
    assert all(daemon_runs[r]["stopped_by"] for r in ours)
    assert _processes_with(marker) == [], "a process of the group outlived its stop"
    code, out, _err = cli("ps", "--state", str(tmp_path / "state"))
    assert code == 0 and "long  ended (exit code 130)" in out


def test_stopping_an_unknown_scenario_is_not_found(tmp_path: Path, daemon: DaemonThread) -> None:
    code, _out, err = cli("stop", "ghost", "--state", str(tmp_path / "state"), "--socket", daemon.socket_path)
    assert code == 6 and "no scenario named 'ghost'" in err


# --------------------------------------------------------------------------- the command line


def test_cli_run_without_a_daemon_starts_one_and_prints_a_line_per_change(tmp_path: Path) -> None:
    path = scenario_file(
        tmp_path,
        [
            {"name": "first", "command": sh("echo one > data.txt")},
            {
                "name": "second",
                "depends_on": ["first"],
                "command": sh("grep -q one data.txt; echo oops; exit 5"),
            },
        ],
    )
    sock = str(tmp_path / "own.sock")
    code, out, err = cli("run", str(path), "--state", str(tmp_path / "st2"), "--socket", sock)
    assert code == EXIT_FAILED
    lines = out.splitlines()
    assert lines[0].split() == ["first", "running", lines[0].split()[2]]
    assert any(line.split()[:2] == ["first", "succeeded"] and "exit 0" in line for line in lines)
    assert any(line.split()[:2] == ["second", "failed"] and "exit 5" in line for line in lines)
    assert "--- second: the last lines of its output\noops" in err
    assert not os.path.exists(sock), "the in-process daemon outlived the scenario"


def test_cli_run_json_and_validate(tmp_path: Path, daemon: DaemonThread) -> None:
    path = scenario_file(tmp_path, [{"name": "only", "replicas": 2, "command": sh("true")}])
    code, out, _err = cli(
        "run", str(path), "--json", "--state", str(tmp_path / "state"), "--socket", daemon.socket_path
    )
    body = json.loads(out)
    assert code == 0 and body["exit_code"] == 0
    assert [(a["name"], a["state"], a["exit_code"]) for a in body["agents"]] == [
        ("only-1", "succeeded", 0),
        ("only-2", "succeeded", 0),
    ]
    code, out, _err = cli("validate", str(path))
    assert code == 0 and "only: " in out and "2 in parallel" in out
    cyclic = scenario_file(
        tmp_path,
        [{"name": "a", "depends_on": ["b"]}, {"name": "b", "depends_on": ["a"]}],
        name="cyclic",
    )
    code, _out, err = cli("validate", str(cyclic))
    assert code == 3 and "cycle, a -> b -> a" in err
    code, _out, err = cli("run", str(cyclic), "--socket", daemon.socket_path)
    assert code == 3 and "cycle" in err


def test_the_live_table_shows_every_column(tmp_path: Path) -> None:
    import io

    sched = plan("name: s\nagents:\n  - {name: a, policy: p.yaml, restart: {max: 1}}\n")
    start_all(sched)
    finish(sched, "a", 3)
    out = io.StringIO()
    with Progress("scenario s", live=True, stream=out) as progress:
        progress.update(sched)
    text = out.getvalue()
    for word in ("AGENT", "STATE", "RUN", "EXIT", "RESTARTS", "DENIALS", "NOTE", "restarting", "r-a-0-0"):
        assert word in text, text


@pytest.mark.parametrize("example", ["pipeline", "fanout"])
def test_the_examples_run(tmp_path: Path, daemon: DaemonThread, example: str) -> None:
    source = Path(__file__).parents[2] / "examples" / "scenarios" / example
    copy = tmp_path / example
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("*.txt", "*.csv", "part-*"))
    runner = run_scenario(tmp_path, daemon, copy / "scenario.yaml")
    # The fan-out's replicas each had a fresh workspace, which the daemon keeps
    # when the agent left something in it: not a test's to keep.
    for run_id in (r for u in runner.scheduler.units.values() for r in u.runs):
        kept = runs_of(daemon)[run_id]["workspace"]
        if kept.startswith(WORKSPACES_ROOT + "/"):
            shutil.rmtree(kept, ignore_errors=True)
    assert runner.code == EXIT_OK, runner.scheduler.units  # type: ignore[attr-defined]
    if example == "pipeline":
        assert states(runner) == {"fetch": "succeeded", "summarise": "succeeded", "report": "skipped"}
        assert (copy / "work" / "summary.txt").read_text().startswith("20 readings, mean ")
    else:
        assert set(states(runner).values()) == {"succeeded"} and len(runner.scheduler.units) == 5
        assert (copy / "work" / "total.txt").read_text() == "600\n"


def test_ctrl_c_stops_the_scenarios_runs(tmp_path: Path, daemon: DaemonThread) -> None:
    path = scenario_file(
        tmp_path,
        [
            {"name": "long", "command": sh(WAIT_FOR.format(f="never"))},
            {"name": "then", "depends_on": ["long"], "launch_when": "always", "command": sh("true")},
        ],
    )
    interrupted: list[str] = []

    def press_ctrl_c(s: Scheduler) -> None:
        # KeyboardInterrupt arrives wherever the runner is; here, once the agent runs.
        if s.units["long"].state == "running" and not interrupted:
            interrupted.append(s.units["long"].run_id)
            raise KeyboardInterrupt

    runner = run_scenario(tmp_path, daemon, path, on_change=press_ctrl_c)
    assert runner.code == EXIT_STOPPED  # type: ignore[attr-defined]
    assert states(runner) == {"long": "stopped", "then": "stopped"}
    info = runs_of(daemon)[interrupted[0]]
    assert info["state"] == "ended" and info["stopped_by"]
    group = json.loads((tmp_path / "state" / "scenarios" / "sc.json").read_text())
    assert (group["stopping"], group["exit_code"]) == ("interrupted", EXIT_STOPPED)


def test_a_detached_scenario_is_listed_and_stopped(tmp_path: Path, daemon: DaemonThread) -> None:
    path = scenario_file(
        tmp_path, [{"name": "bg", "command": sh("echo up > ready; " + WAIT_FOR.format(f="never"))}]
    )
    fifo = tmp_path / "ws" / "ready"
    os.mkfifo(fifo)
    os.chmod(fifo, 0o666)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    keep = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    where = ["--state", str(tmp_path / "state"), "--socket", daemon.socket_path]
    try:
        code, out, err = cli("run", str(path), "--detach", "--json", *where)
        assert code == 0, err
        started = json.loads(out)
        pidfd = os.pidfd_open(started["pid"])
        try:
            poller = select.poll()
            poller.register(reader, select.POLLIN)
            assert poller.poll(WAIT * 1000), Path(started["log"]).read_text()
            assert os.read(reader, 64) == b"up\n"
            code, out, _err = cli("run", str(path), "--detach", *where)
            assert code == 5 and out == "", "a second instance of the same name is refused"
            code, out, _err = cli("ps", *where)
            assert code == 0 and out.startswith(f"sc  running  pid {started['pid']}  1 run(s)")
            code, out, err = cli("stop", "sc", "--grace", "0", *where)
            assert code == 0 and "scenario sc stopped (1 run(s))" in out, err
            exited = select.poll()
            exited.register(pidfd, select.POLLIN)
            assert exited.poll(WAIT * 1000), "the detached runner did not end"
        finally:
            os.close(pidfd)
    finally:
        os.close(reader)
        os.close(keep)
    group = json.loads((tmp_path / "state" / "scenarios" / "sc.json").read_text())
    assert group["exit_code"] == EXIT_STOPPED and group["pid"] == started["pid"]
    log = Path(started["log"]).read_text()
    assert "bg  running" in log and "bg  stopped" in log


def test_a_scenario_name_is_never_a_path(tmp_path: Path) -> None:
    code, _out, err = cli("stop", "../../etc/passwd", "--state", str(tmp_path / "state"))
    assert code == 2 and "is not a valid name" in err
    assert not (tmp_path / "state").exists()


SPAWNER = textwrap.dedent(
    """
    import json, os, socket, struct, sys, time
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ["STOCKADE_BROKER"])
    helper = "name: helper\\ncommand: [/bin/sh, -c, 'm=86; sleep \\"$m\\"%s']\\n" % sys.argv[1]
    params = {"token": os.environ["STOCKADE_TOKEN"], "intent": "agent.spawn", "args": {"policy": helper}}
    body = json.dumps({"v": 1, "id": 1, "method": "intent", "params": params}).encode()
    s.sendall(struct.pack(">I", len(body)) + body)
    n = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))[0]
    answer = json.loads(s.recv(n, socket.MSG_WAITALL))
    print(json.dumps(answer), flush=True)
    with open("ready", "w") as f:
        f.write(answer["result"]["verdict"] + "\\n")
    time.sleep(3600)
    """
)


def test_scenario_stop_ends_the_helpers_its_agents_spawned(tmp_path: Path, daemon: DaemonThread) -> None:
    marker = f"86{os.getpid()}"
    path = scenario_file(
        tmp_path,
        [{"name": "boss", "command": ["/usr/bin/python3", "-c", SPAWNER, str(os.getpid())]}],
        name="family",
    )
    # The shared policy, with a rule that lets its agents start helpers.
    shared = tmp_path / "shared.yaml"
    shared.write_text(shared.read_text() + "tools:\n  - {id: spawn, intent: agent.spawn, verdict: allow}\n")
    fifo = tmp_path / "ws" / "ready"
    os.mkfifo(fifo)
    os.chmod(fifo, 0o666)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    keep = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    runner = ScenarioRunner(
        load_scenario(path), socket_path=daemon.socket_path, state_dir=str(tmp_path / "state")
    )
    result: dict[str, int] = {}
    thread = threading.Thread(target=lambda: result.setdefault("code", runner.run()))
    thread.start()
    try:
        poller = select.poll()
        poller.register(reader, select.POLLIN)
        assert poller.poll(WAIT * 1000), "the agent never spawned its helper"
        assert os.read(reader, 64) == b"allow\n"
        code, _out, err = cli(
            "stop",
            "family",
            "--grace",
            "0",
            "--state",
            str(tmp_path / "state"),
            "--socket",
            daemon.socket_path,
        )
        assert code == 0, err
    finally:
        thread.join(WAIT)
        os.close(reader)
        os.close(keep)
    assert result["code"] == EXIT_STOPPED
    boss = runner.scheduler.units["boss"].run_id
    helpers = [r for r in runs_of(daemon).values() if r.get("parent") == boss]
    assert len(helpers) == 1, "the agent started one helper"
    assert helpers[0]["state"] == "ended" and helpers[0]["stopped_by"], helpers[0]
    assert _processes_with(marker) == [], "the helper's process outlived the group's stop"
