"""``Cell``: run one command in a kernel sandbox and get back its status,
output and events. Used by the CLI, the tests and the benchmarks."""

from __future__ import annotations

import os
import select
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Literal, Protocol

from stockade._slots import Frozen
from stockade.cell import _host
from stockade.cell._attempts import Places, not_an_attempt
from stockade.cell._audit_core import unrecorded_event
from stockade.cell._audit_mount import CELL_LOGINUID
from stockade.cell._cgroup import CellCgroup
from stockade.cell._launch import LaunchSpec, launch, release_mounts
from stockade.cell._migration import launching
from stockade.cell._owners import OwnerLease, lease_owner, release_owner
from stockade.cell._persist import Change, Snapshot, compare, snapshot
from stockade.cell._plan import NOBODY, CellPlan, plan_cell
from stockade.cell._seccomp import build_notify_filter
from stockade.cell._unotify import CellWatch, attach_guard, supervisor
from stockade.errors import CellError, HostError, PolicyError
from stockade.policy import Policy, default_policy
from stockade.record import Event

if TYPE_CHECKING:
    from stockade.cell._audit import AuditReader, Settling
    from stockade.cell._disk import LimitedWorkspace, TmpWatch
    from stockade.cell._terminal import TerminalRelay
    from stockade.cell._workbench import ImageView, Upper

WORKSPACES_ROOT = "/var/lib/stockade/workspaces"
"""Where fresh workspaces are made. Every cell sees this directory as a decoy,
so an attempt on another agent's workspace meets Landlock and is recorded."""

PLAN_REUSE_SECONDS = 2.0

OutputSink = Callable[[int, bytes], None]
"""Called with (1 or 2, chunk) as the command writes to stdout or stderr."""


class CellNetwork(Protocol):
    """The gateway's side of a cell (``stockade.gateway.Gateway``): what the
    cell's programs reach on its loopback, served from outside the cell."""

    def env(self) -> Mapping[str, str]:
        """Variables the cell gets (proxy, LLM endpoint, CA bundle, placeholders)."""
        ...

    def files(self) -> Mapping[str, bytes]:
        """Read-only files the cell gets, by path inside it (the CA bundle)."""
        ...

    def attach(self, cell_id: str, netns_fd: int) -> Callable[[], None]:
        """Start serving inside the cell's network namespace ``netns_fd``;
        returns what stops it. Called in the thread running the cell, before
        the command runs; the detach is called in that thread after it ended.

        Raises:
            CellError: the gateway could not start there (the cell is not run).
        """
        ...


class CellResult(Frozen):
    """How a cell ended."""

    _fields = (
        "cell_id",
        "exit_code",
        "stdout",
        "stderr",
        "events",
        "duration",
        "timed_out",
        "limits_hit",
        "workspace",
        "live",
    )
    __slots__ = _fields

    cell_id: str
    exit_code: int
    """The command's own exit code; 128+N when a signal N ended it."""
    stdout: bytes
    stderr: bytes
    events: tuple[Event, ...]
    duration: float
    timed_out: bool
    limits_hit: tuple[str, ...]
    """Which limits ended or cut the run: ``timeout``, ``memory``, ``pids``,
    ``output``, ``disk`` (the cell's /tmp was full when it ended)."""
    workspace: str
    live: tuple[Event, ...]
    """The events already handed to ``run``'s ``on_event`` (also in ``events``,
    the same objects): what a caller that recorded them live leaves out."""

    def __init__(
        self,
        cell_id: str,
        exit_code: int,
        stdout: bytes,
        stderr: bytes,
        events: tuple[Event, ...],
        duration: float,
        timed_out: bool = False,
        limits_hit: tuple[str, ...] = (),
        workspace: str = "",
        live: tuple[Event, ...] = (),
    ) -> None:
        object.__setattr__(self, "cell_id", cell_id)
        object.__setattr__(self, "exit_code", exit_code)
        object.__setattr__(self, "stdout", stdout)
        object.__setattr__(self, "stderr", stderr)
        object.__setattr__(self, "events", events)
        object.__setattr__(self, "duration", duration)
        object.__setattr__(self, "timed_out", timed_out)
        object.__setattr__(self, "limits_hit", limits_hit)
        object.__setattr__(self, "workspace", workspace)
        object.__setattr__(self, "live", live)

    @property
    def denials(self) -> tuple[Event, ...]:
        return tuple(e for e in self.events if e.outcome in ("denied", "audited"))

    def not_live(self) -> tuple[Event, ...]:
        """``events`` without those handed to ``on_event`` while the cell ran."""
        seen = {id(e) for e in self.live}
        return tuple(e for e in self.events if id(e) not in seen)


EventSink = Callable[[Event], None]
"""Called with each event of a running cell as it happens (``Cell.run``'s ``on_event``)."""

SessionLink = tuple[int, Callable[[CellCgroup, int], None]]
"""``Cell.run``'s ``session``: the descriptor on which the cell's init serves
calls (``_session``), and what is called with the cell's cgroup and its init's
host pid once it serves them."""


