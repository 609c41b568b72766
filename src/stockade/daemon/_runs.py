"""Runs under the daemon, and the broker's serving side: what each intent gets.

A run is one agent in one cell, started by ``run.start``: an id (``r-`` and 12
hex digits), a ``Cell`` run by a thread of its own (the thread that forks a
cell must outlive it: the cell's death signal follows that thread), a broker
socket the server listens on (shown in the cell at
``/run/stockade/broker.sock``), a capability token bound to the run, a
tripwire, and a transcript of the agent's stdout and stderr. Everything a run
does is an event, recorded before anyone is answered.

Each intent on a run's broker socket goes through ``Runs.intents``, the
run's intent path (``_intent_path.IntentPath``), by its one door,
``serve_intent``:

1. a halted run refuses it (``denied``), recorded;
2. the token must be this run's and live (``unauthorized``), recorded as a denial;
3. the policy's ``tools`` rules decide (``Rules``), and for ``agent.*`` then
   ``_agents`` (the subset proof of a helper's policy, the family of a
   message's recipient); unattended runs deny what would ask;
4. the ``intent`` event is stored, durably, before anything else happens;
5. ``allow`` runs the intent (``IntentExecutor``), ``ask`` waits for the
   operator (``Approvals``), ``deny`` answers at once; every denial counts
   toward the tripwire, whose trip halts the run.

Nothing here touches a socket: the server (``_server``) calls in, and opens
and closes the broker sockets this module asks for.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import json
import os
import re
import signal
import stat
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast

from stockade.broker._approvals import ApprovalError, Approvals
from stockade.broker._intents import IntentExecutor
from stockade.broker._rules import Rules
from stockade.broker._tokens import Tokens
from stockade.broker._tripwire import DEFAULT_LIMIT, Tripwire
from stockade.cell._plan import _cell_identity
from stockade.daemon import _paths
from stockade.daemon._agents import Agents
from stockade.daemon._bus import (
    EventBus,
    Recorder,
    approval_event,
    kernel_gap_event,
    noted_store_error,
    run_end_event,
    run_halted_event,
    run_lost_event,
    run_start_event,
    store_error_event,
)
from stockade.daemon._intent_path import IntentPath
from stockade.daemon._network import RunHooks, make_gateway
from stockade.daemon._relay import Relayed, wait_for_previous
from stockade.daemon._relay import recover as recover_spool
from stockade.daemon._requests import RequestError
from stockade.daemon._run import WORKBENCHES_PER_RUN, Run, RunState
from stockade.daemon._tools import RecordBudgets
from stockade.errors import CellError, PolicyError, StockadeError, StoreError
from stockade.policy import Policy
from stockade.record import Event
from stockade.record._chain import StoredEvent
from stockade.sdk import IN_CELL_DIR, MODULE_PATH

if TYPE_CHECKING:
    from stockade.cell._attempts import Places
    from stockade.cell._audit import AuditReader, Settling
    from stockade.cell._cell import Cell, CellResult
    from stockade.cell._cgroup import CellCgroup
    from stockade.cell._session import Session, SessionResult
    from stockade.gateway import Gateway, GatewayOptions

_RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")
"""A name given to ``run.start`` (a scenario's ``pipeline/summarise-2``)."""

TRANSCRIPT_MAX = 64 * 1024 * 1024
"""Transcript bytes kept when the policy sets no ``limits.output``."""
LOG_MAX = 512 * 1024
"""Bytes of transcript one ``run.logs`` answer carries at most (it fits a frame)."""
TOKEN_TTL_MARGIN = 300.0
TOKEN_TTL_DEFAULT = 7 * 24 * 3600.0
"""A run with no timeout gets a token for a week; a restart invalidates it anyway."""
PAST_RUNS_KEPT = 1000
"""Ended runs of earlier daemons that ``run.list`` shows (newest first)."""
STOP_WAIT_EXTRA = 30.0
"""Seconds ``run.stop`` waits past its grace for the cell's end to be recorded."""
HELPER_GRACE = 10.0
"""Seconds a helper gets (after SIGTERM) to end when the run that spawned it ended on its own."""


class BrokerHost(Protocol):
    """What runs need of the server: listening sockets (the only I/O they ask for)."""

    async def open_broker(self, run: Run, path: str, uid: int, gid: int) -> Callable[[], None]:
        """Listen on ``path`` (0600, owned by ``uid``:``gid``) for ``run``'s cell; return a closer."""
        ...


# --------------------------------------------------------------------------- one run's cells


class _CellWatch:
    """Stands in for the audit reader given to a run's cells: passes every call on,
    and keeps a pidfd of each cell's pid 1 while it lives, so the run can be stopped.

    ``Cell`` tells its audit reader the cell id and the host pid of the cell's
    pid 1 right after launching it (``watch``) and lets go after it ended
    (``unwatch``); no other part of ``Cell`` names a running cell's process.
    """

    def __init__(self, reader: AuditReader, run: Run, relay: Relayed | None = None) -> None:
        self._reader = reader
        self._run = run
        self._relay = relay

    def watch(self, cell_id: str, *, session: int, pid: int, places: Places | None = None) -> None:
        self._reader.watch(cell_id, session=session, pid=pid)
        if self._relay is not None:
            self._relay.watch(self._run, cell_id, session=session, pid=pid, places=places)
        run = self._run
        with run.lock:
            if cell_id not in run.cells:
                run.cells.append(cell_id)
            try:
                pidfd = os.pidfd_open(pid)
            except ProcessLookupError:
                return  # already gone
            run.live[cell_id] = pidfd
            if run.kill_requested:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)

    def unwatch(self, cell_id: str) -> None:
        self._reader.unwatch(cell_id)
        if self._relay is not None:
            self._relay.unwatch(cell_id)
        with self._run.lock:
            pidfd = self._run.live.pop(cell_id, None)
            if pidfd is not None:
                os.close(pidfd)

    def collect(self, cell_id: str, *, timeout: float = 2.0, begun: Settling | None = None) -> list[Event]:
        return self._reader.collect(cell_id, timeout=timeout, begun=begun)

    def begin_settle(self, timeout: float = 2.0) -> Settling:
        return self._reader.begin_settle(timeout)

    def abandon(self, settling: Settling) -> None:
        self._reader.abandon(settling)

    def on_event(self, callback: Callable[[Event], None]) -> Callable[[], None]:
        return self._reader.on_event(callback)


