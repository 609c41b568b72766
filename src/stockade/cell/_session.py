"""``Session``: one long-lived workbench cell serving many calls.

A ``Cell`` runs one command per cell. A session launches one cell whose init
(C2, ``_native.c`` with ``_session_init.h``) runs no command of its own: it
serves calls sent on a socket from here, each a child the init starts
inside every layer of the cell (namespaces, the view, Landlock, seccomp,
cgroups) sharing its memory until it execs (``CLONE_VM | CLONE_VFORK``), so
a call costs a vfork and an exec, not a cell. Why the init and not a helper
program in the cell: a workbench's image may hold no Python, no shell, nothing
of ours; the init is already in memory there.

Per call the host makes a control socket (``SO_PASSCRED``: the kernel tells
it the call's host pid), moves the call into a cgroup of its own under the
cell's (so that a timeout's ``cgroup.kill`` ends its whole tree, double-forked
daemons included, and nothing of the other calls), and pumps its stdin and
output through pipes. File operations are calls too: a child of the init
takes the call's user, opens the path inside the cell's view and hands the
descriptor back, so permissions, symlinks and mounts mean what they mean
inside (an open that may wait, a fifo's, is a fork of that child's, killed
at the call's timeout).

State lasts across calls (files, installed things, background processes);
``close()`` ends the cell and returns its ``CellResult`` with the persistence
report, the session's own events (``session.exec`` for each call) and every
kernel refusal, each attributed to the call whose process it was.
"""

from __future__ import annotations

import array
import contextlib
import dataclasses
import errno
import math
import os
import re
import select
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from stockade.cell._cell import Cell, CellResult, EventSink
from stockade.cell._migration import launching
from stockade.errors import CellError, PolicyError, UsageError
from stockade.policy import Policy
from stockade.record import Event

if TYPE_CHECKING:
    from stockade.cell._audit import AuditReader
    from stockade.cell._cell import CellNetwork
    from stockade.cell._cgroup import CellCgroup

MAX_REQUEST = 1 << 20
"""The most bytes of argv, env and cwd one call may send (``SESSION_MAX_REQUEST``
in ``_session_init.h``); Linux's own ARG_MAX is 2 MiB, a quarter of the stack."""
DEFAULT_OUTPUT_LIMIT = 64 << 20
"""Bytes of stdout (and again of stderr) a call keeps when neither it nor the
policy's ``limits.output`` says: the rest is read and dropped, ``truncated``."""
AFTER_EXIT_GRACE = 0.1
"""Seconds the output of a call is still read once its command has exited
and no more comes: a background process it started (``server &``) may hold
the pipes open for as long as it lives, and the call is over all the same."""
START_TIMEOUT = 30.0
"""Seconds a call's child has to report that it started (a fork and a few
syscalls: only a cell frozen or out of processes takes this long)."""
CALLS_REMEMBERED = 4096
"""Calls a refusal read late is still matched against (by pid and time)."""
SESSION_ARGV = ("stockade-session",)
"""What ``cell.start`` names as the command of a session's cell."""

_READ = 65536
_WAIT_STATUS = re.compile(rb"(?:^|\n)W-?\d+\n")
"""The init's report of a call's end, on a line of its own (an error line
before it may hold any text)."""
_ERROR_LINE = re.compile(rb"(?:^|\n)E[^\n]*\n")
"""A child's report of the step that failed (``die()``), whole."""
_UCRED = struct.Struct("iII")  # struct ucred: pid, uid, gid (unix(7))


@dataclass(frozen=True)
class SessionResult:
    """How one call in a session ended."""

    returncode: int
    """The command's exit code; 128+N when a signal N ended it (as the
    cell's and a shell's); 126/127 when it could not be run (not executable /
    not found, or a cwd that cannot be entered: the reason is in stderr)."""
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    truncated: bool = False
    """Output past ``output_limit`` was dropped (on either stream)."""
    call: str = ""
    """The call's id in the record (``session.exec`` and the refusals of its processes)."""
    duration: float = 0.0


@dataclass
class _Call:
    call_id: str
    start: float
    end: float = math.inf
    cgroup: str | None = None
    pid: int | None = None
    """The host pid of the call's first process (the command, or the opener)."""


