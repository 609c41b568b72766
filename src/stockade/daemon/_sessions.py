"""Sessions hosted by the daemon: ``session.*`` requests of the control socket.

Each is a ``stockade.cell.Session`` (one long-lived workbench cell serving many
calls) that the daemon owns, so that a client in another process (the CLI, a
harness, a proctor) can open one, run commands in it and read and write its
files. A session may be bound to a run (``run``): its events carry the run's
id, its kernel refusals count toward the run's tripwire, ``run.stop`` kills
it with the run's other cells, and it is closed when the run ends. Every
session is closed when the daemon stops.

Bytes travel as base64 in the JSON of the protocol (docs/PROTOCOL.md), in
frames of at most the control socket's limit (1 MiB): what is larger goes in
parts through **blobs**, byte buffers the daemon keeps per session
(``session.blob_put`` appends to one, ``session.blob_get`` reads a part of
one). An exec's input or a file's content may be a blob; an exec's output or
a file read that does not fit in the reply comes back as one. Why base64 and
not a binary frame: one frame format for every request, and the cost is small
against a call's (benchmarks/session_exec.py measures it: ~1 ms per MiB each
way here).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import dataclasses
import json
import os
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from stockade.daemon._requests import RequestError
from stockade.errors import PolicyError, StockadeError, StoreError, UsageError
from stockade.record import Event

if TYPE_CHECKING:
    from stockade.cell._audit import AuditReader
    from stockade.cell._session import Session, SessionResult
    from stockade.daemon._peer import Peer
    from stockade.daemon._run import Run
    from stockade.daemon._runs import Runs
    from stockade.gateway import Gateway

INLINE_MAX = 384 * 1024
"""Bytes of one stream (or of a file) sent inline in a reply; more goes in a
blob. Two streams base64'd (4/3) stay well under the 1 MiB frame."""
BLOB_PART_MAX = 512 * 1024
"""The most bytes one ``session.blob_get`` returns, and what a client should
send per ``session.blob_put``."""
BLOBS_MAX = 256 << 20
"""Bytes of blobs one session may hold at once (uploads not yet used, outputs
not yet read)."""
SESSIONS_MAX = 64
"""Sessions one daemon hosts at once."""
CALLS_MAX = 32
"""Calls in flight in one session; one more is refused (``unavailable``)."""
OUTPUT_MAX = 64 << 20
"""The largest ``output_limit`` a remote call may ask (each stream)."""

Handler = Callable[["Peer", Mapping[str, Any]], Awaitable[dict[str, Any]]]


@dataclass
class _Hosted:
    session: Session
    run: str
    created: float
    opened_by: str
    max_calls: int = CALLS_MAX
    in_flight: int = 0
    calls: int = 0
    blobs: dict[str, bytearray] = field(default_factory=dict)
    blob_count: int = 0
    closing: bool = False
    gateway: Gateway | None = None
    """The session's own gateway (a policy of its own), whose rules
    ``session.set_network`` changes; None when it shares its run's."""

    def blob_bytes(self) -> int:
        return sum(len(b) for b in self.blobs.values())


