"""``http.fetch``: the daemon fetches a URL for the agent, under ``network.allow``.

Each hop (the URL, then every redirect) is decided by ``Egress.decide`` and
destination-checked by ``Egress.destination`` on its own, then fetched over a
connection that ``open_upstream`` made to exactly the checked address. A
redirect from an allowed host to ``http://169.254.169.254/``, to a host the
policy does not name, or to a name that resolves somewhere private is refused
like a first request would be.

HTTP/1.1 itself is httpcore's (h11 underneath): an ``AsyncHTTP11Connection``
runs over a stream adapted from ``open_upstream``'s. That connection takes a
stream that is already connected, so no connection pool or network backend
(which would resolve the name again, or could reuse a connection made for
another address) stands between the check and the socket. Redirects are
followed here, not by a client library, because each one needs the checks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import ssl
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote, urljoin, urlsplit

import httpcore

from stockade.gateway._egress import Egress, EgressRefused
from stockade.gateway._http import SEARCHABLE_CODINGS
from stockade.gateway._resolve import ResolveError
from stockade.gateway._secrets import SecretInAnswer, SecretMisuse, Secrets
from stockade.gateway._upstream import UpstreamError, open_upstream
from stockade.policy._model import FRAMING_HEADERS

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
# Hop-by-hop and framing headers are the fetcher's to set, not the agent's.
_DROPPED = FRAMING_HEADERS
# Credentials meant for one origin do not follow a redirect to another.
_ORIGIN_BOUND = frozenset({"authorization", "cookie"})
_UNSAFE_IN_URL = frozenset(" \\\t\r\n\x00\x7f")
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


@dataclass(frozen=True, slots=True)
class FetchLimits:
    """Bounds of one fetch: body bytes kept, seconds in all, redirects followed."""

    max_bytes: int = 10 * 1024 * 1024
    timeout: float = 30.0
    max_redirects: int = 5


@dataclass(frozen=True, slots=True)
class FetchHop:
    """One request of a fetch (the first, or a redirect): one ``http.request`` event."""

    method: str
    url: str
    host: str
    port: int
    address: str | None
    """The address connected to; ``None`` when refused before connecting."""
    status: int | None
    """The response's status; ``None`` when there was none (refused, failed)."""
    verdict: Literal["allow", "deny"]
    rule: str | None
    reason: str
    bytes_up: int = 0
    bytes_down: int = 0
    duration: float = 0.0


@dataclass(frozen=True, slots=True)
class FetchResult:
    """The final response of a fetch; ``hops`` holds every request made on the way."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes
    url: str
    hops: tuple[FetchHop, ...]
    truncated: bool
    """The body was longer than ``FetchLimits.max_bytes`` and was cut there."""


class FetchError(Exception):
    """A fetch ended without a response; ``hops`` holds what happened before (the last one included)."""

    def __init__(self, reason: str, *, hops: tuple[FetchHop, ...] = ()) -> None:
        super().__init__(reason)
        self.reason = reason
        self.hops = hops


class FetchRefused(FetchError):
    """``network.allow`` or the address check refused a hop: a denial, counted as one."""

    def __init__(self, reason: str, *, rule: str | None = None, hops: tuple[FetchHop, ...] = ()) -> None:
        super().__init__(reason, hops=hops)
        self.rule = rule


class FetchFailed(FetchError):
    """Allowed, but it did not work: a bad URL, an unreachable server, a bad certificate, a timeout."""


class _Stream(httpcore.AsyncNetworkStream):
    """``open_upstream``'s streams as httpcore wants them, counting the bytes each way."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self.up = 0
        self.down = 0

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            data = await self._reader.read(max_bytes)
        except (OSError, ssl.SSLError) as exc:
            raise httpcore.ReadError(str(exc)) from exc
        self.down += len(data)
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        try:
            self._writer.write(buffer)
            await self._writer.drain()
        except (OSError, ssl.SSLError) as exc:
            raise httpcore.WriteError(str(exc)) from exc
        self.up += len(buffer)

    async def aclose(self) -> None:
        # One request per connection, so nothing is left to say: abort rather
        # than wait for a TLS close_notify a server may never send.
        self._writer.transport.abort()

    async def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.AsyncNetworkStream:
        raise RuntimeError("TLS is set up by open_upstream before HTTP starts")

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":
            return False
        return self._writer.get_extra_info(info)


