"""Where the daemon keeps its state and listens (docs/DAEMON.md).

State directory: ``--state DIR``, else ``$STOCKADE_STATE``, else
``/var/lib/stockade`` for root or ``$XDG_STATE_HOME/stockade`` (by default
``~/.local/state/stockade``) for anyone else. Control socket: ``--socket PATH``,
else ``$STOCKADE_SOCKET``, else ``<state>/daemon.sock``. In the state
directory:

```
events.db                 the event store (SQLite, WAL)
events.db.journal         its journal: acknowledged events before SQLite has them (32 MiB)
daemon.sock               the control socket (0600)
runs/<id>/run.json        what the run is, and how it ended
runs/<id>/transcript.log  the agent's stdout and stderr, capped
runs/<id>/broker.sock     the run's broker socket, while it runs
runs/<id>/kernel.spool    the audit relay's copy of its kernel refusals, until its run.end is stored
audit-relay.lock          held by the audit relay while it lives (its pid)
persistence/<cell>/       a cell's persistence report and pre-run bytes, for `stockade revert`
daemon.lock               held by the daemon using this directory
store-error.json          a store failure not yet recorded (it is, once the store writes)
```

Pure: nothing here touches the filesystem.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

ROOT_STATE = "/var/lib/stockade"
BROKER_IN_CELL = "/run/stockade/broker.sock"
"""Where a run's broker socket appears inside its cell (``$STOCKADE_BROKER``)."""
SOCKET_NAME = "daemon.sock"
STORE_NAME = "events.db"
RUNS_NAME = "runs"
RUN_ID = re.compile(r"^r-[0-9a-f]{12}$")
"""A run's id: ``r-`` and 12 hex digits."""
MAX_SUN_PATH = 107
"""sockaddr_un.sun_path holds 108 bytes, the last a NUL (unix(7))."""


def state_dir(flag: str | None = None, *, environ: Mapping[str, str] | None = None) -> str:
    """The state directory, absolute: the flag, ``$STOCKADE_STATE``, or the default."""
    env = os.environ if environ is None else environ
    chosen = flag or env.get("STOCKADE_STATE")
    if chosen:
        return os.path.abspath(chosen)
    if os.geteuid() == 0:
        return ROOT_STATE
    base = env.get("XDG_STATE_HOME") or os.path.join(
        env.get("HOME") or os.path.expanduser("~"), ".local", "state"
    )
    return os.path.join(os.path.abspath(base), "stockade")


def socket_path(flag: str | None = None, *, state: str, environ: Mapping[str, str] | None = None) -> str:
    """The control socket, absolute: the flag, ``$STOCKADE_SOCKET``, or ``<state>/daemon.sock``."""
    env = os.environ if environ is None else environ
    chosen = flag or env.get("STOCKADE_SOCKET")
    return os.path.abspath(chosen) if chosen else os.path.join(state, SOCKET_NAME)


def store_path(state: str) -> str:
    return os.path.join(state, STORE_NAME)


def runs_dir(state: str) -> str:
    return os.path.join(state, RUNS_NAME)


def run_dir(state: str, run_id: str) -> str:
    if not RUN_ID.match(run_id):
        raise ValueError(f"not a run id: {run_id!r}")
    return os.path.join(state, RUNS_NAME, run_id)


def transcript_path(state: str, run_id: str) -> str:
    return os.path.join(run_dir(state, run_id), "transcript.log")


def broker_socket_path(state: str, run_id: str) -> str:
    return os.path.join(run_dir(state, run_id), "broker.sock")


def run_meta_path(state: str, run_id: str) -> str:
    return os.path.join(run_dir(state, run_id), "run.json")


def kernel_spool_path(state: str, run_id: str) -> str:
    """The audit relay's spool of a run's kernel refusals (``cell._audit_relay``)."""
    return os.path.join(run_dir(state, run_id), "kernel.spool")


def relay_lock_path(state: str) -> str:
    return os.path.join(state, "audit-relay.lock")


def store_error_path(state: str) -> str:
    """Where a daemon notes a store failure it could not record, for the record."""
    return os.path.join(state, "store-error.json")


def new_run_id() -> str:
    return "r-" + os.urandom(6).hex()


__all__ = [
    "BROKER_IN_CELL",
    "MAX_SUN_PATH",
    "ROOT_STATE",
    "RUN_ID",
    "broker_socket_path",
    "kernel_spool_path",
    "new_run_id",
    "relay_lock_path",
    "run_dir",
    "run_meta_path",
    "runs_dir",
    "socket_path",
    "state_dir",
    "store_error_path",
    "store_path",
    "transcript_path",
]
