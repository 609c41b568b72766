"""The one table of stockade's exit codes (docs/CLI.md, "Exit codes").

Every command and every error class takes its code from here, and a test
compares this table with the one in docs/CLI.md, so that a script's ``case $?``
means the same under every command. A contained command's own exit code is
passed through by ``exec`` and ``run``; those are not listed.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """What a stockade command's exit status says."""

    OK = 0
    FAILED = 1
    USAGE = 2
    POLICY = 3
    DAEMON_UNREACHABLE = 4
    HOST = 5
    NOT_FOUND = 6
    UNANCHORED = 7
    DENIED = 126
    COMMAND_NOT_FOUND = 127
    INTERRUPTED = 130


MEANINGS: dict[ExitCode, str] = {
    ExitCode.OK: "success",
    ExitCode.FAILED: "the command did its work and the answer is no: `verify` found the chain "
    "broken, `revert` could not do a step, an approval was already decided",
    ExitCode.USAGE: "usage: an unknown flag, a missing or malformed value",
    ExitCode.POLICY: "the policy file is wrong or missing, or a value it needs is unset",
    ExitCode.DAEMON_UNREACHABLE: "the daemon is unreachable",
    ExitCode.HOST: "this host lacks a layer the policy needs, a cell could not be set up, "
    "or the daemon failed",
    ExitCode.NOT_FOUND: "not found: a run, approval, scenario, event store or report",
    ExitCode.UNANCHORED: "`verify`: the chain is intact but does not hold a head kept of it",
    ExitCode.DENIED: "denied by policy: the contained command may not be executed",
    ExitCode.COMMAND_NOT_FOUND: "the contained command was not found in the cell",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C)",
}
"""One line per code; docs/CLI.md says the same at more length."""


__all__ = ["MEANINGS", "ExitCode"]
