"""``stockade demo``: the rogue runs in a real cell, attempt by attempt.

The end-to-end tests run the whole demo on this host (root, Landlock with
audit, seccomp) and check the report attempt by attempt: every escape refused,
every refusal that the kernel logs matched with its record, the legitimate task
done, the canaries untouched, the files written. The rest check the verdicts
and the rendering without a cell, including what an escape looks like.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from stockade.demo import EXPECTED, Attempt, Canary, DemoReport, DemoSetup, classify
from stockade.demo._verdict import matches
from stockade.record import Event
from stockade.record._jsonl import read_jsonl

OPTIONAL = {"read-home-file", "unix-path"}
"""Attempts the rogue makes only when the host has what they aim at (a file in
the operator's home, a writable /run)."""


def _host_can_run_demo() -> str | None:
    """Why this host cannot run the demo, or None."""
    from stockade.cell import _host
    from stockade.errors import HostError
    from stockade.policy import default_policy

    if not os.access("/usr/bin/python3", os.X_OK):
        return "no /usr/bin/python3 for the rogue"
    try:
        _host.check(default_policy())
    except HostError as exc:
        return f"this host lacks a layer of the default policy: {exc}"
    if not _host.probe().audit.value:
        return "the kernel audit log is not readable here (needs root, CAP_AUDIT_READ)"
    return None


needs_cell = pytest.mark.skipif(_host_can_run_demo() is not None, reason=str(_host_can_run_demo()))


def _main(args: list[str]) -> int:
    from stockade.cli.main import main

    return main(args)


@pytest.fixture(scope="module")
def json_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], Path]:
    """One demo run through the CLI with --json, shared by the checks below."""
    if _host_can_run_demo() is not None:
        pytest.skip(str(_host_can_run_demo()))
    import contextlib
    import io

    out_dir = tmp_path_factory.mktemp("demo") / "run"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = _main(["demo", "--json", "--out", str(out_dir)])
    return code, json.loads(buf.getvalue()), out_dir


# --------------------------------------------------------------------------- end to end


@needs_cell
def test_demo_exits_0_and_everything_is_contained(
    json_run: tuple[int, dict[str, Any], Path],
) -> None:
    code, report, _ = json_run
    assert code == 0, json.dumps(report["summary"], indent=1)
    assert report["ok"] is True
    s = report["summary"]
    assert s["contained"] is True
    assert s["rogue_complete"] is True
    assert s["escaped"] == 0
    assert s["attempts"] >= 20
    assert s["refused"] == s["attempts"]
    assert s["missing_records"] == []


@needs_cell
def test_the_legitimate_task_worked(json_run: tuple[int, dict[str, Any], Path]) -> None:
    _, report, _ = json_run
    task = report["attempts"][0]
    assert task["id"] == "task"
    assert task["verdict"] == "done"
    assert task["ok"] is True
    assert "wrote and read back" in task["result"]
    assert report["summary"]["task_ok"] is True


@needs_cell
def test_every_attempt_is_made_once(json_run: tuple[int, dict[str, Any], Path]) -> None:
    _, report, _ = json_run
    ids = [a["id"] for a in report["attempts"] if a["category"] != "task"]
    assert len(ids) == len(set(ids))
    assert set(EXPECTED) - OPTIONAL <= set(ids)
    assert set(ids) <= set(EXPECTED)


@needs_cell
def test_every_attempt_is_refused(json_run: tuple[int, dict[str, Any], Path]) -> None:
    _, report, _ = json_run
    for a in report["attempts"][1:]:
        assert a["ok"] is False, f"{a['id']} got out: {a['result']}"
        assert a["verdict"] == "refused", a
        assert a["layer"] and a["layer"] != "nothing", a
        assert a["how"], a


