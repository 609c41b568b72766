"""The daemon's commands: ``daemon``, ``run``, ``ps``, ``stop``, ``logs``,
``status``, ``approvals``, ``approve`` and ``deny`` (docs/DAEMON.md).

Thin: each parses its flags, talks to the daemon through
``stockade.daemon._client.Client`` and renders the answer. Errors are
stockade's own and ``run_app`` turns them into exit codes: 4 when the daemon
is unreachable, 6 when a run or approval is not found, 5 for other daemon
errors (docs/CLI.md). ``stockade run`` with no daemon running starts one in
this process for that run.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from stockade.cli._style import Duration
from stockade.errors import DaemonError, PolicyError
from stockade.exit_codes import ExitCode

if TYPE_CHECKING:
    from stockade.daemon._client import Client

EXIT_HOST = ExitCode.HOST
EXIT_INTERRUPTED = ExitCode.INTERRUPTED
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)")


def _place(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option(
        "--socket",
        "socket_path",
        metavar="PATH",
        default=None,
        help="The daemon's socket (default: $STOCKADE_SOCKET, else <state>/daemon.sock).",
    )(f)
    return click.option(
        "--state",
        "state",
        metavar="DIR",
        default=None,
        help="The daemon's state directory (default: $STOCKADE_STATE, else /var/lib/stockade "
        "for root, $XDG_STATE_HOME/stockade for others).",
    )(f)


_JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")


def _where(state: str | None, socket_path: str | None) -> tuple[str, str]:
    from stockade.daemon import _paths

    state_dir = _paths.state_dir(state)
    return state_dir, _paths.socket_path(socket_path, state=state_dir)


def _client(state: str | None, socket_path: str | None, *, timeout: float | None = 30.0) -> Client:
    from stockade.daemon._client import Client

    return Client(_where(state, socket_path)[1], timeout=timeout)


def _echo_json(value: object) -> None:
    click.echo(json.dumps(value, indent=2, ensure_ascii=False))


def _ago(when: float | None) -> str:
    if not when:
        return "-"
    seconds = max(0.0, time.time() - when)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds)}s ago"


# --------------------------------------------------------------------------- daemon


@click.command("daemon")
@_place
@click.option(
    "--approval-timeout",
    type=Duration(minimum=0.001),
    default="5m",
    show_default=True,
    help="How long an intent waits for the operator before it is denied.",
)
@click.option(
    "--dns",
    metavar="HOST:PORT",
    envvar="STOCKADE_DNS",
    default=None,
    help="The DNS server the gateway asks for names (default: the system resolver).",
)
@click.option(
    "--upstream-ca",
    metavar="FILE",
    envvar="STOCKADE_UPSTREAM_CA",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Extra CA certificates the gateway trusts for upstream servers.",
)
def daemon(
    state: str | None,
    socket_path: str | None,
    approval_timeout: float,
    dns: str | None,
    upstream_ca: str | None,
) -> int:
    """Run the daemon in the foreground until SIGTERM or Ctrl-C.

    It listens on a unix socket (mode 0600), keeps the event store in the
    state directory, and runs the cells that `stockade run` asks for. On
    SIGTERM it stops every run and records that it stopped.
    """
    from stockade.daemon._server import serve
    from stockade.gateway._options import GatewayOptions

    state_dir, sock = _where(state, socket_path)
    started = time.time()

    def ready(served: Any) -> None:
        from stockade.dashboard import attach

        # `stockade dashboard` asks this daemon for its page (dashboard.open).
        attach(served)
        click.echo(f"stockade: daemon listening on {sock} (state {state_dir}, pid {os.getpid()})", err=True)
        _say_lost(served, started)

    try:
        return serve(
            state=state_dir,
            socket_path=sock,
            approval_timeout=approval_timeout,
            ready=ready,
            gateway=GatewayOptions(dns=dns, upstream_ca=upstream_ca),
        )
    except DaemonError as exc:
        # The daemon itself cannot start: a daemon error, not "unreachable".
        click.echo(f"stockade: {exc}", err=True)
        return EXIT_HOST


def _say_lost(served: Any, started: float) -> None:
    """The runs an earlier daemon left running were marked lost as this one
    started: say which, once, where the operator looks."""
    past = getattr(getattr(served, "runs", None), "past", None) or {}
    lost = sorted(
        str(m.get("id"))
        for m in past.values()
        if isinstance(m, dict) and m.get("state") == "lost" and float(m.get("ended") or 0) >= started
    )
    if lost:
        click.echo(
            f"stockade: {len(lost)} run(s) of the previous daemon never ended and are marked lost: "
            f"{', '.join(lost)}; `stockade report RUN` shows what each did",
            err=True,
        )


# --------------------------------------------------------------------------- run


@click.command("run", context_settings={"allow_interspersed_args": False})
@click.option("-f", "--policy", "policy_file", required=True, metavar="POLICY", help="The policy file.")
@click.option(
    "-w",
    "--workspace",
    metavar="DIR",
    default=None,
    help="The workspace (default: the policy's, else a fresh directory, kept).",
)
@click.option("--detach", is_flag=True, help="Start the run and return; a daemon must be running.")
@click.option(
    "--unattended", is_flag=True, help="Nobody answers: what would need approval is denied and counted."
)
@_JSON
@_place
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
def run(
    policy_file: str,
    workspace: str | None,
    detach: bool,
    unattended: bool,
    as_json: bool,
    state: str | None,
    socket_path: str | None,
    argv: tuple[str, ...],
) -> int:
    """Run an agent under the daemon: stockade run -f POLICY [-- COMMAND ARGS...].

    In the foreground the agent's output is printed live, approvals are asked
    at this terminal, and the exit code is the agent's; Ctrl-C stops the run.
    With no daemon running, one is started in this process for the run.
    """
    from stockade.daemon._client import Client, RemoteError
    from stockade.policy import load_policy

    path = os.path.abspath(policy_file)
    policy = load_policy(path)  # a bad file is exit 3 here, before any daemon is involved
    names = set(policy.env.passthrough)
    # The LLM key and the secrets' variables come from this shell, as ${VAR}
    # does (`OPENAI_API_KEY=… stockade run -f …` works with a daemon running).
    names.update(s.env for s in policy.secrets if s.env)
    if policy.llm is not None and policy.llm.api_key_env:
        names.add(policy.llm.api_key_env)
    try:
        with open(path, encoding="utf-8") as f:
            names.update(_VAR.findall(f.read()))
    except OSError as exc:
        raise PolicyError(f"cannot read {path}: {exc.strerror}") from exc
    params: dict[str, Any] = {
        "policy_path": path,
        "argv": list(argv) or None,
        "workspace": os.path.abspath(workspace) if workspace else None,
        "detach": detach,
        "unattended": unattended,
        "env": {name: os.environ[name] for name in sorted(names) if name in os.environ},
    }
    state_dir, sock = _where(state, socket_path)
    client = Client(sock, timeout=60.0)
    local = None
    try:
        client.call("status")
    except DaemonError:
        if detach:
            raise DaemonError(
                f"no daemon is running at {sock}, and a detached run needs one; "
                "start it with `stockade daemon`"
            ) from None
        from stockade.daemon._server import DaemonThread

        local = DaemonThread(state=state_dir, socket_path=sock).start()
    try:
        try:
            info = client.call("run.start", **params)
        except RemoteError as exc:
            if exc.code == "bad_params":
                # The daemon found the policy wrong (a secret unset there…): exit 3, as here.
                raise PolicyError(exc.message) from exc
            raise
        if detach:
            if as_json:
                _echo_json(info)
            else:
                click.echo(info["id"])
            return 0
        if not as_json:
            click.echo(f"stockade: run {info['id']} started; `stockade logs {info['id']}` shows it", err=True)
        code = _foreground(client, info, as_json=as_json)
        if not as_json:
            _refusals(client, str(info["id"]))
            _persistence(state_dir, str(info["id"]))
        return code
    finally:
        client.close()
        if local is not None:
            local.stop()


def _foreground(client: Client, info: dict[str, Any], *, as_json: bool) -> int:
    run_id = str(info["id"])
    prompter = None
    if not info.get("unattended") and sys.stdin.isatty():
        prompter = _Prompter(client, run_id)
        prompter.start()
    output: dict[str, list[str]] = {"stdout": [], "stderr": []}
    try:
        logs = client.subscribe("run.logs", run=run_id, follow=True)
        ended: dict[str, Any] | None = None
        with logs:
            if as_json:
                output["stdout"].append(str(logs.result.get("data", "")))
            else:
                _write(1, logs.result.get("data", ""))
            if logs.result.get("ended"):
                ended = client.call("run.list", all=True)
                ended = next((r for r in ended["runs"] if r["id"] == run_id), None)
            else:
                for push in logs:
                    kind = push.get("kind")
                    if kind == "run.output" and as_json:
                        stream = "stdout" if push.get("stream") == "stdout" else "stderr"
                        output[stream].append(str(push.get("data", "")))
                    elif kind == "run.output":
                        _write(1 if push.get("stream") == "stdout" else 2, str(push.get("data", "")))
                    elif kind == "run.ended":
                        ended = push.get("run")
                        break
                    elif kind == "subscription.dropped":
                        click.echo("stockade: the live output fell behind; see `stockade logs`", err=True)
    except KeyboardInterrupt:
        client.call("run.stop", run=run_id, grace=0)
        click.echo(f"stockade: run {run_id} stopped", err=True)
        return EXIT_INTERRUPTED
    finally:
        if prompter is not None:
            prompter.stop()
    if ended is None:
        raise DaemonError(f"the daemon stopped following run {run_id}; see `stockade logs {run_id}`")
    if as_json:
        # As `exec --json`: the agent's output too (the transcript holds both
        # streams in one; what came before we subscribed is under stdout).
        _echo_json({**ended, "stdout": "".join(output["stdout"]), "stderr": "".join(output["stderr"])})
    if ended.get("halted"):
        click.echo(f"stockade: run {run_id} was halted: {ended['halted']}", err=True)
    if ended.get("error"):
        click.echo(f"stockade: run {run_id} failed: {ended['error']}", err=True)
        return EXIT_HOST
    code = ended.get("exit_code")
    return int(code) if isinstance(code, int) else EXIT_HOST


def run_events(client: Client, run_id: str) -> list[dict[str, Any]]:
    """Every stored event of ``run_id``, through the daemon (``events.export``, paged)."""
    events: list[dict[str, Any]] = []
    after = 0
    while True:
        page = client.call("events.export", run=run_id, after_seq=after, format="jsonl")
        for line in str(page.get("data", "")).splitlines():
            if line.strip():
                events.append(json.loads(line).get("event", {}))
        after = int(page.get("last_seq", after))
        if not page.get("more"):
            return events


def _refusals(client: Client, run_id: str) -> None:
    """What the run was refused, on stderr, as `exec` summarises a cell's."""
    from stockade.cli._shown import visible
    from stockade.errors import StockadeError

    try:
        events = run_events(client, run_id)
    except StockadeError:
        return
    refused = [e for e in events if e.get("outcome") in ("denied", "audited")]
    failed = [
        e
        for e in events
        if e.get("kind") == "http.request"
        and e.get("outcome") == "allowed"
        and (e.get("detail", {}).get("status") is None or int(e["detail"]["status"]) >= 500)
    ]
    lines = []
    if refused:
        lines.append(f"stockade: {len(refused)} refusal(s) in run {run_id}")
        for event in refused[:10]:
            lines.append(f"  - {visible(str(event.get('summary', '')))} [{event.get('layer', '')}]")
        if len(refused) > 10:
            lines.append(f"  … and {len(refused) - 10} more (see `stockade report {run_id}`)")
    if failed:
        # Allowed, but the upstream failed (DNS, TLS, 5xx): why pip found nothing.
        lines.append(f"stockade: {len(failed)} request(s) allowed by the gateway failed upstream")
        for event in failed[:10]:
            detail = event.get("detail", {})
            why = visible(str(detail.get("reason") or "no answer"))
            where = f"{detail.get('method')} {detail.get('host')}:{detail.get('port')}"
            lines.append(f"  - {where}: {why} [gateway]")
    if lines:
        click.echo("\n".join(lines), err=True)


