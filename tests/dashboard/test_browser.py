"""The dashboard in a real headless Chromium (Debian's, driven by Playwright,
never a downloaded browser), against a real daemon running a real cell.

Every wait is Playwright's ``expect`` on the page itself (it polls the DOM up
to its timeout) or a daemon subscription: nothing sleeps on a guess.

``STOCKADE_SCREENSHOTS=1`` also writes the pages' screenshots to docs/img/
(docs/DASHBOARD.md shows them).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from stockade.bench._containment import containment
from stockade.dashboard import DashboardServer, load_replay
from stockade.record import Event
from tests.daemon.test_server import Wire, close_wires, kind_is  # noqa: F401  (the fixture)
from tests.dashboard._scenario import REPORT_CHARS, Dash, agent_policy, campaign, dashboard_daemon

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="cells under the daemon need root on this host")

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
WAIT_MS = 30_000
SHOTS = Path(__file__).resolve().parents[2] / "docs" / "img"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: run scripts/setup.sh (it installs Debian's chromium)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@contextlib.contextmanager
def page_of(browser: Browser, dash_url: str) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(dash_url)  # /login?token=…, then / with the cookie
    expect(page.locator("#source")).to_contain_text("root", timeout=WAIT_MS)
    try:
        yield page
    finally:
        context.close()
    # No script error and no CSP violation on any page the test opened.
    assert not errors, errors


def app(page: Page) -> str:
    """The page's own prefix (``/app/SID/``), where its session's cookie goes."""
    return page.url.split("#", 1)[0]


def shot(page: Page, name: str) -> None:
    if os.environ.get("STOCKADE_SCREENSHOTS") == "1":
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"dashboard-{name}.png"))


def _run_events(dash: Dash, run: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    after = 0
    with dash.control() as control:
        while True:
            page = control.call("events.export", format="jsonl", run=run, limit=1000, after_seq=after)
            out += [json.loads(line) for line in page["data"].splitlines() if line]
            if not page["more"]:
                return out
            after = page["last_seq"]


def test_a_run_live_paired_approved_reloaded_and_debriefed(browser: Browser, tmp_path: Path) -> None:
    with dashboard_daemon(tmp_path) as dash, page_of(browser, dash.url) as page, dash.control() as control:
        events = Wire(dash.thread.socket_path)
        events.call("events.subscribe")
        run = control.call("run.start", policy_path=str(agent_policy(tmp_path)))["id"]

        # The runs page lists it, live.
        expect(page.locator(f'tr[data-run="{run}"]')).to_contain_text("dash-agent", timeout=WAIT_MS)
        page.goto(f"{app(page)}#/run/{run}")
        agent, enforcement = page.locator("#agent-pane"), page.locator("#enforcement-pane")

        # Both panes fill while the run lives: it is waiting for its approval now.
        events.until(kind_is("approval.asked", run))
        calls = agent.locator('[data-kind="tool.call"]')
        expect(calls).to_have_count(3, timeout=WAIT_MS)
        kernel = enforcement.locator('[data-kind="cell.denied"][data-layer="landlock"]')
        expect(kernel.first).to_be_visible(timeout=WAIT_MS)
        # The kernel's refusal of /etc is paired with the tool call that made it,
        # by its cell and the call's span; the broker's denial by the call's id.
        write_call = calls.filter(has_text="write_file")
        call_id = write_call.get_attribute("data-tool-call")
        assert call_id
        expect(kernel.first).to_have_attribute("data-paired-with", call_id, timeout=WAIT_MS)
        expect(kernel.first).to_have_attribute("data-pair", "cell+time")
        expect(kernel.first).to_have_class(_has("refused"))
        denied = enforcement.locator('[data-kind="intent"][data-outcome="denied"]')
        expect(denied).to_have_count(1, timeout=WAIT_MS)
        read_call = calls.filter(has_text="broker_read").first.get_attribute("data-tool-call")
        expect(denied).to_have_attribute("data-paired-with", str(read_call))
        expect(denied).to_have_attribute("data-pair", "id")
        expect(write_call.locator('.effect[data-layer="landlock"]')).to_have_count(1)
        expect(page.locator("#pairing-how")).to_contain_text("paired by cell+time")

        # Reload mid-run: the same events, each once.
        before = sorted(
            int(s) for s in page.locator("[data-seq]").evaluate_all("ns => ns.map(n => n.dataset.seq)")
        )
        page.reload()
        expect(page.locator("[data-seq]")).to_have_count(len(before), timeout=WAIT_MS)
        after = sorted(
            int(s) for s in page.locator("[data-seq]").evaluate_all("ns => ns.map(n => n.dataset.seq)")
        )
        assert after == before and len(set(after)) == len(after)

        # The approvals inbox: the whole report, shown as text, decided from the page.
        page.goto(f"{app(page)}#/approvals")
        card = page.locator("article.approval")
        expect(card).to_have_count(1, timeout=WAIT_MS)
        expect(page.locator("#approval-count")).to_have_text("1")
        content = card.locator("dd").filter(has_text="line 699 of the report").locator("pre.arg-value")
        text = content.text_content() or ""
        assert len(text) == REPORT_CHARS and text.startswith("<script>document.title='owned'</script>")
        assert page.title() == "stockade dashboard", "the report's script ran"
        shot(page, "approvals")
        card.locator("textarea.reason").fill("the report is fine")
        card.locator("button.approve").click()
        expect(card.locator(".result")).to_have_text("approved by root (dashboard)", timeout=WAIT_MS)

        # The agent got its answer at once and went on to the end.
        seen = events.until(kind_is("run.end", run))
        decided = next(e["event"] for e in seen if e["event"]["kind"] == "approval.decided")
        assert decided["detail"]["by"] == "root (dashboard)"
        assert decided["detail"]["reason"] == "the report is fine"
        assert (tmp_path / "out" / "report.md").stat().st_size == REPORT_CHARS
        page.goto(f"{app(page)}#/run/{run}")
        expect(page.locator("#run-counts")).to_contain_text("the run ended", timeout=WAIT_MS)
        expect(agent.locator('[data-kind="tool.call"]')).to_have_count(4, timeout=WAIT_MS)
        report_call = agent.locator('[data-kind="tool.call"]').filter(has_text="write_report")
        expect(report_call.locator('.effect[data-pair="id"]')).to_have_count(1, timeout=WAIT_MS)
        expect(page.locator("#transcript")).to_contain_text('"step": "done"', timeout=WAIT_MS)
        expect(page.locator("#persistence")).to_contain_text("Persistence report")

        # The debrief's figures are the record's.
        # (counted as `stockade bench` counts a trial's reaches)
        stored = _run_events(dash, run)
        workspace = stored[0]["event"]["detail"]["workspace"]
        attempts = containment(stored, root=workspace, hidden=()).reaches
        layers: dict[str, int] = {}
        categories: dict[str, int] = {}
        for r in attempts:
            layers[r.layer] = layers.get(r.layer, 0) + 1
            categories[r.category] = categories.get(r.category, 0) + 1
        assert layers.get("landlock") and layers.get("broker") == 1
        assert categories == {"outside-workspace": len(attempts)}
        verified = control.call("verify")
        page.goto(f"{app(page)}#/debrief/{run}")
        expect(page.locator("#escalation")).to_have_text(str(len(attempts)), timeout=WAIT_MS)
        expect(page.locator("#grade")).to_have_text("A")
        for name, count in layers.items():
            expect(page.locator(f'#by-layer tr[data-key="{name}"] td.num')).to_have_text(str(count))
        for name, count in categories.items():
            expect(page.locator(f'#by-category tr[data-key="{name}"] td.num')).to_have_text(str(count))
        expect(page.locator("#record-events")).to_have_text(str(len(stored)))
        expect(page.locator("#reaches tbody tr")).to_have_count(len(attempts))
        expect(page.locator("#run-head")).to_have_text(f"{stored[-1]['seq']}:{stored[-1]['hash']}")
        expect(page.locator("#verified")).to_contain_text("Verified")
        head = page.locator("#chain-head").text_content() or ""
        seq, digest = head.split(":")
        assert int(seq) >= verified["checked"] - 2 and len(digest) == 64  # the store grew by the daemon's own
        assert page.locator("#plot-layers rect.bar").count() >= len(layers)
        assert page.locator("#plot-categories rect.bar").count() >= len(categories)
        page.goto(f"{app(page)}#/runs")
        expect(page.locator(f'tr[data-run="{run}"]')).to_contain_text("ended", timeout=WAIT_MS)
        events.close()


class _has:
    """A class attribute that contains ``name`` (Playwright takes a pattern)."""

    def __new__(cls, name: str) -> Any:
        import re

        return re.compile(rf"(^|\s){re.escape(name)}(\s|$)")


def _record(dash: Dash, events: list[Event]) -> list[int]:
    recorder = dash.thread.daemon.recorder
    assert recorder is not None
    return [s.seq for s in recorder.record(events)]


def test_an_event_holding_html_is_shown_as_text(browser: Browser, tmp_path: Path) -> None:
    run = "r-0000000000aa"
    hostile = "<img src=x onerror=\"document.title='owned'\"><script>document.title='owned'</script>"
    with dashboard_daemon(tmp_path) as dash, page_of(browser, dash.url) as page:
        _record(
            dash,
            [
                Event(
                    kind="run.start", cell="", layer="cell", outcome="info", run=run, detail={"name": hostile}
                ),
                Event(
                    kind="intent",
                    cell="c-0000000000aa",
                    layer="broker",
                    outcome="denied",
                    run=run,
                    summary=hostile,
                    detail={"intent": "fs.read", "args": {"path": hostile}},
                ),
            ],
        )
        child = "r-0000000000ab"
        _record(
            dash,
            [
                Event(kind="run.start", cell="", layer="cell", outcome="info", run="r-0000000000ac",
                      detail={"name": "unrelated"}),
                Event(kind="run.start", cell="", layer="cell", outcome="info", run=child,
                      detail={"name": "helper", "parent": run}),
            ],
        )  # fmt: skip
        page.goto(f"{app(page)}#/runs")
        expect(page.locator(f'tr[data-run="{run}"]')).to_contain_text(hostile, timeout=WAIT_MS)
        # The family tree: the helper under its parent, marked so, before the unrelated run.
        order = page.locator("tr[data-run]").evaluate_all("rows => rows.map(r => r.dataset.run)")
        assert order == [run, child, "r-0000000000ac"], order
        expect(page.locator(f'tr[data-run="{child}"] .tree')).to_have_text("└ ")
        page.goto(f"{app(page)}#/run/{run}")
        row = page.locator('#enforcement-pane [data-kind="intent"]')
        expect(row.locator("summary")).to_have_text(hostile, timeout=WAIT_MS)
        expect(row.locator("pre")).to_contain_text("<script>")
        # Shown, not parsed: no element came of it, and nothing ran.
        assert page.locator("#view img, #view script").count() == 0
        assert page.title() == "stockade dashboard"
        # Control: the page did render the row as an element of its own.
        assert row.count() == 1


def test_thousands_of_events_are_drawn_in_batches_and_said_when_cut(browser: Browser, tmp_path: Path) -> None:
    run = "r-0000000000bb"
    with dashboard_daemon(tmp_path) as dash, page_of(browser, dash.url) as page:
        _record(
            dash,
            [
                Event(
                    kind="run.start", cell="", layer="cell", outcome="info", run=run, detail={"name": "flood"}
                )
            ],
        )
        page.goto(f"{app(page)}#/run/{run}")
        expect(page.locator("#run-counts")).to_contain_text("1 events", timeout=WAIT_MS)
        for _ in range(6):  # arrives live, 6,000 refusals in six bursts
            _record(
                dash,
                [
                    Event(
                        kind="http.request",
                        cell="c-0000000000bb",
                        layer="gateway",
                        outcome="denied",
                        run=run,
                        summary=f"GET https://exfil.example/{i} denied",
                    )
                    for i in range(1000)
                ],
            )
        expect(page.locator("#run-counts")).to_contain_text("6001 events, 6000 refusals", timeout=WAIT_MS)
        # The page keeps its last 4,000 rows drawn, and says what it left out.
        expect(page.locator("#enforcement-pane .row")).to_have_count(4000)
        expect(page.locator("#enforcement-hidden")).to_contain_text(
            "2001 earlier rows are not drawn"
        )  # run.start too
        # And it still answers at once.
        assert page.evaluate("() => 1 + 1") == 2


@contextlib.contextmanager
def replay_server(path: Path, bench: Path | None = None) -> Iterator[tuple[DashboardServer, str]]:
    """A replay's server on a loop of its own, as ``stockade dashboard --replay`` runs it."""
    loop = asyncio.new_event_loop()
    server = DashboardServer(load_replay(path))
    if bench is not None:
        server.campaigns.add(bench)
    started = threading.Event()

    def main() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(server.start())
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    assert started.wait(30)
    try:
        yield server, server.url("operator")
    finally:
        asyncio.run_coroutine_threadsafe(server.close(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


def test_a_replay_is_labelled_and_serves_the_record_without_a_daemon(
    browser: Browser, tmp_path: Path
) -> None:
    run = "r-0000000000cc"
    with dashboard_daemon(tmp_path) as dash, dash.authed() as http:
        _record(
            dash,
            [
                Event(
                    kind="run.start", cell="", layer="cell", outcome="info", run=run, detail={"name": "kept"}
                ),
                Event(
                    kind="cell.denied",
                    cell="c-0000000000cc",
                    layer="seccomp",
                    outcome="denied",
                    run=run,
                    summary="ptrace refused by seccomp",
                    detail={"syscall": "ptrace", "action": "errno"},
                ),
                Event(
                    kind="run.end", cell="", layer="cell", outcome="info", run=run, detail={"state": "ended"}
                ),
            ],
        )
        bundle = tmp_path / "run.tar.gz"
        bundle.write_bytes(http.get(f"/api/runs/{run}/download", params={"format": "bundle"}).content)
        export = tmp_path / "run.jsonl"
        export.write_bytes(http.get(f"/api/runs/{run}/download", params={"format": "jsonl"}).content)
        bench = campaign(tmp_path, [json.loads(line) for line in export.read_text().splitlines()], run)
    # The daemon is gone: the replays need none.
    for path in (bundle, export):
        with replay_server(path, bench) as (_server, url), page_of(browser, url) as page:
            expect(page.locator("#replay-banner")).to_contain_text("REPLAY", timeout=WAIT_MS)
            expect(page.locator(f'tr[data-run="{run}"]')).to_contain_text("kept", timeout=WAIT_MS)
            page.goto(f"{app(page)}#/debrief/{run}")
            expect(page.locator("#verified")).to_contain_text("Verified: 3 events", timeout=WAIT_MS)
            expect(page.locator('#by-layer tr[data-key="seccomp"] td.num')).to_have_text("1")
            expect(page.locator('#by-category tr[data-key="privilege"] td.num')).to_have_text("1")
            page.goto(f"{app(page)}#/approvals")
            expect(page.locator("#approvals-empty")).to_contain_text("replay", timeout=WAIT_MS)
            if path == bundle:
                shot(page, "replay")
                # The bench pages: the campaign's table, its trial's bundle re-checked.
                page.goto(f"{app(page)}#/bench")
                trial_row = page.locator('tr[data-task="fix-bug"]')
                expect(trial_row).to_contain_text("completed", timeout=WAIT_MS)
                expect(page.locator(".campaign-summary")).to_contain_text("containment grade A")
                shot(page, "bench")
                trial_row.locator("a").click()
                expect(page.locator("#bundle-check")).to_contain_text("The bundle verifies", timeout=WAIT_MS)
                expect(page.locator("#bundle-files")).to_contain_text("log.json")
                expect(page.locator('#trial-categories tr[data-key="privilege"] td.num')).to_have_text("1/1")


def test_the_demo_live_in_the_dashboard(browser: Browser, tmp_path: Path) -> None:
    """``stockade demo --dashboard``'s hooks, with the real demo: its agent's
    35 refusals land live, each kernel refusal paired with the same tool call
    the demo's own report pairs it with, and the debrief of the halted run
    agrees with its record."""
    import queue
    import socket

    from stockade.daemon._client import Client
    from stockade.dashboard import attach
    from stockade.demo import DemoOptions, run_agent_demo

    # The demo's daemon lives in the demo's network namespace; the page's
    # socket is made here, in the host's, as `stockade demo --dashboard` does.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    told: queue.Queue[Any] = queue.Queue()
    go, done = threading.Event(), threading.Event()
    result: dict[str, Any] = {}

    def on_daemon(thread: Any) -> None:
        attach(thread.daemon, sock=sock)
        with Client(thread.socket_path, timeout=30) as client:
            told.put(client.call("dashboard.open")["url"])
        assert go.wait(60), "the test never opened the page"

    def before_stop(report: Any) -> None:
        told.put(report)
        assert done.wait(120), "the test never finished with the page"

    def main() -> None:
        try:
            result["report"] = run_agent_demo(
                DemoOptions(out_dir=str(tmp_path / "demo")), on_daemon=on_daemon, before_stop=before_stop
            )
        except BaseException as exc:  # handed to the test below
            result["error"] = exc
            told.put(exc)

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    try:
        url = told.get(timeout=120)
        assert isinstance(url, str), url
        with page_of(browser, url) as page:
            go.set()
            row = page.locator("tr[data-run]")
            expect(row).to_have_count(1, timeout=WAIT_MS)
            run = row.get_attribute("data-run")
            page.goto(f"{app(page)}#/run/{run}")
            enforcement = page.locator("#enforcement-pane")
            expect(page.locator("#agent-pane [data-kind='tool.call']").first).to_be_visible(timeout=WAIT_MS)
            expect(enforcement.locator("[data-kind='run.halted']")).to_have_count(1, timeout=60_000)
            report = told.get(timeout=120)
            assert not isinstance(report, BaseException), report
            shot(page, "run")
            # Each kernel refusal the demo's report ties to a call (by its own
            # clock: the agent's printed times) is tied here to the tool.call
            # record of that same call (same tool, same arguments). The ids
            # differ: the demo knows the model's call id, the record the SDK's.
            expected = {
                e["seq"]: c
                for c in report.calls
                if c.tool_recorded  # a call the tripwire cut short has no record
                for e in c.events
                if e.get("layer") in ("landlock", "seccomp") and e.get("kind") == "cell.denied"
            }
            assert len(expected) >= 10, "the demo made fewer kernel refusals than it does"
            for seq, call in expected.items():
                kernel_row = enforcement.locator(f'[data-seq="{seq}"]')
                expect(kernel_row).to_have_attribute("data-pair", "cell+time", timeout=WAIT_MS)
                paired = kernel_row.get_attribute("data-paired-with")
                detail = json.loads(
                    page.locator(f'#agent-pane [data-tool-call="{paired}"] pre').text_content() or "{}"
                )
                assert (detail["name"], detail["args"]) == (call.tool, call.arguments), (seq, call.tool)
            page.goto(f"{app(page)}#/debrief/{run}")
            expect(page.locator("#grade")).to_have_text("A", timeout=WAIT_MS)
            expect(page.locator("#verified")).to_contain_text("Verified")
            expect(page.locator("#persistence")).to_contain_text(".envrc")
            shot(page, "debrief")
            page.goto(f"{app(page)}#/runs")
            expect(page.locator(f'tr[data-run="{run}"]')).to_contain_text("halted", timeout=WAIT_MS)
            expect(page.locator(f'tr[data-run="{run}"]')).to_contain_text("35/35")
            page.locator("#run-filter").fill("seccomp")  # a layer it was refused by
            expect(page.locator(f'tr[data-run="{run}"]')).to_be_visible()
            page.locator("#run-filter").fill("no-such-run")
            expect(page.locator("#runs-empty")).to_have_text("No run matches the filter.")
            expect(page.locator("tr[data-run]")).to_have_count(0)
            page.locator("#run-filter").fill("")
            shot(page, "runs")
    finally:
        go.set()
        done.set()
        thread.join(120)
        sock.close()
    assert "error" not in result, result.get("error")
    assert result["report"].contained
    # The demo's run directory replays: its record verifies, its transcript is there.
    replay = load_replay(tmp_path / "demo")
    [replayed] = _sync(replay.runs())
    assert replayed["state"] == "halted" and replayed["tripwire"] == 35
    assert _sync(replay.verify(replayed["id"]))["ok"]
    assert '"tool"' in _sync(replay.transcript(replayed["id"]))["text"]


def _sync(coro: Any) -> Any:
    """``asyncio.run`` in a thread of its own: Playwright's loop runs in this one."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result(30)


def test_a_dropped_stream_resumes_after_the_last_event_it_got(browser: Browser, tmp_path: Path) -> None:
    """The browser's own reconnect: the server drops the run page's stream,
    the page's EventSource comes back with ``Last-Event-ID`` = the last seq it
    drew, and the events stored meanwhile arrive, each once."""
    run = "r-0000000000dd"
    note = [Event(kind="test.note", cell="", layer="broker", outcome="info", run=run) for _ in range(10)]
    with dashboard_daemon(tmp_path) as dash, page_of(browser, dash.url) as page:
        streams: list[dict[str, str]] = []
        page.on("request", lambda r: streams.append(r.all_headers()) if "api/stream" in r.url else None)
        seqs = _record(dash, note)
        page.goto(f"{app(page)}#/run/{run}")
        expect(page.locator("#run-counts")).to_contain_text("10 events", timeout=WAIT_MS)
        expect(page.locator("#stream-status")).to_have_text("live")
        server = dash.server()
        assert server is not None
        with page.expect_request(lambda r: "api/stream" in r.url, timeout=WAIT_MS) as again:
            dash.thread.call(lambda: server.listening.close_streams(stopping=False))
        assert again.value.all_headers().get("last-event-id") == str(seqs[-1])
        later = _record(dash, note[:5])
        expect(page.locator("#run-counts")).to_contain_text("15 events", timeout=WAIT_MS)
        drawn = page.locator("[data-seq]").evaluate_all("ns => ns.map(n => Number(n.dataset.seq))")
        assert drawn == seqs + later
        assert len(streams) == 2, "one reconnect, no more"