class _LiveEvents:
    """One run's events on their way to ``on_event`` while the cell runs.

    The reader calls ``from_reader`` for every event of the host it
    attributes; this keeps the cell's own, drops the launcher's (see
    ``_attempts.not_an_attempt``), gives each the run id once and remembers it, so that
    the same record collected at the end is the same object, delivered once.
    """

    def __init__(self, cell_id: str, run_id: str, plan: CellPlan, sink: EventSink | None) -> None:
        self._cell = cell_id
        self._run = run_id
        self.places = Places.of(plan)
        """What judges the mount layer's refusals (``_attempts``), handed to the reader too."""
        self._sink = sink
        self._lock = threading.Lock()
        self._settled: dict[int, Event] = {}
        """id(raw event) -> the event with the run id; the raw one is kept
        alive by ``_raw`` so that its id stays its own."""
        self._raw: list[Event] = []
        self._delivered: list[Event] = []

    def settle(self, event: Event) -> Event:
        """The event as the result holds it (with the run id), the same object each time."""
        with self._lock:
            done = self._settled.get(id(event))
            if done is None:
                done = event._replace(run=self._run) if self._run else event
                self._settled[id(event)] = self._settled[id(done)] = done
                self._raw.append(event)
            return done

    def start(self, event: Event) -> None:
        if self._sink is not None:
            self._deliver(self.settle(event))

    def from_reader(self, event: Event) -> None:
        if self._sink is None or event.cell != self._cell or not_an_attempt(event, self.places):
            return
        self._deliver(self.settle(event))

    def _deliver(self, event: Event) -> None:
        assert self._sink is not None
        with self._lock:
            self._delivered.append(event)
        self._sink(event)

    def delivered(self) -> tuple[Event, ...]:
        with self._lock:
            return tuple(self._delivered)


_shared_audit: AuditReader | None = None
_shared_audit_lock = threading.Lock()


def shared_audit_reader() -> AuditReader:
    """The process-wide kernel audit reader, started on first use.

    Raises:
        HostError: the kernel audit log cannot be read here (not root, or no
            audit support); kernel refusals could not become events.
    """
    global _shared_audit
    if _shared_audit is not None:
        return _shared_audit
    # One reader, whoever asks first: a hundred cells started at once from
    # as many threads each opened a reader of their own, and their rule
    # requests, waited for side by side under load, timed out (issue 18).
    with _shared_audit_lock:
        if _shared_audit is not None:
            return _shared_audit
        import sys

        from stockade.cell._audit import AuditReader

        # The reader thread parses every audit record of the host; with the
        # default 5 ms GIL switch interval a busy reader would stall a launch
        # by that much each time it holds the interpreter.
        sys.setswitchinterval(min(sys.getswitchinterval(), 0.0005))
        reader = AuditReader()
        reader.start()
        import atexit

        # Closed at exit so that the last stockade process of the host
        # removes the audit rules (``AuditReader.close``).
        atexit.register(reader.close)
        _shared_audit = reader
    return _shared_audit


def shared_audit_reader_soon() -> Callable[[], AuditReader]:
    """The process-wide reader (``shared_audit_reader``), started in a thread
    while the caller goes on; the callable returned waits for it and raises
    what its start raised. Its start is mostly waiting on the kernel (the
    rules' requests, the marker sent round through the audit log), which a
    plan made meanwhile hides: ~2 ms of a fresh ``stockade exec`` (issue 18)."""
    reader = _shared_audit
    if reader is not None:
        return lambda: reader
    outcome: list[AuditReader | BaseException] = []

    def start() -> None:
        try:
            outcome.append(shared_audit_reader())
        except BaseException as exc:  # handed to the caller, in its thread
            outcome.append(exc)

    thread = threading.Thread(target=start, name="stockade-audit-start", daemon=True)
    thread.start()

    def wait() -> AuditReader:
        thread.join()
        got = outcome[0]
        if isinstance(got, BaseException):
            raise got
        return got

    return wait


FDS_PER_CELL = 9
"""Descriptors a running cell holds in the process that launched it, at most
(its output pipes, pidfds, the supervisor's listener, cgroup handles, its
mount namespace, held so that its unmounting is not part of C1's exit:
_launch._Releaser): 8.0 counted with 100 cells at once
(tests/escapes/test_scale.py counts them)."""
CELLS_AT_ONCE = 1000
"""Cells one process should be able to run at the same time."""
_room_checked = False


def _room_for_cells() -> None:
    """Raise this process's soft RLIMIT_NOFILE, once, to room for
    ``CELLS_AT_ONCE`` running cells (within the hard limit): the soft limit
    is 1,024 on many hosts, which 85 cells at once would exhaust, and the
    cell that finds no descriptor fails to start. Never lowered; the cells
    inherit it, as they would the daemon's (which raises it to the hard
    limit)."""
    global _room_checked
    if _room_checked:
        return
    _room_checked = True
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = FDS_PER_CELL * CELLS_AT_ONCE + 1024
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        if new > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            except (ValueError, OSError):
                pass  # then the limit stays; a cell short of one says so when it fails