class Session:
    """A long-lived workbench cell serving many ``exec``, ``read_file`` and
    ``write_file`` calls, concurrently from any number of threads.

    ``with Session(policy) as s: s.exec(["make"])``; ``close()`` (or the end
    of the ``with``) ends the cell and every process in it and returns its
    ``CellResult``. Not a ``Cell``: a session has no command of its own and no
    cell-wide timeout; every call has its own.
    """

    def __init__(
        self,
        policy: Policy | None = None,
        *,
        image: object | None = None,
        workspace: str | os.PathLike[str] | None = None,
        run_id: str | None = None,
        on_event: EventSink | None = None,
        keep_workspace: bool | None = None,
        audit: AuditReader | Literal["auto", "off"] | None = "auto",
        environ: Mapping[str, str] | None = None,
        sockets: Mapping[str, str] | None = None,
        extra_env: Mapping[str, str] | None = None,
        files: Mapping[str, bytes] | None = None,
        network: CellNetwork | None = None,
        records: str | None = None,
        max_calls: int = 64,
        upper_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        """
        Args:
            policy: the policy; the default policy when omitted.
            image: the workbench's image (``stockade.image.Image``) as ``/``;
                the host's view when None. Passed on to ``Cell``.
            workspace, keep_workspace, audit, environ, sockets, extra_env,
                files, network, records: as for ``Cell``.
            run_id: the daemon's run this session belongs to; set on every event.
            on_event: called with each event as it happens (``cell.start``,
                each kernel refusal with the call it belongs to,
                ``session.exec`` for each call), from the threads that make them.
            max_calls: calls in flight at once; one more waits for a free
                slot (each holds a process and a few descriptors).
            upper_dir: with an image, keep the session's upper layer there
                (``Cell``'s): what its calls changed outside the mounts
                (a package installed, ``/etc``) outlives it, and a later cell
                or session given the same directory starts from it.

        Raises:
            HostError, PolicyError: as ``Cell`` (the host lacks a layer, the
                policy cannot be honoured).
            UsageError: ``max_calls`` is not a positive number.
        """
        if not isinstance(max_calls, int) or isinstance(max_calls, bool) or not 1 <= max_calls <= 1000:
            raise UsageError(f"max_calls {max_calls!r} is not a number of calls from 1 to 1000; pass e.g. 64")
        self._cell = Cell(
            policy,
            workspace=workspace,
            keep_workspace=keep_workspace,
            audit=audit,
            environ=environ,
            run_id=run_id or "",
            sockets=sockets,
            extra_env=extra_env,
            files=files,
            network=network,
            records=records,
            image=image,  # a workbench's (cell/_workbench.py)
            upper_dir=upper_dir,
        )
        self.policy = self._cell.policy
        self.run_id = run_id or ""
        self.session_id = "s-" + os.urandom(6).hex()
        self.cell_id = ""
        """The cell's id (its ``cell.start`` event), known once started."""
        self._sink = on_event
        self._slots = threading.BoundedSemaphore(max_calls)
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._cgroup: CellCgroup | None = None
        self._init_pid = 0
        """The host pid of the cell's init, once started."""
        self._failure: BaseException | None = None
        self._result: CellResult | None = None
        self._closed = False
        self._calls: dict[str, _Call] = {}
        self._count = 0
        self._events: list[Event] = []
        """The session's own events (``session.*``), in order."""
        self._annotated: dict[int, Event] = {}
        """id(an event of the cell's) -> the same with the call it belongs to."""
        self._originals: list[Event] = []
        self._env: dict[str, str] = {}
        self._workdir = "/"
        self._uid = self._gid = 0
        self._may_change_user = False

    # ------------------------------------------------------------------ life

    @property
    def workspace(self) -> str:
        return self._cell.workspace

    def start(self) -> Session:
        """Launch the cell; returns once it serves calls.

        Raises:
            CellError: the cell could not be set up, or the session was closed.
            HostError: a layer the policy needs is not available.
        """
        with self._lock:
            if self._closed:
                raise CellError(f"session {self.session_id} is closed; open a new one")
            if self._thread is not None:
                return self
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            # A request is one message, and a message must fit in the
            # sender's buffer (212992 bytes by default): root may force more.
            for option in (getattr(socket, "SO_SNDBUFFORCE", 32), socket.SO_SNDBUF):
                with contextlib.suppress(OSError):
                    ours.setsockopt(socket.SOL_SOCKET, option, 2 * MAX_REQUEST)
                    break
            self._sock = ours
            plan, _landlock, _seccomp = self._cell._prepared_plan()
            self._env = dict(plan.env)
            self._workdir = plan.workdir
            self._uid, self._gid = getattr(plan, "uid", 1000), getattr(plan, "gid", 1000)
            # Another user than the cell's own needs CAP_SETUID/CAP_SETGID in
            # its namespace, which only a root workbench keeps (_plan.ROOT_CAPS).
            self._may_change_user = bool(getattr(plan, "keep_caps", 0) & (1 << 6)) and bool(
                getattr(plan, "keep_caps", 0) & (1 << 7)
            )

            def started(cgroup: CellCgroup, init_pid: int) -> None:
                self._cgroup = cgroup
                self._init_pid = init_pid
                theirs.close()  # the cell's init holds its own copy now
                self._ready.set()

            def run() -> None:
                try:
                    self._result = self._cell.run(
                        SESSION_ARGV, on_event=self._from_cell, session=(theirs.fileno(), started)
                    )
                except BaseException as exc:  # handed to start() or close()
                    self._failure = exc
                finally:
                    with contextlib.suppress(OSError):
                        theirs.close()
                    self._ready.set()

            self._thread = threading.Thread(target=run, name=f"session-{self.session_id}", daemon=True)
            self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            failure = self._failure
            self.close()
            raise failure
        if self._result is not None:  # the init ended at once
            raise CellError(
                f"session {self.session_id}'s cell ended as it started: {self._result.stderr[-500:]!r}"
            )
        self._emit(
            "session.open",
            f"session {self.session_id} opened",
            {"session": self.session_id, "policy": self.policy.name, "workspace": self.workspace},
        )
        return self

    def close(self) -> CellResult:
        """End the cell and every process in it; its ``CellResult`` (the
        persistence report included). Idempotent: the same result again.

        Raises:
            CellError: the cell failed (its error is the cause), or never started.
        """
        with self._lock:
            first = not self._closed
            self._closed = True
            sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()  # the init's EOF: it exits, and the kernel ends its pid namespace
        if self._thread is not None:
            self._thread.join()
        if self._failure is not None:
            raise CellError(f"session {self.session_id} failed: {self._failure}") from self._failure
        if self._result is None:
            self._cell.close()
            raise CellError(f"session {self.session_id} was never started; call start() or use it in a with")
        if first:
            self._emit("session.close", f"session {self.session_id} closed", {"session": self.session_id})
            self._cell.close()
            result = self._result
            mine = tuple(self._events)
            events = sorted(
                (*(self._annotated.get(id(e), e) for e in result.events), *mine), key=lambda e: e.time
            )
            live = (*(self._annotated.get(id(e), e) for e in result.live), *(mine if self._sink else ()))
            self._result = dataclasses.replace(result, events=tuple(events), live=live)
        return self._result

    def __enter__(self) -> Session:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ calls

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
    ) -> SessionResult:
        """Run ``argv`` in the session's cell and wait for it.

        Args:
            argv: the command; looked up on the call's ``PATH`` when it has no slash.
            input: bytes for its stdin (none: /dev/null).
            cwd: an absolute path inside the cell; the cell's workdir by default.
            env: variables set over the cell's environment for this call.
            user: a uid or name inside the cell; the cell's own by default.
                Another user needs a root workbench (``user: root``).
            timeout: seconds; the policy's ``limits.timeout`` by default.
                At the deadline the call's whole process tree is killed.
            output_limit: bytes kept of stdout and again of stderr; the
                policy's ``limits.output``, else ``DEFAULT_OUTPUT_LIMIT``.

        Raises:
            UsageError: an argument is wrong (the message says which and why).
            CellError: the session is closed, or its cell is gone.
        """
        command = _argv(argv)
        data = _input(input)
        where = self._cwd(cwd)
        variables = self._call_env(env)
        uid, gid = self._user(user)
        seconds = self._timeout(timeout)
        limit = self._output_limit(output_limit)
        payload = (
            b"\0".join(
                [b"X", b"%d" % uid, b"%d" % gid, os.fsencode(where), b"%d" % len(command)]
                + [os.fsencode(a) for a in command]
                + [os.fsencode(f"{k}={v}") for k, v in sorted(variables.items())]
            )
            + b"\0"
        )
        if len(payload) > MAX_REQUEST:
            raise UsageError(
                f"the call's argv, env and cwd take {len(payload)} bytes, more than the {MAX_REQUEST} a call "
                "may send; pass large data as input (stdin) or write it to a file first"
            )
        with self._slots:
            call = self._begin()
            try:
                result = self._run_call(call, payload, data, seconds, limit)
            finally:
                self._end(call)
        self._emit(
            "session.exec",
            f"{_shortened(' '.join(command))} exited {result.returncode}"
            + (" (timeout)" if result.timed_out else ""),
            {
                "session": self.session_id,
                "call": call.call_id,
                "argv": list(command),
                "cwd": where,
                "uid": uid,
                "exit_code": result.returncode,
                "duration": round(result.duration, 6),
                "timed_out": result.timed_out,
                "truncated": result.truncated,
                "stdout_bytes": len(result.stdout),
                "stderr_bytes": len(result.stderr),
            },
            outcome="denied" if result.timed_out else "info",
        )
        return result

    def read_file(
        self,
        path: str,
        *,
        user: str | int | None = None,
        limit: int | None = None,
        block: bool = True,
        timeout: float | None = None,
    ) -> bytes:
        """The content of ``path`` as ``user`` sees it inside the cell.

        Args:
            path: absolute, or relative to the cell's workdir.
            limit: the most bytes to return; a longer file is an error.
            block: False opens it ``O_NONBLOCK``: a fifo gives what is in it
                now (nothing without a writer) instead of holding the call
                until a writer comes (the broker's fs intents: the path is the
                agent's to choose).
            timeout: seconds an open that waits (a fifo's writer, a device)
                may take; the policy's ``limits.timeout`` by default. At the
                deadline the opener is killed.

        Raises:
            FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError,
                OSError: as Python's ``open`` raises them, for the path inside the cell.
            TimeoutError: the open waited past ``timeout`` (ETIMEDOUT).
            UsageError: an argument is wrong, or the file is longer than ``limit``.
            CellError: the session is closed, or its cell is gone.
        """
        where = self._path(path)
        uid, gid = self._user(user)
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
            raise UsageError(f"limit {limit!r} is not a number of bytes; pass e.g. 1048576, or None")
        seconds = self._timeout(timeout)
        fd = self._open(where, uid, gid, os.O_RDONLY | (0 if block else os.O_NONBLOCK), -1, seconds)
        try:
            chunks: list[bytes] = []
            size = 0
            while True:
                try:
                    chunk = os.read(fd, 1 << 20)
                except OSError as exc:
                    raise OSError(exc.errno, os.strerror(exc.errno or 0), where) from None
                if not chunk:
                    break
                size += len(chunk)
                if limit is not None and size > limit:
                    raise UsageError(
                        f"{where} in session {self.session_id} holds more than the limit of {limit} bytes; "
                        "pass a larger limit, or read it in parts with exec"
                    )
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def write_file(
        self,
        path: str,
        data: bytes,
        *,
        user: str | int | None = None,
        mode: int | None = None,
        exist: Literal["replace", "fail", "append"] = "replace",
        block: bool = True,
        timeout: float | None = None,
    ) -> None:
        """Create or replace ``path`` with ``data``, as ``user`` inside the cell.

        Args:
            path: absolute, or relative to the cell's workdir; its directory must exist.
            mode: the file's permission bits (e.g. 0o755); a new file gets
                0o644 (0o666 less the cell's umask) by default.
            exist: what to do with a file already there: ``replace`` its
                content, ``fail`` (``FileExistsError``: the broker's
                ``fs.write`` mode ``create``), or ``append`` to it.
            block: False opens it ``O_NONBLOCK``, as ``read_file``'s: a fifo
                without a reader fails at once (ENXIO).
            timeout: as ``read_file``'s (a fifo's reader, a read lease's holder).

        Raises:
            FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError,
                OSError: as Python's ``open`` raises them, for the path inside the cell.
            TimeoutError: the open waited past ``timeout`` (ETIMEDOUT).
            UsageError: an argument is wrong.
            CellError: the session is closed, or its cell is gone.
        """
        where = self._path(path)
        uid, gid = self._user(user)
        body = _input(data, what="data")
        if body is None:
            raise UsageError("data is None; pass the file's content as bytes (b'' for an empty file)")
        if mode is not None and (
            not isinstance(mode, int) or isinstance(mode, bool) or not 0 <= mode <= 0o7777
        ):
            raise UsageError(f"mode {mode!r} is not a file mode from 0 to 0o7777; pass e.g. 0o644")
        how = {"replace": os.O_TRUNC, "fail": os.O_EXCL, "append": os.O_APPEND}.get(exist)
        if how is None:
            raise UsageError(f"exist {exist!r} is not one of replace, fail, append; pass e.g. 'replace'")
        flags = os.O_WRONLY | os.O_CREAT | how | (0 if block else os.O_NONBLOCK)
        seconds = self._timeout(timeout)
        fd = self._open(where, uid, gid, flags, -1 if mode is None else mode, seconds)
        try:
            view = memoryview(body)
            while view:
                try:
                    view = view[os.write(fd, view) :]
                except OSError as exc:
                    raise OSError(exc.errno, os.strerror(exc.errno or 0), where) from None
        finally:
            os.close(fd)

    def list_dir(
        self, path: str, *, user: str | int | None = None, limit: int = 10_000
    ) -> tuple[list[tuple[str, str, int]], bool]:
        """The entries of the directory ``path`` as ``user`` sees it inside the
        cell: ``([(name, type, size)…], truncated)``, sorted by name, at most
        ``limit``; ``type`` as the broker's ``fs.list`` says it (``file``, ``dir``,
        ``symlink``, ``fifo``, ``socket``, ``char``, ``block``, ``other``).

        The directory is opened inside the cell (as the user, in its view, as
        ``read_file`` opens a file); its entries are read and each is
        ``lstat``-ed through that descriptor, one name at a time, never
        following a link, so that nothing outside the directory is looked at.

        Raises:
            FileNotFoundError, PermissionError, NotADirectoryError, OSError: for
                the path inside the cell.
            UsageError, CellError: as ``read_file``.
        """
        where = self._path(path)
        uid, gid = self._user(user)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise UsageError(f"limit {limit!r} is not a number of entries; pass e.g. 10000")
        fd = self._open(where, uid, gid, os.O_RDONLY | os.O_DIRECTORY, -1, None)  # a directory never waits
        try:
            try:
                names = sorted(os.listdir(fd))
            except OSError as exc:
                raise OSError(exc.errno, os.strerror(exc.errno or 0), where) from None
            entries: list[tuple[str, str, int]] = []
            for name in names[:limit]:
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except OSError:
                    continue  # gone since it was listed
                kind = _KINDS.get(stat.S_IFMT(st.st_mode), "other")
                entries.append((name, kind, st.st_size if kind == "file" else 0))
            return entries, len(names) > limit
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ arguments

    def _path(self, path: str) -> str:
        if not isinstance(path, str):
            raise UsageError(
                f"path {path!r} is not a str; pass a path inside the cell such as '/app/main.py'"
            )
        if not path or "\0" in path:
            raise UsageError(f"path {path!r} is empty or holds a NUL byte; pass a path inside the cell")
        where = os.path.normpath(os.path.join(self._workdir, path))
        if len(os.fsencode(where)) >= 4000:
            raise UsageError(f"path {where[:80]!r}… is too long for the kernel (PATH_MAX 4096)")
        return where

    def _cwd(self, cwd: str | None) -> str:
        if cwd is None:
            return self._workdir
        if not isinstance(cwd, str) or not cwd.startswith("/") or "\0" in cwd:
            raise UsageError(
                f"cwd {cwd!r} is not an absolute path inside the cell; pass one such as {self._workdir!r}"
            )
        return cwd

    def _call_env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        merged = dict(self._env)
        if env is None:
            return merged
        if not isinstance(env, Mapping):
            raise UsageError(f"env {env!r} is not a mapping; pass a dict such as {{'LANG': 'C.UTF-8'}}")
        for key, value in env.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise UsageError(f"env entry {key!r}: {value!r} is not str: str; pass text for both")
            if not key or "=" in key or "\0" in key or "\0" in value:
                raise UsageError(
                    f"env name {key!r} (value {value[:40]!r}) is empty, holds '=' or a NUL byte; "
                    "pass a name such as 'LANG'"
                )
            merged[key] = value
        return merged

    def _user(self, user: str | int | None) -> tuple[int, int]:
        if user is None:
            return self._uid, self._gid
        uid: int | None = None
        gid: int | None = None
        image = getattr(self._cell, "image", None)
        if image is not None and isinstance(user, str | int) and not isinstance(user, bool):
            # A name (or a uid and its group) as the image's /etc/passwd says.
            from stockade.cell._workbench import resolve_user

            try:
                found = resolve_user(str(user), image.rootfs)
                uid, gid = found.uid, found.gid
            except PolicyError as exc:
                raise UsageError(f"user {user!r} of session {self.session_id}: {exc}") from None
        elif isinstance(user, int) and not isinstance(user, bool):
            uid = user
        elif isinstance(user, str) and user.isdigit():
            uid = int(user)
        elif isinstance(user, str) and user == "root":
            uid = 0
        elif isinstance(user, str) and user == "agent":
            uid = 1000
        if uid is None or not 0 <= uid < 2**32 - 1:
            raise UsageError(
                f"user {user!r} is not a user of session {self.session_id}'s cell; "
                f"pass a uid, or None for the cell's own ({self._uid})"
            )
        if uid == self._uid:
            return self._uid, self._gid
        if not self._may_change_user:
            raise UsageError(
                f"user {user!r} is not the cell's own user ({self._uid}), and only a root workbench "
                "(policy `user: root`) may run a call as another; leave user out"
            )
        return uid, uid if gid is None else gid

    def _timeout(self, timeout: float | None) -> float | None:
        if timeout is None:
            return self.policy.limits.timeout
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < math.inf:
            raise UsageError(f"timeout {timeout!r} is not a positive number of seconds; pass e.g. 30")
        return float(timeout)

    def _output_limit(self, limit: int | None) -> int:
        if limit is None:
            return self.policy.limits.output or DEFAULT_OUTPUT_LIMIT
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise UsageError(f"output_limit {limit!r} is not a number of bytes; pass e.g. 1048576")
        return limit

    # ------------------------------------------------------------------ the wire

    def _begin(self) -> _Call:
        with self._lock:
            if self._closed or self._sock is None:
                raise CellError(f"session {self.session_id} is closed; open a new one")
            if self._result is not None or self._failure is not None:
                raise CellError(f"session {self.session_id}'s cell has ended; open a new session")
            self._count += 1
            call = _Call(f"{self.session_id}.{self._count}", time.time())
            self._calls[call.call_id] = call
            if len(self._calls) > CALLS_REMEMBERED:  # what a late refusal is matched against
                del self._calls[next(iter(self._calls))]
            return call

    def _end(self, call: _Call) -> None:
        call.end = time.time()
        if call.cgroup is not None:
            # Empty once the call and all it started ended; a background
            # process keeps it (and so its place in the record) until close.
            with contextlib.suppress(OSError):
                os.rmdir(call.cgroup)

    def _send(self, payload: bytes, fds: list[int]) -> None:
        with self._send_lock:
            sock = self._sock
            if sock is None:
                raise CellError(f"session {self.session_id} is closed; open a new one")
            try:
                sock.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            except OSError as exc:
                raise CellError(
                    f"session {self.session_id}'s cell does not take calls any more ({exc.strerror}); "
                    "open a new session"
                ) from exc

    def _call_cgroup(self, call: _Call, pid: int) -> str | None:
        """Move the call's first process into a cgroup of its own under the
        cell's v2 one (before it execs: nothing it starts is outside)."""
        cgroup = self._cgroup
        if cgroup is None or not cgroup.paths:
            return None
        path = os.path.join(cgroup.paths[0], "call-" + call.call_id.rsplit(".", 1)[1])
        try:
            os.mkdir(path)
            with open(os.path.join(path, "cgroup.procs"), "w") as f:
                f.write(str(pid))
        except OSError:
            with contextlib.suppress(OSError):
                os.rmdir(path)
            return None
        return path

    def _started(self, ctl: socket.socket, call: _Call, deadline: float) -> tuple[int | None, bytes]:
        """Wait for the call's child to say it started; (its host pid, what
        came after) or (None, the report of what failed)."""
        got = bytearray()
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([ctl], [], [], left)[0]:
                raise CellError(
                    f"call {call.call_id} did not start within {START_TIMEOUT:g} s (the cell is frozen or "
                    "out of processes); close the session"
                )
            data, ancdata, _flags, _addr = ctl.recvmsg(4096, socket.CMSG_SPACE(_UCRED.size))
            if not data:
                return None, bytes(got)
            if data[:1] == b"S" and not got:
                pid = next(
                    (
                        _UCRED.unpack_from(d)[0]
                        for level, kind, d in ancdata
                        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS
                    ),
                    None,
                )
                return pid, data[1:]
            got.extend(data)
            if got.startswith(b"E") and b"\n" in got:
                return None, bytes(got)

    def _run_call(
        self, call: _Call, payload: bytes, data: bytes | None, seconds: float | None, limit: int
    ) -> SessionResult:
        start = time.monotonic()
        # The call's move into its own cgroup (_call_cgroup) finds the
        # kernel's semaphore slow, as the next call within a second will.
        launching()
        ctl, ctl_cell = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ctl.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        if data is None:
            in_r, in_w = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), -1
        else:
            in_r, in_w = os.pipe2(os.O_CLOEXEC)
        mine = [out_r, err_r, in_w]
        try:
            try:
                self._send(payload, [in_r, out_w, err_w, ctl_cell.fileno()])
            finally:
                for fd in (in_r, out_w, err_w):
                    os.close(fd)
                ctl_cell.close()
            pid, rest = self._started(ctl, call, start + START_TIMEOUT)
            call.pid = pid
            if pid is not None:
                call.cgroup = self._call_cgroup(call, pid)
                ctl.sendall(b"G")
            report = bytearray(rest)
            outcome = _pump(
                ctl,
                report,
                out_r,
                err_r,
                in_w,
                data,
                None if seconds is None else start + seconds,
                limit,
                lambda: self._kill_call(call, pid),
                wait_for_exit=pid is not None,
            )
            mine[2] = -1  # _pump closed stdin's pipe
        finally:
            for fd in mine:
                if fd >= 0:
                    os.close(fd)
            ctl.close()
        status, error = _parse_report(bytes(report))
        stdout, stderr, timed_out, truncated = outcome
        if error is not None:
            stage, err, message = error
            code = 126 if stage != "exec" or err in (errno.EACCES, errno.EPERM) else 127
            stderr = stderr + f"stockade: {message}\n".encode()  # die() gave the reason
        elif status is None:
            raise CellError(
                f"session {self.session_id}'s cell ended during call {call.call_id}; open a new session"
            )
        else:
            code = os.waitstatus_to_exitcode(status)
            code = 128 - code if code < 0 else code
        return SessionResult(
            returncode=code,
            stdout=stdout,
            stderr=stderr,
            timed_out=timed_out,
            truncated=truncated,
            call=call.call_id,
            duration=time.monotonic() - start,
        )

    def _kill_call(self, call: _Call, pid: int | None) -> None:
        """The whole tree of the call: its cgroup's ``cgroup.kill`` (Linux
        5.14), else its process group."""
        if call.cgroup is not None:
            try:
                with open(os.path.join(call.cgroup, "cgroup.kill"), "w") as f:
                    f.write("1")
                return
            except OSError:
                pass
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, 9)

    def _open(self, path: str, uid: int, gid: int, flags: int, mode: int, seconds: float | None) -> int:
        payload = (
            b"\0".join([b"O", b"%d" % uid, b"%d" % gid, os.fsencode(path), b"%d" % flags, b"%d" % mode])
            + b"\0"
        )
        with self._slots:
            call = self._begin()
            try:
                ctl, ctl_cell = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    ctl.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
                    try:
                        self._send(payload, [ctl_cell.fileno()])
                    finally:
                        ctl_cell.close()
                    pid, rest = self._started(ctl, call, time.monotonic() + START_TIMEOUT)
                    if pid is None:
                        report = rest
                        fd = -1
                    else:
                        # No cgroup of its own, unlike an exec: the child
                        # opens one path and exits, starts nothing (but the
                        # one opener of an open that may wait, in its process
                        # group: killpg at the timeout); its refusals are
                        # matched by its pid. The cgroup's mkdir, move and
                        # rmdir were a third of a 4 KiB read
                        # (benchmarks/harness_exec.py).
                        call.pid = pid
                        ctl.sendall(b"G")
                        try:
                            fd, report = _receive_fd(ctl, rest, seconds)
                        except TimeoutError:
                            # Only an open that may wait gets here, in the
                            # fork the call's child left in its process group.
                            self._kill_call(call, pid)
                            raise TimeoutError(
                                errno.ETIMEDOUT, f"opening it waited past the {seconds:g} s timeout", path
                            ) from None
                finally:
                    ctl.close()
            finally:
                self._end(call)
        if fd >= 0:
            return fd
        _status, error = _parse_report(report)
        if error is None:
            raise CellError(
                f"session {self.session_id}'s cell ended while opening {path}; open a new session"
            )
        _stage, err, _message = error
        raise OSError(err, os.strerror(err), path)

    # ------------------------------------------------------------------ events

    def _from_cell(self, event: Event) -> None:
        """An event of the cell (from the audit reader's thread or the
        cell's): a refusal gets the call whose process it was."""
        if event.kind == "cell.start" and not self.cell_id:
            self.cell_id = event.cell
        if event.outcome in ("denied", "audited") and event.layer not in ("cell", "timeout", "cgroup"):
            calls = self._calls_of(event)
            if calls:
                detail = {**event.detail, "session": self.session_id}
                if len(calls) == 1:
                    detail["call"] = calls[0]
                else:
                    detail["calls"] = calls  # several ran then, and its process was gone before it was read
                annotated = dataclasses.replace(event, detail=detail)
                with self._lock:
                    self._originals.append(event)
                    self._annotated[id(event)] = annotated
                event = annotated
        if self._sink is not None:
            self._sink(event)

    def _calls_of(self, event: Event) -> list[str]:
        """The call a refusal belongs to: the one whose first process made it,
        else the one whose cgroup holds its process, else (the process is gone,
        and was a child of a call's) the calls in flight when it came."""
        pid = event.detail.get("pid")
        with self._lock:
            calls = list(self._calls.values())
        if isinstance(pid, int) and pid > 0:
            for c in reversed(calls):  # the latest first: a pid is reused only after a while
                if c.pid == pid:
                    return [c.call_id]
            try:
                with open(f"/proc/{pid}/cgroup") as f:
                    for line in f:
                        if line.startswith("0::"):
                            name = line.rstrip("\n").rsplit("/", 1)[-1]
                            if name.startswith("call-"):
                                return [f"{self.session_id}.{name[5:]}"]
            except OSError:
                pass
        return [c.call_id for c in calls if c.start - 0.05 <= event.time <= c.end + 0.05]

    def _emit(
        self, kind: str, summary: str, detail: dict[str, object], outcome: Literal["info", "denied"] = "info"
    ) -> None:
        event = Event(
            kind=kind,
            cell=self.cell_id,
            layer="cell",
            outcome=outcome,
            summary=summary[:1000],
            detail=detail,
            run=self.run_id,
        )
        with self._lock:
            self._events.append(event)
        if self._sink is not None:
            self._sink(event)


