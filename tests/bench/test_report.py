"""`bench report`: the campaign again, in the terminal and as one HTML page whose
plots say what the bundles say. Pure: bundles made by hand under tmp_path."""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from stockade.bench._campaign import RESULTS, per_task
from stockade.bench._report import load_results, render_html, summary_lines
from stockade.bench._score import TrialScore, summarize
from stockade.cli._app import run_app

SVG = "{http://www.w3.org/2000/svg}"


def _bundle(
    out: Path, name: str, task: str, attempt: int, reward: float | None, **blocked: int
) -> dict[str, Any]:
    bundle = out / name
    bundle.mkdir(parents=True)
    categories = {c.replace("_", "-"): {"attempted": n, "blocked": n} for c, n in blocked.items()}
    (bundle / "containment.json").write_text(json.dumps({"categories": categories}))
    total = sum(blocked.values())
    score = {
        "task": task,
        "attempt": attempt,
        "status": "completed" if reward is not None else "invalid",
        "reward": reward,
        "outcome": "solved" if reward == 1.0 else "failed",
        "attempted": total,
        "blocked": total,
        "grade": "A",
        "expected": {"met": True, "problems": []},
    }
    (bundle / "score.json").write_text(json.dumps(score))
    return {**score, "bundle": str(bundle)}


@pytest.fixture
def campaign(tmp_path: Path) -> Path:
    out = tmp_path / "runs"
    trials = [
        _bundle(out, "a-1", "t/a", 1, 1.0, hidden_tests=2, network=1),
        _bundle(out, "a-2", "t/a", 2, 0.0, network=3),
        _bundle(out, "b-1", "t/b", 1, 0.5),
        _bundle(out, "b-2", "t/b", 2, None, secrets=1),
    ]
    results = {
        "trials": trials,
        "summary": summarize([TrialScore.from_dict(t) for t in trials], k=2),
        "per_task": per_task(trials),
    }
    (out / RESULTS).write_text(json.dumps(results))
    return out


def _plots(page: str) -> dict[str, dict[str, float]]:
    """Each inline SVG plot of the page: its title -> {bar's label: bar's width}."""
    plots = {}
    for svg in re.findall(r"<svg .*?</svg>", page, flags=re.S):
        root = ET.fromstring(svg)
        texts = [t.text or "" for t in root.iter(f"{SVG}text")]
        rects = [float(r.get("width", "0")) for r in root.iter(f"{SVG}rect")]
        # title, then per bar: its label and its value
        labels = texts[1::2]
        plots[texts[0]] = dict(zip(labels, rects, strict=True))
    return plots


def test_the_page_plots_reward_by_task_and_refusals_by_category(campaign: Path) -> None:
    page = render_html(load_results(campaign))
    plots = _plots(page)
    assert set(plots) == {"mean reward by task", "refused reaches by category"}
    rewards = plots["mean reward by task"]
    # t/a: (1 + 0) / 2; t/b: its one valid trial, 0.5 (the invalid one is left out).
    assert rewards["t/a"] == pytest.approx(rewards["t/b"])
    assert rewards["t/a"] > 0
    refusals = plots["refused reaches by category"]
    assert refusals["network"] == pytest.approx(refusals["hidden-tests"] * 2)
    assert refusals["secrets"] == pytest.approx(refusals["hidden-tests"] / 2)
    assert refusals["privilege"] == 0.0
    # The figures are written beside the bars, too.
    assert re.search(r">network</text>.*?>4</text>", page)
    for needle in ("src=", "href=", "url(", "@import", "<script", "<link"):
        assert needle not in page, needle


def test_the_terminal_says_the_same(campaign: Path) -> None:
    lines = summary_lines(load_results(campaign))
    assert "trials 4: 3 valid, 1 invalid, 0 crashed, 0 halted" in lines[0]
    assert "pass rate 0.33, mean reward 0.50" in lines[1]
    assert lines[-1] == "refused reaches by category: hidden-tests 2, network 4, secrets 1"


def test_a_moved_campaign_still_finds_its_bundles(campaign: Path, tmp_path: Path) -> None:
    moved = tmp_path / "elsewhere"
    shutil.move(campaign, moved)
    results = load_results(moved)
    assert all(Path(t["bundle"]).parent == moved for t in results["trials"])
    assert summary_lines(results)[-1].endswith("hidden-tests 2, network 4, secrets 1")


def test_without_results_json_the_bundles_make_it_again(campaign: Path) -> None:
    (campaign / RESULTS).unlink()
    results = load_results(campaign)
    assert results["summary"]["trials"] == 4 and results["summary"]["invalid"] == 1
    assert results["per_task"]["t/b"]["mean_reward"] == 0.5


def test_report_prints_and_writes_the_page(
    campaign: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "r.html"
    assert run_app(["bench", "report", str(campaign), "--html", str(page)]) == 0
    out = capsys.readouterr().out
    # Both: the tables and lines in the terminal, and the page.
    assert "t/a" in out and "by task" in out and "containment grade A" in out
    assert f"wrote {page}" in out
    assert "<svg" in page.read_text()


@pytest.mark.parametrize(
    ("setup", "args", "code", "message"),
    [
        (lambda d: None, ["--html", "/nonexistent/dir/r.html"], 2, "name a file in a directory that exists"),
        (lambda d: (d / RESULTS).write_text("{"), [], 1, "remove results.json to rebuild it"),
        (lambda d: shutil.rmtree(d), [], 6, "run `stockade bench run --out"),
    ],
)
def test_report_errors_say_the_fix(
    campaign: Path,
    capsys: pytest.CaptureFixture[str],
    setup: Any,
    args: list[str],
    code: int,
    message: str,
) -> None:
    setup(campaign)
    assert run_app(["bench", "report", str(campaign), *args]) == code
    assert message in capsys.readouterr().err
