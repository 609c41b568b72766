"""The ``stockade`` sandbox environment of Inspect AI.

``sandbox="stockade"`` (the default policy), ``("stockade", "policy.yaml")``
(a stockade policy), ``("stockade", "compose.yaml")`` (a Docker compose file:
its one service's image, working directory, environment and limits, see
``_compose``) or ``SandboxEnvironmentSpec("stockade", StockadeSandboxConfig(…))``.
Each sample gets one workbench session (``_workbench``): one cell for the
whole sample, so files, ``/tmp`` and background processes last from
``sample_init`` to ``sample_cleanup``, and nothing of it outlives the sample.
At the end its events land in stockade's store (``_record.land``) and its
containment report goes into the sample's metadata under ``"stockade"``, so
that an eval log says what the agent reached for and what stopped it.

The contract is inspect_ai 0.3.285's ``SandboxEnvironment``; Inspect's own
conformance suite (``inspect_ai.util._sandbox.self_check``) runs against this
in tests/harness/test_inspect_conformance.py.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import errno
import os
import shlex
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Literal, TypeVar, Union, cast, overload

import anyio
import anyio.to_thread
from inspect_ai.util import (
    ExecResult,
    OutputLimitExceededError,
    SandboxConnection,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    SandboxUnavailableError,
    SandboxUserUnsupportedError,
    concurrency,
    sandboxenv,
)
from pydantic import BaseModel

from stockade.errors import UsageError
from stockade.harness import _compose
from stockade.harness._hosted import SampleHost, start_sample
from stockade.harness._pool import Later, Spare, SparePool
from stockade.harness._record import containment_report
from stockade.harness._workbench import ExecFiles, Workbench
from stockade.policy import Policy, default_policy, load_policy

T = TypeVar("T")

ARGV_IN_REQUEST = 768 << 10
"""Bytes of argv sent with a session call as they are; a longer one (Inspect
checks 1 MiB, the session takes 1 MiB of argv, env and cwd in all) is
written to a file in the cell and read back there by bash (``_staged_argv``)."""

_THREADS = anyio.CapacityLimiter(256)
"""Threads that wait on cells. anyio's default limiter (40) would make the
41st concurrent exec of an eval wait for a thread, not for the machine;
Inspect's own ``subprocesses`` concurrency is the throttle (``concurrency``)."""


class StockadeSandboxConfig(BaseModel, frozen=True):
    """The ``stockade`` sandbox's own configuration (all optional)."""

    policy: str | None = None
    """A stockade policy file (docs/POLICY.md); the default policy when None."""
    image: str | None = None
    """An image of stockade's store (``stockade image ls``) as the cell's ``/``."""
    compose: str | None = None
    """A compose file whose service supplies image, workdir, environment, limits."""
    state: str | None = None
    """The state directory whose store gets the record (``$STOCKADE_STATE`` or the default)."""


def resolve_policy(config: SandboxEnvironmentConfigType | None) -> tuple[Policy, str | None]:
    """The policy a config stands for, and the state directory for the record.

    Raises:
        PolicyError: the policy or compose file is wrong (the message names the key).
    """
    from inspect_ai.util._sandbox.compose import ComposeConfig

    if config is None:
        return default_policy("inspect"), None
    if isinstance(config, str):
        path = os.path.abspath(config)
        if _compose.is_compose(path):
            doc = _compose.read_compose(path)
            service = _compose.compose_service(doc, source=path)
            return _compose.policy_for_service(default_policy("inspect"), service), None
        return load_policy(path), None
    if isinstance(config, ComposeConfig):
        doc = config.model_dump(exclude_none=True, by_alias=True)
        service = _compose.compose_service(doc, source="the compose config")
        return _compose.policy_for_service(default_policy("inspect"), service), None
    if isinstance(config, StockadeSandboxConfig):
        if config.policy and config.compose:
            from stockade.errors import PolicyError

            raise PolicyError("the stockade sandbox config names both a policy and a compose file; keep one")
        if config.compose:
            policy, _ = resolve_policy(config.compose)
        else:
            policy = load_policy(config.policy) if config.policy else default_policy("inspect")
        if config.image:
            policy = dataclasses.replace(policy, image=config.image)
        return policy, config.state
    from stockade.errors import PolicyError

    raise PolicyError(
        f"the stockade sandbox got a config of type {type(config).__name__}; give a policy file, "
        "a compose file or a StockadeSandboxConfig"
    )


