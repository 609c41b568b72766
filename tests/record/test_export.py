"""Exports (JSON, JSONL, text), --since, and the `verify` and `export` commands."""

from __future__ import annotations

import io
import json
import os
import sqlite3
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from stockade.cli._record_cmds import default_db, export_cmd, verify
from stockade.errors import NotFoundError, StoreError
from stockade.record import Event, StoredEvent, export, export_to_file, open_store, parse_since
from stockade.record._chain import ChainVerifier, canonical_json
from stockade.record._export import iso_utc, printable, text_line
from tests.record.test_chain import build_chain, make_event

# -- formats --------------------------------------------------------------------


def _export(events: list[StoredEvent], fmt: str) -> str:
    out = io.StringIO()
    assert export(events, fmt, out) == len(events)  # type: ignore[arg-type]
    return out.getvalue()


def test_jsonl_is_one_stored_event_per_line() -> None:
    stored = build_chain([make_event(i, detail={"path": f"/tmp/é{i}\n"}) for i in range(3)])
    text = _export(stored, "jsonl")
    lines = text.split("\n")
    assert lines[-1] == "" and len(lines) == 4
    assert [json.loads(line) for line in lines[:-1]] == [s.to_dict() for s in stored]
    assert lines[0] == canonical_json(stored[0].to_dict())
    assert set(json.loads(lines[0])) == {"seq", "hash", "prev", "event"}


def test_a_jsonl_export_can_be_verified_on_its_own() -> None:
    stored = build_chain([make_event(i) for i in range(5)])
    verifier = ChainVerifier()
    for line in _export(stored, "jsonl").splitlines():
        obj = json.loads(line)
        assert (
            verifier.check(obj["seq"], obj["prev"], obj["hash"], canonical_json(obj["event"]).encode())
            is None
        )
    assert verifier.result().checked == 5


def test_json_is_one_array() -> None:
    stored = build_chain([make_event(i) for i in range(3)])
    assert json.loads(_export(stored, "json")) == [s.to_dict() for s in stored]
    assert json.loads(_export([], "json")) == []
    assert _export([], "jsonl") == _export([], "text") == ""


def test_text_is_one_human_line_per_event() -> None:
    [a, b] = build_chain(
        [
            make_event(0, time=1795959063.412, run="r-0123456789ab", cell="c-3f9a1c2e4b5d"),
            make_event(1, time=1795959063.0, run="", summary="", kind="cell.start", outcome="info"),
        ]
    )
    assert text_line(a) == (
        "1 2026-11-29T13:31:03.412Z r-0123456789ab/c-3f9a1c2e4b5d landlock denied "
        "write to /etc/f0 refused by landlock (fs.write_file)"
    )
    assert text_line(b) == "2 2026-11-29T13:31:03.000Z -/c-3f9a1c2e4b5d landlock info cell.start"
    assert _export([a, b], "text") == f"{text_line(a)}\n{text_line(b)}\n"


def test_text_cannot_be_forged_or_drive_the_terminal() -> None:
    """An agent chooses the paths in summaries: no line break, escape sequence
    or bidi override gets through as itself."""
    evil = "x\n2 2026-01-01T00:00:00.000Z r/c broker allowed all fine\r\x1b[2J\u202eevil\u2028\x00"
    [stored] = build_chain([make_event(0, summary=evil, cell="c\x1b]0;t\x07")])
    line = text_line(stored)
    assert line.isprintable() and "\n" not in _export([stored], "text")[:-1]
    assert "x\\n2 2026" in line and "\\x1b[2J" in line and "\\u202eevil\\u2028\\x00" in line
    assert printable("plain é 名") == "plain é 名"


def test_iso_utc() -> None:
    assert iso_utc(0) == "1970-01-01T00:00:00.000Z"
    assert iso_utc(1795959063.4129) == "2026-11-29T13:31:03.413Z"
    assert iso_utc(59.9996) == "1970-01-01T00:01:00.000Z"
    assert iso_utc(1e300) == "1e+300"


def test_export_streams() -> None:
    """The first events are written before the last are read."""
    out = io.StringIO()
    written_when_last_was_read: list[int] = []
    stored = build_chain([make_event(i) for i in range(3000)])

    def events() -> Iterator[StoredEvent]:
        yield from stored[:-1]
        written_when_last_was_read.append(len(out.getvalue()))
        yield stored[-1]

    for fmt in ("json", "jsonl", "text"):
        out.seek(0)
        out.truncate()
        written_when_last_was_read.clear()
        export(events(), fmt, out)
        assert written_when_last_was_read[0] > len(out.getvalue()) // 2, fmt


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown export format 'xml'"):
        export([], "xml", io.StringIO())  # type: ignore[arg-type]


