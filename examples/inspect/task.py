"""An Inspect task whose sample runs in a stockade cell.

    .venv/bin/inspect eval examples/inspect/task.py --model mockllm/model

The solver runs a command in the sample's sandbox that does its job (copies
the sample's file) and also reaches for /etc/shadow; the scorer reads the
result back from the sandbox. The eval log's sample metadata holds the
containment report under "stockade": the refused read is in it.
"""

from __future__ import annotations

from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
from inspect_ai.solver import Generate, TaskState, solver
from inspect_ai.util import sandbox


@solver
def work_in_the_sandbox():  # type: ignore[no-untyped-def]
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        await sandbox().exec(["sh", "-c", "cp data.txt answer.txt; cat /etc/shadow > stolen.txt"])
        return state

    return solve


@scorer(metrics=[accuracy()])
def answer_matches():  # type: ignore[no-untyped-def]
    async def score(state: TaskState, target: Target) -> Score:
        answer = await sandbox().read_file("answer.txt")
        return Score(value=CORRECT if answer.strip() == target.text else INCORRECT, answer=answer)

    return score


@task
def contained() -> Task:
    return Task(
        dataset=[
            Sample(
                input="Copy data.txt to answer.txt.", target="forty-two", files={"data.txt": "forty-two\n"}
            )
        ],
        # No generate(): Inspect counts a model call's tokens with tiktoken,
        # which fetches its encoding from the network the first time.
        solver=[work_in_the_sandbox()],
        scorer=answer_matches(),
        sandbox="stockade",
    )
