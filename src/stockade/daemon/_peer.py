"""One connection to the daemon: the control socket's or a run's broker socket.

``Peer`` is the asyncio protocol of every connection the daemon accepts: it
feeds the bytes to the sans-I/O ``Connection`` (``stockade.broker._protocol``),
hands each request to its host (``PeerHost``: the ``Daemon`` of ``_server``),
writes what comes back and the pushes of subscriptions, and applies the limits
that keep one peer from hurting the others (see ``_server``'s docstring). Kept
apart from ``_server`` (the daemon's lifecycle, its requests) so that each
stays readable; it knows the daemon only as the small protocol ``PeerHost``,
so ``_server`` imports this module and not the other way round.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import socket
import struct
import sys
import time
from collections import deque
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast

from stockade import _fds
from stockade.broker._protocol import Connection, ErrorCode, ProtocolViolation, Request
from stockade.daemon._intent_path import PreparedRead
from stockade.errors import ProtocolError, StockadeError, wire_error

if TYPE_CHECKING:
    from stockade.daemon._run import Run
    from stockade.daemon._runs import Runs
    from stockade.record._chain import StoredEvent

MAX_INFLIGHT = 64
"""Requests of one connection served at once; more wait, and reading pauses."""
MAX_BROKER_CONNECTIONS = 64
"""Connections one run's broker socket takes at once."""
BROKER_MAX_FRAME = 24 * 1024 * 1024
"""The frame limit of a broker socket: a 16 MiB read or write is a frame of
about 21.4 MiB (docs/BROKER.md), so the control socket's 1 MiB is too small."""
BROKER_BUFFER_BUDGET = 64 * 1024 * 1024
"""Bytes of unfinished frames all of one run's broker connections may hold at
once; past it the connection that asked for more is closed. A cell cannot make
the daemon hold more than this for it, whatever its memory limit."""
BROKER_IDLE = 300.0
"""Seconds a broker connection may sit with nothing asked and nothing
pending before the daemon closes it. Each holds a descriptor of the daemon;
64 a run (``MAX_BROKER_CONNECTIONS``) idle forever are 64 held for nothing.
The SDK reconnects and sends again when it finds one closed this way, which
the daemon announces with a last push (``CLOSING_PUSH``): nothing of that
connection was read or done after it, so sending again is safe."""
CLOSING_PUSH = b'{"v":1,"push":"closing","reason":"idle"}'
_UCRED = struct.Struct("3i")


class PeerHost(Protocol):
    """What a connection needs of the daemon that accepted it (``_server.Daemon``)."""

    @property
    def max_frame(self) -> int:
        """The control socket's frame limit, in bytes."""
        ...

    @property
    def subscriber_buffer(self) -> int:
        """Bytes of pushes a subscriber may leave unread before it is dropped."""
        ...

    @property
    def released(self) -> bool:
        """True once the daemon let go of its sockets."""
        ...

    @property
    def runs(self) -> Runs | None:
        """The runs, whose intent path serves a broker socket's intents."""
        ...

    def register(self, peer: Peer) -> bool:
        """Count a new connection in; False when its run has all it may have."""
        ...

    def refused(self, run: Run, reason: str) -> None:
        """A connection to ``run``'s broker socket was refused for ``reason``
        (recorded once per run, then counted)."""
        ...

    def forget(self, peer: Peer) -> None:
        """The connection is gone: drop its subscriptions and its runs."""
        ...

    def buffered(self, run: Run) -> int:
        """Bytes of unfinished frames held for ``run``'s broker connections."""
        ...

    async def control(self, peer: Peer, req: Request) -> dict[str, Any]:
        """Serve one request of the control socket; its result."""
        ...

    async def broker(self, peer: Peer, req: Request) -> dict[str, Any]:
        """Serve one request of a broker socket; its result."""
        ...


