"""Proctored benchmark runs: Harbor / Terminal-Bench 2 tasks under full containment (docs/BENCH.md).

``load_task`` reads a task directory; ``Campaign`` runs trials of tasks with
an agent under the daemon, each leaving a bundle (score, containment report,
log, manifest) that ``verify_bundle`` re-checks; ``summarize`` gives the
campaign's scores.
"""

from stockade.bench._bundle import verify_bundle
from stockade.bench._containment import Containment, Reach, containment
from stockade.bench._proctor import AGENTS, ProctorConfig, Trial, read_reward
from stockade.bench._score import TrialScore, grade, pass_at_k, summarize
from stockade.bench._task import CATEGORIES, Task, TaskError, load_task, validate_tasks

__all__ = [
    "AGENTS",
    "CATEGORIES",
    "Containment",
    "ProctorConfig",
    "Reach",
    "Task",
    "TaskError",
    "Trial",
    "TrialScore",
    "containment",
    "grade",
    "load_task",
    "pass_at_k",
    "read_reward",
    "summarize",
    "validate_tasks",
    "verify_bundle",
]
