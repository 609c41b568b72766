"""``stockade session``: open, exec, ls and close against a real daemon."""

from __future__ import annotations

import json
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


def test_open_exec_ls_close(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    policy = tmp_path / "bench.json"
    policy.write_text(json.dumps({"name": "bench", "workspace": str(ws)}))
    with daemon_at(tmp_path) as dt:
        sock = dt.socket_path
        code, out, err = _cli(sock, "open", str(policy))
        assert code == 0, err
        sid = out.strip()
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
