"""The per-cell cap on kept denials: a denial flood is counted, not held."""

from __future__ import annotations

from stockade.cell._audit_core import KIND_LOST, AuditCorrelator
from stockade.record._event import Event


def _denial(cell: str, n: int) -> Event:
    return Event(kind="cell.denied", cell=cell, layer="seccomp", outcome="denied", detail={"n": n})


def test_denials_past_the_cap_are_counted_and_reported_once() -> None:
    core = AuditCorrelator(max_events_per_cell=5)
    core.watch("c1", session=42, pid=4242, now=0.0)
    out: list[Event] = []
    for n in range(12):
        core._emit(_denial("c1", n), out)
    assert [e.detail.get("n") for e in out] == [0, 1, 2, 3, 4]  # live: what is kept, no more
    taken = core.take("c1")
    assert [e.detail.get("n") for e in taken[:5]] == [0, 1, 2, 3, 4]
    assert len(taken) == 6
    assert taken[-1].kind == KIND_LOST
    assert taken[-1].detail == {"reason": "cap", "count": 7}
    # After a take the cell starts afresh, and the count does not repeat.
    core._emit(_denial("c1", 99), out)
    assert [e.detail.get("n") for e in core.take("c1")] == [99]