@dataclass(slots=True)
class FetchTarget:
    """A URL as a fetch decides and asks for it: the host normalised, the target encoded."""

    scheme: str
    host: str
    port: int
    target: str
    url: str


@dataclass(slots=True)
class _Run:
    """What one fetch carries from hop to hop."""

    egress: Egress
    tls: ssl.SSLContext
    limits: FetchLimits
    plain_http: bool
    secrets: Secrets
    started: float = field(default_factory=time.monotonic)
    hops: list[FetchHop] = field(default_factory=list)

    def remaining(self) -> float:
        return max(0.001, self.limits.timeout - (time.monotonic() - self.started))


def parse_url(url: str, plain_http: bool) -> FetchTarget:
    """The parts of ``url`` to decide, connect and ask with.

    Raises:
        FetchRefused: a scheme other than https (or http with ``plain_http``).
        FetchFailed: the URL is malformed.
    """
    if any(c in _UNSAFE_IN_URL for c in url):
        raise FetchFailed(f"the URL {url!r} holds spaces, backslashes or control characters; encode them")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise FetchFailed(
            f"the URL {url!r} is malformed ({exc}); give a URL such as 'https://example.com/'"
        ) from exc
    scheme = parts.scheme.lower()
    if scheme == "http" and not plain_http:
        raise FetchRefused(
            f"{url} is plain HTTP, which http.fetch refuses; use https:// "
            "(or set network.fetch_plain_http: true in the policy)"
        )
    if scheme not in ("http", "https"):
        raise FetchRefused(f"{url!r} is not an http(s) URL; http.fetch fetches https:// URLs only")
    if "@" in parts.netloc:
        raise FetchFailed(
            f"the URL {url!r} carries credentials; remove them and send an Authorization header"
        )
    host = parts.hostname or ""
    if not host:
        raise FetchFailed(f"the URL {url!r} names no host; give a URL such as 'https://example.com/'")
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError as exc:
            raise FetchFailed(
                f"the URL {url!r} has a host name that is not a valid internationalised name; "
                "write its 'xn--' form"
            ) from exc
    # Keep existing escapes, encode what may not appear raw in a request line.
    path = quote(parts.path or "/", safe="/%:@!$&'()*+,;=-._~")
    query = quote(parts.query, safe="/%:@!$&'()*+,;=-._~?")
    target = path + (f"?{query}" if parts.query else "")
    default = 443 if scheme == "https" else 80
    return FetchTarget(scheme, host, default if port is None else port, target, url.split("#", 1)[0])


def _check_headers(headers: Mapping[str, str]) -> None:
    """Refuse header names and values that would not survive the wire intact.

    Raises:
        FetchFailed: a name is not an HTTP token, or a value holds a line
            break, a NUL or characters outside Latin-1.
    """
    for name, value in headers.items():
        if not _TOKEN.match(name):
            raise FetchFailed(f"the header name {name!r} is not valid; use letters, digits and '-'")
        if not value.isascii() and not all(ord(c) < 256 for c in value):
            raise FetchFailed(f"the value of header {name!r} has characters outside Latin-1; encode it")
        if any(c in value for c in "\r\n\x00"):
            raise FetchFailed(f"the value of header {name!r} holds a line break or NUL; remove it")


def _host_header(host: str, port: int, scheme: str) -> str:
    shown = f"[{host}]" if ":" in host else host
    return shown if port == (443 if scheme == "https" else 80) else f"{shown}:{port}"


def _request_headers(
    headers: Mapping[str, str], body: bytes, method: str, same_origin: bool
) -> list[tuple[bytes, bytes]]:
    """The agent's headers, less those the fetcher owns, plus framing (Host comes with the destination)."""
    out: list[tuple[bytes, bytes]] = []
    named: set[str] = set()
    for name, value in headers.items():
        lower = name.lower()
        if lower in _DROPPED or (not same_origin and lower in _ORIGIN_BOUND):
            continue
        named.add(lower)
        out.append((name.encode("latin-1"), value.encode("latin-1")))
    if body or method in ("POST", "PUT", "PATCH"):
        out.append((b"Content-Length", str(len(body)).encode()))
    if "user-agent" not in named:
        out.append((b"User-Agent", b"stockade-fetch"))
    out.append((b"Connection", b"close"))
    return out