class Cell:
    """A kernel sandbox for one command, configured by a policy.

    ``Cell(policy).run(argv)`` launches, waits, enforces the timeout and the
    output cap, collects the kernel's refusals from the audit log and cleans
    everything up (processes, cgroups, mounts and, unless asked to keep it, a
    fresh workspace). A cell object can run several commands, one at a time,
    each in a fresh cell sharing the workspace.
    """

    def __init__(
        self,
        policy: Policy | None = None,
        *,
        workspace: str | os.PathLike[str] | None = None,
        keep_workspace: bool | None = None,
        audit: AuditReader | Literal["auto", "off"] | None = "auto",
        environ: Mapping[str, str] | None = None,
        run_id: str = "",
        sockets: Mapping[str, str] | None = None,
        extra_env: Mapping[str, str] | None = None,
        files: Mapping[str, bytes] | None = None,
        network: CellNetwork | None = None,
        records: str | None = None,
        image: object | None = None,
        upper_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        """
        Args:
            policy: the policy; the default policy when omitted.
            workspace: the workspace directory; the policy's, or a fresh one.
            keep_workspace: keep a fresh workspace after the run (default: remove it).
            audit: where kernel refusals are read: "auto" (the shared reader),
                an ``AuditReader``, "off" to run without kernel refusal
                records where the audit log cannot be read (the operator's
                explicit choice: every cell then records the gap in a
                ``cell.audit_lost`` event, reason ``off``), or None to record
                no kernel refusals (tests of other layers only).
            environ: the caller's environment, for ``env.pass``; os.environ by default.
            run_id: the daemon's run this cell belongs to; set on every event.
            sockets: unix sockets of the host to show in the cell, as
                {path in the cell: path on the host} (the broker's socket).
            extra_env: variables set in the cell beyond the policy's (the
                broker's address and the run's capability token).
            files: read-only files shown in the cell, {path in the cell:
                content} (the agent SDK); see ``plan_cell`` for where they may go.
            network: the gateway serving this cell's loopback; without it
                nothing answers there and the cell has no way out at all.
            records: where persistence reports are kept for ``stockade
                revert`` (``_revert.records_dir()`` by default).
            image: a workbench's image (``stockade.image.Image``): its root
                filesystem is the cell's ``/`` (cell/_workbench.py); by default
                the policy's ``image:``, resolved in ``stockade.image.default_store()``.
            upper_dir: keep the run's upper layer here (its files in the
                image's own ids, with overlay whiteouts) instead of throwing it
                away; each run continues from what the last one left.

        Raises:
            HostError: the host lacks a layer the policy needs.
            PolicyError: the policy cannot be honoured (e.g. a bad workspace).
        """
        self.policy = policy or default_policy()
        _host.check(self.policy)
        self.image = _image_view(image, self.policy)
        """The workbench's image (``_workbench.ImageView``), or None for the host's view."""
        if upper_dir is not None and self.image is None:
            raise PolicyError(
                f"upper_dir {os.fspath(upper_dir)!r} is the upper layer of an image, and this cell has "
                "none; give an image (or the policy's image:), or leave upper_dir out"
            )
        self._upper_dir = None if upper_dir is None else os.fspath(upper_dir)
        self._environ = dict(os.environ if environ is None else environ)
        chosen = workspace if workspace is not None else self.policy.workspace
        if chosen is not None:
            # The policy loader's own check, for a workspace given here instead
            # or a Policy made in Python (never loaded from a file).
            from stockade.policy._workspace import workspace_problem

            given = os.path.abspath(os.fspath(chosen))
            why = workspace_problem(given, environ=self._environ)
            if why is not None:
                raise PolicyError(f"workspace {given!r} {why}")
        self._fresh = chosen is None
        self.keep_workspace = (not self._fresh) if keep_workspace is None else keep_workspace
        self.workspace = str(chosen) if chosen is not None else _fresh_workspace()
        self._limited: LimitedWorkspace | None = None
        """A fresh workspace's own filesystem, for ``limits.disk``."""
        disk = self.policy.limits.disk
        if disk is not None:
            if not self._fresh:
                raise PolicyError(
                    f"limits.disk cannot be enforced on the existing workspace {self.workspace!r} "
                    "(the kernel limits a filesystem, and this is a directory of yours); leave the "
                    "workspace out to get a fresh one of that size, or remove limits.disk"
                )
            from stockade.cell._disk import LimitedWorkspace  # only for a disk limit (shutil)

            try:
                st = os.stat(self.workspace)
                self._limited = LimitedWorkspace(self.workspace, disk, (st.st_uid, st.st_gid))
            except BaseException:
                os.rmdir(self.workspace)
                raise
        self._audit_choice = audit
        self.run_id = run_id
        self._sockets = tuple(sorted((sockets or {}).items()))
        self._network = network
        self._extra_env = {**(network.env() if network is not None else {}), **dict(extra_env or {})}
        self._files = tuple(
            sorted({**dict(files or {}), **(network.files() if network is not None else {})}.items())
        )
        self._prepared: tuple[float, CellPlan, object, tuple[tuple[bytes, bool], ...]] | None = None
        from stockade.cell._revert import records_dir

        self.records = records if records is not None else records_dir()
        self.cgroup_within: Mapping[str, str] | None = None
        """Where its cells' cgroups go (``CellCgroup.nest`` of a family's):
        set by the daemon, so that a family of runs is held to its root's
        limits by the kernel."""
        self.last_report: tuple[Change, ...] = ()
        """The persistence report of the last run (also its ``cell.persistence`` event)."""

    @property
    def fresh(self) -> bool:
        """Whether the workspace was made for this Cell (neither given nor the policy's)."""
        return self._fresh

    # ------------------------------------------------------------------ running

    def _run_with_input(
        self,
        argv: list[str] | tuple[str, ...] | None,
        data: bytes,
        **kwargs: object,
    ) -> CellResult:
        # A pipe fed from a thread: the command may read slowly, or not at all
        # (the writer then stops at EPIPE when the cell's end closes).
        read_end, write_end = os.pipe2(os.O_CLOEXEC)

        def feed() -> None:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(write_end, view) :]
            except OSError:
                pass
            finally:
                os.close(write_end)

        feeder = threading.Thread(target=feed, name="stockade-cell-input", daemon=True)
        feeder.start()
        try:
            return self.run(argv, stdin=read_end, **kwargs)  # type: ignore[arg-type]
        finally:
            os.close(read_end)

    def run(
        self,
        argv: list[str] | tuple[str, ...] | None = None,
        *,
        stdin: int | None = None,
        input: bytes | None = None,
        on_output: OutputSink | None = None,
        timeout: float | None = None,
        on_event: EventSink | None = None,
        session: SessionLink | None = None,
    ) -> CellResult:
        """Run ``argv`` (or the policy's ``command``) in a fresh cell and wait.

        Args:
            stdin: a file descriptor for the command's stdin (default /dev/null);
                a terminal is never given to the cell: it gets a pty of its
                own, fed from this one (``_terminal.TerminalRelay``).
            input: bytes for the command's stdin instead, as ``subprocess.run``
                takes them (fed through a pipe; not with ``stdin``).
            on_output: stream output chunks here instead of keeping them.
            timeout: wall-clock seconds; the policy's ``limits.timeout`` by default.
            on_event: called with ``cell.start`` once the cell is launched, then
                with each kernel refusal (and ``cell.audit_lost``) as soon as the
                audit reader has attributed it, from the reader's thread, while
                the cell runs. These events are also in the result's
                ``events``, as the very same objects, so a caller that records
                them live can leave them out at the end (``CellResult.live``).
            session: for ``Session`` only: the cell's init serves calls on
                this descriptor instead of running ``argv``, with no timeout of
                its own (each call has its own), until the other end closes.

        Raises:
            CellError: the cell could not be set up.
            HostError: a layer the policy needs is not available.
            ValueError: both ``stdin`` and ``input`` were given.
        """
        if input is not None:
            if stdin is not None:
                raise ValueError("Cell.run takes stdin or input, not both; give one of them")
            return self._run_with_input(
                argv, input, on_output=on_output, timeout=timeout, on_event=on_event, session=session
            )
        command = tuple(argv) if argv else self.policy.command
        if not command:
            raise CellError("no command to run: pass one, or set `command` in the policy")
        cell_id = "c-" + os.urandom(6).hex()
        # The kernel's wait for C1's cgroup move, paid by a thread from now
        # and spared the next launch within a second (cell/_migration.py).
        launching()
        _room_for_cells()
        policy = self.policy
        limits = policy.limits
        deadline_seconds = timeout if timeout is not None else limits.timeout
        if session is not None:
            deadline_seconds = None
        audit_soon = self._audit_reader_soon()
        try:
            plan, landlock, seccomp = self._prepared_plan()
        except BaseException as exc:
            # Waited for whatever went wrong: a reader cut short at exit, its
            # rules added and its close not yet registered, would leave them.
            try:
                audit_soon()
            except Exception:
                if isinstance(exc, Exception):
                    raise  # the reader's failure first, as when it started before the plan
            raise
        audit = audit_soon()
        events: list[Event] = []
        walked = self._walked(plan)
        before = snapshot(walked, protected=_inside(plan.protected, walked))
        cgroup = CellCgroup.create(cell_id, limits, within=self.cgroup_within)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        null_fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC) if stdin is None else -1
        relay: TerminalRelay | None = None
        start = time.monotonic()
        events.append(_start_event(cell_id, policy, command, plan))
        if self._audit_choice == "off":
            events.append(unrecorded_event(cell_id, time.time()))
        live = _LiveEvents(cell_id, self.run_id, plan, on_event)
        unsubscribe: Callable[[], None] | None = None
        launched = None
        owner = None
        upper: Upper | None = None
        settling: Settling | None = None
        made_userns: list[int] = []
        tmp_watch: TmpWatch | None = None
        disk_events: dict[str, Event] = {}
        detach: list[Callable[[], None]] = []
        notify_ours, notify_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        watch: CellWatch | None = None
        connect_events: list[Event] = []
        mounts_released: Callable[[], None] | None = None
        try:
            # Before any process joins the cgroup: no unix socket of the cell
            # connects but through the connect supervisor (_unotify).
            attach_guard(cgroup.paths[0])
            # The host uid that creates the cell's user namespace, so that its
            # per-user kernel counters are the cell's own, not root's (_owners).
            owner = lease_owner()
            range_fd = -1
            if plan.id_range:
                # A workbench (or user: root) maps the slot's whole range; its
                # host ids are known now that the slot is.
                plan, range_fd = _with_range(plan, owner)
                # cell.start (not yet handed to anyone) with the host ids now known.
                events[0] = _start_event(cell_id, policy, command, plan)
                if range_fd >= 0:
                    made_userns.append(range_fd)
                if plan.image_rootfs:
                    # Imported here: a cell of the host's view (every `stockade
                    # exec` without --image) does not pay for it (issue 18).
                    from stockade.cell._workbench import check_upper, layers, make_upper

                    copy = plan.image_rootfs if layers() == "copy" else None  # stockade doctor
                    upper = make_upper(self._upper_dir, copy_from=copy)
                    check_upper(upper, plan)
            # A terminal is never the cell's: it gets a pty of its own (_terminal).
            if stdin is not None and os.isatty(stdin):
                from stockade.cell._terminal import relay_if_terminal  # termios: only for a terminal

                relay = relay_if_terminal(stdin)
            spec = LaunchSpec(
                argv=command,
                plan=plan,
                cgroup_procs=cgroup.procs_files(),
                landlock=landlock,
                seccomp=seccomp,
                # A login uid no person has: every cell its own audit session,
                # and the mount layer's audit rules match cells only.
                audit_loginuid=CELL_LOGINUID if audit is not None else None,
                stdin=relay.slave if relay is not None else stdin if stdin is not None else null_fd,
                stdout=out_w,
                stderr=err_w,
                cap_last=_cap_last(),
                idmap_userns=_idmaps(plan, made_userns),
                on_namespaces=self._attacher(cell_id, detach) if self._network is not None else None,
                userns_owner=None if owner is None else (owner.uid, owner.gid),
                notify=(build_notify_filter(), notify_theirs.fileno()),
                keep_fds=(session[0],) if session is not None else (),
                session=session[0] if session is not None else None,
                id_base=None if not plan.id_range else plan.host_uid - plan.uid,
                range_userns=range_fd,
                upper=None
                if upper is None
                else (upper.base, os.path.basename(upper.upper), os.path.basename(upper.work)),
                pin_mounts=True,
            )
            if on_event is not None and audit is not None:
                # Subscribed before the launch: a refusal in the cell's first
                # instant is attributed as soon as ``watch`` claims it.
                unsubscribe = audit.on_event(live.from_reader)
            launched = launch(spec)
            for event in events:  # cell.start, and the gap it has if audit is off
                live.start(event)
            if audit is not None and launched.session is not None:
                # First thing after the launch: the cell's refusals wait in the
                # reader's limbo until it is watched, and under load (500 cells
                # at once) every step before this one delays it by seconds.
                audit.watch(cell_id, session=launched.session, pid=launched.init_pid, places=live.places)
            if limits.disk is not None:
                # Watched while the cell runs: a limit reached is in the
                # record live, even if the agent empties the place again.
                def disk_reached(sentence: str) -> None:
                    disk_events[sentence] = event = _limit_event(cell_id, "cell", sentence)
                    live.start(event)

                from stockade.cell._disk import TmpWatch

                tmp_watch = TmpWatch(
                    launched.init_pid, limits.disk, workspace=self._limited, on_reached=disk_reached
                )
                tmp_watch.start()
            os.close(out_w)
            os.close(err_w)
            out_w = err_w = -1
            notify_theirs.close()
            watch = _watch_connects(
                notify_ours, cell_id, launched.init_pid, dict(self._sockets), plan.host_uid, policy,
                live.start,
            )
            if session is not None:
                session[1](cgroup, launched.init_pid)
            status, timed_out, stdout, stderr, truncated = _supervise(
                launched.pid, out_r, err_r, deadline_seconds, limits.output, on_output, cgroup
            )
            # The view's unmounting, beside the rest of this end (_launch._Releaser).
            mounts_released = release_mounts(launched.mount_ns)
            if audit is not None and launched.session is not None:
                # The cell's pid 1 has ended, and with it every process of its
                # pid namespace (the kernel reaps them first): every record
                # of theirs is queued. The marker goes round while the rest
                # of the cell is ended (collect waits for it).
                settling = audit.begin_settle()
        except BaseException:
            # Interrupted or failed while the cell ran: it must not outlive us.
            if launched is not None:
                _kill_cell(launched.pid, cgroup)
                try:
                    os.waitpid(launched.pid, 0)
                except ChildProcessError:
                    pass
                if mounts_released is None:
                    mounts_released = release_mounts(launched.mount_ns)
                mounts_released()
                if audit is not None:
                    if settling is not None:
                        audit.abandon(settling)
                    audit.unwatch(cell_id)
            if unsubscribe is not None:
                unsubscribe()
            cgroup.destroy()
            release_owner(owner)
            if tmp_watch is not None:
                tmp_watch.close()
            raise
        finally:
            for fd in made_userns:
                os.close(fd)  # C1 applied them to its mounts before the launch returned
            if upper is not None:
                from stockade.cell._workbench import finish_upper

                if mounts_released is not None:
                    mounts_released()  # its overlay unmounted first
                finish_upper(upper, plan)  # the cell is dead: nothing uses its layers
            if watch is not None:
                connect_events = supervisor().unwatch(watch)
            notify_ours.close()
            notify_theirs.close()
            for stop in detach:
                stop()
            if relay is not None:
                changed = relay.close()  # the cell is dead: nothing uses its pty any more
                if changed:
                    events.append(_terminal_event(cell_id, changed))
            for fd in (out_r, err_r, out_w, err_w, null_fd):
                if fd >= 0:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
        duration = time.monotonic() - start
        try:
            stats = cgroup.stats()
            cgroup.destroy()
        except BaseException:
            if audit is not None and settling is not None:
                audit.abandon(settling)
            raise
        release_owner(owner)  # every process of the cell has ended
        if audit is not None and launched.session is not None:
            # Those delivered live come back here too: the same events, once.
            events.extend(
                live.settle(e)
                for e in audit.collect(cell_id, begun=settling)
                if not not_an_attempt(e, live.places)
            )
            audit.unwatch(cell_id)
        if unsubscribe is not None:
            # Only now: what collect's barrier brought in went to on_event too
            # (the daemon's tripwire counts it), not only to the result.
            unsubscribe()
        events.extend(live.settle(e) for e in connect_events)
        limits_hit: list[str] = []
        if timed_out:
            limits_hit.append("timeout")
            events.append(
                _limit_event(cell_id, "timeout", f"killed after the {deadline_seconds:g} s timeout")
            )
        if stats.oom_killed:
            limits_hit.append("memory")
            # At its own limit a cell's peak is the limit (to a page); one
            # killed well short of it met its family's (cgroup_within).
            peak = stats.memory_peak
            own = limits.memory is None or peak is None or peak >= limits.memory * 0.9
            whose = (
                f"memory limit of {limits.memory} bytes"
                if own
                else f"memory limit of its run's family (this cell held at most {peak} bytes "
                f"of its own {limits.memory})"
            )
            events.append(_limit_event(cell_id, "cgroup", f"{whose} reached: killed"))
        if stats.pids_limit_hit:
            limits_hit.append("pids")
            # Refused by its family's limit (cgroup_within), not its own: say whose.
            whose = (
                f"process limit of {limits.pids}"
                if stats.pids_peak_at_max is not False
                else f"process limit of its run's family (this cell held fewer than its own {limits.pids})"
            )
            events.append(_limit_event(cell_id, "cgroup", f"{whose} reached: fork refused"))
        if truncated:
            limits_hit.append("output")
            events.append(_limit_event(cell_id, "cell", f"output past {limits.output} bytes dropped"))
        disk_full = tmp_watch.reached() if tmp_watch is not None else []
        if disk_full:
            limits_hit.append("disk")
            events.extend(disk_events.get(s) or _limit_event(cell_id, "cell", s) for s in disk_full)
        exit_code = status
        if launched.exec_error is not None:
            _stage, err, message = launched.exec_error
            exit_code = 126 if err in (1, 13) else 127
            note = f"stockade: {message}\n".encode()
            if on_output is not None:
                on_output(2, note)
            else:
                stderr = stderr + note
        events.append(self._persistence(cell_id, before))
        events.append(
            Event(
                kind="cell.end",
                cell=cell_id,
                layer="cell",
                outcome="info",
                summary=f"cell ended with exit code {exit_code}" + (" (timeout)" if timed_out else ""),
                detail={
                    "exit_code": exit_code,
                    "duration": round(duration, 6),
                    "timed_out": timed_out,
                    "limits_hit": limits_hit,
                    "memory_peak": stats.memory_peak,
                    "cpu_usage_ns": stats.cpu_usage_ns,
                },
            )
        )
        if mounts_released is not None:
            mounts_released()  # nothing of the cell's view outlives the call
        return CellResult(
            cell_id=cell_id,
            exit_code=exit_code,
            stdout=stdout,
            stderr=stderr,
            events=tuple(live.settle(e) for e in events),
            live=live.delivered(),
            duration=duration,
            timed_out=timed_out,
            limits_hit=tuple(limits_hit),
            workspace=self.workspace,
        )

    def _attacher(self, cell_id: str, detach: list[Callable[[], None]]) -> Callable[[int], None]:
        """The launch hook that starts the gateway in the new cell's network namespace."""
        network = self._network
        assert network is not None

        def attach(pid: int) -> None:
            try:
                fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                raise CellError(f"cannot reach the cell's network namespace: {exc}") from exc
            try:
                detach.append(network.attach(cell_id, fd))
            finally:
                os.close(fd)

        return attach

    def _walked(self, plan: CellPlan) -> tuple[str, ...]:
        """The places the persistence report walks: the writable ones, but not a
        fresh workspace that ``close`` removes (nothing in it outlives the Cell)."""
        if self._fresh and not self.keep_workspace:
            return tuple(r for r in plan.writable_roots if r != plan.workspace)
        return plan.writable_roots

    def _records_hidden(self) -> tuple[str, ...]:
        """The reports' directory, when a writable place holds it: made now (a
        decoy covers only what exists) and hidden, since ``stockade revert``
        writes what a report says, as the operator."""
        records = os.path.realpath(self.records)
        places = (self.workspace, *self.policy.filesystem.write)
        if not any(records.startswith(os.path.realpath(p).rstrip("/") + "/") for p in places):
            return ()
        os.makedirs(records, mode=0o700, exist_ok=True)
        return (records,)

    def _persistence(self, cell_id: str, before: Snapshot) -> Event:
        """The ``cell.persistence`` event: what the cell left that a tool of the
        operator's would run or load, kept for ``stockade revert`` when not empty."""
        from stockade.cell._revert import save

        after = snapshot(before.roots, protected=before.protected, keep=False)
        changes = compare(before, after)
        self.last_report = tuple(changes)
        detail: dict[str, object] = {
            "changes": [c.to_dict() for c in changes],
            "roots": list(before.roots),
            "cut": list(dict.fromkeys([*before.cut, *after.cut])),
        }
        cut = list(dict.fromkeys([*before.cut, *after.cut]))
        if changes or cut:
            try:
                detail["kept"] = save(
                    self.records, cell=cell_id, run=self.run_id, changes=changes, before=before, cut=cut
                )
                detail["revert"] = f"stockade revert {self.run_id or cell_id}"
            except OSError as exc:
                detail["kept"] = ""
                detail["error"] = (
                    f"the report could not be kept in {self.records} for revert: {exc.strerror or exc}; "
                    "set STOCKADE_STATE to a writable directory"
                )
            summary = f"{len(changes)} file(s) that tools run or load were created or changed: " + "; ".join(
                c.line() for c in changes[:3]
            )
        else:
            summary = "nothing that tools run or load was created or changed"
        if cut:
            summary += f" (the walk was cut: {cut[0]})"
        return Event(
            kind="cell.persistence",
            cell=cell_id,
            layer="cell",
            outcome="info",
            summary=summary[:1000],
            detail=detail,
        )

    def close(self) -> None:
        """Let go of the prepared layers, and remove a fresh workspace unless
        asked to keep it. Idempotent."""
        self._prepared = None  # closes the host descriptors its rules hold
        if self._limited is not None and not self.keep_workspace:
            self._limited.remove()
            self._limited = None
        elif self._limited is not None:
            # Kept: its files are copied out and the image let go (_disk), so
            # nothing of it stays loop-mounted.
            limited, self._limited = self._limited, None
            try:
                note = limited.keep()
            except CellError as exc:
                note = f"the kept workspace's image {limited.image} is kept: {exc}"
            if note is not None:
                import logging  # only when something went wrong

                logging.getLogger(__name__).warning("%s", note)
        if self._fresh and not self.keep_workspace and os.path.isdir(self.workspace):
            try:
                os.rmdir(self.workspace)  # left empty, as a command that writes nothing leaves it
            except OSError:
                import shutil  # only here: shutil pulls in zlib, bz2 and lzma (issue 18)

                shutil.rmtree(self.workspace, ignore_errors=True)

    def __enter__(self) -> Cell:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ helpers

    def _audit_reader_soon(self) -> Callable[[], AuditReader | None]:
        """What waits for this cell's reader: the shared one is started in a
        thread while the plan is made (``shared_audit_reader_soon``)."""
        if self._audit_choice == "auto":
            return shared_audit_reader_soon()
        chosen = None if self._audit_choice == "off" else self._audit_choice
        return lambda: chosen

    def _prepared_plan(self) -> tuple[CellPlan, object, tuple[tuple[bytes, bool], ...]]:
        """The plan and prepared layers, reused for ``PLAN_REUSE_SECONDS``.

        A plan reads the host (directory listings for decoys, the entries of
        /etc); consecutive runs of one Cell reuse it briefly instead of reading
        it all again. Reuse can only be stale in the safe direction: a host
        path that appeared since is not in the view.
        """
        from stockade.cell._layers import prepare_layers

        now = time.monotonic()
        if self._prepared is not None and now - self._prepared[0] < PLAN_REUSE_SECONDS:
            return self._prepared[1], self._prepared[2], self._prepared[3]
        if self.image is not None:
            from stockade.cell._workbench import plan_workbench

            plan = plan_workbench(
                self.policy,
                self.image,
                workspace=self.workspace,
                environ=self._environ,
                sockets=self._sockets,
                files=self._files,
                extra_hidden=self._records_hidden(),
            )
        else:
            plan = plan_cell(
                self.policy,
                workspace=self.workspace,
                environ=self._environ,
                sockets=self._sockets,
                files=self._files,
                extra_hidden=self._records_hidden(),
            )
        if self._extra_env:
            plan = plan._replace(env=tuple(sorted({**dict(plan.env), **self._extra_env}.items())))
        landlock, seccomp = prepare_layers(self.policy, plan)
        self._prepared = (now, plan, landlock, seccomp)
        return plan, landlock, seccomp


