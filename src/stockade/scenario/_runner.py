"""Running a scenario over the daemon's protocol, and stopping one.

Three parts, from the inside out:

- ``Scheduler``, without I/O: which runs to start now, which to skip and why,
  what a run's end means (success, a crash to restart, a failure), and the
  scenario's exit code. It is fed what happened and answers what to do.
- ``Group``, the scenario's file in the daemon's state directory
  (``<state>/scenarios/<name>.json``): which runs it started, whether it is
  being stopped. A lock is held from deciding to start a run until its id is
  written, so ``stop_group`` sees every run the scenario ever started, and
  nothing starts after it set ``stopping``.
- ``ScenarioRunner``, the driver: it subscribes to the daemon's events first
  (so no ``run.end`` can be missed), then starts runs with ``run.start`` as the
  scheduler says and feeds it each ``run.end``.

**When a run is restarted**: when its agent's ``restart.max`` allows, and the
run ended on its own with an exit code other than 0 (a crash, or a signal:
137 for a memory or time limit). Not when it was **halted** by its tripwire
(the policy said this agent must stop; a restart would give it a fresh
budget of denials), not when its cell **could not start** (the same host or
policy problem would recur), and not when someone **stopped** it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from stockade.daemon._client import Client, RemoteError
from stockade.errors import DaemonError, ScenarioBusy, ScenarioError, ScenarioNotFound, StockadeError
from stockade.policy._schema import check_name
from stockade.policy._units import show
from stockade.scenario._model import Agent, Scenario, run_variables

UnitState = Literal["waiting", "starting", "running", "succeeded", "failed", "skipped", "stopped"]
FINAL: frozenset[str] = frozenset(("succeeded", "failed", "skipped", "stopped"))

EXIT_OK = 0
EXIT_FAILED = 1
"""An agent failed (after its restarts), or could not start."""
EXIT_STOPPED = 130
"""The scenario was stopped (``stockade scenario stop``, Ctrl-C)."""


# --------------------------------------------------------------------------- scheduling, no I/O


@dataclass(slots=True)
class Unit:
    """One run slot of an agent (one replica) across its restarts."""

    agent: str
    name: str
    replica: int
    state: UnitState = "waiting"
    run_id: str = ""
    runs: list[str] = field(default_factory=list)
    restarts: int = 0
    exit_code: int | None = None
    denials: int = 0
    note: str = ""
    _past_denials: int = 0


@dataclass(frozen=True, slots=True)
class Ended:
    """How a run ended, from its ``run.end`` event's detail (or ``run.list``)."""

    state: str
    exit_code: int | None
    error: str = ""
    halted: str = ""
    stopped_by: str = ""
    denials: int = 0

    @classmethod
    def from_detail(cls, detail: dict[str, Any]) -> Ended:
        code = detail.get("exit_code")
        return cls(
            state=str(detail.get("state", "")),
            exit_code=code if isinstance(code, int) else None,
            error=str(detail.get("error") or detail.get("reason") or ""),
            halted=str(detail.get("halted") or ""),
            stopped_by=str(detail.get("stopped_by") or ""),
            denials=int(detail.get("denials") or 0),
        )


