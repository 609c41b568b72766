"""The broker's intent round trip, as an agent pays it, and the daemon's throughput.

Run as root from the repository:

    .venv/bin/python benchmarks/intents.py [--requests N] [--seconds S]

A daemon is started in a process of its own (``stockade.daemon._server.serve``)
on a fresh state directory, and one run is started under it whose agent, in
its cell, is the load generator (``/usr/bin/python3``, standard library only,
framing by hand): the clients are where agents are, behind the broker socket
the cell is given, on the same two cores as the daemon.

- round trip: one client, ``fs.read`` of a small granted file, allowed by a
  rule, sent one after the other; each is recorded durably (one ``O_DSYNC``
  write of the store's journal, docs/RECORD.md) before it is answered. p50
  and p99 over N intents after a warm-up.
- throughput: 1, 10 and 100 client processes in the cell, each with its own
  connection, sending the same intent in a loop for S seconds; intents
  answered per second. The store is then checked to hold every one of them.

Nothing here asserts a time; it prints the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

LOAD = r"""
import json, os, socket, struct, sys, time

BROKER, TOKEN = os.environ["STOCKADE_BROKER"], os.environ["STOCKADE_TOKEN"]
PATH = sys.argv[1]
REQUESTS, SECONDS = int(sys.argv[2]), float(sys.argv[3])
LEVELS = [int(x) for x in sys.argv[4].split(",")]

def frame(i):
    body = json.dumps({"v": 1, "id": i, "method": "intent",
                       "params": {"token": TOKEN, "intent": "fs.read", "args": {"path": PATH}}}).encode()
    return struct.pack(">I", len(body)) + body

def one(s, i, request):
    # One recv for the whole reply when it has come, as the floor's client
    # below reads its echo: framing by hand, without a second system call for
    # the length.
    s.sendall(request)
    buf = s.recv(65536)
    while len(buf) < 4 or len(buf) < 4 + struct.unpack_from(">I", buf)[0]:
        chunk = s.recv(65536)
        if not chunk:
            raise EOFError
        buf += chunk
    if b'"verdict":"allow"' not in buf:
        raise SystemExit("not allowed: " + buf[:300].decode(errors="replace"))

def connect():
    s = socket.socket(socket.AF_UNIX)
    s.connect(BROKER)
    return s

# Round trip, one client.
s = connect()
request = frame(1)
for i in range(200):
    one(s, i, request)
times = []
for i in range(REQUESTS):
    t = time.perf_counter_ns()
    one(s, i, request)
    times.append(time.perf_counter_ns() - t)
