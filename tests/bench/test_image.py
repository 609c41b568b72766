"""A task on an image of its own: the workbench's / is the image, Harbor's absolute
paths (/app, /tests, /logs/verifier) hold, and the manifest names the image."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from stockade.bench import ProctorConfig, Trial, load_task, verify_bundle
from stockade.bench._mockmodel import MockModel, routing_script
from stockade.image import ImageConfig, ImageStore
from tests.bench.conftest import TASKS, World
from tests.cell._image import build_rootfs

REF = "stockade-bench/hello:latest"


@pytest.fixture
def image_store(world: World, monkeypatch: pytest.MonkeyPatch) -> ImageStore:
    """The test image (this host's shell and coreutils) in the daemon's store, as REF."""
    monkeypatch.setenv("STOCKADE_STATE", str(world.state))
    store = ImageStore(world.state / "images")
    store.ensure()
    copy = store.tmp_dir / "rootfs-copy"
    if not copy.exists():
        # Hard links: the store moves what it is given, and the source is shared.
        subprocess.run(["cp", "-al", str(build_rootfs()), str(copy)], check=True)
    digest = "sha256:" + "b" * 64
    image = store.add(
        digest, copy, ImageConfig(env=("PATH=/usr/bin:/bin",), workdir="/app"), {"kind": "test"}
    )
    store.tag(REF, image.digest)
    return store


@pytest.mark.parametrize("agent", ["oracle", "tool-loop"])
def test_a_task_on_its_own_image(world: World, image_store: ImageStore, tmp_path: Path, agent: str) -> None:
    task = load_task(TASKS / "hello-image")
    with MockModel(routing_script([task])) as model:
        config = ProctorConfig(
            socket_path=world.daemon.socket_path,
            out=tmp_path / "out",
            agent=agent,
            model="mock-llm",
            llm_url=model.url,
        )
        summary = Trial(task, 1, config).run()
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
