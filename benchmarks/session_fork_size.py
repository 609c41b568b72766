"""What a session call costs against the size of the process that started the
session, beside ``subprocess.run`` from that same process.

Run as root from the repository:  .venv/bin/python benchmarks/session_fork_size.py [--rounds N]

A session's init (the cell's pid 1) is a clone of the process that launched
the cell and never execs, so it holds a copy-on-write image of that
process's memory; each call is a fork of the init, whose cost grows with the
anonymous memory it copies the page tables of. An eval's process (Inspect,
Harbor) is large. For each size the script starts a child of its own that
first allocates that much ballast (written, so resident), then opens a
session and times ``read_file`` of 4 KiB and ``exec(["/bin/true"])``
interleaved with ``subprocess.run(["/bin/true"])`` from the same child
(CPython spawns with vfork, which copies no page tables: the floor).
Medians over ``--rounds``; sizes interleaved twice. Nothing here asserts a time.
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
    with open("/proc/self/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))
    del ballast
    return {"rss_mib": rss / 1024, **{name: statistics.median(v) * 1e3 for name, v in times.items()}}


def main(rounds: int) -> None:
    results: dict[int, list[dict[str, float]]] = {size: [] for size in SIZES_MIB}
    for _ in range(2):
        for size in SIZES_MIB:
            out = subprocess.run(
                [sys.executable, __file__, "--child", str(size), "--rounds", str(rounds)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            results[size].append(json.loads(out.splitlines()[-1]))
    print(f"median ms over {rounds} rounds, two runs per size")
    for size, runs in results.items():
        cells = "  ".join(
            f"{name} {' / '.join(f'{r[name]:6.2f}' for r in runs)}" for name in runs[0] if name != "rss_mib"
        )
        print(f"  ballast {size:4d} MiB (rss {runs[0]['rss_mib']:5.0f} MiB)  {cells}")


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
