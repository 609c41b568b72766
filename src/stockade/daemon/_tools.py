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

Nothing here touches a socket: the server calls ``record_tool_call``; ``Runs.intent``
may call ``check_tool_call_id`` (as ``_tools.check_tool_call_id``: the modules
import each other).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from stockade.broker._intents import _json_type, _short, redact
from stockade.broker._rules import Decision
from stockade.broker._tokens import TokenCheck

# The module, not its names: ``_intent_path`` imports this one
# (``check_tool_call_id``) in turn, and either may be imported first.
from stockade.daemon import _intent_path
from stockade.daemon._requests import RequestError
from stockade.errors import StoreError
from stockade.record import Event

if TYPE_CHECKING:
    from stockade.daemon._runs import Run, Runs

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


def check_tool_call_id(value: object) -> str | None:
    """An intent's optional ``tool_call`` param, checked: the id, or ``None`` when absent.

    For ``Runs.intent``, to put the id in the ``intent`` event.

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


async def record_tool_call(runs: Runs, run: Run, params: Mapping[str, Any], *, cell: str) -> dict[str, Any]:
    """``tool.record`` on ``run``'s broker socket: store one ``tool.call`` event.

    The token is checked first, as for an intent (a bad one is recorded as a
    denial and counted); then every param; then the event is stored durably
    before the agent is answered.

    Returns:
        ``{"recorded": true, "tool_call": id, "seq": n}``; ``seq`` is the
        event's place in the record.

    Raises:
        RequestError: ``unavailable`` (the store cannot write), ``unauthorized``
            (the token), ``bad_params`` (a missing, unknown or malformed param).
    """
    if runs.recorder.failure is not None:
        raise RequestError(
            "unavailable",
            f"the event store cannot write, so no tool call is recorded: {runs.recorder.failure}",
        )
    check = _intent_path._check_token(runs.tokens, run, params.get("token"))
    if check != TokenCheck.OK:
        reason = f"unauthorized: the capability token is {_intent_path._TOKEN_WORDS.get(check, check.value)}"
        name = params.get("name")
        note = {"name": name if isinstance(name, str) else None}
        await runs._record_intent(run, cell, "tool.record", redact(note), Decision("deny", None, reason))
        raise RequestError("unauthorized", f"{reason}; use the token in $STOCKADE_TOKEN")
    fields = parse_params(params)
    event = tool_call_event(run, cell, fields)
    try:
        stored = await runs.recorder.record_soon([event])
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


def _bad(problem: str) -> RequestError:
    return RequestError("bad_params", f"tool.record: {problem}")


__all__ = ["TOOL_CALL_ID", "check_tool_call_id", "parse_params", "record_tool_call", "tool_call_event"]