# --------------------------------------------------------------------------- all runs


class Runs:
    """Every run of one daemon: starting, the cells' threads, stopping, halting.
    The runs' intents are served by ``intents``, the intent path it makes."""

    def __init__(
        self,
        *,
        state: str,
        loop: asyncio.AbstractEventLoop,
        recorder: Recorder,
        bus: EventBus,
        host: BrokerHost,
        tokens: Tokens | None = None,
        approvals: Approvals | None = None,
        approval_timeout: float = 300.0,
        audit: Callable[[], AuditReader] | None = None,
        gateway: GatewayOptions | None = None,
        intent_budgets: RecordBudgets | None = None,
    ) -> None:
        self.state_dir = state
        self.gateway_options = gateway if gateway is not None else _gateway_options()
        self.loop = loop
        self.recorder = recorder
        self.bus = bus
        self.host = host
        self.tokens = tokens or Tokens()
        self.approvals = approvals or Approvals()
        self.approval_timeout = approval_timeout
        self._audit = audit
        self.relay = Relayed(state) if audit is None else None
        """The audit relay that outlives a killed daemon (``_relay``); only
        with the real, shared reader (a test's stand-in has no kernel behind it)."""
        self.runs: dict[str, Run] = {}
        self.past: dict[str, dict[str, Any]] = {}
        self._workbench_pool = concurrent.futures.ThreadPoolExecutor(
            64, thread_name_prefix="stockade-workbench"
        )
        self.on_output_dropped: Callable[[str], None] = lambda run_id: None
        self.session_exec: Callable[[str, str, list[str], float, str | None, int], SessionResult | None] = (
            lambda run_id, session, argv, timeout, cwd, output: None
        )
        """An ``exec`` intent naming a session: the daemon's sessions run it
        (``_sessions.Sessions.exec_for_run``); None when ``session`` is not
        an open session of that run."""
        self.session_for: Callable[[str, str], Session | None] = lambda run_id, session: None
        """The open session ``session`` bound to run ``run_id``, for ``fs.*``
        intents that name it (``_sessions.Sessions.session_for_run``), or None."""
        self.refusing: str = ""
        """Set when new runs are refused (the store failed): the reason."""
        self.agents = Agents(
            runs=self.runs, recorder=recorder, state_dir=state, start=self.start, stop=self.stop
        )
        self.intents = IntentPath(
            loop=loop,
            recorder=recorder,
            tokens=self.tokens,
            approvals=self.approvals,
            approval_timeout=approval_timeout,
            agents=self.agents,
            workbench_pool=self._workbench_pool,
            halt=self.halt,
            budgets=intent_budgets,
        )
        self._cascades: set[asyncio.Task[None]] = set()
        """Stops of helpers whose parent was halted or ended (kept: a task needs a reference)."""

    # ------------------------------------------------------------------ finding

    def find(self, ref: object) -> Run | dict[str, Any]:
        """A run by id or name (the running one, else the latest); a past run as its ``run.json``.

        Raises:
            RequestError: ``bad_params``, ``not_found`` or ``conflict`` (a name several running runs share).
        """
        if not isinstance(ref, str) or not ref:
            raise RequestError("bad_params", "'run' must be a run's id or name, such as r-3f9a1c2e4b5d")
        if ref in self.runs:
            return self.runs[ref]
        if ref in self.past:
            return self.past[ref]
        named = [r for r in self.runs.values() if r.name == ref]
        running = [r for r in named if not r.done.is_set()]
        if len(running) > 1:
            ids = ", ".join(r.id for r in running)
            raise RequestError("conflict", f"several runs named {ref!r} are running ({ids}); give an id")
        if running:
            return running[0]
        if named:
            return max(named, key=lambda r: r.created)
        past = [p for p in self.past.values() if p.get("name") == ref]
        if past:
            return max(past, key=lambda p: float(p.get("created") or 0))
        raise RequestError("not_found", f"no run {ref!r}; `stockade ps` lists the runs")

    def listing(self, *, include_past: bool = False) -> list[dict[str, Any]]:
        items = [r.info() for r in self.runs.values()]
        if include_past:
            items.extend(self.past.values())
        return sorted(items, key=lambda i: float(i.get("created") or 0))

    # ------------------------------------------------------------------ recovery

    def recover(self) -> list[Event]:
        """Read the runs of earlier daemons from the state directory; return a
        ``run.end`` for each that never ended (its daemon died), to record."""
        root = _paths.runs_dir(self.state_dir)
        # A killed daemon's relay drains its cells' last refusals, then lets go.
        if not wait_for_previous(self.state_dir):
            import logging

            logging.getLogger(__name__).warning(
                "the previous daemon's audit relay is still running; its spools are read as they are"
            )
        try:
            names = os.listdir(root)
        except FileNotFoundError:
            return []
        found: list[dict[str, Any]] = []
        for name in names:
            if not _paths.RUN_ID.match(name):
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(_paths.broker_socket_path(self.state_dir, name))
            try:
                with open(_paths.run_meta_path(self.state_dir, name), encoding="utf-8") as f:
                    meta = json.load(f)
            except (OSError, ValueError):
                continue
            if isinstance(meta, dict) and meta.get("id") == name:
                found.append(meta)
        events = []
        for meta in found:
            if meta.get("ended") is not None and self.relay is not None:
                # Its end is stored, so is every refusal before it (or an
                # earlier restart recovered them from this spool).
                self.relay.run_ended(str(meta["id"]))
            if meta.get("ended") is None:
                meta.update(state="lost", ended=time.time(), error="the daemon ended before the run did")
                run_id = str(meta["id"])
                cell = str((meta.get("cells") or [""])[-1])
                stored = (s.event for s in self.recorder.store.query(run=run_id))
                found_in_spool = recover_spool(self.state_dir, run_id, stored)
                events.extend(found_in_spool.events)
                events.append(
                    kernel_gap_event(
                        self.recorder.store,
                        run_id,
                        cell or (found_in_spool.events[-1].cell if found_in_spool.events else ""),
                        time.time(),
                        recovered=len(found_in_spool.events),
                        relayed_cells=found_in_spool.cells,
                        complete=found_in_spool.complete,
                        dropped=found_in_spool.dropped,
                        gaps=found_in_spool.gaps,
                        unjudged=found_in_spool.unjudged,
                        relay_lost=found_in_spool.lost,
                    )
                )
                events.append(run_lost_event(run_id, meta["error"]))
                self._write_meta_dict(meta)
        found.sort(key=lambda m: float(m.get("created") or 0))
        self.past = {str(m["id"]): m for m in found[-PAST_RUNS_KEPT:]}
        return events

    def _write_meta(self, run: Run) -> None:
        self._write_meta_dict(run.info())

    def _write_meta_dict(self, meta: Mapping[str, Any]) -> None:
        """``runs/<id>/run.json``, replaced atomically (a crash leaves the old or the new)."""
        path = _paths.run_meta_path(self.state_dir, str(meta["id"]))
        tmp = path + ".tmp"
        try:
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600), "w") as f:
                json.dump(meta, f, indent=1)
            os.replace(tmp, path)
        except OSError:
            pass  # the store has the record; run.json only helps `ps` after a restart

    # ------------------------------------------------------------------ starting

    async def start(
        self, params: Mapping[str, Any], *, parent: Run | None = None, policy: Policy | None = None
    ) -> Run:
        """``run.start``: make the run, its socket and its cell, record ``run.start``, start it.

        ``agent.spawn`` passes the spawning run as ``parent`` and the helper's
        ``policy``, already loaded and proven a subset of the parent's.

        Raises:
            RequestError: ``unavailable`` (the store failed), ``bad_params`` (a
                bad policy or parameter, a host that lacks what the policy needs).
        """
        if self.recorder.failure is not None:
            await self._retry_store()
        elif self.refusing:
            self._retry_state_dir()
        opts = _start_params(params)
        environ = opts["env"] if opts["env"] is not None else dict(os.environ)
        if policy is None:
            policy = _load_policy(opts, environ)
        run_id = _paths.new_run_id()
        run_dir = _paths.run_dir(self.state_dir, run_id)
        os.makedirs(_paths.runs_dir(self.state_dir), mode=0o700, exist_ok=True)
        os.mkdir(run_dir, 0o700)
        limits = policy.limits
        ttl = (limits.timeout or TOKEN_TTL_DEFAULT) + TOKEN_TTL_MARGIN
        expiry = time.time() + ttl
        token = self.tokens.issue(run_id, "", ttl=ttl)
        sock_path = _paths.broker_socket_path(self.state_dir, run_id)
        run = Run(
            id=run_id,
            name=opts["name"] or policy.name,
            policy=policy,
            argv=tuple(opts["argv"] or policy.command),
            workspace=opts["workspace"] or policy.workspace or "",
            detach=opts["detach"],
            unattended=opts["unattended"],
            created=time.time(),
            token=token,
            token_expiry=expiry,
            # A helper counts toward its parent's tripwire: the family has one.
            tripwire=parent.tripwire if parent is not None else Tripwire(limits.denials or DEFAULT_LIMIT),
            rules=Rules(policy.tools),
            parent=parent.id if parent is not None else "",
            environ={k: environ[k] for k in policy.env.passthrough if k in environ},
        )
        cell: Cell | None = None
        try:
            if self.relay is not None:
                await asyncio.to_thread(self.relay.ensure)
            watch = _CellWatch(self._audit() if self._audit is not None else _shared_audit(), run, self.relay)
            run.hooks = RunHooks(run, self.recorder, self.intents.count_denial)
            # The secrets and the LLM key: an operator's run takes them from
            # the caller's shell (`stockade run` sends the variables the policy
            # names), the daemon's own environment filling in; a helper run
            # (asked for by an agent) never chooses: its daemon's only.
            given = opts["env"] if parent is None and opts["env"] is not None else {}
            run.gateway = await asyncio.to_thread(
                make_gateway,
                run,
                hooks=run.hooks,
                loop=self.loop,
                environ={**os.environ, **given},
                options=self.gateway_options,
            )
            if parent is not None and parent.gateway is not None:
                # And spends its parent's LLM budget (llm.max_requests, max_tokens).
                run.gateway.llm.share_usage(parent.gateway.llm)
            if parent is None and _family_limited(policy):
                run.family_cgroup = await asyncio.to_thread(_family_cgroup, run)
            cell = await asyncio.to_thread(
                _make_cell,
                policy,
                opts["workspace"],
                environ,
                run_id,
                sock_path,
                token,
                watch,
                run.gateway,
                opts["upper"],
                self.state_dir,
            )
            # Persistence reports go with the run's state, for `stockade revert`.
            cell.records = os.path.join(self.state_dir, "persistence")
            cell.cgroup_within = self._family_within(run if parent is None else parent)
            run.workspace = cell.workspace
            run.executor = IntentExecutor(
                policy,
                workspace=cell.workspace,
                run_workbench=lambda argv, p: self._workbench(run, argv, p),
                answer=lambda question: self._answer(run, question),
                hidden=(self.state_dir,),
                session_exec=lambda session, argv, timeout, cwd, output: self.session_exec(
                    run.id, session, argv, timeout, cwd, output
                ),
                session_for=lambda session: self.session_for(run.id, session),
            )
            uid, gid = _cell_identity(cell.workspace)
            run.close_broker = await self.host.open_broker(run, sock_path, uid, gid)
            await self.recorder.record_soon([run_start_event(run)])
        except BaseException as exc:
            if run.close_broker is not None:
                run.close_broker()
            if cell is not None:
                cell.close()
            if run.family_cgroup is not None:
                await asyncio.to_thread(_destroy_family, run)
            if run.gateway is not None:
                await run.gateway.close()
            _remove_quietly(run_dir)
            if isinstance(exc, StoreError):
                raise RequestError("unavailable", str(exc)) from exc
            if isinstance(exc, PolicyError):
                raise RequestError("bad_params", str(exc)) from exc
            if isinstance(exc, StockadeError):
                raise RequestError("unavailable", str(exc)) from exc
            raise
        self.runs[run.id] = run
        if parent is not None:
            parent.children.append(run.id)
            self._write_meta(parent)
        self._write_meta(run)
        thread = threading.Thread(
            target=self._run_cell, args=(run, cell), name=f"stockade-{run.id}", daemon=True
        )
        run.thread = thread
        thread.start()
        return run

    # ------------------------------------------------------------- the run's thread

    def _run_cell(self, run: Run, cell: Cell) -> None:
        """The run's own thread: it forks the cell and outlives it (death signal)."""
        cap = run.policy.limits.output or TRANSCRIPT_MAX
        fd = times = -1
        unwritable: list[OSError] = []

        def sink(stream: int, data: bytes) -> None:
            if unwritable:
                return  # the run is being halted; nothing more is kept
            room = cap - run.transcript_bytes
            if len(data) > room:
                data = data[: max(0, room)]
                run.transcript_truncated = True
            if not data:
                return
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.write(times, f"{run.transcript_bytes} {time.time():.6f} {stream}\n".encode())
            except OSError as exc:
                # A full or failing state disk: the transcript is part of the
                # run's record, so the run halts as it does when the store
                # cannot write, rather than going on unrecorded (or ending as
                # an internal error, which it is not).
                unwritable.append(exc)
                run.transcript_truncated = True
                self._soon(self._transcript_failed, run, exc)
                return
            offset = run.transcript_bytes
            run.transcript_bytes += len(data)
            self._soon(self._output, run, stream, offset, data)

        result: CellResult | None = None
        error = ""
        try:
            try:
                fd = _open_transcript(_paths.transcript_path(self.state_dir, run.id))
                # When each chunk came and from which stream: `stockade logs --timestamps`.
                times = _open_transcript(_paths.transcript_path(self.state_dir, run.id) + ".times")
            except OSError as exc:
                # (No inode left, no descriptor left.) As a write that fails:
                # the run halts, here before its cell starts, and still ends.
                self._soon(self._transcript_failed, run, exc)
                error = f"the run's transcript cannot be opened: {exc.strerror or exc}"
            else:
                if not run.kill_requested:
                    result = cell.run(list(run.argv) or None, on_output=sink, on_event=self._live_sink(run))
        except StockadeError as exc:
            error = str(exc)
        except BaseException as exc:  # a bug: say so, and still end the run
            error = f"internal error running the cell: {exc!r}"
        finally:
            for opened in (fd, times):
                if opened >= 0:
                    os.close(opened)
            cell.close()
            if cell.fresh and not run.children:
                # A fresh workspace is kept for the operator to look at, unless
                # the agent left nothing in it: then it would only pile up.
                # (Not while helpers may still have it mounted: removing a
                # directory detaches the mounts of it in their cells.)
                with contextlib.suppress(OSError):
                    os.rmdir(cell.workspace)
        if result is not None:
            try:
                self.recorder.record(result.not_live())
            except StoreError:
                pass  # on_failure has halted everything and said why
        self._soon(self._cell_ended, run, result, error)

    def _transcript_failed(self, run: Run, exc: OSError) -> None:
        """On the loop: a run whose transcript cannot be written is halted."""
        why = "its filesystem is full; free space on it" if exc.errno == errno.ENOSPC else exc.strerror
        path = _paths.transcript_path(self.state_dir, run.id)
        reason = f"the run's transcript cannot be written to {path}: {why}"
        if not self.refusing:
            # The state directory is what every run records into: no run
            # starts until it takes a write again (``_retry_state_dir``).
            self.refusing = f"the state directory cannot be written, so no run may start: {reason}"
        task = self.loop.create_task(self.halt(run, reason))
        self._cascades.add(task)
        task.add_done_callback(self._cascades.discard)

    def _live_sink(self, run: Run) -> Callable[[Event], None]:
        """``Cell.run``'s ``on_event`` for a run's cells: each event (``cell.start``,
        a kernel refusal) goes to the loop and into the record as it happens,
        from the audit reader's thread; a refusal counts toward the tripwire."""

        def sink(event: Event) -> None:
            self._soon(self._record_live, run, event)

        return sink

    def _record_live(self, run: Run, event: Event) -> None:
        """On the loop: store a cell's event now (in order with what the loop
        records next), then count a kernel refusal like a broker denial."""
        if event.kind != "cell.denied":
            self.recorder.record_then([event], _ignore)
            return

        def stored(result: list[StoredEvent] | BaseException) -> None:
            # Counted once durable, as an intent's denial is: the halt it may
            # cause is recorded after it.
            if isinstance(result, BaseException):
                return  # the store failed: on_failure has halted every run
            task = self.loop.create_task(self.intents.count_denial(run))
            self._cascades.add(task)
            task.add_done_callback(self._cascades.discard)

        self.recorder.record_then([event], stored)

    def _soon(self, fn: Callable[..., object], *args: object) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: the daemon is gone
            self.loop.call_soon_threadsafe(fn, *args)

    def _output(self, run: Run, stream: int, offset: int, data: bytes) -> None:
        for _dropped in self.bus.output(run.id, stream, offset, data):
            self.on_output_dropped(run.id)

    def _cell_ended(self, run: Run, result: CellResult | None, error: str) -> None:
        self.loop.create_task(self._finish(run, result, error))

    async def _finish(self, run: Run, result: CellResult | None, error: str) -> None:
        if run.close_broker is not None:
            run.close_broker()
            run.close_broker = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_paths.broker_socket_path(self.state_dir, run.id))
        await self.intents.close_approvals(run, "the run ended")
        if run.gateway is not None:
            await run.gateway.close()
        run.ended = time.time()
        run.exit_code = result.exit_code if result is not None else None
        run.error = error
        if run.halted:
            run.state = "halted"
        elif error:
            run.state = "failed"
        else:
            run.state = "ended"
        root = self.agents.root(run)
        family = [root, *self.agents.descendants(root)]
        # ``ended`` (set above, with no await since), not ``done``: two of the
        # family finishing at once each await before setting ``done``, and
        # each would see the other still running and leave the cgroup behind.
        if root.family_cgroup is not None and all(r.ended is not None for r in family):
            # The family's last cell has ended: its cgroup goes before the end is recorded.
            family_limits = await asyncio.to_thread(_destroy_family, root)
        else:
            family_limits = []
        end = run_end_event(run, result.cell_id if result is not None else "")
        self._write_meta(run)
        with contextlib.suppress(StoreError):
            ended = await self.recorder.record_soon([*family_limits, end])
            if ended:
                # The run's bundle carries the head at its end, for
                # `stockade verify --expect SEQ:HASH` later (docs/RECORD.md).
                head = {"seq": ended[-1].seq, "hash": ended[-1].hash}
                self._write_meta_dict({**run.info(), "record": head})
                if self.relay is not None:
                    self.relay.run_ended(run.id)
        self.bus.end_output(run.id, run.info())
        run.done.set()
        self.agents.ended(run)
        self._stop_helpers(run, grace=HELPER_GRACE, by=f"its parent {run.id} ended")

    def _family_within(self, run: Run) -> dict[str, str] | None:
        """Where the cells of ``run`` (of any run of its family) make their cgroups."""
        root = self.agents.root(run)
        return root.family_cgroup.nest() if root.family_cgroup is not None else None

    def _workbench(self, run: Run, argv: list[str], policy: Policy) -> CellResult:
        """``exec`` intents: a workbench cell in the run's workspace, from a worker
        thread that outlives it; its events are recorded before it returns."""
        from stockade.cell._cell import Cell

        if not run.workbench_slots.acquire(timeout=0):
            raise CellError(
                f"{WORKBENCHES_PER_RUN} exec intents of this run are running; wait for one to end"
            )
        try:
            if run.kill_requested:
                raise CellError(f"run {run.id} is stopping")
            audit = self._audit() if self._audit is not None else _shared_audit()
            records = os.path.join(self.state_dir, "persistence")
            with Cell(
                policy,
                run_id=run.id,
                audit=cast("AuditReader", _CellWatch(audit, run, self.relay)),
                records=records,
            ) as cell:
                cell.cgroup_within = self._family_within(run)
                result = cell.run(argv, on_event=self._live_sink(run))
            self.recorder.record(result.not_live())
            return result
        finally:
            run.workbench_slots.release()

    def _answer(self, run: Run, question: str) -> str | None:
        """``ask`` intents (a question for the operator), from a worker thread: an
        approval whose decision's reason is the answer; ``None`` when denied or unanswered."""
        approval = self.approvals.ask(
            run.id, "ask", {"question": question}, timeout=self.approval_timeout, unattended=run.unattended
        )
        if run.unattended:
            with run.lock:  # worker threads of several questions may be here at once
                run.unattended_denials += 1
        self.recorder.record([approval_event("approval.asked", run, approval)])
        if approval.state == "pending":
            approval = self.approvals.wait(approval.id, self.approval_timeout + 1.0)
            if approval.state == "pending":  # the clock stood still: close it ourselves
                with contextlib.suppress(ApprovalError):
                    approval = self.approvals.decide(
                        approval.id, "deny", by="timeout", reason="no answer in time"
                    )
        self.recorder.record([approval_event("approval.decided", run, approval)])
        return approval.reason if approval.state == "approved" else None

    # ------------------------------------------------------------------ stopping

    async def stop(self, run: Run, *, grace: float, by: str) -> None:
        """Ask the run's cells to end (SIGTERM), kill them after ``grace`` seconds, wait for the end;
        the same for every run it spawned, and theirs, at once."""
        await asyncio.gather(
            self._stop_one(run, grace=grace, by=by),
            *(
                self.stop(helper, grace=grace, by=f"{by} (with its parent {run.id})")
                for helper in self.agents.helpers(run)
                if not helper.done.is_set() or helper.children
            ),
        )

    def _stop_helpers(self, run: Run, *, grace: float, by: str) -> None:
        """Stop every run below ``run`` without waiting for them (a halt, an end)."""
        for helper in self.agents.helpers(run):
            if helper.done.is_set() and not helper.children:
                continue
            task = self.loop.create_task(self.stop(helper, grace=grace, by=by))
            self._cascades.add(task)
            task.add_done_callback(self._cascades.discard)

    async def _stop_one(self, run: Run, *, grace: float, by: str) -> None:
        if run.done.is_set():
            return
        if run.state == "running":
            run.state = "stopping"
            run.stopped_by = by
        if grace > 0:
            run.signal_cells(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(run.done.wait(), grace)
        run.signal_cells(signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(run.done.wait(), STOP_WAIT_EXTRA)

    async def halt(self, run: Run, reason: str) -> None:
        """Halt ``run``: kill its cells now, refuse every later intent. Records ``run.halted``."""
        if run.halted:
            return
        run.halted = reason
        run.state = "halted"
        run.signal_cells(signal.SIGKILL)
        self._stop_helpers(run, grace=0.0, by=f"its parent {run.id} was halted")
        halted = run_halted_event(run, reason)
        with contextlib.suppress(StoreError):
            await self.recorder.record_soon([halted])
        await self.intents.close_approvals(run, f"the run was halted: {reason}")

    def store_failed(self, exc: StoreError) -> None:
        """The store cannot write: refuse new runs, halt the running ones (their
        ``run.halted`` cannot be recorded; the daemon's log and the
        ``store.error`` event recorded once the store writes again say why)."""
        self.refusing = f"the event store cannot write, so no run may start: {exc}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        with (
            contextlib.suppress(OSError),
            open(os.open(_paths.store_error_path(self.state_dir), flags, 0o600), "w") as f,
        ):
            json.dump({"error": str(exc), "time": time.time(), "path": getattr(exc, "path", "")}, f)
        for run in self.runs.values():
            if not run.done.is_set():
                run.halted = f"the event store cannot write: {exc}"
                run.state = "halted"
                run.signal_cells(signal.SIGKILL)
        self.intents.deny_waiting(str(exc))

    def _retry_state_dir(self) -> None:
        """Before a run starts while a transcript could not be written: a
        probe written and synced in the state directory clears the refusal.

        Raises:
            RequestError: ``unavailable``, the probe could not be written.
        """
        probe = os.path.join(self.state_dir, ".write-probe")
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, b"\0" * 65536)
                os.fsync(fd)
            finally:
                os.close(fd)
                os.unlink(probe)
        except OSError as exc:
            raise RequestError("unavailable", f"{self.refusing} (still: {exc.strerror})") from exc
        self.refusing = ""

    async def _retry_store(self) -> None:
        """Before a run starts while the store is failed: try it again, recording
        the failure (``store.error``); refuse the run if it still cannot write.

        Raises:
            RequestError: ``unavailable``.
        """
        event = noted_store_error(self.state_dir)
        if event is None:
            failure = self.recorder.failure
            event = store_error_event(str(failure), time.time(), getattr(failure, "path", ""))
        try:
            await self.recorder.retry([event])
        except StoreError as exc:
            raise RequestError(
                "unavailable", self.refusing or f"the event store cannot write: {exc}"
            ) from exc
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_paths.store_error_path(self.state_dir))
        self.refusing = ""

    async def stop_all(self, grace: float) -> None:
        await asyncio.gather(
            *(self.stop(r, grace=grace, by="daemon") for r in self.runs.values() if not r.done.is_set())
        )
        for run in self.runs.values():
            if run.thread is not None:
                await asyncio.to_thread(run.thread.join, STOP_WAIT_EXTRA)
        self._workbench_pool.shutdown(wait=False, cancel_futures=True)


