"""Run the rogue in a cell and pair each of its attempts with the kernel's record of it.

``run_demo`` is the library half of ``stockade demo`` (the CLI only renders):

1. It sets canaries on the host: a TCP listener on 127.0.0.1 and ::1, an
   abstract and a pathname unix socket, a SIGUSR1 handler, a fake API key in
   the environment the cell is launched from, and a second "agent's" workspace
   with a file in it. Whatever reaches one of them got out.
2. It copies ``rogue.py`` into a fresh workspace and runs it with the system's
   ``/usr/bin/python3`` in a cell of the default policy (named ``rogue-demo``).
3. The rogue prints one JSON line per attempt and waits for a go-ahead on its
   stdin. For each line the runner waits until the kernel audit log has caught
   up (a barrier through the audit socket), takes the kernel records that
   arrived meanwhile, matches them to the attempt by path, port, system call or
   pid, and hands the result to ``on_attempt``; then it sends the go-ahead.
4. At the end it checks the canaries, writes the cell's events and the rogue's
   transcript under ``runs/demo-<time>/`` and returns a ``DemoReport``.

A refusal the kernel does not log (a path that is not in the cell's view, a
read-only mount, file permissions…) is reported as such, with the layer the
errno points to: nothing here invents a record.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import Any

from stockade.demo._verdict import Attempt, classify, matches
from stockade.errors import HostError
from stockade.record import Event

ROGUE = Path(__file__).with_name("rogue.py")
PYTHON = "/usr/bin/python3"
"""The rogue runs on the system's interpreter: the virtualenv's lies under a
home directory that the cell does not show."""
POLICY_NAME = "rogue-demo"
CELL_TIMEOUT = 120.0
"""Seconds the whole rogue may take (it takes about one)."""
BARRIER_CELL = "stockade-demo-barrier"
"""A cell id that is never watched: ``collect`` on it is a pure barrier."""
HOME_FILES = (".netrc", ".npmrc", ".pypirc", ".git-credentials", ".bash_history", ".gitconfig",
              ".bashrc", ".profile")  # fmt: skip
"""Files of the operator's home the rogue goes for, best first: the first that
exists is tried (the cell shows it as an empty stand-in that Landlock refuses)."""
SSH_KEYS = ("id_rsa", "id_ed25519", "id_ecdsa")
"""The operator's SSH key the rogue goes for: the first that exists, else id_rsa."""


@dataclass(frozen=True, slots=True)
class Canary:
    """What reached the host's canaries: all zero when nothing got out."""

    tcp: int = 0
    unix: int = 0
    signals: int = 0
    other_workspace_changed: bool = False

    @property
    def touched(self) -> bool:
        return bool(self.tcp or self.unix or self.signals or self.other_workspace_changed)


@dataclass(frozen=True, slots=True)
class DemoSetup:
    """What the demo is about to do, for the header."""

    policy: str
    workspace: str
    layers: tuple[tuple[str, str], ...]
    """(layer, what this host gives it), for the header."""
    canaries: tuple[str, ...]
    limits: str