def _inside(paths: tuple[str, ...], roots: tuple[str, ...]) -> tuple[str, ...]:
    """``paths`` that lie under one of ``roots``: the protected paths that a
    snapshot of ``roots`` notes (``_persist.snapshot`` looks at no other).
    A fresh workspace is not walked, and its two dozen protected paths
    (``.bashrc``, ``.git/hooks``…) are not looked up before and after each run."""
    tops = tuple(r.rstrip("/") + "/" for r in roots)
    return tuple(p for p in paths if p.startswith(tops)) if tops else ()


def _watch_connects(
    sock: socket.socket,
    cell_id: str,
    init_pid: int,
    offered: dict[str, str],
    host_uid: int,
    policy: Policy,
    on_event: Callable[[Event], None],
) -> CellWatch:
    """Hand the cell's connect listener, which its init sent on ``sock``, to the supervisor.

    Raises:
        CellError: the listener did not come (the cell's connects would wait forever).
    """
    sock.settimeout(5.0)
    try:
        _msg, fds, _flags, _addr = socket.recv_fds(sock, 1, 1)
    except OSError as exc:
        raise CellError(f"the cell's connect listener did not arrive: {exc}") from exc
    if len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise CellError("the cell's connect listener did not arrive (the init sent no descriptor)")
    os.set_inheritable(fds[0], False)
    return supervisor().watch(
        fds[0],
        cell_id=cell_id,
        init_pid=init_pid,
        offered=offered,
        host_uid=host_uid,
        audit=policy.mode == "audit",
        on_event=on_event,
    )


