"""Intents: what an agent asks the broker to do for it, and doing it.

An intent is a name and a JSON object of arguments. The arguments are a trust
boundary (they come from the agent), so each intent's are a strict pydantic
model: unknown keys, wrong types, relative or oversized paths are an
``IntentError`` naming the argument, and nothing is done. The daemon decides
first (``Rules``, approvals, tripwire); ``IntentExecutor.execute`` only runs
an intent already allowed.

========== =================================================== ==============================
intent     arguments                                           value
========== =================================================== ==============================
fs.read    ``path, session?``                                  ``path, size, content, encoding``
fs.write   ``path, content, mode?, encoding?, session?``       ``path, bytes, created, mode``
fs.list    ``path, session?``                                  ``path, entries, truncated``
exec       ``argv, timeout?, cwd?, session?``                  ``exit_code, stdout, stderr, …``
ask        ``question``                                        ``answer``
agent.*    spawn ``policy, argv?, name?``; send ``to, message``; executed by the daemon
           recv ``timeout?``                                   (``daemon._agents``)
========== =================================================== ==============================

Bytes travel as text when they are valid UTF-8 (``encoding: "utf-8"``) and
as base64 otherwise, or when the text would be longer in JSON (``encoding:
"base64"``). An intent that was allowed but
could not be done returns ``{"error": {"code", "message"}}``; the code
``refused`` means the broker's own checks (grants, hidden paths, links)
refused it, which the daemon records and counts as a denial: inside the
broker that is a ``Refusal`` value (``_refusal``, ``IntentExecutor.outcome``),
told by its type; ``{"error": …}`` is only its wire form.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import math
import re
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from stockade.broker._fs import MAX_LIST, MAX_READ, MAX_WRITE, FileAccess, FsFailure
from stockade.broker._refusal import Refusal
from stockade.broker._rules import normalize_path
from stockade.errors import IntentError, StockadeError, UsageError
from stockade.policy._model import NetworkPolicy, Policy

if TYPE_CHECKING:
    from stockade.cell._cell import CellResult
    from stockade.cell._session import Session, SessionResult

MAX_PATH = 4096
MAX_ARGV = 4096
"""Words of an ``exec`` command line, at most."""
MAX_ARGV_BYTES = 256 * 1024
MAX_QUESTION = 4096
EXEC_TIMEOUT = 300.0
"""Seconds an ``exec`` may run when it names no timeout (the policy's limit may be lower)."""
EXEC_TIMEOUT_MAX = 3600.0
EXEC_OUTPUT_MAX = 1024 * 1024
"""Bytes of stdout + stderr an ``exec`` returns, at most (the policy's ``limits.output`` may be lower)."""

SECRET_KEYS = frozenset({"token", "secret", "password", "api_key"})
REDACTED = "[redacted]"
_REDACT_DEPTH = 16
_REDACT_ITEMS = 1000


# ------------------------------------------------------------------ arguments


def _abs_path(value: str) -> str:
    if "\x00" in value:
        raise ValueError("contains a NUL byte; name a real path")
    if not value.startswith("/"):
        raise ValueError("is not an absolute path; name it from '/', such as '/data/file.txt'")
    if len(value) > MAX_PATH:
        raise ValueError(f"is longer than {MAX_PATH} characters")
    return normalize_path(value)


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("contains a NUL byte, which cannot be passed to a program")
    return value


def _argv_size(value: list[str]) -> list[str]:
    if sum(len(word.encode("utf-8", "surrogatepass")) + 1 for word in value) > MAX_ARGV_BYTES:
        raise ValueError(f"is longer than {MAX_ARGV_BYTES // 1024} KiB in all")
    return value


AbsPath = Annotated[str, AfterValidator(_abs_path)]
Word = Annotated[str, AfterValidator(_no_nul)]


class _Args(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


SessionId = Annotated[str, Field(pattern=r"^s-[0-9a-f]{12}$")]
"""A workbench session of the same run (``session.open`` with ``run``): an
intent that names one is done there, in the session's view, as its user,
instead of on the host under the run's grants."""


class FsReadArgs(_Args):
    path: AbsPath
    session: SessionId | None = None


class FsListArgs(_Args):
    path: AbsPath
    session: SessionId | None = None


class FsWriteArgs(_Args):
    path: AbsPath
    session: SessionId | None = None
    content: Annotated[str, Field(max_length=MAX_WRITE * 4 // 3 + 4)]
    mode: Literal["create", "overwrite", "append"] = "create"
    encoding: Literal["utf-8", "base64"] = "utf-8"
    """How ``content`` holds the bytes to write: as text, or base64 for binary data."""

    def data(self) -> bytes:
        """The bytes to write.

        Raises:
            IntentError: ``content`` is not valid base64 (with ``encoding: base64``).
        """
        if self.encoding == "utf-8":
            return self.content.encode("utf-8", "surrogatepass")
        try:
            return base64.b64decode(self.content, validate=True)
        except (binascii.Error, ValueError):
            raise IntentError(
                "fs.write: 'content' is not valid base64; encode the bytes with standard base64, "
                "or send text with encoding 'utf-8'",
                field="content",
            ) from None


class ExecArgs(_Args):
    argv: Annotated[list[Word], Field(min_length=1, max_length=MAX_ARGV), AfterValidator(_argv_size)]
    timeout: Annotated[float, Field(gt=0, le=EXEC_TIMEOUT_MAX, allow_inf_nan=False)] | None = None
    cwd: AbsPath | None = None
    session: SessionId | None = None
    """A workbench session of the same run (``session.open`` with ``run``):
    the command runs there, where earlier commands' state lasts, instead of in
    a fresh cell."""


class AskArgs(_Args):
    question: Annotated[str, Field(min_length=1, max_length=MAX_QUESTION)]


MAX_URL = 8192
MAX_FETCH_BODY = 1 << 20
_HEADER_NAME = r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$"


def _header_values(value: dict[str, str]) -> dict[str, str]:
    if len(value) > 64:
        raise ValueError("at most 64 headers; send fewer")
    for name, text in value.items():
        if len(text) > 8192 or any(c in text for c in "\r\n\x00"):
            raise ValueError(f"the value of header {name!r} is too long or holds a line break or NUL; fix it")
    return value


class FetchArgs(_Args):
    """``http.fetch``: the broker fetches a URL under ``network.allow``."""

    url: Annotated[str, Field(min_length=1, max_length=MAX_URL), AfterValidator(_no_nul)]
    method: Literal["GET", "HEAD", "POST"] = "GET"
    headers: Annotated[
        dict[Annotated[str, Field(pattern=_HEADER_NAME)], str], AfterValidator(_header_values)
    ] = Field(default_factory=dict)
    body: Annotated[str, Field(max_length=MAX_FETCH_BODY * 4 // 3 + 4)] = ""
    encoding: Literal["utf-8", "base64"] = "utf-8"
    """How ``body`` holds the bytes to send: as text, or base64."""

    def data(self) -> bytes:
        """The body's bytes.

        Raises:
            IntentError: ``body`` is not valid base64 (with ``encoding: base64``).
        """
        if self.encoding == "utf-8":
            return self.body.encode("utf-8", "surrogatepass")
        try:
            return base64.b64decode(self.body, validate=True)
        except (binascii.Error, ValueError):
            raise IntentError(
                "http.fetch: 'body' is not valid base64; encode the bytes with standard base64, "
                "or send text with encoding 'utf-8'",
                field="body",
            ) from None


MAX_SPAWN_POLICY = 1 << 20
"""Characters of a helper's policy text (the policy loader's own bound)."""
MAX_MESSAGE = 64 * 1024
"""Bytes (UTF-8) of one ``agent.send`` message."""
RECV_TIMEOUT = 30.0
"""Seconds ``agent.recv`` waits when it names no timeout."""
RECV_TIMEOUT_MAX = 300.0


def _message_size(value: str) -> str:
    if len(value.encode("utf-8", "surrogatepass")) > MAX_MESSAGE:
        raise ValueError(f"is longer than {MAX_MESSAGE // 1024} KiB; send it in parts, or as a file")
    return value


class SpawnArgs(_Args):
    """``agent.spawn``: start a helper under ``policy`` (YAML text), which must grant
    nothing the spawning run's policy does not."""

    policy: Annotated[str, Field(min_length=1, max_length=MAX_SPAWN_POLICY), AfterValidator(_no_nul)]
    argv: (
        Annotated[list[Word], Field(min_length=1, max_length=MAX_ARGV), AfterValidator(_argv_size)] | None
    ) = None
    """The helper's command; the policy's ``command`` when left out."""
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")] | None = None
    """The helper run's name; the policy's ``name`` when left out."""


class SendArgs(_Args):
    """``agent.send``: a message to a run of the same family (parent, child, sibling)."""

    to: Annotated[str, Field(min_length=1, max_length=64)]
    message: Annotated[str, AfterValidator(_message_size)]


class RecvArgs(_Args):
    """``agent.recv``: the next message for this run, waiting up to ``timeout`` seconds."""

    timeout: Annotated[float, Field(ge=0, le=RECV_TIMEOUT_MAX, allow_inf_nan=False)] = RECV_TIMEOUT


IntentArgs = (
    FsReadArgs | FsWriteArgs | FsListArgs | ExecArgs | AskArgs | FetchArgs | SpawnArgs | SendArgs | RecvArgs
)

# ---------------------------------------------------------------------- the table

Runs = Literal["loop", "thread", "gateway", "daemon"]
"""Where the daemon executes an allowed intent: ``loop``, inline on its event
loop (bounded host file calls, cheaper than a hop to a thread); ``thread``, on
the workbench pool (a fresh cell, or a call into the run's session: seconds to
minutes); ``gateway``, the egress proxy's fetch (``daemon._network``);
``daemon``, the daemon's own state (runs, mailboxes, the operator's answer)."""
Decider = Literal["budget", "rules", "network.allow", "grants", "family", "human"]
"""Who may refuse an intent, in order: the family's event ``budget``; the
policy's ``rules`` (``tools``); ``network.allow`` (``http.fetch``, first); the
broker's own ``grants`` check (``filesystem``, hidden paths, links: a
refusal after the rules allowed it); the ``family`` bounds of ``agent.*``
(depth, helpers, subset); a ``human``, when a rule's verdict is ``ask``."""


@dataclass(frozen=True, slots=True)
class IntentSpec:
    """One intent: its arguments, where it runs, whether it changes anything, who decides."""

    name: str
    args: type[_Args] | None
    """The strict model of its arguments; ``None``: coming in a later version."""
    runs: Runs | None
    """Where it is executed (``Runs``); with a ``session`` argument it is ``thread``."""
    read_only: bool
    """Executing it changes nothing: the daemon may do it before its event is
    durable (never answer before)."""
    decided_by: tuple[Decider, ...]
    subject: str | None = None
    """The argument a suggested rule matches (``fs.read`` of ``path``)."""
    value: tuple[str, ...] = ()
    """The keys of its value when allowed and done (docs/BROKER.md)."""

    def runs_for(self, args: Mapping[str, object]) -> Runs | None:
        """Where it runs with these arguments: a ``session`` makes it a call
        into that session's cell, on a thread, never the loop."""
        return "thread" if args.get("session") is not None else self.runs


_ALWAYS: tuple[Decider, ...] = ("budget", "rules")
_FS_VALUE = ("path", "size", "content", "encoding")
TABLE: Mapping[str, IntentSpec] = types.MappingProxyType(
    {
        s.name: s
        for s in (
            IntentSpec("fs.read", FsReadArgs, "loop", True, (*_ALWAYS, "grants", "human"), "path", _FS_VALUE),
            IntentSpec(
                "fs.write",
                FsWriteArgs,
                "loop",
                False,
                (*_ALWAYS, "grants", "human"),
                "path",
                ("path", "bytes", "created", "mode"),
            ),
            IntentSpec(
                "fs.list",
                FsListArgs,
                "loop",
                True,
                (*_ALWAYS, "grants", "human"),
                "path",
                ("path", "entries", "truncated"),
            ),
            IntentSpec(
                "exec",
                ExecArgs,
                "thread",
                False,
                (*_ALWAYS, "grants", "human"),
                "argv",
                ("exit_code", "stdout", "stderr", "timed_out", "limits_hit", "duration"),
            ),
            IntentSpec("ask", AskArgs, "daemon", True, (*_ALWAYS, "human"), None, ("answer",)),
            IntentSpec(
                "http.fetch",
                FetchArgs,
                "gateway",
                False,
                ("budget", "network.allow", "rules", "human"),
                "url",
                ("status", "url", "headers", "content", "encoding", "truncated", "hops", "duration"),
            ),
            IntentSpec("llm.chat", None, None, False, _ALWAYS),
            IntentSpec(
                "agent.spawn",
                SpawnArgs,
                "daemon",
                False,
                (*_ALWAYS, "family", "human"),
                None,
                ("run", "name"),
            ),
            IntentSpec(
                "agent.send", SendArgs, "daemon", False, (*_ALWAYS, "family", "human"), "to", ("to", "size")
            ),
            IntentSpec(
                "agent.recv",
                RecvArgs,
                "daemon",
                False,
                (*_ALWAYS, "family", "human"),
                None,
                ("from", "name", "message", "time", "timeout"),
            ),
        )
    }
)
"""Every intent a policy may name, in the order the docs list them: the one
place their names, arguments, placement and deciders are written (the
daemon's dispatch, ``Rules``' suggestions and docs/BROKER.md read it or are
checked against it by tests/broker/test_table.py)."""

INTENTS = tuple(name for name, spec in TABLE.items() if spec.args is not None)
"""The intents this broker executes."""
COMING = tuple(name for name, spec in TABLE.items() if spec.args is None)
"""Intents a policy may already name, executed by a later version."""
READ_ONLY = frozenset(name for name, spec in TABLE.items() if spec.read_only and spec.runs == "loop")
"""Intents done on the loop that change nothing (``fs.read``, ``fs.list``)."""
_MODELS: dict[str, type[_Args]] = {name: spec.args for name, spec in TABLE.items() if spec.args is not None}


def _loc(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _problem(error: Mapping[str, Any], model: type[_Args]) -> str:
    kind = error["type"]
    where = _loc(tuple(error["loc"]))
    given = error.get("input")
    if kind == "missing":
        return f"'{where}' is missing; give it"
    if kind == "extra_forbidden":
        known = ", ".join(model.model_fields)
        return f"'{where}' is not one of its arguments; remove it (the arguments are: {known})"
    if kind == "value_error":
        message = str(error.get("ctx", {}).get("error", error["msg"]))
        return f"'{where}' {message}"
    if kind.endswith("_type"):
        return f"'{where}' must be {_expected(kind)}, not {_json_type(given)}"
    if kind == "literal_error":
        return f"'{where}' {_short(given)} is not valid; {error['msg'][0].lower()}{error['msg'][1:]}"
    return f"'{where}' {_short(given)} is not valid: {error['msg'][0].lower()}{error['msg'][1:]}"


def _expected(kind: str) -> str:
    return {
        "string_type": "a string",
        "float_type": "a number",
        "int_type": "a whole number",
        "list_type": "a list",
        "dict_type": "an object",
        "bool_type": "true or false",
        "model_type": "an object",
    }.get(kind, kind.removesuffix("_type"))


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:45] + "…" + text[-10:]


def parse_args(intent: str, args: object) -> IntentArgs:
    """Validate the arguments of ``intent``; the returned model has paths normalised.

    The daemon may call this before deciding, so that a malformed intent is
    answered ``bad_params`` and neither decided nor counted.

    Raises:
        IntentError: an unknown or coming intent (``bad_request``), or bad
            arguments (``bad_params``, naming the first bad one).
    """
    model = _MODELS.get(intent)
    if model is None:
        raise _unknown(intent)
    if type(args) is not dict and not isinstance(args, Mapping):  # the ABC check is slow
        raise IntentError(f"{intent}: the arguments must be an object, not {_json_type(args)}")
    try:
        return model.model_validate(dict(args))  # type: ignore[return-value]
    except ValidationError as exc:
        errors = exc.errors()
        first = errors[0]
        more = (
            f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
            if len(errors) > 1
            else ""
        )
        raise IntentError(
            f"{intent}: {_problem(first, model)}{more}", field=_loc(tuple(first["loc"])) or None
        ) from None


def _unknown(intent: object) -> IntentError:
    if intent in COMING:
        return IntentError(
            f"intent {intent!r} is coming in a later version of stockade; this broker executes "
            f"{', '.join(INTENTS)}",
            code="bad_request",
        )
    import difflib

    close = difflib.get_close_matches(str(intent), [*INTENTS, *COMING], n=1)
    fix = f"did you mean {close[0]!r}?" if close else f"the intents are {', '.join(INTENTS)}"
    return IntentError(f"{_short(intent)} is not an intent; {fix}", code="bad_request")


# -------------------------------------------------------------------- results


def blob(data: bytes) -> dict[str, object]:
    """Bytes for a JSON result: text when valid UTF-8, else base64.

    Text is kept only while its JSON form is no longer than base64 would be
    (a file of control characters escapes to six bytes each), so a value is
    never more than 4/3 of its bytes on the wire.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return {"content": base64.b64encode(data).decode("ascii"), "encoding": "base64"}
    size, base64_size = len(data), 4 * ((len(data) + 2) // 3)
    # Each character JSON escapes takes at most six bytes: counting them once
    # settles most texts (a line of fifteen characters or more per newline)
    # without counting each kind apart.
    at_most = size + 5 * len(_ESCAPABLE.findall(text))
    if at_most > base64_size and _json_escaped_size(text, size) > base64_size:
        return {"content": base64.b64encode(data).decode("ascii"), "encoding": "base64"}
    return {"content": text, "encoding": "utf-8"}


_ESCAPABLE = re.compile(r'["\\\x00-\x1f]')
"""Every character JSON escapes (``json.dumps(ensure_ascii=False)``)."""
_ESCAPED_SHORT = '"\\\n\r\t\b\f'
"""Characters JSON escapes in two bytes (``\\n``…)."""
_ESCAPED_LONG = re.compile("[\x00-\x07\x0b\x0e-\x1f]")
"""The other control characters, which JSON escapes in six bytes (``\\u0001``…)."""


def _json_escaped_size(text: str, size: int) -> int:
    """The bytes of ``text`` (``size`` in UTF-8) inside a JSON string, as
    ``json.dumps(text, ensure_ascii=False)`` writes it, without writing it."""
    extra = sum(text.count(c) for c in _ESCAPED_SHORT)
    return size + extra + 5 * len(_ESCAPED_LONG.findall(text))


def failure(code: str, message: str) -> dict[str, object]:
    return {"error": {"code": code, "message": message}}


def refusal(value: Mapping[str, object]) -> str | None:
    """The reason when an intent's value *on the wire* says the broker refused
    it, else ``None``: for clients and tests. The daemon tells a refusal by its
    type (``IntentExecutor.outcome`` gives a ``Refusal``), never by this."""
    error = value.get("error")
    if error is not None and isinstance(error, Mapping) and error.get("code") == "refused":
        return str(error.get("message", ""))
    return None


def redact(args: Mapping[str, object], *, limit: int = 4096) -> dict[str, object]:
    """A copy of ``args`` fit for an event or an approval.

    Values under keys named ``token``, ``secret``, ``password`` or ``api_key``
    (any case, ``-`` or ``_``) become ``"[redacted]"``, at any depth; strings
    longer than ``limit`` characters are shortened (saying by how much);
    containers are cut at 1,000 items and 16 levels. Secrets inside values
    (``--password=…`` in an argv) are not recognised.
    """
    result = _redact(args, limit, 0)
    assert isinstance(result, dict)
    return result


def _is_secret(key: str) -> bool:
    return key.lower().replace("-", "_") in SECRET_KEYS


def _redact(value: object, limit: int, depth: int) -> object:
    if depth > _REDACT_DEPTH:
        return "[nested too deep]"
    if type(value) is dict or isinstance(value, Mapping):  # the ABC check is slow
        out: dict[str, object] = {}
        for index, (key, item) in enumerate(value.items()):
            if index >= _REDACT_ITEMS:
                out["[more]"] = f"{len(value) - _REDACT_ITEMS} more keys"
                break
            name = str(key)
            out[name] = REDACTED if _is_secret(name) else _redact(item, limit, depth + 1)
        return out
    if isinstance(value, list | tuple):
        items = [_redact(item, limit, depth + 1) for item in value[:_REDACT_ITEMS]]
        if len(value) > _REDACT_ITEMS:
            items.append(f"[{len(value) - _REDACT_ITEMS} more items]")
        return items
    if isinstance(value, str):
        if len(value) > limit:
            return value[:limit] + f"… [{len(value) - limit} more characters]"
        return value
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return _redact(str(value), limit, depth)


# ------------------------------------------------------------------- executor

RunWorkbench = Callable[[list[str], Policy], "CellResult"]
SessionExec = Callable[[str, list[str], float, "str | None", int], "SessionResult | None"]
"""Runs ``argv`` in the run's session ``session`` with a timeout, a cwd and an
output cap; None when the run has no open session of that id."""
SessionFor = Callable[[str], "Session | None"]
"""The run's open session of that id (for ``fs.*`` with ``session``), or None
when it is not one bound to this run."""
Answer = Callable[[str], "str | None"]


class IntentExecutor:
    """Executes the allowed intents of one run."""

    def __init__(
        self,
        policy: Policy,
        *,
        workspace: str,
        run_workbench: RunWorkbench,
        answer: Answer | None = None,
        hidden: Sequence[str] = (),
        session_exec: SessionExec | None = None,
        session_for: SessionFor | None = None,
    ) -> None:
        """
        Args:
            policy: the run's policy.
            workspace: the run's workspace on the host.
            run_workbench: runs a command in a fresh cell under the given policy
                (``lambda argv, p: Cell(p, run_id=…).run(argv)`` plus recording
                its events); called by ``exec``.
            answer: asks the operator the ``ask`` intent's question and returns
                the answer, or ``None`` when none came in time; without it,
                ``ask`` fails as ``unavailable``.
            hidden: more host places never reachable by fs intents (the
                daemon's state directory).
            session_exec: runs an ``exec`` that names a ``session`` there
                (the daemon's, ``_sessions``); without it such an exec fails
                as ``unavailable``.
            session_for: the run's session of an id, for ``fs.*`` intents
                that name a ``session``; without it they fail as ``unavailable``.
        """
        self.policy = policy
        self.workspace = workspace
        self._run_workbench = run_workbench
        self._answer = answer
        self._session_exec = session_exec
        self._session_for = session_for
        self._files = FileAccess(policy, workspace=workspace, hidden=hidden)

    def grant_refusal(self, intent: str, args: Mapping[str, object]) -> str | None:
        """Why the grants refuse this fs intent, without touching the
        filesystem; None when they allow it (or it is not an fs intent, or
        its arguments are malformed: ``execute`` says so). The daemon asks it
        before putting an intent to a human: an approval the grants would
        refuse anyway is a question that can only waste the operator's time."""
        spec = TABLE.get(intent)
        if spec is None or "grants" not in spec.decided_by or spec.runs != "loop":
            return None
        try:
            parsed = parse_args(intent, args)
        except IntentError:
            return None
        path = getattr(parsed, "path", None)
        if not isinstance(path, str) or getattr(parsed, "session", None) is not None:
            return None  # in a session, its cell's own view decides
        refused = self._files.check(path, write=intent == "fs.write")
        return refused.message if refused is not None else None

    def execute(self, intent: str, args: Mapping[str, object]) -> dict[str, object]:
        """Execute ``intent``; return its JSON-serialisable value (a refusal in
        its wire form, ``{"error": {"code": "refused", …}}``).

        Raises:
            IntentError: the intent or its arguments are malformed (nothing was done).
        """
        return _wire(self.outcome(parse_args(intent, args)))

    def execute_parsed(self, parsed: IntentArgs) -> dict[str, object]:
        """``execute`` of arguments that ``parse_args`` already gave (the
        daemon's fast path validates them first: once is enough)."""
        return _wire(self.outcome(parsed))

    def outcome(self, parsed: IntentArgs) -> dict[str, object] | Refusal:
        """What executing ``parsed`` gave: its value, or the broker's
        ``Refusal`` (a denial the daemon records and counts, told by its type).

        Raises:
            IntentError: ``http.fetch`` and ``agent.*``, which the daemon executes.
        """
        if isinstance(parsed, FsReadArgs | FsWriteArgs | FsListArgs) and parsed.session is not None:
            return self._fs_in_session(parsed)
        try:
            if isinstance(parsed, FsReadArgs):
                data = self._files.read(parsed.path)
                if isinstance(data, Refusal):
                    return data
                return {"path": parsed.path, "size": len(data), **blob(data)}
            if isinstance(parsed, FsWriteArgs):
                data = parsed.data()
                created = self._files.write(parsed.path, data, parsed.mode)
                if isinstance(created, Refusal):
                    return created
                return {"path": parsed.path, "bytes": len(data), "created": created, "mode": parsed.mode}
            if isinstance(parsed, FsListArgs):
                listed = self._files.list(parsed.path)
                if isinstance(listed, Refusal):
                    return listed
                entries, truncated = listed
                return {
                    "path": parsed.path,
                    "entries": [_entry(e.name, e.type, e.size) for e in entries],
                    "truncated": truncated,
                }
        except FsFailure as exc:
            return failure(exc.code, exc.message)
        if isinstance(parsed, ExecArgs):
            return self._exec(parsed)
        if isinstance(parsed, FetchArgs):
            # Network I/O on the daemon's loop: the daemon executes it (daemon/_network).
            raise IntentError("http.fetch is executed by the daemon's gateway, not here", code="bad_request")
        if isinstance(parsed, SpawnArgs | SendArgs | RecvArgs):
            # Runs and mailboxes belong to the daemon: it executes these (daemon/_agents).
            name = {SpawnArgs: "agent.spawn", SendArgs: "agent.send", RecvArgs: "agent.recv"}[type(parsed)]
            raise IntentError(f"{name} is executed by the daemon, not here", code="bad_request")
        assert isinstance(parsed, AskArgs)
        return self._ask(parsed)

    def workbench_policy(self, args: ExecArgs) -> Policy:
        """The policy an ``exec`` runs under: the run's, with no network (loopback
        ports stay: they are the cell's own), a fresh workspace, no command, no
        tools and no LLM endpoint; its timeout and output cap bounded by the
        arguments, the run's limits and ``EXEC_TIMEOUT``/``EXEC_OUTPUT_MAX``."""
        policy = self.policy
        limits = policy.limits
        cap = min(limits.timeout or math.inf, EXEC_TIMEOUT_MAX)
        timeout = min(args.timeout if args.timeout is not None else EXEC_TIMEOUT, cap)
        output = min(limits.output or EXEC_OUTPUT_MAX, EXEC_OUTPUT_MAX)
        return dataclasses.replace(
            policy,
            command=(),
            workspace=None,
            workdir=args.cwd,
            network=NetworkPolicy(allow=(), loopback_ports=policy.network.loopback_ports),
            limits=dataclasses.replace(limits, timeout=timeout, output=output),
            tools=(),
            llm=None,
        )

    def _exec(self, args: ExecArgs) -> dict[str, object] | Refusal:
        if args.session is not None:
            return self._exec_in_session(args)
        if args.cwd is not None:
            refused = self._files.check(args.cwd, write=False)
            if refused is not None:
                return refused.within("cwd")
        policy = self.workbench_policy(args)
        try:
            result = self._run_workbench(list(args.argv), policy)
        except StockadeError as exc:
            return failure("failed", f"the workbench cell could not run: {exc}")
        return {
            "exit_code": result.exit_code,
            "stdout": blob(result.stdout),
            "stderr": blob(result.stderr),
            "timed_out": result.timed_out,
            "limits_hit": list(result.limits_hit),
            "denials": len(result.denials),
            "duration": round(result.duration, 6),
            "cell": result.cell_id,
        }

    def _exec_in_session(self, args: ExecArgs) -> dict[str, object] | Refusal:
        """``exec`` in the run's own workbench session. The session's cell
        has its own view (its policy, its workspace), so the cwd is checked
        there, not against this run's grants; a session that is not this
        run's is the broker's refusal (recorded, counted as a denial)."""
        assert args.session is not None
        if self._session_exec is None:
            return failure("unavailable", "this broker has no sessions; leave 'session' out for a fresh cell")
        limits = self.workbench_policy(args).limits
        timeout = limits.timeout if limits.timeout is not None else EXEC_TIMEOUT
        output = limits.output if limits.output is not None else EXEC_OUTPUT_MAX
        try:
            result = self._session_exec(args.session, list(args.argv), timeout, args.cwd, output)
        except StockadeError as exc:
            return failure("failed", f"the command could not run in session {args.session}: {exc}")
        if result is None:
            return Refusal(
                "session",
                f"session {args.session} is not an open session of this run; open one bound to it "
                "(session.open with run), or leave 'session' out for a fresh cell",
            )
        return {
            "exit_code": result.returncode,
            "stdout": blob(result.stdout),
            "stderr": blob(result.stderr),
            "timed_out": result.timed_out,
            "limits_hit": [
                n for n, hit in (("timeout", result.timed_out), ("output", result.truncated)) if hit
            ],
            "duration": round(result.duration, 6),
            "session": args.session,
            "call": result.call,
        }

    def _fs_in_session(self, args: FsReadArgs | FsWriteArgs | FsListArgs) -> dict[str, object] | Refusal:
        """An ``fs.*`` intent in the run's own workbench session, through the
        session's file calls: the file is opened inside the session's cell,
        as its user, so its view, permissions, Landlock and protected paths
        decide, and a layer's refusal is that layer's event (attributed to
        the call), not the broker's: it is not counted twice."""
        assert args.session is not None
        if self._session_for is None:
            return failure("unavailable", "this broker has no sessions; leave 'session' out")
        session = self._session_for(args.session)
        if session is None:
            return Refusal(
                "session",
                f"session {args.session} is not an open session of this run; open one bound to it "
                "(session.open with run), or leave 'session' out",
            )
        path = args.path
        where = f"{path} in session {args.session}"
        try:
            if isinstance(args, FsReadArgs):
                # Not blocking: a fifo the agent put there must not hold a daemon thread.
                data = session.read_file(path, limit=MAX_READ, block=False)
                return {"path": path, "size": len(data), **blob(data)}
            if isinstance(args, FsListArgs):
                entries, truncated = session.list_dir(path, limit=MAX_LIST)
                return {
                    "path": path,
                    "entries": [_entry(name, kind, size) for name, kind, size in entries],
                    "truncated": truncated,
                }
            data = args.data()
            if len(data) > MAX_WRITE:
                return failure("too_large", f"{len(data)} bytes is more than the 16 MiB fs.write limit")
            try:
                # O_EXCL first: a new file is made, and fs.write says whether it was.
                session.write_file(path, data, exist="fail", block=False)
                created = True
            except FileExistsError:
                if args.mode == "create":
                    raise
                session.write_file(
                    path, data, exist="append" if args.mode == "append" else "replace", block=False
                )
                created = False
            return {"path": path, "bytes": len(data), "created": created, "mode": args.mode}
        except FileNotFoundError:
            return failure("not_found", f"{where} does not exist (or its directory does not)")
        except FileExistsError:
            return failure("exists", f"{where} exists; write it with mode overwrite or append")
        except IsADirectoryError:
            return failure("is_a_directory", f"{where} is a directory")
        except NotADirectoryError:
            return failure("not_a_directory", f"{where}: a part of the path is not a directory")
        except PermissionError:
            return failure(
                "io",
                f"{where}: permission denied inside the session's cell (a layer's refusal is in the record)",
            )
        except OSError as exc:
            return failure("io", f"{where} failed: {exc.strerror}")
        except UsageError as exc:  # the file is over MAX_READ
            return failure("too_large", str(exc))
        except StockadeError as exc:  # CellError: the session's cell is gone
            return failure("failed", f"{where} could not be done: {exc}")

    def _ask(self, args: AskArgs) -> dict[str, object]:
        if self._answer is None:
            return failure("unavailable", "nobody is attached to answer questions for this run")
        answer = self._answer(args.question)
        return {"answer": answer}


def _wire(outcome: dict[str, object] | Refusal) -> dict[str, object]:
    return outcome.value() if isinstance(outcome, Refusal) else outcome


def _entry(name: str, kind: str, size: int) -> dict[str, object]:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # a name that is not UTF-8 on disk (os gives it surrogate-escaped)
        raw = name.encode("utf-8", "surrogateescape")
        return {
            "name": base64.b64encode(raw).decode("ascii"),
            "encoding": "base64",
            "type": kind,
            "size": size,
        }
    return {"name": name, "type": kind, "size": size}


__all__ = [
    "COMING",
    "EXEC_OUTPUT_MAX",
    "EXEC_TIMEOUT",
    "EXEC_TIMEOUT_MAX",
    "INTENTS",
    "READ_ONLY",
    "TABLE",
    "Answer",
    "AskArgs",
    "ExecArgs",
    "FsListArgs",
    "FsReadArgs",
    "FsWriteArgs",
    "IntentArgs",
    "IntentError",
    "IntentExecutor",
    "IntentSpec",
    "RecvArgs",
    "Refusal",
    "RunWorkbench",
    "SendArgs",
    "SpawnArgs",
    "blob",
    "failure",
    "parse_args",
    "redact",
    "refusal",
]
