"""The egress proxy a cell reaches on its own 127.0.0.1:3128.

Three kinds of request come in, each parsed by h11 and decided on its own host:

- ``GET http://host/path`` (absolute form): decided on host, port, method and
  path, connected to the address ``Egress.destination`` checked (where an
  address rule with methods or paths binds it too), forwarded with
  hop-by-hop headers removed and secrets put in place of placeholders where
  their policy lets them stand; a request carrying a secret's value is refused.
  Keep-alive: the next request on the connection is decided afresh.
- ``CONNECT host:port`` that the rules need not look inside: the ClientHello's
  server name must be ``host``, then bytes are relayed (``_tunnel``).
- ``CONNECT host:port`` that they must look inside (a rule with methods or
  paths, on the name or the address it resolves to; any secret in the run,
  whose value must not leave unseen): the proxy answers the TLS itself with a
  leaf of the run's CA and handles each request inside as above, forwarding
  over TLS verified against the real roots.

Every refusal is recorded (and counted toward the run's tripwire) before the
client reads it; an allowed request is recorded when it ends, off its path
(``_answers``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from ipaddress import ip_address
from typing import Any, cast

import h11

from stockade import _fds
from stockade.errors import StoreError
from stockade.gateway._answers import MAX_HEADERS, Answers, Client, GatewayHooks
from stockade.gateway._ca import RunCA
from stockade.gateway._egress import Destination, Egress, EgressDecision, EgressRefused
from stockade.gateway._http import (
    AnswerWithheld,
    BadRequest,
    BodyRefused,
    ClientGone,
    ClientProtocol,
    Outcome,
    RequestInfo,
    Scheme,
    Target,
    Upstream,
    UpstreamFailed,
    bracket,
    forward,
    forward_headers,
    header_value,
    next_event,
    parse_absolute,
    parse_authority,
    reason_of,
)
from stockade.gateway._secrets import SecretMisuse, Secrets
from stockade.gateway._tunnel import (
    UNRECOGNIZED_NAME_ALERT,
    ClientHelloError,
    Relay,
    read_client_hello,
    sni_mismatch,
)
from stockade.gateway._upstream import open_upstream
from stockade.record._event import Event

log = logging.getLogger("stockade.gateway")

MAX_SUBSTITUTED_BODY = 1024 * 1024
"""Bodies up to this size (with a Content-Length) have placeholders replaced; larger ones stream untouched."""
CONNECT_TIMEOUT = 30.0
LISTEN_BACKLOG = 1024
POOL_PER_PLACE = 16
"""Idle upstream connections kept per (host, port, address, TLS)."""
POOL_SIZE = 256
"""Idle upstream connections kept in all."""
POOL_IDLE = 30.0
"""Seconds an idle upstream connection is trusted to be still open (servers close theirs after 5-60 s)."""
HANDSHAKE_TIMEOUT = 30.0

_TOO_MANY_TEXT = b"stockade: too many connections to the gateway; close some and retry\n"
_TOO_MANY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_TOO_MANY_TEXT), _TOO_MANY_TEXT)
)


class Proxy(Answers):
    """The egress proxy of one run, serving each of its cells on a pre-bound socket.

    ``hide_echoed_secrets``: in every answer of a run with secrets, put the
    placeholder back where a secret's value comes back in any of its forms (a
    server quoting the token it got, data stored and read back), asking every
    host for uncompressed answers and decoding gzip and deflate ones so that
    they can be read. The daemon turns it on (``Gateway``).
    """

    def __init__(
        self,
        *,
        run_id: str,
        egress: Egress,
        hooks: GatewayHooks,
        secrets: Secrets,
        ca: RunCA | None,
        upstream_tls: ssl.SSLContext,
        idle_timeout: float = 300.0,
        max_connections: int = 1024,
        hide_echoed_secrets: bool = False,
    ) -> None:
        super().__init__(run_id=run_id, hooks=hooks, secrets=secrets)
        self._egress = egress
        self._ca = ca
        self._upstream_tls = upstream_tls
        self._idle = idle_timeout
        self._max_connections = max_connections
        self._hide_echoes = hide_echoed_secrets
        self._servers: list[asyncio.Server] = []
        self._connections: set[asyncio.Task[Any]] = set()
        self._pool: dict[tuple[str, int, str, bool], list[Upstream]] = {}
        self._closed = False
        self.refused = 0
        """Connections refused past ``max_connections`` or the descriptor reserve."""

    @property
    def connections(self) -> int:
        """Client connections open now."""
        return len(self._connections)

    async def serve(self, sock: socket.socket, cell_id: str) -> None:
        """Serve the listening ``sock`` (bound in the cell's namespace) for ``cell_id``; returns at once."""

        loop = asyncio.get_running_loop()

        async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._connection(cell_id, reader, writer)

        def protocol() -> ClientProtocol:
            return ClientProtocol(asyncio.StreamReader(limit=MAX_HEADERS, loop=loop), connected, loop=loop)

        # asyncio.start_server, with a protocol that says when the client leaves.
        # asyncio calls listen() again with its own backlog (100 unless told):
        # a burst of connections from the cell past that would wait for SYN retries.
        server = await loop.create_server(protocol, sock=sock, backlog=LISTEN_BACKLOG)
        self._servers.append(server)

    async def close(self) -> None:
        """Stop listening, end every connection, and wait for the records in flight."""
        self._closed = True
        for server in self._servers:
            server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self.refused > 1:
            later = self.refused - 1
            await self._note_refused("", "the later refusals of this run's gateway, counted", later)
        await self._recorded(timeout=5.0)
        for kept in self._pool.values():
            for upstream in kept:
                upstream.close()
        self._pool.clear()
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()

    async def drop_connections(self) -> None:
        """End every client connection open now and forget the kept upstreams
        (the rules changed: ``Gateway.set_network``); the listeners stay."""
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*list(self._connections), return_exceptions=True)
        for kept in self._pool.values():
            for upstream in kept:
                upstream.close()
        self._pool.clear()

    # ------------------------------------------------------------------ connections

    async def _connection(
        self, cell: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        client = Client(cell, reader, writer)
        try:
            sock = writer.get_extra_info("socket")
            low = sock is not None and _fds.low(sock.fileno())  # the daemon's reserve (stockade._fds)
            if self._closed or low or len(self._connections) > self._max_connections:
                # A bound on the daemon's sockets, not a policy decision: the
                # first refusal is an event, the later ones are counted (one
                # event at close), so a flood does not flood the record.
                writer.write(_TOO_MANY)
                if not self._closed:
                    await self._refuse_connection(cell, low)
                return
            await self._requests(client, None)
        except (ConnectionError, TimeoutError, ssl.SSLError, h11.RemoteProtocolError, ClientGone):
            pass  # the client went away: nothing to answer
        except asyncio.CancelledError:
            if not self._closed:
                raise
        except Exception:  # a bug: log it, never take the daemon's loop down
            log.exception("the gateway's connection handler failed")
        finally:
            self._release(client)
            if self._closed:
                writer.transport.abort()
            else:
                writer.close()
            self._connections.discard(task)

    async def _refuse_connection(self, cell: str, low: bool) -> None:
        self.refused += 1
        if low:
            why = "the daemon is near its descriptor limit (its reserve is the operator's)"
        else:
            # The run's own doing: it counts toward the tripwire, as a denial.
            why = f"the run has {self._max_connections} connections to the gateway open; close some"
            await self._hooks.denied()
        if self.refused == 1:
            await self._note_refused(cell, why, 1)

    async def _note_refused(self, cell: str, why: str, count: int) -> None:
        word = "a connection" if count == 1 else f"{count} connections"
        event = Event(
            kind="connection.refused",
            cell=cell,
            layer="gateway",
            outcome="denied",
            run=self.run_id,
            summary=f"the gateway refused {word}: {why}",
            detail={
                "listener": "gateway",
                "reason": why,
                "count": count,
                "max_connections": self._max_connections,
                "idle_timeout": self._idle,
            },
        )
        with contextlib.suppress(StoreError):  # the refusal stands whether or not it is stored
            await self._hooks.record([event])

    async def _requests(self, c: Client, tls: Destination | None) -> None:
        """Serve requests on ``c`` until it closes; ``tls``: inside a terminated CONNECT to it."""
        while True:
            try:
                event = await next_event(c.h, c.reader, self._idle)
            except TimeoutError:
                return
            except h11.RemoteProtocolError as exc:
                if c.reader.at_eof():
                    return  # the client left mid-request: nobody to answer
                req = RequestInfo("?", "https" if tls else "http")
                status = exc.error_status_hint if exc.error_status_hint in (400, 431) else 400
                await self._refuse(c, req, status, f"the request is malformed: {exc}", None)
                return
            if not isinstance(event, h11.Request):
                return  # ConnectionClosed
            if len(event.target) + sum(len(n) + len(v) + 4 for n, v in event.headers) > MAX_HEADERS:
                # h11 bounds only a head that is still incomplete; one read can bring it whole.
                req = RequestInfo(event.method.decode("ascii", "replace"), "https" if tls else "http")
                await self._refuse(c, req, 431, f"the request's headers exceed {MAX_HEADERS // 1024} KiB")
                return
            keep = await self._request(c, event, tls)
            if not keep or c.h.our_state is not h11.DONE or c.h.their_state is not h11.DONE:
                return
            c.h.start_next_cycle()

    async def _request(self, c: Client, event: h11.Request, tls: Destination | None) -> bool:
        """Handle one request; whether the connection may carry another."""
        method = event.method.decode("ascii", "replace")
        raw_target = event.target.decode("ascii", "replace")
        scheme: Scheme = "https" if tls is not None else "http"
        req = RequestInfo(method, "tunnel" if method == "CONNECT" and tls is None else scheme)
        problem: BadRequest | None = None
        try:  # parsed first so that even a refusal of a halted run names the host
            if method == "CONNECT":
                req.host, req.port = parse_authority(raw_target, None)
            else:
                target = _target(raw_target, tls)
                req.host, req.port, req.path = target.host, target.port, target.path
        except BadRequest as exc:
            problem = exc
        halted = self._hooks.halted()
        if halted is not None:
            return await self._refuse(c, req, 403, f"{halted}; every request is refused")
        if not await self._flush_unrecorded(c, req):
            return False
        if problem is not None:
            return await self._refuse(c, req, 400, str(problem))
        if method == "CONNECT":
            if tls is not None:
                return await self._refuse(c, req, 400, "a CONNECT inside a CONNECT is not supported")
            return await self._connect(c, req)
        assert req.host is not None and req.port is not None
        host_header = header_value(event, b"host")
        if host_header is None and event.http_version == b"1.0":
            # HTTP/1.0 may leave Host out; the request upstream (HTTP/1.1) needs one.
            host_header = bracket(req.host) + ("" if req.port == (443 if tls else 80) else f":{req.port}")
            event = h11.Request(
                method=event.method,
                target=event.target,
                headers=[*event.headers, (b"host", host_header.encode("ascii"))],
                http_version=b"1.0",
            )
        if host_header is None:
            return await self._refuse(
                c, req, 400, "the request has no Host header; send one naming the URL's host"
            )
        try:
            named = parse_authority(host_header, 443 if tls else 80)
        except BadRequest:
            named = None
        if named != (req.host, req.port):
            return await self._refuse(
                c,
                req,
                400,
                f"the Host header {host_header!r} does not name the host of the request "
                f"({bracket(req.host)}:{req.port}); send the same host in both",
            )
        return await self._forward(c, event, req, tls)

    # ------------------------------------------------------------------ plain requests

    async def _forward(
        self, c: Client, event: h11.Request, req: RequestInfo, tls: Destination | None
    ) -> bool:
        assert req.host is not None and req.port is not None and req.path is not None
        host, port, path = req.host, req.port, req.path
        decision = self._egress.decide(host, port, method=req.method, path=path.partition("?")[0])
        if decision.verdict != "allow":
            return await self._refuse(c, req, 403, decision.reason, decision.rule)
        encrypted = tls is not None
        secrets = self._secrets
        try:
            # Every part of the request is searched for the values (the agent's own
            # bytes, before any placeholder is replaced), whatever its host.
            secrets.refuse_values(host.encode("ascii", "replace"), host, "in its host name")
            secrets.refuse_values(event.method, host, "in its method")
            secrets.refuse_values(b"\n".join(n for n, _ in event.headers), host, "in a header's name")
            headers = [
                (n, secrets.put(v, host, "header", encrypted=encrypted, header=n)) for n, v in event.headers
            ]
            if self._hide_echoes and secrets.active:
                # Answers are searched for the values (``echo_filter``): they should come
                # uncompressed (gzip and deflate are decoded when they come anyway).
                headers = [(n, v) for n, v in headers if n != b"accept-encoding"]
                headers.append((b"accept-encoding", b"identity"))
            target = secrets.put(path.encode("ascii"), host, "url", encrypted=encrypted)
        except SecretMisuse as exc:
            return await self._refuse(c, req, 403, str(exc), decision.rule)
        if c.h.they_are_waiting_for_100_continue:
            c.writer.write(c.h.send(h11.InformationalResponse(status_code=100, headers=[])))
        body: bytes | None = None
        length = header_value(event, b"content-length")
        chunked = header_value(event, b"transfer-encoding") is not None
        if not chunked and (length is None or (length.isdigit() and int(length) <= MAX_SUBSTITUTED_BODY)):
            # Read whole (no body at all, or a small one): placeholders in it can be
            # replaced, and the request can be sent again if a kept connection fails.
            body = await self._read_body(c)
            if body:
                try:
                    body = secrets.put(body, host, "body", encrypted=encrypted)
                except SecretMisuse as exc:
                    return await self._refuse(c, req, 403, str(exc), decision.rule)
                headers = [(n, v) for n, v in headers if n != b"content-length"]
                headers.append((b"content-length", str(len(body)).encode()))
        try:
            upstream_request = h11.Request(
                method=event.method, target=target, headers=forward_headers(headers)
            )
        except h11.LocalProtocolError:
            # A value put in place of a placeholder broke the request (a space in
            # the URL...). h11's message would quote the value: not repeated here.
            return await self._refuse(
                c,
                req,
                400,
                "a secret's value cannot stand where its placeholder is (it holds characters a URL "
                "or header cannot); send the placeholder in a header or the body",
            )

        protocol = c.writer.transport.get_protocol()
        assert isinstance(protocol, ClientProtocol)
        echo = secrets.echo_filter() if self._hide_echoes else None
        while True:
            kept = c.upstream is not None and c.upstream.key[:2] == (host, port) and c.upstream.usable()
            if not kept:
                self._release(c)
                opened = await self._open(c, req, decision, tls)
                if not isinstance(opened, Upstream):
                    return opened  # refused or failed: whether the client's connection may go on
                c.upstream = opened
            upstream = c.upstream
            assert upstream is not None
            req.address = upstream.address
            # An address rule's methods and paths bind whatever name led here
            # (checked per request: a kept connection serves the next one too).
            bound = self._egress.decide_address(
                host, ip_address(upstream.address), port, method=req.method, path=path.partition("?")[0]
            )
            if bound is not None:
                return await self._refuse(c, req, 403, bound.reason, bound.rule)
            outcome = Outcome()
            # A client that leaves while the upstream is silent would go unnoticed
            # (nothing reads it then): end the upstream connection at once, as nginx does.
            protocol.on_gone = upstream.writer.transport.abort
            try:
                await forward(
                    c.h,
                    c.reader,
                    c.writer,
                    upstream_request,
                    body,
                    upstream,
                    timeout=self._idle,
                    outcome=outcome,
                    echo=echo,
                    scan=secrets.body_scan(host) if body is None else None,
                )
            except BodyRefused as exc:
                # Part of the body went out: that connection carries nothing more.
                c.close_upstream()
                return await self._refuse(c, req, 403, str(exc), decision.rule)
            except UpstreamFailed as exc:
                c.close_upstream()
                gone = protocol.gone
                retry = not isinstance(exc, AnswerWithheld)
                if retry and kept and body is not None and not outcome.answered and not gone:
                    # The server closed a kept connection as the request went out
                    # (it may, between requests): once more, on a new connection.
                    continue
                why = "the client closed the connection before the end of the response" if gone else str(exc)
                outcome.error = why
                if outcome.answered or gone:
                    self._record_later(self._event(c, req, outcome.status, outcome, decision, "allow", why))
                    return False
                return await self._fail(c, req, decision, why, outcome)
            except ClientGone as exc:
                c.close_upstream()
                self._record_later(self._event(c, req, outcome.status, outcome, decision, "allow", str(exc)))
                return False
            finally:
                protocol.on_gone = None
            break
        if upstream.conn.our_state is h11.DONE and upstream.conn.their_state is h11.DONE:
            upstream.conn.start_next_cycle()
        else:
            c.close_upstream()
        self._record_later(self._event(c, req, outcome.status, outcome, decision, "allow", decision.reason))
        return True

    async def _open(
        self, c: Client, req: RequestInfo, decision: EgressDecision, tls: Destination | None
    ) -> Upstream | bool:
        """A new connection to the request's upstream; once a refusal or a 502 went
        out instead, whether the client's connection may carry another request."""
        assert req.host is not None and req.port is not None
        dest = tls
        if dest is None:
            try:
                dest = await self._egress.destination(req.host, req.port)
            except EgressRefused as exc:
                return await self._refuse(c, req, 403, exc.reason, exc.rule)
            except Exception as exc:  # ResolveError and kin: nothing to connect to
                return await self._fail(c, req, decision, f"{req.host} could not be resolved: {exc}")
        req.address = str(dest.address)
        # Before connecting: an address rule's methods and paths bind what a name rule let through.
        bound = self._egress.decide_address(
            req.host, dest.address, dest.port, method=req.method, path=(req.path or "/").partition("?")[0]
        )
        if bound is not None:
            return await self._refuse(c, req, 403, bound.reason, bound.rule)
        key = (dest.host, dest.port, str(dest.address), tls is not None)
        idle = self._pool.get(key)
        now = asyncio.get_running_loop().time()
        while idle:
            upstream = idle.pop()
            if upstream.usable() and now - upstream.idle_since < POOL_IDLE:
                return upstream
            upstream.close()
        try:
            reader, writer = await open_upstream(
                dest, tls=self._upstream_tls if tls is not None else None, timeout=CONNECT_TIMEOUT
            )
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            return await self._fail(c, req, decision, f"could not connect to {req.url()}: {reason_of(exc)}")
        return Upstream(key, str(dest.address), reader, writer)

    def _release(self, c: Client) -> None:
        """Keep ``c``'s upstream connection for a later request to the same place, or close it.

        Opening one costs more than the rest of a small request; a client that
        opens a connection per request (curl in a loop, ``Connection: close``)
        then still finds the upstream's open. Only the run's own clients share
        them, and only toward the same checked address.
        """
        upstream, c.upstream = c.upstream, None
        if upstream is None:
            return
        kept = self._pool.setdefault(upstream.key, [])
        total = sum(len(v) for v in self._pool.values())
        if self._closed or not upstream.usable() or len(kept) >= POOL_PER_PLACE or total >= POOL_SIZE:
            upstream.close()
        else:
            upstream.idle_since = asyncio.get_running_loop().time()
            kept.append(upstream)

    async def _read_body(self, c: Client) -> bytes:
        chunks: list[bytes] = []
        while True:
            try:
                event = await next_event(c.h, c.reader, self._idle)
            except (TimeoutError, h11.RemoteProtocolError) as exc:
                raise ClientGone(f"the client broke off its request body ({reason_of(exc)})") from exc
            if isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return b"".join(chunks)
            else:
                raise ClientGone("the client closed the connection before the end of its request body")

    # ------------------------------------------------------------------ CONNECT

    async def _connect(self, c: Client, req: RequestInfo) -> bool:
        assert req.host is not None and req.port is not None
        host, port = req.host, req.port
        # h11's view of the CONNECT ends with its EndOfMessage (it has no body).
        if not isinstance(await next_event(c.h, c.reader, self._idle), h11.EndOfMessage):
            return False
        decision = self._egress.decide(host, port)
        if decision.verdict != "allow":
            return await self._refuse(c, req, 403, decision.reason, decision.rule)
        try:
            dest = await self._egress.destination(host, port)
        except EgressRefused as exc:
            return await self._refuse(c, req, 403, exc.reason, exc.rule)
        except Exception as exc:
            return await self._fail(c, req, decision, f"{host} could not be resolved: {exc}")
        req.host, req.address = dest.host, str(dest.address)
        # With secrets in the run every tunnel is opened: their values must not
        # leave unseen toward any host. An address rule with methods or paths
        # binds what reaches the address, whatever name led there.
        inspect = decision.inspect or self._secrets.active or self._egress.address_limits(dest.address, port)
        if inspect and self._ca is None:
            return await self._refuse(
                c,
                req,
                403,
                f"requests to {host} must be inspected (a rule with methods or paths, or a secret), "
                "but this run has no CA; the gateway was set up without one",
                decision.rule,
            )
        c.writer.write(c.h.send(h11.Response(status_code=200, headers=[], reason=b"Connection established")))
        trailing, _closed = c.h.trailing_data
        if inspect:
            await self._terminate(c, dest, req, decision, bytes(trailing))
        else:
            await self._tunnel(c, dest, req, decision, bytes(trailing))
        return False

    async def _tunnel(
        self, c: Client, dest: Destination, req: RequestInfo, decision: EgressDecision, first: bytes
    ) -> None:
        # The upstream connection is opened while the ClientHello is on its way
        # (a round trip saved on every tunnel); no byte of the client's goes
        # there before its server name is checked, and a refused tunnel closes
        # it unused. The address is the checked one, which a valid CONNECT
        # reaches anyway: opening it early gives the agent nothing new.
        connecting = asyncio.ensure_future(open_upstream(dest, tls=None, timeout=CONNECT_TIMEOUT))
        taken = False
        try:
            try:
                hello, first = await read_client_hello(c.reader, first, min(self._idle, HANDSHAKE_TIMEOUT))
            except ClientHelloError as exc:
                await self._refuse_in_tunnel(c, req, f"{exc}; only TLS may pass through CONNECT", decision)
                return
            if hello is None:
                return  # the client left before saying anything
            # Nothing more is read from the client until the relay takes over, so
            # ``first`` holds every byte the client has sent (none is left behind
            # in the StreamReader).
            client_transport = cast(asyncio.Transport, c.writer.transport)
            client_transport.pause_reading()
            client_eof = c.reader.at_eof()
            mismatch = sni_mismatch(hello, dest.host)
            if mismatch is not None:
                if await self._refuse_in_tunnel(c, req, mismatch, decision):
                    c.writer.write(UNRECOGNIZED_NAME_ALERT)  # after the record, as every refusal
                return
            try:
                _reader, writer = await connecting
            except (OSError, TimeoutError) as exc:
                outcome = Outcome(status=502, error=f"could not connect to {req.url()}: {reason_of(exc)}")
                self._record_later(self._event(c, req, 502, outcome, decision, "allow", outcome.error or ""))
                return
            taken = True
        finally:
            if not taken:
                _abandon(connecting)
        relay = Relay(
            client_transport,
            cast(asyncio.Transport, writer.transport),
            idle_timeout=self._idle,
        )
        error: BaseException | None = None
        try:
            error = await relay.run(first, client_eof=client_eof)
        finally:
            outcome = Outcome(status=200, bytes_up=relay.bytes_up, bytes_down=relay.bytes_down)
            reason = decision.reason if error is None else f"the tunnel ended: {reason_of(error)}"
            self._record_later(self._event(c, req, 200, outcome, decision, "allow", reason))

    async def _terminate(
        self, c: Client, dest: Destination, req: RequestInfo, decision: EgressDecision, first: bytes
    ) -> None:
        assert self._ca is not None
        if first:
            return  # the client spoke before the 200: not a TLS client we can serve
        try:
            await c.writer.start_tls(
                self._ca.server_context(dest.host), ssl_handshake_timeout=HANDSHAKE_TIMEOUT
            )
        except (ssl.SSLError, ConnectionError, TimeoutError) as exc:
            reason = (
                f"the client's TLS handshake with the gateway failed ({reason_of(exc)}); trust the run's CA"
            )
            outcome = Outcome(error=reason)
            self._record_later(self._event(c, req, None, outcome, decision, "allow", reason))
            return
        inner = Client(c.cell, c.reader, c.writer)
        try:
            await self._requests(inner, dest)
        finally:
            self._release(inner)


def _target(raw: str, tls: Destination | None) -> Target:
    """Where a request goes: its absolute URL, or inside a terminated CONNECT, that host.

    Raises:
        BadRequest: not a target this proxy accepts.
    """
    if tls is None:
        return parse_absolute(raw)
    if raw.startswith("/"):
        return Target(tls.host, tls.port, raw)
    if raw.startswith("https://"):
        absolute = parse_absolute("http://" + raw[len("https://") :])
        if absolute.host != tls.host:
            raise BadRequest(f"{raw[:200]!r} names another host than the CONNECT ({tls.host}); send a path")
        return Target(tls.host, tls.port, absolute.path)
    raise BadRequest(f"{raw[:200]!r} is not a request target inside TLS; send a path such as '/v1/x'")


def _abandon(connecting: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]]) -> None:
    """A tunnel's early upstream connection that the relay did not take: cancelled,
    or closed unused."""
    if not connecting.done():
        connecting.cancel()
        return
    if connecting.cancelled() or connecting.exception() is not None:
        return
    _reader, writer = connecting.result()
    writer.close()


__all__ = ["GatewayHooks", "Proxy"]
