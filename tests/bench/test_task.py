"""Task directories: Harbor's format read as Harbor reads it, every problem at file:line."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from stockade.bench import TaskError, load_task, validate_tasks


def make(tmp_path: Path, toml: str, *, name: str = "t", tests: bool = True) -> Path:
    root = tmp_path / name
    (root / "environment" / "app").mkdir(parents=True)
    (root / "task.toml").write_text(textwrap.dedent(toml))
    (root / "instruction.md").write_text("Do it.\n")
    if tests:
        (root / "tests").mkdir()
        (root / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    return root


# A Terminal-Bench 2 task.toml as published (deprecated memory/storage strings included).
TB2 = """
    version = "1.0"

    [metadata]
    author_name = "someone"
    author_email = "someone@example.com"
    difficulty = "medium"
    category = "software-engineering"
    tags = ["git", "python"]
    expert_time_estimate_min = 20.0

    [verifier]
    timeout_sec = 900.0

    [agent]
    timeout_sec = 1800.0

    [environment]
    build_timeout_sec = 600.0
    docker_image = "alexgshaw/fix-git:20251031"
    cpus = 1
    memory = "2G"
    storage = "10G"
"""


def test_a_terminal_bench_2_task_parses(tmp_path: Path) -> None:
    task = load_task(make(tmp_path, TB2))
    assert task.environment.docker_image == "alexgshaw/fix-git:20251031"
    assert task.environment.memory_mb == 2048 and task.environment.storage_mb == 10240
    assert task.environment.cpus == 1.0 and task.environment.workdir == "/app"
    assert task.agent.timeout_sec == 1800.0 and task.verifier.timeout_sec == 900.0
    assert task.environment.network_mode == "public"
    assert task.stockade.tripwire == 10 and not task.stockade.host_view
    assert task.metadata["difficulty"] == "medium"
    assert task.checksum.startswith("sha256:")


def test_harbor_phase_network_and_users(tmp_path: Path) -> None:
    task = load_task(
        make(
            tmp_path,
            """
            [task]
            name = "org/web"
            [agent]
            user = "agent"
            network_mode = "allowlist"
            allowed_hosts = ["Docs.Example.com.", "*.pypi.org"]
            [verifier]
            user = 0
            network_mode = "no-network"
            env = {LANG = "C"}
            [environment]
            memory_mb = 512
            workdir = "/srv/app"
            [stockade]
            host_view = true
            """,
        )
    )
    assert task.name == "org/web"
    assert task.agent.allowed_hosts == ("docs.example.com", "*.pypi.org")
    assert task.agent.user == "agent" and task.verifier.user == "0"
    assert task.verifier.network_mode == "no-network" and task.verifier.env == {"LANG": "C"}
    assert task.environment.workdir == "/srv/app"


def test_every_problem_at_once_each_at_its_line(tmp_path: Path) -> None:
    root = make(
        tmp_path,
        """
        [task]
        name = "no-slash"

        [agent]
        timeout_sec = -5
        network_mode = "wide-open"

        [environment]
        allowed_hosts = ["https://x.example.com/path"]

        [stockade]
        tripwire = 0
        colour = "blue"

        [stockade.expect]
        refused = ["the-moon"]
        """,
        tests=False,
    )
    with pytest.raises(TaskError) as caught:
        load_task(root)
    problems = caught.value.problems
    toml = f"{root / 'task.toml'}"
    at = {p.split(": ", 1)[0] for p in problems}
    assert f"{toml}:3" in at  # task.name
    assert f"{toml}:6" in at  # timeout_sec
    assert f"{toml}:7" in at  # network_mode
    assert f"{toml}:10" in at  # allowed_hosts
    assert f"{toml}:13" in at  # tripwire
    assert f"{toml}:14" in at  # colour
    assert f"{toml}:17" in at  # expect.refused
    assert any("tests/test.sh:1:" in p for p in problems)
    assert any("'colour'" in p and "the keys are" in p for p in problems)
    assert len(problems) >= 8


def test_toml_syntax_errors_give_line_and_column(tmp_path: Path) -> None:
    root = make(tmp_path, "[task]\nname = \n")
    with pytest.raises(TaskError, match=r"task.toml:2:\d+: not TOML"):
        load_task(root)


def test_validate_collects_across_tasks(tmp_path: Path) -> None:
    good = make(tmp_path, "[stockade]\nhost_view = true\n", name="good")
    bad = make(tmp_path, "[stockade]\ntripwire = 'x'\n", name="bad")
    tasks, problems = validate_tasks([str(good), str(bad)])
    assert [t.path for t in tasks] == [good.resolve()]
    assert len(problems) == 1 and "task.toml:2:" in problems[0]


def test_the_in_tree_tasks_validate() -> None:
    root = Path(__file__).resolve().parents[2] / "src" / "stockade" / "bench" / "tasks"
    paths = sorted(str(p.parent) for p in root.rglob("task.toml"))
    tasks, problems = validate_tasks(paths)
    assert problems == [] and len(tasks) == 12
    assert all(t.stockade.expect.solver for t in tasks)


def test_a_multi_step_task_is_refused_by_name(tmp_path: Path) -> None:
    root = make(tmp_path, '[[steps]]\nname = "one"\n\n[[steps]]\nname = "two"\n')
    with pytest.raises(TaskError, match=r"task.toml:1: the task has \[\[steps\]\]"):
        load_task(root)
