"""``stockade bench``: validate, run, verify and report proctored benchmark trials (docs/BENCH.md).

Thin: resolves task names, calls ``stockade.bench``, renders. Exit codes: 0
ok; 1 a bundle fails verification, or a trial's expectations were not met
(``run --check``); 2 usage; 3 a task is wrong; 4 the daemon is unreachable;
6 no such task, bundle or results.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from stockade.cli._daemon_cmds import _place, _where
from stockade.exit_codes import ExitCode

EXIT_OK = int(ExitCode.OK)
EXIT_FAILED = int(ExitCode.FAILED)
EXIT_POLICY = int(ExitCode.POLICY)
EXIT_NOT_FOUND = int(ExitCode.NOT_FOUND)
_TASKS = Path(__file__).resolve().parent.parent / "bench" / "tasks"


def resolve_tasks(specs: tuple[str, ...]) -> list[Path]:
    """Task directories: a path (a task, or a directory of tasks), or an in-tree task's name."""
    found: list[Path] = []
    for spec in specs:
        path = Path(spec)
        if not path.exists() and (_TASKS / spec).exists():
            path = _TASKS / spec
        if (path / "task.toml").is_file() or path.name == "task.toml":
            found.append(path)
        elif path.is_dir() and sorted(path.glob("*/task.toml")):
            found.extend(p.parent for p in sorted(path.glob("*/task.toml")))
        else:
            names = ", ".join(
                sorted(p.parent.relative_to(_TASKS).as_posix() for p in _TASKS.rglob("task.toml"))
            )
            raise click.UsageError(
                f"{spec!r} is not a task directory (one holding task.toml), a directory of tasks, "
                f"or an in-tree task; the in-tree tasks are {names}, "
                "and 'protocol' names the 10-task protocol"
            )
    return found


@click.group("bench")
def bench() -> None:
    """Proctored benchmark runs on Harbor / Terminal-Bench 2 tasks (docs/BENCH.md)."""


@bench.command("validate")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@click.argument("tasks", nargs=-1, required=True)
def validate_cmd(tasks: tuple[str, ...], as_json: bool) -> int:
    """Check task directories: every problem at file:line; exit 3 when one is wrong."""
    from stockade.bench import validate_tasks

    loaded, problems = validate_tasks([str(p) for p in resolve_tasks(tasks)])
    if as_json:
        click.echo(
            json.dumps(
                {
                    "ok": not problems,
                    "tasks": [{"name": t.name, "path": str(t.path), "checksum": t.checksum} for t in loaded],
                    "problems": problems,
                },
                indent=2,
            )
        )
    else:
        for task in loaded:
            image = task.environment.docker_image or (
                "environment/Dockerfile" if task.environment.dockerfile else "host view"
            )
            click.echo(f"{task.path}: {task.name} ok ({image}, tripwire {task.stockade.tripwire})")
        for problem in problems:
            click.echo(problem, err=True)
    return EXIT_POLICY if problems else EXIT_OK


