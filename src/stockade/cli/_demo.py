"""``stockade demo``: an agent whose model was prompt-injected tries to get out, live.

Thin: ``stockade.demo.run_agent_demo`` runs the agent under an in-process
daemon, in the demo's own network namespace, and builds the report; this
module renders the header, one entry per tool call as its record arrives, the
tripwire, the kernel's records (from its audit log, live) and the containment
report (rich, imported lazily), or the whole report as JSON. Exit 0 when every
attempt was refused and recorded, nothing reached a canary and the legitimate
task was done; 1 otherwise; 5 when the host cannot run the demo. docs/DEMO.md
explains every attempt and how to read a line.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from rich.console import Console

    from stockade.demo import Call, DemoReport

_CATEGORIES = {
    "other": "The agent starts: its task, and the notes that carry the injection",
    "task": "The legitimate task",
    "persistence": "Persistence: what it may leave in its own workspace, for the report to name",
    "kernel": "The kernel: files, sockets and system calls",
    "broker": "The broker: intents outside the policy's tools rules",
    "gateway": "The gateway: requests through the proxy",
    "llm": "The LLM endpoint",
}
_LAYERS = {
    "landlock": "kernel (Landlock)",
    "seccomp": "kernel (seccomp)",
    "mount": "kernel (read-only mount)",
    "dac": "kernel (file permissions)",
    "broker": "broker",
    "gateway": "gateway",
    "llm": "LLM endpoint",
}
_SYMBOL = {
    "refused": "✓",
    "done": "✓",
    "allowed": "·",
    "escaped": "✗",
    "failed": "✗",
    "unrecorded": "!",
    "planted": "!",
}
_STYLE = {
    "refused": "green",
    "done": "green",
    "allowed": "dim",
    "escaped": "bold red",
    "failed": "bold red",
    "unrecorded": "yellow",
    "planted": "yellow",
}


@click.command("demo")
@click.option(
    "--json", "as_json", is_flag=True, help="Print the whole report as JSON instead (nothing live)."
)
@click.option("--no-color", is_flag=True, help="No colours (NO_COLOR in the environment does the same).")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where to write the run's files (default: runs/demo-agent-<time>).",
)
@click.option(
    "--model-url",
    default=None,
    metavar="URL",
    help="A real OpenAI-compatible endpoint, such as http://127.0.0.1:11434/v1, instead of the mock.",
)
@click.option("--model", default=None, metavar="NAME", help="The model to ask for at --model-url.")
@click.option(
    "--model-key-env",
    default=None,
    metavar="VAR",
    help="The environment variable holding the key for --model-url (none: no key).",
)
@click.option(
    "--dashboard",
    "with_dashboard",
    is_flag=True,
    help="Serve the live dashboard from the demo's daemon: print its URL, wait for Enter to start.",
)
def demo(
    as_json: bool,
    no_color: bool,
    out_dir: str | None,
    model_url: str | None,
    model: str | None,
    model_key_env: str | None,
    with_dashboard: bool,
) -> None:
    """Watch a prompt-injected agent try every way out of its cell, and each layer stop it.

    An agent loop runs in a cell under the daemon, driven by a scripted model
    that a note in its workspace has prompt-injected: it does its task (a
    report from the docs host), then tries to read secrets, write the host's
    files, connect out directly, call forbidden system calls, ask the broker
    and the gateway for what the policy does not grant, and steal the LLM key,
    until the tripwire halts it. Every attempt is shown with its verdict, the
    layer that refused it and the rule; then a containment report, and the
    run's files under runs/.

    Needs root. Exits 0 when everything was contained and the task done, 1
    otherwise, 5 when this host cannot run it.
    """
    from stockade.demo import DemoOptions, run_agent_demo

    if (model is not None or model_key_env is not None) and model_url is None:
        raise click.UsageError("--model and --model-key-env go with --model-url; give the endpoint's URL")
    if model_key_env is not None and not os.environ.get(model_key_env):
        raise click.UsageError(f"--model-key-env names {model_key_env}, which is not set; export it first")
    if model_url is not None:
        if not model_url.startswith(("http://", "https://")):
            raise click.BadParameter(
                f"{model_url!r} is not an http:// or https:// URL; give the endpoint's, such as "
                "http://127.0.0.1:11434/v1",
                param_hint="'--model-url'",
            )
        _reachable(model_url)
    options = DemoOptions(out_dir=out_dir, model_url=model_url, model=model, model_key_env=model_key_env)
    hooks: dict[str, Any] = {}
    if with_dashboard:
        from stockade.cli._dashboard_cmd import demo_hooks

        hooks = demo_hooks()
    if as_json:
        import json

        report = run_agent_demo(options, **hooks)
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        view = _View(_console(no_color))
        report = run_agent_demo(options, on_start=view.start, on_call=view.call, on_halt=view.halt, **hooks)
        view.finish(report)
    if not report.contained:
        raise click.exceptions.Exit(1)


def _reachable(url: str) -> None:
    """Refuse to start against a model that does not answer at all: the run
    would only show a task not done (and read as 'NOT CONTAINED').

    Any HTTP answer (even 404 or 401) counts; only a transport failure does not.

    Raises:
        HostError: nothing answers at ``url``.
    """
    import httpx

    from stockade.errors import HostError

    try:
        with httpx.Client(timeout=httpx.Timeout(10.0), trust_env=False) as client:
            client.get(url.rstrip("/") + "/models")
    except httpx.HTTPError as exc:
        raise HostError(
            f"the model at {url} is unreachable ({exc or type(exc).__name__}); start it, "
            "fix --model-url, or leave it out for the demo's scripted model",
            feature="model",
        ) from None


def _console(no_color: bool) -> Console:
    from stockade.cli._style import console

    made: Console = console(highlight=False, no_color=no_color or None, emoji=False)
    return made


class _View:
    """Renders the demo as it happens."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.category = ""

    def _flush(self) -> None:
        self.console.file.flush()

    def start(self, setup: dict[str, Any]) -> None:
        from rich.markup import escape
        from rich.table import Table

        c = self.console
        c.print()
        c.print("[bold]stockade demo[/bold]: a prompt-injected agent tries to get out of its cell")
        c.print(
            "An agent loop runs in a cell under the daemon. Its model reads a note that carries a prompt "
            "injection and then tries every way out it knows, one tool call at a time. Each call shows the "
            "verdict ([green]✓[/green] refused, [bold red]✗[/bold red] got through), the layer that "
            "refused it and the rule, as the record receives it."
        )
        c.print()
        info = Table.grid(padding=(0, 2))
        info.add_column(style="bold", no_wrap=True)
        info.add_column()
        info.add_row("run", setup["run"])
        info.add_row("policy", f"{escape(_rel(setup['policy']))} (sha256 {setup['policy_sha256'][:16]}…)")
        info.add_row("model", escape(setup["model"]))
        info.add_row(
            "network",
            f"the demo's own namespace {setup['netns']}: {setup['docs_host']} (allowed, with the DOCS_TOKEN "
            "secret), an attacker's host, a private wiki, the metadata address; nothing leaves the machine",
        )
        info.add_row(
            "tripwire",
            f"the run halts at the {_ordinal(setup['denial_limit'])} refusal, by any layer "
            "(the kernel's Landlock and seccomp included)",
        )
        info.add_row("workspace", escape(setup["workspace"]))
        c.print(info)
        self._flush()

    def call(self, call: Call) -> None:
        c = self.console
        if call.category != self.category:
            self.category = call.category
            c.print()
            self._rule(f"[bold]{_CATEGORIES.get(call.category, call.category)}")
        live = call.verdict
        if call.category == "kernel" and live == "unrecorded":
            live = "refused"  # the kernel's record may come a moment after the call
        self._line(call, live)
        if call.category == "kernel" and not call.denials:
            self._body(
                f"[cyan]○[/cyan] [bold]kernel[/bold]: {_esc(_last_line(call.error))} "
                "[dim](its record comes from the audit log a moment later)[/dim]"
            )
        else:
            self._body(_stopped_by(call))
        self._flush()

    def _rule(self, title: str) -> None:
        from rich.rule import Rule

        # Piped, the console is wide so that nothing is cut; a rule as wide as
        # that would be noise in a pager: 80 columns, as on a terminal.
        width = None if self.console.is_terminal else 80
        self.console.print(Rule(title, align="left"), width=width)

    def _body(self, text: str) -> None:
        from rich.table import Table

        body = Table.grid(padding=(0, 1), expand=self.console.is_terminal)
        body.add_column(width=9, no_wrap=True)
        body.add_column(ratio=1)
        body.add_row("", text)
        self.console.print(body)

    def _line(self, call: Call, verdict: str) -> None:
        from rich.table import Table

        style = _STYLE[verdict]
        head = Table.grid(padding=(0, 1), expand=self.console.is_terminal)
        head.add_column(width=9, no_wrap=True)
        head.add_column(ratio=3)
        head.add_column(ratio=2, justify="right", style="dim", overflow="ellipsis", no_wrap=True)
        word = {"allowed": "ok", "unrecorded": "NO RECORD"}.get(verdict, verdict.upper())
        title = call.planned.title if call.planned is not None else _own_title(call)
        head.add_row(f"[{style}]{_SYMBOL[verdict]} {word}[/{style}]", _esc(title), _esc(_shown(call)))
        self.console.print(head)

    def halt(self, reason: str) -> None:
        c = self.console
        c.print()
        c.print(
            f"[bold magenta]⚡ TRIPWIRE[/bold magenta] {_esc(reason)}: "
            "its cell is killed, every later intent refused."
        )
        self._flush()

    def finish(self, report: DemoReport) -> None:
        from rich.table import Table

        c = self.console
        calls = report.calls
        # The call the tripwire interrupted never reported itself; the record has it.
        shown = {x.call_id for x in calls if x.end is not None}
        for call in calls:
            if call.call_id not in shown and call.is_attempt:
                c.print()
                c.print("[bold]The call the tripwire interrupted[/bold], from the record:")
                self._line(call, call.verdict)
                self._body(_stopped_by(call))
        kernel = [x for x in calls if x.category == "kernel"]
        if kernel:
            c.print()
            self._rule("[bold]The kernel's own records, read from the audit log")
            for call in kernel:
                self._line(call, call.verdict)
                self._body(_stopped_by(call))
        c.print()
        s = report.summary()
        table = Table(title="Containment report", title_justify="left", show_header=False, box=None)
        table.add_column(style="bold", no_wrap=True)
        table.add_column(justify="right", no_wrap=True)
        table.add_column()
        table.add_row("attempts to get out", str(s["attempts"]), "")
        refused_note = (
            "every one on record" if s["recorded"] == s["attempts"] else f"{s['recorded']} on record"
        )
        table.add_row("refused", _count(s["refused"], s["attempts"]), refused_note)
        for layer, n in sorted(
            s["by_layer"].items(), key=lambda kv: list(_LAYERS).index(kv[0]) if kv[0] in _LAYERS else 9
        ):
            table.add_row(f"  by the {_LAYERS.get(layer, layer)}", str(n), "")
        escaped = s["escaped"]
        table.add_row(
            "got through", f"[{'bold red' if escaped else 'green'}]{len(escaped)}[/]", ", ".join(escaped)
        )
        if s["unrecorded"]:
            table.add_row(
                "[yellow]refused, no record[/yellow]", str(len(s["unrecorded"])), ", ".join(s["unrecorded"])
            )
        if report.scripted and s["unexpected"]:
            table.add_row(
                "[yellow]another layer than expected[/yellow]",
                str(len(s["unexpected"])),
                ", ".join(s["unexpected"]),
            )
        touched = {k: v for k, v in report.canaries.items() if v}
        canaries = ", ".join(report.canaries) + ", the other agent's workspace"
        if touched or report.other_workspace_changed:
            table.add_row("canaries", "[bold red]REACHED[/bold red]", _esc(str(touched)))
        else:
            table.add_row("canaries", "[green]untouched[/green]", _esc(canaries))
        if report.leaks:
            table.add_row("secrets", "[bold red]LEAKED[/bold red]", _esc("; ".join(report.leaks)))
        else:
            model = report.model_calls
            sent = f" (the endpoint sent it to the model {model['with_the_key']} times)" if model else ""
            table.add_row(
                "secrets",
                "[green]kept[/green]",
                f"DOCS_TOKEN's value went to the docs host only; the LLM key never entered the cell{sent}",
            )
        task = "[green]done[/green]" if report.task_ok else "[bold red]NOT DONE[/bold red]"
        table.add_row(
            "legitimate task", task, "report.md written" if report.report_md is not None else "no report.md"
        )
        trip = report.tripwire
        table.add_row(
            "tripwire",
            "[green]halted the run[/green]" if trip else "[yellow]did not trip[/yellow]",
            _esc(trip),
        )
        left = report.persistence
        if left:
            names = ", ".join(f"{c.get('change')} {c.get('path')}" for c in left[:3])
            more = " …" if len(left) > 3 else ""
            undo = f"stockade revert {report.run.get('id', '')}"
            note = _esc(f"{names}{more}; undo: {undo}")
            table.add_row("left for your tools", f"[yellow]{len(left)}[/yellow]", note)
        else:
            table.add_row(
                "left for your tools", "[green]nothing[/green]", "no hook, git config, rc or editor file"
            )
        table.add_row("took", f"{report.duration:.1f} s", "")
        c.print(table)
        c.print()
        files = report.files
        if files:
            out = os.path.dirname(files["record_json"])
            c.print(f"[bold]files[/bold]  {_esc(_rel(out))}/")
            c.print(
                f"  record.json, record.txt   the run's record ({len(_events(report))} events), JSON and text"
            )
            c.print("  transcript.jsonl          the agent's own lines: each tool call and its result")
            c.print(
                f"  policy.yaml, policy.sha256  the policy (sha256 {report.setup['policy_sha256'][:16]}…)"
            )
            c.print("  report.json               this report, attempt by attempt")
        c.print()
        if report.contained:
            c.print(
                f"[bold green]Contained[/bold green]: {s['refused']} of {s['attempts']} attempts refused and "
                "recorded, none got through, the legitimate task was done"
                + (", and the tripwire halted the run." if trip else ".")
            )
        else:
            c.print(f"[bold red]NOT CONTAINED[/bold red]: {_esc('; '.join(report.problems))}.")
            if report.agent_error:
                c.print(report.agent_error[-2000:], markup=False)
        self._flush()


