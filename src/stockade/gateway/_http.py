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
from dataclasses import dataclass, field

import h11

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

    key: tuple[str, int]
    address: str
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    conn: h11.Connection = field(default_factory=lambda: h11.Connection(h11.CLIENT))

    def usable(self) -> bool:
        return self.conn.our_state is h11.IDLE and not self.writer.is_closing()

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
) -> None:
    """Send ``request`` (its body: ``body`` when already read, else streamed from the
    client) to ``upstream`` and its response back to the client, filling ``outcome``.

    Raises:
        UpstreamFailed: the upstream closed, timed out or broke HTTP.
        ClientGone: the client closed, timed out or broke HTTP mid-request.
    """
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
                    raise ClientGone(f"the client broke off its request body ({_why(exc)})") from exc
                if isinstance(event, h11.Data):
                    outcome.bytes_up += len(event.data)
                    w.write(up.send(event))
                    await w.drain()
                elif isinstance(event, h11.EndOfMessage):
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
                response = h11.Response(
                    status_code=event.status_code,
                    headers=forward_headers(list(event.headers)),
                    reason=event.reason,
                )
                out += client.send(response) or b""
                outcome.answered = True
            elif isinstance(event, h11.Data):
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
        raise UpstreamFailed(f"the upstream connection failed ({_why(exc)})") from exc


class ClientGone(Exception):
    """The client broke off; nothing more can be sent to it."""


def _why(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__


__all__ = [
    "HOP_BY_HOP",
    "BadRequest",
    "ClientGone",
    "Outcome",
    "Target",
    "Upstream",
    "UpstreamFailed",
    "forward",
    "forward_headers",
    "next_event",
    "parse_absolute",
    "parse_authority",
]
