"""The event: one record of one decision or happening, from any layer.

Every layer writes the same shape, so that one store, one export and one live
stream serve them all. Version 1 of the model; docs/EVENTS.md documents it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

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


@dataclass(frozen=True)
class Event:
    """One record. ``detail`` holds what was tried, in the layer's own terms
    (``path``, ``port``, ``syscall``, ``blockers``…), never a secret."""

    kind: str
    """Dotted name: ``cell.start``, ``cell.end``, ``cell.denied``, ``cell.limit``…"""
    cell: str
    layer: Layer
    outcome: Outcome
    detail: dict[str, Any] = field(default_factory=dict)
    time: float = field(default_factory=time.time)
    summary: str = ""
    """One human sentence, e.g. ``write to /etc/passwd refused by landlock``."""
    run: str = ""
    """The run (under the daemon) this event belongs to; empty outside one."""

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
