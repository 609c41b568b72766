"""Where a harness sample's sessions live: in the daemon when one runs, else here.

A sample (an Inspect sample, a Harbor trial) has one record and one or more
workbench sessions (Harbor's agent and verifier phases). ``start_sample``
picks the host once, at the sample's start:

- **a daemon runs** for the state directory (its socket answers ``status``):
  the sample is a run of the daemon (``run.start``, named
  ``<harness>/<task>``, so ``stockade ps`` lists it while it lives) and each
  session is a daemon-hosted session bound to that run (``session.open``
  with ``run`` and a policy of its own, so the session has its own gateway).
  Every event goes into the daemon's store and onto its live stream as it
  happens, with the run's id; the report's events are read back from the
  store (``events.export``) at the end. The run's own cell is a placeholder
  that waits (``sleep infinity`` under a minimal policy): a run is what the
  daemon lists, stops and records, and a harness sample has no agent process
  of its own to be it.
- **no daemon runs**: the sessions live in this process
  (``stockade.cell.Session``), their events are collected here and appended
  to the store at the end (``_record.Landing``), which is then this process's to
  write.

The daemon path costs a round trip per call through the control socket
(docs/PERFORMANCE.md); the in-process path is for machines without a daemon.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from stockade.daemon import _paths
from stockade.errors import DaemonError, RemoteError, UsageError
from stockade.harness._record import Landing, SampleRecord
from stockade.harness._workbench import ExecResult, Workbench, open_workbench
from stockade.policy import Policy
from stockade.record import Event

CONNECT_TIMEOUT = 5.0
"""Seconds the harness waits for a daemon's ``status`` before deciding none runs."""
CALL_TIMEOUT = 120.0
"""Seconds one control request may take (a session call adds its own timeout)."""
CALLS_AT_ONCE = 30
"""Calls this process has in flight in one daemon session: under the daemon's
32 per session (``session.max_calls``), so a busy eval waits here, not refused."""
HOLDER_COMMAND = ("/bin/sleep", "infinity")
"""The placeholder process of a sample's run (see the module's docstring)."""


class SampleHost(Protocol):
    """One sample's sessions and record."""

    via: str
    """``"daemon"`` or ``"process"``: where the sessions live."""
    record: SampleRecord

    def open(self, policy: Policy, *, upper: str | None = None) -> Workbench:
        """A session under ``policy`` (an image named by ``policy.image``);
        on an image, its upper layer kept in ``upper`` (a directory, or one
        not made yet), from which a later session given it continues.

        Raises:
            StockadeError: the session cannot start (a bad policy, a missing
                image, a daemon that refused).
        """
        ...

    def close(self, workbench: Workbench) -> None:
        """End ``workbench`` (every process in it dies); its events join the record."""
        ...

    def finish(self, *, later: Callable[[Callable[[], None]], None] | None = None) -> dict[str, Any]:
        """End the sample: its record into the store. Returns where it is, for the report.

        ``later``: what may end after the report (a daemon run's placeholder,
        which holds nothing of the sample's) is handed to it instead of being
        waited for; the record the report gives is complete without it.
        """
        ...


def start_sample(*, harness: str, task: str, sample: str, state: str | None) -> SampleHost:
    """The host of a new sample: the daemon of ``state`` (the default state
    directory when None) when it runs, else this process.

    Raises:
        DaemonError, RemoteError: a daemon runs and refused the sample's run.
    """
    chosen = state or _paths.state_dir()
    socket = daemon_socket(chosen)
    if socket is not None:
        return DaemonHost(socket, harness=harness, task=task, sample=sample)
    return ProcessHost(
        SampleRecord(_paths.new_run_id(), harness=harness, task=task, sample=sample), state=state
    )


def daemon_socket(state: str) -> str | None:
    """The socket of a daemon serving ``state``, or None when none answers there."""
    from stockade.daemon._client import Client

    path = _paths.socket_path(state=state)
    try:
        with Client(path, timeout=CONNECT_TIMEOUT) as client:
            client.call("status")
    except DaemonError:
        return None
    return path


# --------------------------------------------------------------------------- in this process


class ProcessHost:
    """Sessions in this process; the record appended to the store at the end."""

    via = "process"

    def __init__(self, record: SampleRecord, *, state: str | None) -> None:
        self.record = record
        self._state = state
        self._landing: Landing | None = None

    def prepare_finish(self) -> None:
        """Open the store for ``finish`` now, in a thread, while the last
        session closes (its open replays and flushes the journal, a few
        fsyncs). Call ``finish`` or ``abandon_finish`` after it."""
        if self._landing is None:
            self._landing = Landing(self._state, ahead=True)

    def abandon_finish(self) -> None:
        landing, self._landing = self._landing, None
        if landing is not None:
            landing.abandon()

    def open(self, policy: Policy, *, upper: str | None = None) -> Workbench:
        return open_workbench(
            policy, run_id=self.record.run_id, on_event=self.record.add, state=self._state, upper=upper
        )

    def close(self, workbench: Workbench) -> None:
        self.record.extend(workbench.close().events)

    def finish(self, *, later: Callable[[Callable[[], None]], None] | None = None) -> dict[str, Any]:
        landing, self._landing = self._landing, None
        # Opened now when prepare_finish was not called; its close handed to later either way.
        landed = (landing or Landing(self._state)).land(self.record, later=later)
        return {"via": "process", **landed}


