"""``stockade exec`` run inside a network namespace of its own (``unshare -n``,
the normal container and CI set-up), for real: the kernel multicasts audit
records in the host's namespace only, so kernel refusals either still reach
the record (the reader makes its socket in an ancestor's namespace, proven by
a marker that must come back) or the cell refuses to start and says why;
never a silent gap (issue 12)."""

from __future__ import annotations

import json
import os
import select
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

STOCKADE = str(Path(sys.executable).with_name("stockade"))
WRITE_ETC = ["/bin/sh", "-c", "echo x > /etc/stockade-netns-test; exit 7"]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="unshare -n and the audit log need root")


def pid1_netns_reachable() -> bool:
    try:
        os.stat("/proc/1/ns/net")
        return True
    except OSError:
        return False


def test_exec_under_unshare_n_still_records_kernel_refusals(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    done = subprocess.run(
        ["unshare", "-n", STOCKADE, "exec", "-w", str(tmp_path), "--events", str(events), "--", *WRITE_ETC],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 7, done.stderr
    assert "1 refusal(s) in this cell" in done.stderr
    assert "creation of a file in /etc refused by landlock" in done.stderr
    kinds = [json.loads(line)["kind"] for line in events.read_text().splitlines()]
    assert "cell.denied" in kinds and "cell.audit_lost" not in kinds


def orphan_in_own_netns(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    """``stockade ARGS`` in a new network namespace, orphaned (its shell exits
    at once), so that no ancestor of it is in the host's namespace any more
    but pid 1. Waits on a pipe the orphan holds, not on time."""
    out, err = tmp_path / "out", tmp_path / "err"
    rc = tmp_path / "rc"
    read_end, write_end = os.pipe()
    command = shlex.join([STOCKADE, *args])
    script = f"({command} >{out} 2>{err}; echo $? >{rc}) &"
    subprocess.run(["unshare", "-n", "sh", "-c", script], pass_fds=(write_end,), check=True, timeout=30)
    os.close(write_end)
    deadline = time.monotonic() + 60
    while True:  # EOF once the orphan (and everything it ran) has exited
        ready, _, _ = select.select([read_end], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, "stockade exec in its own network namespace did not end within 60 s"
        if not os.read(read_end, 4096):
            break
    os.close(read_end)
    return int(rc.read_text()), out.read_text(), err.read_text()


def test_exec_where_the_audit_log_cannot_be_reached_refuses_or_records(tmp_path: Path) -> None:
    code, _out, err = orphan_in_own_netns(tmp_path, "exec", "-w", str(tmp_path), "--", *WRITE_ETC)
    if pid1_netns_reachable():
        # pid 1 is in the host's namespace and may be entered: still recorded.
        assert code == 7 and "1 refusal(s) in this cell" in err, err
        return
    # This host's pid 1 cannot be looked at: nowhere to read the records from.
    assert code == 5, err
    assert "not in the host's network namespace" in err
    assert "--without-kernel-records" in err and "stockade doctor" in err


def test_without_kernel_records_runs_and_says_so(tmp_path: Path) -> None:
    # The control: the operator's explicit choice runs the cell, which still
    # refuses the write, and the gap is on screen and in the record.
    events = tmp_path / "events.jsonl"
    args = ("--without-kernel-records", "-w", str(tmp_path), "--events", str(events), "--", *WRITE_ETC)
    code, _out, err = orphan_in_own_netns(tmp_path, "exec", *args)
    assert code == 7, err
    assert "Permission denied" in err  # refused all the same
    assert "--without-kernel-records: Landlock and seccomp refusals in this cell are not recorded" in err
    recorded = [json.loads(line) for line in events.read_text().splitlines()]
    gap = [e for e in recorded if e["kind"] == "cell.audit_lost"]
    assert len(gap) == 1 and gap[0]["detail"]["reason"] == "off"
    assert [e["kind"] for e in recorded][:2] == ["cell.start", "cell.audit_lost"]