s.close()
times.sort()
print(json.dumps({"round_trip_ns": {"p50": times[len(times) // 2], "p90": times[int(len(times) * 0.9)],
                  "p99": times[int(len(times) * 0.99)], "n": len(times)}}), flush=True)

# Throughput: C processes, each its own connection, for SECONDS.
for clients in LEVELS:
    pipes, pids = [], []
    start_r, start_w = os.pipe()
    for c in range(clients):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.close(start_w)
            s = connect()
            os.read(start_r, 1)  # all connected first, then all start
            done, end = 0, time.monotonic() + SECONDS
            while time.monotonic() < end:
                one(s, done, request)
                done += 1
            os.write(w, str(done).encode())
            os._exit(0)
        os.close(w)
        pipes.append(r)
        pids.append(pid)
    t0 = time.monotonic()
    os.write(start_w, b"x" * clients)
    total = 0
    for r in pipes:
        total += int(os.read(r, 64) or b"0")
        os.close(r)
    for pid in pids:
        os.waitpid(pid, 0)
    elapsed = time.monotonic() - t0
    os.close(start_r)
    os.close(start_w)
    print(json.dumps({"throughput": {"clients": clients, "intents": total, "seconds": round(elapsed, 3),
                      "per_second": round(total / elapsed, 1)}}), flush=True)
"""


def _call(sock: socket.socket, rid: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
    body = json.dumps({"v": 1, "id": rid, "method": method, "params": params}).encode()
    sock.sendall(struct.pack(">I", len(body)) + body)
    while True:
        msg = _read(sock)
        if msg.get("id") == rid:
            if not msg.get("ok"):
                raise SystemExit(f"{method}: {msg}")
            result: dict[str, Any] = msg["result"]
            return result


def _read(sock: socket.socket) -> dict[str, Any]:
    head = b""
    while len(head) < 4:
        chunk = sock.recv(4 - len(head))
        if not chunk:
            raise SystemExit("the daemon closed the connection")
        head += chunk
    (n,) = struct.unpack(">I", head)
    body = b""
    while len(body) < n:
        body += sock.recv(n - len(body))
    message: dict[str, Any] = json.loads(body)
    return message


def _fsync_floor(directory: Path, rounds: int = 500) -> tuple[float, float]:
    """p50 and p99, in microseconds, of one durable SQLite commit (WAL,
    synchronous=FULL, one small row) on the filesystem of ``directory``: the
    least an intent that is recorded before it is answered can cost here."""
    import sqlite3

    path = directory / "floor.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE t (x TEXT)")
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        conn.execute("BEGIN")
        conn.execute("INSERT INTO t VALUES (?)", ("x" * 400,))
        conn.execute("COMMIT")
        times.append(time.perf_counter() - t)
    conn.close()
    times.sort()
    return times[len(times) // 2] * 1e6, times[int(len(times) * 0.99)] * 1e6


FLOOR_SERVER = r"""
import asyncio, os, sys
import uvloop
sock_path, journal, durable = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
fd = os.open(journal, os.O_RDWR | os.O_CREAT | os.O_DSYNC, 0o600)
os.pwrite(fd, bytes(32 << 20), 0)  # written blocks, as the daemon's journal (record/_journal.py)
os.fsync(fd)
offset, pending, scheduled = 0, [], False

def flush():
    # Group commit, as the daemon's recorder: one durable write for every
    # frame this pass of the loop received, then the answers.
    global offset, pending, scheduled
    batch, pending, scheduled = pending, [], False
    if durable:
        data = b"".join(frame for _, frame in batch)
        os.pwrite(fd, data, offset)
        offset = (offset + len(data)) % (31 << 20)
    for transport, frame in batch:
        transport.write(frame)

class Echo(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.buf = transport, b""

    def data_received(self, data):
        global scheduled
        self.buf += data
        while len(self.buf) >= 4:
            n = int.from_bytes(self.buf[:4], "big")
            if len(self.buf) < 4 + n:
                return
            frame, self.buf = self.buf[: 4 + n], self.buf[4 + n :]
            pending.append((self.transport, frame))
            if not scheduled:
                scheduled = True
                asyncio.get_running_loop().call_soon(flush)

async def main():
    server = await asyncio.get_running_loop().create_unix_server(Echo, sock_path, backlog=256)
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    server.close()

# On the daemon's own loop (stockade.daemon._server.new_loop), so that the
# floor is the least that loop can do.
uvloop.run(main())
"""

_FLOOR_FRAME = json.dumps(
    {
        "v": 1,
        "id": 1,
        "method": "intent",
        "params": {"token": "x" * 180, "intent": "fs.read", "args": {"path": "/tmp/granted/small.txt"}},
    }
).encode()


@contextlib.contextmanager
def _floor_server(directory: Path, durable: bool) -> Iterator[str]:
    sock_path = directory / f"floor-{int(durable)}.sock"
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            FLOOR_SERVER,
            str(sock_path),
            str(directory / "floor.journal"),
            str(int(durable)),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert server.stdout is not None
        if server.stdout.readline() != b"ready\n":
            raise SystemExit("the floor server did not start")
        yield str(sock_path)
    finally:
        server.communicate(b"", timeout=30)


def _echo_once(sock: socket.socket, frame: bytes) -> None:
    sock.sendall(frame)
    got = 0
    while got < len(frame):
        chunk = sock.recv(65536)
        if not chunk:
            raise SystemExit("the floor server closed the connection")
        got += len(chunk)


def _echo_throughput(directory: Path, clients: int, seconds: float) -> float:
    """Answers per second of the durable echo server (group commit) to
    ``clients`` processes, each its own connection, in a loop for ``seconds``:
    the most a one-interpreter Python daemon could answer here if recording
    and answering were all it did."""
    frame = struct.pack(">I", len(_FLOOR_FRAME)) + _FLOOR_FRAME
    with _floor_server(directory, True) as sock_path:
        start_r, start_w = os.pipe()
        pipes, pids = [], []
        for _ in range(clients):
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # a client
                try:
                    os.close(r)
                    sock = socket.socket(socket.AF_UNIX)
                    sock.connect(sock_path)
                    os.read(start_r, 1)
                    done, end = 0, time.monotonic() + seconds
                    while time.monotonic() < end:
                        _echo_once(sock, frame)
                        done += 1
                    os.write(w, str(done).encode())
                finally:
                    os._exit(0)
            os.close(w)
            pipes.append(r)
            pids.append(pid)
        started = time.monotonic()
        os.write(start_w, b"x" * clients)
        total = 0
        for r in pipes:
            total += int(os.read(r, 64) or b"0")
            os.close(r)
        for pid in pids:
            os.waitpid(pid, 0)
        elapsed = time.monotonic() - started
        os.close(start_r)
        os.close(start_w)
    return total / elapsed


def _echo_floor(directory: Path, durable: bool, rounds: int) -> tuple[float, float]:
    """p50 and p99, in microseconds, of the same client loop against a bare
    server on the daemon's loop (uvloop) that echoes each frame, after one
    ``O_DSYNC`` write of it to a preallocated file when ``durable``: what a
    Python daemon answering only after a durable write costs on this machine
    before doing any work."""
    frame = struct.pack(">I", len(_FLOOR_FRAME)) + _FLOOR_FRAME
    times = []
    with _floor_server(directory, durable) as sock_path:
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(sock_path)
        for i in range(rounds + 200):
            t = time.perf_counter_ns()
            _echo_once(sock, frame)
            if i >= 200:
                times.append(time.perf_counter_ns() - t)
        sock.close()
    times.sort()
    return times[len(times) // 2] / 1000, times[int(len(times) * 0.99)] / 1000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=5000, help="round trips timed (default 5000)")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per throughput level (default 5)")
    parser.add_argument("--clients", default="1,10,100", help="throughput levels (default 1,10,100)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: cells under the daemon need it on this host")

    tmp = Path(tempfile.mkdtemp(prefix="stockade-bench-", dir="/tmp"))
    os.chmod(tmp, 0o755)
    try:
        granted = tmp / "granted"
        granted.mkdir()
        (granted / "small.txt").write_text("a small granted file\n")
        ws = tmp / "ws"
        ws.mkdir()
        policy = tmp / "bench.json"
        policy.write_text(
            json.dumps(
                {
                    "name": "bench",
                    "workspace": str(ws),
                    "command": [
                        "/usr/bin/python3",
                        "-c",
                        LOAD,
                        f"{granted}/small.txt",
                        str(args.requests),
                        str(args.seconds),
                        args.clients,
                    ],
                    "filesystem": {"read": [str(granted)]},
                    "tools": [
                        {
                            "id": "small",
                            "intent": "fs.read",
                            "verdict": "allow",
                            "match": {"path": f"{granted}/*"},
                        }
                    ],
                    "limits": {"timeout": "30m", "pids": 1024, "memory": "4G"},
                }
            )
        )
        state, sock_path = tmp / "state", tmp / "d.sock"
        code = (
            "import sys\nfrom stockade.daemon._server import serve\n"
            "serve(state=sys.argv[1], socket_path=sys.argv[2], ready=lambda d: print('ready', flush=True))\n"
        )
        daemon = subprocess.Popen(
            [sys.executable, "-c", code, str(state), str(sock_path)], stdout=subprocess.PIPE, cwd=ROOT
        )
        try:
            assert daemon.stdout is not None
            ready, _, _ = select.select([daemon.stdout], [], [], 60)
            if not ready or daemon.stdout.readline() != b"ready\n":
                raise SystemExit("the daemon did not start")
            control = socket.socket(socket.AF_UNIX)
            control.connect(str(sock_path))
            events = socket.socket(socket.AF_UNIX)
            events.connect(str(sock_path))
            _call(events, 1, "events.subscribe", {"run": None})
            before = _call(control, 1, "status", {})["store"]
            started = time.monotonic()
            run = _call(control, 2, "run.start", {"policy_path": str(policy), "detach": True})
            while True:
                msg = _read(events)
                event = msg.get("event", {}).get("event", {})
                if event.get("kind") == "run.end" and event.get("run") == run["id"]:
                    break
            took = time.monotonic() - started
            after = _call(control, 3, "status", {})["store"]
            logs = _call(control, 4, "run.logs", {"run": run["id"]})["data"]
            info = next(r for r in _call(control, 5, "run.list", {})["runs"] if r["id"] == run["id"])
            verified = _call(
                control,
                6,
                "verify",
                {},
            )
            control.close()
            events.close()
        finally:
            daemon.terminate()
            daemon.wait(60)
        results = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
        if info["exit_code"] != 0 or not results:
            raise SystemExit(
                f"the load generator failed ({info['state']}, exit {info['exit_code']}):\n{logs[-2000:]}"
            )
        rt = next(r["round_trip_ns"] for r in results if "round_trip_ns" in r)
        print(f"intent round trip (fs.read allowed, recorded durably), one client, n={rt['n']}:")
        p50, p90, p99 = (rt[k] / 1000 for k in ("p50", "p90", "p99"))
        print(f"  p50 {p50:.0f} us   p90 {p90:.0f} us   p99 {p99:.0f} us")
        floor50, floor99 = _fsync_floor(tmp)
        echo50, echo99 = _echo_floor(tmp, False, args.requests)
        dsync50, dsync99 = _echo_floor(tmp, True, args.requests)
        print("  side by side, the same client loop against a bare echo server on uvloop (the floor):")
        print(f"    echo only                          p50 {echo50:.0f} us   p99 {echo99:.0f} us")
        print(f"    echo after one O_DSYNC write        p50 {dsync50:.0f} us   p99 {dsync99:.0f} us")
        print(f"    stockade / durable echo: p50 {p50 / dsync50:.2f}x, p99 {p99 / dsync99:.2f}x")
        print(f"  (one durable SQLite commit on this disk alone: p50 {floor50:.0f} us, p99 {floor99:.0f} us)")
        print("throughput (allowed intents answered per second, each recorded durably first),")
        print("side by side with the durable echo server (group commit, same client loop, from the host):")
        for r in results:
            if "throughput" in r:
                t = r["throughput"]
                rate, done, secs = t["per_second"], t["intents"], t["seconds"]
                floor = _echo_throughput(tmp, t["clients"], args.seconds)
                print(
                    f"  {t['clients']:>3} clients  {rate:>9.0f} /s   ({done} in {secs} s)"
                    f"   durable echo {floor:>7.0f} /s   stockade / echo {rate / floor:.2f}x"
                )
        stored = after["last_seq"] - before["last_seq"]
        commits = after["commits"] - before["commits"]
        print(
            f"record: {info['intents']} intent events of this run, {stored} events stored in "
            f"{commits} transactions ({stored / max(commits, 1):.1f} per commit); "
            f"chain {'intact' if verified['ok'] else 'BROKEN'}; whole run {took:.1f} s"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