# --------------------------------------------------------------------------- in the daemon


class DaemonHost:
    """The sample as a run of the daemon, its sessions hosted there."""

    via = "daemon"

    def __init__(self, socket: str, *, harness: str, task: str, sample: str) -> None:
        from stockade.daemon._client import Client

        self._socket = socket
        self._client = Client(socket, timeout=CALL_TIMEOUT)
        try:
            status = self._client.call("status")
            self._state = str(status.get("state") or "")
            info = self._client.call(
                "run.start",
                policy_text=json.dumps(_holder_policy(f"{harness}-{_name_part(task)}")),
                unattended=True,
                name=f"{harness}/{_name_part(task)}",
            )
        except BaseException:
            self._client.close()
            raise
        self.run_id = str(info["id"])
        self.record = SampleRecord(self.run_id, harness=harness, task=task, sample=sample)
        self._open: list[_RemoteWorkbench] = []
        self._finished = False

    def open(self, policy: Policy, *, upper: str | None = None) -> Workbench:
        text = json.dumps(policy_document(dataclasses.replace(policy, image=None)))
        try:
            remote = self._client.open_session(
                run=self.run_id,
                policy_text=text,
                image=policy.image,
                upper=upper if policy.image is not None else None,
            )
        except RemoteError as exc:
            if exc.code == "bad_params":
                raise UsageError(str(exc)) from exc
            raise
        workbench = _RemoteWorkbench(self._socket, remote.info)
        self._open.append(workbench)
        return workbench

    def alive(self, workbench: Workbench) -> bool:
        """Whether ``workbench`` is still open in the daemon (a spare that
        waited for its sample: the daemon may have stopped meanwhile)."""
        wanted = getattr(workbench, "session_id", None)
        try:
            return any(s["session"] == wanted for s in self._client.sessions(self.run_id))
        except (DaemonError, RemoteError, OSError):
            return False

    def close(self, workbench: Workbench) -> None:
        # The session's events are in the daemon's store already, with the
        # run's id: the record reads them back at the end (finish).
        workbench.close()
        if workbench in self._open:
            self._open.remove(workbench)

    def finish(self, *, later: Callable[[Callable[[], None]], None] | None = None) -> dict[str, Any]:
        if self._finished:
            raise UsageError(f"the sample of run {self.run_id} has finished already; start another one")
        self._finished = True
        stopped = False
        try:
            for workbench in list(self._open):
                with contextlib.suppress(DaemonError, RemoteError):
                    self.close(workbench)
            if later is None:
                # The placeholder ends now; run.stop answers once the run's end
                # is stored, so the export below holds every event of the run.
                self._client.call("run.stop", run=self.run_id, grace=0)
                stopped = True
            # Without it: every session of the sample is closed, and a
            # session.close answers once its events are stored (its cell's end,
            # kernel refusals, persistence report, gateway requests), so the
            # export holds every event of the sample; the run's own end (its
            # placeholder's) is stored once ``later`` has run.
            events = _export(self._client, self.run_id)
        except BaseException:
            self._stop_run()
            raise
        if stopped:
            self._client.close()
        else:
            assert later is not None
            later(self._stop_run)
        local = [e for e in self.record.events() if e.kind.startswith("harness.")]
        self.record.replace([event for _, event in events] + local)
        store = _paths.store_path(self._state) if self._state else None
        seqs = [seq for seq, _ in events]
        return {
            "via": "daemon",
            "daemon": self._socket,
            "store": store,
            "first_seq": min(seqs) if seqs else None,
            "last_seq": max(seqs) if seqs else None,
            "run_end": "stored" if stopped else "stored after this report (the run's placeholder ends then)",
            "verify": f"stockade verify --db {store}" if store else "stockade verify",
            "export": f"stockade export --run {self.run_id}",
            "not_in_store": [e.kind for e in local],
        }

    def _stop_run(self) -> None:
        """End the run's placeholder and let the connection go (idempotent)."""
        try:
            with contextlib.suppress(DaemonError, RemoteError):
                self._client.call("run.stop", run=self.run_id, grace=0)
        finally:
            self._client.close()


def _export(client: Any, run_id: str) -> list[tuple[int, Event]]:
    """Every stored event of ``run_id``, with its sequence number, in order."""
    found: list[tuple[int, Event]] = []
    after = 0
    while True:
        page = client.call("events.export", run=run_id, format="jsonl", after_seq=after)
        for line in str(page.get("data", "")).splitlines():
            if line.strip():
                stored = json.loads(line)
                found.append((int(stored["seq"]), _event(stored["event"])))
        after = int(page.get("last_seq") or after)
        if not page.get("more"):
            return found


