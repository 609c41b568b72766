"""The daemon's spare file descriptors: a reserve that agents cannot take.

Every connection a cell makes to the daemon (its broker socket, its LLM
endpoint, its gateway) costs the daemon a descriptor. Past the process's limit
nothing opens any more: not the operator's ``status``, not a new run's cell,
not the store. So each listener a cell can reach refuses a new connection
once the descriptor it was given is within ``RESERVE`` of the soft limit
(``low``), while the control socket keeps accepting: the reserve is the
operator's and the daemon's own.

The check is one comparison: the kernel gives a new descriptor the lowest
free number (open(2), accept(2)), so a connection given number N means 0 to
N-1 are all taken.
"""

from __future__ import annotations

import resource

RESERVE = 256
"""Descriptors kept for the daemon and its operator (the control socket,
SQLite and its journal, a new run's cell and its listeners)."""
LOW_MESSAGE = (
    f"the daemon is within {RESERVE} descriptors of its limit, which it keeps for the operator "
    "and its own work; close connections"
)


def _soft_limit() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def low(fd: int) -> bool:
    """Whether a connection given descriptor ``fd`` eats into the reserve."""
    return fd >= _soft_limit() - RESERVE


__all__ = ["LOW_MESSAGE", "RESERVE", "low"]
