"""What a session call costs against the size of the process that started the
session, beside ``subprocess.run`` from that same process.

Run as root from the repository:  .venv/bin/python benchmarks/session_fork_size.py [--rounds N]

A session's init (the cell's pid 1) is a clone of the process that launched
the cell and never execs, so it starts with a copy-on-write image of that
process's memory: a call forked from it would copy the page tables of all
of it (calls share the init's memory instead, and the init lets go of the
launcher's before it serves: _session_init.h), and the cell's end tears
down what the init still holds. An eval's process (Inspect, Harbor) is
large. For each size the script starts a child of its own that first
allocates that much ballast (written, so resident), then opens a session
and times ``read_file`` of 4 KiB and ``exec(["/bin/true"])``
interleaved with ``subprocess.run(["/bin/true"])`` from the same child
(CPython spawns with vfork, which copies no page tables: the floor).
Then, from the same child, ``Session.start``, the first exec after it and
``close`` of fresh sessions (twice a quarter of ``--rounds``, at least 10),
every other one closed 50 ms after its exec (an agent's time): the init
lets go of the launcher's memory a step at a time between calls, and the
cell's end tears down what it still holds. Medians over ``--rounds``; sizes interleaved
twice. ``benchmarks/with_native.py DIR`` runs it on another build of the
init. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SIZES_MIB = (0, 64, 256)


def child(ballast_mib: int, rounds: int) -> dict[str, float]:
    ballast = bytearray(os.urandom(1)) * (ballast_mib << 20)
    from stockade.cell import Session
    from stockade.policy import default_policy

    with Session(default_policy("inspect")) as session:
        session.write_file("/tmp/x", b"x" * 4096)
        calls = {
            "read_file 4 KiB": lambda: session.read_file("/tmp/x"),
            "Session.exec /bin/true": lambda: session.exec(["/bin/true"]),
            "subprocess.run /bin/true": lambda: subprocess.run(["/bin/true"], check=True),
        }
        times: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(rounds):
            for name, call in calls.items():
                start = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - start)
    # A session's own start and end from this launcher: Session.start, its
    # first exec (which waits for the init to let go of the launcher's
    # memory, if it does), and close (the cell's end, its record).
    for name in ("Session.start", "first exec", "Session.close", "Session.close after 50 ms"):
        times[name] = []
    for i in range(2 * max(5, rounds // 4)):
        start = time.perf_counter()
        session = Session(default_policy("inspect")).start()
        started = time.perf_counter()
        session.exec(["/bin/true"])
        called = closing = time.perf_counter()
        if i % 2:
            time.sleep(0.05)  # an agent's time between its calls and the end
            closing = time.perf_counter()
        session.close()
        times["Session.start"].append(started - start)
        times["first exec"].append(called - started)
        times["Session.close after 50 ms" if i % 2 else "Session.close"].append(time.perf_counter() - closing)
    with open("/proc/self/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))
    del ballast
    return {"rss_mib": rss / 1024, **{name: statistics.median(v) * 1e3 for name, v in times.items()}}


def _interpreter() -> list[str]:
    """How to run a child: through with_native.py again when this process
    was started by it with another build (its children must load that one)."""
    native = sys.modules.get("stockade.cell._native")
    where = os.path.dirname(getattr(native, "__file__", "") or "")
    here = os.path.dirname(os.path.abspath(__file__))
    package = os.path.join(os.path.dirname(here), "src", "stockade", "cell")
    if native is None or not where or os.path.samefile(where, package):
        return [sys.executable]
    return [sys.executable, os.path.join(here, "with_native.py"), where]


def main(rounds: int) -> None:
    results: dict[int, list[dict[str, float]]] = {size: [] for size in SIZES_MIB}
    for _ in range(2):
        for size in SIZES_MIB:
            out = subprocess.run(
                [*_interpreter(), __file__, "--child", str(size), "--rounds", str(rounds)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            results[size].append(json.loads(out.splitlines()[-1]))
    print(f"median ms over {rounds} rounds, two runs per size")
    for size, runs in results.items():
        print(f"  ballast {size:4d} MiB (rss {runs[0]['rss_mib']:5.0f} MiB)")
        for name in runs[0]:
            if name != "rss_mib":
                print(f"    {name:26s} {' / '.join(f'{r[name]:7.2f}' for r in runs)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.rounds)))
    else:
        main(args.rounds)
