"""The audit rules' lease, handed at close to a detached remover.

Every audit reader of the host holds a shared ``flock`` on ``RULES_LEASE``
(``_audit._take_lease``) while it needs the kernel audit rules; the rules go
when nobody needs them any more, since while they are loaded the host pays
for them (docs/PERFORMANCE.md). Removing them takes one ``AUDIT_DEL_RULE``
round trip per rule, each 7-15 ms in the kernel here where an add takes
0.02 (ten: 120-160 ms, measured): time that the last ``stockade exec``
spent at exit, after its command had ended. So a reader that closes hands its
lease over instead, and returns at once:

- If a remover already lingers (it holds an exclusive ``flock`` on
  ``REMOVER_MARK``), the closer only lets its own lease go: that remover
  removes the rules once the last reader has gone.
- Else it spawns one, detached (``setsid --fork``: a new session, reparented
  away from the closer, so no zombie is left to it; standard descriptors on
  ``/dev/null``, the working directory ``/``, only the interpreter's standard
  library, ``-I -S``), which inherits the lease itself (the same open file,
  so the shared lock never lapses), the mark, a control socket and the
  rules' payloads through a pipe, and nothing else of the closer's.

The remover waits ``RULES_GRACE`` seconds holding the lease, so that
back-to-back commands find the rules in place instead of adding them again,
then asks for the lease exclusively. Given, it removes the rules, lets the
mark go, then the lease. Refused (a reader holds it), it waits until every
reader has gone (a blocking exclusive lock, which new readers' shared locks
do not wait for), goes back to shared and waits the grace again. So the last
reader's rules go ``RULES_GRACE`` seconds after it closed, and a reader that
starts meanwhile keeps them, with no wait.

Races: a reader that starts while the remover removes waits for the lease
(``_take_lease``) and adds them again, as before. A closer that sees the mark
held knows the remover has not begun removing (it removes only with the lease
exclusive, which the closer's shared lock excludes, and lets the mark go
before the lease), so that remover will see the closer's lease go. A remover
killed with SIGKILL leaves the rules to the next closer, which finds no mark
held and spawns another; a SIGTERM (``systemctl stop``) makes it try at once
and go. The kernel takes rule changes from any network namespace (it checks
only the initial user and pid namespaces, ``audit_netlink_ok`` in
kernel/audit.c), so the control socket, made by the reader where its own
socket is, works wherever the remover is.
"""

from __future__ import annotations

import fcntl
import os
import signal
import struct
import sys
from collections.abc import Sequence
from typing import Final

__all__ = ["REMOVER_MARK", "RULES_GRACE", "hand_over", "remover_pid"]

REMOVER_MARK: Final = "/run/stockade/audit-rules.remover"
"""The remover holds an exclusive ``flock`` on this file for its life, and
writes its pid into it."""
RULES_GRACE: Final = 3.0
"""Seconds the rules outlive the last reader: long enough for a script's
next ``stockade exec`` (the exec itself takes a tenth of this), short enough
that the host does not pay for rules nobody needs."""
SETSID: Final = ("/usr/bin/setsid", "/bin/setsid")
"""util-linux's setsid(1), whose ``--fork`` detaches the remover."""
_PIPE_ROOM: Final = 60_000
"""The payloads must fit in a pipe's buffer (64 KiB): nobody reads them until
the remover has started."""