@sandboxenv(name="stockade")
class StockadeSandboxEnvironment(SandboxEnvironment):
    """One sample's workbench session, contained by stockade."""

    def __init__(self, workbench: Workbench, host: SampleHost, cwd: str) -> None:
        super().__init__()
        self._workbench = workbench
        self._files = ExecFiles(workbench)
        self.host = host
        self.record = host.record
        self._cwd = cwd
        self._closed = False
        self.report: dict[str, Any] | None = None
        """The containment report, once the sample has been cleaned up."""
        self._pool: SparePool | None = None
        """The config's spares (its take started the next; its end tops them up)."""
        self._session: dict[str, Any] = {}
        """When the sample's session started, and whether ahead of it (the report's ``session``)."""

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def config_files(cls) -> list[str]:
        return ["compose.yaml", "compose.yml", "docker-compose.yaml", "docker-compose.yml"]

    @classmethod
    def is_docker_compatible(cls) -> bool:
        return True

    @classmethod
    def default_concurrency(cls) -> int | None:
        # A cell costs a few MiB and milliseconds; what bounds an eval is the
        # machine's cores (each busy sample keeps one near full).
        return 2 * (len(os.sched_getaffinity(0)) or 1)

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return StockadeSandboxConfig(**config)

    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        # Fail once, before any sample, on a wrong policy or a host that lacks
        # a layer the policy needs, rather than in every sample.
        from stockade.cell import _host

        policy, state = resolve_policy(config)
        _host.check(policy)
        # Then start the first spare session of this config (_pool): the first
        # sample takes it instead of waiting for its own cell (and run) to
        # start. Inspect calls this once per sandbox config for the whole eval,
        # with the task name "startup": a spare learns its task from the
        # sample that takes it (and the later ones from the sample whose take
        # started them).
        key = _pool_key(config)
        pool = SparePool(
            lambda task: _start_session(task, policy, state, sample_id=None),
            most=cls.default_concurrency() or 1,
            task=SPARE_TASK,
        )
        with _POOLS_LOCK:
            previous = _POOLS.pop(key, None)
            _POOLS[key] = pool
        if previous is not None:
            await _in_thread(previous.close)
        pool.fill()

    @classmethod
    async def sample_init(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, metadata: dict[str, str]
    ) -> dict[str, SandboxEnvironment]:
        policy, state = resolve_policy(config)
        from inspect_ai.solver._task_state import sample_state

        current = sample_state()  # set before the sandbox is (Inspect's task runner)
        sample_id = f"{current.sample_id}/{current.epoch}" if current is not None else ""
        with _POOLS_LOCK:
            pool = _POOLS.get(_pool_key(config))
        spare = await _in_thread(lambda: pool.take(policy, task=task_name)) if pool is not None else None
        if spare is not None and not await _in_thread(spare.alive):
            gone = spare
            _LATER(lambda: gone.end_unused("its session was no longer open when a sample took it"))
            spare = None
        ahead = spare is not None
        if spare is None:
            # A daemon's run when one runs (`stockade ps` lists the sample, its
            # events are stored live), else a session in this process (_hosted).
            spare = await _in_thread(lambda: _start_session(task_name, policy, state, sample_id=sample_id))
        else:
            spare.host.record.task = task_name
            spare.host.record.sample = sample_id
            _sample_started(spare, ahead=True)
        env = cls(spare.workbench, spare.host, spare.cwd)
        env._pool = pool
        env._session = {"started_ahead": ahead, "started": round(spare.started_at, 6)}
        return {"default": env}

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        for environment in environments.values():
            if isinstance(environment, StockadeSandboxEnvironment):
                await environment._close(interrupted=interrupted)

    @classmethod
    async def task_cleanup(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, cleanup: bool
    ) -> None:
        # Each sample's session ended at its sample_cleanup, its record in the
        # store by then; left: this config's spares that no sample took, and
        # the daemon runs' placeholders that samples' ends handed on
        # (_pool.Later). Inspect calls this once per config ("shutdown").
        with _POOLS_LOCK:
            pool = _POOLS.pop(_pool_key(config), None)
        if pool is not None:
            await _in_thread(pool.close)
        await _in_thread(_LATER.wait)

    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        # `inspect sandbox cleanup stockade`: what a killed eval left behind,
        # the cgroups and mount points of cells whose processes are gone (the
        # same sweep the daemon makes when it starts).
        from stockade.daemon._server import _sweep_stale_cells

        await _in_thread(_sweep_stale_cells)

    async def _close(self, *, interrupted: bool) -> None:
        if self._closed:
            return
        self._closed = True
        # In process, the store is opened while the session closes (_hosted).
        prepare = getattr(self.host, "prepare_finish", None)
        if prepare is not None:
            prepare()
        try:
            await _in_thread(lambda: self.host.close(self._workbench))
        except BaseException:
            abandon = getattr(self.host, "abandon_finish", None)
            if abandon is not None:
                await _in_thread(abandon)
            raise
        self.record.harness_event(
            "harness.sample.end",
            f"inspect task {self.record.task}: the sample's session ended"
            + (" (interrupted)" if interrupted else ""),
            interrupted=interrupted,
        )
        landed = await _in_thread(lambda: self.host.finish(later=_LATER))
        self.report = {**containment_report(self.record, landed=landed), "session": dict(self._session)}
        _attach_to_sample(self.report)
        if self._pool is not None:
            # The next sample's spare, if the one this sample's take started
            # was taken meanwhile (more samples at once than spares).
            self._pool.fill(task=self.record.task)

    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        """``stockade session shell`` for the sample's session, when the daemon
        hosts it: a line-by-line shell whose every line is a recorded exec in
        the sample's cell, inside all its layers.

        Raises:
            ConnectionError: the sample's session has ended.
            NotImplementedError: no daemon hosts the session (it lives in this
                process); the message says to start one.
        """
        if self._closed:
            raise ConnectionError(f"the stockade session of run {self.record.run_id} has ended")
        socket = getattr(self._workbench, "socket", None)
        session_id = getattr(self._workbench, "session_id", None)
        if self.host.via != "daemon" or socket is None or session_id is None:
            # Entering the cell's namespaces from outside (nsenter) would skip
            # its Landlock and seccomp, which is no connection to offer.
            raise NotImplementedError(
                f"the stockade session of run {self.record.run_id} lives inside the eval's process, "
                "which offers no outside connection; start the daemon for the same state directory "
                "(`stockade daemon &`) before the eval, and each sample's session is the daemon's, "
                "reached with `stockade session shell`"
            )
        argv = [_stockade_command(), "session", "shell", "--socket", socket, "--cwd", self._cwd]
        if user is not None:
            argv += ["--user", user]
        return SandboxConnection(type="stockade", command=shlex.join([*argv, session_id]))

    def default_polling_interval(self) -> float:
        return 0.2

    # ------------------------------------------------------------------ exec and files

    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        # timeout_retry is for transports that hang (docker exec under load);
        # a cell's timeout is the command's own slowness, and running it twice
        # more would only take three times as long to say so.
        self._check_open()
        data = input.encode("utf-8") if isinstance(input, str) else input
        limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        where = self._resolve(cwd) if cwd is not None else self._cwd
        workbench = self._workbench
        files = self._files

        def run() -> Any:
            uid = None if user is None else _uid_of(workbench, user)
            if user is not None and uid is None:
                return None  # no such user: a failed command, as docker exec says it
            argv = list(cmd)
            if sum(len(a.encode()) + 1 for a in argv) > ARGV_IN_REQUEST:
                argv = _staged_argv(files, argv, uid)
            return workbench.exec(
                argv, input=data, cwd=where, env=env, user=uid, timeout=timeout, output_limit=limit
            )

        try:
            async with _throttled(concurrency):
                result = await _in_thread(run)
        except UsageError as exc:
            if user is not None and "only a root workbench" in str(exc):
                raise SandboxUserUnsupportedError(str(exc)) from exc
            raise
        if result is None:
            return ExecResult(
                success=False,
                returncode=1,
                stdout="",
                stderr=f"stockade: no user {user!r} in the cell's /etc/passwd\n",
            )
        stdout = result.stdout.decode("utf-8", "replace")
        stderr = result.stderr.decode("utf-8", "replace")
        if result.timed_out:
            raise TimeoutError(
                f"the command {cmd[:1]!r} ran past its timeout of {timeout} s in the stockade cell"
            )
        if result.truncated:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR, stdout)
        if result.returncode == 126 and "ermission denied" in stderr:
            raise PermissionError(f"cannot execute {cmd[0]!r} in the stockade cell: {stderr.strip()}")
        return ExecResult(
            success=result.returncode == 0, returncode=result.returncode, stdout=stdout, stderr=stderr
        )

    async def write_file(self, file: str, contents: str | bytes) -> None:
        self._check_open()
        path = self._resolve(file)
        data = contents.encode("utf-8") if isinstance(contents, str) else contents
        workbench = self._workbench

        def write() -> None:
            try:
                workbench.write_file(path, data)
            except FileNotFoundError:
                # Inspect's contract: missing parents are made, as the sandbox's user.
                made = workbench.exec(["/bin/mkdir", "-p", "--", os.path.dirname(path)])
                if made.returncode != 0:
                    raise
                workbench.write_file(path, data)

        await _in_thread(write)

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> Union[str | bytes]:  # noqa: UP007
        self._check_open()
        path = self._resolve(file)
        limit = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE
        workbench = self._workbench
        try:
            data = await _in_thread(lambda: workbench.read_file(path, limit=limit))
        except UsageError as exc:
            # The path is a non-empty str and the limit a count (checked
            # here): what is left to refuse is a file over the limit.
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, None) from exc
        if text:
            # newline="" semantics: bytes decoded as they are, CRLF kept.
            return data.decode("utf-8")
        return data

    def _resolve(self, path: str) -> str:
        if not path or "\0" in path:
            raise FileNotFoundError(errno.ENOENT, "not a path", path)
        return path if os.path.isabs(path) else os.path.join(self._cwd, path)

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxUnavailableError(
                f"the stockade session of run {self.record.run_id} has ended; a sandbox is usable "
                "only between its sample's init and cleanup"
            )


