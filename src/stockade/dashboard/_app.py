"""The dashboard's web app: a Starlette application over a ``Source``.

What keeps it the operator's alone (docs/DASHBOARD.md, "Security"):

- **Loopback only**, and the ``Host`` header must name the address it
  listens on (``127.0.0.1:PORT``, ``localhost:PORT``): a page of another site
  whose name an attacker pointed at 127.0.0.1 (DNS rebinding) gets 421.
- **An operator token.** ``stockade dashboard`` prints a URL that carries
  one token once (``/login?token=…``); the login opens a session: the page
  lives under ``/app/SID/`` (SID random), and its key is an HttpOnly,
  ``SameSite=Strict`` cookie whose ``Path`` is that prefix, so the token
  leaves the address bar and the history. A browser sends a host's cookies
  to every port of it, so a cookie for ``/`` would also go to any other
  server on 127.0.0.1 the operator visits (another user's, say); scoped to
  a path only the operator's URL names, it does not. Every other path, the
  static files included, needs the session's cookie under its own prefix, or
  ``Authorization: Bearer TOKEN`` (scripts, at the root): without, 401.
- **CSRF.** A POST (deciding an approval) needs an ``Origin`` header naming
  this server, a JSON body, and the header ``X-Stockade-CSRF`` holding the
  session's CSRF token (an HMAC of the operator token), which only a page of
  this origin can read (``/api/session``; no CORS header is ever sent).
- **Strict CSP**, no inline script or style, nothing fetched from another
  origin: ``default-src 'none'`` and ``'self'`` for scripts, styles,
  connections and images. The page writes every value of every event with
  ``textContent`` (never as HTML).
- **A slow browser never slows the daemon.** The live stream (Server-Sent
  Events) takes the bus's lines into a bounded queue of its own; when a
  reader falls behind, the queue is dropped and the stream reads what it
  missed from the store, from the last ``seq`` it sent: the bus never waits
  and never drops the stream, and the browser misses nothing.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import hmac
import io
import json
import re
import secrets
import tarfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stockade.dashboard._bench import Campaigns
from stockade.dashboard._source import DecideError, Source
from stockade.dashboard._summary import debrief

STATIC = Path(__file__).parent / "static"
COOKIE = "stockade_dashboard"
CSRF_HEADER = "x-stockade-csrf"
FEED_LIMIT = 2000
"""Live lines a stream holds for a slow reader before it drops them and reads
from the store instead (about 1 MiB at the demo's event sizes)."""
PAGE = 500
"""Stored events one read of a catch-up takes."""
KEEPALIVE = 15.0
"""Seconds of quiet after which the stream sends a comment (proxies and
browsers close a silent stream)."""
EVENTS_MAX = 5000
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]


@dataclass
class Operators:
    """The tokens this dashboard accepts, each naming its operator."""

    key: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    tokens: dict[str, str] = field(default_factory=dict)
    sessions: dict[str, tuple[str, str]] = field(default_factory=dict)
    """A browser session's cookie value -> (its path's SID, the token it logged in with)."""

    def mint(self, operator: str) -> str:
        token = secrets.token_urlsafe(32)
        self.tokens[token] = operator
        return token

    def who(self, token: str | None) -> str | None:
        if not token:
            return None
        for known, operator in self.tokens.items():
            if hmac.compare_digest(known.encode(), token.encode()):
                return operator
        return None

    def login(self, token: str) -> tuple[str, str]:
        """A new session of ``token``: its SID (in its path) and its cookie's value."""
        sid, cookie = secrets.token_urlsafe(12), secrets.token_urlsafe(32)
        self.sessions[cookie] = (sid, token)
        return sid, cookie

    def session_token(self, sid: str, cookie: str | None) -> str | None:
        """The token of the session whose cookie is ``cookie``, if its path is ``sid``."""
        if not cookie:
            return None
        for known, (known_sid, token) in self.sessions.items():
            if hmac.compare_digest(known.encode(), cookie.encode()):
                return token if hmac.compare_digest(known_sid.encode(), sid.encode()) else None
        return None

    def csrf(self, token: str) -> str:
        return hmac.new(self.key, b"csrf\0" + token.encode(), hashlib.sha256).hexdigest()


