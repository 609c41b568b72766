"""stockade_agent: ask the stockade broker for what your cell cannot do itself.

An agent contained by stockade reaches files outside its workspace, runs
commands, fetches URLs and asks its operator through the **broker**: a Unix
socket inside its cell (``$STOCKADE_BROKER``), where each request carries the
run's capability token (``$STOCKADE_TOKEN``). This module speaks that protocol
(docs/PROTOCOL.md) with one method per intent and typed results::

    from stockade_agent import Broker, Denied, tool

    broker = Broker.connect()
    text = broker.read("/srv/docs/readme.md").decode()
    try:
        broker.write("/srv/out/report.md", text)
    except Denied as exc:
        print("not allowed:", exc.reason)

    @tool
    def search_docs(query: str) -> list[str]:
        return [e.name for e in broker.list("/srv/docs") if query in e.name]

It is one file using only the standard library, written for Python 3.8 and
later, so that any Python in any cell can import it: stockade mounts it at
``/run/stockade/lib/stockade_agent.py`` and puts that directory on
``PYTHONPATH``. So: no ``match`` and no other 3.9+ syntax; the
annotations say ``X | None`` because ``from __future__ import annotations``
keeps them unevaluated, but nothing evaluated at run time (a base class, an
``isinstance``, a ``TypeVar`` bound) uses ``|`` or ``list[...]``.

What goes wrong is raised, every error a ``BrokerError`` with a ``code``::

    BrokerError              .code: the daemon's other codes (bad_params, unavailable…), protocol, timeout
    ├── NotInCell            not_in_cell    no $STOCKADE_BROKER / $STOCKADE_TOKEN here
    ├── Unreachable          unreachable    the socket cannot be reached, or broke mid-call
    ├── Unauthorized         unauthorized   the token is forged, expired or another run's
    ├── RunHalted            denied         the run's tripwire tripped: every intent is refused
    ├── Denied               deny           the policy (or the operator) said no to this intent
    ├── IntentFailed         not_found, exists, …   allowed, but it could not be done
    └── NoAnswer             no_answer      ask(): the operator gave no answer

A denial counts toward the run's tripwire: an agent that keeps trying what it
was denied halts its own run.
"""

from __future__ import annotations

import base64
import binascii
import contextvars
import functools
import inspect
import json
import os
import re
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, List, TypeVar, overload  # noqa: UP035 (List: see Listing)

__version__ = "1"
"""The protocol version this module speaks (the frames' ``v``)."""

PROTOCOL_VERSION = 1
MAX_FRAME = 24 * 1024 * 1024
"""The broker socket's frame limit (docs/DAEMON.md): a 16 MiB read travels as about 21.4 MiB."""
MAX_ID = 2**53 - 1
ENV_BROKER = "STOCKADE_BROKER"
ENV_TOKEN = "STOCKADE_TOKEN"
ENV_RUN = "STOCKADE_RUN"

ARG_STRING_MAX = 1000
"""Characters of one string argument of a tool kept in its ``tool.call`` event."""
ARG_ITEMS_MAX = 50
"""Items of one list or dict argument kept in its event."""
ARG_DEPTH_MAX = 6
ERROR_MAX = 1000
"""Characters of a failed tool's error kept in its event."""

_LENGTH = struct.Struct(">I")
_SUN_PATH_MAX = 107
_NOSIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)
"""A peer gone while sending is EPIPE, not SIGPIPE (a program embedding Python may not ignore it)."""
_F = TypeVar("_F", bound="Callable[..., Any]")  # a string: collections.abc.Callable[...] fails on 3.8


# --------------------------------------------------------------------------- errors


class BrokerError(Exception):
    """Something the broker, or the way to it, refused or failed; ``code`` says what.

    Besides its subclasses' codes, ``code`` is the daemon's own error code when
    it answered with one they do not cover (``bad_params``, ``unavailable``,
    ``too_large``, ``internal``…, docs/PROTOCOL.md), or ``protocol`` when its
    reply could not be understood.
    """

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(message)


class NotInCell(BrokerError):
    """``Broker.connect()`` outside a stockade cell: the variables are missing."""

    def __init__(self, message: str) -> None:
        super().__init__("not_in_cell", message)


class Unreachable(BrokerError):
    """The broker socket cannot be reached, or the connection broke during a call
    (the intent may or may not have been done then: it is never sent twice)."""

    def __init__(self, message: str) -> None:
        super().__init__("unreachable", message)


class Unauthorized(BrokerError):
    """The capability token is not this run's live token: forged, expired, another run's."""

    def __init__(self, message: str) -> None:
        super().__init__("unauthorized", message)


class RunHalted(BrokerError):
    """The run is halted (its tripwire tripped, or it ended): every intent is refused."""

    def __init__(self, message: str) -> None:
        super().__init__("denied", message)