async def _hop(
    run: _Run,
    where: FetchTarget,
    method: str,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
    follow: frozenset[int],
) -> tuple[int, list[tuple[str, str]], bytes, bool]:
    """One request, decided, checked and made; its ``FetchHop`` appended to ``run.hops``.

    The body of a redirect that will be followed (a status in ``follow``, with
    a ``Location``) is not read: it is never returned.

    Raises:
        FetchRefused, FetchFailed: as ``fetch``.
    """
    started = time.monotonic()

    def record(
        verdict: Literal["allow", "deny"],
        rule: str | None,
        reason: str,
        address: str | None = None,
        status: int | None = None,
        stream: _Stream | None = None,
    ) -> tuple[FetchHop, ...]:
        scrub = run.secrets.scrub
        run.hops.append(
            FetchHop(
                method=method,
                url=scrub(where.url),
                host=scrub(where.host),
                port=where.port,
                address=address,
                status=status,
                verdict=verdict,
                rule=rule,
                reason=scrub(reason),
                bytes_up=stream.up if stream else 0,
                bytes_down=stream.down if stream else 0,
                duration=time.monotonic() - started,
            )
        )
        return tuple(run.hops)

    decision = run.egress.decide(where.host, where.port, method=method, path=where.target)
    if decision.verdict == "deny":
        raise FetchRefused(
            decision.reason, rule=decision.rule, hops=record("deny", decision.rule, decision.reason)
        )
    try:
        headers, target, body = _put_secrets(run.secrets, where, headers, body)
    except SecretMisuse as exc:
        hops = record("deny", decision.rule, str(exc))
        raise FetchRefused(str(exc), rule=decision.rule, hops=hops) from None
    try:
        dest = await run.egress.destination(where.host, where.port)
    except EgressRefused as exc:
        raise FetchRefused(
            exc.reason, rule=decision.rule, hops=record("deny", decision.rule, exc.reason)
        ) from exc
    except ResolveError as exc:
        raise FetchFailed(str(exc), hops=record("allow", decision.rule, f"{decision.reason}; {exc}")) from exc
    address = str(dest.address)
    bound = run.egress.decide_address(
        where.host, dest.address, dest.port, method=method, path=where.target.partition("?")[0]
    )
    if bound is not None:
        raise FetchRefused(bound.reason, rule=bound.rule, hops=record("deny", bound.rule, bound.reason))
    tls = run.tls if where.scheme == "https" else None
    stream: _Stream | None = None
    try:
        reader, writer = await open_upstream(dest, tls=tls, timeout=run.remaining())
        stream = _Stream(reader, writer)
        scheme = where.scheme.encode()
        origin = httpcore.Origin(scheme, dest.host.encode("ascii"), dest.port)
        connection = httpcore.AsyncHTTP11Connection(origin, stream)
        request = httpcore.Request(
            method,
            httpcore.URL(scheme=scheme, host=dest.host, port=dest.port, target=target),
            # The checked host in its normal form: 0xa000001 is asked for as 10.0.0.1.
            headers=[(b"Host", _host_header(dest.host, dest.port, where.scheme).encode("ascii")), *headers],
            content=body,
        )
        try:
            response = await connection.handle_async_request(request)
            status = response.status
            answer = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.headers]
            kept, truncated = bytearray(), False
            if not (status in follow and _location(answer) is not None):
                async for chunk in response.aiter_stream():
                    room = run.limits.max_bytes - len(kept)
                    if len(chunk) > room:
                        kept += chunk[:room]
                        truncated = True
                        break
                    kept += chunk
        finally:
            await connection.aclose()
    except UpstreamError as exc:
        reason = f"{decision.reason}; {exc}"
        raise FetchFailed(
            str(exc), hops=record("allow", decision.rule, reason, address, None, stream)
        ) from exc
    except (httpcore.ProtocolError, httpcore.NetworkError, httpcore.TimeoutException, OSError) as exc:
        problem = f"{where.url}: the server's answer broke off or was not HTTP ({type(exc).__name__}: {exc})"
        reason = f"{decision.reason}; {problem}"
        raise FetchFailed(
            problem, hops=record("allow", decision.rule, reason, address, None, stream)
        ) from exc
    except asyncio.CancelledError:
        record(
            "allow",
            decision.rule,
            f"{decision.reason}; cut off at the fetch's time limit",
            address,
            None,
            stream,
        )
        raise
    try:
        answer, data, truncated = _searched(run.secrets, answer, bytes(kept), truncated, run.limits.max_bytes)
    except FetchFailed as exc:
        exc.hops = record("allow", decision.rule, f"{decision.reason}; {exc.reason}", address, status, stream)
        raise
    record("allow", decision.rule, decision.reason, address, status, stream)
    return status, answer, data, truncated