def test_export_to_file_is_atomic_and_private(tmp_path: Path) -> None:
    stored = build_chain([make_event(i) for i in range(3)])
    target = tmp_path / "out.jsonl"
    target.write_text("previous\n")

    def broken() -> Iterator[StoredEvent]:
        yield from stored
        raise StoreError("the disk went away", path="x")

    with pytest.raises(StoreError):
        export_to_file(broken(), "jsonl", str(target))
    assert target.read_text() == "previous\n"
    assert os.listdir(tmp_path) == ["out.jsonl"]
    assert export_to_file(stored, "jsonl", str(target)) == 3
    assert target.read_text() == _export(stored, "jsonl")
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert os.listdir(tmp_path) == ["out.jsonl"]


# -- --since ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", 1_000_000 - 90),
        ("10m", 1_000_000 - 600),
        ("2h", 1_000_000 - 7200),
        ("1.5h", 1_000_000 - 5400),
        ("7d", 1_000_000 - 7 * 86400),
        ("1w", 1_000_000 - 7 * 86400),
        (" 10m ", 1_000_000 - 600),
        ("2026-11-29T13:31:03Z", 1795959063.0),
        ("2026-11-29T13:31:03.5+00:00", 1795959063.5),
        ("2026-11-29T14:31:03+01:00", 1795959063.0),
        ("2026-11-29T13:31:03", 1795959063.0),  # no offset: UTC
        ("2026-11-29", 1795910400.0),
    ],
)
def test_since_accepts_iso_8601_and_durations(text: str, expected: float) -> None:
    assert parse_since(text, now=1_000_000) == expected


@pytest.mark.parametrize("text", ["", "yesterday", "10 minutes", "-5m", "2026-13-01", "5y", "400d"])
def test_since_refuses_anything_else(text: str) -> None:
    with pytest.raises(ValueError, match=r"neither an ISO-8601 time .* nor a duration"):
        parse_since(text)


# -- the commands -------------------------------------------------------------------


@pytest.fixture
def db(tmp_path: Path) -> str:
    path = str(tmp_path / "events.db")
    with open_store(path) as s:
        s.append(
            [
                make_event(0, time=1000.0, run="r-a"),
                make_event(1, time=2000.0, run="r-b"),
                make_event(2, time=3000.0, run="r-a", summary="line\nbreak"),
            ]
        )
    return path


def _run(command: object, args: list[str], **kw: object) -> tuple[int, str, str]:
    result = CliRunner().invoke(command, args, catch_exceptions=False, **kw)  # type: ignore[arg-type]
    return result.exit_code, result.stdout, result.stderr


def test_verify_exits_0_when_intact(db: str) -> None:
    code, out, _ = _run(verify, ["--db", db])
    assert code == 0
    assert "all 3 events are intact and in order" in out and "last event 3, hash " in out


def test_verify_exits_1_and_shows_the_first_altered_event(db: str) -> None:
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("UPDATE events SET json = replace(json, 'r-b', 'r-c'), run = 'r-c' WHERE seq = 2")
    conn.close()
    code, out, _ = _run(verify, ["--db", db])
    assert code == 1
    assert "NOT intact: event 2 was altered: its stored hash does not match its content" in out
    assert "1 event(s) before it are intact" in out
    assert 'event 2 as stored: {"cell":' in out and '"run":"r-c"' in out
    code, out, _ = _run(verify, ["--db", db, "--json"])
    body = json.loads(out)
    assert (code, body["ok"], body["first_bad_seq"], body["checked"]) == (1, False, 2, 1)
    assert json.loads(body["first_bad_event"])["run"] == "r-c"


def test_verify_names_a_missing_event(db: str) -> None:
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("DELETE FROM events WHERE seq = 1")
    conn.close()
    code, out, _ = _run(verify, ["--db", db])
    assert code == 1 and "event 1 is missing (the next stored event is 2)" in out


def test_verify_and_export_exit_6_without_a_store(tmp_path: Path) -> None:
    missing = str(tmp_path / "none.db")
    for command in (verify, export_cmd):
        code, _, err = _run(command, ["--db", missing])
        assert code == 6 and f"there is no event store at {missing}" in err
    assert not os.path.exists(missing)


def test_export_formats_to_stdout(db: str) -> None:
    code, out, _ = _run(export_cmd, ["--db", db, "--format", "jsonl"])
    assert code == 0
    assert [json.loads(line)["seq"] for line in out.splitlines()] == [1, 2, 3]
    code, out, _ = _run(export_cmd, ["--db", db, "--format", "json"])
    assert [e["event"]["run"] for e in json.loads(out)] == ["r-a", "r-b", "r-a"]
    code, out, _ = _run(export_cmd, ["--db", db, "--format", "text"])
    lines = out.splitlines()
    assert len(lines) == 3 and lines[2].endswith("line\\nbreak")
    assert lines[0].startswith("1 1970-01-01T00:16:40.000Z r-a/c-3f9a1c2e4b5d landlock denied ")