# ---------------------------------------------------------------------- helpers


_KINDS = {
    stat.S_IFREG: "file",
    stat.S_IFDIR: "dir",
    stat.S_IFLNK: "symlink",
    stat.S_IFIFO: "fifo",
    stat.S_IFSOCK: "socket",
    stat.S_IFCHR: "char",
    stat.S_IFBLK: "block",
}
"""File types by ``S_IFMT``, named as ``fs.list`` names them (broker/_fs.py)."""


def _argv(argv: Sequence[str]) -> tuple[str, ...]:
    if isinstance(argv, str | bytes) or not isinstance(argv, Sequence):
        raise UsageError(f"argv {argv!r} is not a list of str; pass e.g. ['sh', '-c', 'make test']")
    command = tuple(argv)
    if not command:
        raise UsageError("argv is empty; pass the command to run, e.g. ['make']")
    for i, arg in enumerate(command):
        if not isinstance(arg, str):
            raise UsageError(f"argv[{i}] {arg!r} is not a str; pass text")
        if "\0" in arg:
            raise UsageError(
                f"argv[{i}] {arg[:60]!r} holds a NUL byte, which no command can receive; remove it"
            )
    if not command[0]:
        raise UsageError("argv[0] is empty; pass the command to run")
    return command


def _input(data: object, what: str = "input") -> bytes | None:
    if data is None:
        return None
    if isinstance(data, bytes):
        return data
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    raise UsageError(f"{what} is a {type(data).__name__}, not bytes; pass bytes (text.encode() for text)")


