"""Small servers for gateway tests: an HTTP/1.1 server (h11) and canary listeners.

They run on the test's event loop inside the test's network namespace, bound
to the addresses the namespace holds (93.184.216.34, 10.0.0.1, …).
``HttpServer`` answers from ``routes`` (path → ``Reply``) and records every
request and the local address it arrived on; a ``Canary`` accepts connections,
records that someone came, and closes them: a test that expects a refusal
asserts its canaries saw nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field

import h11


@dataclass
class Reply:
    status: int = 200
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    hang: bool = False
    """Send the headers and part of the body, then never finish (time-limit tests)."""


@dataclass
class Seen:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes
    local: str
    """The address the request arrived on (the one the client connected to)."""


Route = Reply | Callable[[Seen], Reply]


class HttpServer:
    def __init__(self, routes: dict[str, Route] | None = None, *, tls: ssl.SSLContext | None = None) -> None:
        self.routes: dict[str, Route] = dict(routes or {})
        self.tls = tls
        self.seen: list[Seen] = []
        self.connections = 0
        self._servers: list[asyncio.Server] = []
        self._never = asyncio.Event()

    async def listen(self, host: str, port: int) -> HttpServer:
        self._servers.append(await asyncio.start_server(self._serve, host, port, ssl=self.tls))
        return self

    async def close(self) -> None:
        self._never.set()
        for server in self._servers:
            server.close()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn = h11.Connection(h11.SERVER)
        local = str(writer.get_extra_info("sockname")[0])
        try:
            request: h11.Request | None = None
            body = b""
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await reader.read(65536)
                    conn.receive_data(data)
                    if not data:
                        return
                    continue
                if isinstance(event, h11.Request):
                    request = event
                elif isinstance(event, h11.Data):
                    body += bytes(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    break
                elif isinstance(event, h11.ConnectionClosed):
                    return
            assert request is not None
            seen = Seen(
                request.method.decode(),
                request.target.decode(),
                {k.decode().lower(): v.decode() for k, v in request.headers},
                body,
                local,
            )
            self.seen.append(seen)
            route = self.routes.get(seen.target.split("?", 1)[0], Reply(404, body=b"no such page"))
            reply = route(seen) if callable(route) else route
            headers = [*reply.headers, ("Connection", "close")]
            if reply.hang:
                headers.append(("Content-Length", str(len(reply.body) + 1000)))
            elif not any(k.lower() == "content-length" for k, _ in headers):
                headers.append(("Content-Length", str(len(reply.body))))
            writer.write(conn.send(h11.Response(status_code=reply.status, headers=headers)) or b"")
            if seen.method != "HEAD":
                writer.write(conn.send(h11.Data(data=reply.body)) or b"")
            await writer.drain()
            if reply.hang:
                await self._never.wait()
                return
            writer.write(conn.send(h11.EndOfMessage()) or b"")
            await writer.drain()
        except (ConnectionError, ssl.SSLError, h11.RemoteProtocolError):
            pass
        finally:
            writer.close()


class Canary:
    """Listens and records who connected; a refused request must leave ``hits`` empty."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        self._servers: list[asyncio.Server] = []

    async def listen(self, host: str, port: int) -> Canary:
        async def hit(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.hits.append(f"{writer.get_extra_info('sockname')[0]}:{port}")
            writer.close()

        self._servers.append(await asyncio.start_server(hit, host, port))
        return self

    async def close(self) -> None:
        for server in self._servers:
            server.close()