class Sessions:
    """The daemon's sessions, served on its loop; the calls run in threads."""

    def __init__(self, runs: Runs) -> None:
        self._runs = runs
        self._hosted: dict[str, _Hosted] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing: dict[str, asyncio.Future[dict[str, Any]]] = {}
        """Sessions being closed: a ``session.close`` of one waits for that close
        to end, so that "closed" means its cell is gone (its kept upper free for
        the next cell: a bench's verifier, after the run closed its session)."""

    def methods(self) -> dict[str, Handler]:
        """The control socket's ``session.*`` methods (``Daemon.extensions``)."""
        return {
            "session.open": self.open,
            "session.exec": self.exec,
            "session.read_file": self.read_file,
            "session.write_file": self.write_file,
            "session.close": self.close,
            "session.list": self.listing,
            "session.blob_put": self.blob_put,
            "session.blob_get": self.blob_get,
            "session.set_network": self.set_network,
        }

    # ------------------------------------------------------------------ open / close

    async def open(self, peer: Peer, p: Mapping[str, Any]) -> dict[str, Any]:
        from stockade.cell._session import Session
        from stockade.daemon._run import Run
        from stockade.daemon._runs import _CellWatch, _load_policy, _shared_audit, upper_param

        _only(p, {"policy_path", "policy_text", "image", "workspace", "run", "max_calls", "upper"})
        upper = upper_param(p)
        if len(self._hosted) >= SESSIONS_MAX:
            raise RequestError(
                "unavailable", f"this daemon hosts {SESSIONS_MAX} sessions already; close one first"
            )
        run: Run | None = None
        network: Any = None
        if p.get("run") is not None:
            found = self._runs.find(p.get("run"))
            if not isinstance(found, Run):
                raise RequestError(
                    "not_found", f"no running run {p.get('run')!r}; list runs with `stockade ps`"
                )
            if found.state != "running":
                raise RequestError(
                    "conflict", f"run {found.id} is {found.state}; bind a session to a running run"
                )
            run = found
        workspace = p.get("workspace")
        if workspace is not None and (not isinstance(workspace, str) or not os.path.isabs(workspace)):
            raise RequestError("bad_params", f"'workspace' must be an absolute path, not {workspace!r}")
        if p.get("policy_path") is None and p.get("policy_text") is None:
            if run is None:
                raise RequestError(
                    "bad_params", "give 'policy_path' or 'policy_text', or a 'run' to take its policy"
                )
            policy = run.policy
            workspace = workspace or run.workspace or None
            # The run's own gateway (its allow list, its secrets, its LLM
            # budget): only under the run's own policy, whose network it enforces.
            network = run.gateway
        else:
            for key in ("policy_path", "policy_text"):
                if p.get(key) is not None and not isinstance(p.get(key), str):
                    raise RequestError("bad_params", f"'{key}' must be a string")
            if p.get("policy_path") is not None and not os.path.isabs(p["policy_path"]):
                raise RequestError(
                    "bad_params", f"'policy_path' must be an absolute path, not {p['policy_path']!r}"
                )
            policy = _load_policy(
                {"policy_path": p.get("policy_path"), "policy_text": p.get("policy_text")}, os.environ
            )
        own_gateway: Gateway | None = None
        if network is None:
            # A gateway of the session's own policy, as `stockade exec` has
            # one: an allowed host is fetched through it, any other refused
            # and recorded (and counted toward the bound run's tripwire).
            own_gateway = network = self._gateway(policy, run)
        image = None
        # Resolved in this daemon's store (its --state): the request's image,
        # else the policy's (Cell alone would look in the default state dir).
        ref = p.get("image") if p.get("image") is not None else policy.image
        if ref is not None:
            image = await asyncio.to_thread(_image, ref, self._runs.state_dir)
        max_calls = p.get("max_calls", CALLS_MAX)
        if isinstance(max_calls, bool) or not isinstance(max_calls, int) or not 1 <= max_calls <= CALLS_MAX:
            raise RequestError(
                "bad_params", f"'max_calls' must be a number from 1 to {CALLS_MAX}, not {max_calls!r}"
            )
        audit: object = "auto"
        if run is not None:
            runs = self._runs
            reader = runs._audit() if runs._audit is not None else _shared_audit()
            audit = cast("AuditReader", _CellWatch(reader, run, runs.relay))
        sink = self._sink(run)
        records = os.path.join(self._runs.state_dir, "persistence")
        try:
            session = await asyncio.to_thread(
                lambda: Session(
                    policy,
                    image=image,
                    workspace=workspace,
                    run_id=run.id if run is not None else None,
                    on_event=sink,
                    audit=audit,  # type: ignore[arg-type]
                    records=records,
                    max_calls=max_calls,
                    network=network,
                    upper_dir=upper,
                ).start()
            )
        except (PolicyError, UsageError) as exc:
            if own_gateway is not None:
                await own_gateway.close()
            raise RequestError("bad_params", str(exc)) from exc
        except StockadeError as exc:
            if own_gateway is not None:
                await own_gateway.close()
            raise RequestError("unavailable", f"the session's cell could not start: {exc}") from exc
        hosted = _Hosted(
            session, run.id if run is not None else "", time.time(), peer.who, max_calls, gateway=own_gateway
        )
        self._hosted[session.session_id] = hosted
        if run is not None:
            self._spawn(self._close_with(run, session.session_id))
        return self._info(session.session_id, hosted)

    def _gateway(self, policy: Any, run: Run | None) -> Gateway:
        from stockade.gateway import Gateway

        try:
            return Gateway(
                policy,
                run_id=run.id if run is not None else "",
                token=secrets.token_urlsafe(24),
                hooks=_SessionHooks(self._runs, run),
                loop=self._runs.loop,
                environ=os.environ,
                options=self._runs.gateway_options,
            )
        except PolicyError as exc:
            raise RequestError("bad_params", str(exc)) from exc

    async def set_network(self, peer: Peer, p: Mapping[str, Any]) -> dict[str, Any]:
        """``session.set_network``: the session's gateway enforces ``network.allow``
        rules given here from now on (a benchmark's agent phase, then its
        verifier's); connections open now are ended. Recorded as ``session.network``."""
        from stockade.policy import loads_policy

        _only(p, {"session", "network"})
        session_id, hosted = self._find(p)
        if hosted.gateway is None:
            raise RequestError(
                "conflict",
                f"session {session_id} shares the gateway of run {hosted.run} (it was opened under the "
                "run's own policy); open it with a policy of its own to change its network",
            )
        given = p.get("network")
        if not isinstance(given, dict) or set(given) - {"allow"}:
            raise RequestError(
                "bad_params",
                f"'network' must be a table with only 'allow' (a policy's network.allow), not {given!r}",
            )
        try:
            allow = loads_policy(
                json.dumps({"name": "session-network", "network": given}), source="<session.set_network>"
            ).network.allow
        except PolicyError as exc:
            raise RequestError("bad_params", str(exc)) from exc
        current = hosted.gateway.egress.network
        try:
            await hosted.gateway.set_network(dataclasses.replace(current, allow=allow))
        except PolicyError as exc:
            raise RequestError("bad_params", str(exc)) from exc
        hosts = [rule.host for rule in allow]
        event = Event(
            kind="session.network",
            cell=hosted.session.cell_id,
            layer="gateway",
            outcome="info",
            summary=f"session {session_id}'s gateway now allows {', '.join(hosts) or 'no host'}"[:1000],
            detail={"session": session_id, "allow": hosts, "by": peer.who},
            run=hosted.run,
        )
        try:
            await self._runs.recorder.record_soon([event])
        except StoreError as exc:
            raise RequestError("unavailable", str(exc)) from exc
        return {"session": session_id, "allow": hosts}

    async def close(self, peer: Peer, p: Mapping[str, Any]) -> dict[str, Any]:
        _only(p, {"session"})
        wanted = p.get("session")
        closing = self._closing.get(wanted) if isinstance(wanted, str) else None
        if closing is not None:
            return await asyncio.shield(closing)
        session_id, hosted = self._find(p)
        return await self._close(session_id, hosted)

    async def _close(self, session_id: str, hosted: _Hosted) -> dict[str, Any]:
        hosted.closing = True
        self._hosted.pop(session_id, None)
        done: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._closing[session_id] = done
        try:
            reply = await self._end(session_id, hosted)
        except Exception as exc:
            done.set_exception(exc)
            done.exception()  # retrieved: a close nobody else waits for is not an unhandled error
            raise
        except BaseException:
            done.cancel()
            raise
        else:
            done.set_result(reply)
            return reply
        finally:
            self._closing.pop(session_id, None)

    async def _end(self, session_id: str, hosted: _Hosted) -> dict[str, Any]:
        try:
            result = await asyncio.to_thread(hosted.session.close)
        except StockadeError as exc:
            raise RequestError("internal", f"session {session_id} did not close cleanly: {exc}") from exc
        with contextlib.suppress(StoreError):
            # From the loop, after the cell's live events (queued to the loop
            # by its thread before close returned): one write, durable before
            # the answer, with no second thread hop.
            await self._runs.recorder.record_soon(list(result.not_live()))
        report = [e for e in result.events if e.kind == "cell.persistence"]
        return {
            "session": session_id,
            "cell": result.cell_id,
            "run": hosted.run,
            "exit_code": result.exit_code,
            "calls": hosted.calls,
            "duration": round(result.duration, 6),
            "denials": len(result.denials),
            "persistence": report[0].detail.get("changes", []) if report else [],
        }

    async def close_all(self) -> None:
        """Every session, when the daemon stops (``Daemon.closers``)."""
        for session_id, hosted in list(self._hosted.items()):
            with contextlib.suppress(RequestError):
                await self._close(session_id, hosted)

    async def _close_with(self, run: Run, session_id: str) -> None:
        await run.done.wait()
        hosted = self._hosted.get(session_id)
        if hosted is not None:
            with contextlib.suppress(RequestError):
                await self._close(session_id, hosted)

    async def listing(self, peer: Peer, p: Mapping[str, Any]) -> dict[str, Any]:
        _only(p, {"run"})
        run = p.get("run")
        return {
            "sessions": [
                self._info(sid, h) for sid, h in sorted(self._hosted.items()) if run is None or h.run == run
            ]
        }

    # ------------------------------------------------------------------ calls

    async def exec(self, peer: Peer, p: Mapping[str, Any]) -> dict[str, Any]:
        _only(
            p,
            {"session", "argv", "input", "input_blob", "cwd", "env", "user", "timeout", "output_limit"},
        )
        session_id, hosted = self._find(p)
        argv = p.get("argv")
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            raise RequestError("bad_params", f"'argv' must be a list of strings, not {argv!r}")
        data = self._bytes(hosted, p, "input", "input_blob")
        limit = p.get("output_limit")
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= OUTPUT_MAX
        ):
            raise RequestError(
                "bad_params", f"'output_limit' must be bytes from 0 to {OUTPUT_MAX}, not {limit!r}"
            )
        session = hosted.session
        result = cast(
            "SessionResult",
            await self._call(
                hosted,
                lambda: session.exec(
                    argv,
                    input=data,
                    cwd=p.get("cwd"),
                    env=p.get("env"),
                    user=p.get("user"),
                    timeout=p.get("timeout"),
                    output_limit=OUTPUT_MAX if limit is None else limit,
                ),
            ),
        )
        return {
            "session": session_id,
            "call": result.call,
            "returncode": result.returncode,
            "timed_out": result.timed_out,
            "truncated": result.truncated,
            "duration": round(result.duration, 6),
            **self._out(hosted, "stdout", result.stdout),
            **self._out(hosted, "stderr", result.stderr),
        }

    async def read_file(self, peer: Peer, p: Mapping[str, Any]) -> dict[str, Any]:
        _only(p, {"session", "path", "user", "limit"})
        session_id, hosted = self._find(p)
        session = hosted.session
        got = await self._call(
            hosted,
            lambda: _oserror(
                lambda: session.read_file(p.get("path", ""), user=p.get("user"), limit=p.get("limit"))
            ),
        )
        if isinstance(got, dict):
            return {"session": session_id, **got}
        data = cast(bytes, got)
        return {"session": session_id, "size": len(data), **self._out(hosted, "data", data)}

    async def write_file(self, peer: Peer, p: Mapping[str, Any]) -> dict[str, Any]:
        _only(p, {"session", "path", "data", "data_blob", "user", "mode"})
        session_id, hosted = self._find(p)
        data = self._bytes(hosted, p, "data", "data_blob")
        if data is None:
            raise RequestError("bad_params", "give the file's content as 'data' (base64) or 'data_blob'")
        session = hosted.session
        got = await self._call(
            hosted,
            lambda: _oserror(
                lambda: session.write_file(p.get("path", ""), data, user=p.get("user"), mode=p.get("mode"))
            ),
        )
        if isinstance(got, dict):
            return {"session": session_id, **got}
        return {"session": session_id, "size": len(data)}

    async def blob_put(self, peer: Peer, p: Mapping[str, Any]) -> dict[str, Any]:
        """Append ``data`` (base64) to ``blob``, or to a new blob without one."""
        _only(p, {"session", "blob", "data"})
        session_id, hosted = self._find(p)
        part = _b64(p.get("data"), "data")
        name = p.get("blob")
        if name is None:
            hosted.blob_count += 1
            name = f"b{hosted.blob_count}"
            hosted.blobs[name] = bytearray()
        blob = hosted.blobs.get(name) if isinstance(name, str) else None
        if blob is None:
            raise RequestError(
                "not_found", f"no blob {name!r} in session {session_id}; leave 'blob' out for a new one"
            )
        if hosted.blob_bytes() + len(part) > BLOBS_MAX:
            raise RequestError(
                "unavailable",
                f"session {session_id} holds {hosted.blob_bytes()} bytes of blobs, and {len(part)} more "
                f"would pass its {BLOBS_MAX}; use or read the ones it has",
            )
        blob.extend(part)
        return {"session": session_id, "blob": name, "size": len(blob)}

    async def blob_get(self, peer: Peer, p: Mapping[str, Any]) -> dict[str, Any]:
        """A part of ``blob`` from ``offset``; a blob read to its end is dropped."""
        _only(p, {"session", "blob", "offset"})
        session_id, hosted = self._find(p)
        name, offset = p.get("blob"), p.get("offset", 0)
        blob = hosted.blobs.get(name) if isinstance(name, str) else None
        if blob is None:
            raise RequestError("not_found", f"no blob {name!r} in session {session_id}")
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= len(blob):
            raise RequestError("bad_params", f"'offset' must be from 0 to {len(blob)}, not {offset!r}")
        part = bytes(blob[offset : offset + BLOB_PART_MAX])
        end = offset + len(part) >= len(blob)
        if end:
            del hosted.blobs[cast(str, name)]
        return {"session": session_id, "blob": name, "data": base64.b64encode(part).decode(), "end": end}

    def exec_for_run(
        self, run_id: str, session_id: str, argv: list[str], timeout: float, cwd: str | None, output: int
    ) -> SessionResult | None:
        """An ``exec`` intent of run ``run_id`` in its session ``session_id``,
        from the intent's worker thread; None when that is not an open
        session bound to that run (the broker refuses it, and records so).

        Raises:
            UsageError: a bad argument (the session's message).
            CellError: the session's cell is gone.
        """
        hosted = self._hosted.get(session_id)
        if hosted is None or not run_id or hosted.run != run_id or hosted.closing:
            return None
        hosted.calls += 1
        return hosted.session.exec(argv, cwd=cwd, timeout=timeout, output_limit=output)

    def session_for_run(self, run_id: str, session_id: str) -> Session | None:
        """The open session ``session_id`` if it is bound to run ``run_id``
        (an ``fs.*`` intent of that run names it), else None: the broker
        refuses it, and records so."""
        hosted = self._hosted.get(session_id)
        if hosted is None or not run_id or hosted.run != run_id or hosted.closing:
            return None
        hosted.calls += 1
        return hosted.session

    # ------------------------------------------------------------------ helpers

    async def _call(self, hosted: _Hosted, fn: Callable[[], object]) -> object:
        if hosted.closing:
            raise RequestError("conflict", f"session {hosted.session.session_id} is closing")
        if hosted.in_flight >= hosted.max_calls:
            raise RequestError(
                "unavailable",
                f"session {hosted.session.session_id} has {hosted.in_flight} calls in flight, its most; "
                "wait for one to end",
            )
        hosted.in_flight += 1
        hosted.calls += 1
        try:
            return await asyncio.to_thread(fn)
        except UsageError as exc:
            raise RequestError("bad_params", str(exc)) from exc
        except StockadeError as exc:
            raise RequestError("unavailable", str(exc)) from exc
        finally:
            hosted.in_flight -= 1

    def _find(self, p: Mapping[str, Any]) -> tuple[str, _Hosted]:
        session_id = p.get("session")
        hosted = self._hosted.get(session_id) if isinstance(session_id, str) else None
        if hosted is None:
            raise RequestError(
                "not_found", f"no open session {session_id!r}; list them with `stockade session ls`"
            )
        return cast(str, session_id), hosted

    def _bytes(self, hosted: _Hosted, p: Mapping[str, Any], inline: str, blob_key: str) -> bytes | None:
        if p.get(inline) is not None and p.get(blob_key) is not None:
            raise RequestError("bad_params", f"give '{inline}' or '{blob_key}', not both")
        if p.get(blob_key) is not None:
            name = p.get(blob_key)
            blob = hosted.blobs.pop(name, None) if isinstance(name, str) else None
            if blob is None:
                raise RequestError("not_found", f"no blob {name!r} in session {hosted.session.session_id}")
            return bytes(blob)
        if p.get(inline) is None:
            return None
        return _b64(p.get(inline), inline)

    def _out(self, hosted: _Hosted, key: str, data: bytes) -> dict[str, Any]:
        if len(data) <= INLINE_MAX:
            return {key: base64.b64encode(data).decode()}
        hosted.blob_count += 1
        name = f"b{hosted.blob_count}"
        hosted.blobs[name] = bytearray(data)
        return {key: None, f"{key}_blob": name, f"{key}_size": len(data)}

    def _sink(self, run: Run | None) -> Callable[[Event], None]:
        runs = self._runs
        if run is not None:
            return runs._live_sink(run)

        def sink(event: Event) -> None:
            runs._soon(runs.recorder.record_then, [event], lambda _r: None)

        return sink

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _info(self, session_id: str, hosted: _Hosted) -> dict[str, Any]:
        s = hosted.session
        return {
            "session": session_id,
            "cell": s.cell_id,
            "run": hosted.run,
            "policy": s.policy.name,
            "workspace": s.workspace,
            "created": hosted.created,
            "calls": hosted.calls,
            "in_flight": hosted.in_flight,
            "opened_by": hosted.opened_by,
        }


