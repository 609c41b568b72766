"""Approvals: an intent whose rule says ``ask`` waits for a human.

A state machine, with its clock injected: ``ask`` opens an approval (id
``a-<12 hex>``) with a deadline; ``decide`` closes it once (approve or deny,
by whom, why); ``expire`` closes every approval past its deadline as denied
(``by="timeout"``). A second decision is a ``conflict``; an unknown id is
``not_found``. ``wait`` blocks the run's broker thread until the approval is
closed or a timeout passes.

In unattended mode (a run started with nobody to answer) ``ask`` returns an
approval already denied (``by="unattended"``): the daemon refuses the intent
at once and counts the denial.

Nothing here does I/O or emits events; the daemon writes ``approval.asked``
and ``approval.decided`` from what these methods return. Arguments are kept
as ``redact`` leaves them, so an approval never holds a secret.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Literal

from stockade.errors import ApprovalError

MAX_PENDING = 1000
"""Pending approvals at most, over all runs; past it ``ask`` denies at once
(an agent cannot grow the daemon by asking)."""
MAX_KEPT = 10_000
"""Closed approvals kept for ``get`` and ``wait``; the oldest are forgotten first."""
ARGS_PREVIEW = 65_536
"""Characters of each string argument an approval keeps for the operator to read."""

State = Literal["pending", "approved", "denied"]


@dataclass(frozen=True, slots=True)
class Approval:
    """One question to the operator and, once closed, its answer."""

    id: str
    run: str
    intent: str
    args: Mapping[str, object]
    """Redacted: secrets replaced, long strings shortened."""
    asked_at: float
    deadline: float
    state: State = "pending"
    by: str = ""
    """Who decided: the operator's name, ``timeout``, ``unattended``, ``limit`` or ``run ended``."""
    reason: str = ""
    decided_at: float | None = None

    @property
    def verdict(self) -> Literal["allow", "deny", "ask"]:
        """``allow`` once approved, ``deny`` once denied, ``ask`` while pending."""
        return {"pending": "ask", "approved": "allow", "denied": "deny"}[self.state]  # type: ignore[return-value]

    def to_dict(self) -> dict[str, object]:
        """For ``approvals.list`` and the ``approval.*`` events' detail."""
        return {
            "id": self.id,
            "run": self.run,
            "intent": self.intent,
            "args": dict(self.args),
            "asked_at": self.asked_at,
            "deadline": self.deadline,
            "state": self.state,
            "decision": {"approved": "approve", "denied": "deny"}.get(self.state),
            "by": self.by,
            "reason": self.reason,
            "decided_at": self.decided_at,
        }


