"""A harness sample's events land in stockade's store, or beside it while a
daemon holds it; the containment report counts what was refused."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from stockade.daemon import _paths
from stockade.harness._record import SampleRecord, containment_report, land
from stockade.record import Event, open_store
from stockade.record._journaled import open_journaled_store


def _refusal(n: int) -> Event:
    return Event(
        kind="cell.denied",
        cell="c-1",
        layer="landlock",
        outcome="denied",
        summary=f"write to /etc/x{n} refused",
    )


def test_events_land_in_the_store_and_verify(tmp_path: Path) -> None:
    record = SampleRecord("r-0123456789ab", harness="inspect", task="t", sample="1")
    record.harness_event("harness.sample.start", "starts")
    refusal = _refusal(0)
    record.add(refusal)
    record.add(refusal)  # the live sink and the end both deliver it: kept once
    landed = land(record, state=str(tmp_path))
    assert landed["store"] == _paths.store_path(str(tmp_path))
    with open_store(landed["store"], readonly=True) as store:
        stored = store.query(run="r-0123456789ab")
        assert [s.event.kind for s in stored] == ["harness.sample.start", "cell.denied"]
        assert store.verify().ok
    report = containment_report(record, landed=landed)
    assert report["refusals"] == 1
    assert report["refusals_by_layer"] == {"landlock": 1}
    assert report["attempts"][0]["summary"] == "write to /etc/x0 refused"
    assert report["record"]["first_seq"] == 1 and report["record"]["last_seq"] == 2


def test_a_second_sample_continues_the_chain(tmp_path: Path) -> None:
    for run in ("r-000000000001", "r-000000000002"):
        record = SampleRecord(run, harness="inspect", task="t")
        record.add(_refusal(1))
        landed = land(record, state=str(tmp_path))
    assert landed["first_seq"] == 2
    with open_store(_paths.store_path(str(tmp_path)), readonly=True) as store:
        assert store.verify().ok and store.last_seq() == 2


def test_a_running_daemons_store_is_left_alone(tmp_path: Path) -> None:
    held = open_journaled_store(_paths.store_path(str(tmp_path)))  # what a daemon holds
    try:
        record = SampleRecord("r-0000000000aa", harness="harbor", task="t")
        record.add(_refusal(2))
        landed = land(record, state=str(tmp_path))
        assert landed["store"] is None and "running daemon" in landed["why"]
        lines = Path(landed["events_file"]).read_text().splitlines()
        assert json.loads(lines[0])["run"] == "r-0000000000aa"
        assert held.last_seq() == 0
    finally:
        held.close()


def test_a_flood_of_refusals_is_counted_not_listed(tmp_path: Path) -> None:
    record = SampleRecord("r-0000000000bb", harness="inspect", task="t")
    for n in range(120):
        record.add(_refusal(n))
    report = containment_report(record, landed={})
    assert report["refusals"] == 120
    assert len(report["attempts"]) == 50 and report["attempts_left_out"] == 70


def test_samples_ending_at_once_in_one_process_all_land_in_the_store(tmp_path: Path) -> None:
    import threading

    landed: dict[int, dict[str, object]] = {}
    failed: list[BaseException] = []
    go = threading.Barrier(6)

    def one(n: int) -> None:
        record = SampleRecord(f"r-{n:012d}", harness="inspect", task="t", sample=str(n))
        record.add(_refusal(n))
        go.wait(10)
        try:
            landed[n] = land(record, state=str(tmp_path))
        except BaseException as exc:  # what a sample_cleanup would have raised
            failed.append(exc)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert failed == []
    assert all(landed[n]["store"] == _paths.store_path(str(tmp_path)) for n in range(6))  # none kept beside
    with open_store(_paths.store_path(str(tmp_path)), readonly=True) as store:
        assert store.last_seq() == 6 and store.verify().ok
        assert {s.event.run for s in store.query()} == {f"r-{n:012d}" for n in range(6)}


def test_a_store_opened_ahead_is_landed_or_let_go(tmp_path: Path) -> None:
    from stockade.harness._record import Landing

    first = Landing(str(tmp_path), ahead=True)
    second = Landing(str(tmp_path), ahead=True)  # waits for this process's lock of the store
    record = SampleRecord("r-000000000011", harness="inspect", task="t")
    record.add(_refusal(11))
    assert first.land(record)["first_seq"] == 1
    second.abandon()  # its sample's end failed: nothing written, the store let go
    later = SampleRecord("r-000000000012", harness="inspect", task="t")
    later.add(_refusal(12))
    assert land(later, state=str(tmp_path))["first_seq"] == 2
    with open_store(_paths.store_path(str(tmp_path)), readonly=True) as store:
        assert store.verify().ok and store.last_seq() == 2


def test_a_landing_hands_its_close_on_and_its_events_are_readable_meanwhile(tmp_path: Path) -> None:
    """With ``later``, ``land`` returns once the events are in the journal
    (durable, and read by a reader of the store); the close that indexes
    them into SQLite is what ``later`` runs, and the next landing waits for it."""
    from stockade.harness._record import Landing

    handed: list[Callable[[], None]] = []
    record = SampleRecord("r-00000000c105", harness="inspect", task="t")
    record.add(_refusal(3))
    landed = Landing(str(tmp_path)).land(record, later=handed.append)
    assert landed["first_seq"] == 1 and len(handed) == 1
    with open_store(landed["store"], readonly=True) as store:  # the journal is read too
        assert [s.event.kind for s in store.query(run="r-00000000c105")] == ["cell.denied"]
    second = SampleRecord("r-00000000c106", harness="inspect", task="t")
    second.add(_refusal(4))
    landing = Landing(str(tmp_path), ahead=True)  # waits for the first's close
    assert not landing._ready.wait(0.2), "a second landing opened the store before the first closed it"
    handed.pop()()  # what ``later`` runs: the first's close
    assert landing.land(second)["first_seq"] == 2
    with open_store(_paths.store_path(str(tmp_path)), readonly=True) as store:
        assert store.verify().ok and store.last_seq() == 2


def test_a_hosts_finish_hands_the_close_on_with_or_without_a_store_opened_ahead(tmp_path: Path) -> None:
    from stockade.harness._hosted import ProcessHost

    for ahead, run in ((True, "r-00000000c201"), (False, "r-00000000c202")):
        record = SampleRecord(run, harness="inspect", task="t")
        record.add(_refusal(5))
        host = ProcessHost(record, state=str(tmp_path))
        if ahead:
            host.prepare_finish()
        handed: list[Callable[[], None]] = []
        landed = host.finish(later=handed.append)
        assert landed["via"] == "process" and len(handed) == 1, (ahead, landed)
        with open_store(landed["store"], readonly=True) as store:
            assert [s.event.kind for s in store.query(run=run)] == ["cell.denied"]
        handed.pop()()
    with open_store(_paths.store_path(str(tmp_path)), readonly=True) as store:
        assert store.verify().ok and store.last_seq() == 2
