"""HTTP/1.1 through the proxy: request targets, hop-by-hop headers, one exchange.

h11 parses and frames both sides (the client's requests, the upstream's
responses); this module only moves its events from one connection to the
other and keeps count. Framing is h11's: a body arrives as Data events and
h11 re-frames it for the other side from the headers that remain, so the
proxy never copies a length it did not check.
"""

from __future__ import annotations

import asyncio
import re
import socket
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Literal

import h11

from stockade.gateway._secrets import BodyScan, EchoFilter, SecretInAnswer, SecretMisuse
from stockade.record._event import Event

Scheme = Literal["http", "https", "tunnel"]

# RFC 9110 section 7.6.1, plus the proxy-only ones clients still send.
# Transfer-Encoding is hop-by-hop too, but h11 owns it: it re-frames each body
# itself from the headers it is given.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"upgrade",
        b"expect",  # the proxy answers 100-continue itself (see forward)
    }
)
# A Connection header may list headers to drop, but never these: dropping Host
# or the framing would change what the request means.
_NEVER_LISTED = frozenset({b"host", b"content-length", b"transfer-encoding"})

# A host in a request target: a name, an IPv4 literal, or [an IPv6 literal].
# Anything else (percent-encoding, userinfo, backslashes) is refused rather
# than guessed at, since upstream servers and this proxy might read it differently.
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::([0-9]{1,5}))?$")


class BadRequest(ValueError):
    """The client's request is malformed for a proxy; the message says how to fix it."""


@dataclass(frozen=True, slots=True)
class Target:
    """Where a request goes: ``host`` lower case, unbracketed, without a final dot."""

    host: str
    port: int
    path: str = "/"
    """Origin-form: the path and query, never empty."""


def parse_authority(text: str, default_port: int | None) -> tuple[str, int]:
    """``host[:port]`` (``[v6]:port``) of a CONNECT target or a Host header.

    Raises:
        BadRequest: not a host and port this proxy accepts.
    """
    match = _HOST.match(text)
    if match is None:
        raise BadRequest(f"{text!r} is not a host[:port]; write a host name or an IP address and a port")
    host, port_text = match.group(1), match.group(2)
    if host.startswith("["):
        host = host[1:-1]
    host = host.lower()
    if host.endswith(".") and host != ".":
        host = host[:-1]
    if port_text is None:
        if default_port is None:
            raise BadRequest(f"{text!r} has no port; CONNECT needs host:port, such as 'example.com:443'")
        return host, default_port
    port = int(port_text)
    if not 0 < port < 65536:
        raise BadRequest(f"{text!r} has port {port}, which is not a TCP port (1-65535)")
    return host, port


def parse_absolute(target: str) -> Target:
    """The target of an absolute-form request, ``http://host[:port]/path?query``.

    Raises:
        BadRequest: not an ``http://`` URL this proxy accepts (https:// must be a CONNECT).
    """
    scheme, sep, rest = target.partition("://")
    if not sep or not scheme.isalpha():
        raise BadRequest(
            f"{target[:200]!r} is not a proxy request; set this proxy as HTTP_PROXY so that "
            "requests carry the full URL (http://host/path), and use CONNECT for https"
        )
    if scheme.lower() != "http":
        raise BadRequest(
            f"{scheme.lower()}:// URLs are not forwarded as plain requests; send https through "
            "CONNECT (set HTTPS_PROXY to this proxy)"
        )
    end = len(rest)
    for sep_char in "/?":
        index = rest.find(sep_char)
        if index != -1:
            end = min(end, index)
    authority, path = rest[:end], rest[end:]
    if "#" in path:
        raise BadRequest("the request target holds a fragment ('#'); send the URL without it")
    if "@" in authority:
        raise BadRequest(f"{authority!r} holds user information ('@'); put credentials in a header instead")
    host, port = parse_authority(authority, 80)
    if not path:
        path = "/"
    elif path.startswith("?"):
        path = "/" + path
    return Target(host, port, path)


