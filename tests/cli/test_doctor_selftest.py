"""``stockade doctor``'s self-test: a real cell's Landlock and seccomp refusals
must come back as events while it runs, or the doctor fails and says why
(issue 12: inside a network namespace of its own the doctor said audit was
fine while every refusal vanished)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from stockade.cell._selftest import BOUND, kernel_refusals
from tests.cli.test_exec_netns import STOCKADE, orphan_in_own_netns, pid1_netns_reachable

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="cells and the audit log need root")


def test_the_self_test_sees_both_refusals_come_back_while_the_cell_runs() -> None:
    result = kernel_refusals()
    assert result.ok, result
    assert result.landlock_ms is not None and 0 <= result.landlock_ms < BOUND * 1000
    assert result.seccomp_ms is not None and 0 <= result.seccomp_ms < BOUND * 1000
    assert "landlock" in result.here and "seccomp" in result.here


def test_doctor_json_reports_the_self_test_and_exits_0_here() -> None:
    done = subprocess.run([STOCKADE, "doctor", "--json"], capture_output=True, text=True, timeout=120)
    report = json.loads(done.stdout)
    assert done.returncode == 0, done.stderr
    assert report["self_test"]["ok"] is True and report["ok"] is True
    assert report["self_test"]["landlock_ms"] is not None


def test_doctor_where_refusals_cannot_come_back_fails_and_says_why(tmp_path: Path) -> None:
    code, out, err = orphan_in_own_netns(tmp_path, "doctor", "--json")
    report = json.loads(out)
    if pid1_netns_reachable():
        # The reader reaches the host's namespace through pid 1's: it works.
        assert code == 0 and report["self_test"]["ok"] is True, err
        return
    assert code == 5, err
    assert report["ok"] is False and report["self_test"]["ok"] is False
    assert "not in the host's network namespace" in report["self_test"]["fix"]
    assert "kernel refusals reaching the record" in err
