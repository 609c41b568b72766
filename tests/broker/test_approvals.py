"""Approvals: the state machine (clock injected, no sleeps), and waiting on it."""

from __future__ import annotations

import json
import threading

import pytest

from stockade.broker import _approvals
from stockade.broker._approvals import Approval, ApprovalError, Approvals


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def approvals(**kwargs: object) -> tuple[Approvals, Clock]:
    clock = Clock()
    return Approvals(clock=clock, **kwargs), clock  # type: ignore[arg-type]


def test_ask_opens_a_pending_approval_with_an_id_and_deadline() -> None:
    box, _clock = approvals()
    approval = box.ask("r-1", "exec", {"argv": ["make"]}, timeout=30)
    assert approval.id.startswith("a-") and len(approval.id) == 14
    assert (approval.state, approval.verdict, approval.by) == ("pending", "ask", "")
    assert (approval.asked_at, approval.deadline) == (1000.0, 1030.0)
    assert box.pending() == [approval] and box.get(approval.id) == approval
    other = box.ask("r-1", "exec", {"argv": ["make"]}, timeout=30)
    assert other.id != approval.id


def test_approve_then_a_second_decision_is_a_conflict() -> None:
    box, clock = approvals()
    approval = box.ask("r-1", "fs.write", {"path": "/out/x"}, timeout=30)
    clock.now += 5
    decided = box.decide(approval.id, "approve", by="alice", reason="looks fine")
    assert (decided.state, decided.verdict, decided.by, decided.reason) == (
        "approved",
        "allow",
        "alice",
        "looks fine",
    )
    assert decided.decided_at == 1005.0
    with pytest.raises(ApprovalError) as info:
        box.decide(approval.id, "deny", by="bob")
    assert info.value.code == "conflict" and "already approved by alice" in str(info.value)
    assert box.get(approval.id) == decided  # the second decision changed nothing
    assert box.pending() == []


def test_deny() -> None:
    box, _clock = approvals()
    approval = box.ask("r-1", "exec", {}, timeout=30)
    decided = box.decide(approval.id, "deny", by="alice")
    assert (decided.state, decided.verdict) == ("denied", "deny")


def test_an_unknown_id_is_not_found() -> None:
    box, _clock = approvals()
    with pytest.raises(ApprovalError) as info:
        box.decide("a-000000000000", "approve", by="alice")
    assert info.value.code == "not_found" and info.value.exit_code == 6
    with pytest.raises(ApprovalError):
        box.wait("a-000000000000", 0)


def test_a_bad_decision_is_refused() -> None:
    box, _clock = approvals()
    approval = box.ask("r-1", "exec", {}, timeout=30)
    with pytest.raises(ValueError, match="approve"):
        box.decide(approval.id, "yes", by="alice")  # type: ignore[arg-type]
    assert box.get(approval.id) == approval


def test_expire_denies_what_is_past_its_deadline_only() -> None:
    box, _clock = approvals()
    short = box.ask("r-1", "exec", {}, timeout=10)
    long = box.ask("r-1", "exec", {}, timeout=100)
    assert box.expire(1009.9) == []
    expired = box.expire(1010.0)
    assert [a.id for a in expired] == [short.id]
    assert (expired[0].state, expired[0].by, expired[0].reason) == (
        "denied",
        "timeout",
        "no answer within 10 s",
    )
    assert box.expire(1010.0) == []  # once
    assert [a.id for a in box.pending()] == [long.id]
    with pytest.raises(ApprovalError) as info:
        box.decide(short.id, "approve", by="alice")
    assert info.value.code == "conflict"


def test_deciding_after_the_deadline_is_a_conflict_even_before_expire_ran() -> None:
    box, clock = approvals()
    approval = box.ask("r-1", "exec", {}, timeout=10)
    clock.now += 10
    assert box.pending() == []  # past its deadline: not shown as open
    with pytest.raises(ApprovalError) as info:
        box.decide(approval.id, "approve", by="alice")
    assert info.value.code == "conflict" and "timeout" in str(info.value)
    closed = box.get(approval.id)
    assert closed is not None and (closed.state, closed.by) == ("denied", "timeout")


def test_unattended_asks_come_back_denied() -> None:
    box, _clock = approvals(unattended=True)
    approval = box.ask("r-1", "exec", {"argv": ["rm"]}, timeout=30)
    assert (approval.state, approval.verdict, approval.by) == ("denied", "deny", "unattended")
    assert box.pending() == []
    with pytest.raises(ApprovalError):
        box.decide(approval.id, "approve", by="alice")
    # per call, either way
    assert box.ask("r-1", "exec", {}, timeout=30, unattended=False).state == "pending"
    attended, _ = approvals()
    assert attended.ask("r-2", "exec", {}, timeout=30, unattended=True).state == "denied"


def test_wait_returns_when_another_thread_decides() -> None:
    box, _clock = approvals()
    approval = box.ask("r-1", "exec", {}, timeout=300)
    results: list[Approval] = []
    waiting = threading.Thread(target=lambda: results.append(box.wait(approval.id, timeout=60)))
    waiting.start()
    box.decide(approval.id, "approve", by="alice")
    waiting.join(timeout=60)
    assert not waiting.is_alive()
    assert results[0].state == "approved"