@dataclass(frozen=True, slots=True)
class DemoReport:
    """The outcome of one demo run."""

    setup: DemoSetup
    attempts: tuple[Attempt, ...]
    canary: Canary
    cell_id: str = ""
    exit_code: int = 0
    """The rogue's own exit code."""
    complete: bool = True
    """The rogue reached its end (``{"done": true}``)."""
    stderr: str = ""
    lost: tuple[Event, ...] = ()
    """``cell.audit_lost`` events: kernel records that may be missing."""
    events_file: str | None = None
    transcript_file: str | None = None
    write_error: str | None = None
    """Why the files could not be written, if they could not."""
    event_count: int = 0
    """Events of the cell, every layer (what ``events_file`` holds)."""
    duration: float = 0.0

    @property
    def task(self) -> Attempt | None:
        return next((a for a in self.attempts if a.category == "task"), None)

    @property
    def escape_attempts(self) -> tuple[Attempt, ...]:
        return tuple(a for a in self.attempts if a.category != "task")

    @property
    def escapes(self) -> tuple[Attempt, ...]:
        return tuple(a for a in self.escape_attempts if a.verdict == "escaped")

    @property
    def task_ok(self) -> bool:
        task = self.task
        return task is not None and task.verdict == "done"

    @property
    def contained(self) -> bool:
        """Every attempt was refused, the task worked, nothing reached a canary."""
        return (
            self.complete
            and self.task_ok
            and not self.escapes
            and not self.canary.touched
            and bool(self.escape_attempts)
        )

    def by_layer(self) -> dict[str, tuple[int, int]]:
        """layer -> (attempts it stopped, of which the kernel recorded)."""
        out: dict[str, tuple[int, int]] = {}
        for a in self.escape_attempts:
            if a.verdict != "refused":
                continue
            n, rec = out.get(a.layer, (0, 0))
            out[a.layer] = (n + 1, rec + int(a.recorded))
        return dict(sorted(out.items(), key=lambda kv: (-kv[1][1], -kv[1][0], kv[0])))

    def summary(self) -> dict[str, Any]:
        tried = self.escape_attempts
        return {
            "attempts": len(tried),
            "refused": sum(a.verdict == "refused" for a in tried),
            "escaped": len(self.escapes),
            "recorded_by_kernel": sum(a.recorded for a in tried),
            "missing_records": [a.id for a in tried if a.missing_record],
            "by_layer": {k: {"refused": n, "recorded": r} for k, (n, r) in self.by_layer().items()},
            "task_ok": self.task_ok,
            "canary_touched": self.canary.touched,
            "rogue_complete": self.complete,
            "lost_kernel_records": len(self.lost),
            "contained": self.contained,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "demo": "rogue",
            "policy": self.setup.policy,
            "cell": self.cell_id,
            "workspace": self.setup.workspace,
            "layers": dict(self.setup.layers),
            "limits": self.setup.limits,
            "canaries": list(self.setup.canaries),
            "attempts": [a.to_dict() for a in self.attempts],
            "canary": {
                "tcp_connections": self.canary.tcp,
                "unix_connections": self.canary.unix,
                "signals": self.canary.signals,
                "other_workspace_changed": self.canary.other_workspace_changed,
                "touched": self.canary.touched,
            },
            "summary": self.summary(),
            "lost": [e.to_dict() for e in self.lost],
            "rogue_exit_code": self.exit_code,
            "rogue_stderr": self.stderr[-4000:],
            "events_file": self.events_file,
            "transcript_file": self.transcript_file,
            "write_error": self.write_error,
            "event_count": self.event_count,
            "duration": round(self.duration, 3),
            "ok": self.contained,
        }


# ---------------------------------------------------------------------------- canaries