# --------------------------------------------------------------------------- helpers


def _start_params(params: Mapping[str, Any]) -> dict[str, Any]:
    path, text = params.get("policy_path"), params.get("policy_text")
    if (path is None) == (text is None):
        raise RequestError("bad_params", "give exactly one of 'policy_path' and 'policy_text'")
    if path is not None and (not isinstance(path, str) or not os.path.isabs(path)):
        raise RequestError("bad_params", f"'policy_path' must be an absolute path, not {path!r}")
    if text is not None and not isinstance(text, str):
        raise RequestError("bad_params", "'policy_text' must be a string of YAML")
    argv = params.get("argv")
    if argv is not None and not (isinstance(argv, list) and all(isinstance(a, str) for a in argv)):
        raise RequestError("bad_params", "'argv' must be a list of strings")
    workspace = params.get("workspace")
    if workspace is not None and (not isinstance(workspace, str) or not os.path.isabs(workspace)):
        raise RequestError("bad_params", f"'workspace' must be an absolute path, not {workspace!r}")
    if workspace is not None and not os.path.isdir(workspace):
        raise RequestError(
            "bad_params",
            f"the workspace {workspace!r} is not a directory; create it, or leave 'workspace' out "
            "for a fresh one",
        )
    if workspace is not None:
        # The check of a policy's workspace, Cell(workspace=...) and exec -w.
        from stockade.policy._workspace import workspace_problem

        why = workspace_problem(workspace)
        if why is not None:
            raise RequestError("bad_params", f"workspace {os.path.normpath(workspace)!r} {why}")
    name = params.get("name")
    if name is not None and not (isinstance(name, str) and _RUN_NAME.fullmatch(name)):
        raise RequestError(
            "bad_params",
            f"'name' {name!r} is not a run name; use 1 to 128 letters, digits, '.', '_', '-' or '/', "
            "starting with a letter or digit",
        )
    env = params.get("env")
    if env is not None and not (
        isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    ):
        raise RequestError("bad_params", "'env' must map names to strings")
    for flag in ("detach", "unattended"):
        if not isinstance(params.get(flag, False), bool):
            raise RequestError("bad_params", f"'{flag}' must be true or false")
    upper = upper_param(params)
    return {
        "policy_path": path,
        "policy_text": text,
        "argv": argv,
        "workspace": workspace,
        "env": env,
        "detach": bool(params.get("detach", False)),
        "unattended": bool(params.get("unattended", False)),
        "name": name,
        "upper": upper,
    }


