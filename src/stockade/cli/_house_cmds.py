"""What users of agentctl, docker and nsjail expect: ``init`` (a commented
starter policy), ``report RUN`` (a run's containment report, again, later),
``prune`` (ended runs and kept workspaces, with a dry run) and ``completion``
(the shell's tab completion).

``report`` and ``prune`` read the daemon's state directory and its event store
directly, as ``revert`` and ``export`` do, so they work with or without a
daemon running; ``prune`` asks the daemon, when one runs, which runs are live
and never touches those.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from typing import Any

import click

from stockade.cli._daemon_cmds import _JSON, _place, _where
from stockade.cli._style import Duration
from stockade.errors import DaemonError, NotFoundError, PolicyError
from stockade.exit_codes import ExitCode

# --------------------------------------------------------------------------- init

STARTER = """\
# A starter policy for {where} (written by `stockade init`).
# Check it:  stockade validate {file}
# Use it:    stockade exec -p {file} -- COMMAND     (one command, no daemon)
#            stockade run -f {file} -- COMMAND      (under the daemon: approvals, gateway)
# Every key is described in docs/POLICY.md; what is not granted here is refused.
name: {name}

# The agent's working tree, read-write; the cell sees it at the same path.
{workspace_line}

filesystem:
  # base: system gives the system directories read-only, a private /tmp, and
  # hides the host's home, keys and sockets. Add what the agent may read:
  read: []
  # ... and, beyond the workspace, what it may write:
  write: []
  # Files in the workspace the agent may read but never change (or create),
  # beyond those protected already (git hooks and config, shell rc files, .envrc…):
  protect: []

exec:
  allow: []             # empty: any program the cell can read may run

env:
  pass: [TERM, LANG]    # copied from your environment; nothing else crosses

limits:
  memory: 1G
  pids: 256
  cpu: 1
  timeout: 30m

network:
  # No network unless named here; allowed hosts are reached through the
  # gateway (an HTTP(S) proxy the cell is given), never directly.
  allow: []
  # allow: [pypi.org, files.pythonhosted.org]

# An LLM the agent may call through the gateway; the key stays outside the cell:
# llm: {{provider: openai, model: gpt-4o-mini, api_key_env: OPENAI_API_KEY}}