def _put_secrets(
    secrets: Secrets, where: FetchTarget, headers: list[tuple[bytes, bytes]], body: bytes
) -> tuple[list[tuple[bytes, bytes]], str, bytes]:
    """A hop's headers, target and body with the values of its placeholders in place,
    as the proxy puts them (``Secrets.put``): only toward their hosts, over https,
    where each secret's policy lets them stand.

    Raises:
        SecretMisuse: a value, or a placeholder where it must not go.
    """
    if not secrets.active:
        return headers, where.target, body
    encrypted = where.scheme == "https"
    host = where.host
    secrets.refuse_values(host.encode("ascii", "replace"), host, "in its host name")
    secrets.refuse_values(b"\n".join(n for n, _ in headers), host, "in a header's name")
    out = [
        (name, secrets.put(value, host, "header", encrypted=encrypted, header=name.lower()))
        for name, value in headers
        if name.lower() != b"accept-encoding"
    ]
    # The answer is searched for the values: it should come uncompressed.
    out.append((b"Accept-Encoding", b"identity"))
    target = secrets.put(where.target.encode("ascii"), host, "url", encrypted=encrypted).decode("latin-1")
    if any(c in _UNSAFE_IN_URL for c in target):
        raise SecretMisuse(
            secrets.names_in(where.target.encode("ascii")),
            host,
            kind="place",
            where="in its URL, and a value put there holds characters a URL cannot",
            fix="send the placeholder in a header",
        )
    put = secrets.put(body, host, "body", encrypted=encrypted)
    if len(put) != len(body):
        out = [(n, v) for n, v in out if n.lower() != b"content-length"]
        out.append((b"Content-Length", str(len(put)).encode()))
    return out, target, put


def _searched(
    secrets: Secrets, headers: list[tuple[str, str]], body: bytes, truncated: bool, limit: int
) -> tuple[list[tuple[str, str]], bytes, bool]:
    """An answer for the agent with the values of the run's secrets hidden (as the
    proxy's ``EchoFilter`` hides them); a gzip or deflate body is decoded first.

    Raises:
        FetchFailed: the body is in a coding that cannot be searched, or holds a
            value in a form that cannot be cut out (then none of it is returned).
    """
    echo = secrets.echo_filter()
    if echo is None:
        return headers, body, truncated
    coding = ",".join(v for k, v in headers if k.lower() == "content-encoding").strip().lower()
    if coding and coding != "identity":
        if coding not in SEARCHABLE_CODINGS:
            raise FetchFailed(
                f"the answer is in the content-coding {coding!r}, which stockade cannot read to search "
                "it for the run's secrets (it asked for identity); ask the server for an uncompressed answer"
            )
        wbits = 16 + 15 if coding != "deflate" else (15 if body[:1] == b"\x78" else -15)
        inflate = zlib.decompressobj(wbits)
        try:
            plain = inflate.decompress(body, limit + 1)
        except zlib.error as exc:
            raise FetchFailed(f"the answer's {coding} body does not decompress ({exc})") from None
        truncated = truncated or len(plain) > limit
        body = plain[:limit]
        headers = [(k, v) for k, v in headers if k.lower() not in ("content-encoding", "content-length")]
    try:
        shown = [(k, echo.whole(v.encode("latin-1")).decode("latin-1")) for k, v in headers]
        data = echo.feed(body) + echo.flush()
    except SecretInAnswer as exc:
        raise FetchFailed(str(exc)) from None
    if data != body:
        shown = [(k, v) for k, v in shown if k.lower() != "content-length"]
    return shown, data, truncated