class Peer(asyncio.Protocol):
    """One connection, to the control socket (``run`` is None) or to a run's broker socket.

    Control requests are served concurrently (a ``run.stop`` that waits does
    not hold up an ``approvals.decide``); a broker connection's intents are
    served one after the other, in order, as an agent expects.
    """

    def __init__(self, daemon: PeerHost, run: Run | None) -> None:
        self.daemon = daemon
        self.run = run
        self.conn = Connection(max_frame=daemon.max_frame if run is None else BROKER_MAX_FRAME)
        self.transport: asyncio.Transport | None = None
        self.cell = ""
        self.who = "operator"
        self.owned: set[str] = set()
        self.sub_ids: list[int] = []
        self._backlog: deque[Request] = deque()
        self._inflight = 0
        self._paused_reading = False
        self._writing_paused = False
        self._closing = False
        self._decoders: dict[int, codecs.IncrementalDecoder] = {}
        self._pushes: list[bytes] = []
        """Event pushes not yet written (``push_event``); ``write`` sends them first."""
        self._pushes_size = 0
        self._active = time.monotonic()
        """When the peer last sent bytes or was answered (the idle timer's clock)."""
        self._idle_timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        # A stream transport; uvloop's (``_server.new_loop``) does not derive from asyncio's class.
        self.transport = transport = cast(asyncio.Transport, base)
        if self.daemon.released:  # accepted as the daemon let go: it would never be closed
            transport.close()
            self._closing = True
            return
        if self.run is not None and _fds.low(_fileno(transport)):
            # The last descriptors are the operator's and the daemon's: the
            # control socket (run is None) still takes connections.
            transport.write(self.conn.fail(0, "unavailable", _fds.LOW_MESSAGE))
            transport.close()
            self._closing = True
            self.daemon.refused(self.run, _fds.LOW_MESSAGE)
            return
        if not self.daemon.register(self):
            why = f"this run has {MAX_BROKER_CONNECTIONS} connections open; close one"
            transport.write(self.conn.fail(0, "unavailable", why))
            transport.close()
            self._closing = True
            if self.run is not None:
                self.daemon.refused(self.run, why)
            return
        sock = transport.get_extra_info("socket")
        pid, uid = _peer_cred(sock)
        if self.run is None:
            self.who = _user_name(uid)
        elif pid == os.getpid() and sock is not None:
            # Connected by the cell's connect supervisor (cell/_unotify), which
            # knows for which cell.
            from stockade.cell._unotify import cell_of_peer

            self.cell = cell_of_peer(sock)
        elif pid > 0:
            self.cell = _cell_of(pid)
        if self.run is not None:
            # One timer per connection, re-armed when it fires, not per request.
            self._idle_timer = asyncio.get_running_loop().call_later(BROKER_IDLE, self._idle_check)

    def _idle_check(self) -> None:
        """Close the connection if it has been idle ``BROKER_IDLE`` seconds; else look again then."""
        if self._closing or self.transport is None:
            return
        now = time.monotonic()
        busy = self._inflight or self._backlog or self.conn.buffered
        if not busy and now - self._active >= BROKER_IDLE:
            self.transport.write(struct.pack(">I", len(CLOSING_PUSH)) + CLOSING_PUSH)
            self.close()
            return
        wait = BROKER_IDLE if busy else BROKER_IDLE - (now - self._active)
        self._idle_timer = asyncio.get_running_loop().call_later(max(wait, 0.01), self._idle_check)

    def data_received(self, data: bytes) -> None:
        self._active = time.monotonic()
        for item in self.conn.receive(data):
            if isinstance(item, ProtocolViolation):
                self.write(self.conn.fail(item.id, item.code, item.message))
            else:
                self._backlog.append(item)
        if self.conn.closed:
            self.close()
            return
        if (
            self.run is not None
            and self.conn.buffered
            and self.daemon.buffered(self.run) > BROKER_BUFFER_BUDGET
        ):
            self.write(
                self.conn.fail(
                    0,
                    "too_large",
                    f"this run's connections hold more than {BROKER_BUFFER_BUDGET >> 20} MiB of unfinished "
                    "frames; send one large intent at a time",
                )
            )
            self.close()
            return
        self._pump()

    def eof_received(self) -> bool | None:
        # A peer that stops mid-frame is simply gone; nothing was half-served.
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        self._backlog.clear()
        self.daemon.forget(self)

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._set_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._set_reading()

    # -- serving

    def _pump(self) -> None:
        limit = 1 if self.run is not None else MAX_INFLIGHT
        while self._backlog and self._inflight < limit and not self._closing:
            req = self._backlog.popleft()
            self._inflight += 1
            if self.run is not None and self._serve_intent(req):
                continue
            asyncio.get_running_loop().create_task(self._serve(req))
        self._set_reading()

    def _serve_intent(self, req: Request) -> bool:
        """Serve an intent: an allowed read-only one without a task (the
        broker's fast path, ``IntentPath.serve_intent``), done now and answered
        from the recorder's callback once its event is durable, two passes of
        the loop where a task takes four; any other in a task. False (nothing
        done) for a request that is not an intent. The one door of intents:
        ``PeerHost.broker`` serves the rest of a broker socket's requests."""
        runs, run = self.daemon.runs, self.run
        if req.method != "intent" or run is None:
            return False
        assert runs is not None  # a broker socket is opened by the runs, once they exist
        intents = runs.intents
        try:
            prepared = intents.serve_intent(run, req.params, cell=self.cell)
        except Exception as exc:  # refused before anything was recorded
            self.answer(req, exc)
            return True
        if not isinstance(prepared, PreparedRead):
            asyncio.get_running_loop().create_task(self._serve(req, prepared))
            return True
        if prepared.refused:  # counted toward the tripwire before the answer: a task
            asyncio.get_running_loop().create_task(self._serve(req, intents.settle_read(run, prepared)))
            return True

        def then(recorded: list[StoredEvent] | BaseException) -> None:
            try:
                outcome: dict[str, Any] | Exception = intents.finish_read(run, prepared, recorded)
            except Exception as exc:
                outcome = exc
            self.answer(req, outcome)

        intents.recorder.record_then(prepared.events, then)
        return True

    def _set_reading(self) -> None:
        if self.transport is None or self._closing:
            return
        want_pause = self._writing_paused or len(self._backlog) >= MAX_INFLIGHT
        if want_pause and not self._paused_reading:
            self.transport.pause_reading()
            self._paused_reading = True
        elif not want_pause and self._paused_reading:
            self.transport.resume_reading()
            self._paused_reading = False

    async def _serve(self, req: Request, work: Awaitable[dict[str, Any]] | None = None) -> None:
        """Serve ``req`` (or await ``work``, its serving already begun) and answer it."""
        try:
            if work is not None:
                result = await work
            elif self.run is not None:
                result = await self.daemon.broker(self, req)
            else:
                result = await self.daemon.control(self, req)
        except Exception as exc:
            self.answer(req, exc)
            return
        self.answer(req, result)

    def answer(self, req: Request, outcome: Mapping[str, Any] | Exception) -> None:
        """Write the answer to ``req``: its result, or the error ``outcome`` is;
        then serve what waits."""
        try:
            if isinstance(outcome, Exception):
                raise outcome
            frame = self.conn.respond(req.id, outcome)
        except StockadeError as exc:
            # stockade.errors.wire_error is the one place an error becomes a wire code.
            code, message = wire_error(exc)
            frame = self.conn.fail(req.id, _code(code), message)
        except Exception as exc:  # a bug: say so, keep serving
            print(f"stockade: internal error serving {req.method}: {exc!r}", file=sys.stderr)
            frame = self.conn.fail(req.id, "internal", f"the daemon failed serving {req.method}: {exc!r}")
        self.write(frame)
        self._inflight -= 1
        self._active = time.monotonic()
        self._pump()

    def write(self, frame: bytes) -> None:
        if self.transport is not None and not self._closing:
            if self._pushes:  # in order: what was pushed before goes first
                frame = b"".join([*self._pushes, frame])
                self._pushes.clear()
                self._pushes_size = 0
            self.transport.write(frame)

    def close(self) -> None:
        if self.transport is not None and not self._closing:
            self._closing = True
            self.transport.close()

    # -- pushes

    def _room(self) -> bool:
        return (
            self.transport is not None
            and not self._closing
            and self.transport.get_write_buffer_size() + self._pushes_size <= self.daemon.subscriber_buffer
        )

    def push_event(self, sub: int, line: str) -> bool:
        """A subscription's ``send``: False (after a last push saying so) when it fell behind."""
        if self._closing:
            return False
        if not self._room():
            self._push_dropped(sub)
            return False
        try:
            frame = self.conn.push_json(sub, line)
        except ProtocolError:
            return True  # too large for a frame (it cannot be: events are smaller); skip it
        # The events of one write of the store go out in one system call, at
        # the end of this pass of the loop, instead of one call each.
        if not self._pushes:
            asyncio.get_running_loop().call_soon(self._send_pushes)
        self._pushes.append(frame)
        self._pushes_size += len(frame)
        return True

    def _send_pushes(self) -> None:
        if self._pushes:
            self.write(b"")

    def push_output(self, sub: int, stream: int, offset: int, data: bytes) -> bool:
        """A transcript follower's ``send``."""
        if self._closing:
            return False
        if not self._room():
            self._push_dropped(sub)
            return False
        decoder = self._decoders.get(sub)
        if decoder is None:
            decoder = self._decoders[sub] = codecs.getincrementaldecoder("utf-8")("replace")
        text = decoder.decode(data)
        # A chunk is at most 64 KiB of output: its push fits a frame.
        message = {
            "kind": "run.output",
            "stream": "stdout" if stream == 1 else "stderr",
            "offset": offset,
            "data": text,
        }
        with contextlib.suppress(ProtocolError):
            self.write(self.conn.push(sub, message))
        return True

    def push_end(self, sub: int, info: dict[str, Any]) -> None:
        """A transcript follower's ``end``: the run is over."""
        self._decoders.pop(sub, None)
        with contextlib.suppress(ProtocolError):
            self.write(self.conn.push(sub, {"kind": "run.ended", "run": info}))

    def _push_dropped(self, sub: int) -> None:
        # One small frame past the limit, so the client knows why the stream stopped.
        note = {"kind": "subscription.dropped", "reason": "the client fell behind; subscribe again"}
        with contextlib.suppress(ProtocolError):
            self.write(self.conn.push(sub, note))


def _code(code: str) -> ErrorCode:
    from stockade.broker._protocol import ERROR_CODES

    return code if code in ERROR_CODES else "internal"


def _fileno(transport: asyncio.BaseTransport) -> int:
    sock = transport.get_extra_info("socket")
    return sock.fileno() if sock is not None else -1


def _peer_cred(sock: socket.socket | None) -> tuple[int, int]:
    if sock is None:
        return 0, -1
    try:
        pid, uid, _gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    except OSError:
        return 0, -1
    return pid, uid


def _user_name(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _cell_of(pid: int) -> str:
    """The cell a process belongs to, from its cgroup (``…/stockade/<cell>@<pid>``); '' if none."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return ""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        parts = path.split("/")
        for i, part in enumerate(parts[:-1]):
            if part == "stockade" and "@" in parts[i + 1]:
                return parts[i + 1].rpartition("@")[0]
    return ""


__all__ = [
    "BROKER_BUFFER_BUDGET",
    "BROKER_MAX_FRAME",
    "MAX_BROKER_CONNECTIONS",
    "MAX_INFLIGHT",
    "Peer",
    "PeerHost",
]
