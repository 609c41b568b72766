"""The host-wide cost of stockade's kernel audit rules, for a process that is not a cell.

Run as root from the repository. It holds the rules' lease like a reader
(``/run/stockade/audit-rules.lock``), and takes it exclusively to measure
"without": it waits (at most a minute each time) until no other stockade
process of the host needs the rules, and a reader that starts meanwhile waits
for it (up to ``LEASE_WAIT``, 10 s: keep rounds short). At the end it removes
the rules when nobody else needs them, as the last reader's remover would:

    .venv/bin/python benchmarks/audit_rules.py [--rounds N] [--calls N]

stockade's audit reader installs the rules of ``cell/_audit_mount`` (the
refusals of read-only mounts and file permissions) on the syscall-exit filter
while a stockade process needs them (they go a few seconds after the last one
ends). They match cells' processes only (``auid``), but the kernel pays for
them in every process: with any audit rule loaded, a task's audit context is
no longer a "dummy" (``audit_n_rules``), so every system call of every task
collects the names and inodes it looks up, and at exit the kernel walks the
exit filter's rules for it (kernel/auditsc.c). While the host has no rule of
its own, stockade adds one on the task filter (``_audit_mount.task_rule``)
that gives every task forked outside a cell no audit context at all.

Each round starts a fresh unrelated process (``/usr/bin/python3 -I -S``, not
in any cell) that times, per call, a system call without a path
(``getppid``), one that looks up a path (``stat``), and an open and close of
a file (``openat`` is in the rules' masks), in three states, in alternating
order: without any rule, with the exit-filter rules alone (as before the task
rule), and with what stockade loads now (the task rule too, when the host has
no rule of its own: without it the third state is the second). The process's auid is the operator's
(or unset), never a cell's, so the rules never match it: what is measured is
their cost to everything else on the host. Printed: medians per call and the
ratio. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import os
import socket
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Iterator

from stockade.cell._audit import RULES_LEASE, _list_rules
from stockade.cell._audit_lease import remover_pid
from stockade.cell._audit_mount import decoy_rule, ensure_proc_decoy, foreign_rules, rule_payloads, task_rule

NETLINK_AUDIT = 9
AUDIT_ADD_RULE = 1011
AUDIT_DEL_RULE = 1012
NLMSG_ERROR = 2
NLM_F_REQUEST, NLM_F_ACK = 0x1, 0x4
_HDR = struct.Struct("=IHHII")

_WORKLOAD = """
import os, sys, time
n = int(sys.argv[1])
path = "/usr/bin/true"
out = []
for name, call in (
    ("getppid", lambda: os.getppid()),
    ("stat", lambda: os.stat(path)),
    ("open+close", lambda: os.close(os.open(path, os.O_RDONLY))),
):
    for _ in range(n // 10):
        call()
    t = time.perf_counter_ns()
    for _ in range(n):
        call()
    out.append(f"{name}={(time.perf_counter_ns() - t) / n:.1f}")
print(" ".join(out))
"""


def _payloads() -> list[bytes]:
    payloads = list(rule_payloads())
    decoy = ensure_proc_decoy()
    if decoy is not None:
        payloads.append(decoy_rule(decoy.st_ino, decoy.st_dev))
    return payloads


def _rules(sock: socket.socket, msg_type: int, payloads: list[bytes]) -> list[int]:
    """Send each payload as ``msg_type`` and return the kernel's answers (0 or an errno)."""
    answers = []
    for seq, payload in enumerate(payloads, 1):
        sock.send(_HDR.pack(_HDR.size + len(payload), msg_type, NLM_F_REQUEST | NLM_F_ACK, seq, 0) + payload)
        while True:
            data = sock.recv(65536)
            _length, kind, _flags, got, _pid = _HDR.unpack_from(data)
            if kind == NLMSG_ERROR and got == seq:
                answers.append(-struct.unpack_from("=i", data, _HDR.size)[0])
                break
    return answers


@contextlib.contextmanager
def exclusive(lease: int) -> Iterator[None]:
    """The lease taken exclusively (no other reader needs the rules), then
    shared again."""
    deadline = time.monotonic() + 60.0
    while True:
        try:
            fcntl.flock(lease, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            fcntl.flock(lease, fcntl.LOCK_SH)  # the conversion may have dropped it
            if time.monotonic() > deadline:
                sys.exit("other stockade processes needed the rules for a minute: run this when idle")
            time.sleep(0.05)
    try:
        yield
    finally:
        fcntl.flock(lease, fcntl.LOCK_SH)


@contextlib.contextmanager
def rules_removed(sock: socket.socket, payloads: list[bytes]) -> Iterator[None]:
    answers = _rules(sock, AUDIT_DEL_RULE, payloads)
    try:
        if any(a not in (0, errno.ENOENT) for a in answers):
            raise SystemExit(f"cannot remove the rules: {[os.strerror(a) for a in answers if a]}")
        yield
    finally:
        back = _rules(sock, AUDIT_ADD_RULE, payloads)
        if any(a not in (0, errno.EEXIST) for a in back):
            sys.exit(f"could not put the rules back ({back}): run any stockade command to add them again")


def _run(calls: int) -> dict[str, float]:
    done = subprocess.run(
        ["/usr/bin/python3", "-I", "-S", "-c", _WORKLOAD, str(calls)],
        capture_output=True,
        text=True,
        check=True,
    )
    return {k: float(v) for k, v in (item.split("=") for item in done.stdout.split())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=100_000)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the rules are the kernel's (CAP_AUDIT_CONTROL)")
    payloads = _payloads()
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_AUDIT)
    sock.bind((0, 0))
    os.makedirs(os.path.dirname(RULES_LEASE), exist_ok=True)
    lease = os.open(RULES_LEASE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(lease, fcntl.LOCK_SH)  # a reader: no remover takes the rules meanwhile
    foreign = foreign_rules(_list_rules(sock, 5.0))
    spare = [task_rule()] if foreign == 0 else []
    # Make sure they are in place (as after any stockade command), then measure.
    _rules(sock, AUDIT_ADD_RULE, payloads + spare)
    states = ("without", "exit rules alone", "stockade's now")
    times: dict[str, dict[str, list[float]]] = {state: {} for state in states}
    for i in range(args.rounds):
        for state in states if i % 2 == 0 else states[::-1]:
            if state == "without":
                with exclusive(lease), rules_removed(sock, payloads + spare):
                    got = _run(args.calls)
            elif state == "exit rules alone" and spare:
                with rules_removed(sock, spare):
                    got = _run(args.calls)
            else:
                got = _run(args.calls)
            for name, ns in got.items():
                times[state].setdefault(name, []).append(ns)
    try:
        fcntl.flock(lease, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if remover_pid() is None:  # nobody else needs them, and no remover will take them
            _rules(sock, AUDIT_DEL_RULE, payloads + spare)
    except BlockingIOError:
        pass  # another reader's: its close hands them to a remover
    os.close(lease)
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {os.getloadavg()[0]:.1f}; "
        f"{len(payloads)} exit-filter rules, "
        f"the task rule {'too' if spare else f'not ({foreign} other rules)'}; "
        f"an unrelated process, {args.rounds} rounds of {args.calls} calls"
    )
    head = f"{'without':>9} {'exit rules':>11} {'ratio':>6} {'now':>9} {'ratio':>6}"
    print(f"  {'per call (ns, median)':16} {head}")
    for name in times["without"]:
        without = statistics.median(times["without"][name])
        alone = statistics.median(times["exit rules alone"][name])
        now = statistics.median(times["stockade's now"][name])
        row = f"{without:9.0f} {alone:11.0f} {alone / without:5.2f}x {now:9.0f} {now / without:5.2f}x"
        print(f"  {name:16} {row}")
    print("  (per call: the Python loop's own cost is in every column; ratio: to without)")


if __name__ == "__main__":
    main()
