"""Serving the dashboard: in the daemon, or alone for a replay.

**In the daemon.** ``attach(daemon)`` gives the daemon's control socket one
more request, ``dashboard.open`` (what ``stockade dashboard`` sends). The
first one starts the web server on the daemon's own loop (uvicorn, on a
loopback port: 0 picks a free one), and every one mints a token for the
operator who asked (the control socket's peer, by its uid) and answers the
URL that carries it. The daemon does not import this package (the
dashboard depends on the daemon, not the reverse): whoever starts the
daemon attaches it (``stockade daemon`` does).

Serving on the daemon's loop, not a thread of its own: the live stream
reads the bus where the bus publishes, without a hop between threads, and
every store read goes to a worker thread, so a page's request never holds
the loop for longer than answering it takes.

**A replay.** ``serve_replay`` runs the same app over a ``ReplaySource`` in
the foreground, with no daemon and no kernel feature: it runs on any OS
Python and Starlette run on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Callable, Generator, Mapping
from typing import TYPE_CHECKING, Any

import uvicorn

from stockade.dashboard._app import Listening, Operators, build_app
from stockade.dashboard._bench import Campaigns
from stockade.dashboard._source import LiveSource, Source
from stockade.errors import DaemonError, RequestError

if TYPE_CHECKING:
    from stockade.daemon._peer import Peer
    from stockade.daemon._server import Daemon

METHOD = "dashboard.open"


class _QuietServer(uvicorn.Server):
    """uvicorn's server without its signal handlers: the daemon owns SIGTERM
    and SIGINT (``Server.capture_signals`` would take them over while it serves)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class DashboardServer:
    """One dashboard's web server on the running loop (``start``, ``close``)."""

    def __init__(
        self, source: Source, *, host: str = "127.0.0.1", port: int = 0, sock: socket.socket | None = None
    ) -> None:
        """
        Args:
            sock: a listening loopback socket to serve on instead of binding
                ``host``:``port``: one made in the host's network namespace for
                a daemon whose threads live in another (``stockade demo``'s).
        """
        if sock is not None:
            host, port = sock.getsockname()[:2]
        if host not in ("127.0.0.1", "::1", "localhost"):
            raise DaemonError(
                f"the dashboard listens on loopback only, not {host!r}; "
                "reach it from elsewhere through an SSH tunnel (ssh -L)"
            )
        self.source = source
        self.host = "127.0.0.1" if host == "localhost" else host
        self.port = port
        self.operators = Operators()
        self.campaigns = Campaigns()
        """The bench campaigns the bench pages show (``--bench DIR``)."""
        self.listening = Listening()
        self._sock = sock
        self._server: _QuietServer | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        """Listen and serve in a task of the running loop.

        Raises:
            DaemonError: the port cannot be bound.
        """
        sock = self._sock if self._sock is not None else self._listen()
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        self.listening.set_port(self.port)
        config = uvicorn.Config(
            build_app(self.source, self.operators, self.listening, self.campaigns),
            lifespan="off",
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=1,
            ws="none",
        )
        server = _QuietServer(config)
        self._server = server
        self._task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
        # Until it serves, or failed to.
        while not server.started and not self._task.done():
            await asyncio.sleep(0.01)
        if self._task.done():
            self._server = None
            sock.close()
            raise DaemonError(f"the dashboard's server did not start: {self._task.exception()!r}")

    def _listen(self) -> socket.socket:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
            sock.listen(128)
        except OSError as exc:
            sock.close()
            raise DaemonError(
                f"the dashboard cannot listen on {self.host}:{self.port}: {exc.strerror}; "
                "give another --port (0 picks a free one)"
            ) from exc
        return sock

    def url(self, operator: str) -> str:
        """A fresh token for ``operator``, in the URL that logs in with it."""
        token = self.operators.mint(operator)
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/login?token={token}"

    async def close(self) -> None:
        server, task = self._server, self._task
        self._server = self._task = None
        if server is None or task is None:
            return
        self.listening.close_streams()
        server.should_exit = True
        # Live streams never end by themselves: after the grace, uvicorn cancels them.
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(task, 5.0)


def attach(
    daemon: Daemon, *, port: int = 0, sock: socket.socket | None = None
) -> Callable[[], DashboardServer | None]:
    """Give ``daemon`` the ``dashboard.open`` request (module docstring), on its loop.

    ``sock``: serve on this listening socket (``DashboardServer``), not a port.
    Returns a function that says the server once it started (for tests)."""
    holder: dict[str, DashboardServer] = {}
    starting = asyncio.Lock()

    async def open_dashboard(peer: Peer, params: Mapping[str, Any]) -> dict[str, Any]:
        wanted = params.get("port", port)
        if isinstance(wanted, bool) or not isinstance(wanted, int) or not 0 <= wanted <= 65535:
            raise RequestError("bad_params", "'port' must be a TCP port, 0 to 65535 (0: a free one)")
        bench = params.get("bench", [])
        if not isinstance(bench, list) or not all(isinstance(d, str) and os.path.isabs(d) for d in bench):
            raise RequestError(
                "bad_params", "'bench' must be a list of absolute paths of campaign directories"
            )
        async with starting:
            server = holder.get("server")
            if server is None:
                server = DashboardServer(LiveSource(daemon), port=wanted, sock=sock)
                try:
                    await server.start()
                except DaemonError as exc:
                    raise RequestError("unavailable", str(exc)) from exc
                holder["server"] = server
        for directory in bench:
            server.campaigns.add(directory)
        return {"url": server.url(peer.who), "port": server.port, "operator": peer.who}

    async def close() -> None:
        server = holder.pop("server", None)
        if server is not None:
            await server.close()

    daemon.extensions[METHOD] = open_dashboard
    daemon.closers.append(close)
    return lambda: holder.get("server")


def serve_replay(
    source: Source,
    *,
    port: int = 0,
    operator: str = "operator",
    ready: Callable[[str], None] | None = None,
    bench: list[str] | None = None,
) -> int:
    """Serve ``source`` (a replay) in the foreground until Ctrl-C; the exit code.

    ``ready`` gets the URL (with its token) once the server listens.

    Raises:
        DaemonError: the port cannot be bound.
    """

    async def main() -> None:
        server = DashboardServer(source, port=port)
        for directory in bench or []:
            server.campaigns.add(directory)
        await server.start()
        if ready is not None:
            ready(server.url(operator))
        try:
            await asyncio.Event().wait()
        finally:
            await server.close()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
    return 0


__all__ = ["METHOD", "DashboardServer", "attach", "serve_replay"]