def _persistence(state_dir: str, run_id: str) -> None:
    """The run's persistence report (every cell of it that left something a
    tool of the operator's would run), on stderr after the run."""
    from stockade.cell._persist import report_lines
    from stockade.cell._revert import RECORDS, reports
    from stockade.cli._revert_cmd import run_family

    family = run_family(state_dir, run_id)
    shown = False
    for _where, report in [r for ident in family for r in reports(os.path.join(state_dir, RECORDS), ident)]:
        lines = report_lines({**report, "revert": f"stockade revert {run_id}"})
        if lines:
            click.echo("stockade: " + "\n".join(lines), err=True)
            shown = True
    if not shown:
        # A run always ends with its report; an empty one is a line.
        click.echo("stockade: persistence report: nothing that your tools run or load was left", err=True)


def _write(fd: int, text: str) -> None:
    if not text:
        return
    stream = sys.stdout if fd == 1 else sys.stderr
    try:
        stream.write(text)
        stream.flush()
    except BrokenPipeError:
        pass


class _Prompter:
    """Asks the operator at this terminal about the run's approvals, one at a time."""

    def __init__(self, client: Client, run_id: str) -> None:
        from stockade.daemon._client import Client

        self._decider = Client(client.path, timeout=30.0)
        self._events = Client(client.path, timeout=30.0)
        self._run = run_id
        self._thread = threading.Thread(target=self._main, name="stockade-prompt", daemon=True)
        self._seen: set[str] = set()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._events.close()
        self._decider.close()

    def _main(self) -> None:
        from stockade.errors import StockadeError

        try:
            with self._events.subscribe("events.subscribe", run=self._run) as stream:
                # Asked before we listened: they are pending now.
                for approval in self._decider.call("approvals.list", run=self._run)["approvals"]:
                    self._prompt(approval)
                for stored in stream:
                    event = stored.get("event", {})
                    if (
                        event.get("kind") == "approval.asked"
                        and event.get("detail", {}).get("state") == "pending"
                    ):
                        self._prompt(event["detail"])
                    elif event.get("kind") == "run.end":
                        return
        except (StockadeError, OSError, ValueError):
            return

    def _prompt(self, approval: dict[str, Any]) -> None:
        from stockade.daemon._client import RemoteError

        approval_id = str(approval.get("id"))
        if approval_id in self._seen:
            return
        self._seen.add(approval_id)
        from stockade.cli._shown import argument_lines, visible

        # Shown whole, escapes visible: the operator approves what is printed here.
        if approval.get("intent") == "ask":
            question = visible(str(approval.get("args", {}).get("question", "")))
            click.echo(f"\nstockade: the agent asks ({visible(approval_id)}): {question}", err=True)
            answer = click.prompt("answer (empty to refuse)", default="", show_default=False, err=True)
            decision, reason = ("approve", answer) if answer else ("deny", "refused at the terminal")
        else:
            click.echo(
                f"\nstockade: approval {visible(approval_id)}: {visible(str(approval.get('intent')))}",
                err=True,
            )
            for line in argument_lines(approval.get("args", {})):
                click.echo(line, err=True)
            yes = click.confirm("approve?", default=False, err=True)
            decision, reason = ("approve", "") if yes else ("deny", "refused at the terminal")
        try:
            self._decider.call(
                "approvals.decide", id=approval_id, decision=decision, reason=reason, by="terminal"
            )
        except RemoteError as exc:
            click.echo(f"stockade: {exc}", err=True)