def _image_view(image: object | None, policy: Policy) -> ImageView | None:
    """The workbench image of a cell: the one given, else the policy's
    ``image:`` from the default store (``stockade.image``), else None.

    Raises:
        ImageError: the policy's image is not in the store.
    """
    if image is None and policy.image is not None:
        from stockade.image import default_store  # only for workbenches

        image = default_store().get(policy.image)
    if image is None:
        return None
    from stockade.cell._workbench import ImageView

    if isinstance(image, ImageView):
        return image
    return ImageView.of(image)


def _with_range(plan: CellPlan, owner: OwnerLease | None) -> tuple[CellPlan, int]:
    """The plan with its host ids in ``owner``'s slot, and the slot's id-range
    user namespace (for the idmapped layers of an image).

    Raises:
        HostError: no slot, because stockade does not run as root here.
    """
    if owner is None:
        raise HostError(
            "a workbench (an image, or user:) maps a range of ids, which only root can do; "
            "run stockade as root, or leave image and user out",
            feature="userns.range",
        )
    from stockade.cell._workbench import range_userns

    base = owner.uid + 1
    plan = plan._replace(host_uid=base + plan.uid, host_gid=base + plan.gid)
    return plan, range_userns(base) if plan.image_rootfs else -1


def _fresh_workspace() -> str:
    os.makedirs(WORKSPACES_ROOT, mode=0o711, exist_ok=True)
    # Like tempfile.mkdtemp (a random name, made exclusively, mode 0700), without
    # importing tempfile on the exec path.
    while True:
        path = os.path.join(WORKSPACES_ROOT, "ws-" + os.urandom(6).hex())
        try:
            os.mkdir(path, 0o700)
            break
        except FileExistsError:
            continue
    if os.geteuid() == 0:
        # The cell acts as nobody on the host; its own workspace must be its own.
        os.chown(path, NOBODY, NOBODY)
    os.chmod(path, 0o755)
    return path


