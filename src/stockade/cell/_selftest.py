"""The kernel-refusal self-test of ``stockade doctor``: a refusal that must come back.

A host can have Landlock, seccomp and a readable audit socket and still lose
every refusal (stockade inside a network namespace of its own, where the
kernel's audit multicast never arrives; auditing off and locked; a backlog
that drops). Only the whole path proves it: this runs a tiny real cell that
is refused one write by Landlock and one UDP socket by seccomp, then waits on
its stdin; both refusals must reach ``Cell.run``'s ``on_event`` while the cell
still runs, within ``BOUND`` seconds, or the test fails and says where.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Final

from stockade.errors import StockadeError
from stockade.record import Event

BOUND: Final = 5.0
"""Seconds both refusals may take to come back (they take milliseconds)."""

PYTHON: Final = "/usr/bin/python3"
"""The system interpreter: the cell's view shows /usr, not a virtual environment."""

_SCRIPT: Final = """
import socket, sys, time
t = time.time()
try: open("/etc/stockade-doctor-self-test", "w")
except OSError: pass
u = time.time()
try: socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
except OSError: pass
print(t, u, flush=True)
sys.stdin.read()
"""


@dataclass(frozen=True)
class SelfTest:
    """What the self-test saw."""

    ok: bool
    here: str
    """What happened, in a line."""
    fix: str | None
    landlock_ms: float | None = None
    """From the refused write to its event, in milliseconds (None: never came)."""
    seccomp_ms: float | None = None


def kernel_refusals(bound: float = BOUND) -> SelfTest:
    """Run the self-test cell; never raises (a failure is the result)."""
    from stockade.cell._cell import Cell
    from stockade.policy import default_policy

    if not os.path.exists(PYTHON):
        return SelfTest(
            False, f"no {PYTHON} to run the test cell", "install python3 (Debian: apt-get install python3)"
        )
    arrived: dict[str, float] = {}
    lock = threading.Lock()
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    open_ends = [write_end]

    def let_it_end() -> None:
        with lock:  # once, from whichever thread comes first
            for fd in open_ends:
                os.close(fd)  # the cell's stdin ends: it exits
            open_ends.clear()

    def on_event(event: Event) -> None:
        if event.outcome == "denied" and event.layer in ("landlock", "seccomp"):
            arrived.setdefault(event.layer, time.time())
            if len(arrived) == 2:
                let_it_end()

    try:
        with Cell(default_policy("doctor-self-test")) as cell:
            try:
                result = cell.run(
                    [PYTHON, "-I", "-S", "-c", _SCRIPT], stdin=read_end, on_event=on_event, timeout=bound
                )
            finally:
                let_it_end()
    except StockadeError as exc:
        return SelfTest(False, "the test cell could not run", str(exc))
    finally:
        os.close(read_end)
    try:
        started = [float(x) for x in result.stdout.split()[:2]]
    except ValueError:
        started = []
    if len(started) != 2:
        return SelfTest(
            False,
            f"the test cell did not run its script (exit {result.exit_code})",
            result.stderr.decode(errors="replace").strip()[-300:] or None,
        )
    ms = {
        layer: round((arrived[layer] - t) * 1000, 2)
        for layer, t in zip(("landlock", "seccomp"), started, strict=True)
        if layer in arrived
    }
    missing = [layer for layer in ("landlock", "seccomp") if layer not in arrived]
    if missing:
        late = [e.layer for e in result.events if e.outcome == "denied" and e.layer in missing]
        where = (
            "came only when the cell ended, not while it ran"
            if late
            else "never came back, though the kernel refused the calls"
        )
        return SelfTest(
            False,
            f"the test cell's {' and '.join(missing)} refusal {where} (bound {bound:g} s)",
            "see docs/DOCTOR.md, 'kernel refusals reach the record': run stockade in the host's "
            "network namespace with CAP_AUDIT_READ and CAP_AUDIT_CONTROL (docs/RECIPES.md)",
            ms.get("landlock"),
            ms.get("seccomp"),
        )
    return SelfTest(
        True,
        f"a test cell's refused write (landlock) and UDP socket (seccomp) came back as events while it "
        f"ran, {ms['landlock']:g} ms and {ms['seccomp']:g} ms after the calls",
        None,
        ms["landlock"],
        ms["seccomp"],
    )


__all__ = ["BOUND", "SelfTest", "kernel_refusals"]