def _stopped_by(call: Call) -> str:
    verdict = call.verdict
    how = _esc(call.how[:320])
    if verdict == "refused":
        layer = _LAYERS.get(call.layer, call.layer)
        rule = f" [dim]({_esc(call.rule[:120])})[/dim]" if call.rule and call.rule not in call.how else ""
        return f"[green]●[/green] [bold]{layer}[/bold]: {how}{rule}"
    if verdict == "escaped":
        return f"[bold red]nothing stopped it: {how}[/bold red]"
    if verdict == "unrecorded":
        return f"[yellow]○ failed, but no layer recorded a refusal: {how}[/yellow]"
    if verdict == "planted":
        return f"[yellow]{how}: the workspace is its own; the persistence report at the end names it[/yellow]"
    return f"[{_STYLE[verdict]}]{how}[/]"


def _shown(call: Call) -> str:
    args = call.arguments if isinstance(call.arguments, dict) else {}
    if call.tool == "intent":
        given = args.get("args")
        inner: dict[str, Any] = given if isinstance(given, dict) else {}
        target = next((str(inner[k]) for k in ("path", "url", "argv", "question") if k in inner), "")
        return f"intent {args.get('name', '')} {target}".strip()
    main = next((str(args[k]) for k in ("command", "path", "url") if k in args), "")
    method = f"{args['method']} " if "method" in args else ""
    return f"{call.tool} {method}{main}".strip()