def upper_param(params: Mapping[str, Any]) -> str | None:
    """``upper``: where an image cell keeps its upper layer (``Cell(upper_dir=)``),
    an absolute path that is a directory or does not exist yet; a later cell given
    the same one continues from it (a bench's verifier sees what its agent changed)."""
    upper = params.get("upper")
    if upper is None:
        return None
    if not isinstance(upper, str) or not os.path.isabs(upper) or "\0" in upper:
        raise RequestError("bad_params", f"'upper' must be an absolute path, not {upper!r}")
    if os.path.islink(upper) or (os.path.lexists(upper) and not os.path.isdir(upper)):
        raise RequestError(
            "bad_params", f"'upper' {upper!r} is not a directory; name a directory, or one not made yet"
        )
    # An upper holds the image's own owners on disk (a setuid-root program
    # the agent made, as root of its workbench, is one on the host too), and
    # the daemon chowns it to root: so it must lie in a directory that only
    # the daemon's user can enter, which only that user can have made.
    parent = os.path.dirname(os.path.normpath(upper))
    try:
        st = os.lstat(parent)
    except OSError as exc:
        raise RequestError(
            "bad_params",
            f"'upper' {upper!r}: its directory {parent!r} cannot be read ({exc.strerror}); make it first",
        ) from exc
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise RequestError(
            "bad_params",
            f"'upper' {upper!r} is in {parent!r}, which is not a directory of the daemon's user (uid "
            f"{os.geteuid()}) closed to others (mode {stat.S_IMODE(st.st_mode):o}); make its directory "
            "with mode 0700 as that user",
        )
    return upper