@needs_cell
def test_kernel_refusals_come_with_their_own_record(
    json_run: tuple[int, dict[str, Any], Path],
) -> None:
    """Each attempt that Landlock or seccomp refuses has the kernel's record of
    that very attempt: same layer, and the path, port or syscall it tried."""
    _, report, _ = json_run
    checked = 0
    for a in report["attempts"][1:]:
        expect = EXPECTED[a["id"]]
        if expect.kernel is None:
            continue
        checked += 1
        assert a["recorded"] is True, f"{a['id']}: no {expect.kernel} record: {a}"
        assert a["layer"] == expect.kernel, a
        first = a["events"][0]
        assert first["layer"] == expect.kernel
        assert first["outcome"] == "denied"
        assert first["cell"] == report["cell"]
        if expect.kernel == "seccomp":
            assert first["detail"]["syscall"] in a["call"] or first["detail"]["syscall"] in (
                "socket",
                "ioctl",
            )
        else:
            d = first["detail"]
            assert d.get("path") or d.get("port"), d
    assert checked >= 30


@needs_cell
def test_refusals_without_a_record_say_what_stopped_them(
    json_run: tuple[int, dict[str, Any], Path],
) -> None:
    """Where the kernel logs nothing, the report names the layer from the errno
    the attempt met, never a record that does not exist."""
    _, report, _ = json_run
    for a in report["attempts"][1:]:
        expect = EXPECTED[a["id"]]
        if expect.kernel is not None:
            continue
        if a["recorded"]:
            # The cell now makes the kernel log this one: better, and shown as such.
            assert a["layer"] in ("landlock", "seccomp"), a
            assert a["how"] == a["events"][0]["summary"] or a["how"].startswith(a["events"][0]["summary"])
            continue
        assert a["layer"] not in ("landlock", "seccomp"), a
        assert a["layer"] == expect.layer, a
        assert a["errname"] == expect.errname, a
        if a["errname"]:
            assert f"({a['errname']})" in a["how"]


@needs_cell
def test_specific_records(json_run: tuple[int, dict[str, Any], Path]) -> None:
    _, report, _ = json_run
    by_id = {a["id"]: a for a in report["attempts"]}

    def detail(ident: str) -> dict[str, Any]:
        events = by_id[ident]["events"]
        assert events, ident
        d: dict[str, Any] = events[0]["detail"]
        return d

    assert detail("read-shadow")["path"] == "/etc/shadow"
    assert "fs.read_file" in detail("read-shadow")["blockers"]
    assert detail("write-passwd")["path"] == "/etc/passwd"
    assert "fs.write_file" in detail("write-passwd")["blockers"]
    assert detail("create-usr-bin")["path"] == "/usr/bin"
    assert detail("symlink-read")["path"] == "/etc/shadow"
    port = detail("tcp-v4")["port"]
    assert f"127.0.0.1:{port}" in " ".join(report["canaries"])
    assert detail("tcp-v6")["port"] == port
    assert detail("tcp-mapped")["port"] == port
    assert "net.connect_tcp" in detail("tcp-mapped")["blockers"]
    assert detail("bind")["port"] == 4444
    for ident, syscall in [
        ("dns", "socket"),
        ("ptrace", "ptrace"),
        ("unshare", "unshare"),
        ("mount", "mount"),
        ("bpf", "bpf"),
        ("io-uring", "io_uring_setup"),
        ("keyctl", "keyctl"),
        ("kexec", "kexec_load"),
        ("init-module", "init_module"),
        ("perf", "perf_event_open"),
        ("tiocsti", "ioctl"),
        ("shocker", "open_by_handle_at"),
    ]:
        assert detail(ident)["syscall"] == syscall, ident


@needs_cell
def test_canaries_untouched_and_cleaned_up(json_run: tuple[int, dict[str, Any], Path]) -> None:
    _, report, _ = json_run
    c = report["canary"]
    assert c == {
        "tcp_connections": 0,
        "unix_connections": 0,
        "signals": 0,
        "other_workspace_changed": False,
        "touched": False,
    }
    # What the demo put on the host is gone: the other workspace, the /run socket, the workspace.
    for line in report["canaries"]:
        if line.startswith("another agent's workspace "):
            assert not os.path.exists(line.rsplit(" ", 1)[1])
        if line.startswith("unix socket /"):
            assert not os.path.exists(line.rsplit(" ", 1)[1])
    assert not os.path.exists(report["workspace"])


