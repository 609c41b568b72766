"""``stockade demo``: a scripted rogue program tries to get out of its cell, live.

Thin: ``stockade.demo.run_demo`` runs the rogue and pairs each attempt with the
kernel's record of it; this module renders the header, one entry per attempt
as it happens, and the summary (rich, imported lazily), or the whole report as
JSON. Exit 0 when every attempt was refused, the legitimate task worked and no
canary was touched; 1 otherwise; 5 when the host cannot run the demo (not
root, a layer missing). docs/DEMO.md explains every attempt and how to read a
line.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from rich.console import Console

    from stockade.demo import Attempt, DemoReport, DemoSetup

_CATEGORIES = {
    "task": "The legitimate task",
    "filesystem": "Files: secrets, system files, other agents, persistence",
    "network": "Network: reaching the host or the outside",
    "process": "Processes and privilege",
}
_SYMBOL = {"refused": "✓", "done": "✓", "escaped": "✗", "failed": "✗"}
_STYLE = {"refused": "green", "done": "green", "escaped": "bold red", "failed": "bold red"}


@click.command("demo")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable report instead.")
@click.option("--no-color", is_flag=True, help="No colours (NO_COLOR in the environment does the same).")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where to write the events and the rogue's transcript (default: runs/demo-<time>).",
)
def demo(as_json: bool, no_color: bool, out_dir: str | None) -> None:
    """Watch a rogue program try to escape its cell, and every layer stop it.

    The rogue, a scripted stand-in for a hijacked agent, does one legitimate
    task in its workspace and then tries to read secrets, write system files,
    reach the host's network and gain privileges, one attempt at a time. Each
    attempt is shown with its verdict and what stopped it, with the kernel's own
    record of the refusal where the kernel makes one.

    Needs root (the kernel audit log). Exits 0 when every attempt was refused
    and the legitimate task worked, 1 otherwise.
    """
    from stockade.demo import run_demo

    if as_json:
        import json

        report = run_demo(out_dir=out_dir)
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        view = _View(_console(no_color))
        report = run_demo(out_dir=out_dir, on_start=view.start, on_attempt=view.attempt)
        view.finish(report)
    if not report.contained:
        raise click.exceptions.Exit(1)


def _console(no_color: bool) -> Console:
    from rich.console import Console

    return Console(highlight=False, no_color=no_color or None, emoji=False)


class _View:
    """Renders the demo as it happens."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.category = ""

    def _flush(self) -> None:
        self.console.file.flush()

    def start(self, setup: DemoSetup) -> None:
        from rich.table import Table

        c = self.console
        c.print()
        c.print("[bold]stockade demo[/bold]: a rogue program tries to get out of its cell")
        c.print(
            "A scripted stand-in for a hijacked agent runs in a cell. It does one legitimate "
            "task, then tries to escape, one attempt at a time. Each attempt shows what it "
            "tried, the verdict ([green]✓[/green] refused, [bold red]✗[/bold red] got out) and "
            "what stopped it: [green]●[/green] the kernel's own record "
            "of the refusal (Landlock or seccomp, read from the audit log), or "
            "[cyan]○[/cyan] the layer that refused it where the kernel keeps no record.",
        )
        c.print()
        info = Table.grid(padding=(0, 2))
        info.add_column(style="bold", no_wrap=True)
        info.add_column()
        info.add_row(
            "policy",
            f"{setup.policy}: the default policy (system directories read-only, a fresh "
            "workspace read-write, no network, nothing of the host's home, secrets or sockets)",
        )
        info.add_row("workspace", setup.workspace)
        info.add_row("limits", setup.limits)
        layers = Table.grid(padding=(0, 2))
        layers.add_column(no_wrap=True)
        layers.add_column()
        for name, here in setup.layers:
            layers.add_row(name, here)
        info.add_row("layers", layers)
        info.add_row("canaries", "\n".join(setup.canaries))
        c.print(info)
        self._flush()

    def attempt(self, attempt: Attempt) -> None:
        from rich.markup import escape
        from rich.table import Table

        c = self.console
        if attempt.category != self.category:
            self.category = attempt.category
            c.print()
            c.rule(f"[bold]{_CATEGORIES.get(attempt.category, attempt.category)}", align="left")
        style = _STYLE[attempt.verdict]
        head = Table.grid(padding=(0, 1), expand=True)
        head.add_column(width=9, no_wrap=True)
        head.add_column(ratio=3)
        head.add_column(ratio=2, justify="right", style="dim", overflow="ellipsis", no_wrap=True)
        verdict = f"[{style}]{_SYMBOL[attempt.verdict]} {attempt.verdict.upper()}[/{style}]"
        head.add_row(verdict, escape(attempt.title), escape(attempt.call))
        body = Table.grid(padding=(0, 1), expand=True)
        body.add_column(width=9, no_wrap=True)
        body.add_column(ratio=1)
        body.add_row("", _stopped_by(attempt))
        c.print(head)
        c.print(body)
        self._flush()

    def finish(self, report: DemoReport) -> None:
        from rich.table import Table

        c = self.console
        c.print()
        s = report.summary()
        tried = report.escape_attempts
        recorded = s["recorded_by_kernel"]
        unrecorded = s["refused"] - recorded
        table = Table(title="Summary", title_justify="left", show_header=False, box=None)
        table.add_column(style="bold", no_wrap=True)
        table.add_column(justify="right", no_wrap=True)
        table.add_column()
        table.add_row("attempts to escape", str(len(tried)), "")
        table.add_row("refused", str(s["refused"]), "")
        table.add_row("  recorded by the kernel", str(recorded), "Landlock and seccomp records")
        table.add_row("  refused, no record", str(unrecorded), "the kernel keeps no record of these layers")
        if s["missing_records"]:
            table.add_row(
                "[yellow]  records missing[/yellow]",
                f"[yellow]{len(s['missing_records'])}[/yellow]",
                "[yellow]" + ", ".join(s["missing_records"]) + "[/yellow]",
            )
        escaped = len(report.escapes)
        table.add_row(
            "escaped",
            f"[{'bold red' if escaped else 'green'}]{escaped}[/]",
            ", ".join(a.id for a in report.escapes),
        )
        task = report.task
        table.add_row(
            "legitimate task",
            "[green]done[/green]" if report.task_ok else "[bold red]FAILED[/bold red]",
            (task.how if task else "the rogue never reported it"),
        )
        canary = report.canary
        if canary.touched:
            what = (
                f"{canary.tcp} TCP connection(s), {canary.unix} unix connection(s), "
                f"{canary.signals} signal(s), other workspace changed: "
                f"{canary.other_workspace_changed}"
            )
            table.add_row("canaries", "[bold red]TOUCHED[/bold red]", what)
        else:
            table.add_row(
                "canaries",
                "[green]untouched[/green]",
                "no connection, no signal, the other agent's workspace unchanged",
            )
        if report.lost:
            table.add_row(
                "[yellow]kernel records lost[/yellow]",
                f"[yellow]{len(report.lost)}[/yellow]",
                report.lost[0].summary,
            )
        c.print(table)
        c.print()
        layers = Table(title="By layer", title_justify="left", box=None, padding=(0, 2))
        layers.add_column("layer", style="bold")
        layers.add_column("refused", justify="right")
        layers.add_column("recorded by the kernel", justify="right")
        for layer, (n, rec) in report.by_layer().items():
            layers.add_row(layer, str(n), str(rec) if rec else "-")
        c.print(layers)
        c.print()
        if report.events_file:
            c.print(f"events      {_rel(report.events_file)} ({report.event_count} events, JSON lines)")
            c.print(f"transcript  {_rel(report.transcript_file or '')} (the rogue's own lines)")
        elif report.write_error:
            c.print(f"[yellow]events and transcript not written: {report.write_error}[/yellow]")
        c.print()
        if not report.complete:
            c.print(f"[bold red]The rogue stopped before its end (exit code {report.exit_code}).[/]")
            if report.stderr.strip():
                c.print(report.stderr.strip()[-2000:], markup=False)
        if report.contained:
            c.print(
                f"[bold green]Contained[/bold green]: 0 of {len(tried)} escape attempts got out, "
                f"{recorded} refusals are on record from the kernel itself, and the legitimate "
                "task worked."
            )
        else:
            problems = _problems(report)
            c.print(f"[bold red]NOT CONTAINED[/bold red]: {'; '.join(problems)}.")
        self._flush()


