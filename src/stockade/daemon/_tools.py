"""The broker socket's ``tool.record``: an agent's own account of its tool calls.

An agent built on the SDK (``stockade.sdk``, ``stockade_agent``) records each
call of one of its tools when the call ends: the tool's name, its arguments,
the size of its result, how long it took, whether it raised. The daemon
stores it as one ``tool.call`` event (layer ``broker``, outcome ``info``).
The intents made during the call carry the same ``tool_call`` id in their
params, so the record links what the model asked for to the verdicts it
caused.

This is the agent's own account, not a decision: nothing is allowed or denied
here, and it does not count toward the tripwire. Only a bad token does, as for
an intent (it is recorded as a denied ``intent`` named ``tool.record``). A
halted or ended run's calls are still recorded: they say what the agent was
doing when it was stopped.

What an agent makes the daemon store this way is budgeted (``RecordBudgets``),
per family of runs (a run and every helper below it share one budget): at most
``RECORD_RATE`` calls a second sustained (``RECORD_BURST`` at once) and
``RECORD_BYTES`` of arguments and errors over the family's life; and nothing
while the store is within its reserve (``JournaledStore.room_for_agents``),
which is kept for the daemon's own events. A call past a budget is refused
(``denied``); the first refusal of a family is recorded as one
``budget.exceeded`` event, the later ones only counted (``status`` shows the
counts), so that a flood of refusals does not flood the record either.

Nothing here touches a socket: the server calls ``record_tool_call`` with the
intent path, which it knows only as ``ToolRecordHost`` (so this module does
not import ``_intent_path``, which imports it for ``check_tool_call_id``).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from stockade.broker._intents import _json_type, _short, redact
from stockade.broker._tokens import TokenCheck
from stockade.daemon._requests import RequestError
from stockade.errors import StoreError
from stockade.record import Event

if TYPE_CHECKING:
    from stockade.daemon._agents import Agents
    from stockade.daemon._bus import Recorder
    from stockade.daemon._run import Run

TOOL_CALL_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}\Z")
"""A tool call's id: the SDK's (``tc-`` and 16 hex digits) or a model's own
(``call_…``), so the record can name the model's call."""
TOOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]{0,127}\Z")
"""A tool's name: a Python qualified name, or a model's tool name."""
ARGS_JSON_MAX = 64 * 1024
"""Bytes of a call's arguments (as JSON, after redaction) one event holds at most."""
ARG_STRING_MAX = 4096
ERROR_MAX = 4096
DURATION_MAX = 366 * 24 * 3600.0
SIZE_MAX = 2**63 - 1
PARAMS = ("token", "name", "args", "result_size", "duration", "ok", "error", "tool_call")
RECORD_RATE = 100.0
"""``tool.record`` calls a second one family of runs may make, sustained. An
SDK agent records one per tool call: a few a second at most. 14 MB/s of them
filled this host's disk in about 1.5 h."""
RECORD_BURST = 500
"""Calls a family may make at once before ``RECORD_RATE`` holds it back."""
RECORD_BYTES = 64 * 1024 * 1024
"""Bytes of arguments and errors one family of runs may have stored by
``tool.record`` over its life (a thousand full 64 KiB calls)."""
INTENT_RATE = 1000.0
"""Intents a second one family of runs may make, sustained, each an event in
the record (``_intent_path``). An agent waits for each answer and a model for
each step: tens a second is a busy one; the daemon serves about 11,000 a
second in all (docs/PERFORMANCE.md), so one family at this rate leaves the
rest to the others, and a flood stores at most ~1 MB/s."""
INTENT_BURST = 5000
"""Intents a family may make at once before ``INTENT_RATE`` holds it back."""
INTENT_BYTES = 1024 * 1024 * 1024
"""Bytes of redacted intent arguments a family may have stored over its life
(a million intents of 1 KiB: days of a busy agent, 17 minutes of a flood)."""


@dataclass(slots=True)
class _Budget:
    tokens: float
    at: float
    stored: int = 0
    refused: int = 0