class Denied(BrokerError):
    """The broker's verdict on this intent was ``deny``: a policy rule, no rule at
    all, the operator, or the broker's own checks (a hidden path, a link).

    ``rule`` is the deciding rule's id (``None`` when no rule matched), ``reason``
    the broker's sentence (for no matching rule, it names the rule that would
    allow the call), ``approval`` the approval's id when an operator decided,
    ``refused`` true when a rule allowed it and the broker's own checks (grants,
    hidden paths, links) refused it.
    """

    def __init__(
        self,
        intent: str,
        reason: str,
        rule: str | None = None,
        approval: str | None = None,
        *,
        refused: bool = False,
    ) -> None:
        self.intent = intent
        self.verdict = "deny"
        self.rule = rule
        self.reason = reason
        self.approval = approval
        self.refused = refused
        by = f"rule {rule!r}" if rule and not refused else "the broker"
        super().__init__("deny", f"{intent} was denied by {by}: {reason}")


class IntentFailed(BrokerError):
    """The intent was allowed but could not be done; ``code`` is the broker's
    (``not_found``, ``exists``, ``is_a_directory``, ``not_a_directory``,
    ``too_large``, ``io``, ``failed``, ``unavailable``; docs/BROKER.md)."""

    def __init__(self, intent: str, code: str, message: str) -> None:
        self.intent = intent
        super().__init__(code, f"{intent} failed ({code}): {message}")


class NoAnswer(BrokerError):
    """``ask()`` got no answer: the operator declined, or did not answer in time."""

    def __init__(self, question: str) -> None:
        self.question = question
        super().__init__(
            "no_answer",
            f"the operator gave no answer to {_short(question)} (declined or timed out); "
            "go on without it, or ask again later",
        )


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Entry:
    """One entry of a listing. ``type`` is ``file``, ``dir``, ``symlink`` or
    ``other``; a name that is not UTF-8 on disk comes as ``os.fsdecode`` gives it."""

    name: str
    type: str
    size: int


class Listing(List[Entry]):  # noqa: UP006 (a base class is evaluated: list[Entry] fails on 3.8)
    """The entries of a directory (a list), with ``path`` and whether the broker
    cut it at its limit of 10,000 entries (``truncated``)."""

    def __init__(self, entries: Sequence[Entry], path: str, truncated: bool) -> None:
        super().__init__(entries)
        self.path = path
        self.truncated = truncated


@dataclass(frozen=True)
class WriteResult:
    """What ``write`` did: the normalised ``path``, the ``bytes`` written, whether
    the file was ``created``, and the ``mode`` used."""

    path: str
    bytes: int
    created: bool
    mode: str


@dataclass(frozen=True)
class Message:
    """A message from another agent of the same group, by ``recv``."""

    sender: str
    """The sending run's id."""
    name: str
    """The sending run's name."""
    text: str
    time: float


@dataclass(frozen=True)
class ExecResult:
    """A command run by ``exec`` in a workbench cell of its own."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    limits_hit: tuple[str, ...] = ()
    denials: int = 0
    """How many times the workbench cell's kernel layers refused the command something."""
    duration: float = 0.0
    cell: str = ""
    session: str = ""
    """The workbench session it ran in (``exec(session=…)``), else empty."""

    @property
    def ok(self) -> bool:
        """The command exited 0 and was not stopped by its timeout."""
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True)
class FetchResponse:
    """The answer to ``fetch``: ``headers`` as (name, value) pairs in order
    (a name may repeat), ``url`` the final URL (after redirects, ``hops`` of
    them in all), ``truncated`` when the body was cut at the broker's limit."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes
    url: str
    truncated: bool = False
    hops: int = 0
    duration: float = 0.0

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (any case), or ``None``."""
        wanted = name.lower()
        for key, value in self.headers:
            if key.lower() == wanted:
                return value
        return None

    @property
    def text(self) -> str:
        """The body as text (UTF-8, undecodable bytes replaced)."""
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body)


@dataclass
class ToolCall:
    """One call of a tool, while it runs: its ``id`` (carried by every intent
    made during it), ``name`` and ``arguments``. Set ``result`` for the record
    (its size is recorded, never its content)."""

    id: str
    name: str
    arguments: dict[str, Any]
    result: Any = None
    started: float = field(default_factory=time.monotonic)


# The tool call in progress in this thread or task: its intents carry its id.
_CURRENT_CALL: contextvars.ContextVar[ToolCall | None] = contextvars.ContextVar(
    "stockade_tool_call", default=None
)


# --------------------------------------------------------------------------- the broker


