"""The egress proxy a cell reaches on its own 127.0.0.1:3128.

Three kinds of request come in, each parsed by h11 and decided on its own host:

- ``GET http://host/path`` (absolute form): decided on host, port, method and
  path, connected to the address ``Egress.destination`` checked, forwarded
  with hop-by-hop headers removed and secrets put in place of placeholders.
  Keep-alive: the next request on the connection is decided afresh.
- ``CONNECT host:port`` that the rules need not look inside: the ClientHello's
  server name must be ``host``, then bytes are relayed (``_tunnel``).
- ``CONNECT host:port`` that they must look inside (a rule with methods or
  paths, a secret meant for the host): the proxy answers the TLS itself with a
  leaf of the run's CA and handles each request inside as above, forwarding
  over TLS verified against the real roots.

Every refusal is recorded (and counted toward the run's tripwire) before the
client reads it; an allowed request is recorded when it ends, off its path.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, cast

import h11

from stockade.gateway._ca import RunCA
from stockade.gateway._egress import Destination, Egress, EgressDecision, EgressRefused
from stockade.gateway._http import (
    BadRequest,
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
    own_answer,
    parse_absolute,
    parse_authority,
    reason_of,
    request_event,
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

MAX_HEADERS = 64 * 1024
"""Bytes of a request's line and headers (h11's ``max_incomplete_event_size``); past it, 431."""
MAX_SUBSTITUTED_BODY = 1024 * 1024
"""Bodies up to this size (with a Content-Length) have placeholders replaced; larger ones stream untouched."""
CONNECT_TIMEOUT = 30.0
LISTEN_BACKLOG = 1024
HANDSHAKE_TIMEOUT = 30.0

_TOO_MANY_TEXT = b"stockade: too many connections to the gateway; close some and retry\n"
_TOO_MANY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_TOO_MANY_TEXT), _TOO_MANY_TEXT)
)


class GatewayHooks(Protocol):
    """What the gateway needs of the daemon: the record, the tripwire, the run's state."""

    async def record(self, events: Sequence[Event]) -> None:
        """Store ``events`` durably before returning.

        Raises:
            StoreError: the store cannot write; the proxy answers 503 and forwards nothing.
        """
        ...

    async def denied(self) -> None:
        """Count one denial toward the run's tripwire."""
        ...

    def halted(self) -> str | None:
        """Why the run is halted, or ``None``: a halted run's requests are all refused."""
        ...


@dataclass(slots=True)
class _Client:
    """One client connection (or the TLS session inside one of its CONNECTs)."""

    cell: str
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    h: h11.Connection = field(
        default_factory=lambda: h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADERS)
    )
    upstream: Upstream | None = None

    def close_upstream(self) -> None:
        if self.upstream is not None:
            self.upstream.close()
            self.upstream = None


