"""``stockade session``: workbench sessions the daemon hosts (docs/SESSIONS.md).

Thin: each subcommand is one or two ``session.*`` requests through
``Client.open_session`` / ``RemoteSession``, and prints what came back.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from typing import Any

import click

from stockade.cli._daemon_cmds import _JSON, _client, _echo_json, _place
from stockade.cli._style import Duration


@click.group("session")
def session() -> None:
    """Workbench sessions: one long-lived cell serving many commands (docs/SESSIONS.md)."""


@session.command("open")
@click.argument("policy", metavar="POLICY", required=False, type=click.Path(dir_okay=False))
@click.option("--run", "run_ref", metavar="ID", help="Bind to this running run (its policy and workspace).")
@click.option("--image", metavar="REF", help="The image as the cell's / (stockade image ls).")
@click.option(
    "-w",
    "--workspace",
    metavar="DIR",
    type=click.Path(file_okay=False),
    help="The workspace (an existing directory).",
)
@_JSON
@_place
def open_cmd(
    policy: str | None,
    run_ref: str | None,
    image: str | None,
    workspace: str | None,
    as_json: bool,
    state: str | None,
    socket_path: str | None,
) -> int:
    """Open a session from a POLICY file, or bound to a --run; print its id."""
    if policy is None and run_ref is None:
        raise click.UsageError("give a POLICY file, or --run ID to bind to a running run")
    with _client(state, socket_path, timeout=120.0) as client:
        opened = client.open_session(
            policy_path=os.path.abspath(policy) if policy else None,
            image=image,
            workspace=os.path.abspath(workspace) if workspace else None,
            run=run_ref,
        )
    if as_json:
        _echo_json(opened.info)
    else:
        click.echo(opened.session_id)
    return 0


@session.command("exec", context_settings={"allow_interspersed_args": False})
@click.argument("session_id", metavar="SESSION")
@click.argument("argv", nargs=-1, required=True)
@click.option("--cwd", metavar="DIR", help="An absolute directory inside the cell.")
@click.option("-e", "--env", "env", metavar="K=V", multiple=True, help="A variable for this command.")
@click.option("--user", metavar="UID", help="Another user (a root workbench only).")
@click.option(
    "--timeout",
    type=Duration(minimum=0.001),
    help="Kill the command's whole tree after this long (90, 30s, 5m).",
)
@click.option("--stdin", "use_stdin", is_flag=True, help="Pass this command's stdin to it.")
@_place
def exec_cmd(
    session_id: str,
    argv: tuple[str, ...],
    cwd: str | None,
    env: tuple[str, ...],
    user: str | None,
    timeout: float | None,
    use_stdin: bool,
    state: str | None,
    socket_path: str | None,
) -> int:
    """Run ARGV in SESSION; its output here, its exit code as this command's."""
    from stockade.daemon._client import RemoteSession

    variables: dict[str, str] = {}
    for item in env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.UsageError(f"--env {item!r} is not K=V; write e.g. --env LANG=C.UTF-8")
        variables[name] = value
    data = sys.stdin.buffer.read() if use_stdin else None
    with _client(state, socket_path, timeout=60.0) as client:
        remote = RemoteSession.attach(client, session_id)
        result = remote.exec(
            list(argv), input=data, cwd=cwd, env=variables or None, user=user, timeout=timeout
        )
    sys.stdout.buffer.write(result.stdout)
    sys.stdout.buffer.flush()
    sys.stderr.buffer.write(result.stderr)
    if result.timed_out:
        click.echo(f"stockade: killed after the {timeout:g} s timeout", err=True)
    return int(result.returncode)