# --------------------------------------------------------------------------- the rest


@click.command("ps")
@click.option("-a", "--all", "show_all", is_flag=True, help="Also the runs of earlier daemons.")
@_JSON
@_place
def ps(show_all: bool, as_json: bool, state: str | None, socket_path: str | None) -> int:
    """List the daemon's runs."""
    lost: list[str] = []
    with _client(state, socket_path) as client:
        runs = client.call("run.list", all=show_all)["runs"]
        if not show_all and not as_json:
            # Runs the previous daemon left running were marked lost when this
            # one started: hidden without -a, so say that they are there.
            since = time.time() - float(client.call("status").get("uptime") or 0) - 60
            shown = {r.get("id") for r in runs}
            lost = [
                str(r.get("id"))
                for r in client.call("run.list", all=True)["runs"]
                if r.get("state") == "lost"
                and r.get("id") not in shown
                and float(r.get("ended") or 0) >= since
            ]
    if as_json:
        _echo_json(runs)
        return 0
    rows = [("ID", "NAME", "STATE", "EXIT", "INTENTS", "DENIALS", "STARTED")]
    for r in runs:
        code = r.get("exit_code")
        rows.append(
            (
                str(r.get("id")),
                str(r.get("name")),
                str(r.get("state")),
                "-" if code is None else str(code),
                str(r.get("intents", 0)),
                f"{r.get('denials', 0)}/{r.get('denial_limit', '-')}",
                _ago(r.get("created")),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    if lost:
        click.echo(
            f"stockade: {len(lost)} run(s) of the previous daemon were lost when it ended "
            f"({', '.join(lost)}); `stockade ps -a` lists them",
            err=True,
        )
    return 0


@click.command("stop")
@click.argument("run_ref", metavar="NAME|ID", required=False)
@click.option("--all", "stop_all", is_flag=True, help="Stop every live run of the daemon.")
@click.option(
    "--grace",
    type=Duration(maximum=3600, zero=True),
    default="10s",
    show_default=True,
    help="How long the agent gets after SIGTERM before its cell is killed.",
)
@_JSON
@_place
def stop(
    run_ref: str | None,
    stop_all: bool,
    grace: float,
    as_json: bool,
    state: str | None,
    socket_path: str | None,
) -> int:
    """Stop a run (or, with --all, every live run): SIGTERM to the agent, its
    cell killed after --grace seconds."""
    if (run_ref is None) == (not stop_all):
        raise click.UsageError("give a run's NAME or ID, or --all (not both)")
    stopped: list[dict[str, Any]] = []
    with _client(state, socket_path, timeout=grace + 60.0) as client:
        if stop_all:
            refs = [str(r["id"]) for r in client.call("run.list", all=False)["runs"]
                    if r.get("state") in ("running", "stopping")]
        else:
            refs = [str(run_ref)]
        for ref in refs:
            stopped.append(client.call("run.stop", run=ref, grace=grace))
    if as_json:
        _echo_json(stopped if stop_all else stopped[0])
        return 0
    if stop_all and not stopped:
        click.echo("no run is live")
    for info in stopped:
        code = info.get("exit_code")
        click.echo(f"{info['id']} {info['state']}" + ("" if code is None else f" (exit code {code})"))
    return 0


@click.command("logs")
@click.argument("run_ref", metavar="NAME|ID")
@click.option("-f", "--follow", is_flag=True, help="Keep printing output as the agent writes it.")
@click.option(
    "-n", "--tail", type=click.IntRange(min=0), default=None, metavar="N", help="Only the last N lines."
)
@click.option(
    "-t", "--timestamps", is_flag=True, help="Start each line with when it was written (UTC, ISO-8601)."
)
@click.option(
    "--json", "as_json", is_flag=True, help="One JSON object per line: time, stream, line (JSON lines)."
)
@_place
def logs(
    run_ref: str,
    follow: bool,
    tail: int | None,
    timestamps: bool,
    as_json: bool,
    state: str | None,
    socket_path: str | None,
) -> int:
    """Print a run's transcript (the agent's stdout and stderr, capped).

    With -f, until the run ends (exit 0) or the daemon goes away (exit 4).
    """
    plain = not (timestamps or as_json)
    lines = _Lines(timestamps=timestamps, as_json=as_json)
    state_dir = _where(state, socket_path)[0]
    with _client(state, socket_path) as client:
        if not follow:
            result = client.call("run.logs", run=run_ref, tail=tail)
            if plain:
                _write(1, result["data"])
            else:
                lines.stored(state_dir, result)
                lines.flush()
            if result.get("truncated") and tail is None:
                click.echo(
                    "stockade: older output left out; see the transcript file in the run's directory",
                    err=True,
                )
            return 0
        with client.subscribe("run.logs", run=run_ref, tail=tail, follow=True) as stream:
            run_id = str(stream.result.get("run") or run_ref)
            if plain:
                _write(1, stream.result.get("data", ""))
            else:
                lines.stored(state_dir, stream.result)
            if stream.result.get("ended"):
                lines.flush()
                return 0
            try:
                for push in stream:
                    kind = push.get("kind")
                    if kind == "run.output":
                        fd = 1 if push.get("stream") == "stdout" else 2
                        if plain:
                            _write(fd, str(push.get("data", "")))
                        else:
                            lines.feed(fd, str(push.get("data", "")), time.time())
                    elif kind == "run.ended":
                        lines.flush()
                        return 0
                    elif kind == "subscription.dropped":
                        lines.flush()
                        click.echo(
                            "stockade: fell behind the live output; run `stockade logs` again", err=True
                        )
                        return EXIT_HOST
            except KeyboardInterrupt:
                return EXIT_INTERRUPTED
            except DaemonError:
                pass
            lines.flush()
    # The stream ended without the run's end: the daemon went away.
    raise DaemonError(
        f"the daemon went away while run {run_id} was still running; "
        f"`stockade status` says whether it runs, `stockade report {run_id}` what the run did"
    )


def _stamp(when: float | None) -> str:
    if when is None:
        return "-"
    import datetime

    moment = datetime.datetime.fromtimestamp(when, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


class _Lines:
    """A transcript cut into lines, each with the time its chunk came and its
    stream, for ``logs --timestamps`` and ``logs --json``."""

    def __init__(self, *, timestamps: bool, as_json: bool) -> None:
        self.timestamps = timestamps
        self.as_json = as_json
        self._pending: dict[int, str] = {1: "", 2: ""}
        self._since: dict[int, float | None] = {1: None, 2: None}

    def stored(self, state_dir: str, result: dict[str, Any]) -> None:
        """What ``run.logs`` answered, split at the chunks the daemon noted
        (``transcript.log.times``: offset, time, stream); without that file
        (a run of an older daemon), one chunk of no known time."""
        from bisect import bisect_right

        from stockade.daemon import _paths

        data = str(result.get("data", "")).encode()
        end = int(result.get("offset") or len(data))
        start = end - len(data)
        marks: list[tuple[int, float, int]] = []
        try:
            times = _paths.transcript_path(state_dir, str(result.get("run"))) + ".times"
            with open(times, encoding="ascii") as f:
                for row in f:
                    off, when, stream = row.split()
                    marks.append((int(off), float(when), int(stream)))
        except (OSError, ValueError):
            marks = []
        if not marks:
            self.feed(1, data.decode("utf-8", "replace"), None)
            return
        offsets = [m[0] for m in marks]
        cuts = sorted({start, *(o for o in offsets if start < o < end)})
        for i, cut in enumerate(cuts):
            upto = cuts[i + 1] if i + 1 < len(cuts) else end
            mark = marks[max(0, bisect_right(offsets, cut) - 1)]
            piece = data[cut - start : upto - start].decode("utf-8", "replace")
            self.feed(2 if mark[2] == 2 else 1, piece, mark[1])

    def feed(self, fd: int, text: str, when: float | None) -> None:
        if not self._pending[fd]:
            self._since[fd] = when
        *done, rest = (self._pending[fd] + text).split("\n")
        for line in done:
            self._emit(fd, line, self._since[fd])
            self._since[fd] = when
        self._pending[fd] = rest

    def flush(self) -> None:
        for fd in (1, 2):
            if self._pending[fd]:
                self._emit(fd, self._pending[fd], self._since[fd])
                self._pending[fd] = ""

    def _emit(self, fd: int, line: str, when: float | None) -> None:
        if self.as_json:
            item = {"time": when, "stream": "stdout" if fd == 1 else "stderr", "line": line}
            if self.timestamps:
                item["timestamp"] = _stamp(when)
            _write(1, json.dumps(item, ensure_ascii=False) + "\n")
        else:
            _write(fd, f"{_stamp(when)} {line}\n")


@click.command("status")
@_JSON
@_place
def status(as_json: bool, state: str | None, socket_path: str | None) -> int:
    """Say whether the daemon runs, where, and what it holds (exit 4 when it does not)."""
    try:
        with _client(state, socket_path) as client:
            info = client.call("status")
    except DaemonError as exc:
        if not as_json:
            raise
        # A script that asked for JSON gets JSON, and the same exit code.
        _echo_json({"running": False, "socket": _where(state, socket_path)[1], "error": str(exc)})
        return exc.exit_code
    if as_json:
        info = {"running": True, **info}
        _echo_json(info)
        return 0
    store = info.get("store", {})
    click.echo(f"daemon    pid {info['pid']}, version {info['version']}, up {info['uptime']:.0f} s")
    click.echo(f"socket    {info['socket']}")
    click.echo(f"state     {info['state']}")
    click.echo(f"runs      {info['runs']['running']} running, {info['runs']['total']} in all")
    click.echo(f"approvals {info['approvals_pending']} pending")
    last = store.get("last_seq", "?")
    click.echo(
        f"store     {store.get('path')}: {last} events"
        + (f"; ERROR: {store['error']}" if store.get("error") else "")
    )
    journal = store.get("journal")
    if journal:
        click.echo(
            f"journal   {journal['path']} ({journal['bytes'] >> 20} MiB): "
            f"{journal['unindexed']} events not yet in SQLite"
        )
    if not info.get("accepting_runs", True):
        click.echo("stockade: the daemon refuses new runs: its store cannot write", err=True)
        return EXIT_HOST
    return 0


@click.group("approvals", invoke_without_command=True)
@click.option("--run", "run_ref", metavar="ID", default=None, help="Only this run's.")
@_JSON
@_place
@click.pass_context
def approvals(
    ctx: click.Context, run_ref: str | None, as_json: bool, state: str | None, socket_path: str | None
) -> int:
    """List the approvals waiting for an operator; ``approvals show ID`` prints one whole.

    Arguments longer than the listing's width are cut with a mark that says
    how many characters are left out; control characters are shown as escapes.
    """
    from stockade.cli._shown import preview, safe_json, visible

    if ctx.invoked_subcommand is not None:
        return 0
    with _client(state, socket_path) as client:
        pending = client.call("approvals.list", **({"run": run_ref} if run_ref else {}))["approvals"]
    if as_json:
        click.echo(safe_json(pending, indent=2))
        return 0
    if not pending:
        click.echo("no approvals are waiting")
    for a in pending:
        left = max(0.0, float(a.get("deadline") or 0) - time.time())
        approval_id = visible(str(a["id"]))
        args = preview(safe_json(a.get("args", {})), approval_id)
        click.echo(
            f"{approval_id}  run {visible(str(a['run']))}  {visible(str(a['intent']))} {args}"
            f"  ({left:.0f} s left)"
        )
    return 0


@approvals.command("show")
@click.argument("approval_id", metavar="ID")
@_JSON
@_place
def approvals_show(approval_id: str, as_json: bool, state: str | None, socket_path: str | None) -> int:
    """Print one waiting approval whole: every argument, with its length,
    control characters shown as escapes (``--json``: the approval as JSON)."""
    from stockade.cli._shown import argument_lines, safe_json, visible

    with _client(state, socket_path) as client:
        pending = client.call("approvals.list")["approvals"]
    found = [a for a in pending if a.get("id") == approval_id]
    if not found:
        from stockade.daemon._client import RemoteError

        raise RemoteError(
            f"no approval {visible(approval_id)!r} is waiting; `stockade approvals` lists those that are",
            code="not_found",
            method="approvals.list",
        )
    a = found[0]
    if as_json:
        click.echo(safe_json(a, indent=2))
        return 0
    left = max(0.0, float(a.get("deadline") or 0) - time.time())
    click.echo(f"approval {visible(str(a['id']))}  run {visible(str(a['run']))}  ({left:.0f} s left)")
    click.echo(f"intent {visible(str(a['intent']))}")
    for line in argument_lines(a.get("args", {})):
        click.echo(line)
    return 0


def _decide(
    approval_id: str, decision: str, reason: str, as_json: bool, state: str | None, socket_path: str | None
) -> int:
    with _client(state, socket_path) as client:
        result = client.call("approvals.decide", id=approval_id, decision=decision, reason=reason)
    if as_json:
        _echo_json(result)
    else:
        click.echo(f"{result['id']} {result['state']}")
    return 0


@click.command("approve")
@click.argument("approval_id", metavar="ID")
@click.option("--reason", default="", help="Why (for a question the agent asked: the answer).")
@_JSON
@_place
def approve(approval_id: str, reason: str, as_json: bool, state: str | None, socket_path: str | None) -> int:
    """Approve a waiting intent; the agent gets its answer at once."""
    return _decide(approval_id, "approve", reason, as_json, state, socket_path)


@click.command("deny")
@click.argument("approval_id", metavar="ID")
@click.option("--reason", required=True, help="Why: recorded, and told to the agent.")
@_JSON
@_place
def deny(approval_id: str, reason: str, as_json: bool, state: str | None, socket_path: str | None) -> int:
    """Deny a waiting intent."""
    return _decide(approval_id, "deny", reason, as_json, state, socket_path)


COMMANDS = (daemon, run, ps, stop, logs, status, approvals, approve, deny)
"""Registered by ``stockade.cli._app``."""

__all__ = ["COMMANDS", "approvals", "approve", "daemon", "deny", "logs", "ps", "run", "status", "stop"]