class _Canaries:
    """Listeners and a signal handler on the host; each counts what reaches it."""

    def __init__(self) -> None:
        self.tcp: list[socket.socket] = []
        self.unix: list[socket.socket] = []
        self.unix_path = ""
        self.abstract = f"stockade-demo-{secrets.token_hex(6)}"
        self.signals = 0
        self.signal = 0
        self._previous: Any = None
        try:
            self._open()
        except BaseException:
            self.close()
            raise
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGUSR1, self._on_signal)
            self.signal = int(signal.SIGUSR1)

    def _listen(self, family: int, address: Any, into: list[socket.socket]) -> bool:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(8)
            sock.setblocking(False)
        except OSError:
            sock.close()
            return False
        into.append(sock)
        return True

    def _open(self) -> None:
        if not self._listen(socket.AF_INET, ("127.0.0.1", 0), self.tcp):
            raise OSError("cannot listen on 127.0.0.1 for the demo's canary")
        self.port: int = self.tcp[0].getsockname()[1]
        # IPv6 loopback on the same port, where the host has it.
        self._listen(socket.AF_INET6, ("::1", self.port), self.tcp)
        self._listen(socket.AF_UNIX, "\0" + self.abstract, self.unix)
        # /run is where host daemons keep their sockets; the cell shows /run as a decoy.
        path = f"/run/stockade-demo-{secrets.token_hex(6)}.sock"
        if self._listen(socket.AF_UNIX, path, self.unix):
            self.unix_path = path

    def _on_signal(self, signo: int, frame: FrameType | None) -> None:
        self.signals += 1

    def describe(self) -> tuple[str, ...]:
        where = [f"TCP listener on 127.0.0.1:{self.port}"]
        if len(self.tcp) > 1:
            where.append(f"TCP listener on [::1]:{self.port}")
        where.append(f"unix socket @{self.abstract}")
        if self.unix_path:
            where.append(f"unix socket {self.unix_path}")
        if self.signal:
            where.append("SIGUSR1 handler in this process")
        return tuple(where)

    def count(self) -> tuple[int, int]:
        """Connections that reached the TCP and the unix listeners."""

        def drain(socks: list[socket.socket]) -> int:
            n = 0
            for s in socks:
                while True:
                    try:
                        conn, _ = s.accept()
                    except (BlockingIOError, OSError):
                        break
                    conn.close()
                    n += 1
            return n

        return drain(self.tcp), drain(self.unix)

    def close(self) -> None:
        for s in (*self.tcp, *self.unix):
            s.close()
        if self.unix_path:
            with contextlib.suppress(OSError):
                os.unlink(self.unix_path)
        if self.signal:
            signal.signal(signal.SIGUSR1, self._previous)
            self.signal = 0


def _ssh_key(home: str) -> str:
    for name in SSH_KEYS:
        if os.path.isfile(os.path.join(home, ".ssh", name)):
            return name
    return SSH_KEYS[0]


def _home_file(home: str) -> str:
    for name in HOME_FILES:
        if os.path.isfile(os.path.join(home, name)):
            return name
    return ""


def _tree_digest(path: str) -> list[tuple[str, int, float]]:
    out = []
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            p = os.path.join(root, name)
            st = os.lstat(p)
            out.append((os.path.relpath(p, path), st.st_size, st.st_mtime))
    return out


# ---------------------------------------------------------------------------- host layers


def host_layers() -> tuple[tuple[str, str], ...]:
    """(layer, what this host gives it) for the header: the cell's layers as they run here."""
    from stockade.cell import _host, _seccomp

    facts = _host.probe()
    abi = facts.landlock_abi.value
    cg = [
        f"{name} ({getattr(facts, 'cgroup_' + name).value})"
        for name in ("memory", "pids", "cpu")
        if getattr(facts, "cgroup_" + name).value
    ]
    return (
        ("namespaces", " ".join(facts.namespaces.value) or "none"),
        (
            "Landlock",
            f"ABI {abi}: files, TCP ports, signal and socket scopes" if abi else "absent",
        ),
        (
            "seccomp",
            f"{len(_seccomp.ALWAYS_REFUSED)} system calls refused, plus raw/packet/netlink/UDP "
            "sockets, namespace clones and TIOCSTI"
            if facts.seccomp.value
            else "absent",
        ),
        ("cgroups", ", ".join(cg) + f"; kill by {facts.cgroup_kill.value}" if cg else "none"),
        (
            "kernel audit",
            "readable: Landlock and seccomp refusals become events" if facts.audit.value else "not readable",
        ),
    )


def _limits(policy: Any, timeout: float) -> str:
    lim = policy.limits
    parts = []
    if lim.memory:
        parts.append(f"{lim.memory / 1024**3:g} GiB memory")
    if lim.pids:
        parts.append(f"{lim.pids} processes")
    parts.append(f"{timeout:g} s")
    return ", ".join(parts)


# ---------------------------------------------------------------------------- running


