"""A Cell dropped without close() and freed by the cyclic collector, in a
thread that holds the lock its finaliser needs: no hang, ever (issue 12; an
Inspect conformance run hung so in 3 runs of 6)."""

from __future__ import annotations

import gc
import threading
from pathlib import Path

from stockade.cell import Cell, _layers


def _users() -> int:
    with _layers._lock:
        return sum(shared.users for shared in _layers._current.values())


def test_an_unclosed_cell_collected_under_the_descriptor_lock_does_not_hang(tmp_path: Path) -> None:
    gc.disable()  # the cycle below must live until this test collects it
    try:
        cell = Cell(workspace=tmp_path)
        assert cell.run(["/bin/sleep", "0.1"]).exit_code == 0
        before = _users()
        assert before > 0  # its prepared rules hold host descriptors
        cell.cycle = cell  # type: ignore[attr-defined]  # only the collector can free it
        del cell
        done = threading.Event()

        def collect_under_the_lock() -> None:
            # As a thread inside HostDescriptors.open() would be when an
            # allocation there starts a collection.
            with _layers._lock:
                gc.collect()
            done.set()

        worker = threading.Thread(target=collect_under_the_lock, daemon=True)
        worker.start()
        assert done.wait(10), "collecting an unclosed Cell deadlocked on the descriptors' lock"
    finally:
        gc.enable()
    # Queued, not lost: the next holder of the lock lets them go.
    _layers.HostDescriptors().close()
    assert not _layers._orphans
    assert _users() < before


def test_a_closed_cell_lets_go_of_its_descriptors_at_once(tmp_path: Path) -> None:
    # The control: the ordinary path still releases synchronously.
    with Cell(workspace=tmp_path) as cell:
        cell.run(["/bin/sleep", "0.1"])
        held = _users()
    assert _users() < held
