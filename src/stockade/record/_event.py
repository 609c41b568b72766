"""The event: one record of one decision or happening, from any layer.

Every layer writes the same shape, so that one store, one export and one live
stream serve them all. Version 1 of the model; docs/EVENTS.md documents it.
"""

from __future__ import annotations

from time import time as _now
from typing import Any, Literal

from stockade._slots import Frozen

EVENT_VERSION = 1

Layer = Literal[
    "cell", "landlock", "seccomp", "mount", "dac", "netns", "cgroup", "timeout", "broker", "gateway", "llm"
]
"""Which layer decided: the kernel ones (landlock, seccomp, mount = the
filesystem view, dac = file permissions, netns = the network namespace,
cgroup = resource limits, timeout = the wall clock) and the mediation ones
(broker, gateway)."""

Outcome = Literal["allowed", "denied", "audited", "info"]
"""``denied``: refused; ``audited``: would have been refused, let through
because the policy's mode is ``audit``; ``allowed``; ``info``: lifecycle."""


class Event(Frozen):
    """One record. ``detail`` holds what was tried, in the layer's own terms
    (``path``, ``port``, ``syscall``, ``blockers``…), never a secret.

    A frozen value class (``stockade._slots``; ``dataclasses.replace`` and
    ``asdict`` work on it): ``detail`` defaults to a new empty dict, ``time``
    to now."""

    _fields = ("kind", "cell", "layer", "outcome", "detail", "time", "summary", "run")
    __slots__ = _fields

    kind: str
    """Dotted name: ``cell.start``, ``cell.end``, ``cell.denied``, ``cell.limit``…"""
    cell: str
    layer: Layer
    outcome: Outcome
    detail: dict[str, Any]
    time: float
    summary: str
    """One human sentence, e.g. ``write to /etc/passwd refused by landlock``."""
    run: str
    """The run (under the daemon) this event belongs to; empty outside one."""

    def __init__(
        self,
        kind: str,
        cell: str,
        layer: Layer,
        outcome: Outcome,
        detail: dict[str, Any] | None = None,
        time: float | None = None,
        summary: str = "",
        run: str = "",
    ) -> None:
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "cell", cell)
        object.__setattr__(self, "layer", layer)
        object.__setattr__(self, "outcome", outcome)
        object.__setattr__(self, "detail", {} if detail is None else detail)
        object.__setattr__(self, "time", _now() if time is None else time)
        object.__setattr__(self, "summary", summary)
        object.__setattr__(self, "run", run)

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": EVENT_VERSION,
            "time": self.time,
            "kind": self.kind,
            "run": self.run,
            "cell": self.cell,
            "layer": self.layer,
            "outcome": self.outcome,
            "summary": self.summary,
            "detail": self.detail,
        }
