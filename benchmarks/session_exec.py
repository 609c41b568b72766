"""``exec`` in a live session beside a fresh cell per command and beside
``subprocess.run`` on the host, side by side.

Run as root from the repository:  .venv/bin/python benchmarks/session_exec.py [--rounds N]

Each round runs, interleaved from this one warm process:

- ``subprocess.run`` of the command on the host (the floor: nothing contained);
- ``Session.exec`` of it in a live session (``stockade.cell.Session``: one
  cell, each call forked by the cell's init);
- ``Cell.run`` of it: a fresh cell for every command (what an ``exec``
  intent costs without a session);
- the same ``exec`` through the daemon (``RemoteSession``, the control
  socket, base64 in JSON), under a temporary state directory.

for ``/bin/true`` and ``sh -c 'echo hi'`` (fresh cells in a block of their
own, after the others: an ended cell's namespaces are torn down by the
kernel in the background, and a call right after one pays for it), then 4 KiB ``write_file`` +
``read_file``, then a session's own start and end (in process and through
the daemon, beside a fresh cell's whole life), then the cost of moving 8 MiB
of stdin through each path (and base64 of 8 MiB alone, what the daemon's
JSON adds). The median and 90th
percentile of each. The aim: a session's exec under 10 ms. Nothing here
asserts a time.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable

from stockade.cell import Cell, Session
from stockade.daemon._client import Client
from stockade.daemon._server import DaemonThread


def _stats(samples: list[float]) -> str:
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
    return f"median {statistics.median(ordered) * 1e3:8.2f} ms   p90 {p90 * 1e3:8.2f} ms"


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=50)
    rounds = parser.parse_args().rounds
    commands = {"/bin/true": ["/bin/true"], "sh -c 'echo hi'": ["/bin/sh", "-c", "echo hi"]}
    big = os.urandom(8 << 20)
    with tempfile.TemporaryDirectory() as tmp:
        ws = os.path.join(tmp, "ws")
        os.mkdir(ws)
        dt = DaemonThread(state=os.path.join(tmp, "state"), socket_path=os.path.join(tmp, "d.sock")).start()
        try:
            with (
                Session(workspace=ws) as session,
                Cell(workspace=ws) as cell,
                Client(dt.socket_path, timeout=120) as client,
            ):
                remote = client.open_session(policy_text=json.dumps({"name": "bench", "workspace": ws}))
                paths: dict[str, Callable[[list[str], bytes | None], object]] = {
                    "subprocess.run (host)": lambda argv, data: subprocess.run(
                        argv, input=data, capture_output=True, check=False
                    ),
                    "Session.exec (live session)": lambda argv, data: session.exec(argv, input=data),
                    "RemoteSession.exec (daemon)": lambda argv, data: remote.exec(argv, input=data),
                    "Cell.run (fresh cell)": lambda argv, data: cell.run(argv),
                }
                # Fresh cells run in a block of their own: the kernel tears down
                # an ended cell's namespaces in the background, and calls of
                # the other paths right after one would pay for it.
                fresh = {"Cell.run (fresh cell)": paths.pop("Cell.run (fresh cell)")}
                for name, argv in commands.items():
                    times: dict[str, list[float]] = {k: [] for k in (*paths, *fresh)}
                    for _ in range(rounds):
                        for label, fn in paths.items():
                            times[label].append(_timed(lambda fn=fn, argv=argv: fn(argv, None)))  # type: ignore[misc]
                    for _ in range(rounds):
                        for label, fn in fresh.items():
                            times[label].append(_timed(lambda fn=fn, argv=argv: fn(argv, None)))  # type: ignore[misc]
                    print(f"\nexec {name} ({rounds} rounds)")
                    for label, samples in times.items():
                        print(f"  {label:30s} {_stats(samples)}")
                files: dict[str, list[float]] = {"Session": [], "RemoteSession": []}
                data = os.urandom(4096)
                for _ in range(rounds):
                    for label, s in (("Session", session), ("RemoteSession", remote)):
                        files[label].append(
                            _timed(lambda s=s: (s.write_file("f.bin", data), s.read_file("f.bin")))  # type: ignore[misc]
                        )
                print(f"\nwrite_file + read_file of 4 KiB ({rounds} rounds)")
                for label, samples in files.items():
                    print(f"  {label:30s} {_stats(samples)}")
                # A session's own start and end, beside a fresh cell's whole
                # life (the same launch and teardown, with one command).
                text = json.dumps({"name": "bench", "workspace": ws})
                ends: dict[str, list[float]] = {
                    "Session.start": [],
                    "Session.close": [],
                    "RemoteSession open": [],
                    "RemoteSession close": [],
                    "Cell.run /bin/true": [],
                }
                for _ in range(max(5, rounds // 5)):
                    start = time.perf_counter()
                    opened = Session(workspace=ws).start()
                    ends["Session.start"].append(time.perf_counter() - start)
                    ends["Session.close"].append(_timed(opened.close))
                    start = time.perf_counter()
                    hosted = client.open_session(policy_text=text)
                    ends["RemoteSession open"].append(time.perf_counter() - start)
                    ends["RemoteSession close"].append(_timed(hosted.close))
                    ends["Cell.run /bin/true"].append(_timed(lambda: cell.run(["/bin/true"])))
                print(f"\na session's start and end ({len(ends['Session.start'])} rounds)")
                for label, samples in ends.items():
                    print(f"  {label:30s} {_stats(samples)}")
                moved: dict[str, list[float]] = {
                    "subprocess.run (host)": [],
                    "Session.exec (live session)": [],
                    "RemoteSession.exec (daemon)": [],
                    "base64 encode + decode alone": [],
                }
                for _ in range(max(3, rounds // 10)):
                    for label in moved:
                        if label.startswith("base64"):
                            moved[label].append(_timed(lambda: base64.b64decode(base64.b64encode(big))))
                        else:
                            moved[label].append(_timed(lambda label=label: paths[label](["cat"], big)))  # type: ignore[misc]
                print("\n8 MiB through stdin and back (cat)")
                for label, samples in moved.items():
                    print(f"  {label:30s} {_stats(samples)}")
                remote.close()
        finally:
            dt.stop()


if __name__ == "__main__":
    main()