def _stopped_by(attempt: Attempt) -> str:
    from rich.markup import escape

    how = escape(attempt.how)
    if attempt.verdict == "escaped":
        return f"[bold red]nothing stopped it: {how}[/bold red]"
    if attempt.verdict in ("done", "failed"):
        return f"[{_STYLE[attempt.verdict]}]{how}[/]"
    if attempt.recorded:
        return f"[green]●[/green] [bold]{attempt.layer}[/bold]: {how}"
    if attempt.missing_record:
        return (
            f"[yellow]○ no {attempt.expected_kernel} record came[/yellow]; "
            f"[bold]{attempt.layer}[/bold]: {how}"
        )
    return f"[cyan]○[/cyan] [bold]{attempt.layer}[/bold]: {how}"


def _problems(report: DemoReport) -> list[str]:
    out = []
    if report.escapes:
        out.append(f"{len(report.escapes)} attempt(s) escaped: " + ", ".join(a.id for a in report.escapes))
    if not report.task_ok:
        out.append("the legitimate task failed")
    if report.canary.touched:
        out.append("a canary on the host was touched")
    if not report.complete:
        out.append("the rogue did not finish")
    if not report.escape_attempts:
        out.append("no attempt was made")
    return out or ["see the report above"]


def _rel(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


__all__ = ["demo"]