class Scheduler:
    """The scenario's state: what to start, what each end means. No I/O."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.units: dict[str, Unit] = {}
        self._of: dict[str, list[Unit]] = {}
        for agent in scenario.agents:
            units = [Unit(agent.name, name, i) for i, name in enumerate(agent.unit_names(), 1)]
            self._of[agent.name] = units
            self.units.update((u.name, u) for u in units)
        self._by_run: dict[str, Unit] = {}
        self.stopping = ""

    @property
    def done(self) -> bool:
        return all(u.state in FINAL for u in self.units.values())

    def exit_code(self) -> int:
        if self.stopping:
            return EXIT_STOPPED
        return EXIT_FAILED if any(u.state == "failed" for u in self.units.values()) else EXIT_OK

    def outcome(self, agent: str) -> str | None:
        """``succeeded``, ``failed``, ``skipped``, ``stopped``; None while any of its runs is not over."""
        states = {u.state for u in self._of[agent]}
        if not states <= FINAL:
            return None
        for word in ("stopped", "failed", "succeeded"):
            if word in states:
                return word
        return "skipped"

    def advance(self) -> list[Unit]:
        """The units to start now (marked ``starting``); skips those whose condition failed."""
        if self.stopping:
            return []
        start: list[Unit] = []
        changed = True
        while changed:
            changed = False
            for agent in self.scenario.agents:
                waiting = [u for u in self._of[agent.name] if u.state == "waiting"]
                if not waiting:
                    continue
                outcomes = {d: self.outcome(d) for d in agent.depends_on}
                if any(o is None for o in outcomes.values()):
                    continue
                reason = _skip_reason(agent, outcomes)
                for unit in waiting:
                    if reason:
                        unit.state, unit.note = "skipped", reason
                        changed = True
                    else:
                        unit.state = "starting"
                        start.append(unit)
        return start

    def started(self, unit: Unit, run_id: str) -> None:
        unit.state, unit.run_id = "running", run_id
        unit.runs.append(run_id)
        unit.exit_code = None
        self._by_run[run_id] = unit

    def start_failed(self, unit: Unit, message: str) -> None:
        unit.state, unit.note = "failed", f"could not start: {message}"

    def unit_of(self, run_id: str) -> Unit | None:
        return self._by_run.get(run_id)

    def denied(self, run_id: str) -> Unit | None:
        """A denial of a live run: counted at once (the final count comes with its end)."""
        unit = self._by_run.get(run_id)
        if unit is None or unit.run_id != run_id or unit.state != "running":
            return None
        unit.denials += 1
        return unit

    def ended(self, run_id: str, end: Ended) -> Unit | None:
        """Run ``run_id`` ended: the unit is over, or waiting to be restarted."""
        unit = self._by_run.get(run_id)
        if unit is None or unit.run_id != run_id or unit.state != "running":
            return None
        unit.exit_code = end.exit_code
        unit._past_denials += end.denials
        unit.denials = unit._past_denials
        agent = self.scenario.agent(unit.agent)
        if self.stopping and not (end.exit_code == 0 and end.state == "ended" and not end.stopped_by):
            unit.state, unit.note = "stopped", self.stopping
        elif end.state == "failed" or end.state == "lost":
            unit.state, unit.note = "failed", f"the run {end.state}: {end.error}"
        elif end.halted:
            unit.state, unit.note = "failed", f"halted by its tripwire, not restarted: {end.halted}"
        elif end.stopped_by:
            unit.state, unit.note = "failed", f"stopped by {end.stopped_by}"
        elif end.exit_code == 0:
            unit.state, unit.note = "succeeded", ""
        elif unit.restarts < agent.restart_max:
            unit.restarts += 1
            unit.state = "waiting"
            unit.note = f"exit code {end.exit_code}: restart {unit.restarts} of {agent.restart_max}"
        else:
            unit.state = "failed"
            unit.note = f"exit code {end.exit_code}" + (
                f"; restarts used up ({unit.restarts} of {agent.restart_max})" if agent.restart_max else ""
            )
        return unit

    def stop(self, reason: str) -> list[Unit]:
        """Start nothing more; the units not started are ``stopped``. The running ones, to stop."""
        self.stopping = self.stopping or reason
        running = []
        for unit in self.units.values():
            if unit.state in ("waiting", "starting"):
                unit.state, unit.note = "stopped", f"not started: {self.stopping}"
            elif unit.state == "running":
                running.append(unit)
        return running


def _skip_reason(agent: Agent, outcomes: dict[str, str | None]) -> str:
    """Why ``agent`` will not start given its dependencies' outcomes; '' if it starts."""
    if not outcomes or agent.launch_when == "always":
        return ""
    if agent.launch_when == "success":
        bad = [f"{d} {o}" for d, o in outcomes.items() if o != "succeeded"]
        return f"{', '.join(bad)} (launch_when: success)" if bad else ""
    failed = [d for d, o in outcomes.items() if o == "failed"]
    return "" if failed else "no dependency failed (launch_when: failure)"


