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


def _harbor_run(
    tmp_path: Path, agent: str, task: Path = TASK, *, ek: tuple[str, ...] = (), **env: str
) -> tuple[dict[str, object], Path]:
    done = _harbor(tmp_path, agent, task, ek=ek, **env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (trial,) = [p for p in (tmp_path / "jobs").glob("*/*") if p.is_dir()]
    return json.loads((trial / "result.json").read_text()), trial


def _harbor(
    tmp_path: Path, agent: str, task: Path, *, ek: tuple[str, ...], **env: str
) -> subprocess.CompletedProcess[str]:
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
    return subprocess.run(
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
            *(arg for kv in ek for arg in ("--ek", kv)),
        ],
        env=environ,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


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


def test_with_a_daemon_the_trial_is_its_run_and_its_record_the_daemons(tmp_path: Path) -> None:
    from stockade.daemon import _paths
    from stockade.daemon._client import Client
    from stockade.daemon._server import DaemonThread

    state = tmp_path / "state"
    dt = DaemonThread(state=str(state), socket_path=_paths.socket_path(state=str(state)))
    dt.start()
    try:
        result, trial = _harbor_run(tmp_path, "oracle")
        assert _reward(result) == 1.0
        report = json.loads((trial / "stockade" / "containment.json").read_text())
        assert report["record"]["via"] == "daemon"
        with Client(dt.socket_path, timeout=60) as client:
            (run,) = [r for r in client.call("run.list", all=True)["runs"] if r["id"] == report["run"]]
            page = client.call("events.export", run=report["run"], format="jsonl")
        assert run["name"] == "harbor/hello-stockade" and run["state"] != "running"
        stored = [json.loads(line)["event"] for line in page["data"].splitlines()]
        # The agent's phase and the verifier's, each a session of the trial's run.
        assert [e["kind"] for e in stored].count("session.open") == 2
        lines = (trial / "stockade" / "events.jsonl").read_text().splitlines()
        bundled = [json.loads(line) for line in lines]
        assert [e for e in bundled if not e["kind"].startswith("harness.")] == stored
    finally:
        dt.stop()


def test_a_package_the_agent_installs_into_the_image_reaches_the_verifier(tmp_path: Path) -> None:
    import shutil

    from tests.harness._image import store_image

    task = tmp_path / "upper-task"
    shutil.copytree(TASK, task)
    solve = task / "solution" / "solve.sh"
    # As a package would: a file of the image's /usr, outside every handed-over directory.
    solve.write_text(solve.read_text() + "mkdir -p /usr/local/share\necho installed > /usr/local/share/pkg\n")
    test = task / "tests" / "test.sh"
    test.write_text(
        test.read_text().replace(
            "mkdir -p /logs/verifier",
            '[ "$(cat /usr/local/share/pkg 2>/dev/null)" = installed ] || ok=0\nmkdir -p /logs/verifier',
        )
    )
    store_image(tmp_path / "state", tag="upper-task")
    result, trial = _harbor_run(tmp_path, "oracle", task=task)
    assert _reward(result) == 1.0
    assert not (trial / "stockade" / "upper").exists()  # gone with the trial


def test_public_network_is_the_policys_allow_list_or_refused(tmp_path: Path) -> None:
    import shutil

    task = tmp_path / "public-task"
    shutil.copytree(TASK, task)
    toml = (task / "task.toml").read_text()
    (task / "task.toml").write_text(toml.replace('network_mode = "no-network"', 'network_mode = "public"'))
    refused = tmp_path / "refused"
    refused.mkdir()
    done = _harbor(refused, "oracle", task, ek=())
    assert done.returncode != 0 and "network_mode 'public'" in " ".join((done.stdout + done.stderr).split())
    assert not list((refused / "jobs").glob("*/*/stockade"))  # refused before any cell
    policy = tmp_path / "allow.yaml"
    policy.write_text("name: public\nnetwork:\n  allow: [pypi.org]\n")
    result, trial = _harbor_run(tmp_path, "oracle", task=task, ek=(f"policy={policy}",))
    assert _reward(result) == 1.0
    bundled = [json.loads(line) for line in (trial / "stockade" / "events.jsonl").read_text().splitlines()]
    (said,) = [e for e in bundled if e["kind"] == "harness.trial.network"]
    assert said["detail"]["mode"] == "public" and said["detail"]["allowed_hosts"] == ["pypi.org"]