def test_wait_with_no_time_left_only_looks() -> None:
    box, _clock = approvals()
    approval = box.ask("r-1", "exec", {}, timeout=300)
    assert box.wait(approval.id, timeout=0) == approval


def test_wait_expires_an_approval_past_its_deadline() -> None:
    box, clock = approvals()
    approval = box.ask("r-1", "exec", {}, timeout=10)
    clock.now += 11
    closed = box.wait(approval.id, timeout=60)
    assert (closed.state, closed.by) == ("denied", "timeout")


def test_approvals_keep_args_redacted() -> None:
    box, _clock = approvals()
    approval = box.ask(
        "r-1", "fs.write", {"path": "/x", "token": "s3cret", "nested": {"Api-Key": "k"}}, timeout=5
    )
    assert approval.args["token"] == "[redacted]"
    assert approval.args["nested"] == {"Api-Key": "[redacted]"}
    assert "s3cret" not in json.dumps(approval.to_dict())


def test_to_dict_is_json() -> None:
    box, _clock = approvals()
    approval = box.decide(
        box.ask("r-1", "exec", {"argv": ["ls"]}, timeout=5).id, "deny", by="alice", reason="no"
    )
    data = json.loads(json.dumps(approval.to_dict()))
    assert data["decision"] == "deny" and data["state"] == "denied" and data["args"] == {"argv": ["ls"]}


def test_a_flood_of_asks_is_denied_past_the_pending_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_approvals, "MAX_PENDING", 3)
    box, _clock = approvals()
    opened = [box.ask("r-1", "exec", {}, timeout=5) for _ in range(3)]
    refused = box.ask("r-1", "exec", {}, timeout=5)
    assert all(a.state == "pending" for a in opened)
    assert (refused.state, refused.by) == ("denied", "limit")
    box.decide(opened[0].id, "deny", by="alice")
    assert box.ask("r-1", "exec", {}, timeout=5).state == "pending"  # room again


def test_closed_approvals_are_forgotten_oldest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_approvals, "MAX_KEPT", 5)
    monkeypatch.setattr(_approvals, "MAX_PENDING", 2)
    box, _clock = approvals(unattended=True)
    ids = [box.ask("r-1", "exec", {}, timeout=5).id for _ in range(20)]
    kept = [i for i in ids if box.get(i) is not None]
    assert len(kept) <= 5 + 2 and kept == ids[-len(kept) :]


def test_drop_run_denies_that_runs_pending_approvals() -> None:
    box, _clock = approvals()
    mine = box.ask("r-1", "exec", {}, timeout=5)
    theirs = box.ask("r-2", "exec", {}, timeout=5)
    dropped = box.drop_run("r-1")
    assert [a.id for a in dropped] == [mine.id] and dropped[0].by == "run ended"
    assert [a.id for a in box.pending()] == [theirs.id]
    assert box.pending(run="r-1") == []


@pytest.mark.parametrize("timeout", [0, -5, float("nan"), float("inf"), True])
def test_a_bad_timeout_is_refused(timeout: float) -> None:
    box, _clock = approvals()
    with pytest.raises(ValueError, match="timeout"):
        box.ask("r-1", "exec", {}, timeout=timeout)
    assert box.pending() == []


LONG = "x" * (_approvals.ARGS_PREVIEW + 1)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        pytest.param(
            {"argv": ["sh", "-c", "echo hi" + " " * _approvals.ARGS_PREVIEW + "; rm -rf ~"]},
            "characters",
            id="padded-string",
        ),
        pytest.param({"items": list(range(1001))}, "1001 items", id="long-list"),
        pytest.param({"env": {f"K{i}": "v" for i in range(1001)}}, "1001 keys", id="wide-object"),
        pytest.param({"a": [[[[[[[[[[[[[[[[["deep"]]]]]]]]]]]]]]]]]}, "nested deeper", id="deep"),
    ],
)
def test_arguments_that_cannot_be_shown_whole_are_denied_at_once(args: dict[str, object], says: str) -> None:
    """What the operator approves is what they were shown: an approval whose
    arguments ``redact`` would cut is denied at once, saying why, never left
    pending with a part of it out of sight."""
    box, _clock = approvals()
    refused = box.ask("r-1", "exec", args, timeout=30)
    assert (refused.state, refused.by) == ("denied", "limit")
    assert "cannot be shown whole" in refused.reason and says in refused.reason
    assert box.pending() == []


def test_arguments_that_fit_and_long_secrets_stay_pending() -> None:
    """The control: arguments at the limit stay pending and whole; a long
    value under a secret key is replaced, not shown, so it cuts nothing."""
    box, _clock = approvals()
    fits = box.ask("r-1", "exec", {"argv": ["sh", "-c", "y" * _approvals.ARGS_PREVIEW]}, timeout=30)
    secret = box.ask("r-1", "http.fetch", {"url": "https://a.example", "token": LONG}, timeout=30)
    assert fits.state == "pending" and fits.args["argv"][2] == "y" * _approvals.ARGS_PREVIEW  # type: ignore[index]
    assert secret.state == "pending" and secret.args["token"] == "[redacted]"