_STARTER: Final = (
    "import os;d=b''.join(iter(lambda:os.read(6,65536),b''));n=int(d[:8]);exec(d[8:8+n])"
    " # stockade: the audit rules' remover (cell/_audit_lease.py)"
)
"""The remover's command line: it reads its code, then the payloads, from
descriptor 6 (a short line in ``ps``)."""
_REMOVER: Final = r"""
import fcntl, os, signal, socket, struct, sys, time
LEASE, MARK, CONTROL, PAYLOADS = 3, 4, 5, 6
os.close(PAYLOADS)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # until its handler can act
os.chdir("/")
os.closerange(PAYLOADS + 1, 1 << 20)
grace = float(sys.argv[1])
os.ftruncate(MARK, 0)
os.pwrite(MARK, b"%d\n" % os.getpid(), 0)
data = d[8 + n :]
payloads, i = [], 0
while i + 4 <= len(data):
    (n,) = struct.unpack_from("=I", data, i)
    payloads.append(data[i + 4 : i + 4 + n])
    i += 4 + n


class Finish(Exception):
    pass


def finish(signum, frame):
    raise Finish


signal.signal(signal.SIGHUP, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, finish)
try:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    while True:
        time.sleep(grace)
        try:
            fcntl.flock(LEASE, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            pass
        fcntl.flock(LEASE, fcntl.LOCK_EX)  # every reader has gone: the grace again
        fcntl.flock(LEASE, fcntl.LOCK_SH)
except Finish:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        fcntl.flock(LEASE, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.exit(0)  # a reader needs them: its close hands them over again
signal.signal(signal.SIGTERM, signal.SIG_IGN)
sock = socket.socket(fileno=CONTROL)
hdr = struct.Struct("=IHHII")
seq, pending = 0, payloads
for attempt in range(1, 5):
    waiting = {}
    for payload in pending:
        seq += 1
        waiting[seq] = payload
        sock.send(hdr.pack(hdr.size + len(payload), 1012, 0x5, seq, 0) + payload)
    sock.settimeout(2.0 * attempt)
    try:
        while waiting:
            got = sock.recv(65536)
            at = 0
            while at + hdr.size <= len(got):
                length, kind, _flags, answered, _pid = hdr.unpack_from(got, at)
                if kind == 2:
                    waiting.pop(answered, None)
                at += max(hdr.size, (length + 3) & ~3)
    except OSError:
        pass
    if not waiting:
        break
    pending = list(waiting.values())
os.close(MARK)
os.close(LEASE)
"""
"""The remover's code, run by ``_STARTER`` with descriptors 3-6 handed to it."""


def hand_over(
    lease: int,
    payloads: Sequence[bytes],
    control: int,
    *,
    grace: float = RULES_GRACE,
    mark_path: str = REMOVER_MARK,
) -> bool:
    """Hand the shared lock that ``lease`` holds to a remover (see the module
    docstring); True when one holds it now or one lingers already (the caller
    then closes ``lease`` and is done), False when none could be had (the
    caller removes the rules itself, as before). ``control`` is a
    ``NETLINK_AUDIT`` socket the remover may use; the caller keeps its own."""
    setsid = next((path for path in SETSID if os.access(path, os.X_OK)), None)
    python = os.path.realpath(sys.executable) if sys.executable else ""
    code = _REMOVER.encode()
    data = b"%08d" % len(code) + code + b"".join(struct.pack("=I", len(p)) + p for p in payloads)
    if setsid is None or not python or len(data) > _PIPE_ROOM:
        return False
    try:
        mark = os.open(mark_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError:
        return False
    held: list[int] = [mark]
    try:
        try:
            fcntl.flock(mark, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True  # a remover lingers, and will see this lease go
        except OSError:
            return False
        os.ftruncate(mark, 0)  # the remover writes its pid (``remover_pid``)
        read_end, write_end = os.pipe()
        held += [read_end, write_end]
        os.write(write_end, data)  # fits: nobody reads before the remover starts
        # Above every number the file actions write, so that none is
        # overwritten before it is copied (close-on-exec: gone at the exec).
        sources = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (lease, mark, control, read_end)]
        held += sources
        actions: list[tuple[int, ...] | tuple[int, int, str, int, int]] = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
            (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
            *((os.POSIX_SPAWN_DUP2, src, target) for target, src in enumerate(sources, 3)),
            *((os.POSIX_SPAWN_CLOSE, fd) for fd in _inheritable(above=len(sources) + 2)),
        ]
        try:
            pid = os.posix_spawn(
                setsid,
                [setsid, "--fork", python, "-I", "-S", "-c", _STARTER, repr(grace)],
                {"PATH": os.defpath},
                file_actions=actions,
                setsigmask=(),
                setsigdef=(signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGCHLD),
            )
        except OSError:
            return False
        try:
            _, status = os.waitpid(pid, 0)  # setsid forks the remover and ends at once
        except ChildProcessError:
            return True  # reaped by another thread of the caller: it did start
        return os.waitstatus_to_exitcode(status) == 0
    finally:
        for fd in held:
            os.close(fd)


def _inheritable(above: int) -> list[int]:
    """This process's descriptors above ``above`` that an exec would keep: a
    caller's inherited pipe would otherwise stay open in the remover."""
    found: list[int] = []
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return found
    for name in names:
        fd = int(name)
        if fd <= above:
            continue
        try:
            if os.get_inheritable(fd):
                found.append(fd)
        except OSError:
            continue  # the listing's own descriptor, or closed meanwhile
    return found


def remover_pid(mark_path: str = REMOVER_MARK) -> int | None:
    """The pid of the remover that lingers now (0 while it starts), or None
    when none does."""
    try:
        fd = os.open(mark_path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 32, 0).strip()
            return int(text) if text.isdigit() else 0
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
