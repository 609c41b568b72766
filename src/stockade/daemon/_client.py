"""A small synchronous client for the daemon's sockets (docs/PROTOCOL.md).

The protocol itself is ``stockade.broker._protocol``; this module only moves its
frames over a Unix socket, and turns what goes wrong there into stockade's
errors, each saying whose fault it was::

    DaemonError      the daemon is not running, closed the connection, or did not
                     answer in time (exit 4)
    ProtocolError    the daemon's reply is malformed (a version mismatch, a bug) (exit 5)
    RemoteError      the daemon read the request and refused it; ``code`` says why

A ``Client`` is not thread-safe: give each thread its own.
"""

from __future__ import annotations

import base64
import itertools
import os
import socket
import time
import weakref
from collections import deque
from collections.abc import Iterator
from types import TracebackType
from typing import Any, Final

from stockade.broker._protocol import (
    MAX_FRAME,
    VERSION,
    Failure,
    FrameDecoder,
    Push,
    Response,
    encode,
    parse_reply,
)
from stockade.errors import DaemonError, ProtocolError, RemoteError

_READ: Final = 1 << 16

# The daemon could not read the request: it may close the stream after saying so.
_UNREAD: Final = frozenset(("bad_frame", "too_large", "bad_json", "bad_request"))


def _not_running(path: str) -> str:
    return f"the daemon is not running at {path}; start it with `stockade daemon`"


class _Channel:
    """One connection: a socket, its frame decoder, and the frames read ahead."""

    def __init__(self, path: str, timeout: float | None, max_frame: int) -> None:
        self.path = path
        self.timeout = timeout
        self._decoder = FrameDecoder(max_frame=max_frame)
        self._frames: deque[bytes] = deque()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(path)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            sock.close()
            raise DaemonError(_not_running(path)) from exc
        except PermissionError as exc:
            sock.close()
            raise DaemonError(
                f"permission denied on the daemon's socket {path}; run as the user who started the daemon"
            ) from exc
        except TimeoutError as exc:
            sock.close()
            raise DaemonError(
                f"the daemon at {path} did not accept a connection within {timeout:g} s;"
                " it may be overloaded: see its log"
            ) from exc
        except OSError as exc:
            sock.close()
            raise DaemonError(
                f"cannot connect to the daemon at {path} ({exc.strerror or exc});"
                " check the socket path (--socket, $STOCKADE_SOCKET)"
            ) from exc
        self._sock = sock

    def _wait(self, deadline: float | None, method: str) -> None:
        if deadline is None:
            self._sock.settimeout(None)
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise self._timed_out(method)
        self._sock.settimeout(remaining)

    def _timed_out(self, method: str) -> DaemonError:
        return DaemonError(
            f"the daemon at {self.path} did not answer {method!r} within {self.timeout:g} s;"
            " it may be stuck: see its log, or allow longer with a larger timeout"
        )

    def _broken(self, method: str, how: str) -> DaemonError:
        return DaemonError(f"the daemon at {self.path} {how} during {method!r}; see the daemon's log")

    def send(self, frame: bytes, deadline: float | None, method: str) -> None:
        self._wait(deadline, method)
        try:
            self._sock.sendall(frame)
        except TimeoutError as exc:
            raise self._timed_out(method) from exc
        except OSError as exc:  # EPIPE, ECONNRESET: the daemon went away
            raise self._broken(method, "closed the connection") from exc

    def receive(self, deadline: float | None, method: str) -> Response | Failure | Push | None:
        """The next reply or push, or None when the daemon closed the
        connection between two frames."""
        while not self._frames:
            if self._decoder.oversized is not None:
                raise ProtocolError(
                    f"the daemon at {self.path} sent a frame of {self._decoder.oversized} bytes, over"
                    f" this client's limit of {self._decoder.max_frame}; ask for less, or raise max_frame"
                )
            self._wait(deadline, method)
            try:
                data = self._sock.recv(_READ)
            except TimeoutError as exc:
                raise self._timed_out(method) from exc
            except OSError as exc:
                raise self._broken(method, "closed the connection") from exc
            if not data:
                if self._decoder.buffered:
                    raise self._broken(method, "closed the connection in the middle of a reply")
                return None
            self._frames.extend(self._decoder.feed(data))
        return parse_reply(self._frames.popleft())

    def close(self) -> None:
        self._sock.close()