def forward_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """``headers`` without the hop-by-hop ones and those their Connection header lists."""
    listed: set[bytes] = set()
    for name, value in headers:
        if name in (b"connection", b"proxy-connection"):
            listed.update(token.strip().lower() for token in value.split(b","))
    listed -= _NEVER_LISTED
    return [(n, v) for n, v in headers if n not in HOP_BY_HOP and n not in listed]


async def next_event(conn: h11.Connection, reader: asyncio.StreamReader, timeout: float) -> h11.Event | type:
    """The next h11 event of ``conn``, reading from ``reader`` as needed.

    Raises:
        TimeoutError: nothing arrived for ``timeout`` seconds.
        h11.RemoteProtocolError: the peer broke HTTP/1.1 (or sent a header block past the limit).
    """
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        async with asyncio.timeout(timeout):
            data = await reader.read(262144)
        conn.receive_data(data)


@dataclass(slots=True)
class Upstream:
    """A connection to one upstream, kept across the requests of one client connection."""

    key: tuple[str, int, str, bool]
    """Where it goes: host, port, the checked address, and whether over TLS."""
    address: str
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    conn: h11.Connection = field(default_factory=lambda: h11.Connection(h11.CLIENT))
    idle_since: float = 0.0
    """The loop's time when it was last put aside unused (the proxy's pool)."""

    def usable(self) -> bool:
        """Whether another request may go on this connection (the server has not closed it)."""
        return self.conn.our_state is h11.IDLE and not self.writer.is_closing() and not self.reader.at_eof()

    def close(self) -> None:
        self.writer.close()


@dataclass(slots=True)
class Outcome:
    """What one forwarded exchange did."""

    status: int | None = None
    bytes_up: int = 0
    bytes_down: int = 0
    error: str | None = None
    """Why the exchange failed, one sentence; ``None`` when it completed."""
    answered: bool = False
    """Whether a response (or part of one) went to the client: then a failure can only close."""


class UpstreamFailed(Exception):
    """The upstream broke off; the message says how."""


class AnswerWithheld(UpstreamFailed):
    """The upstream's answer could not be passed on: compressed in a coding the
    gateway cannot search for secrets, or holding a value it cannot cut out.
    Asking again would get the same: never retried."""


class BodyRefused(Exception):
    """A streamed request body carried a secret; part of it may have gone out, so
    the upstream connection must be dropped. ``misuse`` says what it carried."""

    def __init__(self, misuse: SecretMisuse) -> None:
        super().__init__(str(misuse))
        self.misuse = misuse


SEARCHABLE_CODINGS = frozenset({"gzip", "x-gzip", "deflate"})
"""Content-codings the gateway decodes to search an answer for secrets (it asks for identity)."""


class _Decoder:
    """A gzip or deflate body decoded as it streams, so that it can be searched.

    ``deflate`` is zlib data (RFC 9110 8.4.1.2), though some servers send raw
    deflate: told apart by the first two bytes.
    """

    def __init__(self, coding: str) -> None:
        self._coding = coding
        self._inflate: Any = zlib.decompressobj(16 + 15) if coding != "deflate" else None
        self._start = b""

    def feed(self, data: bytes) -> bytes:
        if self._inflate is None:
            self._start += data
            if len(self._start) < 2:
                return b""
            data, self._start = self._start, b""
            zlib_header = data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
            self._inflate = zlib.decompressobj(15 if zlib_header else -15)
        try:
            out: bytes = self._inflate.decompress(data)
        except zlib.error as exc:
            raise AnswerWithheld(f"the upstream's {self._coding} answer does not decompress ({exc})") from exc
        return out

    def flush(self) -> bytes:
        if self._inflate is None:
            if self._start:
                raise AnswerWithheld(f"the upstream's {self._coding} answer is one byte, not {self._coding}")
            return b""
        try:
            out: bytes = self._inflate.flush()
        except zlib.error as exc:
            raise AnswerWithheld(f"the upstream's {self._coding} answer does not decompress ({exc})") from exc
        return out