# --------------------------------------------------------------------------- the group file


def _group_dir(state_dir: str) -> str:
    return os.path.join(state_dir, "scenarios")


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        pass
    return True


class Group:
    """A scenario instance's file, ``<state>/scenarios/<name>.json``, under a lock."""

    def __init__(self, state_dir: str, name: str) -> None:
        check_name(name)  # a name is a file name here: never a path
        self.name = name
        self.path = os.path.join(_group_dir(state_dir), f"{name}.json")
        self._lock_path = os.path.join(_group_dir(state_dir), f"{name}.lock")

    def exists(self) -> bool:
        return os.path.exists(self.path)

    def read(self) -> dict[str, Any]:
        with open(self.path, encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}

    @contextlib.contextmanager
    def locked(self) -> Iterator[dict[str, Any]]:
        """The group's data under an exclusive lock; written back (atomically) on exit."""
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                data = self.read()
            except (FileNotFoundError, ValueError):
                data = {}
            before = json.dumps(data, sort_keys=True)
            yield data
            if json.dumps(data, sort_keys=True) != before:
                tmp = self.path + ".tmp"
                with open(
                    os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600), "w"
                ) as f:
                    json.dump(data, f, indent=1)
                os.replace(tmp, self.path)
        finally:
            os.close(fd)

    def begin(self, scenario: Scenario) -> None:
        """Claim the name for this process.

        Raises:
            ScenarioBusy: a live process runs a scenario of this name.
        """
        with self.locked() as data:
            busy = _busy(self.name, data)
            if busy:
                raise ScenarioBusy(busy)
            data.clear()
            data.update(
                name=self.name,
                scenario=scenario.name,
                file=scenario.source,
                pid=os.getpid(),
                started=time.time(),
                ended=None,
                exit_code=None,
                stopping="",
                runs=[],
            )

    def finish(self, exit_code: int) -> None:
        with self.locked() as data:
            data.update(ended=time.time(), exit_code=exit_code)


def _busy(name: str, data: dict[str, Any]) -> str:
    if data and data.get("ended") is None and _alive(data.get("pid")):
        return (
            f"a scenario named {show(name)} is already running (pid {data.get('pid')}); "
            f"stop it with `stockade scenario stop {name}`, or give this one --name"
        )
    return ""


def group_busy(group: Group) -> str:
    """Why ``group``'s name cannot be run now (a live runner has it); '' when it can."""
    with group.locked() as data:
        return _busy(group.name, data)


def list_groups(state_dir: str) -> list[dict[str, Any]]:
    """Every scenario run under ``state_dir``, oldest first; ``live``: whether its runner lives."""
    out = []
    with contextlib.suppress(FileNotFoundError):
        for entry in sorted(os.listdir(_group_dir(state_dir))):
            if entry.endswith(".json"):
                with contextlib.suppress(OSError, ValueError):
                    data = Group(state_dir, entry[: -len(".json")]).read()
                    data["live"] = data.get("ended") is None and _alive(data.get("pid"))
                    out.append(data)
    return sorted(out, key=lambda d: float(d.get("started") or 0))