class Subscription(Iterator[dict[str, Any]]):
    """The events the daemon pushes on one subscription, on a connection of its own.

    Iterating blocks until the next event (no timeout: a live stream may be
    quiet for a long time), and ends when the daemon closes the stream.
    ``result`` is the daemon's reply to the subscribing request. Close it, or
    use it in a ``with`` block, to end the stream early.

    Raises (while iterating):
        DaemonError: the connection broke in the middle of a frame.
        RemoteError: the daemon ended the stream with an error.
        ProtocolError: the daemon sent a malformed frame.
    """

    def __init__(self, channel: _Channel, method: str, result: dict[str, Any], early: deque[Push]) -> None:
        self.method = method
        self.result = result
        self._channel: _Channel | None = channel
        self._early = early

    def __next__(self) -> dict[str, Any]:
        if self._early:
            return self._early.popleft().event
        channel = self._channel
        if channel is None:
            raise StopIteration
        try:
            reply = channel.receive(None, self.method)
            if reply is None:
                raise StopIteration
            if isinstance(reply, Push):
                return reply.event
            if isinstance(reply, Failure):
                raise RemoteError(reply.message, code=reply.code, method=self.method)
            raise ProtocolError(
                f"the daemon sent a second reply (id {reply.id}) on the {self.method!r} subscription;"
                " check that the daemon and this client are the same stockade version"
            )
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        self._early.clear()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class Client:
    """A connection to one of the daemon's sockets, at ``path``.

    ``call`` sends one request and waits for its reply; ``subscribe`` opens a
    connection of its own and streams what the daemon pushes. The connection is
    opened on first use, and opened again after one broke, but a request is
    never sent twice. ``timeout`` (seconds, None for none) bounds each call,
    from sending the request to reading the whole reply; ``max_frame`` bounds a
    reply's size.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, timeout: float | None = 30.0, max_frame: int = MAX_FRAME
    ) -> None:
        self.path = os.fspath(path)
        self.timeout = timeout
        self.max_frame = max_frame
        self._channel: _Channel | None = None
        self._ids = itertools.count(1)
        self._subscriptions: weakref.WeakSet[Subscription] = weakref.WeakSet()

    def _deadline(self) -> float | None:
        return None if self.timeout is None else time.monotonic() + self.timeout

    def _request(self, method: str, params: dict[str, Any]) -> tuple[int, bytes]:
        request_id = next(self._ids)
        frame = encode(
            {"v": VERSION, "id": request_id, "method": method, "params": params}, max_frame=self.max_frame
        )
        return request_id, frame

    def call(self, method: str, /, **params: Any) -> dict[str, Any]:
        """Send ``method`` with ``params`` and return the daemon's result.

        Raises:
            DaemonError: the daemon is not running, closed the connection, or
                did not answer within ``timeout``.
            RemoteError: the daemon refused the request.
            ProtocolError: the request cannot be encoded or is too large, or the
                reply is malformed.
        """
        request_id, frame = self._request(method, params)
        if self._channel is None:
            self._channel = _Channel(self.path, self.timeout, self.max_frame)
        channel = self._channel
        deadline = self._deadline()
        try:
            channel.send(frame, deadline, method)
            return _await_result(channel, request_id, method, deadline, None)
        except RemoteError as exc:
            if exc.code in _UNREAD:
                self._drop()
            raise
        except BaseException:
            # A timeout or a broken stream leaves the connection in an unknown
            # state (a late reply would answer the next call): start afresh.
            self._drop()
            raise

    def subscribe(self, method: str, /, **params: Any) -> Subscription:
        """Send ``method`` (such as ``events.subscribe``) on a new connection and
        return the stream of events the daemon pushes after its reply.

        Raises:
            DaemonError, RemoteError, ProtocolError: as ``call``, for the
                subscribing request.
        """
        request_id, frame = self._request(method, params)
        channel = _Channel(self.path, self.timeout, self.max_frame)
        early: deque[Push] = deque()
        try:
            deadline = self._deadline()
            channel.send(frame, deadline, method)
            result = _await_result(channel, request_id, method, deadline, early)
        except BaseException:
            channel.close()
            raise
        subscription = Subscription(channel, method, result, early)
        self._subscriptions.add(subscription)
        return subscription

    def open_session(
        self,
        *,
        policy_path: str | None = None,
        policy_text: str | None = None,
        image: str | None = None,
        workspace: str | None = None,
        run: str | None = None,
        max_calls: int | None = None,
        upper: str | None = None,
    ) -> RemoteSession:
        """``session.open``: a workbench session the daemon hosts (docs/SESSIONS.md).

        Give a policy (a path on the daemon's host, or its text), or a ``run``
        to bind to (its policy and workspace by default).

        Raises:
            DaemonError, ProtocolError: as ``call``.
            RemoteError: the daemon refused: a bad policy (``bad_params``), no
                such run (``not_found``), the cell could not start (``unavailable``).
        """
        params: dict[str, Any] = {
            k: v
            for k, v in {
                "policy_path": policy_path,
                "policy_text": policy_text,
                "image": image,
                "upper": upper,
                "workspace": workspace,
                "run": run,
                "max_calls": max_calls,
            }.items()
            if v is not None
        }
        return RemoteSession(self, self.call("session.open", **params))

    def sessions(self, run: str | None = None) -> list[dict[str, Any]]:
        """``session.list``: the open sessions (of ``run``)."""
        found = self.call("session.list", **({"run": run} if run is not None else {}))
        return list(found["sessions"])

    def _drop(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def close(self) -> None:
        """Close the connection and every subscription this client opened."""
        self._drop()
        for subscription in list(self._subscriptions):
            subscription.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class RemoteSession:
    """A session the daemon hosts, with ``Session``'s methods (``exec``,
    ``read_file``, ``write_file``, ``close``) over ``client``'s connection.

    Bytes go as base64, in parts of ``PART`` bytes through the session's blobs
    when they do not fit one frame. Like its ``Client``, not thread-safe: a
    thread of its own opens its own ``Client`` and ``RemoteSession.attach``.
    """

    PART: Final = 512 * 1024
    INLINE: Final = 384 * 1024
    MARGIN: Final = 30.0
    """Seconds a call may take beyond its own timeout (the daemon's side of it)."""

    def __init__(self, client: Client, info: dict[str, Any]) -> None:
        self.client = client
        self.info = info
        self.session_id: str = info["session"]
        self.cell_id: str = info.get("cell", "")
        self.workspace: str = info.get("workspace", "")

    @classmethod
    def attach(cls, client: Client, session_id: str) -> RemoteSession:
        """The open session ``session_id``, over another ``client``."""
        for info in client.sessions():
            if info["session"] == session_id:
                return cls(client, info)
        raise RemoteError(
            f"no open session {session_id!r}; list them with `stockade session ls`",
            code="not_found",
            method="session.list",
        )

    def _call(self, method: str, timeout: float | None, /, **params: Any) -> dict[str, Any]:
        saved = self.client.timeout
        if saved is not None:
            self.client.timeout = None if timeout is None else max(saved, timeout + self.MARGIN)
        try:
            return self.client.call(method, session=self.session_id, **params)
        finally:
            self.client.timeout = saved

    def _upload(self, data: bytes) -> str:
        blob: str | None = None
        for start in range(0, max(len(data), 1), self.PART):
            part = base64.b64encode(data[start : start + self.PART]).decode()
            got = self._call("session.blob_put", None, data=part, **({"blob": blob} if blob else {}))
            blob = got["blob"]
        assert blob is not None
        return blob

    def _download(self, result: dict[str, Any], key: str) -> bytes:
        if result.get(key) is not None:
            return base64.b64decode(result[key])
        blob = result.get(f"{key}_blob")
        if blob is None:
            return b""
        parts: list[bytes] = []
        offset = 0
        while True:
            got = self._call("session.blob_get", None, blob=blob, offset=offset)
            part = base64.b64decode(got["data"])
            parts.append(part)
            offset += len(part)
            if got["end"]:
                return b"".join(parts)

    def _payload(self, data: bytes, inline: str, blob: str) -> dict[str, Any]:
        if len(data) <= self.INLINE:
            return {inline: base64.b64encode(data).decode()}
        return {blob: self._upload(data)}

    def exec(
        self,
        argv: list[str] | tuple[str, ...],
        *,
        input: bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | int | None = None,
        timeout: float | None = None,
        output_limit: int | None = None,
    ) -> Any:
        """``session.exec``; a ``stockade.cell.SessionResult``.

        Raises:
            RemoteError: ``bad_params`` (a bad argument), ``not_found`` (no such
                session), ``unavailable`` (its calls are all in flight, or its cell ended).
            DaemonError, ProtocolError: as ``Client.call``.
        """
        from stockade.cell._session import SessionResult

        params: dict[str, Any] = {"argv": list(argv)}
        if input is not None:
            params.update(self._payload(bytes(input), "input", "input_blob"))
        for key, value in (("cwd", cwd), ("env", env), ("user", user), ("timeout", timeout)):
            if value is not None:
                params[key] = value
        if output_limit is not None:
            params["output_limit"] = output_limit
        got = self._call("session.exec", timeout if timeout is not None else None, **params)
        return SessionResult(
            returncode=got["returncode"],
            stdout=self._download(got, "stdout"),
            stderr=self._download(got, "stderr"),
            timed_out=got["timed_out"],
            truncated=got["truncated"],
            call=got.get("call", ""),
            duration=got.get("duration", 0.0),
        )

    def read_file(self, path: str, *, user: str | int | None = None, limit: int | None = None) -> bytes:
        """``session.read_file``.

        Raises:
            FileNotFoundError, PermissionError, IsADirectoryError, OSError: as
                inside the cell.
            RemoteError, DaemonError, ProtocolError: as ``exec``.
        """
        params: dict[str, Any] = {"path": path}
        if user is not None:
            params["user"] = user
        if limit is not None:
            params["limit"] = limit
        got = self._call("session.read_file", None, **params)
        _raise_oserror(got)
        return self._download(got, "data")

    def write_file(
        self, path: str, data: bytes, *, user: str | int | None = None, mode: int | None = None
    ) -> None:
        """``session.write_file``.

        Raises:
            FileNotFoundError, PermissionError, IsADirectoryError, OSError: as
                inside the cell.
            RemoteError, DaemonError, ProtocolError: as ``exec``.
        """
        params: dict[str, Any] = {"path": path, **self._payload(bytes(data), "data", "data_blob")}
        if user is not None:
            params["user"] = user
        if mode is not None:
            params["mode"] = mode
        _raise_oserror(self._call("session.write_file", None, **params))

    def set_network(self, allow: list[dict[str, Any]]) -> list[str]:
        """``session.set_network``: the session's own gateway enforces ``allow``
        (a policy's ``network.allow`` rules) from now on; the hosts it allows.

        Raises:
            RemoteError: ``conflict`` (the session shares its run's gateway),
                ``bad_params`` (a rule the policy loader refuses).
        """
        got = self._call("session.set_network", None, network={"allow": allow})
        return [str(h) for h in got.get("allow", [])]

    def close(self) -> dict[str, Any]:
        """``session.close``: what the session's cell left (``persistence``), its counts."""
        return self._call("session.close", None)

    def __enter__(self) -> RemoteSession:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _raise_oserror(result: dict[str, Any]) -> None:
    error = result.get("error")
    if isinstance(error, dict):
        raise OSError(int(error.get("errno") or 0), str(error.get("strerror", "")), error.get("path"))


def _await_result(
    channel: _Channel, request_id: int, method: str, deadline: float | None, early: deque[Push] | None
) -> dict[str, Any]:
    """The result of request ``request_id``; pushes that come first are kept in
    ``early`` (a subscription's) or dropped (a plain call has none)."""
    while True:
        reply = channel.receive(deadline, method)
        if reply is None:
            raise DaemonError(
                f"the daemon at {channel.path} closed the connection before answering {method!r};"
                " see the daemon's log"
            )
        if isinstance(reply, Push):
            if early is not None:
                early.append(reply)
            continue
        if reply.id not in (request_id, 0):
            raise ProtocolError(
                f"the daemon answered request {reply.id} while this client waited for {request_id};"
                " check that the daemon and this client are the same stockade version"
            )
        if isinstance(reply, Failure):
            raise RemoteError(reply.message, code=reply.code, method=method)
        return reply.result


__all__ = ["Client", "RemoteError", "RemoteSession", "Subscription"]
