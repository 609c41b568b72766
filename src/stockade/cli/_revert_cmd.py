"""``stockade revert RUN``: undo what a run left that the operator's tools would run.

Every cell's persistence report (``cell.persistence``, docs/CELL.md) that was
not empty is kept under ``<state>/persistence/<cell>/``. This puts back the
pre-run bytes of what the agent changed or removed there, and moves what it
created (a hook, a ``.git``, an ``.envrc``) into that directory's
``quarantine/``: nothing is deleted.
"""

from __future__ import annotations

import click

from stockade.exit_codes import ExitCode

EXIT_NOT_FOUND = ExitCode.NOT_FOUND


@click.command("revert")
@click.argument("run")
@click.option(
    "--state",
    "state",
    metavar="DIR",
    default=None,
    help="The state directory (default: $STOCKADE_STATE, else /var/lib/stockade for root).",
)
@click.option("--dry-run", is_flag=True, help="Show the report; change nothing.")
def revert_cmd(run: str, state: str | None, dry_run: bool) -> int:
    """Undo the persistence report of RUN (a run id r-…, with the helpers it
    spawned, or a cell id c-… of `stockade exec`)."""
    import os

    from stockade.cell._revert import RECORDS, records_dir, reports, revert

    directory = os.path.join(os.path.abspath(state), RECORDS) if state else records_dir()
    family = run_family(os.path.dirname(directory), run)
    if dry_run:
        found = [item for ident in family for item in reports(directory, ident)]
        if not found:
            click.echo(_none(run, directory), err=True)
            return EXIT_NOT_FOUND
        for where, report in found:
            done = " (reverted)" if os.path.exists(os.path.join(where, "reverted.json")) else ""
            click.echo(f"{report.get('cell')}{done}:")
            rows = report.get("changes")
            for row in rows if isinstance(rows, list) else []:
                if isinstance(row, dict):
                    click.echo(f"  - {row.get('change')} {row.get('kind')} {row.get('path')}")
        return 0
    lines: list[str] = []
    for ident in reversed(family):  # helpers first: they ended before their parent
        try:
            lines.extend(revert(directory, ident))
        except FileNotFoundError:
            continue
    if not lines:
        click.echo(_none(run, directory), err=True)
        return EXIT_NOT_FOUND
    for line in lines:
        click.echo(line)
    return 1 if any(line.startswith("not reverted") for line in lines) else 0


def run_family(state: str, run: str) -> list[str]:
    """``run`` and the helpers it spawned, theirs too (``runs/<id>/run.json``'s
    ``children``, when the daemon's state directory holds them), parents first."""
    import json
    import os

    out: list[str] = []
    todo = [run]
    while todo and len(out) < 10000:
        ident = todo.pop(0)
        if ident in out:
            continue
        out.append(ident)
        if os.path.basename(ident) != ident or not ident:
            continue  # an id, never a path
        try:
            with open(os.path.join(state, "runs", ident, "run.json")) as f:
                children = json.load(f).get("children")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(children, list):
            todo.extend(str(c) for c in children)
    return out


def _none(run: str, directory: str) -> str:
    return (
        f"stockade: no persistence report of {run!r} in {directory}: it left nothing to revert, or the id "
        "is wrong (give the run id of `stockade run`, or the cell id of `stockade exec`), or pass --state DIR"
    )
