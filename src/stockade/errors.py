"""The whole exception tree of stockade.

A denial is never an exception: it is a result and an event. Exceptions are for
things that went wrong, and their class says whose fault it was and so what the
caller can do about it::

    StockadeError                 root; never raised itself
    ├── UsageError                a flag or argument of a command is malformed: fix the command line
    │   └── ReplayError           a file given to ``dashboard --replay`` is no bundle or export
    ├── PolicyError               the user's policy file (or flags) are wrong: fix the file
    │   └── TaskError             a benchmark task directory is wrong: every problem at once
    ├── HostError                 this host lacks a kernel feature the policy needs: see `stockade doctor`
    ├── CellError                 a cell could not be set up or run (a bug or a broken host)
    ├── DaemonError               the daemon is unreachable or broken
    ├── RemoteError               the daemon read a request and refused it (client side; ``code``)
    ├── RequestError              the daemon refuses a request (daemon side; ``code`` goes on the wire)
    ├── IntentError               an agent's intent is malformed: unknown, or with bad arguments
    ├── ApprovalError             an approval cannot be decided: not found, or decided already
    ├── ScenarioError             a scenario could not be run as asked
    │   └── ScenarioBusy          a scenario of that name is already running
    ├── NotFoundError             something named on the command line does not exist
    │   └── ScenarioNotFound      no scenario of that name has run here
    ├── ProtocolError             a malformed message on a socket
    ├── ImageError                an image, its tarball or its Dockerfile is wrong, or not in the store
    └── StoreError                the event store cannot write its file: full disk, read-only, corrupt

Every message is one sentence: what happened, the offending value, then the fix.
Each class carries its exit code (``stockade.exit_codes``, the one table of them)
and the wire protocol's error code (docs/PROTOCOL.md) a daemon answers with when
a request ends in it; ``wire_error`` is the one place that turns an exception
into that answer.
"""

from __future__ import annotations

from typing import Literal

from stockade.exit_codes import ExitCode


class StockadeError(Exception):
    """Root of every error stockade raises on purpose."""

    #: The stable CLI exit code for this class of error (``stockade.exit_codes``).
    exit_code: int = ExitCode.FAILED
    #: The wire protocol's error code a daemon answers a request with (docs/PROTOCOL.md).
    wire_code: str = "internal"


class UsageError(StockadeError):
    """A flag or argument of a command is malformed (``--timeout soon``)."""

    exit_code = ExitCode.USAGE
    wire_code = "bad_params"


class PolicyError(StockadeError):
    """A policy file, or the flags that stand in for one, is wrong.

    ``location`` is ``file:line:col`` where the problem is, when known.
    """

    exit_code = ExitCode.POLICY
    wire_code = "bad_params"

    def __init__(self, message: str, *, location: str | None = None) -> None:
        self.location = location
        self.message = message
        super().__init__(f"{location}: {message}" if location else message)


class ReplayError(UsageError):
    """A file given to ``stockade dashboard --replay`` is not a bundle or an export stockade wrote."""


class TaskError(PolicyError):
    """A benchmark task directory is wrong: every problem, each at ``file:line`` (exit 3)."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(problems) if len(problems) > 1 else problems[0])


class HostError(StockadeError):
    """This host lacks a kernel feature that the policy needs.

    stockade never runs a cell with less protection than its policy asked for;
    ``stockade doctor`` explains what is missing and how to get it.
    """

    exit_code = ExitCode.HOST

    def __init__(self, message: str, *, feature: str) -> None:
        self.feature = feature
        super().__init__(message)


class CellError(StockadeError):
    """A cell could not be set up: a step of the launch failed on this host."""

    exit_code = ExitCode.HOST


class DaemonError(StockadeError):
    """The daemon is unreachable or answered with an internal error."""

    exit_code = ExitCode.DAEMON_UNREACHABLE


_REMOTE_EXIT: dict[str, int] = {
    "bad_params": ExitCode.USAGE,
    "not_found": ExitCode.NOT_FOUND,
    "denied": ExitCode.DENIED,
}


class RemoteError(StockadeError):
    """The daemon read the request and refused it (what a client receives).

    ``code`` is the protocol's error code (docs/PROTOCOL.md: ``not_found``,
    ``conflict``, ``bad_params``, ``unauthorized``, ``denied``, ``unavailable``,
    ``internal``…), ``method`` the request's method, and the message the
    daemon's own sentence. ``exit_code`` follows the code: 2 for ``bad_params``,
    6 for ``not_found``, 126 for ``denied``, 5 (a daemon error) for the
    rest.
    """

    def __init__(self, message: str, *, code: str, method: str) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.wire_code = code
        self.method = method
        self.exit_code = _REMOTE_EXIT.get(code, ExitCode.HOST)


class RequestError(StockadeError):
    """A request the daemon refuses; ``code`` is the wire protocol's error code."""

    exit_code = ExitCode.HOST

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        self.wire_code = code
        super().__init__(message)


