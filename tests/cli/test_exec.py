"""``stockade exec`` from the shell: flags, exit codes, --json and --events."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stockade.cli._exec import USAGE, _parse, _Usage

STOCKADE = str(Path(sys.executable).with_name("stockade"))


def run(*args: str, cwd: Path | None = None, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STOCKADE, "exec", *args], capture_output=True, text=True, cwd=cwd, input=stdin, timeout=60
    )


def test_exit_code_is_the_commands(tmp_path: Path) -> None:
    done = run("--workspace", str(tmp_path), "--", "/bin/sh", "-c", "echo hi; exit 3")
    assert done.returncode == 3
    assert done.stdout == "hi\n"


def test_refusals_are_summarised_on_stderr(tmp_path: Path) -> None:
    done = run("-w", str(tmp_path), "--", "/bin/cat", "/etc/shadow")
    assert done.returncode == 1
    assert "refusal(s) in this cell" in done.stderr
    assert "/etc/shadow" in done.stderr and "landlock" in done.stderr


def test_quiet_leaves_stderr_to_the_command(tmp_path: Path) -> None:
    done = run("-q", "-w", str(tmp_path), "--", "/bin/cat", "/etc/shadow")
    assert "refusal" not in done.stderr
    assert "Permission denied" in done.stderr


def test_json_reports_output_and_events(tmp_path: Path) -> None:
    done = run("--json", "-w", str(tmp_path), "--", "/bin/sh", "-c", "echo out; cat /etc/shadow")
    report = json.loads(done.stdout)
    assert done.returncode == report["exit_code"] == 1
    assert report["stdout"] == "out\n"
    denied = [e for e in report["events"] if e["kind"] == "cell.denied"]
    assert denied and denied[0]["detail"]["path"] == "/etc/shadow"
    assert report["events"][0]["kind"] == "cell.start"


def test_json_to_a_closed_pipe_is_said_without_a_traceback(tmp_path: Path) -> None:
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the result is written (`| true`)
    try:
        done = subprocess.run(
            [STOCKADE, "exec", "--json", "-w", str(tmp_path), "--", "/bin/sh", "-c", "exit 4"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write)
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr
    assert "could not be written" in done.stderr and "exited with 4" in done.stderr
    assert done.returncode == 4


def test_events_file_is_jsonl(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    workspace = tmp_path / "ws"
    workspace.mkdir()
    done = run("--events", str(events), "-w", str(workspace), "--", "/bin/sh", "-c", "echo x > /usr/evil")
    assert done.returncode != 0
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    assert lines[0]["kind"] == "cell.start"
    assert any(e["kind"] == "cell.denied" and e["layer"] == "landlock" for e in lines)
    assert lines[-1]["kind"] == "cell.end"
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_stdin_reaches_the_command(tmp_path: Path) -> None:
    done = run("-w", str(tmp_path), "--", "/bin/cat", stdin="piped\n")
    assert done.stdout == "piped\n"


def test_timeout_flag(tmp_path: Path) -> None:
    done = run("--timeout", "0.3", "-w", str(tmp_path), "--", "/bin/sleep", "30")
    assert done.returncode == 137
    assert "timeout" in done.stderr


def test_command_not_found_is_127(tmp_path: Path) -> None:
    done = run("-w", str(tmp_path), "--", "definitely-not-a-command")
    assert done.returncode == 127
    assert "definitely-not-a-command" in done.stderr


def test_policy_file_is_used(tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text("name: tiny\nlimits:\n  timeout: 0.3s\n")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    done = run("--policy", str(policy), "-w", str(workspace), "--", "/bin/sleep", "30")
    assert done.returncode == 137


def test_bad_policy_is_exit_3(tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text("name: bad\nnetwork:\n  alow: []\n")
    done = run("--policy", str(policy), "--", "/bin/true")
    assert done.returncode == 3
    assert "p.yaml:3:3" in done.stderr and "allow" in done.stderr


def test_help_and_usage_errors() -> None:
    done = run("--help")
    assert done.returncode == 0 and done.stdout == USAGE
    done = run("--bogus")
    assert done.returncode == 2 and "there is no option --bogus" in done.stderr
    done = run("--timeout", "soon", "--", "/bin/true")
    assert done.returncode == 2 and "--timeout 'soon'" in done.stderr


def test_no_command_is_usage_error() -> None:
    done = run()
    assert done.returncode == 2
    assert "no command" in done.stderr


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--", "ls", "-l"], ["ls", "-l"]),
        (["ls", "-l"], ["ls", "-l"]),
        (["-w", "/x", "ls"], ["ls"]),
        (["--workspace=/x", "--json", "--", "--odd"], ["--odd"]),
    ],
)
def test_parser_splits_options_from_the_command(argv: list[str], expected: list[str]) -> None:
    assert _parse(argv)["command"] == expected


@pytest.mark.parametrize("argv", [["-w"], ["--timeout", "0"], ["--timeout", "-1"], ["--nope"]])
def test_parser_rejects(argv: list[str]) -> None:
    with pytest.raises(_Usage):
        _parse(argv)
