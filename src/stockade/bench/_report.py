"""``stockade bench report``: a campaign's results as a terminal table, or one HTML page.

The page is self-contained: its plots are inline SVG drawn here, its style is
inline, and it loads nothing from anywhere (no script, font or image from a
third party), so opening it makes no request.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from stockade.bench._campaign import RESULTS, per_task
from stockade.bench._score import TrialScore, summarize
from stockade.bench._task import CATEGORIES


def load_results(path: str | Path) -> dict[str, Any]:
    """A campaign's results: its ``results.json``, else rebuilt from the bundles' ``score.json``.

    Raises:
        FileNotFoundError: ``path`` holds neither.
    """
    root = Path(path)
    if (root / RESULTS).is_file():
        loaded: dict[str, Any] = json.loads((root / RESULTS).read_text(encoding="utf-8"))
        for trial in loaded.get("trials", []):
            # results.json names each bundle where it was made; a campaign copied
            # or moved since holds it beside results.json, under the same name.
            bundle = trial.get("bundle")
            if isinstance(bundle, str) and not Path(bundle).is_dir() and (root / Path(bundle).name).is_dir():
                trial["bundle"] = str(root / Path(bundle).name)
        return loaded
    trials = []
    for score in sorted(root.glob("*/score.json")):
        trial = json.loads(score.read_text(encoding="utf-8"))
        trial["bundle"] = str(score.parent)
        containment = score.parent / "containment.json"
        if containment.is_file():
            trial["containment"] = json.loads(containment.read_text(encoding="utf-8"))
        trials.append(trial)
    if not trials:
        raise FileNotFoundError(f"{root} holds no {RESULTS} and no bundle (*/score.json)")
    return {
        "trials": trials,
        "summary": summarize([TrialScore.from_dict(t) for t in trials]),
        "per_task": per_task(trials),
    }


def _categories(results: Mapping[str, Any]) -> dict[str, int]:
    """Refused reaches by category over the campaign (from each bundle's containment.json)."""
    counts = dict.fromkeys(CATEGORIES, 0)
    for trial in results.get("trials", []):
        containment = trial.get("containment")
        if containment is None and trial.get("bundle"):
            path = Path(trial["bundle"]) / "containment.json"
            if path.is_file():
                containment = json.loads(path.read_text(encoding="utf-8"))
        for name, seen in ((containment or {}).get("categories") or {}).items():
            if name in counts:
                counts[name] += int(seen.get("blocked", 0))
    return counts


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def table(results: Mapping[str, Any]) -> Table:
    """The per-trial table, with the campaign's line last."""
    t = Table(title="stockade bench", show_lines=False)
    for column in ("task", "try", "status", "reward", "outcome", "reaches", "blocked", "grade", "expected"):
        t.add_column(column, justify="right" if column in ("try", "reward", "reaches", "blocked") else "left")
    for trial in results.get("trials", []):
        expected = trial.get("expected") or {}
        t.add_row(
            str(trial.get("task", "?")),
            _fmt(trial.get("attempt")),
            _fmt(trial.get("status")),
            _fmt(trial.get("reward")),
            _fmt(trial.get("outcome")),
            _fmt(trial.get("attempted")),
            _fmt(trial.get("blocked")),
            _fmt(trial.get("grade")),
            "yes" if expected.get("met") else ("; ".join(expected.get("problems", [])) or "no"),
        )
    return t


def per_task_table(results: Mapping[str, Any]) -> Table:
    """One line per task: its trials, pass rate, mean reward, pass@k, reaches and grade."""
    t = Table(title="by task", show_lines=False)
    for column in ("task", "trials", "valid", "pass rate", "mean reward", "pass@k", "reaches", "grade"):
        t.add_column(column, justify="left" if column in ("task", "pass@k") else "right")
    for name, s in (results.get("per_task") or {}).items():
        pass_at = ", ".join(f"@{k} {_fmt(v)}" for k, v in (s.get("pass_at_k") or {}).items())
        t.add_row(
            name,
            _fmt(s.get("trials")),
            _fmt(s.get("valid")),
            _fmt(s.get("pass_rate")),
            _fmt(s.get("mean_reward")),
            pass_at or "-",
            _fmt((s.get("escalations") or {}).get("attempted")),
            _fmt(s.get("containment_grade")),
        )
    return t


def summary_lines(results: Mapping[str, Any]) -> list[str]:
    s = results.get("summary") or {}
    refused = ", ".join(f"{name} {n}" for name, n in _categories(results).items() if n)
    pass_at = ", ".join(f"pass@{k} {_fmt(v)}" for k, v in (s.get("pass_at_k") or {}).items())
    return [
        f"trials {s.get('trials', 0)}: {s.get('valid', 0)} valid, {s.get('invalid', 0)} invalid, "
        f"{s.get('crashed', 0)} crashed, {s.get('halted', 0)} halted",
        f"capability: pass rate {_fmt(s.get('pass_rate'))}, mean reward {_fmt(s.get('mean_reward'))}"
        + (f", {pass_at}" if pass_at else "")
        + " (valid trials only)",
        f"containment grade {s.get('containment_grade', '-')} "
        f"({(s.get('escalations') or {}).get('blocked', 0)} of "
        f"{(s.get('escalations') or {}).get('attempted', 0)} reaches blocked); "
        f"escalation score {s.get('escalation_score', 0)} (reaches the agents made)",
        f"refused reaches by category: {refused or 'none'}",
    ]


def _bars(
    title: str, items: Sequence[tuple[str, float]], *, maximum: float | None = None, counts: bool = False
) -> str:
    """A horizontal bar chart as inline SVG (``counts``: the values are whole numbers)."""
    width, bar, gap, label = 640, 18, 6, 180
    top = max([v for _, v in items] + [maximum or 0.0, 1e-9])
    height = 30 + len(items) * (bar + gap)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'aria-label="{html.escape(title)}">',
        f'<text x="0" y="16" font-size="14" font-weight="bold">{html.escape(title)}</text>',
    ]
    for i, (name, value) in enumerate(items):
        y = 28 + i * (bar + gap)
        w = (width - label - 60) * (value / top)
        parts.append(f'<text x="0" y="{y + 13}" font-size="12">{html.escape(name)}</text>')
        parts.append(f'<rect x="{label}" y="{y}" width="{w:.1f}" height="{bar}" fill="#4a7bb7"/>')
        shown = _fmt(int(value) if counts else value)
        parts.append(f'<text x="{label + w + 4:.1f}" y="{y + 13}" font-size="12">{shown}</text>')
    parts.append("</svg>")
    return "".join(parts)


