"""Kernel-refusal latency: from the refused system call to its event on the daemon's live stream,
beside the floor, the same refusal's audit record reaching a raw audit socket.

Run as root from the repository:

    .venv/bin/python benchmarks/kernel_refusals.py [--refusals N] [--gap MS] [--relay both|on|off]

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
namespace). With ``--relay both`` (the default) the whole measurement is made
twice, alternating, with the daemon's audit relay (``cell._audit_relay``: a
second reader in a process of its own) and without it
(``STOCKADE_AUDIT_RELAY=off`` in the daemon's environment), ``--rounds``
times each, and the ratios with / without are printed: what the relay costs
the live path. Nothing here asserts a time; it prints the figures.
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


def measure(refusals: int, gap: float, relay: bool) -> tuple[list[float], list[float], list[float], int]:
    """One daemon, one run: (raw, stream, added) latencies in ms, and how many calls the agent made."""
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
                "command": ["/usr/bin/python3", "-I", "-S", "-c", AGENT, str(refusals), str(gap)],
                "limits": {"timeout": "10m", "denials": refusals * 10},
            }
        )
    )
    state, sock_path = tmp / "state", tmp / "d.sock"
    code = (
        "import sys\nfrom stockade.daemon._server import serve\n"
        "serve(state=sys.argv[1], socket_path=sys.argv[2], ready=lambda d: print('ready', flush=True))\n"
    )
    env = dict(os.environ)
    env.pop("STOCKADE_AUDIT_RELAY", None)
    if not relay:
        env["STOCKADE_AUDIT_RELAY"] = "off"
    raw = RawAudit()
    daemon = subprocess.Popen(
        [sys.executable, "-c", code, str(state), str(sock_path)], stdout=subprocess.PIPE, cwd=ROOT, env=env
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
        relay_status = client.call("status")["audit_relay"]
        client.close()
    finally:
        daemon.terminate()
        daemon.wait()
        raw.close()
        shutil.rmtree(tmp, ignore_errors=True)
    # The switch took: a relay ran, or none did.
    if relay != (relay_status is not None and relay_status.get("pid") is not None):
        raise SystemExit(f"asked for relay={relay}, the daemon's status says {relay_status}")
    calls = [float(line) for line in logs.split()]
    if not arrivals:
        raise SystemExit("no refusal reached the live stream")
    domain = arrivals[0][1].encode()
    raw_times = [t for t, d in raw.seen if d == domain]
    stream_times = [t for t, d in arrivals if d == domain.decode()]
    n = min(len(calls), len(raw_times), len(stream_times))
    return (
        [(raw_times[i] - calls[i]) * 1000 for i in range(n)],
        [(stream_times[i] - calls[i]) * 1000 for i in range(n)],
        [(stream_times[i] - raw_times[i]) * 1000 for i in range(n)],
        len(calls),
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--refusals", type=int, default=300, help="refusals timed (default 300)")
    parser.add_argument("--gap", type=float, default=10.0, help="milliseconds between refusals (default 10)")
    parser.add_argument(
        "--relay", choices=("both", "on", "off"), default="both", help="with the relay, without, or both"
    )
    parser.add_argument("--rounds", type=int, default=2, help="runs of each mode, alternating (default 2)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: cells under the daemon and the audit log need it")
    modes = {"both": (True, False), "on": (True,), "off": (False,)}[args.relay]
    got: dict[bool, tuple[list[float], list[float], list[float]]] = {m: ([], [], []) for m in modes}
    for _ in range(args.rounds):
        for mode in modes:
            raw, stream, added, _calls = measure(args.refusals, args.gap, mode)
            for into, values in zip(got[mode], (raw, stream, added), strict=True):
                into.extend(values)
    for mode in modes:
        raw, stream, added = got[mode]
        print(
            f"kernel-refusal latency {'with' if mode else 'without'} the audit relay, {len(stream)} Landlock "
            f"refusals one every {args.gap:g} ms ({args.rounds} runs)"
        )
        print(_figures("raw", raw))
        print(_figures("stream", stream))
        print(_figures("added", added))
    if len(modes) == 2:
        on, off = got[True], got[False]
        print("with / without the relay:")
        for i, name in enumerate(("raw", "stream", "added")):
            a, b = sorted(on[i]), sorted(off[i])
            p99a, p99b = a[min(len(a) - 1, int(len(a) * 0.99))], b[min(len(b) - 1, int(len(b) * 0.99))]
            print(
                f"{name:<8} p50 {statistics.median(a) / statistics.median(b):5.2f}x   "
                f"p99 {p99a / p99b:5.2f}x   mean {statistics.fmean(a) / statistics.fmean(b):5.2f}x"
            )


if __name__ == "__main__":
    main()
