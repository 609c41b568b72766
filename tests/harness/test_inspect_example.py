"""examples/inspect/task.py under `inspect eval` with Inspect's mockllm model:
the sample is scored from its stockade sandbox, and the eval log's sample
metadata carries the containment report with the refused read."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_example_task_runs_and_its_log_says_what_was_refused(tmp_path: Path) -> None:
    from inspect_ai.log import read_eval_log

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "inspect_ai",
            "eval",
            "examples/inspect/task.py",
            "--model",
            "mockllm/model",
            "--log-dir",
            str(tmp_path / "logs"),
            "--display",
            "none",
        ],
        cwd=ROOT,
        env={**os.environ, "STOCKADE_STATE": str(tmp_path / "state")},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (log_file,) = (tmp_path / "logs").glob("*.eval")
    log = read_eval_log(str(log_file))
    assert log.status == "success"
    (sample,) = log.samples or []
    assert sample.scores is not None and sample.scores["answer_matches"].value == "C"  # the control
    report = sample.metadata["stockade"]
    assert report["sample"] == "1/1"
    assert [a["summary"] for a in report["attempts"]] == [
        "read of /etc/shadow refused by landlock (fs.read_file)"
    ]
    assert report["record"]["store"] == str(tmp_path / "state" / "events.db")
    # Inspect's task_init started the sample's session ahead of it (harness/_pool.py).
    assert report["session"]["started_ahead"] is True