def _idmaps(plan: CellPlan, made: list[int] | None = None) -> tuple[tuple[int, int, int], ...]:
    """The user namespaces of the plan's idmapped grants. A cell of one id
    shares them (kept per process); a workbench's host ids are its slot's,
    which changes each run, so its are made for the run, added to ``made``
    and closed by the caller after the launch (kept, they would pile up one
    per slot and owner)."""
    from stockade.cell._launch import idmap_userns, userns_with_maps

    owners: dict[int, int] = {}
    for op in plan.mounts:
        if op.idmap_owner is not None and op.idmap_owner not in owners:
            owners[op.idmap_owner] = os.stat(op.src).st_gid
    out: list[tuple[int, int, int]] = []
    for uid, gid in owners.items():
        if plan.id_range:
            if made is None:
                raise ValueError("a workbench's idmaps are the caller's to close: pass made")
            fd = userns_with_maps(f"{uid} {plan.host_uid} 1\n", f"{gid} {plan.host_gid} 1\n")
            made.append(fd)
        else:
            fd = idmap_userns(uid, gid, plan.host_uid, plan.host_gid)
        out.append((uid, gid, fd))
    return tuple(out)


_CAP_LAST: int | None = None


def _cap_last() -> int:
    global _CAP_LAST
    if _CAP_LAST is None:
        try:
            with open("/proc/sys/kernel/cap_last_cap") as f:
                _CAP_LAST = int(f.read())
        except (OSError, ValueError):
            _CAP_LAST = 40
    return _CAP_LAST