def _load_policy(opts: Mapping[str, Any], environ: Mapping[str, str]) -> Policy:
    from stockade.policy import load_policy, loads_policy

    try:
        if opts["policy_path"] is not None:
            return load_policy(opts["policy_path"], environ=environ)
        return loads_policy(opts["policy_text"], source="<run.start>", environ=environ)
    except PolicyError as exc:
        raise RequestError("bad_params", str(exc)) from exc


def _make_cell(
    policy: Policy,
    workspace: str | None,
    environ: Mapping[str, str],
    run_id: str,
    sock_path: str,
    token: str,
    watch: _CellWatch,
    gateway: Gateway | None,
    upper: str | None = None,
    state_dir: str | None = None,
) -> Cell:
    from stockade.cell._cell import Cell

    image = None
    if policy.image is not None and state_dir is not None:
        # The policy's image from this daemon's store (its --state), not the
        # default state directory's, where Cell would look by itself.
        from stockade.image import default_store

        image = default_store(state_dir).get(policy.image)

    env = {"STOCKADE_BROKER": _paths.BROKER_IN_CELL, "STOCKADE_TOKEN": token, "STOCKADE_RUN": run_id}
    files = _agent_sdk()
    if files and "PYTHONPATH" not in dict(policy.env.set):
        env["PYTHONPATH"] = IN_CELL_DIR
    return Cell(
        policy,
        workspace=workspace,
        audit=cast("AuditReader", watch),
        keep_workspace=True,
        environ=environ,
        run_id=run_id,
        sockets={_paths.BROKER_IN_CELL: sock_path},
        extra_env=env,
        files=files,
        network=gateway,
        upper_dir=upper,
        image=image,
    )


