"""The host-wide cost of stockade's kernel audit rules, for a process that is not a cell.

Run as root from the repository, on a host where nothing else needs the rules
for the few seconds this takes (it removes them while it measures "without"
and puts them back before it ends, even on an error or ^C):

    .venv/bin/python benchmarks/audit_rules.py [--rounds N] [--calls N]

stockade's audit reader installs the rules of ``cell/_audit_mount`` (the
refusals of read-only mounts and file permissions) on the syscall-exit filter
and leaves them, with auditing on, when it ends (another reader may need
them). They match cells' processes only (``auid``), but the kernel pays for
them in every process: with any audit rule loaded, a task's audit context is
no longer a "dummy" (``audit_n_rules``), so every system call of every task
collects the names and inodes it looks up, and at exit the kernel walks the
exit filter's rules for it (kernel/auditsc.c).

Each round starts a fresh unrelated process (``/usr/bin/python3 -I -S``, not
in any cell) that times, per call, a system call without a path
(``getppid``), one that looks up a path (``stat``), and an open and close of
a file (``openat`` is in the rules' masks), with the rules in place and
without them, in alternating order. The process's auid is the operator's
(or unset), never a cell's, so the rules never match it: what is measured is
their cost to everything else on the host. Printed: medians per call and the
ratio. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import socket
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Iterator

from stockade.cell._audit_mount import decoy_rule, ensure_proc_decoy, rule_payloads

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
    # Make sure they are in place (as after any stockade command), then measure.
    _rules(sock, AUDIT_ADD_RULE, payloads)
    times: dict[str, dict[str, list[float]]] = {"with the rules": {}, "without": {}}
    for i in range(args.rounds):
        for state in ("with the rules", "without") if i % 2 == 0 else ("without", "with the rules"):
            if state == "without":
                with rules_removed(sock, payloads):
                    got = _run(args.calls)
            else:
                got = _run(args.calls)
            for name, ns in got.items():
                times[state].setdefault(name, []).append(ns)
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {os.getloadavg()[0]:.1f}; "
        f"{len(payloads)} rules; an unrelated process, {args.rounds} rounds of {args.calls} calls"
    )
    print(f"  {'per call (ns, median)':24} {'without':>9} {'with':>9} {'with/without':>13}")
    for name in times["without"]:
        without = statistics.median(times["without"][name])
        with_ = statistics.median(times["with the rules"][name])
        print(f"  {name:24} {without:9.0f} {with_:9.0f} {with_ / without:12.2f}x")
    print("  (per call: the Python loop's own cost is in both columns)")


if __name__ == "__main__":
    main()