class Broker:
    """A connection to the run's broker socket. One per process is enough.

    Thread-safe: calls from several threads take turns on the one connection
    (the broker answers one connection's intents in order; a thread that must
    not wait behind another's slow ``exec`` or ``ask`` opens a ``Broker`` of its
    own). The connection is opened at the first call; if it is found broken
    when a request is sent, it is opened again once and the request sent on
    the new one. The daemon closes a connection idle for 5 minutes, with a
    last push saying so and nothing of it read after: found before or after
    a request was sent, that too is a fresh connection and the request sent
    again. A reply lost to any other broken connection is an ``Unreachable``:
    the request is never sent twice, since the intent may have been done.

    ``timeout`` bounds each call in seconds; ``None`` (the default) waits as
    long as the broker takes, which for an intent that needs an operator's
    approval is up to the daemon's approval timeout (300 s by default).
    """

    def __init__(self, path: str, token: str, *, run: str = "", timeout: float | None = None) -> None:
        if not path:
            raise NotInCell("the broker socket path is empty; pass the path in $STOCKADE_BROKER")
        if not token:
            raise NotInCell("the capability token is empty; pass the token in $STOCKADE_TOKEN")
        self.path = path
        self.run = run
        self.timeout = timeout
        self._token = token
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._next_id = 0

    @classmethod
    def connect(cls, *, timeout: float | None = None) -> Broker:
        """The broker of the cell this process runs in, from ``$STOCKADE_BROKER``,
        ``$STOCKADE_TOKEN`` and ``$STOCKADE_RUN``.

        Raises:
            NotInCell: a variable is missing: this process is not in a stockade cell.
        """
        path = os.environ.get(ENV_BROKER, "")
        token = os.environ.get(ENV_TOKEN, "")
        missing = [name for name, value in ((ENV_BROKER, path), (ENV_TOKEN, token)) if not value]
        if missing and os.environ.get("STOCKADE_CELL"):
            # A cell of `stockade exec`: contained, but with no daemon, so no broker.
            raise NotInCell(
                f"${' and $'.join(missing)} {'is' if len(missing) == 1 else 'are'} not set: this cell "
                "was started by `stockade exec`, which has no broker (no daemon, no approvals); "
                "run the agent with `stockade run -f POLICY` to reach one"
            )
        if missing:
            raise NotInCell(
                f"${' and $'.join(missing)} {'is' if len(missing) == 1 else 'are'} not set, so this "
                "process is not in a stockade cell; run it with `stockade run`, or use "
                "Broker(path, token) with a run's socket and token"
            )
        return cls(path, token, run=os.environ.get(ENV_RUN, ""), timeout=timeout)

    def __repr__(self) -> str:
        # Never the token: it is the run's capability.
        return f"Broker(path={self.path!r}, run={self.run!r}, token=<hidden>)"

    def close(self) -> None:
        """Close the connection (a later call opens it again)."""
        with self._lock:
            self._drop()

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ intents

    def read(self, path: str, *, session: str | None = None) -> bytes:
        """The content of the file at ``path`` (absolute), at most 16 MiB.

        ``session``: read it inside that workbench session of this run (its
        view, as its user), as ``exec(session=…)`` runs a command there.

        Raises:
            Denied, IntentFailed (``not_found``, ``is_a_directory``, ``too_large``…),
            RunHalted, Unauthorized, Unreachable, BrokerError.
        """
        value = self._value("fs.read", {"path": path, **({"session": session} if session else {})})
        return _unblob(value, "fs.read")

    def write(
        self, path: str, data: bytes | str, *, mode: str = "create", session: str | None = None
    ) -> WriteResult:
        """Write ``data`` (bytes, or text as UTF-8) to the file at ``path``.

        ``mode``: ``create`` (the default: fails with ``exists`` if anything is
        there), ``overwrite`` or ``append`` (both create a missing file).
        ``session``: write it inside that workbench session of this run.

        Raises:
            Denied, IntentFailed (``exists``, ``not_found`` for a missing
            directory…), RunHalted, Unauthorized, Unreachable, BrokerError.
        """
        if isinstance(data, str):
            content, encoding = data, "utf-8"
            _check_text(data, "write: data")
        elif isinstance(data, (bytes, bytearray, memoryview)):
            content, encoding = _blob_args(bytes(data))
        else:
            raise TypeError(f"write() takes bytes or str data, not {type(data).__name__}; encode it first")
        args = {"path": path, "content": content, "mode": mode, "encoding": encoding}
        if session:
            args["session"] = session
        value = self._value("fs.write", args)
        return WriteResult(
            path=_field(value, "path", str, "fs.write"),
            bytes=_field(value, "bytes", int, "fs.write"),
            created=_field(value, "created", bool, "fs.write"),
            mode=_field(value, "mode", str, "fs.write"),
        )

    def list(self, path: str, *, session: str | None = None) -> Listing:
        """The entries of the directory at ``path`` (inside the workbench
        session ``session`` of this run, when given).

        Raises:
            Denied, IntentFailed (``not_found``, ``not_a_directory``…), RunHalted,
            Unauthorized, Unreachable, BrokerError.
        """
        value = self._value("fs.list", {"path": path, **({"session": session} if session else {})})
        entries = []
        for raw in _field(value, "entries", list, "fs.list"):
            if not isinstance(raw, dict):
                raise _protocol("fs.list", "an entry is not an object")
            name = _field(raw, "name", str, "fs.list")
            if raw.get("encoding") == "base64":
                name = os.fsdecode(_b64(name, "fs.list"))
            entries.append(
                Entry(
                    name=name,
                    type=_field(raw, "type", str, "fs.list"),
                    size=_field(raw, "size", int, "fs.list"),
                )
            )
        return Listing(entries, _field(value, "path", str, "fs.list"), bool(value.get("truncated", False)))

    def exec(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        session: str | None = None,
    ) -> ExecResult:
        """Run ``argv`` in a fresh workbench cell (no network, an empty workspace;
        docs/BROKER.md) and return its result, whatever its exit code.

        ``timeout``: seconds (the broker's default is 300, and never more than
        the run's limit). ``cwd``: an absolute path inside a grant (inside the
        session's view with ``session``). ``session``: the id of a workbench
        session the operator opened for this run (``session.open`` with
        ``run``, docs/SESSIONS.md): the command runs there, where the files
        and programs of earlier commands are still in place; a session of
        another run is refused (``Denied``).

        Raises:
            Denied, IntentFailed (``failed``: the workbench could not start),
            RunHalted, Unauthorized, Unreachable, BrokerError.
        """
        if isinstance(argv, str):
            raise TypeError(f"exec() takes a list of words, not the string {_short(argv)}; use shlex.split")
        args: dict[str, Any] = {"argv": [str(word) for word in argv]}
        if timeout is not None:
            args["timeout"] = float(timeout)
        if cwd is not None:
            args["cwd"] = cwd
        if session is not None:
            args["session"] = session
        value = self._value("exec", args)
        return ExecResult(
            exit_code=_field(value, "exit_code", int, "exec"),
            stdout=_unblob(_field(value, "stdout", dict, "exec"), "exec"),
            stderr=_unblob(_field(value, "stderr", dict, "exec"), "exec"),
            timed_out=bool(value.get("timed_out", False)),
            limits_hit=tuple(str(x) for x in value.get("limits_hit") or ()),
            denials=int(value.get("denials") or 0),
            duration=float(value.get("duration") or 0.0),
            cell=str(value.get("cell") or ""),
            session=str(value.get("session") or ""),
        )

    def ask(self, question: str) -> str:
        """Ask the operator ``question``; their answer. Waits until they answer.

        Raises:
            NoAnswer: they declined, or did not answer in time.
            Denied, IntentFailed (``unavailable``: nobody can answer), RunHalted,
            Unauthorized, Unreachable, BrokerError.
        """
        value = self._value("ask", {"question": question})
        answer = value.get("answer")
        if answer is None:
            raise NoAnswer(question)
        if not isinstance(answer, str):
            raise _protocol("ask", "'answer' is not a string")
        return answer

    def fetch(
        self,
        url: str,
        *,
        method: str = "GET",
        headers: Mapping[str, str] | None = None,
        body: bytes | str | None = None,
    ) -> FetchResponse:
        """An HTTP request made by the broker (the ``http.fetch`` intent), for a
        cell whose network does not reach ``url`` itself.

        ``method``: ``GET``, ``HEAD`` or ``POST``. ``body`` (bytes, or text as
        UTF-8) travels as text when it is UTF-8, else as base64.

        Raises:
            Denied, IntentFailed, RunHalted, Unauthorized, Unreachable, BrokerError.
        """
        args: dict[str, Any] = {"url": url, "method": method.upper()}
        if headers:
            args["headers"] = {str(k): str(v) for k, v in headers.items()}
        if body is not None:
            if isinstance(body, str):
                _check_text(body, "fetch: body")
                args["body"] = body
            else:
                content, encoding = _blob_args(bytes(body))
                args["body"] = content
                if encoding != "utf-8":
                    # Only named when needed, as fs.write names it: a text body
                    # is just a string.
                    args["encoding"] = encoding
        value = self._value("http.fetch", args)
        raw_headers = value.get("headers") or []
        pairs = []
        for item in raw_headers if isinstance(raw_headers, list) else []:
            if not (isinstance(item, (list, tuple)) and len(item) == 2):
                raise _protocol("http.fetch", "a header is not a [name, value] pair")
            pairs.append((str(item[0]), str(item[1])))
        # The body as fs.read carries a file (``content`` and ``encoding`` in the
        # value), or under ``body``: as a string (with the value's
        # ``encoding``) or as an object of its own, as exec's stdout.
        raw_body = value.get("body", value if "content" in value else None)
        if isinstance(raw_body, dict):
            data = _unblob(raw_body, "http.fetch")
        elif isinstance(raw_body, str):
            data = _unblob({"content": raw_body, "encoding": value.get("encoding", "utf-8")}, "http.fetch")
        else:
            data = b""
        return FetchResponse(
            status=_field(value, "status", int, "http.fetch"),
            headers=pairs,
            body=data,
            url=str(value.get("url") or url),
            truncated=bool(value.get("truncated", False)),
            hops=int(value.get("hops") or 0),
            duration=float(value.get("duration") or 0.0),
        )

    def spawn(self, policy: str, *, argv: Sequence[str] | None = None, name: str | None = None) -> str:
        """Start a helper agent under ``policy`` (YAML text), which may grant
        nothing this agent's policy does not; its run id (docs/AGENTS.md).

        Raises:
            Denied: a tools rule, or a grant of ``policy`` wider than this agent's
                (the reason names each one).
            RunHalted, Unauthorized, Unreachable, BrokerError.
        """
        args: dict[str, Any] = {"policy": policy}
        if argv is not None:
            args["argv"] = list(argv)
        if name is not None:
            args["name"] = name
        value = self._value("agent.spawn", args)
        return str(_field(value, "run", str, "agent.spawn"))

    def send(self, to: str, message: str) -> None:
        """Send ``message`` to the agent ``to`` (a run id or name: the parent, a
        helper, a sibling). Recorded by the broker.

        Raises:
            Denied: ``to`` is not of this agent's group, or a tools rule.
            IntentFailed: ``full`` (its mailbox is full), ``gone`` (it has ended).
        """
        self._value("agent.send", {"to": to, "message": message})

    def recv(self, timeout: float = 30.0) -> Message | None:
        """The next message for this agent, waiting up to ``timeout`` seconds
        (at most 300); ``None`` when none came."""
        value = self._value("agent.recv", {"timeout": timeout})
        if value.get("timeout"):
            return None
        return Message(
            sender=str(_field(value, "from", str, "agent.recv")),
            name=str(value.get("name") or ""),
            text=str(_field(value, "message", str, "agent.recv")),
            time=float(value.get("time") or 0.0),
        )

    def intent(self, name: str, args: Mapping[str, Any]) -> dict[str, Any]:
        """Any intent by name, with its arguments as the broker takes them
        (docs/BROKER.md); its value, as sent (a dict).

        Raises:
            Denied, IntentFailed, RunHalted, Unauthorized, Unreachable, BrokerError.
        """
        return self._value(name, dict(args))

    # ------------------------------------------------------------------ tools

    @overload
    def tool(self, fn: _F) -> _F: ...
    @overload
    def tool(self, fn: None = None, *, name: str | None = None) -> Callable[[_F], _F]: ...
    def tool(self, fn: _F | None = None, *, name: str | None = None) -> Any:
        """Decorate a function as one of the agent's tools: each call is recorded
        (``tool.record``) with its name, arguments, result size, duration and
        outcome, and the intents made during it carry its id. As ``@broker.tool``
        or ``@broker.tool(name="search")``; see the module's ``tool``."""
        return _decorate(fn, name=name, broker=lambda: self)

    def tool_call(
        self, name: str, arguments: Mapping[str, Any] | None = None, *, call_id: str | None = None
    ) -> _ToolCallScope:
        """A context manager that records one tool call, for a tool loop that
        dispatches calls itself: ``call_id`` may be the model's own id for the
        call (letters, digits and ``_.:-``, at most 128), so the record links it.
        Set ``.result`` on what it yields. An exception leaving the block is
        recorded as the call's error and goes on."""
        if call_id is not None and not _CALL_ID.match(call_id):
            raise ValueError(
                f"the tool call id {_short(call_id)} is not one the broker takes; give 1 to 128 "
                "letters, digits or '_.:-' (or none, and one is made)"
            )
        return _ToolCallScope(self, _tool_name(name), dict(arguments or {}), call_id)

    def record_tool(self, call: ToolCall, *, ok: bool, error: str, result_size: int) -> int:
        """Send one ``tool.record``; the event's sequence number in the record.

        Raises:
            Unauthorized, Unreachable, BrokerError (``bad_params``…): a contained
            agent never hides its tool calls, so a failed recording is an error.
        """
        result = self._call(
            "tool.record",
            {
                "name": call.name,
                "args": _jsonable(call.arguments, 0),
                "result_size": result_size,
                "duration": round(max(0.0, time.monotonic() - call.started), 6),
                "ok": ok,
                "error": error[:ERROR_MAX],
                "tool_call": call.id,
            },
        )
        return int(result.get("seq") or 0)

    # ------------------------------------------------------------------ the wire

    def _value(self, intent: str, args: dict[str, Any]) -> dict[str, Any]:
        """Send an intent; its value when allowed, else the right error."""
        params: dict[str, Any] = {"intent": intent, "args": args}
        current = _CURRENT_CALL.get()
        if current is not None:
            params["tool_call"] = current.id
        answer = self._call("intent", params)
        verdict = answer.get("verdict")
        value = answer.get("value")
        rule = answer.get("rule")
        if verdict == "deny":
            reason = str(answer.get("reason") or "no reason given")
            approval = answer.get("approval")
            error = value.get("error") if isinstance(value, dict) else None
            raise Denied(
                intent,
                reason,
                rule if isinstance(rule, str) else None,
                approval if isinstance(approval, str) else None,
                refused=isinstance(error, dict) and error.get("code") == "refused",
            )
        if verdict != "allow":
            raise _protocol(intent, f"the verdict {verdict!r} is not allow or deny")
        if not isinstance(value, dict):
            raise _protocol(intent, "an allowed intent came without a value")
        error = value.get("error")
        if isinstance(error, dict):
            raise IntentFailed(intent, str(error.get("code") or "failed"), str(error.get("message") or ""))
        return value

    def _call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """One request on the broker socket; its result.

        Raises:
            Unauthorized, RunHalted, Unreachable, BrokerError.
        """
        # Encoded before anything is sent: a request that cannot be is refused
        # whole, and the same bytes go out again on a fresh connection.
        encoded = _encode_params(method, {"token": self._token, **params})
        with self._lock:
            try:
                reply = self._exchange(method, encoded)
            except BaseException:
                # Failed or interrupted part-way (a KeyboardInterrupt in a read):
                # what is left on the connection is unknown, so it goes.
                self._drop()
                raise
        if reply.get("ok") is True:
            result = reply.get("result")
            if not isinstance(result, dict):
                raise _protocol(method, "a reply has no result object")
            return result
        error = reply.get("error")
        code = str(error.get("code") or "internal") if isinstance(error, dict) else "internal"
        message = str(error.get("message") or "") if isinstance(error, dict) else ""
        message = message or f"the broker refused {method} with {code}"
        if code == "unauthorized":
            raise Unauthorized(message)
        if code == "denied":
            raise RunHalted(message)
        raise BrokerError(code, message)

    def _exchange(self, method: str, encoded: bytes) -> dict[str, Any]:
        """Send one request and read its reply (under the lock)."""
        try:
            return self._send_and_read(method, encoded)
        except _ClosedIdle:
            # The daemon closed the connection as idle and read nothing after
            # its last push: the request was not done; once more, fresh.
            self._drop()
            return self._send_and_read(method, encoded)

    def _send_and_read(self, method: str, encoded: bytes) -> dict[str, Any]:
        if self._sock is not None and select.select([self._sock], [], [], 0)[0]:
            # Something came unasked: the daemon's last push before it closed
            # an idle connection (or its end). Not a connection to send on.
            self._drop()
        sock = self._ensure()
        self._next_id = self._next_id + 1 if self._next_id < MAX_ID else 1
        request_id = self._next_id
        try:
            sock.sendall(_frame(request_id, method, encoded), _NOSIGNAL)
        except OSError:
            # Broken before the request went out (the daemon restarted, or
            # closed an idle connection): nothing was done; once more on a
            # fresh connection.
            self._drop()
            sock = self._ensure()
            self._next_id = request_id = 1
            try:
                sock.sendall(_frame(request_id, method, encoded), _NOSIGNAL)
            except OSError as exc:
                raise Unreachable(
                    f"the broker at {self.path} took the connection but not the request "
                    f"({exc.strerror or exc}); the daemon may be stopping, try again later"
                ) from exc
        return self._read_reply(sock, request_id, method)

    def _ensure(self) -> socket.socket:
        if self._sock is not None:
            return self._sock
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            _connect(sock, self.path)
        except OSError as exc:
            sock.close()
            raise Unreachable(
                f"cannot connect to the broker at {self.path} ({exc.strerror or exc}); "
                "the run has ended or this is not its cell"
            ) from exc
        self._sock = sock
        self._next_id = 0
        return sock

    def _drop(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None

    def _read_reply(self, sock: socket.socket, request_id: int, method: str) -> dict[str, Any]:
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        closing = False
        while True:
            try:
                head = _recv_exact(sock, 4, deadline)
                (length,) = _LENGTH.unpack(head)
                if length > MAX_FRAME:
                    raise _protocol(method, f"a reply of {length} bytes is over the limit of {MAX_FRAME}")
                body = _recv_exact(sock, length, deadline)
            except socket.timeout as exc:  # noqa: UP041 (not TimeoutError before Python 3.10)
                self._drop()
                raise BrokerError(
                    "timeout",
                    f"the broker did not answer {method} within {self.timeout:g} s; the intent may still "
                    "be done: raise the Broker's timeout, or give none",
                ) from exc
            except (OSError, EOFError) as exc:
                self._drop()
                if closing:
                    raise _ClosedIdle from exc
                raise Unreachable(
                    f"the connection to the broker broke before it answered {method}, which may or may not "
                    "have been done; the run may have ended (a later call connects again)"
                ) from exc
            except BrokerError:
                self._drop()
                raise
            try:
                message = json.loads(body.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as exc:
                self._drop()
                raise _protocol(method, "a reply is not JSON") from exc
            if not isinstance(message, dict) or message.get("v") != PROTOCOL_VERSION:
                self._drop()
                raise _protocol(method, "a reply is not a protocol version 1 object")
            if "push" in message:
                # "closing": the daemon closes this idle connection, having read
                # nothing after it; the end of the connection follows.
                closing = closing or message.get("push") == "closing"
                continue
            if message.get("id") != request_id:
                if message.get("id") == 0 and message.get("ok") is False:
                    # The daemon could not read the request's id (a broken frame):
                    # this is the answer to it.
                    return message
                continue
            return message


class _ClosedIdle(Exception):
    """The daemon closed the connection as idle before it read the request."""


class _ToolCallScope:
    """``Broker.tool_call``'s context manager (also behind ``@tool``)."""

    def __init__(
        self,
        broker: Broker,
        name: str,
        arguments: dict[str, Any],
        call_id: str | None,
    ) -> None:
        self.call = ToolCall(id=call_id or _new_call_id(), name=name, arguments=arguments)
        self._broker = broker
        self._reset: contextvars.Token[ToolCall | None] | None = None

    def __enter__(self) -> ToolCall:
        self.call.started = time.monotonic()
        self._reset = _CURRENT_CALL.set(self.call)
        return self.call

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: object) -> None:
        self.leave()
        self.finish(exc)

    def leave(self) -> None:
        """Intents from here on are no longer this call's."""
        if self._reset is not None:
            _CURRENT_CALL.reset(self._reset)
            self._reset = None

    def finish(self, exc: BaseException | None) -> None:
        """Record the call. A failed recording raises from here, with the tool's
        own exception (if any) as its context: neither is lost."""
        if exc is None:
            self._broker.record_tool(self.call, ok=True, error="", result_size=_size(self.call.result))
        else:
            self._broker.record_tool(self.call, ok=False, error=f"{type(exc).__name__}: {exc}", result_size=0)


# --------------------------------------------------------------------------- the decorator


_DEFAULT: Broker | None = None
_DEFAULT_LOCK = threading.Lock()


def default_broker() -> Broker:
    """The process's shared ``Broker.connect()``, made at its first use.

    Raises:
        NotInCell: not in a stockade cell.
    """
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = Broker.connect()
        return _DEFAULT


@overload
def tool(fn: _F) -> _F: ...
@overload
def tool(fn: None = None, *, name: str | None = None) -> Callable[[_F], _F]: ...
def tool(fn: _F | None = None, *, name: str | None = None) -> Any:
    """Decorate a function as one of the agent's tools (``@tool`` or
    ``@tool(name="search")``), recorded through ``default_broker()``.

    Each call sends ``tool.record`` once it returns or raises: the tool's name,
    its arguments (by parameter name; long strings and containers cut, bytes as
    their size), the size of its result, its duration, and its error if it
    raised. Every intent made during the call, from the same thread or task,
    carries the call's id, so the record links the tool call to the verdicts it
    caused. A recording that fails raises (a contained agent does not hide its
    tool calls); the tool's own exception is its context. Coroutine functions
    are wrapped as coroutines (their recording runs in a worker thread);
    generator functions are refused.
    """
    return _decorate(fn, name=name, broker=default_broker)


def _decorate(fn: _F | None, *, name: str | None, broker: Callable[[], Broker]) -> Any:
    def wrap(func: _F) -> _F:
        if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
            raise TypeError(
                f"@tool cannot record the generator function {func.__qualname__}: its body runs after "
                "the call returns; make it return a list"
            )
        tool_name = _tool_name(name or func.__name__)
        signature = _signature(func)

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                import asyncio

                scope = broker().tool_call(tool_name, _arguments(signature, args, kwargs))
                call = scope.__enter__()
                failure: BaseException | None = None
                try:
                    call.result = await func(*args, **kwargs)
                except BaseException as exc:
                    failure = exc
                    raise
                finally:
                    scope.leave()
                    # The recording is a blocking call on the socket: off the loop.
                    await asyncio.get_running_loop().run_in_executor(None, scope.finish, failure)
                return call.result

            return run_async  # type: ignore[return-value]

        @functools.wraps(func)
        def run(*args: Any, **kwargs: Any) -> Any:
            with broker().tool_call(tool_name, _arguments(signature, args, kwargs)) as call:
                call.result = func(*args, **kwargs)
            return call.result

        return run  # type: ignore[return-value]

    if fn is not None:
        return wrap(fn)
    return wrap


def _signature(func: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(func)
    except (TypeError, ValueError):
        return None


def _arguments(
    signature: inspect.Signature | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> dict[str, Any]:
    """The call's arguments by parameter name (``self`` and ``cls`` left out)."""
    if signature is not None:
        try:
            bound = signature.bind_partial(*args, **kwargs)
        except TypeError:
            pass  # the call itself will fail the same way, and be recorded
        else:
            return {k: v for k, v in bound.arguments.items() if k not in ("self", "cls")}
    named: dict[str, Any] = {f"arg{i}": v for i, v in enumerate(args)}
    named.update(kwargs)
    return named


# --------------------------------------------------------------------------- helpers


_TOOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]{0,127}\Z")
_CALL_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}\Z")


def _tool_name(name: str) -> str:
    """``name``, if the broker takes it as a tool's name (it checks the same)."""
    if not isinstance(name, str) or not _TOOL_NAME.match(name):
        raise ValueError(
            f"the tool name {_short(str(name))} is not one the broker takes; give 1 to 128 letters, "
            "digits or '_.:-', starting with a letter or '_' (for a lambda: @tool(name=...))"
        )
    return name


def _new_call_id() -> str:
    return "tc-" + os.urandom(8).hex()


def _encode_params(method: str, params: dict[str, Any]) -> bytes:
    """``params`` as the JSON a frame carries (UTF-8, no NaN, no lone surrogate).

    Raises:
        BrokerError: ``bad_params`` (not JSON-able), ``too_large`` (over the frame limit).
    """
    try:
        body = json.dumps(params, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BrokerError(
            "bad_params",
            f"a string in the {method} request is not valid Unicode (a lone surrogate, as os.fsdecode "
            "makes of bytes that are not UTF-8); send such bytes as bytes, or fix the string",
        ) from exc
    except (TypeError, ValueError) as exc:
        raise BrokerError(
            "bad_params",
            f"the {method} request cannot be sent as JSON ({exc}); pass strings, numbers, lists and dicts",
        ) from exc
    if len(body) > MAX_FRAME - 100:
        raise BrokerError(
            "too_large",
            f"the {method} request is {len(body)} bytes, over the broker's limit of {MAX_FRAME}; "
            "write a large file in parts with mode='append'",
        )
    return body


def _frame(request_id: int, method: str, params: bytes) -> bytes:
    """One request frame around already encoded ``params`` (docs/PROTOCOL.md)."""
    head = f'{{"v":{PROTOCOL_VERSION},"id":{request_id},"method":{json.dumps(method)},"params":'
    body = head.encode("ascii") + params + b"}"
    return _LENGTH.pack(len(body)) + body


def _connect(sock: socket.socket, path: str) -> None:
    """Connect to ``path``; one longer than a socket address holds (107 bytes,
    as a run's socket under a deep state directory on the host) is reached
    through its directory's descriptor, as the daemon binds it."""
    if len(os.fsencode(path)) <= _SUN_PATH_MAX:
        sock.connect(path)
        return
    directory = os.open(os.path.dirname(path) or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        sock.connect(f"/proc/self/fd/{directory}/{os.path.basename(path)}")
    finally:
        os.close(directory)


def _recv_exact(sock: socket.socket, n: int, deadline: float | None) -> bytes:
    chunks = []
    left = n
    while left:
        if deadline is not None:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
        else:
            sock.settimeout(None)
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise EOFError("the broker closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _blob_args(data: bytes) -> tuple[str, str]:
    """Bytes for an intent's argument, as fs.write takes them: text when UTF-8, else base64."""
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), "base64"


def _check_text(text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BrokerError(
            "bad_params",
            f"{what} is not valid Unicode (it holds a lone surrogate); pass the bytes instead of a str",
        ) from None


def _unblob(value: Mapping[str, Any], intent: str) -> bytes:
    """Bytes from a value's ``content`` and ``encoding`` (text or base64)."""
    content = value.get("content")
    if not isinstance(content, str):
        raise _protocol(intent, "the value has no 'content' string")
    encoding = value.get("encoding", "utf-8")
    if encoding == "base64":
        return _b64(content, intent)
    if encoding == "utf-8":
        return content.encode("utf-8", "surrogatepass")
    raise _protocol(intent, f"the content's encoding {encoding!r} is not utf-8 or base64")


def _b64(text: str, intent: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _protocol(intent, "base64 content does not decode") from exc


def _field(value: Mapping[str, Any], key: str, kind: type, intent: str) -> Any:
    item = value.get(key)
    if kind is int and isinstance(item, bool):
        item = None
    if not isinstance(item, kind):
        raise _protocol(intent, f"the value's {key!r} is missing or not a {kind.__name__}")
    return item


def _protocol(what: str, problem: str) -> BrokerError:
    return BrokerError(
        "protocol",
        f"the broker's answer to {what} is malformed: {problem}; use the stockade_agent module "
        "the cell mounts (/run/stockade/lib), which matches its daemon",
    )


def _short(text: str, limit: int = 60) -> str:
    shown = repr(text)
    return shown if len(shown) <= limit else shown[: limit - 12] + "…" + shown[-10:]


def _jsonable(value: Any, depth: int) -> Any:
    """A JSON-able, bounded copy of a tool's argument for its event: strings cut
    at ``ARG_STRING_MAX``, containers at ``ARG_ITEMS_MAX`` items and
    ``ARG_DEPTH_MAX`` levels, bytes as their size, other objects as their repr."""
    if value is None or isinstance(value, bool) or (isinstance(value, int) and abs(value) < 2**63):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else repr(value)
    if isinstance(value, str):
        text = value.encode("utf-8", "replace").decode("utf-8")  # no lone surrogates on the wire
        if len(text) > ARG_STRING_MAX:
            return text[:ARG_STRING_MAX] + f"… [{len(text) - ARG_STRING_MAX} more characters]"
        return text
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"<{len(bytes(value))} bytes>"
    if depth >= ARG_DEPTH_MAX:
        return "[nested too deep]"
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for index, (key, item) in enumerate(value.items()):
            if index >= ARG_ITEMS_MAX:
                out["[more]"] = f"{len(value) - ARG_ITEMS_MAX} more keys"
                break
            out[str(_jsonable(str(key), ARG_DEPTH_MAX))] = _jsonable(item, depth + 1)
        return out
    if isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)
        kept = [_jsonable(item, depth + 1) for item in items[:ARG_ITEMS_MAX]]
        if len(items) > ARG_ITEMS_MAX:
            kept.append(f"[{len(items) - ARG_ITEMS_MAX} more items]")
        return kept
    return _jsonable(repr(value), depth)


def _size(result: Any) -> int:
    """A result's size for its event: bytes and text by their (UTF-8) length,
    anything else by the length of its JSON form (its repr when not JSON-able)."""
    if result is None:
        return 0
    if isinstance(result, (bytes, bytearray, memoryview)):
        return len(bytes(result))
    if isinstance(result, str):
        return len(result.encode("utf-8", "surrogatepass"))
    try:
        return len(json.dumps(result, ensure_ascii=False, default=repr).encode("utf-8", "surrogatepass"))
    except (TypeError, ValueError, RecursionError):
        return len(repr(result).encode("utf-8", "surrogatepass"))


def current_tool_call() -> ToolCall | None:
    """The tool call in progress in this thread or task, if any."""
    return _CURRENT_CALL.get()


__all__ = [
    "Broker",
    "BrokerError",
    "Denied",
    "Entry",
    "ExecResult",
    "FetchResponse",
    "IntentFailed",
    "Listing",
    "Message",
    "NoAnswer",
    "NotInCell",
    "RunHalted",
    "ToolCall",
    "Unauthorized",
    "Unreachable",
    "WriteResult",
    "current_tool_call",
    "default_broker",
    "tool",
]
