"""One run's data: who it is, what it was given, what it has done so far.

A ``Run`` is passive: the modules that serve it (``_runs`` starts and stops
it, ``_intent_path`` serves its intents, ``_agents`` its family, ``_network``
its gateway, ``_bus`` writes its events) all read and update it, and it
imports none of them. That is why it sits here, at the bottom of the
daemon's modules, with only the vocabulary of its states beside it: the
daemon's import graph has no circles (``tests/test_import_graph.py``).
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from stockade.broker._intents import IntentExecutor
from stockade.broker._rules import Rules
from stockade.broker._tripwire import Tripwire
from stockade.policy import Policy

if TYPE_CHECKING:
    from stockade.cell._cgroup import CellCgroup
    from stockade.gateway import Gateway
    from stockade.gateway._answers import GatewayHooks

RunState = Literal["running", "stopping", "halted", "ended", "failed", "lost"]
"""``halted``: ended by its tripwire or by a store failure; ``lost``: the
daemon died before the run ended (found so at the next start)."""

WORKBENCHES_PER_RUN = 4
"""``exec`` intents of one run that may hold a workbench cell at once."""


@dataclass(eq=False)
class Run:
    """One run: its identity, its cell's thread, its broker state. Mutated in the loop,
    except where a lock says otherwise."""

    id: str
    name: str
    policy: Policy
    argv: tuple[str, ...]
    workspace: str
    detach: bool
    unattended: bool
    created: float
    token: str = field(repr=False)
    token_expiry: float
    """When the token stops being valid (``time.time()``), a little before ``Tokens`` says so."""
    tripwire: Tripwire
    rules: Rules
    state: RunState = "running"
    executor: IntentExecutor | None = None
    exit_code: int | None = None
    ended: float | None = None
    error: str = ""
    halted: str = ""
    """Why the run was halted (tripwire, store failure); empty otherwise."""
    stopped_by: str = ""
    intents: int = 0
    requests: int = 0
    """Requests through the gateway (proxy and http.fetch hops), recorded."""
    denials: int = 0
    unattended_denials: int = 0
    transcript_bytes: int = 0
    transcript_truncated: bool = False
    cells: list[str] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    close_broker: Callable[[], None] | None = None
    gateway: Gateway | None = None
    hooks: GatewayHooks | None = None
    """What the run's gateway calls back into (``_network.RunHooks``)."""
    thread: threading.Thread | None = None
    # Shared with the cell's threads, under ``lock``:
    lock: threading.Lock = field(default_factory=threading.Lock)
    live: dict[str, int] = field(default_factory=dict)
    """Pidfds of the run's live cells (agent and workbenches), by cell id."""
    kill_requested: bool = False
    workbench_slots: threading.Semaphore = field(
        default_factory=lambda: threading.Semaphore(WORKBENCHES_PER_RUN)
    )
    parent: str = ""
    """The run that spawned this one (``agent.spawn``); empty for a run started by ``run.start``."""
    children: list[str] = field(default_factory=list)
    """The runs this one spawned, in order; stopping or halting this run stops them."""
    environ: dict[str, str] = field(default_factory=dict, repr=False)
    """The values of the policy's ``env.pass`` names this run was given: all its helpers may be given."""
    family_cgroup: CellCgroup | None = None
    """A root run's family cgroup (its limits), in which every cell of the
    family's runs is made: the kernel holds the whole family to the root's
    limits (``_runs``). None for a helper, or a root with no such limit."""

    @property
    def over(self) -> bool:
        return self.state in ("ended", "failed", "halted", "lost") and self.done.is_set()

    def info(self) -> dict[str, Any]:
        """What ``run.list`` and ``run.start`` answer, and ``run.json`` holds. Never the token."""
        return {
            "id": self.id,
            "name": self.name,
            "state": self.state,
            "policy": self.policy.source or f"<{self.policy.name}>",
            "argv": list(self.argv),
            "workspace": self.workspace,
            "detach": self.detach,
            "unattended": self.unattended,
            "created": self.created,
            "ended": self.ended,
            "exit_code": self.exit_code,
            "error": self.error,
            "halted": self.halted,
            "stopped_by": self.stopped_by,
            "intents": self.intents,
            "requests": self.requests,
            "denials": self.denials,
            "denial_limit": self.tripwire.limit,
            "unattended_denials": self.unattended_denials,
            "cells": list(self.cells),
            "parent": self.parent,
            "children": list(self.children),
            "transcript": {"bytes": self.transcript_bytes, "truncated": self.transcript_truncated},
        }

    # ------------------------------------------------------------ killing cells

    def signal_cells(self, sig: int) -> int:
        """Send ``sig`` to the pid 1 of each live cell of the run; return how many got it."""
        sent = 0
        with self.lock:
            if sig == signal.SIGKILL:
                self.kill_requested = True
            for pidfd in self.live.values():
                try:
                    signal.pidfd_send_signal(pidfd, sig)
                    sent += 1
                except ProcessLookupError:
                    pass
        return sent


__all__ = ["WORKBENCHES_PER_RUN", "Run", "RunState"]
