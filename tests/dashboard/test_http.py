"""The dashboard over HTTP, against a real daemon: who may see it (a token,
loopback names only), who may decide (this page's origin and CSRF token),
and the live stream's resume by the record's sequence number."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from stockade.dashboard import _app
from stockade.record import Event
from tests.daemon.test_server import Wire, close_wires, kind_is  # noqa: F401  (the fixture)
from tests.dashboard._scenario import REPORT_CHARS, Dash, agent_policy, dashboard_daemon

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="cells under the daemon need root on this host")


def _note(dash: Dash, n: int, run: str = "r-000000000001", summary: str = "note") -> list[int]:
    """Record ``n`` events of ``run`` straight through the daemon's recorder; their seqs."""
    recorder = dash.thread.daemon.recorder
    assert recorder is not None
    events = [
        Event(kind="test.note", cell="", layer="broker", outcome="info", run=run, summary=f"{summary} {i}")
        for i in range(n)
    ]
    return [s.seq for s in recorder.record(events)]


def _frames(lines: Any, count: int) -> tuple[list[int], list[str]]:
    """Read SSE lines until ``count`` events came; their ids, and the comments seen."""
    ids: list[int] = []
    comments: list[str] = []
    current: int | None = None
    for line in lines:
        if line.startswith("id: "):
            current = int(line[4:])
        elif line.startswith("data: "):
            stored = json.loads(line[6:])
            assert stored["seq"] == current, "an event's SSE id is its seq"
            ids.append(stored["seq"])
            if len(ids) >= count:
                return ids, comments
        elif line.startswith(":"):
            comments.append(line)
    raise AssertionError(f"the stream ended after {len(ids)} of {count} events")


def test_no_token_no_page(tmp_path: Path) -> None:
    with dashboard_daemon(tmp_path) as dash, dash.client() as anon:
        for path in ("/", "/static/app.js", "/api/runs", "/api/approvals", "/api/stream", "/api/session"):
            response = anon.get(path)
            assert response.status_code == 401, path
            assert "stockade dashboard" in response.text
        assert anon.get("/", headers={"authorization": "Bearer not-the-token"}).status_code == 401
        assert anon.get("/login", params={"token": "wrong"}).status_code == 401
        assert anon.get("/", headers={"cookie": f"{_app.COOKIE}=forged"}).status_code == 401
        # Control: the URL the operator got logs in, sets a cookie the page's
        # scripts cannot read, and takes the token out of the address bar.
        login = anon.get("/login", params={"token": dash.token})
        app = login.headers["location"]
        assert login.status_code == 303 and app.startswith("/app/") and dash.token not in app
        cookie = login.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and f"path={app.lower()}" in cookie
        assert dash.token.lower() not in cookie, "the cookie is a session's key, not the token"
        page = anon.get(app)
        assert page.status_code == 200 and "app.js" in page.text
        csp = page.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert "unsafe-inline" not in csp
        assert page.headers["referrer-policy"] == "no-referrer"
        assert anon.get(f"{app}static/app.js").status_code == 200
        session = anon.get(f"{app}api/session").json()
        assert session["mode"] == "live" and session["operator"] == "root" and len(session["csrf"]) == 64
        # The cookie opens its own session's prefix only: not the root, not
        # another session's (a browser sends a host's cookies to all its ports
        # and paths it is scoped to: this one only to the operator's prefix).
        assert anon.get("/api/session").status_code == 401
        assert anon.get("/app/another-session/api/session").status_code == 401
        second = anon.get("/login", params={"token": dash.token}).headers["location"]
        assert second != app and anon.get(f"{second}api/session").status_code == 200
        # A login may land on a page of the app, and nowhere else.
        landed = anon.get("/login", params={"token": dash.token, "page": "/debrief/r-0123456789ab"})
        assert landed.headers["location"].endswith("/#/debrief/r-0123456789ab")
        for elsewhere in ("//attacker.example/", "javascript:alert(1)", "/run/x#y", "https://a.example"):
            location = anon.get("/login", params={"token": dash.token, "page": elsewhere}).headers["location"]
            assert location.startswith("/app/") and location.endswith("/"), (elsewhere, location)