async def forward(
    client: h11.Connection,
    creader: asyncio.StreamReader,
    cwriter: asyncio.StreamWriter,
    request: h11.Request,
    body: bytes | None,
    upstream: Upstream,
    *,
    timeout: float,
    outcome: Outcome,
    echo: EchoFilter | None = None,
    scan: BodyScan | None = None,
) -> None:
    """Send ``request`` (its body: ``body`` when already read, else streamed from the
    client) to ``upstream`` and its response back to the client, filling ``outcome``;
    ``echo`` filters the response (its headers and body) on the way, a gzip or
    deflate body decoded first; ``scan`` searches a streamed request body.

    Raises:
        UpstreamFailed: the upstream closed, timed out or broke HTTP;
            ``AnswerWithheld``: its answer could not be passed on.
        BodyRefused: the streamed body carried a secret (``scan``).
        ClientGone: the client closed, timed out or broke HTTP mid-request.
    """
    try:
        await _forward(client, creader, cwriter, request, body, upstream, timeout, outcome, echo, scan)
    except SecretInAnswer as exc:
        raise AnswerWithheld(str(exc)) from None
    except SecretMisuse as exc:
        raise BodyRefused(exc) from None


async def _forward(
    client: h11.Connection,
    creader: asyncio.StreamReader,
    cwriter: asyncio.StreamWriter,
    request: h11.Request,
    body: bytes | None,
    upstream: Upstream,
    timeout: float,
    outcome: Outcome,
    echo: EchoFilter | None,
    scan: BodyScan | None,
) -> None:
    decoder: _Decoder | None = None
    up = upstream.conn
    w = upstream.writer
    try:
        w.write(up.send(request))
        if body is not None:
            if body:
                w.write(up.send(h11.Data(data=body)))
                outcome.bytes_up += len(body)
            w.write(up.send(h11.EndOfMessage()))
            await w.drain()
        else:
            await w.drain()
            while True:
                try:
                    event = await next_event(client, creader, timeout)
                except (TimeoutError, h11.RemoteProtocolError, ConnectionError) as exc:
                    raise ClientGone(f"the client broke off its request body ({reason_of(exc)})") from exc
                if isinstance(event, h11.Data):
                    data = scan.feed(bytes(event.data)) if scan is not None else event.data
                    outcome.bytes_up += len(data)
                    if data:
                        w.write(up.send(h11.Data(data=data)))
                        await w.drain()
                elif isinstance(event, h11.EndOfMessage):
                    tail = scan.flush() if scan is not None else b""
                    if tail:
                        outcome.bytes_up += len(tail)
                        w.write(up.send(h11.Data(data=tail)))
                    w.write(up.send(h11.EndOfMessage()))
                    await w.drain()
                    break
                else:
                    raise ClientGone("the client closed the connection before the end of its request body")
        # The response's pieces that h11 already holds go out in one write
        # (headers and a small body in one segment), flushed before every wait.
        out = bytearray()
        while True:
            event = up.next_event()
            if event is h11.NEED_DATA:
                if out:
                    cwriter.write(out)
                    out = bytearray()
                    await cwriter.drain()
                async with asyncio.timeout(timeout):
                    data = await upstream.reader.read(262144)
                up.receive_data(data)
                continue
            if isinstance(event, h11.InformationalResponse):
                if event.status_code == 101:
                    raise UpstreamFailed("the upstream switched protocols, which the proxy does not relay")
                continue  # 100-continue was answered by the proxy already; others are advisory
            if isinstance(event, h11.Response):
                outcome.status = event.status_code
                headers = forward_headers(list(event.headers))
                if echo is not None:
                    coding = b",".join(v for n, v in headers if n == b"content-encoding").decode("latin-1")
                    coding = coding.strip().lower()
                    if coding and coding != "identity":
                        if coding not in SEARCHABLE_CODINGS:
                            raise AnswerWithheld(
                                f"the upstream answered in the content-coding {coding!r}, which the gateway "
                                "cannot read to search it for the run's secrets (it asks for identity); "
                                "ask the server for an uncompressed or gzip answer"
                            )
                        decoder = _Decoder(coding)
                    # The body's length may change (and a coded body is passed on decoded):
                    # h11 frames it anew (chunked).
                    headers = [
                        (n, echo.whole(v))
                        for n, v in headers
                        if n != b"content-length" and not (decoder is not None and n == b"content-encoding")
                    ]
                response = h11.Response(status_code=event.status_code, headers=headers, reason=event.reason)
                out += client.send(response) or b""
                outcome.answered = True
            elif isinstance(event, h11.Data):
                if echo is not None:
                    data = bytes(event.data)
                    if decoder is not None:
                        data = decoder.feed(data)
                    event = h11.Data(data=echo.feed(data))
                    if not event.data:
                        continue
                outcome.bytes_down += len(event.data)
                # Large pieces go out as they are (send_with_data_passthrough does
                # not join them into a new bytes object: one copy fewer per chunk).
                pieces = client.send_with_data_passthrough(event) or []
                if len(event.data) < 16384:
                    for piece in pieces:
                        out += piece
                    continue
                if out:
                    cwriter.write(out)
                    out = bytearray()
                cwriter.writelines(pieces)
                await cwriter.drain()
            elif isinstance(event, h11.EndOfMessage):
                tail = b""
                if echo is not None:
                    if decoder is not None:
                        tail = echo.feed(decoder.flush())
                    tail += echo.flush()
                if tail:
                    outcome.bytes_down += len(tail)
                    out += client.send(h11.Data(data=tail)) or b""
                out += client.send(h11.EndOfMessage()) or b""
                cwriter.write(out)
                await cwriter.drain()
                return
            else:
                raise UpstreamFailed("the upstream closed the connection before the end of its response")
    except TimeoutError as exc:
        raise UpstreamFailed(f"the upstream sent nothing for {timeout:g} s") from exc
    except h11.RemoteProtocolError as exc:
        raise UpstreamFailed(f"the upstream broke HTTP/1.1 ({exc})") from exc
    except ConnectionError as exc:
        if cwriter.is_closing():
            raise ClientGone("the client closed the connection") from exc
        raise UpstreamFailed(f"the upstream connection failed ({reason_of(exc)})") from exc