class _SessionHooks:
    """What a session's own gateway calls back into (``GatewayHooks``): the
    record (as the bound run's, if any), the bound run's tripwire and state."""

    def __init__(self, runs: Runs, run: Run | None) -> None:
        self._runs = runs
        self._run = run

    async def record(self, events: Any) -> None:
        run_id = self._run.id if self._run is not None else ""
        await self._runs.recorder.record_soon([dataclasses.replace(e, run=run_id) for e in events])

    async def denied(self) -> None:
        if self._run is not None:
            await self._runs.intents.count_denial(self._run)

    def halted(self) -> str | None:
        run = self._run
        if run is None:
            return None
        if run.halted:
            return f"run {run.id} is halted ({run.halted})"
        if run.done.is_set():
            return f"run {run.id} has ended"
        return None


def _only(p: Mapping[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(p) - allowed)
    if unknown:
        raise RequestError(
            "bad_params", f"unknown parameter {unknown[0]!r}; this method takes {', '.join(sorted(allowed))}"
        )


def _b64(value: object, key: str) -> bytes:
    if not isinstance(value, str):
        raise RequestError("bad_params", f"'{key}' must be base64 text, not {type(value).__name__}")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise RequestError(
            "bad_params", f"'{key}' is not valid base64 ({exc}); encode the bytes with base64"
        ) from exc


def _oserror(fn: Callable[[], object]) -> object:
    """``fn()``, or the OSError it raised as a result: a file that is missing or
    refused inside the cell is an answer, which the client raises again as
    Python's own (FileNotFoundError, PermissionError, IsADirectoryError…)."""
    try:
        return fn()
    except OSError as exc:
        return {"error": {"errno": exc.errno, "strerror": exc.strerror or str(exc), "path": exc.filename}}


def _image(ref: object, state_dir: str | None = None) -> object:
    if not isinstance(ref, str):
        raise RequestError("bad_params", f"'image' must be an image reference, not {ref!r}")
    try:
        from stockade.image import default_store
    except ImportError as exc:
        raise RequestError("unavailable", "this stockade has no image store yet; leave 'image' out") from exc
    try:
        return default_store(state_dir).get(ref)
    except StockadeError as exc:
        raise RequestError("not_found", str(exc)) from exc