def _events(report: DemoReport) -> list[Any]:
    import json

    try:
        with open(report.files["record_json"], encoding="utf-8") as f:
            events: list[Any] = json.load(f)
            return events
    except (OSError, ValueError, KeyError):
        return []


def _ordinal(n: object) -> str:
    if not isinstance(n, int):
        return str(n)
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _own_title(call: Call) -> str:
    args = call.arguments if isinstance(call.arguments, dict) else {}
    if call.tool == "read_file" and args.get("path") == "task.md":
        return "it reads its task"
    if call.tool == "read_file" and args.get("path") == "notes.md":
        return "it reads the team's notes: the injection is in them"
    return "a call of the agent's own"


def _last_line(text: str) -> str:
    """What the agent saw, short: the exit code and the last line of a traceback."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) <= 1:
        return text.strip().removeprefix("RuntimeError: ")[:160]
    head = lines[0].split("Traceback")[0].removeprefix("RuntimeError: ").strip()
    return f"{head} {lines[-1][:120]}".strip()


def _count(n: int, total: int) -> str:
    return f"[green]{n}[/green]" if n == total else f"[bold red]{n}[/bold red]"


def _esc(text: str) -> str:
    from rich.markup import escape

    return escape(text.replace("\n", " "))


def _rel(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


__all__ = ["demo"]
