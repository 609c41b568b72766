"""The whole exception tree of stockade.

A denial is never an exception: it is a result and an event. Exceptions are for
things that went wrong, and their class says whose fault it was and so what the
caller can do about it::

    StockadeError                 root; never raised itself
    ├── PolicyError               the user's policy file (or flags) are wrong: fix the file
    ├── HostError                 this host lacks a kernel feature the policy needs: see `stockade doctor`
    ├── CellError                 a cell could not be set up or run (a bug or a broken host)
    ├── DaemonError               the daemon is unreachable or broken
    ├── ProtocolError             a malformed message on a socket
    └── StoreError                the event store cannot write its file: full disk, read-only, corrupt

Every message is one sentence: what happened, the offending value, then the fix.
"""

from __future__ import annotations


class StockadeError(Exception):
    """Root of every error stockade raises on purpose."""

    #: The stable CLI exit code for this class of error (see docs/CLI.md).
    exit_code: int = 1


class PolicyError(StockadeError):
    """A policy file, or the flags that stand in for one, is wrong.

    ``location`` is ``file:line:col`` where the problem is, when known.
    """

    exit_code = 3

    def __init__(self, message: str, *, location: str | None = None) -> None:
        self.location = location
        self.message = message
        super().__init__(f"{location}: {message}" if location else message)


class HostError(StockadeError):
    """This host lacks a kernel feature that the policy needs.

    stockade never runs a cell with less protection than its policy asked for;
    ``stockade doctor`` explains what is missing and how to get it.
    """

    exit_code = 5

    def __init__(self, message: str, *, feature: str) -> None:
        self.feature = feature
        super().__init__(message)


class CellError(StockadeError):
    """A cell could not be set up: a step of the launch failed on this host."""

    exit_code = 5


class DaemonError(StockadeError):
    """The daemon is unreachable or answered with an internal error."""

    exit_code = 4


class ProtocolError(StockadeError):
    """A message on a socket was malformed, oversized or out of order."""

    exit_code = 5


class StoreError(StockadeError):
    """The event store cannot write (or read) its file: a full disk, a read-only
    file or filesystem, a corrupt file, a lock held by another process.

    Nothing was half-written: the events of the failed call were not stored and
    the chain is intact. stockade runs nothing it cannot record, so the daemon
    starts no run (and halts running ones) until the store can write again.
    ``path`` is the store's file.
    """

    exit_code = 5

    def __init__(self, message: str, *, path: str = "") -> None:
        self.path = path
        super().__init__(message)


__all__ = [
    "CellError",
    "DaemonError",
    "HostError",
    "PolicyError",
    "ProtocolError",
    "StockadeError",
    "StoreError",
]