_SDK: dict[str, bytes] | None = None


def _agent_sdk() -> dict[str, bytes]:
    """The agent SDK (one standard-library module) as the cell sees it, read once."""
    global _SDK
    if _SDK is None:
        try:
            with open(MODULE_PATH, "rb") as f:
                _SDK = {f"{IN_CELL_DIR}/stockade_agent.py": f.read()}
        except FileNotFoundError:
            _SDK = {}
    return _SDK


def _gateway_options() -> GatewayOptions:
    from stockade.gateway import GatewayOptions

    return GatewayOptions.from_env(os.environ)


def _family_limited(policy: Policy) -> bool:
    limits = policy.limits
    return limits.memory is not None or limits.pids is not None or limits.cpu is not None


def _open_transcript(path: str) -> int:
    """A descriptor that appends to one of a run's transcript files."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)


def _family_cgroup(run: Run) -> CellCgroup:
    """The cgroup a root run's family lives in, with the root's limits: its
    own cell and every helper's (and their workbenches') are made inside it,
    so the kernel holds them all together to what the root was given. At
    spawn, ``Agents`` refuses a helper that would pass it with its own
    limits; this is what holds when helpers' processes all grow at once."""
    from stockade.cell._cgroup import CellCgroup

    return CellCgroup.create(f"{run.id}.family", run.policy.limits)