def test_only_loopback_names_are_answered(tmp_path: Path) -> None:
    """A name an attacker points at 127.0.0.1 (DNS rebinding) gets no page,
    even with the token; the loopback names do."""
    with dashboard_daemon(tmp_path) as dash, dash.authed() as http:
        port = dash.base.rsplit(":", 1)[1]
        assert http.get("/api/runs", headers={"host": f"attacker.example:{port}"}).status_code == 421
        assert http.get("/api/runs", headers={"host": f"localhost:{port}"}).status_code == 200
        assert http.get("/api/runs").status_code == 200
    with pytest.raises(Exception, match="loopback"):
        from stockade.dashboard import DashboardServer, ReplaySource

        DashboardServer(ReplaySource("x", []), host="0.0.0.0")


def test_another_origin_cannot_decide_and_this_page_can(tmp_path: Path) -> None:
    with dashboard_daemon(tmp_path) as dash, dash.authed() as http, dash.control() as control:
        events = Wire(dash.thread.socket_path)
        events.call("events.subscribe")
        run = control.call("run.start", policy_path=str(agent_policy(tmp_path)))["id"]
        events.until(kind_is("approval.asked", run))
        [pending] = http.get("/api/approvals").json()["approvals"]
        # Every argument whole: the report's whole text, not a cut of it.
        assert len(pending["args"]["content"]) == REPORT_CHARS and pending["args"]["content"].startswith(
            "<script>"
        )
        csrf = http.get("/api/session").json()["csrf"]
        url = f"/api/approvals/{pending['id']}"
        body = {"decision": "approve", "reason": "looks fine"}
        refused = [
            http.post(url, json=body, headers={"origin": "http://attacker.example", "x-stockade-csrf": csrf}),
            http.post(url, json=body, headers={"x-stockade-csrf": csrf}),  # no Origin at all
            http.post(url, json=body, headers={"origin": dash.base}),  # no CSRF token
            http.post(url, json=body, headers={"origin": dash.base, "x-stockade-csrf": "0" * 64}),
            http.post(
                url,
                content="decision=approve",
                headers={"origin": dash.base, "x-stockade-csrf": csrf, "content-type": "text/plain"},
            ),
        ]
        assert [r.status_code for r in refused] == [403, 403, 403, 403, 415]
        with dash.client() as anon:  # and nobody without the token
            assert (
                anon.post(url, json=body, headers={"origin": dash.base, "x-stockade-csrf": csrf}).status_code
                == 401
            )
        assert [a["id"] for a in http.get("/api/approvals").json()["approvals"]] == [pending["id"]]
        # Control: this page's own request decides, and the agent goes on at once.
        ok = http.post(url, json=body, headers={"origin": dash.base, "x-stockade-csrf": csrf})
        assert ok.status_code == 200, ok.text
        assert ok.json()["approval"]["state"] == "approved"
        seen = events.until(kind_is("run.end", run))
        decided = next(e for e in seen if e["event"]["kind"] == "approval.decided")["event"]
        assert decided["detail"]["by"] == "root (dashboard)" and decided["detail"]["reason"] == "looks fine"
        assert (tmp_path / "out" / "report.md").stat().st_size == REPORT_CHARS
        end = next(e for e in seen if e["event"]["kind"] == "run.end")["event"]
        assert end["detail"]["exit_code"] == 0
        again = http.post(url, json=body, headers={"origin": dash.base, "x-stockade-csrf": csrf})
        assert again.status_code in (404, 409)
        events.close()


def test_the_stream_resumes_after_the_last_event_id(tmp_path: Path) -> None:
    run = "r-00000000abcd"
    with dashboard_daemon(tmp_path) as dash, dash.authed() as http:
        first = _note(dash, 5, run)
        _note(dash, 3, "r-00000000ffff")  # another run's: not in this run's stream
        with http.stream(
            "GET", "/api/stream", params={"run": run}, headers={"last-event-id": str(first[2])}
        ) as s:
            lines = s.iter_lines()
            ids, _ = _frames(lines, 2)
            assert ids == first[3:], "resumed just after the id the browser had"
            later = _note(dash, 4, run)  # live now
            ids, _ = _frames(lines, 4)
            assert ids == later


