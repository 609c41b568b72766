"""One style for every error line of every command, and the flag types behind it.

Every line a command prints about a problem is ``stockade: <sentence>``: what
happened, the value, the fix. Usage mistakes end by naming the command's help
(``; see `stockade stop --help```), whichever parser found them: click's
messages are rewritten here (no ``Error:``, no ``Usage:`` block, no type names
such as "float range"), and ``exec``'s own parser uses ``usage_line`` too.

Durations on the command line use the policy's grammar (``policy._units``):
``--timeout 90``, ``--grace 10s``, ``--approval-timeout 5m``, ``--since 1d2h``.
"""

from __future__ import annotations

import re
import sys
from typing import Any

import click

PREFIX = "stockade: "

_JARGON: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^(.*) is not a valid (?:float|float range)\.?$"), r"\1 is not a number"),
    (re.compile(r"^(.*) is not a valid (?:integer|integer range)\.?$"), r"\1 is not a whole number"),
    (re.compile(r"^(.*) is not a valid boolean\.?$"), r"\1 is not yes or no (true, false, 1, 0)"),
    (re.compile(r"^(.*) is not one of (.*)\.$"), r"\1 is not one of \2"),
    (re.compile(r"^(.*) is not (.*)\.$"), r"\1 is not \2"),
)
_RANGE = re.compile(r"^(.*) is not in the range (.*)\.$")


def error_line(message: str) -> str:
    """``message`` as every command prints a problem."""
    return PREFIX + message


def usage_line(message: str, command: str) -> str:
    """A usage mistake: the sentence, then where the command's options are listed."""
    return f"{PREFIX}{message}; see `{command} --help`"


def echo_error(message: str) -> None:
    """Print ``message`` on stderr in the one style."""
    sys.stderr.write(error_line(message) + "\n")


def _range(text: str) -> str:
    # click writes "0<=x<=3600", "x>=0.001", "x<10": say it in words.
    low = re.match(r"^([-\d.e+]+)(<=?)x(?:(<=?)([-\d.e+]+))?$", text)
    if low:
        a, op1, op2, b = low.groups()
        if b is None:
            return f"at least {a}" if op1 == "<=" else f"more than {a}"
        return f"from {a} to {b}" if (op1, op2) == ("<=", "<=") else f"between {a} and {b}"
    high = re.match(r"^x(<=?|>=?)([-\d.e+]+)$", text)
    if high:
        op, a = high.groups()
        return {"<=": f"at most {a}", "<": f"less than {a}", ">=": f"at least {a}", ">": f"more than {a}"}[op]
    return text


def _plain(message: str) -> str:
    message = message.strip()
    found = _RANGE.match(message)
    if found:
        return f"{found.group(1)} is out of range: give {_range(found.group(2))}"
    for pattern, replacement in _JARGON:
        if pattern.match(message):
            return pattern.sub(replacement, message)
    return message.rstrip(".")


def _hint(exc: click.exceptions.BadParameter | click.exceptions.MissingParameter) -> str:
    if exc.param_hint is not None:
        hint: Any = exc.param_hint
    elif exc.param is not None:
        hint = exc.param.get_error_hint(exc.ctx)
    else:
        return ""
    names = hint if isinstance(hint, str) else "/".join(str(h) for h in hint)
    return names.replace("'", "").replace(" / ", "/")


def click_message(exc: click.ClickException) -> str:
    """Click's message for ``exc`` as a stockade sentence, without click's jargon."""
    if isinstance(exc, click.exceptions.MissingParameter):
        what = (
            "argument" if exc.param_type == "argument" or isinstance(exc.param, click.Argument) else "option"
        )
        hint = _hint(exc)
        return f"the {what} {hint} is missing; give it" if hint else "a value is missing"
    if isinstance(exc, click.exceptions.NoSuchOption):
        text = f"there is no option {exc.option_name}"
        if exc.possibilities:
            text += " (did you mean " + " or ".join(sorted(exc.possibilities)) + "?)"
        return text
    if isinstance(exc, click.exceptions.BadOptionUsage):
        return _plain(exc.message[:1].lower() + exc.message[1:])
    if isinstance(exc, click.exceptions.BadParameter):
        hint = _hint(exc)
        text = _plain(exc.message)
        return f"{hint} {text}" if hint else text
    if isinstance(exc, click.exceptions.UsageError):
        text = _plain(exc.message)
        # "No such command 'x'." / "Got unexpected extra argument (y)"
        found = re.match(r"^No such command '(.*)'\.?(.*)$", text)
        if found:
            more = found.group(2).strip()
            also = f" ({more[:1].lower()}{more[1:]})" if more else ""
            return f"there is no command {found.group(1)!r}{also}"
        return text[:1].lower() + text[1:]
    return _plain(exc.format_message())


def click_error_line(exc: click.ClickException) -> str:
    """The one line ``run_app`` prints for a click error."""
    message = click_message(exc)
    if isinstance(exc, click.UsageError):
        ctx = exc.ctx
        return usage_line(message, ctx.command_path if ctx is not None else "stockade")
    return error_line(message)


PIPED_WIDTH = 400
"""Columns when stdout is a file or a pipe: wide enough that nothing is cut
(rich's default of 80 cut `doctor > f` and `demo | less` with '…')."""


def console(**kwargs: Any) -> Any:
    """A rich ``Console`` that cuts nothing when its output is not a terminal
    (``$COLUMNS``, when set, still wins)."""
    import os

    from rich.console import Console

    made = Console(**kwargs)
    if not made.is_terminal and not os.environ.get("COLUMNS"):
        made.width = PIPED_WIDTH
    return made


class Duration(click.ParamType[float, Any]):
    """A duration flag in the policy's grammar (``90``, ``30s``, ``5m``, ``1h30m``),
    as seconds, with bounds said in words."""

    name = "duration"

    def __init__(self, *, minimum: float = 0.0, maximum: float | None = None, zero: bool = False) -> None:
        self.minimum = minimum
        self.maximum = maximum
        self.zero = zero

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "DURATION"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, float):
            return value
        from stockade.policy._units import format_duration, parse_duration, show

        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if seconds == 0 and self.zero:
            return seconds
        if seconds < self.minimum or (seconds == 0 and not self.zero):
            least = format_duration(self.minimum) if self.minimum else "more than 0s"
            self.fail(f"{show(value)} is too short; give {least} or more", param, ctx)
        if self.maximum is not None and seconds > self.maximum:
            self.fail(f"{show(value)} is too long; give at most {format_duration(self.maximum)}", param, ctx)
        return seconds


__all__ = [
    "PIPED_WIDTH",
    "PREFIX",
    "Duration",
    "click_error_line",
    "click_message",
    "console",
    "echo_error",
    "error_line",
    "usage_line",
]
