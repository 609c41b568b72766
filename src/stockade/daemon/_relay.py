"""The daemon's audit relay: started with the first run, told of every cell,
read back by the next daemon when this one was killed (``cell._audit_relay``
says why it is a process of its own)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from stockade.cell._attempts import Places
from stockade.cell._audit_relay import (
    KERNEL_LAYERS,
    RELAY_ENV,
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

RESTART_BACKOFF = 1.0
"""Seconds before a relay that failed to start is tried again (doubling, up to ``RESTART_BACKOFF_MAX``)."""
RESTART_BACKOFF_MAX = 30.0


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
    back: no refusal the kernel reported for these cells can be missing,
    outside ``gaps``."""
    dropped: int
    """Refusals past the per-cell cap, counted and not kept (by the relay)."""
    gaps: list[tuple[str, float, float]] = field(default_factory=list)
    """(cell, from, to): windows in which no relay watched a cell (its relay
    died, or none ran when it was launched). The daemon lived through them
    (it started the next relay), so its own reader recorded their refusals
    live; what it had not stored when it died is not known."""
    unjudged: int = 0
    """EXDEV refusals not kept: their cell's places were too big to send."""
    lost: list[str] = field(default_factory=list)
    """Why the relay's own reader lost records (``overrun``…), once per cell and reason."""


@dataclass
class _Told:
    """What the relay is told of one live cell, kept to tell a successor."""

    run: str
    cell: str
    session: int
    pid: int
    places: Places | None
    uncovered_since: float | None = None
    """Set while no relay watches the cell: when the last one was seen dead
    (or, for a cell launched with none, when it was launched)."""


class Relayed:
    """The daemon's relay, if this host has one: thread-safe, started lazily
    (``ensure``) so that a daemon that runs nothing starts nothing, and
    watched: a relay that dies is started again at once (``RESTART_BACKOFF``
    between failed starts) and told every live cell anew, with the window in
    which none watched it.

    ``STOCKADE_AUDIT_RELAY=off`` in the daemon's environment: no relay
    (benchmarks compare; ``error`` says so)."""

    def __init__(self, state: str) -> None:
        self._state = state
        self._lock = threading.Lock()
        self._relay: AuditRelay | None = None
        self._cells: dict[str, _Told] = {}
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None
        self.disabled = os.environ.get(RELAY_ENV) == "off"
        self.error: str = f"off ({RELAY_ENV}=off)" if self.disabled else ""
        """Why the relay could not start (a daemon kill would lose what was in flight)."""
        self.restarts = 0
        """Relays started again after one died while the daemon lived."""

    def ensure(self) -> None:
        """Start the relay if it is not running (from a worker thread: it takes ~0.2 s)."""
        if self.disabled:
            return
        with self._lock:
            if self._relay is not None and self._relay.alive():
                return
            self._start_locked()

    def _start_locked(self) -> bool:
        try:
            relay = AuditRelay.start(_paths.relay_lock_path(self._state))
        except (HostError, OSError) as exc:
            self._relay = None
            self.error = str(exc)
            _log().warning("%s", exc)
            return False
        self._relay, self.error = relay, ""
        # Tell it the cells alive now (none for a first relay): those a dead
        # one watched, and those launched while there was none.
        for told in self._cells.values():
            self._tell(relay, told)
        if self._watcher is None or not self._watcher.is_alive():
            self._watcher = threading.Thread(
                target=self._watch_relay, name="stockade-relay-watch", daemon=True
            )
            self._watcher.start()
        return True

    def _tell(self, relay: AuditRelay, told: _Told) -> None:
        spool = _paths.kernel_spool_path(self._state, told.run)
        if relay.watch(
            run=told.run,
            cell=told.cell,
            session=told.session,
            pid=told.pid,
            spool=spool,
            places=told.places,
            uncovered_since=told.uncovered_since,
        ):
            told.uncovered_since = None
        elif told.uncovered_since is None:
            told.uncovered_since = time.time()

    def _watch_relay(self) -> None:
        """Wait on the relay; when it dies and the daemon is not stopping, start another."""
        backoff = 0.0
        while True:
            relay = self._relay
            if relay is not None:
                relay.wait()  # returns when the relay process ends
            if self._stopping.wait(backoff):
                return
            with self._lock:
                if self._stopping.is_set():
                    return
                if self._relay is not None and self._relay is not relay and self._relay.alive():
                    backoff = 0.0  # ensure() started one meanwhile
                    continue
                seen_dead = time.time()
                for told in self._cells.values():
                    if told.uncovered_since is None:
                        told.uncovered_since = seen_dead
                _log().warning("the audit relay ended; starting another for %d live cells", len(self._cells))
                if self._start_locked():
                    self.restarts += 1
                    backoff = 0.0
                elif not self._cells:
                    self._watcher = None  # nothing to cover: the next run's ensure() tries again
                    return
                else:
                    backoff = min(max(backoff * 2, RESTART_BACKOFF), RESTART_BACKOFF_MAX)

    @property
    def pid(self) -> int | None:
        relay = self._relay
        return relay.pid if relay is not None and relay.alive() else None

    def watch(self, run: Run, cell: str, *, session: int, pid: int, places: Places | None = None) -> None:
        if self.disabled:
            return
        with self._lock:
            told = self._cells[cell] = _Told(run.id, cell, session, pid, places)
            relay = self._relay
            if relay is not None:
                self._tell(relay, told)
            else:
                told.uncovered_since = time.time()
        if told.uncovered_since is not None:
            _log().warning("no audit relay is running: cell %s of run %s is not relayed yet", cell, run.id)

    def unwatch(self, cell: str) -> None:
        with self._lock:
            self._cells.pop(cell, None)
            relay = self._relay
        if relay is not None:
            relay.unwatch(cell)

    def run_ended(self, run_id: str) -> None:
        """The run's end is stored, so is every refusal before it: its spool is not needed."""
        with contextlib.suppress(OSError, ValueError):
            os.unlink(_paths.kernel_spool_path(self._state, run_id))

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            relay, self._relay = self._relay, None
        if relay is not None:
            relay.stop()
        watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(5.0)


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
        complete=bool(spools)
        and all(s.ended and s.died and s.barrier and not s.lost for s in spools.values()),
        dropped=sum(s.dropped for s in spools.values()),
        gaps=sorted(((s.cell, a, b) for s in spools.values() for a, b in s.gaps), key=lambda g: g[1]),
        unjudged=sum(s.unjudged for s in spools.values()),
        lost=sorted({reason for s in spools.values() for reason in s.lost}),
    )