class IntentError(StockadeError):
    """The agent's intent was malformed: unknown, or with bad arguments.

    ``code`` is the wire error code the daemon answers with (``bad_params``
    for arguments, ``bad_request`` for an unknown or not-yet-supported
    intent); ``field`` names the offending argument when there is one.
    """

    exit_code = ExitCode.USAGE

    def __init__(
        self,
        message: str,
        *,
        code: Literal["bad_params", "bad_request"] = "bad_params",
        field: str | None = None,
    ) -> None:
        self.code = code
        self.wire_code = code
        self.field = field
        super().__init__(message)


class ApprovalError(StockadeError):
    """A decision the approvals cannot take: ``code`` is ``not_found`` or ``conflict``
    (the wire protocol's error codes of the same names)."""

    exit_code = ExitCode.NOT_FOUND

    def __init__(self, message: str, *, code: Literal["not_found", "conflict"]) -> None:
        self.code = code
        self.wire_code = code
        if code == "conflict":
            self.exit_code = ExitCode.FAILED
        super().__init__(message)


class ScenarioError(StockadeError):
    """A scenario could not be run as asked (a daemon or host error, exit 5)."""

    exit_code = ExitCode.HOST


class ScenarioBusy(ScenarioError):
    """A scenario of that name is already running."""

    wire_code = "conflict"


class NotFoundError(StockadeError):
    """Something named on the command line (a run, a report, a file) does not exist."""

    exit_code = ExitCode.NOT_FOUND
    wire_code = "not_found"


class ScenarioNotFound(NotFoundError):
    """No scenario of that name has run under this state directory."""


class ProtocolError(StockadeError):
    """A message on a socket was malformed, oversized or out of order."""

    exit_code = ExitCode.HOST


class ImageError(StockadeError):
    """An image cannot be imported, built or found: a malformed tarball or
    Dockerfile (exit 3, like a bad policy), a ref the store does not hold
    (exit 6, not found), or a build step that failed (exit 1).

    ``location`` is ``file:line`` of a Dockerfile's offending instruction, when known.
    """

    exit_code: int = ExitCode.POLICY
    wire_code = "bad_params"

    def __init__(self, message: str, *, location: str | None = None, exit_code: int | None = None) -> None:
        self.location = location
        self.message = message
        if exit_code is not None:
            self.exit_code = exit_code
            # A daemon answering with it (an image: REF of a session) says the same.
            wire: dict[int, str] = {ExitCode.NOT_FOUND: "not_found", ExitCode.FAILED: "conflict"}
            self.wire_code = wire.get(exit_code, "bad_params")
        super().__init__(f"{location}: {message}" if location else message)


class StoreError(StockadeError):
    """The event store cannot write (or read) its file: a full disk, a read-only
    file or filesystem, a corrupt file, a lock held by another process.

    Nothing was half-written: the events of the failed call were not stored and
    the chain is intact. stockade runs nothing it cannot record, so the daemon
    starts no run (and halts running ones) until the store can write again.
    ``path`` is the store's file.
    """

    exit_code = ExitCode.HOST
    wire_code = "unavailable"

    def __init__(self, message: str, *, path: str = "") -> None:
        self.path = path
        super().__init__(message)


def wire_error(exc: BaseException) -> tuple[str, str]:
    """The wire protocol's ``(code, message)`` for a request that ended in ``exc``.

    The one place that turns an exception into a daemon's error answer: a
    stockade error answers with its class's (or instance's) ``wire_code`` and its
    own sentence; anything else is a bug, answered ``internal`` with its repr.
    """
    if isinstance(exc, StoreError):
        return "unavailable", f"the event store cannot write: {exc}"
    if isinstance(exc, StockadeError):
        return exc.wire_code, str(exc)
    return "internal", f"the daemon failed: {exc!r}"


__all__ = [
    "ApprovalError",
    "CellError",
    "DaemonError",
    "HostError",
    "ImageError",
    "IntentError",
    "NotFoundError",
    "PolicyError",
    "ProtocolError",
    "RemoteError",
    "ReplayError",
    "RequestError",
    "ScenarioBusy",
    "ScenarioError",
    "ScenarioNotFound",
    "StockadeError",
    "StoreError",
    "TaskError",
    "UsageError",
    "wire_error",
]
