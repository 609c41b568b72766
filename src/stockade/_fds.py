"""The daemon's spare file descriptors: a reserve that agents cannot take.

Every connection a cell makes to the daemon (its broker socket, its LLM
endpoint, its gateway) costs the daemon a descriptor. Past the process's limit
nothing opens any more: not the operator's ``status``, not a new run's cell,
not the store. So each listener a cell can reach refuses a new connection
once the descriptor it was given is within ``RESERVE`` of the soft limit
(``low``), while the control socket keeps accepting: the reserve is the
operator's and the daemon's own.

The check counts. The kernel gives a new descriptor the lowest free number
(open(2), accept(2)), so a connection given number N proves 0 to N-1 taken,
and a number within the reserve is refused at once; but a number below it
says nothing of the descriptors above it (a burst of connections closed
leaves holes that new ones fill while thousands stay open higher up), so the
daemon's open descriptors are counted (``/proc/self/fd``) as well, at most
every ``RECOUNT`` seconds or ``RECOUNT_EVERY`` connections, and the count
decides. A recount of 1,000 descriptors takes about 0.3 ms; between recounts
a check is a comparison.
"""

from __future__ import annotations

import os
import resource
import threading
import time

RESERVE = 256
"""Descriptors kept for the daemon and its operator. Measured (2026-12-02,
a daemon on this host): a run's start holds 14-15 (its cell's pipes and
pidfds, its broker, gateway and LLM listeners, its transcript), the first
one 15 more (the audit reader and its relay's pipes, the store's journal),
the operator's client 1 a connection: 256 leave room to start about 15
runs and serve the operator while agents hold everything else."""
RECOUNT = 0.1
"""Seconds a count of the open descriptors is trusted."""
RECOUNT_EVERY = 1024
"""Connections checked on one count before it is taken again: a burst faster
than ``RECOUNT`` is counted again this often. With 26,000 descriptors open
(the flood of issue 12) a count takes ~8 ms, so a flood of 10,000
connections a second costs ~20 counts a second, not one per connection."""
LOW_MESSAGE = (
    f"the daemon is within {RESERVE} descriptors of its limit, which it keeps for the operator "
    "and its own work; close connections"
)


def _soft_limit() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


class _Count:
    """The daemon's open descriptors, counted now and then (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value = 0
        self._at = float("-inf")
        self._uses = 0

    def value(self) -> int:
        with self._lock:
            now = time.monotonic()
            if now - self._at >= RECOUNT or self._uses >= RECOUNT_EVERY:
                try:
                    self._value = len(os.listdir("/proc/self/fd")) - 1  # less listdir's own
                except OSError:
                    self._value = 0  # no /proc: the descriptor's number alone decides
                self._at, self._uses = now, 0
            self._uses += 1
            return self._value


_count = _Count()


def open_count() -> int:
    """The descriptors this process has open, as last counted (``RECOUNT``)."""
    return _count.value()


def low(fd: int) -> bool:
    """Whether a connection given descriptor ``fd`` eats into the reserve:
    its number is within it, or the count of open descriptors is."""
    bound = _soft_limit() - RESERVE
    return fd >= bound or _count.value() >= bound


__all__ = ["LOW_MESSAGE", "RECOUNT", "RECOUNT_EVERY", "RESERVE", "low", "open_count"]
