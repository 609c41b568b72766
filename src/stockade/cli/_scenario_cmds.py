"""``stockade scenario``: run, stop, check and list groups of agents (docs/SCENARIOS.md).

Thin, like the daemon's commands it sits beside (``_daemon_cmds``, whose
``--state``/``--socket`` options and paths it shares): it loads the scenario
file (exit 3 when it is wrong), runs it with ``stockade.scenario``'s runner
and shows the progress. With no daemon running, ``scenario run`` starts one
in this process for the scenario, as ``stockade run`` does for one run.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from typing import Any

import click

from stockade.cli._daemon_cmds import _JSON, _place, _where
from stockade.cli._style import Duration
from stockade.errors import DaemonError, PolicyError
from stockade.exit_codes import ExitCode

EXIT_POLICY = ExitCode.POLICY
_TAIL_LINES = 5


@contextlib.contextmanager
def daemon_running(state_dir: str, socket_path: str) -> Iterator[bool]:
    """A daemon at ``socket_path`` for the duration: the one running, else one
    started in this process (stopped on exit, its runs with it). Yields whether
    it was started here.

    Raises:
        DaemonError, StoreError: an in-process daemon could not start.
    """
    from stockade.daemon._client import Client
    from stockade.daemon._server import DaemonThread

    try:
        with Client(socket_path, timeout=10.0) as probe:
            probe.call("status")
    except DaemonError:
        local = DaemonThread(state=state_dir, socket_path=socket_path).start()
        try:
            yield True
        finally:
            local.stop()
        return
    yield False


def _check_name(name: str, hint: str) -> None:
    from stockade.policy._schema import check_name

    try:
        check_name(name)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=hint) from None


def _unit_json(unit: Any) -> dict[str, Any]:
    return {
        "agent": unit.agent,
        "name": unit.name,
        "replica": unit.replica,
        "state": unit.state,
        "run": unit.run_id or None,
        "runs": list(unit.runs),
        "exit_code": unit.exit_code,
        "restarts": unit.restarts,
        "denials": unit.denials,
        "note": unit.note,
    }


@click.group("scenario")
def scenario() -> None:
    """Groups of agents: started in order, fanned out, restarted, stopped as one.

    A scenario file lists agents, each with its policy, what it depends on and
    when it starts (docs/SCENARIOS.md).
    """


@scenario.command("run")
@click.argument("file", metavar="FILE")
@click.option("--name", default=None, help="This instance's name (default: the scenario's).")
@click.option(
    "--unattended", is_flag=True, help="Nobody answers: what would need approval is denied and counted."
)
@click.option("--plain", is_flag=True, help="Print a line per change, not a live table.")
@click.option(
    "--detach", is_flag=True, help="Run it in the background (a daemon must be running); print its name."
)
@_JSON
@_place
def run(
    file: str,
    name: str | None,
    unattended: bool,
    plain: bool,
    detach: bool,
    as_json: bool,
    state: str | None,
    socket_path: str | None,
) -> int:
    """Run the scenario FILE under the daemon, showing each agent's progress.

    Exits 0 when every agent that ran succeeded, 1 when one failed (after its
    restarts), 3 when the file is wrong, 130 when the scenario was stopped.
    Approvals are answered with `stockade approvals` / `stockade approve`.
    """
    from stockade.scenario import load_scenario
    from stockade.scenario._progress import Progress
    from stockade.scenario._runner import ScenarioRunner

    loaded = load_scenario(file)  # a bad file is exit 3 here, before any daemon is involved
    if name is not None:
        _check_name(name, "--name")
    state_dir, sock = _where(state, socket_path)
    if detach:
        return _detach(file, name or loaded.name, unattended, as_json, state_dir, sock)
    live = not (plain or as_json) and sys.stdout.isatty()
    with daemon_running(state_dir, sock), Progress(f"scenario {name or loaded.name}", live=live) as progress:
        runner = ScenarioRunner(
            loaded,
            socket_path=sock,
            state_dir=state_dir,
            name=name,
            unattended=unattended,
            on_change=None if as_json else progress.update,
        )
        code = runner.run()
        failed = [u for u in runner.scheduler.units.values() if u.state == "failed" and u.run_id]
        tails = {u.name: _tail(sock, u.run_id) for u in failed}
    if as_json:
        units = [_unit_json(u) for u in runner.scheduler.units.values()]
        click.echo(json.dumps({"name": runner.group.name, "exit_code": code, "agents": units}, indent=2))
        return code
    for unit_name, text in tails.items():
        if text.strip():
            click.echo(f"--- {unit_name}: the last lines of its output", err=True)
            click.echo(text.rstrip("\n"), err=True)
    return code


def _detach(file: str, name: str, unattended: bool, as_json: bool, state_dir: str, sock: str) -> int:
    """Start this command again in the background, in a session of its own,
    its progress in ``<state>/scenarios/<name>.log``; print its name and pid."""
    import os
    import subprocess

    from stockade.daemon._client import Client
    from stockade.scenario._runner import Group, ScenarioBusy, ScenarioError, group_busy

    try:
        with Client(sock, timeout=10.0) as probe:
            probe.call("status")
    except DaemonError:
        raise DaemonError(
            f"no daemon is running at {sock}, and a detached scenario needs one; "
            "start it with `stockade daemon`"
        ) from None
    group = Group(state_dir, name)
    busy = group_busy(group)
    if busy:
        raise ScenarioBusy(busy)
    log = os.path.splitext(group.path)[0] + ".log"
    os.makedirs(os.path.dirname(log), mode=0o700, exist_ok=True)
    argv = [sys.executable, "-m", __name__, "run", os.path.abspath(file), "--plain", "--name", name]
    argv += ["--state", state_dir, "--socket", sock] + (["--unattended"] if unattended else [])
    # The shell puts it in the background and says its pid; the runner holds
    # none of the shell's pipes, so nothing here waits for it.
    shell = '"$@" </dev/null >>"$STOCKADE_SCENARIO_LOG" 2>&1 & echo $!'
    done = subprocess.run(
        ["/bin/sh", "-c", shell, "sh", *argv],
        env={**os.environ, "STOCKADE_SCENARIO_LOG": log},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 or not done.stdout.strip().isdigit():
        raise ScenarioError(
            f"could not start the scenario in the background: {done.stderr.strip() or done.returncode}; "
            "run it without --detach to see why"
        )
    pid = int(done.stdout.strip())
    if as_json:
        click.echo(json.dumps({"name": name, "pid": pid, "log": log}, indent=2))
    else:
        click.echo(f"{name} (pid {pid}); `stockade scenario stop {name}` stops it; its progress: {log}")
    return 0


def _tail(sock: str, run_id: str) -> str:
    from stockade.daemon._client import Client
    from stockade.errors import StockadeError

    try:
        with Client(sock, timeout=10.0) as client:
            return str(client.call("run.logs", run=run_id, tail=_TAIL_LINES).get("data", ""))
    except StockadeError:
        return ""


@scenario.command("stop")
@click.argument("name", metavar="NAME")
@click.option(
    "--grace",
    type=Duration(maximum=3600, zero=True),
    default="10s",
    show_default=True,
    help="How long each agent gets after SIGTERM before its cell is killed.",
)
@_JSON
@_place
def stop(name: str, grace: float, as_json: bool, state: str | None, socket_path: str | None) -> int:
    """Stop the scenario NAME: nothing more starts, and every run it started is stopped."""
    from stockade.scenario._runner import stop_group

    _check_name(name, "NAME")
    state_dir, sock = _where(state, socket_path)
    stopped = stop_group(state_dir, name, sock, grace=grace)
    if as_json:
        click.echo(json.dumps({"name": name, "runs": stopped}, indent=2))
        return 0
    for info in stopped:
        code = info.get("exit_code")
        click.echo(f"{info['id']} {info['state']}" + ("" if code is None else f" (exit code {code})"))
    click.echo(f"scenario {name} stopped ({len(stopped)} run(s))")
    return 0


@scenario.command("validate")
@click.argument("file", metavar="FILE")
@_JSON
@click.pass_context
def validate(ctx: click.Context, file: str, as_json: bool) -> None:
    """Check the scenario FILE and each agent's policy; say what would run, in what order.

    Exits 0 when it is valid, 3 when it is not (every problem with its file:line:col).
    """
    from stockade.cli._policy_cmds import _problems
    from stockade.scenario import load_scenario

    try:
        loaded = load_scenario(file)
    except PolicyError as exc:
        problems = _problems(exc)
        if as_json:
            click.echo(json.dumps({"valid": False, "file": file, "errors": problems}, indent=2))
        else:
            for problem in problems:
                where = f"{problem['location']}: " if problem["location"] else ""
                click.echo(f"stockade: {where}{problem['message']}", err=True)
        ctx.exit(EXIT_POLICY)
    agents = [
        {
            "name": a.name,
            "policy": a.policy,
            "command": list(a.command) if a.command else None,
            "depends_on": list(a.depends_on),
            "launch_when": a.launch_when,
            "replicas": a.replicas,
            "restart_max": a.restart_max,
            "runs": list(a.unit_names()),
        }
        for a in loaded.agents
    ]
    if as_json:
        click.echo(json.dumps({"valid": True, "file": file, "name": loaded.name, "agents": agents}, indent=2))
        return
    click.echo(f"{file}: scenario {loaded.name}, {len(agents)} agent(s), valid")
    for a in loaded.agents:
        when = f"after {', '.join(a.depends_on)} ({a.launch_when})" if a.depends_on else "at once"
        extra = f", {a.replicas} in parallel" if a.replicas > 1 else ""
        extra += f", restarted up to {a.restart_max} time(s) on a crash" if a.restart_max else ""
        click.echo(f"  {a.name}: {a.policy}, {when}{extra}")


@scenario.command("ps")
@_JSON
@_place
def ps(as_json: bool, state: str | None, socket_path: str | None) -> int:
    """List the scenarios run under this state directory, and their runs."""
    from stockade.scenario._runner import list_groups

    state_dir, _sock = _where(state, socket_path)
    groups = list_groups(state_dir)
    if as_json:
        click.echo(json.dumps(groups, indent=2))
        return 0
    if not groups:
        click.echo("no scenario has run here")
    for g in groups:
        if g.get("live"):
            status = "stopping" if g.get("stopping") else "running"
        else:
            status = f"ended (exit code {g.get('exit_code')})"
        click.echo(
            f"{g.get('name')}  {status}  pid {g.get('pid')}  {len(g.get('runs', []))} run(s)  {g.get('file')}"
        )
    return 0


def _detached_main() -> int:
    """``python -m stockade.cli._scenario_cmds run …``: a detached scenario's
    runner, in a session of its own (a Ctrl-C at the terminal that started it
    does not reach it), errors mapped to exit codes as ``stockade`` maps them."""
    import os

    from stockade.errors import StockadeError

    os.setsid()
    try:
        code = scenario.main(args=sys.argv[1:], prog_name="stockade scenario", standalone_mode=False)
    except StockadeError as exc:
        click.echo(f"stockade: {exc}", err=True)
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return 2
    return code if isinstance(code, int) else 0


__all__ = ["daemon_running", "scenario"]

if __name__ == "__main__":
    sys.exit(_detached_main())
