"""Kernel-refusal latency: from the refused system call to its event on the daemon's live stream,
beside the floor, the same refusal's audit record reaching a raw audit socket.

Run as root from the repository:

    .venv/bin/python benchmarks/kernel_refusals.py [--refusals N] [--gap MS]

A daemon is started in a process of its own (``stockade.daemon._server.serve``)
on a fresh state directory; this process subscribes to its live stream
(``events.subscribe``) and, beside it, opens a raw ``NETLINK_AUDIT`` socket
bound to the read-only log group, as the daemon's reader does. One run is
started whose agent (``/usr/bin/python3`` in its cell) is refused N file
creations in ``/etc`` by Landlock, one every GAP milliseconds (the pacing is
the workload, so that each refusal is timed alone, not in a burst), and prints
the wall-clock time just before each call. Each refusal is then timed twice:

- raw: the call to the arrival of its ``AUDIT_LANDLOCK_ACCESS`` record (matched
  by the run's Landlock domain, in order) on the raw socket, read by a thread
  of this process: what the kernel itself costs (the floor);
- stream: the call to the arrival of its ``cell.denied`` event on the live
  stream: the floor plus the daemon's reader, the correlation, the hop to the
  loop, the durable write of the record and the push to a subscriber.

Both clocks are CLOCK_REALTIME of one machine (the cell has no time
namespace). Nothing here asserts a time; it prints the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from stockade.daemon._client import Client  # noqa: E402

AGENT = """
import sys, time
n, gap = int(sys.argv[1]), float(sys.argv[2]) / 1000
for i in range(n):
    t = time.time()
    try:
        open(f"/etc/stockade-bench-{i}", "w")
    except OSError:
        pass
    print(repr(t), flush=True)
    time.sleep(gap)
"""

_DOMAIN = re.compile(rb"domain=([0-9a-f]+) blockers=fs\.make_reg")


class RawAudit:
    """A raw audit socket read by a thread: (arrival time, domain) of each Landlock access record."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 9)  # NETLINK_AUDIT
        self.sock.bind((0, 1))  # AUDIT_NLGRP_READLOG
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.seen: list[tuple[float, bytes]] = []
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            ready, _, _ = select.select([self.sock], [], [], 0.2)
            if not ready:
                continue
            data = self.sock.recv(1 << 16)
            now = time.time()
            # nlmsghdr: len, type (1423 AUDIT_LANDLOCK_ACCESS)
            if len(data) > 16 and int.from_bytes(data[4:6], "little") == 1423:
                m = _DOMAIN.search(data)
                if m is not None:
                    self.seen.append((now, m[1]))

    def close(self) -> None:
        self._stop = True
        self._thread.join()
        self.sock.close()


def _figures(name: str, ms: list[float]) -> str:
    ms = sorted(ms)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return (
        f"{name:<8} n={len(ms):<5} p50 {statistics.median(ms):7.3f} ms   p99 {p99:7.3f} ms   "
        f"max {ms[-1]:7.3f} ms   mean {statistics.fmean(ms):7.3f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--refusals", type=int, default=300, help="refusals timed (default 300)")
    parser.add_argument("--gap", type=float, default=10.0, help="milliseconds between refusals (default 10)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: cells under the daemon and the audit log need it")
    tmp = Path(tempfile.mkdtemp(prefix="stockade-bench-", dir="/tmp"))
    os.chmod(tmp, 0o755)
    ws = tmp / "ws"
    ws.mkdir()
    policy = tmp / "refuser.json"
    policy.write_text(
        json.dumps(
            {
                "name": "refuser",
                "workspace": str(ws),
                "command": ["/usr/bin/python3", "-I", "-S", "-c", AGENT, str(args.refusals), str(args.gap)],
                "limits": {"timeout": "10m", "denials": args.refusals * 10},
            }
        )
    )
    state, sock_path = tmp / "state", tmp / "d.sock"
    code = (
        "import sys\nfrom stockade.daemon._server import serve\n"
        "serve(state=sys.argv[1], socket_path=sys.argv[2], ready=lambda d: print('ready', flush=True))\n"
    )
    raw = RawAudit()
    daemon = subprocess.Popen(
        [sys.executable, "-c", code, str(state), str(sock_path)], stdout=subprocess.PIPE, cwd=ROOT
    )
    try:
        assert daemon.stdout is not None
        ready, _, _ = select.select([daemon.stdout], [], [], 60)
        if not ready or daemon.stdout.readline() != b"ready\n":
            raise SystemExit("the daemon did not start")
        client = Client(sock_path)
        stream = client.subscribe("events.subscribe")
        run = client.call("run.start", policy_path=str(policy), detach=True)["id"]
        arrivals: list[tuple[float, str]] = []
        for pushed in stream:
            now = time.time()
            event = pushed.get("event", pushed)
            if event.get("run") != run:
                continue
            if event["kind"] == "cell.denied" and event["layer"] == "landlock":
                arrivals.append((now, str(event["detail"].get("domain"))))
            if event["kind"] == "run.end":
                break
        stream.close()
        logs = client.call("run.logs", run=run)["data"]
        client.close()
    finally:
        daemon.terminate()
        daemon.wait()
        raw.close()
        shutil.rmtree(tmp, ignore_errors=True)
    calls = [float(line) for line in logs.split()]
    if not arrivals:
        raise SystemExit("no refusal reached the live stream")
    domain = arrivals[0][1].encode()
    raw_times = [t for t, d in raw.seen if d == domain]
    stream_times = [t for t, d in arrivals if d == domain.decode()]
    n = min(len(calls), len(raw_times), len(stream_times))
    print(
        f"kernel-refusal latency, {n} Landlock refusals one every {args.gap:g} ms "
        f"(calls {len(calls)}, raw records {len(raw_times)}, stream events {len(stream_times)})"
    )
    print(_figures("raw", [(raw_times[i] - calls[i]) * 1000 for i in range(n)]))
    print(_figures("stream", [(stream_times[i] - calls[i]) * 1000 for i in range(n)]))
    print(_figures("added", [(stream_times[i] - raw_times[i]) * 1000 for i in range(n)]))


if __name__ == "__main__":
    main()
