"""The Harbor environment end to end: ``harbor run`` (Harbor 0.25.0, in the
Python 3.12 of .venv-harbor that scripts/setup.sh makes) on an in-tree
Harbor task, with Harbor's oracle agent and with an agent that reaches for
the hidden tests."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HARBOR = ROOT / ".venv-harbor" / "bin" / "harbor"
TASK = ROOT / "examples" / "harbor" / "tasks" / "hello-stockade"

if not HARBOR.exists():  # pragma: no cover - setup.sh makes it wherever a Python 3.12 is
    pytest.skip(
        "no .venv-harbor: Harbor needs Python >= 3.12, which scripts/setup.sh found none of",
        allow_module_level=True,
    )


def _harbor_run(tmp_path: Path, agent: str, task: Path = TASK, **env: str) -> tuple[dict[str, object], Path]:
    jobs = tmp_path / "jobs"
    state = tmp_path / "state"
    environ = {
        **os.environ,
        # No traffic off the machine: Harbor's telemetry and LiteLLM's price
        # list would otherwise be fetched at start (HOST.md, network rules).
        "HARBOR_TELEMETRY": "0",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "PYTHONPATH": str(Path(__file__).parent / "harbor_agents"),
        **env,
    }
    done = subprocess.run(
        [
            str(HARBOR),
            "run",
            "-p",
            str(task),
            "-a",
            agent,
            "--env",
            "stockade_harbor:StockadeEnvironment",
            "-o",
            str(jobs),
            "--ek",
            f"state={state}",
        ],
        env=environ,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (trial,) = [p for p in jobs.glob("*/*") if p.is_dir()]
    return json.loads((trial / "result.json").read_text()), trial


def _reward(result: dict[str, object]) -> float:
    verifier = result["verifier_result"]
    assert isinstance(verifier, dict)
    rewards = verifier["rewards"]
    assert isinstance(rewards, dict)
    return float(rewards["reward"])


def test_the_oracle_gets_reward_one_and_the_bundle_is_beside_the_trial(tmp_path: Path) -> None:
    result, trial = _harbor_run(tmp_path, "oracle")
    assert _reward(result) == 1.0
    bundle = trial / "stockade"
    report = json.loads((bundle / "containment.json").read_text())
    assert report["refusals"] == 0
    assert len(report["cells"]) == 2  # the agent's cell, then the verifier's
    manifest = json.loads((bundle / "manifest.json").read_text())
    import hashlib

    for name, digest in manifest["files"].items():
        assert hashlib.sha256((bundle / name).read_bytes()).hexdigest() == digest
    kinds = [json.loads(line)["kind"] for line in (bundle / "events.jsonl").read_text().splitlines()]
    assert kinds[0] == "harness.trial.start" and "harness.trial.phase" in kinds
    assert report["record"]["store"] == str(tmp_path / "state" / "events.db")


def test_an_agent_that_reaches_for_the_hidden_tests_is_reported(tmp_path: Path) -> None:
    result, trial = _harbor_run(tmp_path, "peek_agent:PeekAgent", PEEK_HOST_TESTS=str(TASK / "tests"))
    assert _reward(result) == 0.0
    report = json.loads((trial / "stockade" / "containment.json").read_text())
    assert report["refusals"] >= 1
    assert any("/tests" in a["summary"] for a in report["attempts"]), report["attempts"]
    # What it saw there was nothing: it wrote the length of what it read.
    assert (trial / "stockade" / "root" / "app" / "greeting.txt").read_text() == "0\n"


def test_an_allow_list_lets_the_task_run_and_refuses_a_host_off_it(tmp_path: Path) -> None:
    import shutil

    task = tmp_path / "allowlist-task"
    shutil.copytree(TASK, task)
    toml = (task / "task.toml").read_text()
    toml = toml.replace(
        'network_mode = "no-network"', 'network_mode = "allowlist"\nallowed_hosts = ["pypi.org"]'
    )
    (task / "task.toml").write_text(toml)
    result, trial = _harbor_run(tmp_path, "peek_agent:ReachAgent", task=task)
    assert _reward(result) == 1.0  # the control: the task itself still works
    report = json.loads((trial / "stockade" / "containment.json").read_text())
    assert report["refusals_by_layer"].get("gateway", 0) >= 1
    assert any("off-the-list.example" in a["summary"] for a in report["attempts"]), report["attempts"]
    assert "403" in (trial / "stockade" / "root" / "app" / "curl.err").read_text()


def test_an_image_named_as_the_task_is_the_trials_root(tmp_path: Path) -> None:
    from tests.harness._image import store_image

    store_image(tmp_path / "state", tag="hello-stockade")
    result, trial = _harbor_run(tmp_path, "oracle")
    assert _reward(result) == 1.0
    # The image's own /etc/os-release has two lines; the host's has more.
    assert (trial / "stockade" / "root" / "app" / "count.txt").read_text().strip() == "2"
    first = json.loads((trial / "stockade" / "events.jsonl").read_text().splitlines()[0])
    assert first["detail"]["image"] == "hello-stockade"