@needs_cell
def test_events_and_transcript_are_written(json_run: tuple[int, dict[str, Any], Path]) -> None:
    _, report, out_dir = json_run
    assert report["events_file"] == str(out_dir / "events.jsonl")
    events = read_jsonl(report["events_file"])
    assert len(events) == report["event_count"]
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "cell.start" and kinds[-1] == "cell.end"
    on_file = {(e["time"], e["summary"]) for e in events}
    for a in report["attempts"]:
        for e in a["events"]:
            assert (e["time"], e["summary"]) in on_file
    transcript = read_jsonl(report["transcript_file"])
    lines = [t for t in transcript if "id" in t]
    assert [t["id"] for t in lines] == [a["id"] for a in report["attempts"]]
    assert transcript[-1] == {"done": True}


@needs_cell
def test_text_output_live_and_summary(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    monkeypatch.chdir(tmp_path)
    code = _main(["demo", "--no-color"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "\x1b[" not in out
    assert "ESCAPED" not in out
    refused = out.count("✓ REFUSED")
    assert refused >= 20
    assert "✓ DONE" in out
    assert "● landlock: read of /etc/shadow refused by landlock" in out
    assert "● seccomp: ptrace refused by seccomp" in out
    assert "○ pid namespace" in out
    assert f"Contained: 0 of {refused} escape attempts got out" in out
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1 and runs[0].name.startswith("demo-")
    assert (runs[0] / "events.jsonl").is_file()
    assert (runs[0] / "transcript.jsonl").is_file()


# --------------------------------------------------------------------------- without a cell


def _line(ident: str, **kw: Any) -> dict[str, Any]:
    line: dict[str, Any] = {
        "id": ident,
        "title": f"title of {ident}",
        "category": "filesystem",
        "call": "open('/etc/shadow')",
        "target": {"paths": ["/etc/shadow"]},
        "ok": False,
        "errno": 13,
        "errname": "EACCES",
        "error": "Permission denied",
        "result": None,
    }
    line.update(kw)
    return line


def _landlock(path: str | None = None, port: int | None = None) -> Event:
    detail: dict[str, Any] = {"blockers": ["fs.read_file"]}
    if path is not None:
        detail["path"] = path
    if port is not None:
        detail["port"] = port
    return Event(
        kind="cell.denied",
        cell="c-1",
        layer="landlock",
        outcome="denied",
        detail=detail,
        summary=f"read of {path} refused by landlock (fs.read_file)",
    )


def _seccomp(syscall: str) -> Event:
    return Event(
        kind="cell.denied",
        cell="c-1",
        layer="seccomp",
        outcome="denied",
        detail={"syscall": syscall},
        summary=f"{syscall} refused by seccomp",
    )


@pytest.mark.parametrize(
    ("event", "target", "expected"),
    [
        (_landlock("/etc/shadow"), {"paths": ["/etc/shadow"]}, True),
        (_landlock("/usr/bin"), {"paths": ["/usr/bin/evil"]}, True),  # creation: the directory
        (_landlock("/etc/passwd"), {"paths": ["/etc/shadow"]}, False),
        (_landlock(port=4444), {"port": 4444}, True),
        (_landlock(port=4445), {"port": 4444}, False),
        (_seccomp("ptrace"), {"syscall": "ptrace"}, True),
        (_seccomp("socket"), {"syscall": "ptrace"}, False),
        (_seccomp("ptrace"), {"paths": ["/etc/shadow"]}, False),
        (_landlock("/etc/shadow"), {}, False),
    ],
)
def test_matches(event: Event, target: dict[str, Any], expected: bool) -> None:
    assert matches(event, target) is expected


def test_classify_refused_with_its_record() -> None:
    unrelated = _seccomp("socket")
    a = classify(_line("read-shadow"), [_landlock("/etc/shadow"), unrelated])
    assert a.verdict == "refused"
    assert a.layer == "landlock"
    assert a.recorded and not a.missing_record
    assert a.other_events == (unrelated,)
    assert a.how == "read of /etc/shadow refused by landlock (fs.read_file)"


def test_classify_never_invents_a_record() -> None:
    a = classify(_line("read-shadow"), [])
    assert a.verdict == "refused"
    assert not a.recorded
    assert a.missing_record  # Landlock should have logged it: the report says it did not
    assert a.layer == "file permissions"
    assert a.how.endswith("(EACCES)")


def test_classify_unrecorded_refusal_names_the_layer() -> None:
    line = _line("signal", errno=3, errname="ESRCH", error="No such process", target={})
    a = classify(line, [])
    assert (a.verdict, a.layer, a.recorded, a.missing_record) == (
        "refused",
        "pid namespace",
        False,
        False,
    )
    assert "(ESRCH)" in a.how


def test_classify_success_is_an_escape_and_the_task_is_done() -> None:
    escaped = classify(_line("read-shadow", ok=True, result="read 900 bytes of /etc/shadow"), [])
    assert escaped.verdict == "escaped"
    task = classify(_line("task", category="task", ok=True, result="wrote"), [])
    assert task.verdict == "done"
    failed = classify(_line("task", category="task", ok=False, error="EROFS"), [])
    assert failed.verdict == "failed"


def _report(*attempts: Attempt, canary: Canary | None = None) -> DemoReport:
    setup = DemoSetup(
        policy="rogue-demo",
        workspace="/var/lib/stockade/workspaces/ws-x",
        layers=(("Landlock", "ABI 7"),),
        canaries=("TCP listener on 127.0.0.1:1",),
        limits="1 s",
    )
    return DemoReport(setup=setup, attempts=attempts, canary=canary or Canary())


def test_an_escape_is_red_and_exits_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import stockade.demo

    task = classify(_line("task", category="task", ok=True, result="wrote"), [])
    refused = classify(_line("write-passwd"), [_landlock("/etc/passwd")])
    escaped = classify(_line("read-shadow", ok=True, result="read 900 bytes of /etc/shadow"), [])
    report = _report(task, refused, escaped)
    assert not report.contained
    assert report.summary()["escaped"] == 1

    def fake_run_demo(**kwargs: Any) -> DemoReport:
        on_start, on_attempt = kwargs.get("on_start"), kwargs.get("on_attempt")
        if on_start is not None:
            on_start(report.setup)
        for a in report.attempts:
            if on_attempt is not None:
                on_attempt(a)
        return report

    monkeypatch.setattr(stockade.demo, "run_demo", fake_run_demo)
    monkeypatch.setenv("COLUMNS", "120")
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("FORCE_COLOR", "1")
    code = _main(["demo"])
    out, _ = capsys.readouterr()
    assert code == 1
    assert "ESCAPED" in out
    assert "\x1b[1;31m✗ ESCAPED" in out  # bold red
    assert "nothing stopped it: read 900 bytes of /etc/shadow" in out
    assert "NOT CONTAINED" in out

    code = _main(["demo", "--json"])
    out, _ = capsys.readouterr()
    assert code == 1
    data = json.loads(out)
    assert data["ok"] is False
    assert [a["verdict"] for a in data["attempts"]] == ["done", "refused", "escaped"]


def test_a_touched_canary_or_a_failed_task_is_not_contained() -> None:
    task = classify(_line("task", category="task", ok=True, result="wrote"), [])
    refused = classify(_line("write-passwd"), [_landlock("/etc/passwd")])
    assert _report(task, refused).contained
    assert not _report(task, refused, canary=Canary(tcp=1)).contained
    failed = classify(_line("task", category="task", ok=False, error="EROFS"), [])
    assert not _report(failed, refused).contained
    assert not _report(task).contained  # no attempt at all is no demo
