"""The ``exec`` intent's ``session`` argument: the run's own workbench session."""

from __future__ import annotations

from pathlib import Path

import pytest

from stockade.broker._intents import IntentExecutor, refusal
from stockade.cell import SessionResult
from stockade.cell._cell import CellResult
from stockade.errors import CellError, IntentError
from stockade.policy import Policy, default_policy

SESSION = "s-0123456789ab"


def _never(argv: list[str], policy: Policy) -> CellResult:
    raise AssertionError("an exec naming a session must not start a fresh cell")


def _executor(tmp_path: Path, session_exec: object = None) -> IntentExecutor:
    return IntentExecutor(
        default_policy("t"),
        workspace=str(tmp_path),
        run_workbench=_never,
        session_exec=session_exec,  # type: ignore[arg-type]
    )


def test_an_exec_naming_the_runs_session_runs_there(tmp_path: Path) -> None:
    seen: list[tuple[object, ...]] = []

    def run(session: str, argv: list[str], timeout: float, cwd: str | None, output: int) -> SessionResult:
        seen.append((session, argv, timeout, cwd, output))
        return SessionResult(returncode=3, stdout=b"out", stderr=b"", call=f"{session}.1", duration=0.01)

    value = _executor(tmp_path, run).execute(
        "exec", {"argv": ["make"], "session": SESSION, "cwd": "/app", "timeout": 5}
    )
    assert seen and seen[0][:4] == (SESSION, ["make"], 5.0, "/app")
    assert isinstance(seen[0][4], int) and seen[0][4] > 0
    assert value["exit_code"] == 3 and value["session"] == SESSION and value["call"] == f"{SESSION}.1"
    assert value["stdout"] == {"content": "out", "encoding": "utf-8"}
    assert refusal(value) is None


def test_a_session_that_is_not_the_runs_is_refused(tmp_path: Path) -> None:
    value = _executor(tmp_path, lambda *a: None).execute("exec", {"argv": ["ls"], "session": SESSION})
    why = refusal(value)
    assert why is not None and SESSION in why and "not an open session of this run" in why


def test_without_sessions_and_when_the_session_fails(tmp_path: Path) -> None:
    value = _executor(tmp_path).execute("exec", {"argv": ["ls"], "session": SESSION})
    assert value["error"]["code"] == "unavailable"  # type: ignore[index]

    def broken(*a: object) -> SessionResult:
        raise CellError("its cell has ended")

    failed = _executor(tmp_path, broken).execute("exec", {"argv": ["ls"], "session": SESSION})
    assert failed["error"]["code"] == "failed" and "ended" in failed["error"]["message"]  # type: ignore[index]


@pytest.mark.parametrize("bad", ["", "s-XYZ", "r-0123456789ab", "s-0123456789ab\n", 7])
def test_a_malformed_session_is_an_intent_error(tmp_path: Path, bad: object) -> None:
    with pytest.raises(IntentError, match="session"):
        _executor(tmp_path, lambda *a: None).execute("exec", {"argv": ["ls"], "session": bad})
