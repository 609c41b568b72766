"""The daemon's audit relay: started with the first run, told of every cell,
read back by the next daemon when this one was killed (``cell._audit_relay``
says why it is a process of its own)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stockade.cell._audit_relay import (
    KERNEL_LAYERS,
    AuditRelay,
    CellSpool,
    missing,
    read_spool,
    wait_for_relay,
)
from stockade.daemon import _paths
from stockade.daemon._run import Run
from stockade.errors import HostError
from stockade.record import Event

if TYPE_CHECKING:
    import logging


def _log() -> logging.Logger:
    import logging  # only when something goes wrong

    return logging.getLogger(__name__)


@dataclass(frozen=True)
class Recovered:
    """What a restarted daemon learnt from the relay of one lost run."""

    events: list[Event]
    """The relay's refusals that the store did not hold, to record now."""
    kept: int
    """Kernel refusals of the run the store already held."""
    cells: int
    """Cells the relay watched for the run (0: no spool)."""
    complete: bool
    """The relay outlived the daemon, saw every cell die and its barrier came
    back: no refusal the kernel reported for these cells can be missing."""
    dropped: int
    """Refusals past the per-cell cap, counted and not kept (by the relay)."""


class Relayed:
    """The daemon's relay, if this host has one: thread-safe, started lazily
    (``ensure``) so that a daemon that runs nothing starts nothing."""

    def __init__(self, state: str) -> None:
        self._state = state
        self._lock = threading.Lock()
        self._relay: AuditRelay | None = None
        self.error: str = ""
        """Why the relay could not start (a daemon kill would lose what was in flight)."""

    def ensure(self) -> None:
        """Start the relay if it is not running (from a worker thread: it takes ~0.2 s)."""
        with self._lock:
            if self._relay is not None and self._relay.alive():
                return
            try:
                self._relay = AuditRelay.start(_paths.relay_lock_path(self._state))
                self.error = ""
            except (HostError, OSError) as exc:
                self._relay = None
                self.error = str(exc)
                _log().warning("%s", exc)

    @property
    def pid(self) -> int | None:
        relay = self._relay
        return relay.pid if relay is not None and relay.alive() else None

    def watch(self, run: Run, cell: str, *, session: int, pid: int) -> None:
        relay = self._relay
        spool = _paths.kernel_spool_path(self._state, run.id)
        if relay is None or not relay.watch(run=run.id, cell=cell, session=session, pid=pid, spool=spool):
            _log().warning("the audit relay is not running: cell %s of run %s has no spool", cell, run.id)

    def unwatch(self, cell: str) -> None:
        relay = self._relay
        if relay is not None:
            relay.unwatch(cell)

    def run_ended(self, run_id: str) -> None:
        """The run's end is stored, so is every refusal before it: its spool is not needed."""
        with contextlib.suppress(OSError, ValueError):
            os.unlink(_paths.kernel_spool_path(self._state, run_id))

    def stop(self) -> None:
        with self._lock:
            relay, self._relay = self._relay, None
        if relay is not None:
            relay.stop()


def wait_for_previous(state: str) -> bool:
    """Wait for the relay of a daemon that died to finish draining; False if it did not in time."""
    return wait_for_relay(_paths.relay_lock_path(state))


def recover(state: str, run_id: str, stored: Iterable[Event]) -> Recovered:
    """What the spool of a lost run holds that the store does not."""
    spools: dict[str, CellSpool] = read_spool(_paths.kernel_spool_path(state, run_id))
    kernel = [e for e in stored if e.layer in KERNEL_LAYERS and e.kind in ("cell.denied", "cell.audited")]
    spooled = [e for spool in spools.values() for e in spool.events]
    new = missing(spooled, kernel)
    # The recovered events belong to the run (the relay's carry no run id).
    new = [dataclasses.replace(e, run=run_id) for e in new]
    return Recovered(
        events=new,
        kept=len(kernel),
        cells=len(spools),
        complete=bool(spools) and all(s.ended and s.died and s.barrier for s in spools.values()),
        dropped=sum(s.dropped for s in spools.values()),
    )
