"""Serve an ASGI app on a socket that is already listening, inside a running loop.

The daemon makes each cell's listening sockets inside the cell's network
namespace and serves them all on its own asyncio loop, many at once (one LLM
endpoint per cell). ``uvicorn.Server.serve`` almost does this, with three
habits that do not fit a daemon:

* it installs SIGINT/SIGTERM handlers (``capture_signals``) when run on the main
  thread, and re-raises the captured signal when it stops: the daemon owns its
  signals, so ``capture_signals`` is neutralised here;
* its main loop wakes every 0.1 s to decide whether to stop; one such timer per
  cell adds up, so ``main_loop`` waits on an event instead (the loop's other
  duty, refreshing the ``Date`` header once a second, is switched off: the
  ``date`` and ``server`` headers are not sent);
* it configures logging (``log_config``) and exits the process when the ASGI
  lifespan fails: logging is left to the daemon and the lifespan is off (the
  apps served here have no startup work).

It also bounds what one cell can hold of the daemon here (uvicorn bounds
neither: ``limit_concurrency`` answers 503 but keeps the connection, and a
connection that never sends a request is kept forever; ~26,000 of them took the
daemon to its descriptor limit): at most ``max_connections`` connections at
once, a connection with no request in progress for ``idle_timeout`` seconds is
closed, and none is taken while the daemon's spare descriptors are low
(``stockade._fds``). A refused connection is closed at once; the first refusal
is recorded (``connection.refused``), later ones counted and recorded as one
event when the server closes, so a flood does not flood the record.

Checked against uvicorn 0.54 (``uvicorn/server.py``, ``protocols/http/h11_impl.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import Any

import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.h11_impl import H11Protocol

from stockade import _fds
from stockade.errors import StoreError
from stockade.record import Event

MAX_CONNECTIONS = 64
"""Connections one cell's endpoint holds at once (an agent and its threads
need a few; the SDK keeps one)."""
IDLE_TIMEOUT = 60.0
"""Seconds a connection may sit with no request in progress before it is
closed (a model call in progress is never cut: it has a request)."""

Record = Callable[[Sequence[Event]], Awaitable[None]]


class _Guard:
    """One server's limits and its refusals (see the module docstring)."""

    def __init__(self, limit: int, idle: float, refused: Callable[[str], None]) -> None:
        self.limit, self.idle, self.refused = limit, idle, refused


def _guarded_protocol(guard: _Guard) -> type[asyncio.Protocol]:
    class Guarded(H11Protocol):
        """uvicorn's h11 protocol, refusing past the limits and closing idle connections."""

        _timer: asyncio.TimerHandle | None = None
        _seen: Any = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            sock = transport.get_extra_info("socket")
            why = None
            if len(self.connections) >= guard.limit:
                why = f"{guard.limit} connections are open to this cell's endpoint; close one"
            elif sock is not None and _fds.low(sock.fileno()):
                why = _fds.LOW_MESSAGE
            if why is not None:
                self.transport = transport
                transport.close()
                guard.refused(why)
                return
            super().connection_made(transport)
            self._arm()

        def _arm(self) -> None:
            self._seen = self.cycle
            self._timer = self.loop.call_later(guard.idle, self._idle_check)

        def _idle_check(self) -> None:
            self._timer = None
            if self.transport.is_closing():
                return
            busy = self.cycle is not None and not self.cycle.response_complete
            if not busy and self.cycle is self._seen:  # no request began in a whole period
                self.transport.close()
                return
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self not in self.connections:  # refused: uvicorn never saw it
                return
            super().connection_lost(exc)

    return Guarded


