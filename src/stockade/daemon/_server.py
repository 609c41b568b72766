"""The daemon's sockets: the control socket and each run's broker socket.

This is the only module of the daemon that touches sockets. It reads bytes,
feeds them to the sans-I/O ``Connection`` (``stockade.broker._protocol``),
hands each request to ``Runs`` or answers it here, and writes what comes back.
It runs on one asyncio loop; cells run in threads of their own (``_runs``),
and the store is written by the recorder (``_bus``). One connection is a
``_peer.Peer``.

What keeps one peer from hurting the others:

- a frame is at most ``max_frame`` bytes (1 MiB), so a connection buffers at
  most one frame; a frame that breaks the framing (too large) is answered and
  the connection closed; any other bad frame is answered and the connection
  goes on;
- a peer that does not read its answers is not read either (the transport's
  flow control pauses reading while its write buffer is above the high-water
  mark), and one connection has at most ``MAX_INFLIGHT`` requests being served;
- a subscriber whose unread pushes pass ``subscriber_buffer`` bytes is dropped
  with a last push saying so, and a ``subscriber.dropped`` event is recorded:
  the stream never waits for it;
- a run's broker socket takes at most ``MAX_BROKER_CONNECTIONS`` connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import resource
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import uvloop

from stockade import __version__
from stockade.broker._protocol import MAX_FRAME, Request
from stockade.daemon import _paths
from stockade.daemon._bus import (
    EventBus,
    Recorder,
    daemon_event,
    dropped_event,
    export_page,
    noted_store_error,
)
from stockade.daemon._peer import MAX_BROKER_CONNECTIONS, MAX_INFLIGHT, Peer
from stockade.daemon._runs import LOG_MAX, RequestError, Run, Runs
from stockade.daemon._sessions import Sessions
from stockade.daemon._tools import RecordBudgets, record_tool_call
from stockade.errors import DaemonError, StockadeError, StoreError
from stockade.gateway._options import GatewayOptions
from stockade.record import Event
from stockade.record._chain import StoredEvent
from stockade.record._journaled import STORE_RESERVE

SUBSCRIBER_BUFFER = 4 * 1024 * 1024
"""Bytes of pushes a subscriber may leave unread before it is dropped."""
STOP_GRACE = 10.0
"""Seconds runs get to end when the daemon stops (SIGTERM), before they are killed."""


class Daemon:
    """One daemon: its sockets, its runs, its recorder. Lives on one asyncio loop."""

    def __init__(
        self,
        *,
        state: str,
        socket_path: str | None = None,
        approval_timeout: float = 300.0,
        stop_grace: float = STOP_GRACE,
        max_frame: int = MAX_FRAME,
        subscriber_buffer: int = SUBSCRIBER_BUFFER,
        gateway: GatewayOptions | None = None,
        store_quota: int | None = None,
        store_reserve: int = STORE_RESERVE,
        record_budgets: RecordBudgets | None = None,
        intent_budgets: RecordBudgets | None = None,
    ) -> None:
        """
        Args:
            store_quota: bytes the event store may grow to before what agents
                supply is refused (``JournaledStore.room_for_agents``); None:
                only the disk's free space counts.
            store_reserve: bytes below the quota (and of free disk) kept for
                the daemon's own events.
            record_budgets: the ``tool.record`` budgets (``_tools``).
            intent_budgets: the intents' budgets (``RecordBudgets.intents()``).
        """
        self.state = os.path.abspath(state)
        self.store_quota = store_quota
        self.store_reserve = store_reserve
        self.record_budgets = record_budgets or RecordBudgets()
        self.intent_budgets = intent_budgets or RecordBudgets.intents()
        self.connections_refused: dict[str, int] = {}
        """Refused broker connections by run (``refused``)."""
        self.gateway = gateway
        self.socket_path = socket_path or _paths.socket_path(None, state=self.state)
        self.approval_timeout = approval_timeout
        self.stop_grace = stop_grace
        self.max_frame = max_frame
        self.subscriber_buffer = subscriber_buffer
        self.started = time.time()
        self.bus = EventBus()
        self._peers: set[Peer] = set()
        self._server: asyncio.AbstractServer | None = None
        self._stopped: asyncio.Event | None = None
        self._stopping = False
        self._serving = False
        self.released = False
        """True once the daemon let go of its sockets: a connection accepted just
        before that (its protocol not yet made) closes itself at once."""
        self._lock_fd = -1
        self._loop: asyncio.AbstractEventLoop | None = None
        self.recorder: Recorder | None = None
        self.runs: Runs | None = None
        self.sessions: Sessions | None = None
        """The sessions it hosts (``session.*`` requests, ``_sessions``)."""
        self.extensions: dict[str, Callable[[Peer, Mapping[str, Any]], Awaitable[dict[str, Any]]]] = {}
        """More requests of the control socket, by method, served on the loop
        (``stockade.dashboard.attach`` adds ``dashboard.open``): what depends on
        the daemon plugs in here, so the daemon imports none of it."""
        self.closers: list[Callable[[], Awaitable[None]]] = []
        """Awaited when the daemon lets go of its sockets (an extension's server)."""

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Take the state directory, open the store, record ``daemon.start``, listen.

        Raises:
            DaemonError: another daemon holds the state directory or the socket,
                or the socket cannot be made.
            StoreError: the store cannot be opened or written.
        """
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._stopped = asyncio.Event()
        _raise_fd_limit()
        self._take_state_dir()
        try:
            _check_stale_socket(self.socket_path)
            recorder = Recorder(
                _paths.store_path(self.state), loop, on_stored=self._stored, on_failure=self._store_failed
            )
            await asyncio.to_thread(recorder.start)
            recorder.store.quota, recorder.store.reserve = self.store_quota, self.store_reserve
            self.recorder = recorder
            self.runs = Runs(
                state=self.state,
                loop=loop,
                recorder=recorder,
                bus=self.bus,
                host=self,
                approval_timeout=self.approval_timeout,
                gateway=self.gateway,
                intent_budgets=self.intent_budgets,
            )
            self.runs.on_output_dropped = lambda run_id: self._record_drop("output", run_id)
            self.sessions = Sessions(self.runs)
            self.extensions.update(self.sessions.methods())
            self.runs.session_exec = self.sessions.exec_for_run
            self.runs.session_for = self.sessions.session_for_run
            events = [self._daemon_event("daemon.start", f"daemon started (pid {os.getpid()})")]
            events.extend(self._previous_store_error())
            events.extend(await asyncio.to_thread(self.runs.recover))
            await asyncio.to_thread(_sweep_stale_cells)
            await recorder.record_soon(events)
            self._server = await loop.create_unix_server(
                lambda: Peer(self, None), sock=_listen(self.socket_path, os.getuid(), os.getgid())
            )
        except BaseException:
            await self._release()
            raise
        self._serving = True

    async def wait_stopped(self) -> None:
        assert self._stopped is not None
        await self._stopped.wait()

    def request_stop(self) -> None:
        """Stop (from the loop: a signal handler or a request). Idempotent."""
        if self._stopping or not self._serving or self._loop is None:
            return
        self._stopping = True
        self._loop.create_task(self._shutdown())

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        if self.sessions is not None:
            await self.sessions.close_all()  # recorded before daemon.stop
        if self.runs is not None:
            await self.runs.stop_all(self.stop_grace)
            if self.runs.relay is not None:  # every run ended and is recorded: nothing to relay
                await asyncio.to_thread(self.runs.relay.stop)
        if self.recorder is not None and self.recorder.failure is None:
            with contextlib.suppress(StoreError):
                await self.recorder.record_soon([self._daemon_event("daemon.stop", "daemon stopped")])
        await self._release()
        assert self._stopped is not None
        self._stopped.set()

    async def _release(self) -> None:
        self.released = True
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        # One pass of the loop: a connection accepted before the server closed
        # gets its connection_made, and closes (``released``); then the rest.
        await asyncio.sleep(0)
        for close in self.closers:
            with contextlib.suppress(Exception):
                await close()
        for peer in list(self._peers):
            peer.close()
        if self.recorder is not None:
            await asyncio.to_thread(self.recorder.close)
        with contextlib.suppress(FileNotFoundError):
            if self._server is not None:
                os.unlink(self.socket_path)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _take_state_dir(self) -> None:
        try:
            os.makedirs(self.state, mode=0o700, exist_ok=True)
            _owner_only(self.state)
            os.makedirs(_paths.runs_dir(self.state), mode=0o700, exist_ok=True)
            fd = os.open(
                os.path.join(self.state, "daemon.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
            )
        except OSError as exc:
            raise DaemonError(
                f"cannot use the state directory {self.state}: {exc.strerror}; "
                "give a writable one with --state or $STOCKADE_STATE"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DaemonError(
                f"another daemon is using the state directory {self.state}; "
                "stop it, or give this one another --state"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def _daemon_event(self, kind: str, summary: str) -> Event:
        return daemon_event(kind, summary, socket=self.socket_path, state=self.state)

    def _previous_store_error(self) -> list[Event]:
        event = noted_store_error(self.state)
        if event is None:
            return []
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_paths.store_error_path(self.state))
        return [event]

    # ------------------------------------------------------------------ the record

    def _stored(self, stored: list[StoredEvent]) -> None:
        for sub in self.bus.publish(stored):
            self._record_drop("events", sub.run)

    def _record_drop(self, what: str, run: str | None) -> None:
        if self.recorder is None or self.recorder.failure is not None:
            return
        event = dropped_event(what, run, self.subscriber_buffer)
        waiter = self.recorder.record_soon([event])
        waiter.add_done_callback(lambda f: f.cancelled() or f.exception())

    def _store_failed(self, exc: StoreError) -> None:
        print(
            f"stockade: the event store failed, so no run starts and every run halts: {exc}", file=sys.stderr
        )
        if self.runs is not None:
            self.runs.store_failed(exc)

    # ------------------------------------------------------------------ broker sockets

    async def open_broker(self, run: Run, path: str, uid: int, gid: int) -> Callable[[], None]:
        """Listen on ``path`` for ``run``'s cell: 0600, owned by the cell's host uid."""
        assert self._loop is not None
        sock = _listen(path, uid, gid)
        server = await self._loop.create_unix_server(lambda: Peer(self, run), sock=sock)

        def close() -> None:
            server.close()
            for peer in [p for p in self._peers if p.run is run]:
                peer.close()

        return close

    # ------------------------------------------------------------------ requests

    async def control(self, peer: Peer, req: Request) -> dict[str, Any]:
        """Serve one request of the control socket; its result.

        Raises:
            RequestError: what the client is told instead.
        """
        runs, recorder = self.runs, self.recorder
        assert runs is not None and recorder is not None
        p = req.params
        method = req.method
        if method == "status":
            return await self._status()
        if method == "run.start":
            if self._stopping:
                raise RequestError("unavailable", "the daemon is stopping; start the run when it is back")
            run = await runs.start(p)
            if not run.detach:
                peer.owned.add(run.id)
            return run.info()
        if method == "run.list":
            return {"runs": runs.listing(include_past=bool(p.get("all", False)))}
        if method == "run.stop":
            found = runs.find(p.get("run"))
            grace = p.get("grace", 10.0)
            if isinstance(grace, bool) or not isinstance(grace, int | float) or not 0 <= grace <= 3600:
                raise RequestError("bad_params", "'grace' must be a number of seconds from 0 to 3600")
            if isinstance(found, Run):
                await runs.stop(found, grace=float(grace), by=peer.who)
                return found.info()
            return found
        if method == "run.logs":
            return await self._logs(peer, p)
        if method == "events.subscribe":
            run_filter = p.get("run")
            if run_filter is not None and not isinstance(run_filter, str):
                raise RequestError("bad_params", "'run' must be a run id")
            sub = self.bus.subscribe(peer.push_event, run=run_filter, owner=peer)
            peer.sub_ids.append(sub.id)
            return {"sub": sub.id, "last_seq": await asyncio.to_thread(recorder.store.last_seq)}
        if method == "events.unsubscribe":
            sub_id = p.get("sub")
            if sub_id not in peer.sub_ids:
                raise RequestError("not_found", f"no subscription {sub_id!r} on this connection")
            self.bus.unsubscribe(sub_id)
            return {"sub": sub_id}
        if method == "events.export":
            try:
                return await asyncio.to_thread(export_page, recorder.store, p)
            except ValueError as exc:
                raise RequestError("bad_params", str(exc)) from exc
        if method == "verify":
            result = await asyncio.to_thread(recorder.store.verify)
            return {
                "ok": result.ok,
                "checked": result.checked,
                "first_bad_seq": result.first_bad_seq,
                "reason": result.reason,
                "last_hash": result.last_hash,
            }
        if method == "approvals.list":
            run_filter = p.get("run")
            return {
                "approvals": [
                    a.to_dict()
                    for a in runs.approvals.pending(run_filter if isinstance(run_filter, str) else None)
                ]
            }
        if method == "approvals.decide":
            reason = p.get("reason", "")
            by = p.get("by") or peer.who
            if not isinstance(reason, str) or not isinstance(by, str) or len(by) > 64 or len(reason) > 4096:
                raise RequestError("bad_params", "'reason' and 'by' must be short strings")
            return runs.intents.decide(p.get("id"), p.get("decision"), by=by, reason=reason).to_dict()
        extension = self.extensions.get(method)
        if extension is not None:
            return await extension(peer, p)
        raise RequestError(
            "unknown_method",
            f"no method {method!r} on the control socket; the methods are status, run.start, run.list, "
            "run.stop, run.logs, events.subscribe, events.unsubscribe, events.export, verify, "
            "approvals.list, approvals.decide"
            + "".join(f", {m}" for m in sorted(self.extensions))
            + " (docs/PROTOCOL.md)",
        )

    async def broker(self, peer: Peer, req: Request) -> dict[str, Any]:
        """Serve one request of a broker socket that is not an intent: intents
        have one door, ``IntentPath.serve_intent``, which the peer calls itself.

        Raises:
            RequestError: what the agent is told instead.
        """
        assert self.runs is not None and peer.run is not None
        if req.method == "tool.record":
            return await record_tool_call(
                self.runs.intents, peer.run, req.params, cell=peer.cell, budgets=self.record_budgets
            )
        raise RequestError(
            "unknown_method",
            f"no method {req.method!r} on the broker socket; "
            "send 'intent' or 'tool.record' (docs/PROTOCOL.md)",
        )

    async def _status(self) -> dict[str, Any]:
        runs, recorder = self.runs, self.recorder
        assert runs is not None and recorder is not None
        store: dict[str, Any] = {"path": recorder.path, "error": str(recorder.failure or "")}
        if recorder.failure is None:
            try:
                store["last_seq"] = await asyncio.to_thread(recorder.store.last_seq)
            except StoreError as exc:
                store["error"] = str(exc)
        store["appended"] = recorder.appended
        store["commits"] = recorder.commits
        with contextlib.suppress(StoreError):  # closed: nothing more to say
            journaled = recorder.store
            store["journal"] = {
                "path": journaled.journal.path,
                "bytes": journaled.journal.size,
                "unindexed": journaled.unindexed,
            }
            store["quota"] = journaled.quota
            store["reserve"] = journaled.reserve
            store["room_for_agents"] = journaled.room_for_agents() or "yes"
        store["tool_records_refused"] = self.record_budgets.refused()
        store["intents_refused"] = self.intent_budgets.refused()
        live = [r for r in runs.runs.values() if not r.done.is_set()]
        return {
            "version": __version__,
            "pid": os.getpid(),
            "socket": self.socket_path,
            "state": self.state,
            "started": self.started,
            "uptime": round(time.time() - self.started, 3),
            "accepting_runs": not (runs.refusing or recorder.failure),
            "runs": {"running": len(live), "total": len(runs.runs)},
            "approvals_pending": len(runs.approvals.pending()),
            "connections": len(self._peers),
            "connections_refused": dict(self.connections_refused),
            "subscribers": self.bus.subscribers,
            "subscribers_dropped": self.bus.dropped,
            "store": store,
            # The process that keeps the kernel's refusals across a SIGKILL (_relay).
            "audit_relay": {"pid": runs.relay.pid, "error": runs.relay.error, "restarts": runs.relay.restarts}
            if runs.relay is not None
            else None,
        }

    async def _logs(self, peer: Peer, p: Mapping[str, Any]) -> dict[str, Any]:
        assert self.runs is not None
        found = self.runs.find(p.get("run"))
        run_id = found.id if isinstance(found, Run) else str(found["id"])
        tail, follow = p.get("tail"), p.get("follow", False)
        if tail is not None and (isinstance(tail, bool) or not isinstance(tail, int) or tail < 0):
            raise RequestError("bad_params", "'tail' must be a number of lines, 0 or more")
        if not isinstance(follow, bool):
            raise RequestError("bad_params", "'follow' must be true or false")
        path = _paths.transcript_path(self.state, run_id)
        # Read, then (in the same turn of the loop) start following from where
        # the reading stopped: no byte is sent twice or missed.
        data, size, cut = _tail(path, tail)
        live = isinstance(found, Run) and not found.done.is_set()
        result: dict[str, Any] = {
            "run": run_id,
            "data": data.decode("utf-8", "replace"),
            "offset": size,
            "truncated": cut,
            "ended": not live,
        }
        if follow and live:
            tap = self.bus.tap(run_id, size, peer.push_output, peer.push_end, owner=peer)
            peer.sub_ids.append(tap.id)
            result["sub"] = tap.id
        return result

    def buffered(self, run: Run) -> int:
        """Bytes of unfinished frames held for ``run``'s broker connections."""
        return sum(p.conn.buffered for p in self._peers if p.run is run)

    def register(self, peer: Peer) -> bool:
        if (
            peer.run is not None
            and sum(1 for p in self._peers if p.run is peer.run) >= MAX_BROKER_CONNECTIONS
        ):
            return False
        self._peers.add(peer)
        return True

    def refused(self, run: Run, reason: str) -> None:
        """A refused broker connection of ``run``: the first is a
        ``connection.refused`` event (layer ``broker``), the later ones are
        counted (``status``: ``connections_refused``), so that a flood of
        connections does not become a flood of events."""
        count = self.connections_refused.get(run.id, 0) + 1
        self.connections_refused[run.id] = count
        if count > 1 or self.recorder is None or self.recorder.failure is not None:
            return
        event = Event(
            kind="connection.refused",
            cell="",
            layer="broker",
            outcome="denied",
            run=run.id,
            summary=f"the broker socket of run {run.id} refused a connection: {reason}",
            detail={"listener": "broker", "reason": reason, "count": 1},
        )
        self.recorder.record_then([event], lambda _stored: None)

    def forget(self, peer: Peer) -> None:
        self._peers.discard(peer)
        self.bus.drop_owner(peer)
        if self.runs is None or self._stopping:
            return
        for run_id in peer.owned:
            run = self.runs.runs.get(run_id)
            if run is not None and not run.done.is_set():
                # A foreground run ends with the terminal that started it.
                asyncio.get_running_loop().create_task(self.runs.stop(run, grace=0.0, by="its client left"))


# --------------------------------------------------------------------------- helpers


def _listen(path: str, uid: int, gid: int) -> socket.socket:
    """A listening unix socket at ``path``, 0600, owned by ``uid``:``gid``.

    A path longer than ``sun_path`` holds is bound through its directory's
    descriptor (``/proc/self/fd/N/name``), which the kernel resolves like any path.

    Raises:
        DaemonError: the socket cannot be made there.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
    dir_fd = -1
    try:
        target = path
        if len(os.fsencode(path)) > _paths.MAX_SUN_PATH:
            dir_fd = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            target = f"/proc/self/fd/{dir_fd}/{os.path.basename(path)}"
        # Not the umask: it is the whole process's, and a cell launched by
        # another thread meanwhile would build its view with it. A socket
        # bound but not yet listening refuses every connection, so it is made
        # 0600 (and given to its owner) before anyone can use it.
        sock.bind(target)
        os.chmod(path, 0o600)
        if (uid, gid) != (os.getuid(), os.getgid()):
            os.chown(path, uid, gid)
        sock.listen(512)
    except OSError as exc:
        sock.close()
        raise DaemonError(
            f"cannot listen on {path}: {exc.strerror}; check the directory and its permissions"
        ) from exc
    finally:
        if dir_fd >= 0:
            os.close(dir_fd)
    return sock


def _check_stale_socket(path: str) -> None:
    """Remove a socket left by a daemon that died; refuse if one still answers there."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise DaemonError(f"{path} exists and is not a socket; remove it or give another --socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        probe.settimeout(1.0)
        target = path
        if len(os.fsencode(path)) > _paths.MAX_SUN_PATH:
            return  # cannot probe it simply; the state lock already says no daemon owns it
        probe.connect(target)
    except (ConnectionRefusedError, FileNotFoundError):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    except OSError:
        return
    finally:
        probe.close()
    raise DaemonError(f"a daemon is already listening on {path}; stop it, or give this one another --socket")


def _tail(path: str, lines: int | None) -> tuple[bytes, int, bool]:
    """The last ``lines`` lines (all when None) of the transcript, at most
    ``LOG_MAX`` bytes; its size when read; whether older bytes were left out."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return b"", 0, False
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - LOG_MAX)
        data = os.pread(fd, size - start, start)
    finally:
        os.close(fd)
    cut = start > 0
    if lines is not None:
        parts = data.split(b"\n")
        trailing = parts and parts[-1] == b""
        kept = parts[:-1] if trailing else parts
        if len(kept) > lines:
            cut = True
            kept = kept[len(kept) - lines :] if lines else []
        data = b"\n".join(kept) + (b"\n" if trailing and kept else b"")
    return data, size, cut


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _sweep_stale_cells() -> None:
    """Kill and remove the cgroups of cells whose daemon died (their processes
    died with it, by their death signals; this is the second line)."""
    try:
        from stockade.cell._cgroup import sweep_stale

        sweep_stale(kill=True)
    except (StockadeError, OSError):
        pass


# --------------------------------------------------------------------------- running one


def serve(
    *,
    state: str,
    socket_path: str,
    approval_timeout: float = 300.0,
    ready: Callable[[Daemon], None] | None = None,
    gateway: GatewayOptions | None = None,
) -> int:
    """``stockade daemon``: serve in the foreground until SIGTERM or SIGINT; the exit code.

    Raises:
        DaemonError: the state directory or socket is taken or unusable.
        StoreError: the store cannot be opened or written.
    """

    # The cells' views (the directories above a workspace, /tmp…) are made
    # with this process's umask: an operator's 077 would make them untraversable
    # for the agent. The daemon's own files get their modes explicitly.
    os.umask(0o022)

    async def main() -> None:
        daemon = Daemon(
            state=state, socket_path=socket_path, approval_timeout=approval_timeout, gateway=gateway
        )
        await daemon.start()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, daemon.request_stop)
        if ready is not None:
            ready(daemon)
        await daemon.wait_stopped()

    with asyncio.Runner(loop_factory=new_loop) as runner:
        runner.run(main())
    return 0


def new_loop() -> asyncio.AbstractEventLoop:
    """The daemon's event loop: uvloop's (libuv). Its sockets, callbacks and
    reads are C where asyncio's selector loop runs Python for each, about a
    tenth of an intent's cost in the daemon (docs/PERFORMANCE.md). Both the
    foreground daemon and the in-process one (``DaemonThread``) use it, so the
    tests run on the loop that serves."""
    return uvloop.new_event_loop()


class DaemonThread:
    """A daemon on a loop in a thread of this process: for ``stockade run`` on a
    machine with no daemon running, and for tests.

    The cells it starts die with this process (their death signals follow the
    threads that started them, which live in it).
    """

    def __init__(self, *, state: str, socket_path: str | None = None, **options: Any) -> None:
        self.daemon = Daemon(state=state, socket_path=socket_path, **options)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def socket_path(self) -> str:
        return self.daemon.socket_path

    def start(self, timeout: float = 60.0) -> DaemonThread:
        """Start serving; return once the socket listens.

        Raises:
            DaemonError, StoreError: as ``Daemon.start``.
        """
        self._thread = threading.Thread(target=self._main, name="stockade-daemon", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise DaemonError(f"the in-process daemon did not start within {timeout:g} s")
        if self._error is not None:
            raise self._error
        return self

    def _main(self) -> None:
        loop = new_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._run())
        finally:
            loop.close()

    async def _run(self) -> None:
        try:
            await self.daemon.start()
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        await self.daemon.wait_stopped()

    def call(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` on the daemon's loop."""
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(fn)

    def stop(self, timeout: float = 60.0) -> None:
        """Stop (runs are stopped first) and wait for the thread. Idempotent."""
        if self._error is None:
            self.call(self.daemon.request_stop)
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> DaemonThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _owner_only(path: str) -> None:
    """Make a state directory made beforehand (``mkdir /var/lib/stockade``, mode
    0755) 0700, as docs/DAEMON.md says it is: the record names the operator's
    files. Only one of ours, and never a shared one (sticky, as /tmp) or /."""
    info = os.stat(path)
    if (
        info.st_mode & 0o077
        and info.st_uid == os.geteuid()
        and not info.st_mode & stat.S_ISVTX
        and os.path.realpath(path) not in ("/", os.path.realpath(os.path.expanduser("~")))
    ):
        os.chmod(path, 0o700)


__all__ = [
    "MAX_BROKER_CONNECTIONS",
    "MAX_INFLIGHT",
    "SUBSCRIBER_BUFFER",
    "Daemon",
    "DaemonThread",
    "new_loop",
    "serve",
]