def _destroy_family(run: Run) -> list[Event]:
    """Destroy a root run's family cgroup; a ``cell.limit`` event (of the
    root run) for each of the family's limits the kernel enforced on the
    family as a whole, which no cell's own counters show (the limit was the
    family's, not the cell's)."""
    cgroup, run.family_cgroup = run.family_cgroup, None
    if cgroup is None:
        return []
    stats = cgroup.stats()
    with contextlib.suppress(CellError):  # the next start's sweep removes what is left
        cgroup.destroy()
    limits = run.policy.limits
    found = []
    if stats.pids_peak_at_max:  # its cells' pids.events count the refused forks, not its own
        found.append(f"process limit of {limits.pids} reached: a fork was refused")
    if stats.oom_killed:
        found.append(f"memory limit of {limits.memory} bytes reached: a process was killed")
    return [
        Event(
            kind="cell.limit",
            cell="",
            layer="cgroup",
            outcome="denied",
            run=run.id,
            summary=f"the family of run {run.id} (it and its helpers together, held to its limits): {what}",
            detail={"family": run.id},
        )
        for what in found
    ]


def _shared_audit() -> AuditReader:
    from stockade.cell._cell import shared_audit_reader

    return shared_audit_reader()


def _ignore(result: object) -> None:
    """A live event's ``record_then``: a store failure halts every run by itself."""


def _remove_quietly(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


__all__ = ["LOG_MAX", "BrokerHost", "RequestError", "Run", "RunState", "Runs"]
