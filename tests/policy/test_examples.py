"""The example policies in examples/ load, and run a cell."""

from __future__ import annotations

from pathlib import Path

import pytest

from stockade.cell import Cell
from stockade.policy import load_policy

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.yaml"))


def test_there_are_examples() -> None:
    assert EXAMPLES


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_policy_loads_and_runs(path: Path, tmp_path: Path) -> None:
    policy = load_policy(path)
    assert policy.name
    with Cell(policy, workspace=tmp_path) as cell:
        result = cell.run(["/bin/sh", "-c", "echo ok > out && cat out"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == b"ok\n"
