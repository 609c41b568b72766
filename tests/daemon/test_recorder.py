"""The daemon's Recorder: group commit on the loop, answers only after the
journal write, a failure refuses everything after it, threads can record."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from stockade.daemon._bus import Recorder
from stockade.errors import StoreError
from stockade.record import Event
from stockade.record._chain import StoredEvent
from stockade.record._journal import SUFFIX
from stockade.record._store import open_store


def _event(n: int) -> Event:
    return Event(
        kind="test", cell="c", layer="broker", outcome="allowed", detail={"n": n}, summary=f"event {n}"
    )


def _recorder(tmp_path: Path, loop: asyncio.AbstractEventLoop) -> tuple[Recorder, list[list[StoredEvent]]]:
    seen: list[list[StoredEvent]] = []
    recorder = Recorder(str(tmp_path / "events.db"), loop, on_stored=seen.append, on_failure=lambda exc: None)
    recorder.start()
    return recorder, seen


def test_what_one_pass_of_the_loop_records_is_one_journal_write_and_answered_after_it(tmp_path: Path) -> None:
    async def main() -> None:
        recorder, seen = _recorder(tmp_path, asyncio.get_running_loop())
        writes: list[int] = []
        journal = recorder.store.journal
        original = journal.append

        def counted(record: bytes) -> None:
            original(record)
            writes.append(journal._offset)  # where the journal ends once this write returned

        journal.append = counted  # type: ignore[method-assign]
        try:
            futures = [recorder.record_soon([_event(n)]) for n in range(50)]
            results = await asyncio.gather(*futures)
            # Fifty callers in one pass: one write, one batch handed on, in order.
            assert len(writes) == 1
            assert [r[0].seq for r in results] == list(range(1, 51))
            assert [len(batch) for batch in seen] == [50]
            # Every answer came after its event was in the journal file.
            data = (tmp_path / ("events.db" + SUFFIX)).read_bytes()[: writes[0]]
            assert all(f'"n":{n}'.encode() in data for n in range(50))
            assert recorder.commits == 1 and recorder.appended == 50
        finally:
            await asyncio.to_thread(recorder.close)

    asyncio.run(main())
    with open_store(str(tmp_path / "events.db"), readonly=True) as store:
        assert store.verify().ok
        assert [s.event.detail["n"] for s in store.query()] == list(range(50))


def test_a_failed_write_fails_its_callers_and_every_later_one(tmp_path: Path) -> None:
    failures: list[StoreError] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        recorder = Recorder(
            str(tmp_path / "events.db"), loop, on_stored=lambda s: None, on_failure=failures.append
        )
        recorder.start()
        try:
            await recorder.record_soon([_event(0)])

            def broken(record: bytes) -> None:
                raise StoreError("cannot write the event store's journal: its filesystem is full", path="x")

            recorder.store.journal.append = broken  # type: ignore[method-assign]
            with pytest.raises(StoreError, match="full"):
                await recorder.record_soon([_event(1)])
            del recorder.store.journal.append
            # Refused without trying, until a retry succeeds.
            with pytest.raises(StoreError, match="full"):
                await recorder.record_soon([_event(2)])
            stored = await recorder.retry([_event(3)])
            assert stored[0].seq == 2
            assert (await recorder.record_soon([_event(4)]))[0].seq == 3
        finally:
            await asyncio.to_thread(recorder.close)

    asyncio.run(main())
    assert len(failures) == 1
    with open_store(str(tmp_path / "events.db"), readonly=True) as store:
        assert [s.event.detail["n"] for s in store.query()] == [0, 3, 4]
        assert store.verify().ok


def test_an_event_that_cannot_be_stored_fails_only_its_caller(tmp_path: Path) -> None:
    async def main() -> None:
        recorder, _ = _recorder(tmp_path, asyncio.get_running_loop())
        try:
            bad = Event(
                kind="test", cell="c", layer="broker", outcome="allowed", detail={"x": object()}, summary=""
            )
            good = recorder.record_soon([_event(1)])
            wrong = recorder.record_soon([bad])
            assert (await good)[0].seq == 1
            with pytest.raises(ValueError, match="not plain JSON"):
                await wrong
            assert recorder.failure is None
        finally:
            await asyncio.to_thread(recorder.close)

    asyncio.run(main())


def test_other_threads_record_through_the_loop_and_wait_until_durable(tmp_path: Path) -> None:
    async def main() -> None:
        recorder, _ = _recorder(tmp_path, asyncio.get_running_loop())
        got: list[int] = []

        def from_thread(n: int) -> None:
            got.extend(s.seq for s in recorder.record([_event(n)]))

        try:
            threads = [threading.Thread(target=from_thread, args=(n,)) for n in range(8)]
            for t in threads:
                t.start()
            await asyncio.to_thread(lambda: [t.join() for t in threads])
            assert sorted(got) == list(range(1, 9))
            assert recorder.store.last_seq() == 8
        finally:
            await asyncio.to_thread(recorder.close)

    asyncio.run(main())


def test_a_thread_recording_as_the_loop_ends_gets_an_error_not_a_hang(tmp_path: Path) -> None:
    loop = asyncio.new_event_loop()
    recorder, _ = _recorder(tmp_path, loop)
    outcome: list[object] = []

    def from_thread() -> None:
        try:
            outcome.append(recorder.record([_event(1)]))
        except StoreError as exc:
            outcome.append(exc)

    # The thread hands its events to a loop that never runs again.
    thread = threading.Thread(target=from_thread)
    thread.start()
    while not loop._ready:  # type: ignore[attr-defined]  # its callback is queued
        thread.join(0.01)
    loop.close()
    thread.join(10)
    assert not thread.is_alive(), "record() waited for ever on a closed loop"
    assert len(outcome) == 1 and isinstance(outcome[0], StoreError)
    assert "ended before" in str(outcome[0])
    recorder.close()


def test_events_written_by_a_close_from_another_thread_are_answered_on_the_loop(tmp_path: Path) -> None:
    # close() may come from any thread (the daemon calls it through
    # asyncio.to_thread) and writes what is still queued; the callers' answers
    # and the live stream belong to the loop, whose objects are not thread-safe.
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever)
    runner.start()
    try:
        seen_on: list[int] = []
        answered: list[tuple[int, object]] = []
        recorder = Recorder(
            str(tmp_path / "events.db"),
            loop,
            on_stored=lambda stored: seen_on.append(threading.get_ident()),
            on_failure=lambda exc: None,
        )
        recorder.start()
        queued, release = threading.Event(), threading.Event()

        def on_the_loop() -> None:
            recorder.record_then([_event(1)], lambda result: answered.append((threading.get_ident(), result)))
            queued.set()
            release.wait(10)  # hold the loop: its own write of the queue cannot run first

        loop.call_soon_threadsafe(on_the_loop)
        assert queued.wait(10)
        closer = threading.Thread(target=recorder.close)
        closer.start()
        closer.join(10)
        assert not closer.is_alive()
        release.set()
        for _ in range(100):
            if answered:
                break
            threading.Event().wait(0.05)
        assert [who for who, _ in answered] == [runner.ident], "answered off the loop"
        assert seen_on == [runner.ident], "handed to the live stream off the loop"
        result = answered[0][1]
        assert isinstance(result, list) and [s.seq for s in result] == [1]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(10)
        loop.close()
    with open_store(str(tmp_path / "events.db"), readonly=True) as store:
        assert store.last_seq() == 1 and store.verify().ok