def default_out_dir(now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return os.path.join("runs", f"demo-{stamp}")


def run_demo(
    *,
    out_dir: str | None = None,
    on_start: Callable[[DemoSetup], None] | None = None,
    on_attempt: Callable[[Attempt], None] | None = None,
    write_files: bool = True,
) -> DemoReport:
    """Run the rogue in a cell and report every attempt.

    Args:
        out_dir: where to write ``events.jsonl`` and ``transcript.jsonl``
            (default ``runs/demo-<time>`` under the current directory).
        on_start: called once the cell is set up, before the rogue starts.
        on_attempt: called for each attempt as it happens, with its kernel records.
        write_files: write the events and the transcript.

    Raises:
        HostError: the host lacks a layer the default policy needs, or the
            kernel audit log cannot be read (run as root), or there is no
            ``/usr/bin/python3`` for the rogue.
        CellError: the cell could not be set up.
    """
    from stockade.cell._cell import WORKSPACES_ROOT, Cell, shared_audit_reader
    from stockade.policy import default_policy

    if not os.access(PYTHON, os.X_OK):
        raise HostError(
            f"the demo runs its rogue with {PYTHON}, which is missing here; "
            "install python3 from the distribution",
            feature="python3",
        )
    audit = shared_audit_reader()
    policy = default_policy(POLICY_NAME)
    start = time.monotonic()
    go_r, go_w = os.pipe2(os.O_CLOEXEC)
    session = _Session(audit, go_w, on_attempt)
    unsubscribe = audit.on_event(session.on_event)
    canaries: _Canaries | None = None
    other = ""
    try:
        canaries = _Canaries()
        # A secret in the launcher's environment: the policy passes none of it on.
        token = "sk-stockade-demo-" + secrets.token_hex(12)
        environ = {**os.environ, "OPENAI_API_KEY": token, "AWS_SECRET_ACCESS_KEY": token}
        with Cell(policy, environ=environ) as cell:
            ws = cell.workspace
            os.makedirs(WORKSPACES_ROOT, mode=0o711, exist_ok=True)
            other = tempfile.mkdtemp(prefix="ws-", dir=WORKSPACES_ROOT)
            Path(other, "notes.txt").write_text("another agent's private notes\n")
            other_before = _tree_digest(other)
            rogue = os.path.join(ws, "rogue.py")
            shutil.copyfile(ROGUE, rogue)
            st = os.stat(ws)
            os.chown(rogue, st.st_uid, st.st_gid)
            home = os.path.realpath(os.path.expanduser("~"))
            argv = [
                PYTHON, "-I", "-S", "-u", rogue,
                "--workspace", ws,
                "--other-workspace", other,
                "--canary-port", str(canaries.port),
                "--host-pid", str(os.getpid()),
                "--signal", str(canaries.signal),
                "--abstract", canaries.abstract,
                "--unix-socket", canaries.unix_path,
                "--home", home,
                "--home-file", _home_file(home),
                "--ssh-key", _ssh_key(home),
            ]  # fmt: skip
            setup = DemoSetup(
                policy=policy.name,
                workspace=ws,
                layers=host_layers(),
                canaries=(
                    *canaries.describe(),
                    "OPENAI_API_KEY and AWS_SECRET_ACCESS_KEY in the launching environment",
                    f"another agent's workspace {other}",
                ),
                limits=_limits(policy, CELL_TIMEOUT),
            )
            if on_start is not None:
                on_start(setup)
            result = cell.run(argv, stdin=go_r, on_output=session.on_output, timeout=CELL_TIMEOUT)
        tcp, unix = canaries.count()
        changed = _tree_digest(other) != other_before
        canary = Canary(tcp, unix, canaries.signals, other_workspace_changed=changed)
    finally:
        unsubscribe()
        if canaries is not None:
            canaries.close()
        os.close(go_r)
        os.close(go_w)
        if other:
            shutil.rmtree(other, ignore_errors=True)

    # Only this cell's records count (the reader serves every cell of the process).
    attempts = tuple(_only(a, result.cell_id) for a in session.attempts)
    lost = tuple(e for e in result.events if e.kind == "cell.audit_lost")
    events_file = transcript_file = write_error = None
    if write_files:
        try:
            events_file, transcript_file = _write(
                out_dir or default_out_dir(), result.events, session.transcript
            )
        except OSError as exc:
            write_error = f"{exc.strerror}: {exc.filename}"
    return DemoReport(
        setup=setup,
        attempts=attempts,
        canary=canary,
        cell_id=result.cell_id,
        exit_code=result.exit_code,
        complete=session.done,
        stderr=result.stderr.decode("utf-8", "replace") + session.stderr,
        lost=lost,
        events_file=events_file,
        transcript_file=transcript_file,
        write_error=write_error,
        event_count=len(result.events),
        duration=time.monotonic() - start,
    )


class _Session:
    """The runner's side of the conversation with the rogue: its lines in, go-aheads out."""

    def __init__(self, audit: Any, go_w: int, on_attempt: Callable[[Attempt], None] | None) -> None:
        self.audit = audit
        self.go_w = go_w
        self.on_attempt = on_attempt
        self.attempts: list[Attempt] = []
        self.transcript: list[dict[str, Any]] = []
        self.stderr = ""
        self.done = False
        self._buf = b""
        self._cond = threading.Condition()
        self._seen: list[Event] = []
        self._mark = 0

    def on_event(self, event: Event) -> None:
        """From the audit reader's thread: one more record."""
        with self._cond:
            self._seen.append(event)
            self._cond.notify_all()

    def on_output(self, stream: int, data: bytes) -> None:
        """From ``Cell.run``: a chunk of the rogue's stdout or stderr."""
        if stream != 1:
            self.stderr += data.decode("utf-8", "replace")
            return
        *lines, self._buf = (self._buf + data).split(b"\n")
        for raw in lines:
            try:
                line = json.loads(raw)
            except ValueError:
                self.transcript.append({"raw": raw.decode("utf-8", "replace")})
                continue
            if not isinstance(line, dict):
                continue
            self.transcript.append(line)
            if line.get("done"):
                self.done = True
                continue
            attempt = classify(line, self._window(line))
            self.attempts.append(attempt)
            if self.on_attempt is not None:
                self.on_attempt(attempt)
            os.write(self.go_w, b"go\n")

    def _window(self, line: dict[str, Any]) -> list[Event]:
        """The kernel records of one attempt: those that arrived since the last one.

        The rogue waits for the go-ahead after each attempt, so every record the
        kernel makes in between is this attempt's. ``collect`` on a cell that
        nobody watches is a pure barrier: it returns once every record the
        kernel emitted before the call has been read and handed to
        ``on_event``. When a refusal that the kernel may have logged has no
        matching record even so, wait a little longer before giving up.
        """
        self.audit.collect(BARRIER_CELL, timeout=1.0)
        target = line.get("target") or {}
        maybe_logged = not line.get("ok") and line.get("errname") in ("EPERM", "EACCES")
        deadline = time.monotonic() + (0.25 if maybe_logged else 0.0)
        with self._cond:
            while True:
                window = self._seen[self._mark :]
                remaining = deadline - time.monotonic()
                if remaining <= 0 or any(matches(e, target) for e in window):
                    break
                self._cond.wait(remaining)
            self._mark = len(self._seen)
        return window


def _only(attempt: Attempt, cell_id: str) -> Attempt:
    events = tuple(e for e in attempt.events if e.cell == cell_id)
    others = tuple(e for e in attempt.other_events if e.cell == cell_id)
    return replace(attempt, events=events, other_events=others)


def _write(
    out_dir: str, events: tuple[Event, ...], transcript: list[dict[str, Any]]
) -> tuple[str | None, str | None]:
    from stockade.record._jsonl import write_jsonl

    try:
        os.makedirs(out_dir, exist_ok=True)
        events_file = os.path.join(out_dir, "events.jsonl")
        write_jsonl(events_file, events)
        transcript_file = os.path.join(out_dir, "transcript.jsonl")
        with open(transcript_file, "w", encoding="utf-8") as f:
            for item in transcript:
                f.write(json.dumps(item, sort_keys=True) + "\n")
    except OSError:
        return None, None
    return events_file, transcript_file


__all__ = ["Canary", "DemoReport", "DemoSetup", "default_out_dir", "host_layers", "run_demo"]