# Intents the agent asks the broker for (stockade_agent), and who decides:
# tools:
#   - {{id: notes, intent: fs.write, match: {{path: "{cwd}/notes/*"}}, verdict: ask}}
"""


def _starter(path: str, name: str, cwd: str) -> str:
    from stockade.policy import loads_policy

    def text(workspace_line: str) -> str:
        return STARTER.format(
            where=cwd, file=os.path.basename(path), name=name, workspace_line=workspace_line, cwd=cwd
        )

    chosen = text(f"workspace: {json.dumps(cwd)}")
    try:
        loads_policy(chosen, source=path, environ={})
    except PolicyError as exc:
        # This directory cannot be a workspace (/, /etc, a home…): say why in the file.
        reason = str(exc).split(": ", 1)[-1]
        chosen = text(f"# workspace: {json.dumps(cwd)}   # refused here: {reason}")
    return chosen


@click.command("init")
@click.option(
    "-o",
    "--out",
    "out",
    metavar="FILE",
    default="stockade.yaml",
    show_default=True,
    help="Where to write the starter policy.",
)
@click.option("--name", metavar="NAME", default=None, help="The policy's name (default: this directory's).")
@click.option("--force", is_flag=True, help="Overwrite FILE if it exists.")
def init(out: str, name: str | None, force: bool) -> int:
    """Write a commented starter policy for the current directory.

    The workspace is this directory; everything else is the default policy's
    (system directories read-only, no network, limits), with the keys you are
    likely to change written out and explained. It passes `stockade validate`.
    """
    import re

    cwd = os.getcwd()
    path = os.path.abspath(out)
    if os.path.lexists(path) and not force:
        raise click.UsageError(
            f"{out!r} exists already; choose another --out, or give --force to overwrite it"
        )
    base = re.sub(r"[^a-z0-9-]+", "-", (name or os.path.basename(cwd) or "agent").lower()).strip("-")
    chosen = (base or "agent")[:63]
    text = _starter(path, chosen, cwd)
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        raise click.BadParameter(
            f"{out!r}: the directory {directory!r} does not exist; create it first", param_hint="'--out'"
        )
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise PolicyError(
            f"cannot write the starter policy to {out!r}: {exc.strerror}; choose another --out"
        ) from None
    click.echo(
        f"stockade: wrote {out} (policy {chosen!r}); check it with `stockade validate {out}`", err=True
    )
    return ExitCode.OK


# --------------------------------------------------------------------------- report


def _run_events(state_dir: str, run_id: str) -> list[dict[str, Any]]:
    from stockade.daemon import _paths
    from stockade.record._store import open_store

    path = _paths.store_path(state_dir)
    if not os.path.exists(path):
        raise NotFoundError(f"there is no event store at {path}; pass --state DIR or set STOCKADE_STATE")
    with open_store(path, readonly=True) as store:
        return [stored.event.to_dict() for stored in store.query(run=run_id)]


def _resolve_run(state_dir: str, ref: str) -> str:
    """A run id from an id or a name (the newest run of that name), from the state directory."""
    from stockade.daemon import _paths

    if _paths.RUN_ID.match(ref):
        return ref
    best: tuple[float, str] | None = None
    root = _paths.runs_dir(state_dir)
    for entry in os.listdir(root) if os.path.isdir(root) else ():
        try:
            with open(_paths.run_meta_path(state_dir, entry), encoding="utf-8") as f:
                meta = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict) and meta.get("name") == ref:
            created = float(meta.get("created") or 0)
            if best is None or created > best[0]:
                best = (created, entry)
    if best is None:
        raise NotFoundError(f"no run {ref!r} in {state_dir}; `stockade ps -a` lists the runs")
    return best[1]


def containment_report(run_id: str, events: list[dict[str, Any]]) -> dict[str, Any]:
    """What a run was refused, by layer, and how it ended, from its events."""
    refusals = [e for e in events if e.get("outcome") in ("denied", "audited")]
    by_layer: dict[str, int] = {}
    for event in refusals:
        layer = str(event.get("layer") or "?")
        by_layer[layer] = by_layer.get(layer, 0) + 1
    end = next((e for e in reversed(events) if e.get("kind") == "run.end"), None)
    start = next((e for e in events if e.get("kind") == "run.start"), None)
    halted = next((e for e in events if e.get("kind") == "run.halted"), None)
    approvals = [e for e in events if str(e.get("kind", "")).startswith("approval.")]
    limits = sorted(
        {
            str(e.get("detail", {}).get("limit", e.get("summary", "")))
            for e in events
            if e.get("kind") == "cell.limit"
        }
    )
    return {
        "run": run_id,
        "events": len(events),
        "started": start.get("time") if start else (events[0].get("time") if events else None),
        "ended": end.get("time") if end else None,
        "exit_code": (end or {}).get("detail", {}).get("exit_code"),
        "state": (end or {}).get("detail", {}).get("state", "running" if end is None else None),
        "halted": (halted or {}).get("summary") or None,
        "refusals": len(refusals),
        "by_layer": dict(sorted(by_layer.items())),
        "refused": [
            {"layer": e.get("layer"), "summary": e.get("summary"), "time": e.get("time")} for e in refusals
        ],
        "approvals": len(approvals),
        "limits_hit": limits,
    }


@click.command("report")
@click.argument("run_ref", metavar="RUN")
@click.option("--all", "show_all", is_flag=True, help="List every refusal, not the first 20.")
@_JSON
@_place
def report(run_ref: str, show_all: bool, as_json: bool, state: str | None, socket_path: str | None) -> int:
    """Print a run's containment report again: what it was refused, by which
    layer, how it ended, and its persistence report.

    RUN is a run id or name (the newest run of that name). Read from the event
    store; works after the run, and the daemon, ended. Exit 6 when the record
    holds no event of RUN.
    """
    state_dir, _sock = _where(state, socket_path)
    run_id = _resolve_run(state_dir, run_ref)
    events = _run_events(state_dir, run_id)
    if not events:
        raise NotFoundError(f"the record holds no event of run {run_id!r}; `stockade ps -a` lists the runs")
    found = containment_report(run_id, events)
    if as_json:
        click.echo(json.dumps(found, indent=2, ensure_ascii=False))
        return ExitCode.OK
    from stockade.cli._shown import visible

    ended = "still running" if found["ended"] is None else f"{found['state']}, exit code {found['exit_code']}"
    click.echo(f"run {run_id}: {ended}; {found['events']} events")
    if found["halted"]:
        click.echo(f"halted: {visible(str(found['halted']))}")
    layers = ", ".join(f"{n} {layer}" for layer, n in found["by_layer"].items())
    click.echo(f"{found['refusals']} refusal(s)" + (f" ({layers})" if layers else ""))
    shown = found["refused"] if show_all else found["refused"][:20]
    for item in shown:
        click.echo(f"  - {visible(str(item['summary']))} [{item['layer']}]")
    if len(shown) < len(found["refused"]):
        click.echo(f"  … and {len(found['refused']) - len(shown)} more (--all lists them)")
    if found["approvals"]:
        click.echo(f"{found['approvals']} approval event(s)")
    if found["limits_hit"]:
        click.echo("limits hit: " + ", ".join(found["limits_hit"]))
    from stockade.cli._daemon_cmds import _persistence

    _persistence(state_dir, run_id)
    return ExitCode.OK


# --------------------------------------------------------------------------- prune


def _live_runs(state: str | None, socket_path: str | None) -> tuple[set[str], set[str]] | None:
    """The ids and workspaces of the daemon's live runs, or None when no daemon answers."""
    from stockade.daemon._client import Client

    try:
        with Client(_where(state, socket_path)[1], timeout=10.0) as client:
            runs = client.call("run.list", all=False)["runs"]
    except DaemonError:
        return None
    live = [r for r in runs if r.get("state") in ("running", "stopping")]
    return {str(r["id"]) for r in live}, {
        os.path.realpath(str(r["workspace"])) for r in live if r.get("workspace")
    }


