"""``stockade session``: open, exec, ls and close against a real daemon."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import click
from click.testing import CliRunner

from stockade.cli._session_cmds import session
from stockade.errors import StockadeError
from tests.daemon.test_server import daemon_at, workspace


def _cli(sock: str, *args: str, stdin: bytes | None = None) -> tuple[int, str, str]:
    runner = CliRunner()
    group = click.Group("stockade")
    group.add_command(session)

    @click.command()
    def main() -> None:
        try:
            code = group.main(
                args=["session", *args, "--socket", sock] if args[0] != "exec" else ["session", *args],
                prog_name="stockade",
                standalone_mode=False,
            )
        except StockadeError as exc:
            click.echo(f"stockade: {exc}", err=True)
            raise SystemExit(exc.exit_code) from exc
        raise SystemExit(code if isinstance(code, int) else 0)

    result = runner.invoke(main, [], input=stdin)
    return result.exit_code, result.stdout, result.stderr


@contextlib.contextmanager
def _opened_session(tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    """A daemon and a session opened on it by `stockade session open` (checked
    to succeed): the daemon's socket, the session's id and its workspace."""
    ws = workspace(tmp_path)
    policy = tmp_path / "bench.json"
    policy.write_text(json.dumps({"name": "bench", "workspace": str(ws)}))
    with daemon_at(tmp_path) as dt:
        sock = dt.socket_path
        code, out, err = _cli(sock, "open", str(policy))
        assert code == 0, err
        yield sock, out.strip(), ws


def test_open_exec_ls_close(tmp_path: Path) -> None:
    with _opened_session(tmp_path) as (sock, sid, _ws):
        assert sid.startswith("s-")
        script = "cat; echo e >&2; exit 4"
        code, out, err = _cli(
            sock, "exec", "--socket", sock, "--stdin", sid, "sh", "-c", script, stdin=b"in\n"
        )
        assert (code, out, err) == (4, "in\n", "e\n")  # its output, its exit code
        code, out, _ = _cli(sock, "exec", "--socket", sock, "--timeout", "0.3", sid, "sleep", "300")
        assert code == 137
        code, out, _ = _cli(sock, "ls")
        assert code == 0 and sid in out and "bench" in out
        code, out, _ = _cli(sock, "close", sid)
        assert code == 0 and f"{sid} closed after" in out
        code, out, _ = _cli(sock, "ls")
        assert out.strip() == "no session is open"
        code, _, err = _cli(sock, "close", sid)
        assert code == 6 and "no open session" in err  # not found


def test_shell_runs_each_line_as_a_recorded_exec_and_keeps_cd(tmp_path: Path) -> None:
    with _opened_session(tmp_path) as (sock, sid, ws):
        lines = b"echo hi > made.txt && cat made.txt\ncd /tmp\npwd\ncd /no/such/dir\n\npwd; false\nexit\n"
        code, out, err = _cli(sock, "shell", sid, stdin=lines)
        # Each line ran in the cell; `cd` was kept, a failed one left it as it was.
        assert out == "hi\n/tmp\n/tmp\n", err
        assert "/no/such/dir" in err
        assert code == 1  # `exit` gives the last line's code (`false`)
        assert (ws / "made.txt").read_text() == "hi\n"  # in the session's workspace
        code, out, _ = _cli(sock, "shell", sid, stdin=b"exit 7\n")
        assert code == 7
        (info,) = [i for i in dt_sessions(sock) if i["session"] == sid]
        assert info["calls"] == 5  # one exec per line that ran: the blank line and exit ran none
        code, _, err = _cli(sock, "shell", "s-nosuchsession", stdin=b"true\n")
        assert code == 6 and "no open session" in err


def dt_sessions(sock: str) -> list[dict[str, object]]:
    from stockade.daemon._client import Client

    with Client(sock, timeout=30) as client:
        return list(client.sessions())