class _DaemonServer(uvicorn.Server):
    """A uvicorn server that leaves signals to its host and does not poll."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = asyncio.Event()
        self.stop = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # The daemon owns SIGINT/SIGTERM; uvicorn's version would replace its
        # handlers and re-raise the signal after shutting down.
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        self.ready.set()

    async def main_loop(self) -> None:
        # One tick fills the default headers (none, with date and server
        # headers off); then wait for close() instead of waking every 0.1 s.
        await self.on_tick(0)
        await self.stop.wait()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn (0.3x) sleeps 0.1 s after asking the open connections to
        # shut down, whether or not any is open: every gateway's close, so
        # every run's and daemon session's end, waited for it. With nothing
        # open there is nothing to wait for; the rest of its shutdown is this.
        if self.server_state.connections or self.server_state.tasks:
            await super().shutdown(sockets=sockets)
            return
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for server in self.servers:
            await server.wait_closed()
        if not self.force_exit:
            await self.lifespan.shutdown()


class AppServer:
    """One ASGI app served on one pre-bound listening socket.

    ``await start()`` returns once the socket accepts connections; ``await
    close()`` stops accepting, lets requests in flight finish for up to
    ``grace`` seconds, then cancels what is left and closes the socket.
    """

    def __init__(
        self,
        app: ASGIApp,
        sock: socket.socket,
        *,
        grace: int = 5,
        max_connections: int = MAX_CONNECTIONS,
        idle_timeout: float = IDLE_TIMEOUT,
        record: Record | None = None,
        run_id: str = "",
        cell: str = "",
    ) -> None:
        """
        Args:
            max_connections, idle_timeout: the limits (see the module docstring).
            record: where the ``connection.refused`` events go (of ``run_id``
                and ``cell``); none: refusals are only counted (``refused``).
        """
        self._record = record
        self._run_id, self._cell = run_id, cell
        self.refused = 0
        """Connections refused so far."""
        self._refusal_tasks: set[asyncio.Task[None]] = set()
        self._limits = (max_connections, idle_timeout)
        guard = _Guard(max_connections, idle_timeout, self._refused)
        config = uvicorn.Config(
            app,
            lifespan="off",
            log_config=None,
            access_log=False,
            server_header=False,
            date_header=False,
            http=_guarded_protocol(guard),
            timeout_graceful_shutdown=grace,
        )
        self._server = _DaemonServer(config)
        self._sock = sock
        self._task: asyncio.Task[None] | None = None

    @property
    def address(self) -> tuple[str, int]:
        """The (host, port) the socket listens on."""
        host, port = self._sock.getsockname()[:2]
        return str(host), int(port)

    async def start(self) -> None:
        """Serve in a task of the running loop; return once listening.

        Raises whatever uvicorn raised when it could not start (the socket is
        then closed).
        """
        if self._task is not None:
            raise RuntimeError("this AppServer was started already; make a new one per socket")
        self._task = asyncio.create_task(self._server.serve(sockets=[self._sock]), name="stockade-asgi")
        ready = asyncio.create_task(self._server.ready.wait())
        await asyncio.wait({self._task, ready}, return_when=asyncio.FIRST_COMPLETED)
        if not ready.done():
            ready.cancel()
            self._sock.close()
            await self._task  # re-raises why it stopped before it was ready
            raise RuntimeError("the ASGI server stopped before it was listening")

    def _refused(self, why: str) -> None:
        self.refused += 1
        if self.refused == 1:
            self._note(why, 1)

    def _note(self, why: str, count: int) -> None:
        if self._record is None:
            return
        word = "a connection" if count == 1 else f"{count} connections"
        event = Event(
            kind="connection.refused",
            cell=self._cell,
            layer="llm",
            outcome="denied",
            run=self._run_id,
            summary=f"the LLM endpoint refused {word}: {why}",
            detail={
                "listener": "llm",
                "reason": why,
                "count": count,
                "max_connections": self._limits[0],
                "idle_timeout": self._limits[1],
            },
        )
        task = asyncio.get_running_loop().create_task(self._store(event))
        self._refusal_tasks.add(task)
        task.add_done_callback(self._refusal_tasks.discard)

    async def _store(self, event: Event) -> None:
        assert self._record is not None
        with contextlib.suppress(StoreError):  # the refusal stands whether or not it is stored
            await self._record([event])

    async def close(self) -> None:
        """Stop accepting, finish or cancel the requests in flight, close the socket;
        record how many connections were refused after the first."""
        try:
            await self._close()
        finally:
            if self.refused > 1:
                self._note("the later refusals of this endpoint, counted", self.refused - 1)
            if self._refusal_tasks:
                await asyncio.gather(*self._refusal_tasks, return_exceptions=True)

    async def _close(self) -> None:
        if self._task is None:
            self._sock.close()
            return
        self._server.stop.set()
        self._server.should_exit = True
        try:
            await self._task
        finally:
            # Past the grace period uvicorn cancels the requests' tasks but may
            # leave their connections open; end them so no client hangs.
            for connection in list(self._server.server_state.connections):
                transport = getattr(connection, "transport", None)
                if transport is not None:
                    transport.close()
            self._sock.close()
