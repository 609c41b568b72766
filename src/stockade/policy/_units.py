"""The grammar of a policy's values that the command line shares: sizes,
durations, CPU amounts, and how a message shows a value.

Its own module, free of pydantic, so that ``stockade exec --timeout 1m`` and the
click commands' ``--grace 10s``, ``--since 1d2h`` read durations exactly as a
policy's ``limits.timeout: 1h30m`` is read, without importing the policy models.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

MAX_DURATION = 366 * 86400.0
"""The longest duration a policy or flag may give (a year and a day). Longer is
no limit at all, and past ~292 years the kernel's and Python's clocks overflow
(``timeout: 100000000d`` used to pass validation, then fail every start)."""


_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def show(value: object) -> str:
    """A value as a message shows it: text quoted (control characters escaped,
    the middle of a long one left out), YAML words for the rest."""
    if isinstance(value, str):
        text = "".join(_ESCAPES.get(c, f"\\x{ord(c):02x}") if c < " " or c == "\x7f" else c for c in value)
        if len(text) > 80:
            text = text[:60] + "…" + text[-15:]
        return "'" + text.replace("'", "\\'") + "'"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return str(value)


_SIZE_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4, "p": 1024**5}
_SIZE = re.compile(r"^(\d+(?:\.\d+)?|\.\d+)\s*([kmgtp]?)(?:i?b|bytes?)?$", re.IGNORECASE)
SIZE_PATTERN = r"^(\d+(\.\d+)?|\.\d+) *([kKmMgGtTpP]?)([iI]?[bB]|[bB][yY][tT][eE][sS]?)?$"

_DURATION_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    "w": 7 * 86400.0,
}
_DURATION_PART = re.compile(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*(ns|us|µs|μs|ms|s|m|h|d|w)", re.IGNORECASE)
_NUMBER = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*$")
DURATION_PATTERN = r"^( *(\d+(\.\d+)?|\.\d+) *(ns|us|µs|μs|ms|s|m|h|d|w))+ *$|^ *(\d+(\.\d+)?|\.\d+) *$"


def parse_size(value: object) -> int:
    """Bytes from ``512``, ``'512M'``, ``'2G'``, ``'1.5GiB'``; units are powers of 1024.

    Raises:
        ValueError: not a size; the message says how to write one.
    """
    hint = "write a number of bytes or a number with a unit, such as '512M' or '2G'"
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{show(value)} is not a size; {hint}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{value} is negative; {hint}")
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or value < 0 or not value.is_integer():
            raise ValueError(f"{show(value)} is not a whole number of bytes; {hint}")
        return int(value)
    match = _SIZE.match(value.strip())
    if match is None:
        raise ValueError(f"{show(value)} is not a size; {hint}")
    number, unit = match.groups()
    return round(Fraction(number) * _SIZE_UNITS[unit.lower()])  # exact, even past 2**53


def parse_duration(value: object) -> float:
    """Seconds from ``30``, ``1.5``, ``'30s'``, ``'5m'``, ``'1h30m'``, ``'500ms'``, ``'2d'``.

    Units: ns, us (µs), ms, s, m, h, d, w, as in Go's ``time.ParseDuration``
    plus days and weeks; a bare number is seconds. The one grammar of durations:
    policies and every command's flags (``--timeout``, ``--grace``, ``--since``)
    read them here. At most ``MAX_DURATION``.

    Raises:
        ValueError: not a duration; the message says how to write one.
    """
    hint = "write a number of seconds or a number with a unit, such as '30s', '5m' or '1h'"
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{show(value)} is not a duration; {hint}")
    if isinstance(value, int | float):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{show(value)} is not a duration; {hint}")
        return _bounded(value, float(value))
    plain = _NUMBER.match(value)
    if plain is not None:
        return _bounded(value, float(plain.group(1)))
    total, end = 0.0, 0
    for part in _DURATION_PART.finditer(value):
        if part.start() != end:
            break
        total += float(part.group(1)) * _DURATION_UNITS[part.group(2).lower()]
        end = part.end()
    if end == 0 or value[end:].strip():
        raise ValueError(f"{show(value)} is not a duration; {hint}")
    return _bounded(value, total)


def _bounded(value: object, seconds: float) -> float:
    if seconds > MAX_DURATION:
        raise ValueError(
            f"{show(value)} is longer than {format_duration(MAX_DURATION)}, which is no limit at all; "
            "write a shorter duration, or leave the limit out"
        )
    return seconds


def parse_cpu(value: object) -> float:
    """Cores from ``2``, ``0.5``, ``'0.5'`` or a percentage of one core, ``'50%'``.

    Raises:
        ValueError: not a positive CPU amount.
    """
    hint = "write a number of cores such as 0.5 or 2, or a percentage of one core such as '50%'"
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{show(value)} is not a CPU amount; {hint}")
    if isinstance(value, str):
        text = value.strip()
        percent = text.endswith("%")
        match = _NUMBER.match(text[:-1] if percent else text)
        if match is None:
            raise ValueError(f"{show(value)} is not a CPU amount; {hint}")
        cores = float(match.group(1)) / (100 if percent else 1)
    else:
        cores = float(value)
    if not math.isfinite(cores) or cores <= 0:
        raise ValueError(f"{show(value)} is not more than zero; {hint}")
    return cores


def format_size(n: int) -> str:
    """``2147483648`` → ``'2 GiB'``; exact, so that it parses back to ``n``."""
    for unit, factor in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= factor and n % factor == 0:
            return f"{n // factor} {unit}"
    return f"{n} bytes"


def format_duration(seconds: float) -> str:
    """``5400`` → ``'1h30m'``; ``0.25`` → ``'250ms'``."""
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    whole = int(seconds)
    if whole != seconds:
        return f"{seconds:g}s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if whole >= size:
            parts.append(f"{whole // size}{unit}")
            whole %= size
    return "".join(parts)


__all__ = [
    "DURATION_PATTERN",
    "MAX_DURATION",
    "SIZE_PATTERN",
    "format_duration",
    "format_size",
    "parse_cpu",
    "parse_duration",
    "parse_size",
    "show",
]
