"""What the connect supervisor costs: per connect, and per cell start.

Run as root from the repository:  .venv/bin/python benchmarks/unotify.py [--connects N] [--rounds N]

Per connect: one program connects N times (a fresh socket each time) to a
unix socket it bound itself, to a unix socket stockade offers the cell (as the
broker's), and to a TCP listener on an allowed loopback port; in a cell (every
connect goes to the supervisor) and, as the floor, the same program run
directly on the host. Per cell start: the two steps the supervisor adds to a
launch (attaching the cgroup guard, receiving and registering the listener)
timed inside ``Cell.run``, and ``/bin/true`` in a cell end to end for scale.
Printed: medians. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from stockade.cell import Cell, _cell, _unotify
from stockade.policy import default_policy
from stockade.policy._model import NetworkPolicy

PORT = 18099
PROGRAM = r"""
import json, os, socket, sys, time
n, offered, port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
own = os.path.join(os.getcwd(), "own.sock")
srv = socket.socket(socket.AF_UNIX); srv.bind(own); srv.listen(4096)
tcp = socket.socket(); tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
tcp.bind(("127.0.0.1", port)); tcp.listen(4096)
out = {}
for name, family, addr, accept in (
    ("unix, the cell's own", socket.AF_UNIX, own, srv),
    ("unix, offered (broker)", socket.AF_UNIX, offered, None),
    ("tcp, allowed port", socket.AF_INET, ("127.0.0.1", port), tcp),
):
    start = time.perf_counter()
    for _ in range(n):
        s = socket.socket(family)
        s.connect(addr)
        s.close()
        if accept is not None:
            accept.accept()[0].close()
    out[name] = (time.perf_counter() - start) / n * 1e6
os.unlink(own)
print(json.dumps(out))
"""


def _serve(srv: socket.socket) -> None:
    while True:
        try:
            conn, _ = srv.accept()
        except OSError:
            return
        conn.close()


def per_connect(n: int, rounds: int) -> None:
    tmp = tempfile.mkdtemp(prefix="stockade-bench-", dir="/var/tmp")
    os.chmod(tmp, 0o777)
    offered = os.path.join(tmp, "offered.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(offered)
    os.chmod(offered, 0o777)
    srv.listen(4096)
    threading.Thread(target=_serve, args=(srv,), daemon=True).start()
    policy = dataclasses.replace(default_policy("bench"), network=NetworkPolicy(loopback_ports=(PORT,)))
    served: list[float] = []
    serve = _unotify.Supervisor._serve

    def timed_serve(self: _unotify.Supervisor, w: _unotify.CellWatch) -> None:
        start = time.thread_time()
        try:
            serve(self, w)
        finally:
            served.append((time.thread_time() - start) * 1e6)

    _unotify.Supervisor._serve = timed_serve  # type: ignore[method-assign]
    cell_runs: list[dict[str, float]] = []
    host_runs: list[dict[str, float]] = []
    inside = "/run/stockade/broker.sock"
    with Cell(policy, sockets={inside: offered}) as cell:
        for _ in range(rounds):
            r = cell.run(["/usr/bin/python3", "-c", PROGRAM, str(n), inside, str(PORT)])
            cell_runs.append(json.loads(r.stdout))
            done = subprocess.run(
                ["/usr/bin/python3", "-c", PROGRAM, str(n), offered, str(PORT)],
                capture_output=True,
                cwd=tmp,
                check=True,
            )
            host_runs.append(json.loads(done.stdout))
    srv.close()
    _unotify.Supervisor._serve = serve  # type: ignore[method-assign]
    cpu = statistics.median(served)
    print(f"supervisor CPU per notification (thread time, all kinds): median {cpu:.1f} µs")
    print(f"per connect, µs (median of {rounds} runs of {n} connects each, socket + connect + close):")
    for name in cell_runs[0]:
        c = statistics.median(r[name] for r in cell_runs)
        h = statistics.median(r[name] for r in host_runs)
        print(f"  {name:26s} cell {c:7.1f}   host (no filter) {h:7.1f}   +{c - h:6.1f}")


def per_start(rounds: int) -> None:
    timings: dict[str, list[float]] = {"attach_guard": [], "_watch_connects": []}

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                timings[name].append((time.perf_counter() - start) * 1e3)

        return wrapper

    original = {name: getattr(_cell, name) for name in timings}
    for name, fn in original.items():
        setattr(_cell, name, timed(name, fn))
    whole: list[float] = []
    try:
        with Cell(default_policy()) as cell:
            cell.run(["/bin/true"])
            for _ in range(rounds):
                start = time.perf_counter()
                cell.run(["/bin/true"])
                whole.append((time.perf_counter() - start) * 1e3)
    finally:
        for name, fn in original.items():
            setattr(_cell, name, fn)
    print(f"per cell start, ms (median of {rounds}):")
    for name, values in timings.items():
        print(f"  {name:26s} {statistics.median(values[1:]):.3f}")
    print(f"  {'/bin/true in a cell':26s} {statistics.median(whole):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connects", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    per_connect(args.connects, args.rounds)
    per_start(max(args.rounds * 4, 20))


if __name__ == "__main__":
    main()