class Approvals:
    """The open and recently closed approvals of one daemon. Thread-safe."""

    def __init__(self, *, unattended: bool = False, clock: Callable[[], float] = time.time) -> None:
        """
        Args:
            unattended: every ``ask`` is denied at once (unless the call says otherwise).
            clock: seconds since the epoch; deadlines and ``decided_at`` use it.
        """
        self.unattended = unattended
        self._clock = clock
        self._cond = threading.Condition()
        self._items: OrderedDict[str, Approval] = OrderedDict()
        self._pending = 0

    # ----------------------------------------------------------------- asking

    def ask(
        self,
        run: str,
        intent: str,
        args: Mapping[str, object],
        *,
        timeout: float,
        unattended: bool | None = None,
    ) -> Approval:
        """Open an approval for ``intent`` of ``run``, closing by itself after ``timeout`` seconds.

        Returns it pending, or already denied when unattended (this instance's
        default, or the call's ``unattended``), when ``MAX_PENDING``
        approvals are open, or (``by="limit"``) when its arguments cannot be
        kept whole for the operator to read (a string past ``ARGS_PREVIEW``
        characters, a container past ``redact``'s limits): what is approved
        is what was shown.

        Raises:
            ValueError: ``timeout`` is not a positive finite number.
        """
        from stockade.broker._intents import redact

        if isinstance(timeout, bool) or not (
            isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0
        ):
            raise ValueError(f"approval timeout {timeout!r} is not a positive number of seconds")
        now = self._clock()
        approval = Approval(
            id="a-" + os.urandom(6).hex(),
            run=run,
            intent=intent,
            args=redact(args, limit=ARGS_PREVIEW),
            asked_at=now,
            deadline=now + timeout,
        )
        with self._cond:
            cut = _cut(args, 0)
            if cut is not None:
                # The operator approves what is shown; a part left out of it
                # would be approved unseen.
                approval = _closed(
                    approval, "denied", "limit", f"its arguments cannot be shown whole: {cut}", now
                )
            elif self.unattended if unattended is None else unattended:
                approval = _closed(
                    approval, "denied", "unattended", "the run is unattended: nobody can approve", now
                )
            elif self._pending >= MAX_PENDING:
                approval = _closed(
                    approval, "denied", "limit", f"{MAX_PENDING} approvals are already waiting", now
                )
            else:
                self._pending += 1
            self._store(approval)
            return approval

    # ---------------------------------------------------------------- closing

    def decide(self, id: str, decision: Literal["approve", "deny"], *, by: str, reason: str = "") -> Approval:
        """Close a pending approval with the operator's decision.

        Raises:
            ApprovalError: ``not_found`` (no such id), ``conflict`` (already
                closed: decided, expired, or past its deadline now).
            ValueError: ``decision`` is not ``approve`` or ``deny``.
        """
        if decision not in ("approve", "deny"):
            raise ValueError(f"decision {decision!r} is not 'approve' or 'deny'")
        with self._cond:
            current = self._items.get(id)
            if current is None:
                raise ApprovalError(
                    f"no approval {id!r}; list the open ones with `stockade approvals`", code="not_found"
                )
            now = self._clock()
            if current.state == "pending" and now >= current.deadline:
                current = self._close(current, "denied", "timeout", _timeout_reason(current), now)
            if current.state != "pending":
                raise ApprovalError(
                    f"approval {id!r} was already {current.state} by {current.by}; a decision is final",
                    code="conflict",
                )
            state: State = "approved" if decision == "approve" else "denied"
            return self._close(current, state, by, reason, now)

    def expire(self, now: float) -> list[Approval]:
        """Close, as denied by ``timeout``, every pending approval whose deadline is ``now`` or earlier."""
        with self._cond:
            due = [a for a in self._items.values() if a.state == "pending" and now >= a.deadline]
            return [self._close(a, "denied", "timeout", _timeout_reason(a), now) for a in due]

    def drop_run(self, run: str, reason: str = "the run ended") -> list[Approval]:
        """Close, as denied, every pending approval of ``run`` (it stopped or was halted)."""
        with self._cond:
            due = [a for a in self._items.values() if a.state == "pending" and a.run == run]
            now = self._clock()
            return [self._close(a, "denied", "run ended", reason, now) for a in due]

    # ---------------------------------------------------------------- reading

    def pending(self, run: str | None = None) -> list[Approval]:
        """Open approvals (of ``run``, or all), oldest first; those past their
        deadline but not yet expired are left out."""
        now = self._clock()
        with self._cond:
            return [
                a
                for a in self._items.values()
                if a.state == "pending" and now < a.deadline and (run is None or a.run == run)
            ]

    def get(self, id: str) -> Approval | None:
        with self._cond:
            return self._items.get(id)

    def wait(self, id: str, timeout: float) -> Approval:
        """Block until approval ``id`` is closed or ``timeout`` seconds pass; return it as it is then.

        An approval whose deadline passes (by the injected clock) while
        waiting is expired here. ``timeout`` is real time: 0 only looks.

        Raises:
            ApprovalError: ``not_found``.
        """
        end = time.monotonic() + max(0.0, timeout)
        with self._cond:
            while True:
                current = self._items.get(id)
                if current is None:
                    raise ApprovalError(f"no approval {id!r}", code="not_found")
                if current.state != "pending":
                    return current
                now = self._clock()
                if now >= current.deadline:
                    return self._close(current, "denied", "timeout", _timeout_reason(current), now)
                remaining = min(end - time.monotonic(), current.deadline - now)
                if remaining <= 0:
                    return current
                self._cond.wait(remaining)

    # --------------------------------------------------------------- internal

    def _close(self, approval: Approval, state: State, by: str, reason: str, now: float) -> Approval:
        closed = _closed(approval, state, by, reason, now)
        self._pending -= 1
        self._items[approval.id] = closed
        self._cond.notify_all()
        return closed

    def _store(self, approval: Approval) -> None:
        self._items[approval.id] = approval
        if len(self._items) > MAX_KEPT + MAX_PENDING:
            for key in [k for k, a in self._items.items() if a.state != "pending"][
                : len(self._items) - MAX_KEPT
            ]:
                del self._items[key]


def _cut(value: object, depth: int) -> str | None:
    """What ``redact`` would leave out of ``value`` for an approval (a string
    past ``ARGS_PREVIEW`` characters, a container past its item or depth
    limits), said in a few words; None when it keeps everything."""
    from stockade.broker._intents import _REDACT_DEPTH as REDACT_DEPTH
    from stockade.broker._intents import _REDACT_ITEMS as REDACT_ITEMS
    from stockade.broker._intents import _is_secret

    if depth > REDACT_DEPTH:
        return f"nested deeper than {REDACT_DEPTH} levels"
    if isinstance(value, str):
        if len(value) > ARGS_PREVIEW:
            return f"a string of {len(value)} characters (at most {ARGS_PREVIEW})"
        return None
    if isinstance(value, Mapping):
        if len(value) > REDACT_ITEMS:
            return f"{len(value)} keys in one object (at most {REDACT_ITEMS})"
        # A secret's value is replaced, not shown: nothing of it to cut.
        items: Iterable[object] = [v for k, v in value.items() if not _is_secret(str(k))]
    elif isinstance(value, list | tuple):
        if len(value) > REDACT_ITEMS:
            return f"{len(value)} items in one list (at most {REDACT_ITEMS})"
        items = value
    else:
        return None
    for item in items:
        found = _cut(item, depth + 1)
        if found is not None:
            return found
    return None


def _closed(approval: Approval, state: State, by: str, reason: str, now: float) -> Approval:
    return replace(approval, state=state, by=by, reason=reason, decided_at=now)


def _timeout_reason(approval: Approval) -> str:
    return f"no answer within {approval.deadline - approval.asked_at:g} s"


__all__ = ["ARGS_PREVIEW", "MAX_KEPT", "MAX_PENDING", "Approval", "ApprovalError", "Approvals", "State"]
