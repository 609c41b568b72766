"""What the cgroup-move warm-up (``cell/_migration.py``) costs the rest of the host.

Run as root from the repository:

    .venv/bin/python benchmarks/cgroup_warm_cost.py [--rounds N] [--calls N]

While a launch is near, a thread of the launching process moves itself into
its own cgroup every 4 ms (``_native.warm_cgroup``), which holds the kernel's
``cgroup_threadgroup_rwsem`` in its slow mode. Every fork, thread start and
exit of every task on the host takes that semaphore's reader side, the slower
way while it is slow, and waits out each of the thread's writes. This times
what an unrelated process (``/usr/bin/python3 -I -S``, in no cell) pays for
those, per call, with a warm-up thread running in another process and with
none, in alternating rounds (each round a fresh process of each kind):

- ``fork``: ``os.fork()``, the child's ``os._exit(0)``, the parent's ``waitpid``;
- ``thread``: a thread started and joined;
- ``spawn``: ``posix_spawn`` of ``/bin/true`` and its wait.

Printed: the medians and 99th percentiles per call, and their ratios (warm
over quiet), so that what a second of warm-up costs its neighbours is said,
not guessed. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from stockade.cell import _migration

PROBE = r"""
import json, os, sys, threading, time
calls = int(sys.argv[1])
def timed(fn):
    out = []
    for _ in range(calls):
        start = time.perf_counter_ns()
        fn()
        out.append(time.perf_counter_ns() - start)
    return out
def fork():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
def thread():
    t = threading.Thread(target=int)
    t.start()
    t.join()
def spawn():
    os.waitpid(os.posix_spawn("/bin/true", ["/bin/true"], {}), 0)
print(json.dumps({"fork": timed(fork), "thread": timed(thread), "spawn": timed(spawn)}))
"""

WARMER = r"""
import sys, time
from stockade.cell import _migration
_migration.keep_warm(float(sys.argv[1]))
time.sleep(float(sys.argv[1]) + 0.2)
"""


def _probe(calls: int) -> dict[str, list[int]]:
    out = subprocess.run(
        ["/usr/bin/python3", "-I", "-S", "-c", PROBE, str(calls)], check=True, capture_output=True, text=True
    ).stdout
    result: dict[str, list[int]] = json.loads(out)
    return result


def measure(rounds: int, calls: int) -> None:
    if _migration._own_tasks_file() is None:
        sys.exit("no writable cgroup v1 tasks file here: the warm-up does nothing on this host")
    samples: dict[str, dict[str, list[int]]] = {"quiet": {}, "warm": {}}
    for i in range(rounds):
        for state in ("quiet", "warm") if i % 2 == 0 else ("warm", "quiet"):
            warmer = None
            if state == "warm":
                # Long enough for the probe's whole run, in a process of its own.
                warmer = subprocess.Popen([sys.executable, "-c", WARMER, "8"])
                time.sleep(0.3)  # its thread runs, and has paid its first grace period
            try:
                for name, values in _probe(calls).items():
                    samples[state].setdefault(name, []).extend(values)
            finally:
                if warmer is not None:
                    warmer.kill()
                    warmer.wait()
            time.sleep(0.1)
    print(f"an unrelated process's calls, {rounds} rounds of {calls} each (microseconds)")
    heads = ("quiet median", "warm median", "ratio", "quiet p99", "warm p99", "ratio")
    print(f"  {'':8} " + " ".join(f"{h:>12}" for h in heads))
    for name in samples["quiet"]:
        quiet, warm = sorted(samples["quiet"][name]), sorted(samples["warm"][name])
        qm, wm = statistics.median(quiet) / 1000, statistics.median(warm) / 1000
        q99, w99 = quiet[int(len(quiet) * 0.99)] / 1000, warm[int(len(warm) * 0.99)] / 1000
        figures = (f"{qm:.1f}", f"{wm:.1f}", f"{wm / qm:.2f}", f"{q99:.1f}", f"{w99:.1f}", f"{w99 / q99:.2f}")
        print(f"  {name:8} " + " ".join(f"{f:>12}" for f in figures))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the warm-up writes a cgroup tasks file")
    measure(args.rounds, args.calls)


if __name__ == "__main__":
    main()
