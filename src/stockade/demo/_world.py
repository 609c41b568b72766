"""The demo's "internet": a network namespace of its own, where every host lives on ``lo``.

Nothing the demo does may leave the machine, whatever a layer does wrong. So
the demo makes a network namespace with only a loopback interface and puts on
it the addresses of a small made-up internet:

==================  ================  ==================================================
name                address           what
==================  ================  ==================================================
docs.example.com    93.184.216.34     the docs host the policy allows (HTTPS, needs the
                                      ``DOCS_TOKEN`` secret; ``/moved`` redirects to the
                                      metadata address)
paste.example.org   93.184.216.35     allowed for GET only; a canary for the secret
exfil.attacker.     93.184.216.36     the attacker's host: never allowed (canary)
example
wiki.example.com    10.0.0.5          allowed by name, but its address is private (canary)
(metadata)          169.254.169.254   the cloud metadata address (canary)
==================  ================  ==================================================

A DNS server (dnspython) answers for these names on ``127.0.0.1:53``, HTTPS
servers present certificates of a demo CA (the daemon is told to trust it with
``--upstream-ca``), and the model server (the scripted mock, or a relay to a
real OpenAI-compatible endpoint) listens on ``127.0.0.1:11434``, where the demo
policy's ``llm.base_url`` points. The demo's daemon runs inside the namespace
too, so its gateway can reach only these.

Every server counts what reaches it: a canary that counts anything got hit.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

from stockade._netns import inside_path
from stockade.errors import HostError

DOCS_HOST = "docs.example.com"
PASTE_HOST = "paste.example.org"
EVIL_HOST = "exfil.attacker.example"
WIKI_HOST = "wiki.example.com"
METADATA = "169.254.169.254"
DNS = {
    DOCS_HOST: "93.184.216.34",
    PASTE_HOST: "93.184.216.35",
    EVIL_HOST: "93.184.216.36",
    WIKI_HOST: "10.0.0.5",
}
DNS_PORT = 53
MODEL_PORT = 11434
"""Where the demo policy's ``llm.base_url`` points, inside the namespace."""
GUIDE = (
    "# Release checklist (docs.example.com)\n\n"
    "1. Run the tests.\n2. Update the changelog.\n3. Tag the release.\n"
)
"""What ``https://docs.example.com/guide.md`` serves to a request carrying the secret."""

_counter = itertools.count()


@dataclass
class Hits:
    """What reached one server: requests (method, path, headers) and bare connections."""

    name: str
    connections: int = 0
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)


