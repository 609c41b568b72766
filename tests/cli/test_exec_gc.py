"""``stockade exec`` holds the collector back while it starts (issue 18),
and gives it back as it was: it counts collections, never times."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import pytest

from stockade.cli.main import EXEC_GC_THRESHOLD, main

_PROBE = """
import gc, sys
default = gc.get_threshold()
sys.argv = ["stockade", "exec", "-q", "--", "/bin/true"]
import atexit
from stockade.cli.main import main
before = gc.get_stats()[0]["collections"]

@atexit.register  # the first registered, the last run: main() ends the process
def report():
    collections = gc.get_stats()[0]["collections"] - before
    sys.stderr.write(f"\\n=gc {collections} {gc.get_freeze_count()} {gc.get_threshold() == default}\\n")

main()
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="a cell reads the kernel audit log: needs root")
def test_a_whole_exec_process_starts_without_collections_and_exits_frozen() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    line = next(x for x in done.stderr.splitlines() if x.startswith("=gc "))
    _, collections, frozen, restored = line.split()
    # 10 young collections at Python's threshold of 700; none at EXEC_GC_THRESHOLD.
    assert int(collections) <= 2, f"{collections} collections while exec started and ran"
    assert int(frozen) > 5000 and restored == "True"


def test_an_exec_inside_a_process_that_goes_on_leaves_its_collector_as_it_was(
    capsys: pytest.CaptureFixture[str],
) -> None:
    threshold, frozen = gc.get_threshold(), gc.get_freeze_count()
    assert threshold[0] != EXEC_GC_THRESHOLD
    assert main(["exec", "--help"]) == 0
    assert "Usage: stockade exec" in capsys.readouterr().out
    assert gc.get_threshold() == threshold and gc.get_freeze_count() == frozen


_ENDING = """
import atexit, sys, threading, time
sys.argv = ["stockade", "exec", "-q", "--", "/bin/sh", "-c", "exit 7"]
from stockade.cli.main import main

@atexit.register  # the first registered, the last run
def last() -> None:
    sys.stdout.write(f"=hook last, worker done: {done.is_set()}")  # buffered, never flushed here

done = threading.Event()

def worker() -> None:
    time.sleep(0.2)  # still running when the cell has ended
    done.set()

threading.Thread(target=worker).start()  # not a daemon: the exit waits for it
main()
sys.stdout.write("=after main")  # never reached: main ends the process
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="a cell reads the kernel audit log: needs root")
def test_a_whole_exec_process_ends_as_the_interpreters_exit_would() -> None:
    # Without the module teardown (cli/main.py's _end_process), but with what
    # the interpreter's exit does that shows: threads joined, every exit hook
    # run, stdout flushed, the command's exit code as the status.
    done = subprocess.run([sys.executable, "-c", _ENDING], capture_output=True, text=True, timeout=60)
    assert done.returncode == 7, done.stderr
    assert done.stdout == "=hook last, worker done: True"