def render_html(results: Mapping[str, Any]) -> str:
    """The whole report as one HTML page that requests nothing."""
    rewards = [
        (name, float(task.get("mean_reward") or 0.0))
        for name, task in (results.get("per_task") or {}).items()
    ]
    refusals = [(name, float(n)) for name, n in _categories(results).items()]
    rows = []
    for trial in results.get("trials", []):
        cells = [
            trial.get("task"),
            trial.get("attempt"),
            trial.get("status"),
            trial.get("reward"),
            trial.get("outcome"),
            trial.get("attempted"),
            trial.get("blocked"),
            trial.get("grade"),
            "yes" if (trial.get("expected") or {}).get("met") else "no",
        ]
        rows.append("<tr>" + "".join(f"<td>{html.escape(_fmt(c))}</td>" for c in cells) + "</tr>")
    head = "".join(
        f"<th>{h}</th>"
        for h in ("task", "try", "status", "reward", "outcome", "reaches", "blocked", "grade", "expected")
    )
    summary = "".join(f"<p>{html.escape(line)}</p>" for line in summary_lines(results))
    task_head = "".join(
        f"<th>{h}</th>" for h in ("task", "trials", "valid", "pass rate", "mean reward", "reaches", "grade")
    )
    task_rows = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(_fmt(c))}</td>"
            for c in (
                name,
                s.get("trials"),
                s.get("valid"),
                s.get("pass_rate"),
                s.get("mean_reward"),
                (s.get("escalations") or {}).get("attempted"),
                s.get("containment_grade"),
            )
        )
        + "</tr>"
        for name, s in (results.get("per_task") or {}).items()
    )
    return (
        "<!doctype html>\n<html><head><meta charset='utf-8'>"
        # No request may leave the page: nothing but inline content is allowed.
        "<meta http-equiv='Content-Security-Policy' "
        "content=\"default-src 'none'; style-src 'unsafe-inline'\">"
        "<title>stockade bench report</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 8px}</style></head><body>"
        "<h1>stockade bench report</h1>"
        f"{summary}"
        f"{_bars('mean reward by task', rewards, maximum=1.0)}"
        f"{_bars('refused reaches by category', refusals, counts=True)}"
        f"<h2>by task</h2><table><thead><tr>{task_head}</tr></thead><tbody>{task_rows}</tbody></table>"
        f"<h2>trials</h2><table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
        "</body></html>\n"
    )


__all__ = ["load_results", "per_task_table", "render_html", "summary_lines", "table"]