@dataclass
class Listening:
    """Where the server listens, once it does: the ``Host`` and ``Origin`` it accepts."""

    hosts: set[str] = field(default_factory=set)
    streams: set[Feed] = field(default_factory=set)
    """The live streams being served, so that closing can end them."""
    closing: bool = False

    def close_streams(self, *, stopping: bool = True) -> None:
        """End every live stream: each sends what it holds and returns, so a
        stopping server does not cancel them. ``stopping=False`` ends only the
        streams open now (browsers reconnect, and resume after the last event
        they got: what a dropped connection does)."""
        self.closing = self.closing or stopping
        for feed in self.streams:
            feed.closed = True
            feed.wake.set()

    def set_port(self, port: int) -> None:
        self.hosts = {f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"}

    @property
    def origins(self) -> set[str]:
        return {f"http://{h}" for h in self.hosts}


class _SecurityHeaders:
    """Adds the CSP and its companions to every response (pure ASGI: it does
    not buffer the live stream as a ``BaseHTTPMiddleware`` would)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = list(message.get("headers", [])) + [
                    (k, v) for k, v in _HEADERS if k not in names
                ]
            await send(message)

        await self.app(scope, receive, with_headers)


Handler = Callable[[Request, str, str], Awaitable[Response]]


def build_app(
    source: Source, operators: Operators, listening: Listening, campaigns: Campaigns | None = None
) -> ASGIApp:
    """The ASGI app of one dashboard (see the module docstring)."""
    bench_dirs = campaigns if campaigns is not None else Campaigns()

    def guard(handler: Handler, *, post: bool = False) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            host = request.headers.get("host", "")
            if host not in listening.hosts:
                return PlainTextResponse(
                    f"this dashboard answers only as {sorted(listening.hosts)[0]}, not {host!r}; "
                    "open the URL `stockade dashboard` printed",
                    status_code=421,
                )
            sid = request.path_params.get("sid")
            token = (
                operators.session_token(str(sid), request.cookies.get(COOKIE)) if sid is not None else None
            ) or _bearer(request)
            operator = operators.who(token)
            if operator is None or token is None:
                return PlainTextResponse(
                    "no operator token: open the URL that `stockade dashboard` prints "
                    "(it carries a token once), or send 'Authorization: Bearer TOKEN'",
                    status_code=401,
                )
            if post:
                origin = request.headers.get("origin")
                if origin not in listening.origins:
                    return PlainTextResponse(
                        f"a request from origin {origin!r} was refused: only this dashboard's own page "
                        "may change anything",
                        status_code=403,
                    )
                sent = request.headers.get(CSRF_HEADER, "")
                if not hmac.compare_digest(sent.encode(), operators.csrf(token).encode()):
                    return PlainTextResponse(
                        "the request lacks this session's CSRF token (header X-Stockade-CSRF); "
                        "reload the dashboard's page",
                        status_code=403,
                    )
                if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
                    return PlainTextResponse("send the decision as application/json", status_code=415)
            return await handler(request, operator, token)

        return endpoint

    async def login(request: Request) -> Response:
        host = request.headers.get("host", "")
        if host not in listening.hosts:
            return PlainTextResponse(f"this dashboard does not answer as {host!r}", status_code=421)
        token = request.query_params.get("token", "")
        if operators.who(token) is None:
            return PlainTextResponse(
                "that token is not this dashboard's; run `stockade dashboard` for a fresh URL",
                status_code=401,
            )
        sid, cookie = operators.login(token)
        # `page=/debrief/r-…`: where to land (the page's own hash route), nothing else.
        page = request.query_params.get("page", "")
        fragment = f"#{page}" if _PAGE.fullmatch(page) else ""
        response = Response(status_code=303, headers={"location": f"/app/{sid}/{fragment}"})
        response.set_cookie(COOKIE, cookie, httponly=True, samesite="strict", path=f"/app/{sid}/")
        return response

    async def index(request: Request, operator: str, token: str) -> Response:
        return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8")

    async def static(request: Request, operator: str, token: str) -> Response:
        name = request.path_params["name"]
        types = {"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"}
        if name not in types:
            return PlainTextResponse(f"no static file {name!r}", status_code=404)
        return FileResponse(STATIC / name, media_type=types[name])

    async def session(request: Request, operator: str, token: str) -> Response:
        return JSONResponse(
            {
                "mode": source.mode,
                "label": source.label,
                "operator": operator,
                "csrf": operators.csrf(token),
                "now": time.time(),
            }
        )

    async def runs(request: Request, operator: str, token: str) -> Response:
        return JSONResponse({"runs": await source.runs(), "approvals": len(await source.approvals())})

    async def events(request: Request, operator: str, token: str) -> Response:
        run = request.query_params.get("run") or None
        after = _int(request.query_params.get("after"), 0)
        limit = min(max(_int(request.query_params.get("limit"), EVENTS_MAX), 1), EVENTS_MAX)
        page = await source.events(run=run, after=after, limit=limit)
        return JSONResponse({"events": page, "more": len(page) >= limit})

    async def stream(request: Request, operator: str, token: str) -> Response:
        run = request.query_params.get("run") or None
        # The browser's EventSource sends the id of the last event it got when
        # it reconnects: that is the record's seq, so it resumes just after.
        after = _int(request.headers.get("last-event-id"), _int(request.query_params.get("after"), 0))
        return StreamingResponse(
            _stream(source, run, after, listening=listening),
            media_type="text/event-stream",
            headers={"x-accel-buffering": "no"},
        )

    async def transcript(request: Request, operator: str, token: str) -> Response:
        return JSONResponse(await source.transcript(request.path_params["run"]))

    async def run_debrief(request: Request, operator: str, token: str) -> Response:
        run = request.path_params["run"]
        stored = await _all_events(source, run)
        if not stored:
            return JSONResponse({"error": f"no events of run {run!r} in this record"}, status_code=404)
        verified = await source.verify(run)
        report = await asyncio.to_thread(debrief, stored, verified=bool(verified.get("ok")))
        report["verified"] = verified
        report["info"] = await source.run_info(run)
        return JSONResponse(report)

    async def download(request: Request, operator: str, token: str) -> Response:
        run = request.path_params["run"]
        fmt = request.query_params.get("format", "jsonl")
        if fmt not in _FORMATS:
            return PlainTextResponse(
                f"no format {fmt!r}; ask for json, jsonl, text or bundle", status_code=400
            )
        stored = await _all_events(source, run)
        if not stored:
            return PlainTextResponse(f"no events of run {run!r} in this record", status_code=404)
        name = f"stockade-{run}"
        # Rendered in a worker thread: a long run's export is not the daemon's loop's work.
        if fmt != "bundle":
            body = await asyncio.to_thread(_render, fmt, stored)
            suffix, media = _FORMATS[fmt]
            return _attachment(body, f"{name}{suffix}", media)
        files = {
            "events.jsonl": await asyncio.to_thread(_render, "jsonl", stored),
            "verify.json": json.dumps(await source.verify(run), indent=1).encode(),
        }
        info = await source.run_info(run)
        if info is not None:
            files["run.json"] = json.dumps(info, indent=1).encode()
        files["transcript.log"] = str((await source.transcript(run))["text"]).encode()
        return _attachment(await asyncio.to_thread(_tar, files), f"{name}.tar.gz", "application/gzip")

    async def approvals(request: Request, operator: str, token: str) -> Response:
        return JSONResponse({"approvals": await source.approvals()})

    async def decide(request: Request, operator: str, token: str) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": "the body is not JSON"}, status_code=400)
        decision = body.get("decision") if isinstance(body, dict) else None
        reason = body.get("reason", "") if isinstance(body, dict) else ""
        if decision not in ("approve", "deny") or not isinstance(reason, str) or len(reason) > 4096:
            return JSONResponse(
                {"error": "send {'decision': 'approve' or 'deny', 'reason': text up to 4096 characters}"},
                status_code=400,
            )
        if decision == "deny" and not reason.strip():
            return JSONResponse({"error": "a denial needs a reason: the agent is told it"}, status_code=400)
        try:
            result = await source.decide(
                request.path_params["id"], decision, by=f"{operator} (dashboard)", reason=reason
            )
        except DecideError as exc:
            status = {"not_found": 404, "conflict": 409, "bad_params": 400}.get(exc.code, 503)
            return JSONResponse({"error": str(exc), "code": exc.code}, status_code=status)
        return JSONResponse({"approval": result})

    async def bench(request: Request, operator: str, token: str) -> Response:
        found = await asyncio.to_thread(bench_dirs.listing)
        note = "" if found else "no campaign: give its directory with `stockade dashboard --bench DIR`"
        return JSONResponse({"campaigns": found, "note": note})

    async def bench_trial(request: Request, operator: str, token: str) -> Response:
        index, name = request.path_params["index"], request.path_params["name"]
        found = await asyncio.to_thread(bench_dirs.trial, index, name)
        if found is None:
            return JSONResponse({"error": f"no trial bundle {name!r} in campaign {index}"}, status_code=404)
        return JSONResponse(found)

    async def bench_file(request: Request, operator: str, token: str) -> Response:
        index, name, file = (request.path_params[k] for k in ("index", "name", "file"))
        data = await asyncio.to_thread(bench_dirs.file, index, name, file)
        if data is None:
            return PlainTextResponse(f"no file {file!r} in the manifest of {name!r}", status_code=404)
        return _attachment(data, file.rsplit("/", 1)[-1], "application/octet-stream")

    pages = [
        Route("/", guard(index)),
        Route("/static/{name}", guard(static)),
        Route("/api/session", guard(session)),
        Route("/api/runs", guard(runs)),
        Route("/api/events", guard(events)),
        Route("/api/stream", guard(stream)),
        Route("/api/runs/{run}/transcript", guard(transcript)),
        Route("/api/runs/{run}/debrief", guard(run_debrief)),
        Route("/api/runs/{run}/download", guard(download)),
        Route("/api/approvals", guard(approvals)),
        Route("/api/approvals/{id}", guard(decide, post=True), methods=["POST"]),
        Route("/api/bench", guard(bench)),
        Route("/api/bench/{index:int}/{name}", guard(bench_trial)),
        Route("/api/bench/{index:int}/{name}/files/{file:path}", guard(bench_file)),
    ]
    # The same pages at the root (for scripts, with a bearer token) and under
    # each browser session's own prefix (with its cookie).
    routes = [Route("/login", login), Mount("/app/{sid}", routes=pages), *pages]
    return _SecurityHeaders(Starlette(routes=routes))


# --------------------------------------------------------------------------- the live stream


class Feed:
    """One stream's share of the bus: a bounded queue that never refuses.

    ``send`` runs on the daemon's loop, from ``EventBus.publish``: it only
    appends (or, once the queue is full, forgets it and marks the stream
    behind) and wakes the stream. It always says yes, so the bus never drops
    this subscriber nor records it as dropped: the stream catches up from the
    store by itself."""

    def __init__(self, limit: int | None = None) -> None:
        self.lines: collections.deque[str] = collections.deque()
        self.limit = limit if limit is not None else FEED_LIMIT
        self.behind = False
        self.closed = False
        self.resyncs = 0
        self.wake = asyncio.Event()

    def send(self, _sub: int, line: str) -> bool:
        if not self.behind:
            if len(self.lines) >= self.limit:
                self.behind = True
                self.lines.clear()
            else:
                self.lines.append(line)
        self.wake.set()
        return True


async def _stream(
    source: Source, run: str | None, after: int, *, listening: Listening, feed: Feed | None = None
) -> AsyncIterator[str]:
    """The stored events of ``run`` (all when None) after ``after``, then live, as SSE frames.

    Nothing missed, nothing twice: the feed subscribes before the store is
    read, so an event stored meanwhile is in one or the other or both, and
    ``last`` (the highest seq sent) skips the second copy."""
    feed = feed or Feed()
    unsubscribe = source.subscribe(run, feed.send)
    listening.streams.add(feed)
    last = after
    try:
        yield "retry: 1000\n\n"
        catch_up = True
        while True:
            if catch_up:
                feed.behind = False
                feed.lines.clear()
                while True:
                    page = await source.events(run=run, after=last, limit=PAGE)
                    for stored in page:
                        last = int(stored["seq"])
                        yield f"id: {last}\ndata: {_line(stored)}\n\n"
                    if len(page) < PAGE:
                        break
                catch_up = False
            while feed.lines and not feed.behind:
                line = feed.lines.popleft()
                seq = _seq_of(line)
                if seq <= last:
                    continue
                last = seq
                yield f"id: {seq}\ndata: {line}\n\n"
            if feed.behind:
                feed.resyncs += 1
                catch_up = True
                yield f": resync after seq {last}: this reader fell behind; the rest comes from the store\n\n"
                continue
            if feed.closed or listening.closing:
                return
            feed.wake.clear()
            if feed.lines:
                continue
            try:
                await asyncio.wait_for(feed.wake.wait(), KEEPALIVE)
            except TimeoutError:
                yield ": keepalive\n\n"
    finally:
        listening.streams.discard(feed)
        if unsubscribe is not None:
            unsubscribe()


def _seq_of(line: str) -> int:
    """The seq of a JSONL line (``StoredEvent.to_json``: it ends with ``"seq":N}``)."""
    at = line.rfind('"seq":')
    return int(line[at + 6 : -1]) if at >= 0 else 0


def _line(stored: dict[str, Any]) -> str:
    from stockade.record._chain import canonical_json

    return canonical_json(stored)


async def _all_events(source: Source, run: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    after = 0
    while True:
        page = await source.events(run=run, after=after, limit=EVENTS_MAX)
        found.extend(page)
        if len(page) < EVENTS_MAX:
            return found
        after = int(page[-1]["seq"])


_FORMATS = {
    "jsonl": (".jsonl", "application/x-ndjson"),
    "json": (".json", "application/json"),
    "text": (".txt", "text/plain; charset=utf-8"),
    "bundle": (".tar.gz", "application/gzip"),
}


def _render(fmt: str, stored: list[dict[str, Any]]) -> bytes:
    """A run's events as JSON lines, a JSON array or text (``stockade export``'s formats)."""
    if fmt == "jsonl":
        return "".join(_line(s) + "\n" for s in stored).encode()
    if fmt == "json":
        return ("[\n" + ",\n".join(_line(s) for s in stored) + "\n]\n").encode()
    from stockade.record._export import iso_utc, printable

    lines = []
    for s in stored:
        e = s["event"]
        lines.append(
            f"{s['seq']} {iso_utc(e['time'])} {printable(e.get('cell') or '-')} {e['layer']} "
            f"{e['outcome']} {printable(e.get('summary') or e['kind'])}\n"
        )
    return "".join(lines).encode()


def _tar(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = int(time.time())
            info.mode = 0o600
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _attachment(body: bytes, name: str, media_type: str) -> Response:
    return Response(
        body, media_type=media_type, headers={"content-disposition": f'attachment; filename="{name}"'}
    )


_PAGE = re.compile(r"/[a-z]+(/[A-Za-z0-9._-]{1,128}){0,2}")


def _bearer(request: Request) -> str | None:
    value = request.headers.get("authorization", "")
    return value[7:].strip() if value.lower().startswith("bearer ") else None


def _int(value: str | None, default: int) -> int:
    try:
        return max(0, int(value)) if value is not None else default
    except ValueError:
        return default


__all__ = ["COOKIE", "CSRF_HEADER", "Feed", "Listening", "Operators", "build_app"]
