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

Checked against uvicorn 0.54 (``uvicorn/server.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Generator

import uvicorn
from starlette.types import ASGIApp


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


class AppServer:
    """One ASGI app served on one pre-bound listening socket.

    ``await start()`` returns once the socket accepts connections; ``await
    close()`` stops accepting, lets requests in flight finish for up to
    ``grace`` seconds, then cancels what is left and closes the socket.
    """

    def __init__(self, app: ASGIApp, sock: socket.socket, *, grace: int = 5) -> None:
        config = uvicorn.Config(
            app,
            lifespan="off",
            log_config=None,
            access_log=False,
            server_header=False,
            date_header=False,
            http="h11",
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

    async def close(self) -> None:
        """Stop accepting, finish or cancel the requests in flight, close the socket."""
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