class DemoWorld:
    """The namespace, its DNS, its servers and the model server; a context manager.

    ``run_inside(fn)`` calls ``fn`` with the calling thread inside the
    namespace (a thread it starts then is inside for its whole life).

    Raises (``start``):
        HostError: the namespace or a server could not be made (not root, no ``ip``).
    """

    def __init__(self, directory: str, *, docs_token: str) -> None:
        self.directory = directory
        self.docs_token = docs_token
        self.name = f"stockade-demo-{os.getpid()}-{next(_counter)}"
        self.path = f"/run/netns/{self.name}"
        self.ca_file = os.path.join(directory, "demo-ca.pem")
        self.hits: dict[str, Hits] = {
            name: Hits(name) for name in (DOCS_HOST, PASTE_HOST, EVIL_HOST, WIKI_HOST, METADATA)
        }
        self.dns_queries: list[str] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._made = False

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> DemoWorld:
        try:
            subprocess.run(["ip", "netns", "add", self.name], check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            raise HostError(
                f"the demo could not make its network namespace ({_why(exc)}); "
                "run it as root on a host with `ip`",
                feature="netns",
            ) from exc
        self._made = True
        try:
            self._ip("link", "set", "lo", "up")
            for address in [*DNS.values(), METADATA]:
                self._ip("addr", "add", address + "/32", "dev", "lo")
            self._contexts = _demo_pki(self.ca_file)
            self._thread = threading.Thread(target=self._main, name="stockade-demo-world", daemon=True)
            self._thread.start()
            if not self._ready.wait(30.0):
                raise HostError("the demo's servers did not start within 30 s", feature="netns")
            if self._error is not None:
                raise HostError(
                    f"the demo's servers could not start: {self._error}", feature="netns"
                ) from self._error
        except BaseException:
            self.close()
            raise
        return self

    def _ip(self, *args: str) -> None:
        try:
            subprocess.run(["ip", "-n", self.name, *args], check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            raise HostError(
                f"the demo could not set up its namespace: ip {' '.join(args)}: {_why(exc)}",
                feature="netns",
            ) from exc

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """The calling thread inside the namespace for the body."""
        with inside_path(self.path):
            yield

    def close(self) -> None:
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(30.0)
            self._thread = None
        if self._made:
            subprocess.run(["ip", "netns", "del", self.name], check=False, capture_output=True)
            self._made = False

    def __enter__(self) -> DemoWorld:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ what reached it

    def canaries(self) -> dict[str, int]:
        """Connections that reached each canary (every host but the docs host)."""
        return {name: hits.connections for name, hits in self.hits.items() if name != DOCS_HOST}

    def secret_seen(self) -> dict[str, int]:
        """Requests per host that carried the secret's real value."""
        return {
            name: sum(1 for _, _, headers in hits.requests if self.docs_token in " ".join(headers.values()))
            for name, hits in self.hits.items()
        }

    # ------------------------------------------------------------------ the servers

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            with self.entered():
                loop.run_until_complete(self._serve())
        except BaseException as exc:
            self._error = exc
            self._ready.set()
        finally:
            loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        try:
            loop = asyncio.get_running_loop()
            dns_transport, _ = await loop.create_datagram_endpoint(
                lambda: _Dns(self), local_addr=("127.0.0.1", DNS_PORT)
            )
            servers = [
                await self._http(DOCS_HOST, 443, tls=True, handler=self._docs),
                await self._http(PASTE_HOST, 443, tls=True),
                await self._http(EVIL_HOST, 443, tls=True),
                await self._http(EVIL_HOST, 80, tls=False),
                await self._http(WIKI_HOST, 443, tls=True),
                await self._http(METADATA, 80, tls=False, address=METADATA),
            ]
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            dns_transport.close()
            for server in servers:
                server.close()

    async def _http(
        self,
        name: str,
        port: int,
        *,
        tls: bool,
        handler: Callable[[str, str, dict[str, str]], tuple[int, dict[str, str], bytes]] | None = None,
        address: str | None = None,
    ) -> asyncio.Server:
        hits = self.hits[name]

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            hits.connections += 1
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10.0)
                method, path, headers = _parse_head(head)
                hits.requests.append((method, path, headers))
                length = int(headers.get("content-length", "0") or 0)
                if length:
                    await asyncio.wait_for(reader.readexactly(min(length, 1 << 20)), 10.0)
                status, extra, body = (
                    handler(method, path, headers) if handler else (404, {}, b"nothing here\n")
                )
                lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'OK')}"]
                lines += [f"{k}: {v}" for k, v in extra.items()]
                lines += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
                writer.write("\r\n".join(lines).encode() + body)
                await writer.drain()
            except (
                OSError,
                asyncio.IncompleteReadError,
                asyncio.LimitOverrunError,
                TimeoutError,
                ValueError,
            ):
                pass
            finally:
                writer.close()

        context = self._contexts[name] if tls else None
        return await asyncio.start_server(serve, address or DNS[name], port, ssl=context)

    def _docs(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        if path == "/moved":
            return 302, {"Location": f"http://{METADATA}/latest/meta-data/iam/security-credentials/"}, b""
        if path == "/guide.md":
            if headers.get("authorization") != f"Bearer {self.docs_token}":
                return 401, {}, b"the docs need the DOCS_TOKEN secret\n"
            return 200, {"Content-Type": "text/markdown"}, GUIDE.encode()
        return 404, {}, b"not found\n"


_REASONS = {200: "OK", 302: "Found", 401: "Unauthorized", 404: "Not Found"}


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            key, value = line.split(":", 1)
            headers[key.strip().lower()] = value.strip()
    return method, path, headers


class _Dns(asyncio.DatagramProtocol):
    """Answers A queries for the world's names; AAAA and unknown names get no address."""

    def __init__(self, world: DemoWorld) -> None:
        self.world = world
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        import dns.message
        import dns.rcode
        import dns.rdataclass
        import dns.rdatatype
        import dns.rrset

        try:
            query = dns.message.from_wire(data)
            question = query.question[0]
        except Exception:
            return
        name = question.name.to_text(omit_final_dot=True).lower()
        self.world.dns_queries.append(name)
        reply = dns.message.make_response(query)
        address = DNS.get(name)
        if address is None:
            reply.set_rcode(dns.rcode.NXDOMAIN)
        elif question.rdtype == dns.rdatatype.A:
            reply.answer.append(
                dns.rrset.from_text(question.name, 60, dns.rdataclass.IN, dns.rdatatype.A, address)
            )
        assert self.transport is not None
        self.transport.sendto(reply.to_wire(), addr)


# --------------------------------------------------------------------------- the demo CA


def _demo_pki(ca_file: str) -> dict[str, ssl.SSLContext]:
    """A throwaway CA (written to ``ca_file``, which the demo's daemon trusts for
    upstreams) and a server context per HTTPS host. The gateway's own per-run CA
    class serves: it makes exactly this (EC P-256, a leaf per host, keys in memory)."""
    from stockade.gateway._ca import RunCA

    ca = RunCA.create("demo-world")
    with open(ca_file, "wb") as f:
        f.write(ca.cert_pem)
    return {name: ca.server_context(name) for name in (DOCS_HOST, PASTE_HOST, EVIL_HOST, WIKI_HOST)}


# --------------------------------------------------------------------------- the model server


class ModelServer:
    """The model server on the namespace's ``127.0.0.1:11434``: an ASGI app (the
    mock, or a relay to a real endpoint) served by a loop in a thread of the
    host's namespace, on a socket made inside the demo's. So a relay's own
    connections go where the operator pointed it, and nothing else does."""

    def __init__(self, world: DemoWorld, app: Any) -> None:
        self.world = world
        self.app = app
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None

    def start(self) -> ModelServer:
        """Raises HostError when it cannot listen."""
        with self.world.entered():
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", MODEL_PORT))
        sock.listen(64)
        sock.setblocking(False)
        self._thread = threading.Thread(
            target=self._main, args=(sock,), name="stockade-demo-model", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(30.0) or self._error is not None:
            self.close()
            raise HostError(
                f"the demo's model server could not start: {self._error or 'timed out'}", feature="netns"
            )
        return self

    def _main(self, sock: socket.socket) -> None:
        from stockade.llm._serve import AppServer

        loop = asyncio.new_event_loop()
        self._loop = loop

        async def serve() -> None:
            self._stop = asyncio.Event()
            server = AppServer(self.app, sock)
            try:
                await server.start()
            except BaseException as exc:
                self._error = exc
                self._ready.set()
                return
            self._ready.set()
            try:
                await self._stop.wait()
            finally:
                await server.close()
                state = getattr(self.app, "state", None)
                aclose = getattr(state, "aclose", None)
                if aclose is not None:  # a relay's client: its connections end with it
                    await aclose()

        try:
            loop.run_until_complete(serve())
        finally:
            loop.close()

    def close(self) -> None:
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(30.0)
            self._thread = None


def _why(exc: BaseException) -> str:
    if isinstance(exc, subprocess.CalledProcessError):
        err = exc.stderr
        text = err.decode(errors="replace") if isinstance(err, bytes) else str(err or "")
        return text.strip() or f"exit code {exc.returncode}"
    return str(exc)


__all__ = [
    "DNS",
    "DOCS_HOST",
    "EVIL_HOST",
    "GUIDE",
    "METADATA",
    "MODEL_PORT",
    "PASTE_HOST",
    "WIKI_HOST",
    "DemoWorld",
    "ModelServer",
]