def _supervise(
    pid: int,
    out_r: int,
    err_r: int,
    timeout: float | None,
    output_cap: int | None,
    on_output: OutputSink | None,
    cgroup: CellCgroup,
) -> tuple[int, bool, bytes, bytes, bool]:
    """Wait for the cell, pumping its output and enforcing the timeout."""
    pidfd = os.pidfd_open(pid)
    deadline = None if timeout is None else time.monotonic() + timeout
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    stream = {out_r: 1, err_r: 2}
    kept = 0
    truncated = False
    timed_out = False
    poller = select.poll()
    for fd in (out_r, err_r, pidfd):
        poller.register(fd, select.POLLIN)
    open_fds = {out_r, err_r}
    exited = False
    try:
        while open_fds or not exited:
            wait_ms = -1 if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
            ready = poller.poll(wait_ms)
            if not ready and deadline is not None and time.monotonic() >= deadline and not timed_out:
                timed_out = True
                _kill_cell(pid, cgroup)
                deadline = None
                continue
            for fd, _mask in ready:
                if fd == pidfd:
                    exited = True
                    poller.unregister(pidfd)
                    # The cell's pid 1 is gone, so its whole pid namespace is
                    # too; any writer left is dying, and the caller's
                    # cgroup.destroy() kills whatever might remain.
                    continue
                data = os.read(fd, 65536)
                if not data:
                    poller.unregister(fd)
                    open_fds.discard(fd)
                    continue
                if output_cap is not None and kept + len(data) > output_cap:
                    data = data[: max(0, output_cap - kept)]
                    truncated = True
                kept += len(data)
                if not data:
                    continue
                if on_output is not None:
                    on_output(stream[fd], data)
                else:
                    chunks[fd].append(data)
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(pidfd)
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        code = 128 - code
    return code, timed_out, b"".join(chunks[out_r]), b"".join(chunks[err_r]), truncated