@bench.command("run")
@click.option("--agent", default="oracle", show_default=True, help="oracle, tool-loop, or a command line.")
@click.option("--model", default=None, help="The model the tool loop asks for (the LLM endpoint's).")
@click.option(
    "--llm-url", default=None, help="Where the LLM endpoint forwards (e.g. `stockade mock-llm`'s URL)."
)
@click.option(
    "--llm-key-env", default=None, help="The variable holding the model's API key (never enters a cell)."
)
@click.option(
    "--mock",
    is_flag=True,
    help="Serve each task's own scripted model ([stockade.expect].solver) offline, for --agent tool-loop.",
)
@click.option(
    "--attempts", default=1, show_default=True, type=click.IntRange(1, 1000), help="Trials per task."
)
@click.option(
    "--concurrency", default=1, show_default=True, type=click.IntRange(1, 64), help="Trials at once."
)
@click.option("--out", default="runs", show_default=True, help="Where the bundles and results.json go.")
@click.option("--resume", is_flag=True, help="Skip the trials whose bundle in --out is finished.")
@click.option(
    "--in-workbench",
    is_flag=True,
    help="Run the tool loop inside the workbench cell, not in a cell of its own acting through the broker.",
)
@click.option("--check", is_flag=True, help="Exit 1 unless every trial showed what its task expects.")
@click.option("--json", "as_json", is_flag=True, help="Print results.json instead of the table.")
@_place
@click.argument("tasks", nargs=-1, required=True)
def run_cmd(
    tasks: tuple[str, ...],
    agent: str,
    model: str | None,
    llm_url: str | None,
    llm_key_env: str | None,
    mock: bool,
    attempts: int,
    concurrency: int,
    out: str,
    resume: bool,
    in_workbench: bool,
    check: bool,
    as_json: bool,
    state: str | None,
    socket_path: str | None,
) -> int:
    """Run trials of TASKS, each proctored, each leaving a bundle in --out."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from stockade.bench import ProctorConfig, load_task
    from stockade.bench._campaign import Campaign
    from stockade.bench._report import per_task_table, summary_lines, table
    from stockade.daemon._client import Client
    from stockade.errors import DaemonError

    loaded = [load_task(p) for p in resolve_tasks(tasks)]  # a TaskError is exit 3
    if mock and agent != "tool-loop":
        raise click.UsageError("--mock serves the tool loop's model; add --agent tool-loop")
    if agent == "tool-loop" and not (llm_url or mock):
        raise click.UsageError(
            "--agent tool-loop needs --llm-url (a model server; `stockade mock-llm` serves one) or --mock"
        )
    served = None
    if mock:
        from stockade.bench._mockmodel import MockModel, routing_script

        served = MockModel(routing_script(loaded)).start()
        llm_url, model = served.url, model or "mock-llm"
    state_dir, sock = _where(state, socket_path)
    local = None
    try:
        with Client(sock, timeout=10.0) as probe:
            probe.call("status")
    except DaemonError:
        from stockade.daemon._server import DaemonThread

        local = DaemonThread(state=state_dir, socket_path=sock).start()
    config = ProctorConfig(
        socket_path=sock,
        out=Path(out).resolve(),
        agent=agent,
        model=model,
        llm_url=llm_url,
        llm_key_env=llm_key_env,
        broker=not in_workbench,
        state=state_dir,
    )
    console = Console(stderr=True)
    try:
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            disable=as_json or not sys.stderr.isatty(),
        ) as progress:
            bar = progress.add_task("trials", total=len(loaded) * attempts)

            def advanced(summary: dict[str, Any]) -> None:
                progress.advance(bar)
                progress.console.log(
                    f"{summary.get('task')} #{summary.get('attempt')}: {summary.get('status')}"
                )

            campaign = Campaign(
                loaded, config, attempts=attempts, concurrency=concurrency, resume=resume, on_trial=advanced
            )
            results = campaign.run()
    finally:
        if local is not None:
            local.stop()
        if served is not None:
            served.close()
    if as_json:
        click.echo(json.dumps(results, indent=2))
    else:
        Console().print(table(results))
        Console().print(per_task_table(results))
        for line in summary_lines(results):
            click.echo(line)
        click.echo(f"results: {config.out / 'results.json'}")
    if check and not all((t.get("expected") or {}).get("met") for t in results["trials"]):
        return EXIT_FAILED
    return EXIT_OK


@bench.command("verify")
@click.option("--db", default=None, help="Also check the events against this record (events.db).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@click.argument("bundles", nargs=-1, required=True)
def verify_cmd(bundles: tuple[str, ...], db: str | None, as_json: bool) -> int:
    """Re-check bundles: every file, the manifest's seal, every event's hash; exit 1 when one fails."""
    from stockade.bench import verify_bundle

    report: dict[str, list[str]] = {}
    for bundle in bundles:
        if not os.path.isdir(bundle):
            click.echo(
                f"stockade: {bundle} is not a directory; give a trial's bundle, runs/<task>-<time>", err=True
            )
            return EXIT_NOT_FOUND
        report[bundle] = verify_bundle(bundle, db=db)
    if as_json:
        click.echo(json.dumps({"ok": not any(report.values()), "bundles": report}, indent=2))
    else:
        for bundle, problems in report.items():
            if problems:
                click.echo(f"{bundle}: FAILED")
                for problem in problems:
                    click.echo(f"  {problem}")
            else:
                click.echo(f"{bundle}: ok")
    return EXIT_FAILED if any(report.values()) else EXIT_OK


@bench.command("report")
@click.option(
    "--html", "html_out", default=None, metavar="FILE", help="Also write the report as one HTML page."
)
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.argument("directory", default="runs")
def report_cmd(directory: str, html_out: str | None, as_json: bool) -> int:
    """Print a campaign's results again (the --out of `bench run`), and with --html as a page."""
    from rich.console import Console

    from stockade.bench._report import load_results, per_task_table, render_html, summary_lines, table

    try:
        results = load_results(directory)
    except FileNotFoundError as exc:
        click.echo(f"stockade: {exc}; run `stockade bench run --out {directory}` first", err=True)
        return EXIT_NOT_FOUND
    except ValueError as exc:
        click.echo(
            f"stockade: a results file under {directory} is not JSON ({exc}); "
            "remove results.json to rebuild it from the bundles",
            err=True,
        )
        return EXIT_FAILED
    if as_json:
        click.echo(json.dumps(results, indent=2))
    else:
        Console().print(table(results))
        Console().print(per_task_table(results))
        for line in summary_lines(results):
            click.echo(line)
    if html_out:
        try:
            Path(html_out).write_text(render_html(results), encoding="utf-8")
        except OSError as exc:
            raise click.UsageError(
                f"--html {html_out}: cannot write it ({exc.strerror}); name a file in a directory that exists"
            ) from exc
        click.echo(f"wrote {html_out}", err=as_json)
    return EXIT_OK


__all__ = ["bench", "resolve_tasks"]