class ClientGone(Exception):
    """The client broke off; nothing more can be sent to it."""


class ClientProtocol(asyncio.StreamReaderProtocol):
    """The client connection's protocol: a StreamReaderProtocol that also says when the client leaves."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gone = False
        self.on_gone: Callable[[], object] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # asyncio sets TCP_NODELAY only on sockets made with proto=IPPROTO_TCP;
        # the cell's listening socket (proto 0) hands out ones without it, and
        # Nagle against the client's delayed ACK then costs ~40 ms a response.
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)

    def _left(self) -> None:
        self.gone = True
        if self.on_gone is not None:
            self.on_gone()

    def eof_received(self) -> bool:
        keep_open = super().eof_received()
        self._left()
        return bool(keep_open)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._left()


@dataclass(slots=True)
class RequestInfo:
    """What an event says about a request; filled in as it is learned."""

    method: str
    scheme: Scheme
    host: str | None = None
    port: int | None = None
    path: str | None = None
    address: str | None = None
    start: float = field(default_factory=time.time)
    began: float = field(default_factory=time.monotonic)

    def url(self) -> str:
        if self.scheme == "tunnel" or self.method == "CONNECT":
            return f"{bracket(self.host or '?')}:{self.port}"
        default = 80 if self.scheme == "http" else 443
        port = "" if self.port in (None, default) else f":{self.port}"
        return f"{self.scheme}://{bracket(self.host or '?')}{port}{self.path or ''}"


def request_event(
    req: RequestInfo,
    *,
    run: str,
    cell: str,
    status: int | None,
    outcome: Outcome,
    verdict: Literal["allow", "deny"],
    reason: str,
    rule: str | None,
    scrub: Callable[[str], str],
) -> Event:
    """The ``http.request`` event of ``req`` (docs/EVENTS.md); ``scrub`` hides secrets in every text."""
    method = scrub(req.method)
    url = scrub(req.url())
    path = scrub(req.path) if req.path is not None and req.scheme != "tunnel" else None
    reason = scrub(reason)
    if verdict == "allow":
        what = f"{status}" if status is not None else "no answer"
        size = _size(outcome.bytes_down)
        summary = f"{method} {url} allowed by {rule or 'network.allow'}: {what}, {size}"
        if outcome.error:
            summary += f" ({scrub(outcome.error)})"
    else:
        summary = f"{method} {url} refused: {reason}"
    return Event(
        kind="http.request",
        cell=cell,
        layer="gateway",
        outcome="allowed" if verdict == "allow" else "denied",
        detail={
            "method": method,
            "scheme": req.scheme,
            "host": scrub(req.host) if req.host is not None else None,
            "port": req.port,
            "path": path,
            "address": req.address,
            "status": status,
            "bytes_up": outcome.bytes_up,
            "bytes_down": outcome.bytes_down,
            "duration": round(time.monotonic() - req.began, 6),
            "verdict": verdict,
            "rule": rule,
            "reason": reason,
        },
        time=req.start,
        summary=summary,
        run=run,
    )


def header_value(event: h11.Request, name: bytes) -> str | None:
    """The first value of header ``name`` (lower case) of ``event``."""
    for key, value in event.headers:
        if key == name:
            return value.decode("latin-1")
    return None


def own_answer(
    h: h11.Connection, status: int, text: str, *, deny: bool, rule: str | None, keep: bool
) -> bytes:
    """The bytes of an answer of the proxy's own (a refusal, a 502, a 503), in plain text.

    A refusal (``deny``, or any 400/403/431) carries ``X-Stockade-Verdict: deny``
    and ``X-Stockade-Rule`` (the rule that decided, or ``none``).

    Raises:
        h11.LocalProtocolError: ``h`` is not waiting for a response.
    """
    body = (text + "\n").encode("utf-8", "replace")
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]
    if not keep:
        headers.append((b"connection", b"close"))
    if deny or status in (400, 403, 431):
        safe = "".join(ch if " " <= ch < "\x7f" else "?" for ch in rule or "none")
        headers.append((b"x-stockade-verdict", b"deny"))
        headers.append((b"x-stockade-rule", safe.encode("ascii")))
    # The reason phrase is what clients print first ("Tunnel connection failed: 403 Forbidden").
    try:
        phrase = HTTPStatus(status).phrase.encode("ascii")
    except ValueError:
        phrase = b""
    out = h.send(h11.Response(status_code=status, headers=headers, reason=phrase)) or b""
    out += h.send(h11.Data(data=body)) or b""
    return out + (h.send(h11.EndOfMessage()) or b"")


def bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _size(n: int) -> str:
    if n < 1000:
        return f"{n} B"
    value = n / 1000
    for unit in ("kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            break
        value /= 1000
    return f"{value:.1f} {unit}"


def reason_of(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__


__all__ = [
    "HOP_BY_HOP",
    "SEARCHABLE_CODINGS",
    "AnswerWithheld",
    "BadRequest",
    "BodyRefused",
    "ClientGone",
    "ClientProtocol",
    "Outcome",
    "RequestInfo",
    "Scheme",
    "Target",
    "Upstream",
    "UpstreamFailed",
    "bracket",
    "forward",
    "forward_headers",
    "header_value",
    "next_event",
    "own_answer",
    "parse_absolute",
    "parse_authority",
    "reason_of",
    "request_event",
]