class RecordBudgets:
    """What every family of runs may make the daemon store by one door
    (``tool.record`` by default; ``intents()`` for intents): a token bucket
    for the rate, a count of bytes for the total. Pure, with its clock injected."""

    def __init__(
        self,
        *,
        rate: float = RECORD_RATE,
        burst: int = RECORD_BURST,
        total: int = RECORD_BYTES,
        clock: Callable[[], float] = time.monotonic,
        doing: str = "recorded tool calls",
        fix_rate: str = "record one per call of a tool",
        what: str = "tool call arguments",
        fix_bytes: str = "record less of each call's arguments",
    ) -> None:
        self.rate, self.burst, self.total = rate, burst, total
        self._words = (doing, fix_rate, what, fix_bytes)
        self._clock = clock
        self._families: dict[str, _Budget] = {}

    def charge(self, family: str, size: int) -> str | None:
        """Take one call of ``size`` bytes from ``family``'s budget: None when
        it fits (it is then counted), else why not (nothing is taken)."""
        now = self._clock()
        budget = self._families.get(family)
        if budget is None:
            budget = self._families[family] = _Budget(float(self.burst), now)
        budget.tokens = min(float(self.burst), budget.tokens + (now - budget.at) * self.rate)
        budget.at = now
        doing, fix_rate, what, fix_bytes = self._words
        if budget.tokens < 1.0:
            return (
                f"this run's family has {doing} faster than {self.rate:g} a second "
                f"(a burst of {self.burst}); {fix_rate}"
            )
        if budget.stored + size > self.total:
            return (
                f"this run's family has stored {budget.stored} bytes of {what}, and "
                f"{size} more would pass its budget of {self.total}; {fix_bytes}"
            )
        budget.tokens -= 1.0
        budget.stored += size
        return None

    def refuse(self, family: str) -> bool:
        """Count a refusal of ``family``; True for its first (record that one)."""
        budget = self._families.setdefault(family, _Budget(float(self.burst), self._clock()))
        budget.refused += 1
        return budget.refused == 1

    def refused(self) -> dict[str, int]:
        """Refusals so far, by family (its root run's id), for ``status``."""
        return {family: b.refused for family, b in self._families.items() if b.refused}

    @classmethod
    def intents(
        cls,
        *,
        rate: float = INTENT_RATE,
        burst: int = INTENT_BURST,
        total: int = INTENT_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> RecordBudgets:
        """The budgets of intents (every one is an event: ``_intent_path``)."""
        return cls(
            rate=rate,
            burst=burst,
            total=total,
            clock=clock,
            doing="made intents",
            fix_rate="wait for each answer before the next intent",
            what="intent arguments",
            fix_bytes="send less in each intent (write files in the workspace instead)",
        )


def check_tool_call_id(value: object) -> str | None:
    """An intent's optional ``tool_call`` param, checked: the id, or ``None`` when absent.

    For ``IntentPath.serve_intent``, to put the id in the ``intent`` event.

    Raises:
        RequestError: ``bad_params``, naming the value and the form an id takes.
    """
    if value is None:
        return None
    if not isinstance(value, str) or not TOOL_CALL_ID.match(value):
        raise RequestError(
            "bad_params",
            f"'tool_call' {_short(value)} is not a tool call id; give 1 to 128 letters, digits or "
            "'_.:-', such as the id the SDK makes (tc-…) or the model's own call id",
        )
    return value


class ToolRecordHost(Protocol):
    """What ``tool.record`` needs of the intent path (``_intent_path.IntentPath``)."""

    @property
    def recorder(self) -> Recorder: ...

    @property
    def agents(self) -> Agents: ...

    def check_token(self, run: Run, token: object) -> TokenCheck:
        """Whether ``token`` is ``run``'s and live."""
        ...

    async def refuse_token(
        self, run: Run, cell: str, intent: str, args: Mapping[str, object], check: TokenCheck
    ) -> dict[str, Any]:
        """Record the request as a denial (counted toward the tripwire), then raise ``unauthorized``."""
        ...


async def record_tool_call(
    path: ToolRecordHost, run: Run, params: Mapping[str, Any], *, cell: str, budgets: RecordBudgets
) -> dict[str, Any]:
    """``tool.record`` on ``run``'s broker socket: store one ``tool.call`` event.

    The token is checked first, as for an intent (a bad one is recorded as a
    denial and counted); then every param; then the family's budget and the
    store's reserve (see the module docstring); then the event is stored
    durably before the agent is answered.

    Returns:
        ``{"recorded": true, "tool_call": id, "seq": n}``; ``seq`` is the
        event's place in the record.

    Raises:
        RequestError: ``unavailable`` (the store cannot write), ``unauthorized``
            (the token), ``bad_params`` (a missing, unknown or malformed param),
            ``denied`` (past a budget, or the store is within its reserve).
    """
    if path.recorder.failure is not None:
        raise RequestError(
            "unavailable",
            f"the event store cannot write, so no tool call is recorded: {path.recorder.failure}",
        )
    check = path.check_token(run, params.get("token"))
    if check != TokenCheck.OK:
        name = params.get("name")
        note = {"name": name if isinstance(name, str) else None}
        await path.refuse_token(run, cell, "tool.record", redact(note), check)  # raises unauthorized
    fields = parse_params(params)
    event = tool_call_event(run, cell, fields)
    above = path.agents.lineage(run)
    family = above[-1].id if above else run.id
    size = len(json.dumps(fields["args"], ensure_ascii=False)) + len(fields["error"])
    why = path.recorder.store.room_for_agents() or budgets.charge(family, size)
    if why is not None:
        if budgets.refuse(family):
            refusal = budget_event(run, cell, why, family)
            with contextlib.suppress(StoreError):  # the refusal stands whether or not it is stored
                await path.recorder.record_soon([refusal])
        raise RequestError("denied", f"tool.record refused: {why}")
    try:
        stored = await path.recorder.record_soon([event])
    except StoreError as exc:
        raise RequestError(
            "unavailable", f"the event store cannot write, so the tool call is not recorded: {exc}"
        ) from exc
    return {"recorded": True, "tool_call": fields["tool_call"], "seq": stored[0].seq if stored else 0}


def parse_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """The params of ``tool.record``, checked, with ``args`` redacted and bounded.

    Raises:
        RequestError: ``bad_params``, naming the first bad param and its fix.
    """
    unknown = sorted(set(params) - set(PARAMS))
    if unknown:
        raise _bad(
            f"{unknown[0]!r} is not a param of tool.record; remove it (the params are: {', '.join(PARAMS)})"
        )
    for key in ("name", "args", "result_size", "duration", "ok", "tool_call"):
        if key not in params:
            raise _bad(f"{key!r} is missing; give it")
    name = params["name"]
    if not isinstance(name, str) or not TOOL_NAME.match(name):
        raise _bad(
            f"'name' {_short(name)} is not a tool name; give 1 to 128 letters, digits or '_.:-', "
            "starting with a letter or '_'"
        )
    tool_call = params["tool_call"]
    if not isinstance(tool_call, str) or not TOOL_CALL_ID.match(tool_call):
        raise _bad(
            f"'tool_call' {_short(tool_call)} is not a tool call id; give 1 to 128 letters, digits or '_.:-'"
        )
    args = params["args"]
    if not isinstance(args, dict):
        raise _bad(f"'args' must be an object of the tool's arguments by name, not {_json_type(args)}")
    kept = redact(args, limit=ARG_STRING_MAX)
    size = len(json.dumps(kept, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    if size > ARGS_JSON_MAX:
        raise _bad(
            f"'args' is {size} bytes as JSON, over the limit of {ARGS_JSON_MAX}; cut long values "
            "(the SDK keeps 1,000 characters of a string and 50 items of a list)"
        )
    result_size = params["result_size"]
    if isinstance(result_size, bool) or not isinstance(result_size, int) or not 0 <= result_size <= SIZE_MAX:
        raise _bad(f"'result_size' {_short(result_size)} must be a whole number of bytes, 0 or more")
    duration = params["duration"]
    if (
        isinstance(duration, bool)
        or not isinstance(duration, int | float)
        or not math.isfinite(duration)
        or not 0 <= duration <= DURATION_MAX
    ):
        raise _bad(f"'duration' {_short(duration)} must be a number of seconds from 0 to {DURATION_MAX:g}")
    ok = params["ok"]
    if not isinstance(ok, bool):
        raise _bad(f"'ok' must be true or false, not {_json_type(ok)}")
    error = params.get("error", "")
    if error is None:
        error = ""
    if not isinstance(error, str) or len(error) > ERROR_MAX:
        raise _bad(f"'error' must be a string of at most {ERROR_MAX} characters: the tool's exception")
    if ok and error:
        raise _bad("'error' is given but 'ok' is true; send the error only for a call that raised")
    return {
        "tool_call": tool_call,
        "name": name,
        "args": kept,
        "result_size": result_size,
        "duration": round(float(duration), 6),
        "ok": ok,
        "error": error,
    }


def tool_call_event(run: Run, cell: str, fields: Mapping[str, Any]) -> Event:
    """One ``tool.call`` event from checked params (``parse_params``)."""
    outcome = f"returned {fields['result_size']} bytes" if fields["ok"] else f"raised {fields['error'][:200]}"
    return Event(
        kind="tool.call",
        cell=cell,
        layer="broker",
        outcome="info",
        run=run.id,
        summary=f"tool {fields['name']} {outcome} in {fields['duration']:.3f} s",
        detail=dict(fields),
    )


def budget_event(run: Run, cell: str, why: str, family: str, method: str = "tool.record") -> Event:
    """The one ``budget.exceeded`` event of a family's first refused ``tool.record``
    (``method``) or intent (``intent``, the refused intent's name in ``intent``)."""
    what = "tool.record" if method == "tool.record" else "an intent"
    return Event(
        kind="budget.exceeded",
        cell=cell,
        layer="broker",
        outcome="denied",
        run=run.id,
        summary=f"{what} of run {run.id} refused, and its family's later ones counted: {why}",
        detail={"method": method, "family": family, "reason": why},
    )


def _bad(problem: str) -> RequestError:
    return RequestError("bad_params", f"tool.record: {problem}")


__all__ = [
    "INTENT_BURST",
    "INTENT_BYTES",
    "INTENT_RATE",
    "RECORD_BURST",
    "RECORD_BYTES",
    "RECORD_RATE",
    "TOOL_CALL_ID",
    "RecordBudgets",
    "budget_event",
    "check_tool_call_id",
    "parse_params",
    "record_tool_call",
    "tool_call_event",
]
