"""The chain anchored: a head kept outside the store (``--expect SEQ:HASH``, the
daemon's published head file) shows a tail cut off or a chain rewritten, which
the chain alone does not."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from stockade.cli._record_cmds import EXIT_BROKEN, EXIT_UNANCHORED, export_cmd, verify
from stockade.record import Head, _journaled, open_store, parse_head, read_head
from stockade.record._chain import ChainVerifier
from stockade.record._head import head_path, write_head
from stockade.record._journaled import open_journaled_store
from tests.record.test_chain import build_chain, make_event

WAIT = 10.0


def _verify(expect: dict[int, str], count: int = 5) -> tuple[bool, str]:
    verifier = ChainVerifier(expect)
    for stored in build_chain([make_event(i) for i in range(count)]):
        assert verifier.check(stored.seq, stored.prev, stored.hash, stored.event_json().encode()) is None
    result = verifier.result()
    return result.ok, result.anchor


def test_a_head_in_the_chain_at_its_place_is_anchored() -> None:
    chain = build_chain([make_event(i) for i in range(5)])
    assert _verify({3: chain[2].hash, 5: chain[4].hash}) == (True, "")


def test_another_hash_at_the_expected_place_says_rewritten() -> None:
    chain = build_chain([make_event(i) for i in range(5)])
    ok, anchor = _verify({3: chain[3].hash})
    assert ok and anchor.startswith(f"event 3 has the hash {chain[2].hash}, not the expected {chain[3].hash}")
    assert "rewritten" in anchor


def test_a_record_that_ends_before_the_head_says_cut_off() -> None:
    later = build_chain([make_event(i) for i in range(8)])
    ok, anchor = _verify({8: later[7].hash})
    assert ok and anchor == (
        f"the record ends at event 5, before the expected event 8 (hash {later[7].hash}): "
        "events were cut off its end"
    )


def test_an_empty_record_does_not_hold_a_head() -> None:
    result = ChainVerifier({1: "a" * 64}).result()
    assert result.ok and not result.anchored and "ends at event 0" in result.anchor


def test_a_broken_chain_is_reported_as_broken_not_as_unanchored() -> None:
    chain = build_chain([make_event(i) for i in range(5)])
    verifier = ChainVerifier({5: chain[4].hash})
    for stored in chain[:2] + chain[3:]:  # event 3 removed
        verifier.check(stored.seq, stored.prev, stored.hash, stored.event_json().encode())
    result = verifier.result()
    assert not result.ok and result.first_bad_seq == 3 and result.anchor == ""


@pytest.mark.parametrize("text", ["3", "0:" + "a" * 64, "3:" + "a" * 63, "3:" + "g" * 64, ":" + "a" * 64])
def test_a_head_is_seq_colon_64_hex(text: str) -> None:
    with pytest.raises(ValueError, match="is not a head; give SEQ:HASH"):
        parse_head(text)


def test_a_head_reads_back_as_printed() -> None:
    digest = "AB" * 32
    assert parse_head(f" 12:{digest} ") == Head(12, digest.lower())
    assert str(Head(12, "ab" * 32)) == f"12:{'ab' * 32}"


def test_a_damaged_head_file_is_an_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "events.db.head"
    assert read_head(str(path)) is None
    write_head(str(path), Head(4, "c" * 64))
    assert read_head(str(path)) == Head(4, "c" * 64)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    path.write_text('{"seq": "4"}')
    with pytest.raises(ValueError, match=f"the head file {path} holds no head"):
        read_head(str(path))


# -- the daemon's store publishes its head ----------------------------------------


def test_the_journaled_store_publishes_its_head_while_events_come_and_at_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = str(tmp_path / "events.db")
    published: list[Head] = []
    wrote = threading.Event()
    real = _journaled.write_head

    def spy(path: str, head: Head) -> None:
        real(path, head)
        published.append(head)
        wrote.set()

    monkeypatch.setattr(_journaled, "write_head", spy)
    monkeypatch.setattr(_journaled, "HEAD_INTERVAL", 0.0)
    with open_journaled_store(db) as store:
        assert published == [] and read_head(head_path(db)) is None  # nothing to publish yet
        first = store.append([make_event(i) for i in range(3)])
        assert wrote.wait(WAIT), "the head was not published while the store stayed open"
        assert read_head(head_path(db)) == Head(3, first[-1].hash)
        monkeypatch.setattr(_journaled, "HEAD_INTERVAL", 3600.0)  # from now on only at close
        wrote.clear()
        last = store.append([make_event(9)])
    assert read_head(head_path(db)) == Head(4, last[0].hash)
    assert published[-1] == Head(4, last[0].hash)


def test_a_head_file_that_cannot_be_written_leaves_appends_alone(tmp_path: Path) -> None:
    db = str(tmp_path / "events.db")
    Path(head_path(db)).mkdir()  # the rename over a directory fails
    with open_journaled_store(db) as store:
        stored = store.append([make_event(0)])
    assert stored[0].seq == 1
    assert store.head_error is not None
    with open_store(db, readonly=True) as reader:
        assert reader.verify().checked == 1


# -- `stockade verify --expect` and the published head --------------------------------


def _run(command: object, args: list[str]) -> tuple[int, str, str]:
    result = CliRunner().invoke(command, args, catch_exceptions=False)  # type: ignore[arg-type]
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def daemon_db(tmp_path: Path) -> tuple[str, list[Head]]:
    """A store written as the daemon writes it (its head published at close)."""
    db = str(tmp_path / "events.db")
    with open_journaled_store(db) as store:
        stored = store.append([make_event(i) for i in range(6)])
    return db, [Head(s.seq, s.hash) for s in stored]


def test_verify_prints_the_head_and_holds_what_was_published(daemon_db: tuple[str, list[Head]]) -> None:
    db, heads = daemon_db
    code, out, _ = _run(verify, ["--db", db, "--expect", str(heads[2])])
    assert code == 0, out
    assert f"head {heads[-1]}" in out
    assert f"the chain holds the expected head(s) at event 3, 6 (published in {db}.head)." in out
    code, out, _ = _run(verify, ["--db", db, "--json"])
    body = json.loads(out)
    assert (code, body["anchored"], body["head"], body["anchor"]) == (0, True, str(heads[-1]), None)
    assert body["published_head"] == {"file": db + ".head", **heads[-1].to_dict()}


def test_verify_fails_with_7_on_a_store_whose_tail_was_cut_off(daemon_db: tuple[str, list[Head]]) -> None:
    db, heads = daemon_db
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("DELETE FROM events WHERE seq > 4")  # the chain that is left is intact
    conn.close()
    os.unlink(db + ".journal")  # which still holds them (a read-only store reads its tail)
    code, out, _ = _run(verify, ["--db", db, "--no-published-head"])
    assert code == 0 and "all 4 events are intact" in out  # what the chain alone says
    code, out, _ = _run(verify, ["--db", db])
    assert code == EXIT_UNANCHORED
    assert (
        f"the record does NOT hold a head kept of it: the record ends at event 4, before the expected "
        f"event 6 (hash {heads[5].hash}): events were cut off its end." in out
    )
    code, out, _ = _run(verify, ["--db", db, "--no-published-head", "--expect", str(heads[4])])
    assert code == EXIT_UNANCHORED and "before the expected event 5" in out
    assert _run(verify, ["--db", db, "--no-published-head", "--expect", str(heads[3])])[0] == 0


def test_verify_fails_with_7_on_a_rewritten_chain(tmp_path: Path, daemon_db: tuple[str, list[Head]]) -> None:
    db, heads = daemon_db
    other = str(tmp_path / "other.db")  # the same number of events, chained anew
    with open_store(other) as store:
        store.append([make_event(i, summary="rewritten") for i in range(6)])
    code, out, _ = _run(verify, ["--db", other, "--expect", str(heads[5])])
    assert code == EXIT_UNANCHORED and "event 6 has the hash" in out and "rewritten" in out
    # A broken chain stays exit 1 whatever is expected.
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("UPDATE events SET json = replace(json, 'c-', 'x-') WHERE seq = 2")
    conn.close()
    assert _run(verify, ["--db", db, "--expect", str(heads[5])])[0] == EXIT_BROKEN


def test_verify_refuses_a_malformed_expect_and_a_damaged_head_file(daemon_db: tuple[str, list[Head]]) -> None:
    db, _heads = daemon_db
    code, _, err = _run(verify, ["--db", db, "--expect", "6"])
    assert code == 2 and "is not a head; give SEQ:HASH" in err
    Path(db + ".head").write_text("garbage")
    code, _, err = _run(verify, ["--db", db])
    assert code == EXIT_UNANCHORED and f"the head file {db}.head holds no head" in err
    assert _run(verify, ["--db", db, "--no-published-head"])[0] == 0


def test_an_export_to_a_file_names_its_head(tmp_path: Path, daemon_db: tuple[str, list[Head]]) -> None:
    db, heads = daemon_db
    code, _, err = _run(export_cmd, ["--db", db, "--out", str(tmp_path / "out.jsonl")])
    assert code == 0 and f"the export ends at head {heads[-1]}" in err