def stop_group(
    state_dir: str, name: str, socket_path: str, *, grace: float = 10.0, by: str = "scenario stop"
) -> list[dict[str, Any]]:
    """Stop scenario ``name``: nothing more starts, and every run it started is
    stopped, with the helpers those spawned (their ``parent``; the daemon stops
    them with their parent too); the final ``run.list`` entries of the runs
    that were still live.

    Raises:
        ScenarioNotFound: no scenario of that name.
        DaemonError, RemoteError: as ``Client.call``.
    """
    group = Group(state_dir, name)
    if not group.exists():
        known = ", ".join(g["name"] for g in list_groups(state_dir)) or "none"
        raise ScenarioNotFound(
            f"no scenario named {show(name)} has run here; `stockade scenario ps` lists them (known: {known})"
        )
    with group.locked() as data:
        data["stopping"] = data.get("stopping") or f"stopped by {by}"
        ids = [str(r["id"]) for r in data.get("runs", [])]
        runner_gone = not _alive(data.get("pid"))
        if runner_gone and data.get("ended") is None:
            data.update(ended=time.time(), exit_code=EXIT_STOPPED)
    with Client(socket_path, timeout=grace + 60.0) as client:
        listing = client.call("run.list")["runs"]
    live = {r["id"] for r in listing if r.get("state") in ("running", "stopping")}
    ids = [i for i in _with_children(ids, listing) if i in live]

    def stop_one(run_id: str) -> dict[str, Any] | None:
        with Client(socket_path, timeout=grace + 60.0) as client:
            try:
                return client.call("run.stop", run=run_id, grace=grace)
            except RemoteError as exc:
                if exc.code in ("not_found", "conflict"):
                    return None
                raise

    with ThreadPoolExecutor(max_workers=min(32, max(1, len(ids)))) as pool:
        stopped = list(pool.map(stop_one, ids))
    return [s for s in stopped if s is not None]


def _with_children(ids: list[str], runs: list[dict[str, Any]]) -> list[str]:
    """``ids`` and, transitively, the runs whose ``parent`` is one of them."""
    found = dict.fromkeys(ids)
    grew = True
    while grew:
        grew = False
        for run in runs:
            if run.get("parent") in found and run.get("id") not in found:
                found[str(run["id"])] = None
                grew = True
    return list(found)


# --------------------------------------------------------------------------- the driver