def test_export_filters_by_run_and_since(db: str) -> None:
    def seqs(*args: str) -> list[int]:
        code, out, _ = _run(export_cmd, ["--db", db, *args])
        assert code == 0
        return [json.loads(line)["seq"] for line in out.splitlines()]

    assert seqs("--run", "r-a") == [1, 3]
    assert seqs("--since", "1970-01-01T00:33:20Z") == [2, 3]
    assert seqs("--since", "1970-01-01T00:33:20Z", "--run", "r-a") == [3]
    assert seqs("--since", "10m") == []
    # An unknown run is a NotFoundError (exit 6, with its message), not an empty export.
    with pytest.raises(NotFoundError, match=r"r-none.*stockade ps -a"):
        _run(export_cmd, ["--db", db, "--run", "r-none"])


def test_export_refuses_a_bad_since_with_exit_2(db: str) -> None:
    code, _, err = _run(export_cmd, ["--db", db, "--since", "yesterday"])
    assert code == 2 and "neither an ISO-8601 time" in err


def test_export_to_a_file(db: str, tmp_path: Path) -> None:
    out = tmp_path / "export.json"
    code, stdout, err = _run(export_cmd, ["--db", db, "--format", "json", "--out", str(out)])
    assert (code, stdout) == (0, "")
    assert f"3 event(s) written to {out}" in err
    assert [e["seq"] for e in json.loads(out.read_text())] == [1, 2, 3]


def test_the_default_store_is_in_the_state_directory(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOCKADE_STATE", os.path.dirname(db))
    assert default_db() == db
    assert _run(verify, [])[0] == 0
    monkeypatch.delenv("STOCKADE_STATE")
    if os.geteuid() == 0:
        assert default_db() == "/var/lib/stockade/events.db"


def test_a_corrupt_store_is_a_store_error(tmp_path: Path) -> None:
    garbage = tmp_path / "events.db"
    garbage.write_bytes(b"\x5a" * 8192)
    with pytest.raises(StoreError, match="is corrupt"):
        _run(export_cmd, ["--db", str(garbage)])


def test_a_stored_event_that_is_not_one_fails_a_text_export_clearly(db: str) -> None:
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("UPDATE events SET json = '[]' WHERE seq = 2")
    conn.close()
    assert _run(export_cmd, ["--db", db, "--format", "jsonl"])[0] == 0  # copied as stored
    with pytest.raises(StoreError, match=r"stored event 2 is not a valid event .*; run `stockade verify"):
        _run(export_cmd, ["--db", db, "--format", "text"])
    assert _run(verify, ["--db", db])[0] == 1


def test_export_while_a_writer_appends(tmp_path: Path) -> None:
    """The daemon's case: the command reads a consistent, gapless snapshot of
    a store that another connection keeps appending to."""
    path = str(tmp_path / "events.db")
    stop = threading.Event()
    with open_store(path) as writer:
        writer.append([make_event(i) for i in range(500)])

        def append() -> None:
            i = 0
            while not stop.is_set():
                writer.append([make_event(i)])
                i += 1

        thread = threading.Thread(target=append)
        thread.start()
        try:
            outputs = [_run(export_cmd, ["--db", path])[1] for _ in range(5)]
            code, _, _ = _run(verify, ["--db", path])
        finally:
            stop.set()
            thread.join()
    assert code == 0
    for output in outputs:
        objects = [json.loads(line) for line in output.splitlines()]
        assert [o["seq"] for o in objects] == list(range(1, len(objects) + 1))
        assert len(objects) >= 500
        verifier = ChainVerifier()
        for o in objects:
            assert verifier.check(o["seq"], o["prev"], o["hash"], canonical_json(o["event"]).encode()) is None


def test_export_into_a_closed_pipe_is_quiet(db: str) -> None:
    with open_store(db) as s:
        s.append([make_event(i) for i in range(20000)])
    child = subprocess.Popen(
        [sys.executable, "-c", "from stockade.cli._record_cmds import export_cmd; export_cmd()", "--db", db],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=Path(__file__).parents[2],
    )
    assert child.stdout is not None and child.stderr is not None
    first = child.stdout.readline()
    child.stdout.close()
    assert child.wait(timeout=60) == 0
    assert child.stderr.read() == b""
    child.stderr.close()
    assert json.loads(first)["seq"] == 1


def test_query_results_round_trip_through_export(db: str) -> None:
    with open_store(db, readonly=True) as s:
        stored = list(s.query())
        text = _export(stored, "jsonl")
    events = [
        Event(**{k: v for k, v in json.loads(line)["event"].items() if k != "v"})
        for line in text.splitlines()
    ]
    assert events == [x.event for x in stored]