_POOLS: dict[str, SparePool] = {}
"""The spares of each sandbox config between its task_init and task_cleanup."""
SPARE_TASK = "spare"
"""The task name a spare started by task_init runs under (its daemon run is
``inspect/spare``) until a sample takes it and names it."""
_POOLS_LOCK = threading.Lock()
_LATER = Later()
"""What samples' ends handed on (a daemon run's placeholder to stop)."""


@atexit.register
def _close_pools() -> None:
    """Spares left by a caller that never called task_cleanup (Inspect always
    does): ended and recorded before the interpreter goes, not killed with it."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for pool in pools:
        pool.close()
    _LATER.wait(30.0)


def _pool_key(config: SandboxEnvironmentConfigType | None) -> str:
    if config is None:
        return ""
    if isinstance(config, str):
        return "file:" + os.path.abspath(config)
    if isinstance(config, BaseModel):
        return f"{type(config).__name__}:{config.model_dump_json()}"
    return repr(config)


def _start_session(task_name: str, policy: Policy, state: str | None, *, sample_id: str | None) -> Spare:
    """A sample's session, started now: for ``sample_id``, or a spare (None),
    whose sample is named when one takes it.

    Raises:
        StockadeError: the session cannot start (the host's, the policy's or
            the daemon's reason).
    """
    started, started_at = time.monotonic(), time.time()
    host = start_sample(harness="inspect", task=task_name, sample=sample_id or "", state=state)
    spare = Spare(host, cast(Workbench, None), "/", policy, started, started_at)
    if sample_id is not None:
        _sample_started(spare, ahead=False)
    try:
        workbench = host.open(policy)
    except BaseException:
        with contextlib.suppress(Exception):
            host.finish()
        raise
    try:
        pwd = workbench.exec(["/bin/pwd"], timeout=30)
    except BaseException:
        with contextlib.suppress(Exception):
            host.close(workbench)
        with contextlib.suppress(Exception):
            host.finish()
        raise
    spare.workbench = workbench
    spare.cwd = pwd.stdout.decode("utf-8", "replace").strip() or "/"
    return spare


def _sample_started(spare: Spare, *, ahead: bool) -> None:
    record, policy = spare.host.record, spare.policy
    record.harness_event(
        "harness.sample.start",
        f"inspect task {record.task}: a sample starts in a stockade session ({spare.host.via})"
        + (", started ahead" if ahead else ""),
        policy=policy.name,
        image=policy.image,
        via=spare.host.via,
        ahead=ahead,
        session_started=round(spare.started_at, 6),
    )


def _uid_of(workbench: Workbench, user: str) -> int | str | None:
    """``user`` as the session takes it: root, a number, or a name looked up
    in the cell's own /etc/passwd (an image's users, one adduser made a
    moment ago); None when no such user is there."""
    if user == "root" or user.isdigit():
        return user
    try:
        passwd = workbench.read_file("/etc/passwd", limit=16 << 20)
    except OSError:
        return None
    for line in passwd.decode("utf-8", "replace").splitlines():
        fields = line.split(":")
        if len(fields) > 2 and fields[0] == user and fields[2].isdigit():
            return int(fields[2])
    return None


def _staged_argv(files: ExecFiles, argv: list[str], uid: int | str | None) -> list[str]:
    """An argv too long for one session call: its words go to a file in the
    cell (NUL-separated, as the caller's user), and bash reads them back and
    execs them, so the command sees exactly ``argv``."""
    path = f"/tmp/.stockade-argv-{os.urandom(6).hex()}"
    files.write_file(path, b"\0".join(a.encode() for a in argv) + b"\0", user=uid)
    script = 'mapfile -d "" -t a < "$0" && rm -f -- "$0" && exec "${a[@]}"'
    return ["/bin/bash", "-c", script, path]


def _stockade_command() -> str:
    """The ``stockade`` executable beside this interpreter (the venv's), else
    the one on ``PATH``."""
    beside = os.path.join(os.path.dirname(sys.executable), "stockade")
    return beside if os.access(beside, os.X_OK) else "stockade"


async def _in_thread(fn: Callable[[], T]) -> T:
    return await anyio.to_thread.run_sync(fn, limiter=_THREADS)


def _throttled(wanted: bool) -> contextlib.AbstractAsyncContextManager[object]:
    if not wanted:
        return contextlib.nullcontext()
    from inspect_ai.util._subprocess import max_subprocesses_context_var

    return concurrency("subprocesses", max_subprocesses_context_var.get())


def _attach_to_sample(report: dict[str, Any]) -> None:
    """Put the report into the running sample's metadata (the eval log's
    ``samples[i].metadata.stockade``); outside an eval there is none."""
    from inspect_ai.solver._task_state import sample_state

    state = sample_state()
    if state is not None:
        state.metadata["stockade"] = report


__all__ = ["StockadeSandboxConfig", "StockadeSandboxEnvironment", "resolve_policy"]