class ScenarioRunner:
    """Runs one scenario under the daemon at ``socket_path`` until every agent is over.

    ``on_change`` is called (from the thread calling ``run``) with the scheduler
    after every change, for the progress display. ``name`` is the instance's
    name (default: the scenario's), which ``stop_group`` takes.
    """

    def __init__(
        self,
        scenario: Scenario,
        *,
        socket_path: str,
        state_dir: str,
        name: str | None = None,
        unattended: bool = False,
        environ: dict[str, str] | None = None,
        on_change: Callable[[Scheduler], None] | None = None,
    ) -> None:
        self.scenario = scenario
        self.scheduler = Scheduler(scenario)
        self.group = Group(state_dir, name or scenario.name)
        self.socket_path = socket_path
        self.unattended = unattended
        self.environ = dict(os.environ if environ is None else environ)
        self.on_change = on_change or (lambda _s: None)
        self._inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._client: Client | None = None

    def run(self) -> int:
        """Run the scenario to its end; its exit code (0, 1 an agent failed, 130 stopped).

        Raises:
            ScenarioBusy: the name is taken by a live runner.
            DaemonError: the daemon is unreachable, or went away meanwhile.
        """
        self.group.begin(self.scenario)
        code = EXIT_FAILED
        try:
            with Client(self.socket_path, timeout=60.0) as client:
                self._client = client
                try:
                    self._subscribe(client)
                    code = self._loop(client)
                except KeyboardInterrupt:
                    with self.group.locked() as data:
                        data["stopping"] = data.get("stopping") or "interrupted"
                    self._stop_running("interrupted")
                    code = EXIT_STOPPED
        finally:
            self.group.finish(code)
        return code

    def _subscribe(self, client: Client) -> None:
        """Follow every event the daemon stores, from now on, into the inbox."""
        events = client.subscribe("events.subscribe")

        def pump() -> None:
            try:
                for item in events:
                    if item.get("kind") == "subscription.dropped":
                        self._inbox.put(("dropped", None))
                        return
                    self._inbox.put(("event", item))
                self._inbox.put(("closed", None))
            except (StockadeError, OSError) as exc:  # OSError: closed under our feet at the end
                self._inbox.put(("closed", exc))

        threading.Thread(target=pump, name="stockade-scenario-events", daemon=True).start()

    def _loop(self, client: Client) -> int:
        sched = self.scheduler
        self._launch(client)
        self.on_change(sched)
        while not sched.done:
            kind, item = self._inbox.get()
            if kind == "closed":
                raise DaemonError(
                    f"the daemon at {self.socket_path} stopped sending events while scenario "
                    f"{show(self.group.name)} ran ({item or 'it closed the stream'}); see the daemon's log"
                )
            if kind == "dropped":
                self._resubscribe(client)
            else:
                self._handle(item.get("event") or {})
            self._launch(client)
            self.on_change(sched)
        return sched.exit_code()

    def _handle(self, event: dict[str, Any]) -> None:
        run_id = event.get("run")
        if not isinstance(run_id, str):
            return
        # A run.end is never ours-but-unknown: events are handled on this thread,
        # between launches, and a launch registers its run as soon as
        # run.start answers; one that ended that fast waits in the inbox.
        if event.get("kind") == "run.end" and self.scheduler.unit_of(run_id) is not None:
            self._ended(run_id, Ended.from_detail(event.get("detail") or {}))
        elif event.get("kind") == "intent" and event.get("outcome") == "denied":
            self.scheduler.denied(run_id)

    def _ended(self, run_id: str, end: Ended) -> None:
        stopping = self._stopping()
        if stopping:
            self.scheduler.stop(stopping)  # the running ones are being stopped by whoever set it
        self.scheduler.ended(run_id, end)

    def _stopping(self) -> str:
        with contextlib.suppress(OSError, ValueError):
            return str(self.group.read().get("stopping") or "")
        return ""

    def _launch(self, client: Client) -> None:
        sched = self.scheduler
        while True:
            units = sched.advance()
            if not units:
                return
            for unit in units:
                if unit.state != "starting":
                    continue  # stopped meanwhile
                self._start(client, unit)

    def _start(self, client: Client, unit: Unit) -> None:
        agent = self.scenario.agent(unit.agent)
        env = {n: self.environ[n] for n in agent.env_names if n in self.environ}
        env.update(
            run_variables(
                self.group.name,
                os.path.dirname(self.scenario.source),
                unit.name,
                unit.replica,
                agent.replicas,
                unit.restarts + 1,
            )
        )
        with self.group.locked() as data:
            if data.get("stopping"):
                self.scheduler.stop(str(data["stopping"]))
                return
            try:
                info = client.call(
                    "run.start",
                    policy_path=agent.policy,
                    argv=list(agent.command) if agent.command else None,
                    detach=False,
                    unattended=self.unattended,
                    env=env,
                    name=f"{self.group.name}/{unit.name}"[:128],
                )
            except RemoteError as exc:
                self.scheduler.start_failed(unit, exc.message)
                return
            run_id = str(info["id"])
            data.setdefault("runs", []).append(
                {"id": run_id, "agent": unit.agent, "unit": unit.name, "attempt": unit.restarts + 1}
            )
        self.scheduler.started(unit, run_id)

    def _resubscribe(self, client: Client) -> None:
        """Our event stream fell behind and was dropped: subscribe again, then
        learn from ``run.list`` what ended meanwhile."""
        self._subscribe(client)
        runs = {r["id"]: r for r in client.call("run.list")["runs"]}
        for unit in list(self.scheduler.units.values()):
            info = runs.get(unit.run_id)
            if (
                unit.state == "running"
                and info is not None
                and info.get("state") not in ("running", "stopping")
            ):
                self._ended(unit.run_id, Ended.from_detail(info))

    def _stop_running(self, reason: str) -> None:
        running = self.scheduler.stop(reason)
        for unit in running:
            unit.state, unit.note = "stopped", reason
        if self._client is not None:
            for unit in running:
                with contextlib.suppress(StockadeError):
                    self._client.call("run.stop", run=unit.run_id, grace=0)
        self.on_change(self.scheduler)


__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_STOPPED",
    "Ended",
    "Group",
    "ScenarioBusy",
    "ScenarioError",
    "ScenarioNotFound",
    "ScenarioRunner",
    "Scheduler",
    "Unit",
    "group_busy",
    "list_groups",
    "stop_group",
]