def _kill_cell(pid: int, cgroup: CellCgroup) -> None:
    try:
        os.kill(pid, signal.SIGKILL)  # C1's death takes C2, and so the pid namespace, with it
    except ProcessLookupError:
        pass
    cgroup.kill()


def _start_event(cell_id: str, policy: Policy, command: tuple[str, ...], plan: CellPlan) -> Event:
    limits = policy.limits
    return Event(
        kind="cell.start",
        cell=cell_id,
        layer="cell",
        outcome="info",
        summary=f"cell started for policy {policy.name!r}: {_shortened(' '.join(command))}",
        detail={
            "policy": policy.name,
            "mode": policy.mode,
            "argv": list(command),
            "workspace": plan.workspace,
            "host_uid": plan.host_uid,
            "limits": {
                "memory": limits.memory,
                "pids": limits.pids,
                "cpu": limits.cpu,
                "timeout": limits.timeout,
                "output": limits.output,
                "disk": None
                if limits.disk is None
                else {"bytes": limits.disk.bytes, "files": limits.disk.files},
            },
            "hidden": list(plan.hidden),
            # A workbench's view and who runs in it (docs/CELL.md, Workbenches).
            "image": plan.image_digest or None,
            "uid": plan.uid,
        },
    )


def _shortened(text: str, width: int = 200) -> str:
    """``text`` cut at ``width`` with a mark (the whole argv is in the detail)."""
    if len(text) <= width:
        return text
    return f"{text[:width]}… ({len(text) - width} more characters in detail.argv)"


def _terminal_event(cell_id: str, changed: tuple[str, ...]) -> Event:
    return Event(
        kind="cell.terminal",
        cell=cell_id,
        layer="cell",
        outcome="info",
        summary=f"the cell changed its own terminal ({' '.join(changed)}); the operator's was not touched",
        detail={"changed": list(changed)},
    )


def _limit_event(cell_id: str, layer: Literal["cell", "cgroup", "timeout"], summary: str) -> Event:
    return Event(kind="cell.limit", cell=cell_id, layer=layer, outcome="denied", summary=summary, detail={})


__all__ = ["Cell", "CellNetwork", "CellResult", "shared_audit_reader", "shared_audit_reader_soon"]