def _in_use(path: str) -> bool:
    """Whether a process works in ``path`` (a running `exec` cell's fresh
    workspace, or a shell of the operator's): its cwd or root is under it. A
    cell sees its workspace at the same path, so its cwd reads the same."""
    prefix = os.path.realpath(path) + "/"
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        for link in ("cwd", "root"):
            try:
                target = os.readlink(f"/proc/{pid}/{link}")
            except OSError:
                continue
            if (target + "/").startswith(prefix):
                return True
    return False


def _size(path: str) -> int:
    total = 0
    for root, dirs, files in os.walk(path, onerror=lambda _e: None):
        for name in (*dirs, *files):
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


@click.command("prune")
@click.option("--dry-run", "-n", "dry_run", is_flag=True, help="Say what would be removed; remove nothing.")
@click.option(
    "--older-than",
    "older_than",
    type=Duration(zero=True),
    default="0s",
    show_default=True,
    help="Only what ended (or was last changed) longer ago than this, such as 7d.",
)
@click.option(
    "--workspaces",
    "workspaces",
    is_flag=True,
    help="Also kept fresh workspaces (`exec --keep-workspace`, `run` without --workspace).",
)
@click.option("-y", "--yes", is_flag=True, help="Do not ask; remove at once (what a script passes).")
@_JSON
@_place
def prune(
    dry_run: bool,
    older_than: float,
    workspaces: bool,
    yes: bool,
    as_json: bool,
    state: str | None,
    socket_path: str | None,
) -> int:
    """Remove the directories of ended runs (their transcripts, metadata and
    spools) and, with --workspaces, kept fresh workspaces.

    Never a live run's, never the event store: the record of every run stays
    (`stockade export`, `report`). A daemon that runs is asked which runs are
    live; without one, a run whose metadata says it has not ended is kept.
    Asks before removing, unless --yes or --dry-run.
    """
    from stockade.cell._cell import WORKSPACES_ROOT
    from stockade.daemon import _paths

    state_dir, _sock = _where(state, socket_path)
    found_live = _live_runs(state, socket_path)
    live, live_workspaces = found_live if found_live is not None else (None, set())
    cutoff = time.time() - older_than
    doomed: list[dict[str, Any]] = []
    root = _paths.runs_dir(state_dir)
    for entry in sorted(os.listdir(root)) if os.path.isdir(root) else ():
        if not _paths.RUN_ID.match(entry):
            continue
        try:
            with open(_paths.run_meta_path(state_dir, entry), encoding="utf-8") as f:
                meta = json.load(f)
        except (OSError, ValueError):
            meta = {}
        ended = meta.get("ended") if isinstance(meta, dict) else None
        if (live is not None and entry in live) or ended is None or float(ended) > cutoff:
            continue
        path = _paths.run_dir(state_dir, entry)
        doomed.append({"kind": "run", "id": entry, "path": path, "bytes": _size(path)})
    if workspaces and os.path.isdir(WORKSPACES_ROOT):
        for entry in sorted(os.listdir(WORKSPACES_ROOT)):
            path = os.path.join(WORKSPACES_ROOT, entry)
            if entry.startswith(".") or not os.path.isdir(path) or os.path.islink(path):
                continue
            if os.lstat(path).st_mtime > cutoff:
                continue
            # Never a live run's workspace, nor one a process works in.
            if os.path.realpath(path) in live_workspaces or _in_use(path):
                continue
            doomed.append({"kind": "workspace", "id": entry, "path": path, "bytes": _size(path)})
    total = sum(int(d["bytes"]) for d in doomed)
    if not as_json:
        verb = "would remove" if dry_run else "removing"
        for d in doomed:
            click.echo(f"{verb} {d['kind']} {d['path']} ({int(d['bytes']) >> 10} KiB)")
        if not doomed:
            click.echo("nothing to prune")
    if doomed and not dry_run and not yes:
        if not sys.stdin.isatty():
            raise click.UsageError("prune removes files: confirm at a terminal, or pass --yes (or --dry-run)")
        if not click.confirm(f"remove {len(doomed)} item(s), {total >> 20} MiB?", default=False, err=True):
            click.echo("stockade: nothing was removed", err=True)
            return ExitCode.OK
    removed = []
    if not dry_run:
        for d in doomed:
            shutil.rmtree(str(d["path"]), ignore_errors=True)
            if not os.path.lexists(str(d["path"])):
                removed.append(d)
    if as_json:
        click.echo(
            json.dumps(
                {"dry_run": dry_run, "items": doomed, "removed": len(removed), "bytes": total}, indent=2
            )
        )
    elif not dry_run and doomed:
        click.echo(f"stockade: removed {len(removed)} of {len(doomed)} item(s)", err=True)
    return ExitCode.OK if dry_run or len(removed) == len(doomed) else ExitCode.FAILED


# --------------------------------------------------------------------------- completion

_SHELLS = ("bash", "zsh", "fish")


@click.command("completion")
@click.argument("shell", type=click.Choice(_SHELLS), metavar="SHELL")
def completion(shell: str) -> int:
    """Print the tab-completion script for SHELL (bash, zsh or fish).

    bash: `eval "$(stockade completion bash)"` in ~/.bashrc; zsh: the same
    with zsh in ~/.zshrc; fish: `stockade completion fish | source`.
    """
    from click.shell_completion import get_completion_class

    # The root command from the context, not an import of cli._app, which
    # imports this module (no import circles: tests/test_import_graph.py).
    cli = click.get_current_context().find_root().command
    found = get_completion_class(shell)
    assert found is not None  # click ships all three
    script: str = found(cli, {}, "stockade", "_STOCKADE_COMPLETE").source()
    click.echo(script)
    return ExitCode.OK


COMMANDS = (init, report, prune, completion)
"""Registered by ``stockade.cli._app``."""

__all__ = ["COMMANDS", "completion", "containment_report", "init", "prune", "report"]
