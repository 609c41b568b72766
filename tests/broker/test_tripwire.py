"""The tripwire: denials counted, the limit trips it, and it stays tripped."""

from __future__ import annotations

import threading

import pytest

from stockade.broker._tripwire import DEFAULT_LIMIT, Tripwire


def test_the_tenth_denial_trips_it_by_default() -> None:
    wire = Tripwire()
    assert wire.limit == DEFAULT_LIMIT == 10
    results = [wire.record("deny") for _ in range(10)]
    assert results == [False] * 9 + [True]
    assert wire.tripped and wire.denials == 10


def test_every_later_call_reports_tripped_whatever_its_verdict() -> None:
    wire = Tripwire(limit=2)
    wire.record("deny")
    assert wire.record("deny") is True
    assert [wire.record(v) for v in ("allow", "ask", "deny")] == [True, True, True]
    assert wire.denials == 3


def test_allows_and_asks_do_not_count() -> None:
    wire = Tripwire(limit=3)
    for _ in range(100):
        assert wire.record("allow") is False
        assert wire.record("ask") is False
    assert wire.denials == 0 and not wire.tripped
    assert [wire.record("deny") for _ in range(3)] == [False, False, True]


def test_a_limit_of_one_trips_on_the_first_denial() -> None:
    wire = Tripwire(limit=1)
    assert wire.record("deny") is True


@pytest.mark.parametrize("limit", [0, -1, 2.5, True, "10"])
def test_a_bad_limit_is_refused(limit: object) -> None:
    with pytest.raises(ValueError, match="positive whole number"):
        Tripwire(limit)  # type: ignore[arg-type]


def test_an_unknown_verdict_is_refused_and_not_counted() -> None:
    wire = Tripwire(limit=1)
    with pytest.raises(ValueError, match="verdict"):
        wire.record("denied")
    assert wire.denials == 0 and not wire.tripped


def test_every_call_from_the_trip_on_says_tripped() -> None:
    wire = Tripwire(limit=2)
    assert wire.record("deny") is False
    assert wire.record("deny") is True
    assert wire.record("allow") is True
    assert wire.record("deny") is True


def test_concurrent_denials_are_all_counted() -> None:
    wire = Tripwire(limit=1000)
    claims: list[bool] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def deny_many() -> None:
        start.wait(timeout=30)
        mine = []
        for _ in range(250):
            if wire.record("deny"):
                mine.append(True)
        with lock:
            claims.extend(mine)

    threads = [threading.Thread(target=deny_many) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert wire.denials == 2000 and wire.tripped
    assert len(claims) == 2000 - 999  # every call from the 1000th on reported tripped
    assert "tripped=True" in repr(wire)