@session.command("shell")
@click.argument("session_id", metavar="SESSION")
@click.option("--cwd", metavar="DIR", help="The directory to start in (absolute, inside the cell).")
@click.option("--user", metavar="UID", help="Another user (a root workbench only).")
@click.option(
    "--timeout",
    type=Duration(minimum=0.001),
    help="Kill each line's whole tree after this long (90, 30s, 5m).",
)
@_place
def shell_cmd(
    session_id: str,
    cwd: str | None,
    user: str | None,
    timeout: float | None,
    state: str | None,
    socket_path: str | None,
) -> int:
    """A shell in SESSION: each line is one recorded exec (sh -c LINE); cd is kept, exit ends it."""
    from stockade.daemon._client import RemoteSession

    if cwd is not None and not cwd.startswith("/"):
        raise click.UsageError(
            f"--cwd {cwd!r} is not absolute; give a directory inside the cell such as /app"
        )
    interactive = sys.stdin.isatty()
    if interactive:
        import readline  # noqa: F401  (line editing and history for input())
    code = 0
    with _client(state, socket_path, timeout=60.0) as client:
        remote = RemoteSession.attach(client, session_id)
        if interactive:
            click.echo(
                f"stockade: a shell in session {session_id}; each line is one exec, `exit` ends it",
                err=True,
            )
        while True:
            try:
                line = input(f"{session_id}:{cwd or '~'}$ ") if interactive else sys.stdin.readline()
            except EOFError:
                break  # ^D at the prompt
            if not interactive and not line:
                break  # end of input (a blank line is "\n")
            line = line.rstrip("\n")
            words = _simple_words(line) or []
            if words and words[0] == "exit" and len(words) <= 2:
                return int(words[1]) if len(words) == 2 and words[1].isdigit() else code
            is_cd = bool(words) and words[0] == "cd" and len(words) <= 2
            if is_cd:
                # Resolved in the cell (its view, its HOME), kept for the next lines.
                argv = ["/bin/sh", "-c", 'cd -- "${1:-$HOME}" && pwd', "sh", *words[1:]]
            elif line.strip():
                argv = ["/bin/sh", "-c", line]
            else:
                continue
            result = remote.exec(argv, cwd=cwd, user=user, timeout=timeout)
            if is_cd and result.returncode == 0:
                cwd = result.stdout.decode("utf-8", "replace").strip() or cwd
            else:
                sys.stdout.buffer.write(result.stdout)
                sys.stdout.buffer.flush()
            sys.stderr.buffer.write(result.stderr)
            sys.stderr.buffer.flush()
            if result.timed_out:
                click.echo(f"stockade: killed after the {timeout:g} s timeout", err=True)
            code = int(result.returncode)
    return code


def _simple_words(line: str) -> list[str] | None:
    """The words of ``line`` when it is one plain command (no operator,
    redirection or substitution), else None: only such a ``cd`` or ``exit``
    is the shell's own; anything else goes to ``sh -c`` as typed."""
    if any(c in line for c in ";&|<>()$`\\"):
        return None
    try:
        return shlex.split(line)
    except ValueError:
        return None


@session.command("ls")
@click.option("--run", "run_ref", metavar="ID", help="Only the sessions bound to this run.")
@_JSON
@_place
def ls_cmd(run_ref: str | None, as_json: bool, state: str | None, socket_path: str | None) -> int:
    """List the open sessions."""
    with _client(state, socket_path) as client:
        found = client.sessions(run_ref)
    if as_json:
        _echo_json(found)
        return 0
    if not found:
        click.echo("no session is open")
    for info in found:
        bound = f" run {info['run']}" if info.get("run") else ""
        click.echo(f"{info['session']}  {info['policy']}  {info['calls']} calls{bound}  {info['workspace']}")
    return 0


@session.command("close")
@click.argument("session_id", metavar="SESSION")
@_JSON
@_place
def close_cmd(session_id: str, as_json: bool, state: str | None, socket_path: str | None) -> int:
    """Close SESSION: its cell and every process in it end; what it left is reported."""
    from stockade.daemon._client import RemoteSession

    with _client(state, socket_path, timeout=120.0) as client:
        closed: dict[str, Any] = RemoteSession.attach(client, session_id).close()
    if as_json:
        click.echo(json.dumps(closed, indent=2))
        return 0
    changes = closed.get("persistence") or []
    click.echo(
        f"{session_id} closed after {closed.get('calls', 0)} calls, {closed.get('denials', 0)} refusals"
    )
    for change in changes:
        click.echo(f"  left: {change.get('path', change)}")
    return 0


__all__ = ["session"]
