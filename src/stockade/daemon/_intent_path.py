"""The broker's intent path and its approvals.

What happens to one intent from a run's broker socket, in the order of
docs/BROKER.md (token, halted run, arguments, rules, an operator's approval,
execution), every decision recorded before the agent reads it. Every intent
enters by one door, ``IntentPath.serve_intent`` (called by ``_peer.Peer``).

``IntentPath`` is a component: its constructor names what it works with (the
loop, the recorder, the tokens, the approvals, the agents, the pool of
``exec`` threads, and ``halt``, the callback that halts a run whose tripwire
tripped). ``Runs`` (``_runs``) makes it and calls in to close a run's
approvals and to count a denial; it imports nothing of ``_runs``.

Every intent is an event, so what a family of runs can make the daemon store
this way is budgeted (``budgets``, ``_tools.RecordBudgets.intents``: a rate
and a lifetime total of bytes of arguments), at the door, before the token
or anything else is looked at: a flood of bad tokens or of a halted run's
intents is budgeted too. Past it, an intent is refused (``denied``) without an
event of its own; the family's first refusal is one ``budget.exceeded``
event, the later ones are counted (``status``: ``intents_refused``). Not
counted toward the tripwire: the budget protects the daemon, it is no verdict
on what the agent asked.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import hmac
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stockade.broker._approvals import Approval, ApprovalError, Approvals
from stockade.broker._intents import READ_ONLY, TABLE, IntentArgs, IntentError, parse_args, redact
from stockade.broker._refusal import Refusal
from stockade.broker._rules import Decision
from stockade.broker._tokens import TokenCheck, Tokens
from stockade.daemon import _tools
from stockade.daemon._agents import AGENT_INTENTS, Agents
from stockade.daemon._bus import Recorder, approval_event, intent_event
from stockade.daemon._network import fetch_decision, fetch_value
from stockade.daemon._requests import RequestError
from stockade.errors import StoreError
from stockade.record import Event
from stockade.record._chain import StoredEvent

if TYPE_CHECKING:
    from stockade.daemon._run import Run


class IntentPath:
    """Intents and approvals of every run of one daemon (see the module's docstring)."""

    def __init__(
        self,
        *,
        loop: asyncio.AbstractEventLoop,
        recorder: Recorder,
        tokens: Tokens,
        approvals: Approvals,
        approval_timeout: float,
        agents: Agents,
        workbench_pool: concurrent.futures.ThreadPoolExecutor,
        halt: Callable[[Run, str], Awaitable[None]],
        budgets: _tools.RecordBudgets | None = None,
    ) -> None:
        """
        Args:
            workbench_pool: the threads ``exec`` intents run in (their owner shuts it down).
            halt: halts a run (``Runs.halt``): called when a denial trips its tripwire.
            budgets: what each family may store by intents (``RecordBudgets.intents()``).
        """
        self.budgets = budgets if budgets is not None else _tools.RecordBudgets.intents()
        self.loop = loop
        self.recorder = recorder
        self.tokens = tokens
        self.approvals = approvals
        self.approval_timeout = approval_timeout
        self.agents = agents
        self.halt = halt
        self._workbench_pool = workbench_pool
        self._waiting: dict[str, asyncio.Future[Approval]] = {}
        self._expiry: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ approvals

    def deny_waiting(self, reason: str) -> None:
        """Deny every approval an intent waits for (the store failed: nothing may go on)."""
        for approval_id, waiter in list(self._waiting.items()):
            if not waiter.done():
                with contextlib.suppress(ApprovalError):
                    waiter.set_result(self.approvals.decide(approval_id, "deny", by="daemon", reason=reason))

    async def close_approvals(self, run: Run, reason: str) -> None:
        """``run`` ended or was halted: its open approvals close, their intents go on (denied)."""
        for approval in self.approvals.drop_run(run.id, reason):
            waiter = self._waiting.get(approval.id)
            if waiter is not None and not waiter.done():
                waiter.set_result(approval)

    def decide(self, approval_id: object, decision: object, *, by: str, reason: str) -> Approval:
        """``approvals.decide``: close a pending approval; its intent goes on.

        Raises:
            RequestError: ``bad_params``, ``not_found``, ``conflict``.
        """
        if not isinstance(approval_id, str) or decision not in ("approve", "deny"):
            raise RequestError("bad_params", "give 'id' (a-…) and 'decision': 'approve' or 'deny'")
        try:
            approval = self.approvals.decide(approval_id, decision, by=by, reason=reason)
        except ApprovalError as exc:
            raise RequestError(exc.code, str(exc)) from exc
        waiter = self._waiting.get(approval_id)
        if waiter is not None and not waiter.done():
            waiter.set_result(approval)
        return approval

    def _expire(self) -> None:
        self._expiry = None
        for approval in self.approvals.expire(time.time()):
            waiter = self._waiting.get(approval.id)
            if waiter is not None and not waiter.done():
                waiter.set_result(approval)
        self._schedule_expiry()

    def _schedule_expiry(self) -> None:
        pending = [a.deadline for a in self.approvals.pending()]
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if pending or self._waiting:
            deadlines = pending or [time.time() + 1.0]
            delay = max(0.0, min(deadlines) - time.time()) + 0.001
            self._expiry = self.loop.call_later(delay, self._expire)

    # ------------------------------------------------------------------ intents

    def _read_now(
        self,
        run: Run,
        cell: str,
        intent: str,
        args: Mapping[str, object],
        parsed: IntentArgs,
        decision: Decision,
        tool_call: str | None,
    ) -> PreparedRead:
        """An allowed ``fs.read`` or ``fs.list`` (``READ_ONLY`` of the broker's table), done now,
        its events built but not yet recorded. The caller records ``events``
        (``settle_read``, or the recorder with a callback and then
        ``finish_read``); the agent gets nothing before that."""
        redacted = redact(args)
        events = [intent_event(run, cell, intent, redacted, decision, tool_call=tool_call)]
        error: RequestError | None = None
        value: dict[str, object] = {}
        refused: Refusal | None = None
        assert run.executor is not None
        try:
            outcome = run.executor.outcome(parsed)
        except IntentError as exc:
            error = RequestError(exc.code, str(exc))
        else:
            refused = outcome if isinstance(outcome, Refusal) else None
            value = outcome.value() if isinstance(outcome, Refusal) else outcome
        answer = _answer(decision)
        if refused is not None:
            denied = Decision("deny", decision.rule, f"refused by the broker: {refused.message}")
            events.append(intent_event(run, cell, intent, redacted, denied, tool_call=tool_call))
            answer = _answer(denied)
        return PreparedRead(events, {**answer, "value": value}, refused is not None, error)

    def finish_read(
        self, run: Run, prepared: PreparedRead, recorded: list[StoredEvent] | BaseException
    ) -> dict[str, Any]:
        """The answer to a prepared read that the broker did not refuse (a
        refusal counts toward the tripwire first: ``settle_read``), once the
        recorder gave back ``recorded`` for its events (``Recorder.record_then``).

        Raises:
            RequestError: ``unavailable`` (the store cannot write), or the
                intent's own failure (its events say so).
        """
        if isinstance(recorded, StoreError):
            raise RequestError(
                "unavailable", f"the event store cannot write, so the intent is refused: {recorded}"
            ) from recorded
        if isinstance(recorded, BaseException):
            raise recorded
        run.intents += 1
        if prepared.error is not None:
            raise prepared.error
        return prepared.answer

    async def settle_read(self, run: Run, prepared: PreparedRead) -> dict[str, Any]:
        """Record a prepared read's events, count a refusal, then its answer.

        Raises:
            RequestError: as ``finish_read``.
        """
        await self._record_or_refuse(prepared.events)
        if prepared.refused:
            run.intents += 1
            await self.count_denial(run)
            return prepared.answer
        return self.finish_read(run, prepared, [])

    def serve_intent(
        self, run: Run, params: Mapping[str, Any], *, cell: str
    ) -> PreparedRead | Coroutine[Any, Any, dict[str, Any]]:
        """Where every intent of a broker socket enters. Its checks and its
        verdict, in the order of docs/BROKER.md (token, halted run, arguments,
        rules), are worked out here, once; then an allowed read is done now
        (``_read_now``), and anything else is the coroutine that records it
        and goes on (not yet awaited: its caller gives it a task).

        Raises:
            RequestError: ``bad_params`` (the intent's arguments),
                ``unavailable`` (the store cannot write): refused before
                anything is recorded.
        """
        intent = params.get("intent")
        args = params.get("args", {})
        if not isinstance(intent, str) or not intent or len(intent) > 64 or not isinstance(args, dict):
            raise RequestError(
                "bad_params", "an intent needs 'intent' (a name such as fs.read) and 'args' (an object)"
            )
        if self.recorder.failure is not None:
            raise RequestError(
                "unavailable",
                f"the event store cannot write, so no intent is served: {self.recorder.failure}",
            )
        over = self._charge(run, args)
        if over is not None:
            return self._refuse_budget(run, cell, intent, over)
        check = self.check_token(run, params.get("token"))
        if check != TokenCheck.OK:
            return self.refuse_token(run, cell, intent, args, check)
        if run.halted or run.done.is_set():
            return self._refuse_halted(run, cell, intent, args)
        try:
            parsed = parse_args(intent, args)  # malformed: neither decided, nor counted, nor recorded
        except IntentError as exc:
            raise RequestError(exc.code, str(exc)) from exc
        tool_call = _tools.check_tool_call_id(params.get("tool_call"))
        runs = TABLE[intent].runs_for(args)  # a known intent: parse_args refused any other
        if runs == "gateway":
            decision = fetch_decision(
                run.gateway, run.rules, args, plain_http=run.policy.network.fetch_plain_http
            )
        else:
            decision = run.rules.decide(intent, args)
            if intent in AGENT_INTENTS:
                decision = self.agents.decide(run, intent, args, decision)
        if decision.verdict == "ask" and run.unattended:
            run.unattended_denials += 1
            decision = Decision(
                "deny", decision.rule, f"{decision.reason}; the run is unattended, so nobody can approve"
            )
        if decision.verdict == "allow" and intent in READ_ONLY and runs == "loop":
            return self._read_now(run, cell, intent, args, parsed, decision, tool_call)
        return self._decided(run, cell, intent, args, decision, tool_call)

    def _charge(self, run: Run, args: Mapping[str, object]) -> str | None:
        """Take one intent from its family's budget; why not, if it does not fit."""
        above = self.agents.lineage(run)
        family = above[-1].id if above else run.id
        return self.budgets.charge(family, _stored_size(args))

    async def _refuse_budget(self, run: Run, cell: str, intent: str, why: str) -> dict[str, Any]:
        above = self.agents.lineage(run)
        family = above[-1].id if above else run.id
        if self.budgets.refuse(family):
            event = _tools.budget_event(run, cell, why, family, method="intent")
            event = dataclasses.replace(event, detail={**event.detail, "intent": intent})
            with contextlib.suppress(StoreError):  # the refusal stands whether or not it is stored
                await self.recorder.record_soon([event])
        raise RequestError("denied", f"intent {intent} refused: {why}")

    def check_token(self, run: Run, token: object) -> TokenCheck:
        """Whether ``token`` is ``run``'s and live (``_check_token``)."""
        return _check_token(self.tokens, run, token)

    async def refuse_token(
        self, run: Run, cell: str, intent: str, args: Mapping[str, object], check: TokenCheck
    ) -> dict[str, Any]:
        """Record a bad token's request as a denial (counted), then refuse it.

        Raises:
            RequestError: ``unauthorized``, always.
        """
        reason = f"unauthorized: the capability token is {_TOKEN_WORDS.get(check, check.value)}"
        await self._record_intent(run, cell, intent, args, Decision("deny", None, reason))
        raise RequestError("unauthorized", f"{reason}; use the token in $STOCKADE_TOKEN")

    async def _refuse_halted(
        self, run: Run, cell: str, intent: str, args: Mapping[str, object]
    ) -> dict[str, Any]:
        why = f"run {run.id} is halted ({run.halted})" if run.halted else f"run {run.id} has ended"
        await self._record_intent(run, cell, intent, args, Decision("deny", None, why), count=False)
        raise RequestError("denied", f"{why}; every intent is refused")

    async def _decided(
        self,
        run: Run,
        cell: str,
        intent: str,
        args: Mapping[str, object],
        decision: Decision,
        tool_call: str | None,
    ) -> dict[str, Any]:
        """Record the verdict, then deny, ask the operator, or execute."""
        if decision.verdict == "ask" and run.executor is not None:
            # The grants first: never ask a human to approve what would then
            # be refused as outside them (the README's /srv/notes rule did).
            refused = run.executor.grant_refusal(intent, args)
            if refused is not None:
                decision = Decision("deny", decision.rule, f"refused before asking: {refused}")
        await self._record_intent(run, cell, intent, args, decision, tool_call=tool_call)
        if decision.verdict == "deny":
            return _answer(decision)
        approval: Approval | None = None
        if decision.verdict == "ask" and intent == "ask":
            # A question under a `verdict: ask` rule is one approval, not two:
            # putting it to the operator is the asking (approving the asking
            # first, then asking again, dropped that first answer, and a
            # question that timed out came back Denied, not NoAnswer).
            decision = Decision("allow", decision.rule, "the question is put to the operator")
        if decision.verdict == "ask":
            approval = await self._ask(run, intent, args)
            decision = Decision(
                "allow" if approval.state == "approved" else "deny", decision.rule, _approval_reason(approval)
            )
            if decision.verdict == "deny":
                await self.count_denial(run)
                return {**_answer(decision), "approval": approval.id}
        answer = await self._execute(run, cell, intent, args, decision, tool_call=tool_call)
        return {**answer, "approval": approval.id} if approval is not None else answer

    async def _record_intent(
        self,
        run: Run,
        cell: str,
        intent: str,
        args: Mapping[str, object],
        decision: Decision,
        *,
        count: bool = True,
        again: bool = False,
        tool_call: str | None = None,
    ) -> None:
        """Store the ``intent`` event (durably), then count a denial toward the tripwire.

        ``again``: a second event for an intent already recorded (refused while executed)."""
        event = intent_event(run, cell, intent, redact(args), decision, tool_call=tool_call)
        await self._record_or_refuse([event])
        if not again:
            run.intents += 1
        if decision.verdict == "deny" and count:
            await self.count_denial(run)

    async def _record_or_refuse(self, events: list[Event]) -> None:
        """Store an intent's events durably.

        Raises:
            RequestError: ``unavailable``: the store cannot write, so the intent is refused.
        """
        try:
            await self.recorder.record_soon(events)
        except StoreError as exc:
            raise RequestError(
                "unavailable", f"the event store cannot write, so the intent is refused: {exc}"
            ) from exc

    async def count_denial(self, run: Run) -> None:
        """One more denial of ``run`` toward its tripwire; the one that trips it halts the run."""
        run.denials += 1
        if run.tripwire.record("deny"):
            # A family shares one tripwire (a helper's is its parent's): its
            # trip halts the run that tripped it and the root, with every helper.
            reason = f"{run.tripwire.denials} denials reached the limit of {run.tripwire.limit}"
            root = self.agents.root(run)
            for target in [run] if root is run else [run, root]:
                if not target.halted:
                    await self.halt(target, reason)

    async def _ask(
        self, run: Run, intent: str, args: Mapping[str, object], *, unattended: bool | None = None
    ) -> Approval:
        """Open an approval and wait for it on the loop: a future, not a thread,
        so a run's questions, however many, hold no worker another run needs."""
        approval = self.approvals.ask(
            run.id, intent, args, timeout=self.approval_timeout, unattended=unattended
        )
        if approval.state == "pending":
            waiter: asyncio.Future[Approval] = self.loop.create_future()
            self._waiting[approval.id] = waiter
        await self._record_approval("approval.asked", run, approval)
        if approval.state != "pending":
            await self._record_approval("approval.decided", run, approval)
            return approval
        self._schedule_expiry()
        try:
            approval = await waiter
        finally:
            self._waiting.pop(approval.id, None)
        await self._record_approval("approval.decided", run, approval)
        return approval

    async def _question(self, run: Run, question: str) -> dict[str, object]:
        """An allowed ``ask`` intent: the operator's answer (the approving
        decision's reason), or ``None`` when denied or unanswered. Waited for
        on the loop (``_ask``): 64 open questions of one run once filled the
        daemon-wide worker pool and another run's ``exec`` waited 20 s."""
        approval = await self._ask(run, "ask", {"question": question}, unattended=run.unattended)
        if run.unattended:
            run.unattended_denials += 1
        return {"answer": approval.reason if approval.state == "approved" else None}

    async def _record_approval(self, kind: str, run: Run, approval: Approval) -> None:
        try:
            await self.recorder.record_soon([approval_event(kind, run, approval)])
        except StoreError as exc:
            raise RequestError("unavailable", f"the event store cannot write: {exc}") from exc

    async def _execute(
        self,
        run: Run,
        cell: str,
        intent: str,
        args: Mapping[str, object],
        decision: Decision,
        *,
        tool_call: str | None = None,
    ) -> dict[str, Any]:
        executor = run.executor
        assert executor is not None
        value: dict[str, object] | Refusal
        runs = TABLE[intent].runs_for(args)
        if runs == "gateway":
            assert run.gateway is not None and run.hooks is not None  # decided allow: it has one
            value = await fetch_value(run.gateway, run, cell, args, run.hooks, tool_call=tool_call)
        elif intent in AGENT_INTENTS:
            value = await self.agents.execute(run, cell, intent, args)
        elif intent == "ask":
            value = await self._question(run, str(args["question"]))
        elif runs == "thread":
            # It takes seconds to minutes: a thread of its own (a run holds at
            # most WORKBENCHES_PER_RUN of them). An fs intent in a session is
            # a call into its cell: a thread too, never the loop.
            try:
                value = await self.loop.run_in_executor(self._workbench_pool, _outcome, run, intent, args)
            except IntentError as exc:
                raise RequestError(exc.code, str(exc)) from exc
        else:
            value = _execute_now(run, intent, args)
        return await self._answer_value(run, cell, intent, args, decision, value, tool_call=tool_call)

    async def _answer_value(
        self,
        run: Run,
        cell: str,
        intent: str,
        args: Mapping[str, object],
        decision: Decision,
        value: dict[str, object] | Refusal,
        *,
        tool_call: str | None = None,
    ) -> dict[str, Any]:
        if isinstance(value, Refusal):
            # The broker's own checks (grants, hidden paths, links) refused it
            # after the rules allowed it: a denial like any other.
            denied = Decision("deny", decision.rule, f"refused by the broker: {value.message}")
            await self._record_intent(run, cell, intent, args, denied, again=True, tool_call=tool_call)
            return {**_answer(denied), "value": value.value()}
        return {**_answer(decision), "value": value}


@dataclass(frozen=True, slots=True)
class PreparedRead:
    """An allowed read-only intent, done, its events not yet recorded (``IntentPath._read_now``)."""

    events: list[Event]
    """Its ``intent`` event, and a second one if the broker's own checks refused it."""
    answer: dict[str, Any]
    """The result the agent gets once ``events`` are durable (unless ``error``)."""
    refused: bool
    """The broker refused it after the rules allowed it: a denial toward the tripwire."""
    error: RequestError | None
    """It failed; the agent gets this error instead of ``answer``."""


_TOKEN_WORDS = {
    TokenCheck.MALFORMED: "malformed",
    TokenCheck.FORGED: "forged",
    TokenCheck.WRONG_RUN: "another run's",
    TokenCheck.EXPIRED: "expired",
}


def _outcome(run: Run, intent: str, args: Mapping[str, object]) -> dict[str, object] | Refusal:
    """The executor's value of an allowed intent, or its ``Refusal`` (on a thread)."""
    assert run.executor is not None
    return run.executor.outcome(parse_args(intent, args))


def _execute_now(run: Run, intent: str, args: Mapping[str, object]) -> dict[str, object] | Refusal:
    """An fs intent, in the loop: bounded (16 MiB, 10,000 entries) and cheaper
    than a hop to a thread and back, which the GIL would serialise anyway."""
    try:
        return _outcome(run, intent, args)
    except IntentError as exc:
        raise RequestError(exc.code, str(exc)) from exc


_ARG_STRING_KEPT = 4096
"""What ``redact`` keeps of a string (its default ``limit``)."""


def _stored_size(value: object, depth: int = 0) -> int:
    """About the bytes ``value`` takes in an event, redacted (each string cut
    at what ``redact`` keeps, containers at its 1,000 items and 16 levels),
    without building it: the budget's measure, a few hundred nanoseconds for
    an intent's usual arguments where ``json.dumps(redact(args))`` took ~10 µs."""
    if isinstance(value, str):
        return min(len(value), _ARG_STRING_KEPT) + 2
    if depth > 16:
        return 20
    if isinstance(value, dict):
        total = 2
        for index, (key, item) in enumerate(value.items()):
            if index >= 1000:
                break
            total += len(str(key)) + 4 + _stored_size(item, depth + 1)
        return total
    if isinstance(value, list | tuple):
        return 2 + sum(_stored_size(item, depth + 1) + 2 for item in value[:1000])
    return 8


def _check_token(tokens: Tokens, run: Run, token: object) -> TokenCheck:
    """``tokens.check`` for ``run``, with a fast path: the very token the run was
    given (compared in constant time), before its expiry, is good without
    decoding it again; anything else gets the full check and its reason."""
    if (
        isinstance(token, str)
        and token.isascii()
        and time.time() < run.token_expiry
        and hmac.compare_digest(token.encode("ascii"), run.token.encode("ascii"))
    ):
        return TokenCheck.OK
    return tokens.check(token, run=run.id, cell="")


def _answer(decision: Decision) -> dict[str, Any]:
    return {"verdict": decision.verdict, "rule": decision.rule, "reason": decision.reason, "value": None}


def _approval_reason(approval: Approval) -> str:
    word = {"approved": "approved", "denied": "denied", "pending": "not answered"}[approval.state]
    return f"{word} by {approval.by or 'nobody'}" + (f": {approval.reason}" if approval.reason else "")


__all__ = ["IntentPath", "PreparedRead"]