def test_a_slow_reader_resyncs_from_the_store_and_misses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader that does not keep up overflows its own queue, never the bus:
    the daemon drops nobody, records no ``subscriber.dropped``, and the
    stream reads what it missed from the store, each event once, in order."""
    monkeypatch.setattr(_app, "FEED_LIMIT", 50)
    run = "r-00000000abcd"
    with dashboard_daemon(tmp_path) as dash, dash.authed() as http:
        with http.stream("GET", "/api/stream", params={"run": run}) as s:
            lines = s.iter_lines()
            assert next(lines).startswith("retry:")
            # One recorder call: the bus hands all of them to the feed in one
            # pass of the loop, before the stream can send any, so it overflows.
            seqs = _note(dash, 3000, run)
            ids, comments = _frames(lines, 3000)
        assert ids == seqs
        assert any("resync" in c for c in comments), comments
        assert dash.thread.daemon.bus.dropped == 0
        with dash.control() as control:
            page = control.call("events.export", format="jsonl", limit=1000, after_seq=seqs[-1])
        assert "subscriber.dropped" not in page["data"]


def test_an_events_html_is_served_as_json_text(tmp_path: Path) -> None:
    """The API never serves an event as HTML: JSON with nosniff (the browser
    test checks the page writes it as text)."""
    with dashboard_daemon(tmp_path) as dash, dash.authed() as http:
        _note(dash, 1, summary="<img src=x onerror=alert(1)>")
        response = http.get("/api/events", params={"run": "r-000000000001"})
        assert response.headers["content-type"].startswith("application/json")
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.json()["events"][0]["event"]["summary"] == "<img src=x onerror=alert(1)> 0"


def test_unknown_static_files_and_formats(tmp_path: Path) -> None:
    with dashboard_daemon(tmp_path) as dash, dash.authed() as http:
        assert http.get("/static/../_app.py").status_code == 404
        assert http.get("/static/secret.txt").status_code == 404
        _note(dash, 2)
        assert http.get("/api/runs/r-000000000001/download", params={"format": "pdf"}).status_code == 400
        text = http.get("/api/runs/r-000000000001/download", params={"format": "text"})
        assert text.status_code == 200 and "note 1" in text.text
        assert httpx.get(f"{dash.base}/api/runs", timeout=5).status_code == 401


def test_the_bench_pages_read_a_campaign_and_recheck_its_bundles(tmp_path: Path) -> None:
    from tests.dashboard._scenario import campaign

    run = "r-00000000beef"
    with dashboard_daemon(tmp_path) as dash, dash.authed() as http:
        _note(dash, 3, run)
        stored = http.get("/api/events", params={"run": run}).json()["events"]
        out = campaign(tmp_path, stored, run)
        assert http.get("/api/bench").json()["campaigns"] == []
        with dash.control() as control:  # `stockade dashboard --bench DIR`
            control.call("dashboard.open", bench=[str(out)])
        [found] = http.get("/api/bench").json()["campaigns"]
        [trial] = found["trials"]
        assert (trial["task"], trial["status"], trial["bundle"]) == (
            "fix-bug",
            "completed",
            "fix-bug-20261201-000000",
        )
        page = http.get(f"/api/bench/0/{trial['bundle']}").json()
        assert page["problems"] == [] and page["runs"] == {"agent": run}
        assert "log.json" in page["files"] and "score.json" in page["files"]
        score = http.get(f"/api/bench/0/{trial['bundle']}/files/score.json")
        assert score.status_code == 200 and score.json()["task"] == "fix-bug"
        # Only what the manifest lists is served: not the campaign's other files.
        (out / trial["bundle"] / "planted.txt").write_text("not in the manifest")
        for bad in ("planted.txt", "../results.json", "%2e%2e/results.json"):
            assert http.get(f"/api/bench/0/{trial['bundle']}/files/{bad}").status_code == 404, bad
        assert http.get("/api/bench/0/no-such-trial").status_code == 404
        assert http.get(f"/api/bench/7/{trial['bundle']}").status_code == 404
        # A bundle edited afterwards is said not to verify.
        (out / trial["bundle"] / "score.json").write_text('{"task": "fix-bug", "reward": 0}')
        problems = http.get(f"/api/bench/0/{trial['bundle']}").json()["problems"]
        assert any("score.json" in p for p in problems), problems
    # The trial's bundle replays: its log.json is the record's events.
    from stockade.dashboard import load_replay

    replay = load_replay(out / trial["bundle"])
    assert [s["seq"] for s in replay.stored] == [s["seq"] for s in stored]


def test_a_stopping_daemon_ends_its_live_streams(tmp_path: Path) -> None:
    """Open streams do not hold the daemon up: they get the daemon's last
    event and end, and the server stops without cancelling them."""
    with dashboard_daemon(tmp_path) as dash, dash.authed() as http:
        with http.stream("GET", "/api/stream") as s:
            lines = s.iter_lines()
            _frames(lines, 1)  # daemon.start
            dash.thread.stop()
            rest = list(lines)  # ends: the server closed the stream
        kinds = [json.loads(line[6:])["event"]["kind"] for line in rest if line.startswith("data: ")]
        assert kinds[-1:] == ["daemon.stop"], rest


def test_stockade_dashboard_replay_serves_as_nobody_without_a_daemon(tmp_path: Path) -> None:
    """``stockade dashboard --replay`` run by an unprivileged user (no root,
    no daemon, no kernel feature asked for) prints a URL whose token opens
    the replay, and nothing opens it without the token."""
    import shutil
    import subprocess
    import sys
    import tempfile

    run = "r-00000000cafe"
    with dashboard_daemon(tmp_path) as dash, dash.authed() as http:
        _note(dash, 4, run, summary="kept")
        export = http.get(f"/api/runs/{run}/download", params={"format": "jsonl"}).content
    shared = Path(tempfile.mkdtemp(prefix="stockade-replay-"))
    try:
        shared.chmod(0o755)
        (shared / "run.jsonl").write_bytes(export)
        (shared / "run.jsonl").chmod(0o644)
        stockade = Path(sys.executable).parent / "stockade"
        with subprocess.Popen(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(stockade), "dashboard",
             "--replay", str(shared / "run.jsonl")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=shared,
        ) as proc:  # fmt: skip
            try:
                assert proc.stdout is not None
                line = proc.stdout.readline()  # the server listens once it prints this
                assert "REPLAY of" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
                url = line.split(" at ", 1)[1].strip()
                base, token = url.split("/login", 1)[0], url.split("token=", 1)[1]
                assert httpx.get(f"{base}/api/runs", timeout=10).status_code == 401
                runs = httpx.get(f"{base}/api/runs", headers={"authorization": f"Bearer {token}"}, timeout=10)
                assert [r["id"] for r in runs.json()["runs"]] == [run]
                session = httpx.get(
                    f"{base}/api/session", headers={"authorization": f"Bearer {token}"}, timeout=10
                )
                assert session.json()["mode"] == "replay"
            finally:
                proc.terminate()  # this test's own child, by its pid
    finally:
        shutil.rmtree(shared)


def test_stockade_dashboard_prints_a_working_url_or_says_why_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from stockade.cli._app import run_app
    from stockade.daemon._server import DaemonThread

    sock = str(tmp_path / "d.sock")
    assert run_app(["dashboard", "--socket", sock]) == 4  # no daemon there
    assert "not running" in capsys.readouterr().err
    with DaemonThread(state=str(tmp_path / "bare"), socket_path=sock):  # a daemon without the dashboard
        assert run_app(["dashboard", "--socket", sock]) == 5
        assert "serves no dashboard" in capsys.readouterr().err
    with dashboard_daemon(tmp_path) as dash:
        assert run_app(["dashboard", "--socket", dash.thread.socket_path]) == 0
        url = capsys.readouterr().out.strip()
        with httpx.Client(timeout=10, follow_redirects=True) as browser:
            page = browser.get(url)
            assert page.status_code == 200 and "app.js" in page.text
            assert str(page.url).startswith(f"{dash.base}/app/")
