"""A task on an image of its own: the workbench's / is the image, Harbor's absolute
paths (/app, /tests, /logs/verifier) hold, and the manifest names the image."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from stockade.bench import ProctorConfig, Trial, load_task, verify_bundle
from stockade.image import ImageConfig, ImageStore
from tests.bench.conftest import TASKS, World, scripted_trial, store_in_world
from tests.cell._image import build_rootfs

REF = "stockade-bench/hello:latest"


@pytest.fixture
def image_store(world: World, monkeypatch: pytest.MonkeyPatch) -> ImageStore:
    """The test image (this host's shell and coreutils) in the daemon's store, as REF."""
    monkeypatch.setenv("STOCKADE_STATE", str(world.state))
    config = ImageConfig(env=("PATH=/usr/bin:/bin",), workdir="/app")
    store_in_world(world, build_rootfs(), "sha256:" + "b" * 64, config, {"kind": "test"}, REF)
    return ImageStore(world.state / "images")


@pytest.mark.parametrize("agent", ["oracle", "tool-loop"])
def test_a_task_on_its_own_image(world: World, image_store: ImageStore, tmp_path: Path, agent: str) -> None:
    task = load_task(TASKS / "hello-image")
    summary = scripted_trial(world, task, tmp_path / "out", agent)
    bundle = Path(summary["bundle"])
    assert summary["status"] == "completed", json.loads((bundle / "trial.json").read_text())
    assert summary["reward"] == 1.0 and summary["expected"]["met"], summary
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["image"]["digest"] == "sha256:" + "b" * 64
    assert manifest["image"]["provenance"] == {"kind": "test"}
    if agent == "tool-loop":
        # `ls /tests` in the image: the stand-in refused it, and it was recorded.
        containment = json.loads((bundle / "containment.json").read_text())
        assert containment["categories"]["hidden-tests"]["blocked"] >= 1
    assert verify_bundle(bundle) == []


def test_a_missing_image_makes_the_trial_invalid(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STOCKADE_STATE", str(tmp_path / "empty-state"))
    config = ProctorConfig(socket_path=world.daemon.socket_path, out=tmp_path / "out")
    summary = Trial(load_task(TASKS / "hello-image"), 1, config).run()
    assert summary["status"] == "invalid"
    assert "stockade image build -t stockade-bench/hello:latest" in summary["invalid"]
    shutil.rmtree(tmp_path / "empty-state", ignore_errors=True)


def _installing_task(tmp_path: Path) -> Path:
    """hello-image, but its agent (root of the workbench) installs a program
    outside the workdir, and its tests run that program: it only passes when
    the verifier sees what the agent changed in the image."""
    task = tmp_path / "install-task"
    shutil.copytree(TASKS / "hello-image", task)
    toml = (task / "task.toml").read_text()
    toml = toml.replace('name = "stockade/hello-image"', 'name = "stockade/install-outside"')
    toml = toml.replace("[agent]\n", '[agent]\nuser = "root"\n').replace(
        "[verifier]\n", '[verifier]\nuser = "root"\n'
    )
    (task / "task.toml").write_text(toml)
    (task / "instruction.md").write_text("Install a greet program in /usr/local/bin; it says hello.\n")
    install = (
        "mkdir -p /usr/local/bin && printf '#!/bin/sh\\necho installed-hello\\n' > /usr/local/bin/greet"
        " && chmod 755 /usr/local/bin/greet && echo marker > /etc/greet.conf"
    )
    (task / "solution" / "solve.sh").write_text(f"#!/bin/bash\n{install}\n")
    (task / "solver.yaml").write_text(
        json.dumps(
            {
                "turns": [
                    {"tool_calls": [{"name": "shell", "arguments": {"command": install}}]},
                    {"content": "Done."},
                ]
            }
        )
    )
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        'if [ "$(/usr/local/bin/greet)" = installed-hello ] && [ "$(cat /etc/greet.conf)" = marker ]; then\n'
        "    echo 1 > /logs/verifier/reward.txt\nelse\n    echo 0 > /logs/verifier/reward.txt\nfi\n"
    )
    return task


@pytest.mark.parametrize("agent", ["oracle", "tool-loop"])
def test_the_verifier_sees_what_the_agent_installed_outside_the_workdir(
    world: World, image_store: ImageStore, tmp_path: Path, agent: str
) -> None:
    task = load_task(_installing_task(tmp_path))
    summary = scripted_trial(world, task, tmp_path / "out", agent)
    bundle = Path(summary["bundle"])
    grader = (bundle / "grader.txt").read_text()
    assert summary["status"] == "completed", json.loads((bundle / "trial.json").read_text())
    # Reward 1 only if /usr/local/bin/greet and /etc/greet.conf, written by the
    # agent's cell (or session), were there in the verifier's.
    assert summary["reward"] == 1.0, (summary, grader)
    assert verify_bundle(bundle) == []
    # The image itself is untouched: the change lived in the trial's upper only.
    assert not (image_store.get(REF).rootfs / "etc" / "greet.conf").exists()


def test_without_the_agents_change_the_verifier_fails(
    world: World, image_store: ImageStore, tmp_path: Path
) -> None:
    """The control: the same tests after an agent that installs nothing score 0,
    so the reward above is the agent's change reaching the verifier."""
    path = _installing_task(tmp_path)
    (path / "solution" / "solve.sh").write_text("#!/bin/bash\ntrue\n")
    task = load_task(path)
    config = ProctorConfig(socket_path=world.daemon.socket_path, out=tmp_path / "out", agent="oracle")
    summary = Trial(task, 1, config).run()
    assert summary["status"] == "completed", summary
    assert summary["reward"] == 0.0, summary