def _refused_hop(method: str, url: str, reason: str) -> FetchHop:
    """The hop of a URL refused before it was parsed far enough to decide (its scheme)."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port or 0
    except ValueError:
        host, port = "", 0
    return FetchHop(method, url, host, port, None, None, "deny", None, reason)


def _location(headers: list[tuple[str, str]]) -> str | None:
    for name, value in headers:
        if name.lower() == "location":
            return value.strip()
    return None


async def fetch(
    egress: Egress,
    url: str,
    *,
    method: str = "GET",
    headers: Mapping[str, str] = {},  # read only, never mutated
    body: bytes = b"",
    plain_http: bool = False,
    limits: FetchLimits = FetchLimits(),  # frozen: one shared default is safe
    tls: ssl.SSLContext,
    secrets: Secrets | None = None,
) -> FetchResult:
    """Fetch ``url`` for the agent: every hop decided, checked and recorded.

    https only unless ``plain_http``. Redirects are followed for GET and HEAD
    (a 303 also after any other method, turning it into a GET without body);
    a redirect to another origin drops ``Authorization`` and ``Cookie``. A body
    longer than ``limits.max_bytes`` is cut there (``truncated``).

    ``secrets``: the run's. Their placeholders are put in place as the proxy
    puts them (only toward their hosts, over https, in the headers each
    names, in the body or URL where it opts in); a hop that carries a value,
    or a placeholder elsewhere, is refused. The answer's body and headers are
    searched for the values (a gzip or deflate body decoded first), and every
    hop's URL and reason, every error, is scrubbed.

    Raises:
        FetchRefused: a hop was refused by ``network.allow``, by the address
            check or for its scheme (a denial: count it).
        FetchFailed: the URL is malformed, a server could not be reached or
            did not speak HTTP, a certificate did not verify, too many
            redirects, or the time limit passed.
    """
    secrets = secrets if secrets is not None else Secrets()
    run = _Run(egress, tls, limits, plain_http, secrets)
    try:
        return await _fetch(run, url, method.upper(), headers, body)
    except FetchError as exc:
        # Messages quote URLs and headers: no value of a secret in them, whole or cut.
        exc.reason = secrets.scrub(exc.reason)
        exc.args = (exc.reason,)
        exc.hops = tuple(
            dataclasses.replace(hop, url=secrets.scrub(hop.url), reason=secrets.scrub(hop.reason))
            for hop in exc.hops
        )
        raise


async def _fetch(run: _Run, url: str, method: str, headers: Mapping[str, str], body: bytes) -> FetchResult:
    limits, plain_http = run.limits, run.plain_http
    _check_headers(headers)
    if not _TOKEN.match(method):
        raise FetchFailed(f"{method!r} is not an HTTP method; use GET, HEAD or POST")
    current = url
    origin: tuple[str, str, int] | None = None
    try:
        async with asyncio.timeout(limits.timeout):
            for _ in range(limits.max_redirects + 1):
                try:
                    where = parse_url(current, plain_http)
                except FetchRefused as exc:
                    run.hops.append(_refused_hop(method, current, exc.reason))
                    exc.hops = tuple(run.hops)
                    raise
                except FetchError as exc:
                    exc.hops = tuple(run.hops)
                    raise
                here = (where.scheme, where.host, where.port)
                same_origin = origin is None or origin == here
                origin = origin or here
                sent = _request_headers(headers, body, method, same_origin)
                # GET and HEAD follow every redirect, other methods only a 303.
                follow = _REDIRECTS if method in ("GET", "HEAD") else frozenset({303})
                status, answer, data, truncated = await _hop(run, where, method, sent, body, follow)
                location = _location(answer)
                if status not in follow or location is None:
                    return FetchResult(status, answer, data, where.url, tuple(run.hops), truncated)
                if status == 303 and method != "HEAD":
                    method, body = "GET", b""
                current = urljoin(where.url, location)
    except TimeoutError as exc:
        raise FetchFailed(
            f"fetching {url} did not finish within {limits.timeout:g} s; ask for less, or a faster server",
            hops=tuple(run.hops),
        ) from exc
    raise FetchFailed(
        f"fetching {url} was redirected more than {limits.max_redirects} times (the last time to "
        f"{current}); fetch the final URL directly",
        hops=tuple(run.hops),
    )


__all__ = ["FetchError", "FetchFailed", "FetchHop", "FetchLimits", "FetchRefused", "FetchResult", "fetch"]