class Proxy:
    """The egress proxy of one run, serving each of its cells on a pre-bound socket."""

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
    ) -> None:
        self.run_id = run_id
        self._egress = egress
        self._hooks = hooks
        self._secrets = secrets
        self._ca = ca
        self._upstream_tls = upstream_tls
        self._idle = idle_timeout
        self._max_connections = max_connections
        self._servers: list[asyncio.Server] = []
        self._connections: set[asyncio.Task[Any]] = set()
        self._recording: set[asyncio.Task[None]] = set()
        self._unrecorded: list[Event] = []
        self._closed = False

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
        if self._recording:
            await asyncio.wait(self._recording, timeout=5.0)
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()

    # ------------------------------------------------------------------ connections

    async def _connection(
        self, cell: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        client = _Client(cell, reader, writer)
        try:
            if self._closed or len(self._connections) > self._max_connections:
                # Not a policy decision and not recorded: a bound on the daemon's sockets.
                writer.write(_TOO_MANY)
                return
            await self._requests(client, None)
        except (ConnectionError, TimeoutError, ssl.SSLError, ClientGone):
            pass  # the client went away: nothing to answer
        except asyncio.CancelledError:
            if not self._closed:
                raise
        except Exception:  # a bug: log it, never take the daemon's loop down
            log.exception("the gateway's connection handler failed")
        finally:
            client.close_upstream()
            if self._closed:
                writer.transport.abort()
            else:
                writer.close()
            self._connections.discard(task)

    async def _requests(self, c: _Client, tls: Destination | None) -> None:
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

    async def _request(self, c: _Client, event: h11.Request, tls: Destination | None) -> bool:
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
        self, c: _Client, event: h11.Request, req: RequestInfo, tls: Destination | None
    ) -> bool:
        assert req.host is not None and req.port is not None and req.path is not None
        host, port, path = req.host, req.port, req.path
        decision = self._egress.decide(host, port, method=req.method, path=path.partition("?")[0])
        if decision.verdict != "allow":
            return await self._refuse(c, req, 403, decision.reason, decision.rule)
        encrypted = tls is not None
        try:
            headers = [(n, self._put_secrets(v, host, encrypted)) for n, v in event.headers]
            target = self._put_secrets(path.encode("ascii"), host, encrypted)
        except SecretMisuse as exc:
            return await self._refuse(c, req, 403, str(exc), decision.rule)
        if c.h.they_are_waiting_for_100_continue:
            c.writer.write(c.h.send(h11.InformationalResponse(status_code=100, headers=[])))
        body: bytes | None = None
        length = header_value(event, b"content-length")
        small = length is not None and length.isdigit() and int(length) <= MAX_SUBSTITUTED_BODY
        if small and header_value(event, b"transfer-encoding") is None:
            body = await self._read_body(c)
            try:
                body = self._put_secrets(body, host, encrypted)
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

        upstream = c.upstream
        if upstream is None or upstream.key != (host, port) or not upstream.usable():
            c.close_upstream()
            dest = tls
            if dest is None:
                try:
                    dest = await self._egress.destination(host, port)
                except EgressRefused as exc:
                    return await self._refuse(c, req, 403, exc.reason, exc.rule)
                except Exception as exc:  # ResolveError and kin: nothing to connect to
                    return await self._fail(c, req, decision, f"{host} could not be resolved: {exc}")
            req.address = str(dest.address)
            try:
                reader, writer = await open_upstream(
                    dest, tls=self._upstream_tls if tls is not None else None, timeout=CONNECT_TIMEOUT
                )
            except (OSError, TimeoutError, ssl.SSLError) as exc:
                return await self._fail(
                    c, req, decision, f"could not connect to {req.url()}: {reason_of(exc)}"
                )
            upstream = c.upstream = Upstream((host, port), str(dest.address), reader, writer)
        req.address = upstream.address
        outcome = Outcome()
        protocol = c.writer.transport.get_protocol()
        assert isinstance(protocol, ClientProtocol)
        # A client that leaves while the upstream is silent would go unnoticed
        # (nothing reads it then): end the upstream connection at once, as nginx does.
        protocol.on_gone = upstream.writer.transport.abort
        try:
            await forward(
                c.h, c.reader, c.writer, upstream_request, body, upstream, timeout=self._idle, outcome=outcome
            )
        except UpstreamFailed as exc:
            c.close_upstream()
            gone = protocol.gone
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
        if upstream.conn.our_state is h11.DONE and upstream.conn.their_state is h11.DONE:
            upstream.conn.start_next_cycle()
        else:
            c.close_upstream()
        self._record_later(self._event(c, req, outcome.status, outcome, decision, "allow", decision.reason))
        return True

    def _put_secrets(self, data: bytes, host: str, encrypted: bool) -> bytes:
        """``data`` with the values of the secrets meant for ``host`` in place of their placeholders.

        Only inside terminated TLS: in plain HTTP a value would cross the
        network readable by anyone on the way, so a placeholder there is refused.

        Raises:
            SecretMisuse: a placeholder for another host, or any placeholder in plain HTTP.
        """
        out = self._secrets.substitute(data, host)
        if not encrypted and out is not data:
            names = self._secrets.names_in(data)
            if names:
                raise SecretMisuse(names, host, unencrypted=True)
        return out

    async def _read_body(self, c: _Client) -> bytes:
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

    async def _connect(self, c: _Client, req: RequestInfo) -> bool:
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
        if decision.inspect and self._ca is None:
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
        if decision.inspect:
            await self._terminate(c, dest, req, decision, bytes(trailing))
        else:
            await self._tunnel(c, dest, req, decision, bytes(trailing))
        return False

    async def _tunnel(
        self, c: _Client, dest: Destination, req: RequestInfo, decision: EgressDecision, first: bytes
    ) -> None:
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
            _reader, writer = await open_upstream(dest, tls=None, timeout=CONNECT_TIMEOUT)
        except (OSError, TimeoutError) as exc:
            outcome = Outcome(status=502, error=f"could not connect to {req.url()}: {reason_of(exc)}")
            self._record_later(self._event(c, req, 502, outcome, decision, "allow", outcome.error or ""))
            return
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
        self, c: _Client, dest: Destination, req: RequestInfo, decision: EgressDecision, first: bytes
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
        inner = _Client(c.cell, c.reader, c.writer)
        try:
            await self._requests(inner, dest)
        finally:
            inner.close_upstream()

    # ------------------------------------------------------------------ answers and events

    async def _refuse(
        self, c: _Client, req: RequestInfo, status: int, reason: str, rule: str | None = None
    ) -> bool:
        """Record a denial, count it, then answer ``status``; whether the connection may go on.

        After a 403 to a request read whole, it may (the next request is
        decided on its own); after anything malformed, or a body left unread, it ends.
        """
        reason = self._secrets.scrub(reason)
        event = self._event(c, req, status, Outcome(), None, "deny", reason, rule=rule)
        try:
            await self._hooks.record([event])
        except Exception as exc:
            return self._answer(c, 503, _store_failed(exc), verdict="deny", rule=rule)
        await self._hooks.denied()
        keep = status == 403 and c.h.their_state is h11.DONE
        text = f"stockade: {req.method} {self._secrets.scrub(req.url())} refused: {reason}"
        return self._answer(c, status, text, rule=rule, keep=keep)

    async def _refuse_in_tunnel(
        self, c: _Client, req: RequestInfo, reason: str, decision: EgressDecision
    ) -> bool:
        """A refusal after the 200 of a CONNECT: recorded and counted (True), then the connection closes.

        False when it could not be recorded: there is no HTTP answer to give then, only the close.
        """
        event = self._event(c, req, None, Outcome(), decision, "deny", reason)
        try:
            await self._hooks.record([event])
        except Exception:
            return False
        await self._hooks.denied()
        return True

    async def _fail(
        self,
        c: _Client,
        req: RequestInfo,
        decision: EgressDecision,
        reason: str,
        outcome: Outcome | None = None,
    ) -> bool:
        """An allowed request the upstream could not serve: 502, recorded when answered."""
        outcome = outcome or Outcome()
        outcome.status = 502
        reason = self._secrets.scrub(reason)
        self._answer(c, 502, f"stockade: {req.method} {self._secrets.scrub(req.url())} failed: {reason}")
        self._record_later(self._event(c, req, 502, outcome, decision, "allow", reason))
        return False

    def _answer(
        self,
        c: _Client,
        status: int,
        text: str,
        *,
        verdict: str | None = None,
        rule: str | None = None,
        keep: bool = False,
    ) -> bool:
        """Send the proxy's own answer; whether the connection may carry another request."""
        if c.h.our_state is not h11.SEND_RESPONSE:
            return False
        try:
            c.writer.write(own_answer(c.h, status, text, deny=verdict is not None, rule=rule, keep=keep))
        except h11.LocalProtocolError:
            return False
        return keep

    async def _flush_unrecorded(self, c: _Client, req: RequestInfo) -> bool:
        """Store what a failed background record left; False (after a 503) while the store cannot."""
        if not self._unrecorded:
            return True
        pending, self._unrecorded = self._unrecorded, []
        try:
            await self._hooks.record(pending)
        except Exception as exc:
            self._unrecorded = pending + self._unrecorded
            return self._answer(c, 503, _store_failed(exc), verdict="deny")
        return True

    def _record_later(self, event: Event) -> None:
        task = asyncio.get_running_loop().create_task(self._record_quietly(event))
        self._recording.add(task)
        task.add_done_callback(self._recording.discard)

    async def _record_quietly(self, event: Event) -> None:
        try:
            await self._hooks.record([event])
        except Exception:
            # Kept for the next request, which stops (503) until it can be stored:
            # nothing more is forwarded that the record could not hold.
            if len(self._unrecorded) < 10_000:
                self._unrecorded.append(event)

    def _event(
        self,
        c: _Client,
        req: RequestInfo,
        status: int | None,
        outcome: Outcome,
        decision: EgressDecision | None,
        verdict: Literal["allow", "deny"],
        reason: str,
        *,
        rule: str | None = None,
    ) -> Event:
        rule = rule if rule is not None else (decision.rule if decision is not None else None)
        return request_event(
            req,
            run=self.run_id,
            cell=c.cell,
            status=status,
            outcome=outcome,
            verdict=verdict,
            reason=reason,
            rule=rule,
            scrub=self._secrets.scrub,
        )


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


def _store_failed(exc: BaseException) -> str:
    return (
        f"stockade: the record cannot be written ({exc}); nothing is forwarded until it can, "
        "so fix the daemon's store (disk space, permissions) and retry"
    )


__all__ = ["GatewayHooks", "Proxy"]
