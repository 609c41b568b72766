"""The tripwire: a run that keeps getting denied is stopped.

An agent probing its limits (reading secrets one path after another, trying
commands until one passes) shows itself by its denials. The daemon keeps one
``Tripwire`` per run and records every final verdict; the denial that reaches
the limit trips it, the daemon halts the run (a ``run.halted`` event), and
every intent after that is refused. A tripwire never resets: a halted run
stays halted.

The daemon passes the limit (the policy's ``limits.denials``, 10 by default);
nothing here reads the policy.
"""

from __future__ import annotations

import threading

DEFAULT_LIMIT = 10


class Tripwire:
    """Counts one run's denials; trips at ``limit``. Thread-safe."""

    __slots__ = ("_halt_claimed", "_lock", "denials", "limit", "tripped")

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        """
        Raises:
            ValueError: ``limit`` is not a positive integer.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"tripwire limit {limit!r} is not a positive whole number; give one such as 10")
        self.limit = limit
        self.denials = 0
        """Denials recorded, those after the trip included."""
        self.tripped = False
        self._lock = threading.Lock()

    def record(self, verdict: str) -> bool:
        """Record the final verdict of one intent; return whether the run is now tripped.

        ``deny`` counts; ``allow`` and ``ask`` do not (an ``ask`` is recorded
        again once decided: a refused or expired approval is a ``deny``). The
        call that trips the wire returns True, and so does every call after
        it: the caller refuses the intent (and the broker halts the run).

        Raises:
            ValueError: ``verdict`` is not ``allow``, ``deny`` or ``ask``.
        """
        if verdict not in ("allow", "deny", "ask"):
            raise ValueError(f"verdict {verdict!r} is not one of 'allow', 'deny', 'ask'")
        with self._lock:
            if verdict == "deny":
                self.denials += 1
                if self.denials >= self.limit:
                    self.tripped = True
            return self.tripped

    def __repr__(self) -> str:
        return f"Tripwire(limit={self.limit}, denials={self.denials}, tripped={self.tripped})"


__all__ = ["DEFAULT_LIMIT", "Tripwire"]