def _event(d: Mapping[str, Any]) -> Event:
    return Event(
        kind=str(d["kind"]),
        cell=str(d.get("cell", "")),
        layer=d.get("layer", "cell"),
        outcome=d.get("outcome", "info"),
        detail=dict(d.get("detail") or {}),
        time=float(d.get("time", 0.0)),
        summary=str(d.get("summary", "")),
        run=str(d.get("run", "")),
    )


def _name_part(task: str) -> str:
    """``task`` as a part of a run name (letters, digits, ``.``, ``_``, ``-``)."""
    kept = "".join(c if c.isalnum() or c in "._-" else "-" for c in task).strip("-")
    return (kept or "task")[:100]


def _holder_policy(name: str) -> dict[str, Any]:
    """The run's placeholder: ``sleep`` in a cell with nothing but the
    system's read-only directories, no network, no time limit (the sample
    ends it), and a tripwire high enough that the sample's own policy, not
    the placeholder's default, decides when refusals are too many."""
    return {
        "name": name,
        "command": list(HOLDER_COMMAND),
        "limits": {"timeout": None, "memory": "64M", "pids": 8, "denials": 100000},
    }


class _RemoteWorkbench:
    """A daemon-hosted session, usable from many threads at once: each call
    takes a connection of the pool (a ``RemoteSession`` is one connection's,
    not thread-safe), at most ``CALLS_AT_ONCE`` at a time."""

    def __init__(self, socket: str, info: dict[str, Any]) -> None:
        self._socket = socket
        self._info = info
        self.socket = socket
        """The daemon's socket (``stockade session shell --socket``)."""
        self.session_id = str(info["session"])
        self._idle: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._clients: list[Any] = []
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(CALLS_AT_ONCE)
        self._closed = False

    @contextlib.contextmanager
    def _remote(self) -> Iterator[Any]:
        from stockade.daemon._client import Client, RemoteSession

        with self._slots:
            try:
                remote = self._idle.get_nowait()
            except queue.Empty:
                client = Client(self._socket, timeout=CALL_TIMEOUT)
                with self._lock:
                    self._clients.append(client)
                remote = RemoteSession(client, self._info)
            try:
                yield remote
            except RemoteError as exc:
                # The in-process session raises UsageError for a bad argument
                # (another user without a root workbench, a file over the
                # limit); the harnesses handle that, so it is said the same way.
                if exc.code == "bad_params":
                    raise UsageError(str(exc)) from exc
                raise
            finally:
                self._idle.put(remote)

    def exec(
        self,
        argv: Sequence[str],
        *,
        input: bytes | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | int | None = None,
        timeout: float | None = None,
        output_limit: int | None = None,
    ) -> ExecResult:
        with self._remote() as remote:
            result: ExecResult = remote.exec(
                list(argv),
                input=input,
                cwd=cwd,
                env=dict(env) if env is not None else None,
                user=user,
                timeout=timeout,
                output_limit=output_limit,
            )
            return result

    def read_file(self, path: str, *, user: str | int | None = None, limit: int | None = None) -> bytes:
        with self._remote() as remote:
            data: bytes = remote.read_file(path, user=user, limit=limit)
            return data

    def write_file(
        self, path: str, data: bytes, *, user: str | int | None = None, mode: int | None = None
    ) -> None:
        with self._remote() as remote:
            remote.write_file(path, data, user=user, mode=mode)

    def set_network(self, allow: list[dict[str, Any]]) -> list[str]:
        """``session.set_network``: the session's gateway allows ``allow`` from now on."""
        with self._remote() as remote:
            hosts: list[str] = remote.set_network(allow)
            return hosts

    def close(self) -> Any:
        if self._closed:
            return None
        self._closed = True
        try:
            with self._remote() as remote:
                return remote.close()
        finally:
            with self._lock:
                for client in self._clients:
                    client.close()
                self._clients.clear()


# --------------------------------------------------------------------------- a policy as a document


def policy_document(policy: Policy) -> dict[str, Any]:
    """``policy`` as a policy document the loader reads back to the same
    ``Policy`` (``session.open``'s ``policy_text``): every list spelled out
    (``base: none``), every limit given (``null``: none)."""
    doc: dict[str, Any] = _without_nulls(dataclasses.asdict(policy))
    doc.pop("source", None)
    if not policy.command:
        doc.pop("command", None)
    doc["filesystem"]["base"] = "none"
    doc["env"] = {"base": "none", "pass": list(policy.env.passthrough), "set": dict(policy.env.set)}
    limits = dataclasses.asdict(policy.limits)
    if policy.limits.disk is None:
        limits.pop("disk")
    else:
        limits["disk"] = _without_nulls(limits["disk"])
    doc["limits"] = limits
    for tool, rule in zip(doc.get("tools", []), policy.tools, strict=True):
        tool["match"] = dict(rule.match)
    return doc


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_without_nulls(v) for v in value]
    return value


__all__ = ["DaemonHost", "ProcessHost", "SampleHost", "daemon_socket", "policy_document", "start_sample"]
