"""Many trials: a queue run with a given concurrency, resumable, and its ``results.json``.

Trials are (task, attempt) pairs, run ``concurrency`` at a time, each in its
own thread with its own daemon connection. ``resume`` skips a trial whose
bundle in the output directory is finished (``trial.json`` status completed,
halted or invalid, a manifest, and the same task checksum): a crashed or
cut-short trial is run again. ``results.json`` in the output directory holds
every trial's score and the campaign's summary (``_score.summarize``), and is
rewritten after each trial, so that a campaign cut short still says what it did.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from stockade import __version__
from stockade.bench._bundle import MANIFEST, write_json
from stockade.bench._proctor import FINISHED, ProctorConfig, Trial
from stockade.bench._score import TrialScore, summarize
from stockade.bench._task import Task

RESULTS = "results.json"


def finished_trials(out: Path) -> dict[tuple[str, int, str], dict[str, Any]]:
    """The finished trials of an output directory: (task, attempt, checksum) -> score.json + bundle."""
    done: dict[tuple[str, int, str], dict[str, Any]] = {}
    if not out.is_dir():
        return done
    for trial_file in sorted(out.glob("*/trial.json")):
        bundle = trial_file.parent
        try:
            trial = json.loads(trial_file.read_text(encoding="utf-8"))
            manifest = json.loads((bundle / MANIFEST).read_text(encoding="utf-8"))
            score = json.loads((bundle / "score.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if trial.get("status") not in FINISHED:
            continue
        key = (
            str(trial.get("task")),
            int(trial.get("attempt", 0)),
            str(manifest.get("task", {}).get("checksum")),
        )
        done[key] = {**score, "bundle": str(bundle), "resumed": True}
    return done


class Campaign:
    """The trials of each of ``tasks``, ``attempts`` times, under ``config``."""

    def __init__(
        self,
        tasks: Sequence[Task],
        config: ProctorConfig,
        *,
        attempts: int = 1,
        concurrency: int = 1,
        resume: bool = False,
        on_trial: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        if attempts < 1 or concurrency < 1:
            raise ValueError("attempts and concurrency are whole numbers of at least 1")
        self.tasks = list(tasks)
        self.config = config
        self.attempts = attempts
        self.concurrency = concurrency
        self.resume = resume
        self.on_trial = on_trial
        self.results: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def plan(self) -> tuple[list[tuple[Task, int]], list[dict[str, Any]]]:
        """(trials to run, finished trials skipped by ``resume``)."""
        done = finished_trials(self.config.out) if self.resume else {}
        todo, skipped = [], []
        for task in self.tasks:
            for attempt in range(1, self.attempts + 1):
                found = done.get((task.name, attempt, task.checksum))
                if found is not None:
                    skipped.append(found)
                else:
                    todo.append((task, attempt))
        return todo, skipped

    def run(self) -> dict[str, Any]:
        self.config.out.mkdir(parents=True, exist_ok=True)
        todo, skipped = self.plan()
        self.results = list(skipped)
        for found in skipped:
            if self.on_trial is not None:
                self.on_trial(found)
        with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="bench-trial") as pool:
            futures = [pool.submit(Trial(task, attempt, self.config).run) for task, attempt in todo]
            for future in as_completed(futures):
                summary = future.result()
                with self._lock:
                    self.results.append(summary)
                    self._write()
                if self.on_trial is not None:
                    self.on_trial(summary)
        return self._write()

    def _write(self) -> dict[str, Any]:
        trials = sorted(self.results, key=lambda r: (str(r.get("task")), int(r.get("attempt", 0))))
        results = {
            "stockade_version": __version__,
            "agent": self.config.agent,
            "model": self.config.model,
            "attempts": self.attempts,
            "concurrency": self.concurrency,
            "trials": trials,
            "summary": summarize([TrialScore.from_dict(t) for t in trials if "task" in t], k=self.attempts),
            "per_task": per_task(trials),
        }
        write_json(self.config.out / RESULTS, results)
        return results


def per_task(trials: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    names = sorted({str(t.get("task")) for t in trials if "task" in t})
    return {
        name: summarize([TrialScore.from_dict(t) for t in trials if t.get("task") == name])
        | {
            "expected_met": all(
                t.get("expected", {}).get("met", False) for t in trials if t.get("task") == name
            )
        }
        for name in names
    }


__all__ = ["RESULTS", "Campaign", "finished_trials", "per_task"]