def _receive_fd(
    ctl: socket.socket, rest: bytes, seconds: float | None, release_timeout: float = 2.0
) -> tuple[int, bytes]:
    """The descriptor an open call's child sent, once the child let go of its
    own copy of it ("D": until then a caller that runs what it just wrote
    would meet ETXTBSY, or a fifo's other end); or (-1, its report) as soon
    as its error line is in. The wait for "D" is bounded (a child killed
    between the two ends it at its EOF anyway).

    Raises:
        TimeoutError: no descriptor nor error within ``seconds``.
    """
    got = bytearray(rest)
    room = socket.CMSG_SPACE(_UCRED.size) + socket.CMSG_SPACE(4 * 4)  # SO_PASSCRED adds credentials
    fd = -1
    ctl.settimeout(seconds)
    try:
        while True:
            if fd < 0 and _ERROR_LINE.search(got):
                return -1, bytes(got)
            data, ancdata, _flags, _addr = ctl.recvmsg(4096, room)
            fds: list[int] = []
            for level, kind, blob in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.extend(array.array("i", blob[: len(blob) - len(blob) % 4]))
            for extra in fds[0 if fd >= 0 else 1 :]:
                os.close(extra)  # only ever one: another is nobody's
            if fds and fd < 0:
                fd = fds[0]
                os.set_inheritable(fd, False)
                ctl.settimeout(release_timeout)
                data = data[1:]  # the "F" it came with
            if fd >= 0 and (not data or b"D" in data):
                return fd, bytes(got)
            if not data:
                return -1, bytes(got)
            if fd < 0:
                got.extend(data)
    except TimeoutError:
        if fd < 0:
            raise
        return fd, bytes(got)  # a descriptor, its child slow to let go: the call has it all the same


def _parse_report(report: bytes) -> tuple[int | None, tuple[str, int, str] | None]:
    """(wait status, the error the child reported first) from a control socket's text."""
    status: int | None = None
    error: tuple[str, int, str] | None = None
    for line in report.split(b"\n"):
        if line.startswith(b"W") and line[1:].lstrip(b"-").isdigit():
            status = int(line[1:])
        elif line.startswith(b"E") and error is None:
            parts = line[1:].decode(errors="replace").split("\t", 2)
            if len(parts) == 3 and parts[1].lstrip("-").isdigit():
                error = (parts[0], int(parts[1]), parts[2])
    return status, error


def _pump(
    ctl: socket.socket,
    report: bytearray,
    out_r: int,
    err_r: int,
    in_w: int,
    data: bytes | None,
    deadline: float | None,
    limit: int,
    kill: Callable[[], None],
    *,
    wait_for_exit: bool,
) -> tuple[bytes, bytes, bool, bool]:
    """Feed stdin, keep up to ``limit`` bytes of each stream, watch the
    control socket for the exit status, kill at the deadline. Closes ``in_w``."""
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    kept = {out_r: 0, err_r: 0}
    truncated = timed_out = False
    poller = select.poll()
    for fd in (out_r, err_r):
        poller.register(fd, select.POLLIN)
    poller.register(ctl.fileno(), select.POLLIN)
    view = memoryview(data) if data is not None else memoryview(b"")
    if in_w >= 0:
        os.set_blocking(in_w, False)
        poller.register(in_w, select.POLLOUT)
    open_streams = {out_r, err_r}
    exited = not wait_for_exit
    exited_at: float | None = time.monotonic() if exited else None
    ctl_fd = ctl.fileno()

    def close_stdin() -> None:
        nonlocal in_w
        if in_w >= 0:
            poller.unregister(in_w)
            os.close(in_w)
            in_w = -1

    try:
        if in_w >= 0 and not view:
            close_stdin()
        while open_streams or not exited:
            now = time.monotonic()
            waits = []
            if deadline is not None and not timed_out:
                waits.append(deadline - now)
            if exited and exited_at is not None:
                waits.append(exited_at + AFTER_EXIT_GRACE - now)
            wait_ms = -1 if not waits else max(0, math.ceil(min(waits) * 1000))
            ready = poller.poll(wait_ms)
            now = time.monotonic()
            if deadline is not None and not timed_out and now >= deadline:
                timed_out = True
                kill()
                close_stdin()
                if exited:  # the command is gone; what holds the pipes was just killed
                    exited_at = now
            if not ready and exited and exited_at is not None and now >= exited_at + AFTER_EXIT_GRACE:
                break  # a background process holds the pipes; the call is over
            for fd, _mask in ready:
                if fd == in_w:
                    try:
                        view = view[os.write(in_w, view[:_READ]) :]
                    except (BrokenPipeError, BlockingIOError) as exc:
                        if isinstance(exc, BrokenPipeError):
                            view = memoryview(b"")
                    if not view:
                        close_stdin()
                    continue
                if fd == ctl_fd:
                    got = ctl.recv(4096)
                    if got:
                        report.extend(got)
                    if not got or _WAIT_STATUS.search(report):
                        poller.unregister(ctl_fd)
                        exited = True
                        exited_at = now
                        close_stdin()
                    continue
                chunk = os.read(fd, _READ)
                if not chunk:
                    poller.unregister(fd)
                    open_streams.discard(fd)
                    continue
                exited_at = now if exited else exited_at
                room = limit - kept[fd]
                if len(chunk) > room:
                    truncated = True
                    chunk = chunk[: max(0, room)]
                if chunk:
                    kept[fd] += len(chunk)
                    chunks[fd].append(chunk)
    finally:
        close_stdin()
    return b"".join(chunks[out_r]), b"".join(chunks[err_r]), timed_out, truncated


def _shortened(text: str, width: int = 200) -> str:
    return (
        text
        if len(text) <= width
        else f"{text[:width]}… ({len(text) - width} more characters in detail.argv)"
    )


__all__ = ["Session", "SessionResult"]
