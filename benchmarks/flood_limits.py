"""What the flood limits cost on the paths they guard, each beside its floor.

Run from the repository:

    .venv/bin/python benchmarks/flood_limits.py [--requests N] [--intents N] [--rounds N]

- LLM endpoint: N requests, one after the other on one keep-alive loopback
  connection, to a trivial ASGI app served by ``llm.AppServer`` (uvicorn's
  h11 protocol guarded: connection cap, idle timer, descriptor reserve)
  beside the same app on plain uvicorn with ``http="h11"`` (the floor), on
  the daemon's loop (uvloop). Requests per second and p50 / p99.
- new connections: N connections opened and closed against each (the guard
  pays one ``getrlimit`` and a count per accept).
- ``tool.record``'s checks, per call: ``RecordBudgets.charge`` (a token
  bucket and a byte count) and ``JournaledStore.room_for_agents`` (a stat and
  a statvfs once a second, a comparison otherwise), against an empty call.
- the intent path: its budget (``RecordBudgets.intents()``), per intent: the
  size the arguments would take redacted in the event (``_stored_size``) and
  the charge, for a typical ``fs.read``;
  the rest of the flood limits are per connection (the descriptor check, the
  broker's idle timer) or the run's own object (the family's tripwire).
  benchmarks/intents.py measures the whole intent path.
- the intent path beside a flood of kernel refusals, with the daemon's audit
  relay and without it (``STOCKADE_AUDIT_RELAY=off``), as root: a daemon in a
  process of its own, one run whose agent is refused file creations in
  ``/etc`` by Landlock as fast as it can (every one is parsed by the daemon's
  reader and, with the relay, by the relay's too, spooled and fdatasync'd),
  and beside it a second run whose agent sends N ``fs.read`` intents one
  after the other and times each round trip; alternating, ``--rounds``
  times each; p50 / p99 and the ratios with / without.

Nothing here asserts a time; it prints the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import select
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Awaitable, Callable
from pathlib import Path

import uvicorn
import uvloop
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from stockade.daemon._client import Client
from stockade.daemon._intent_path import _stored_size
from stockade.daemon._tools import RecordBudgets
from stockade.llm import AppServer
from stockade.record._journaled import open_journaled_store

REQUEST = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"


def _app() -> Starlette:
    async def hello(request: Request) -> Response:
        return PlainTextResponse("ok")

    return Starlette(routes=[Route("/", hello)])


def _listening() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


async def _plain(sock: socket.socket) -> Callable[[], Awaitable[None]]:
    config = uvicorn.Config(
        _app(),
        lifespan="off",
        log_config=None,
        access_log=False,
        server_header=False,
        date_header=False,
        http="h11",
    )
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.001)

    async def close() -> None:
        server.should_exit = True
        await task

    return close


async def _guarded(sock: socket.socket) -> Callable[[], Awaitable[None]]:
    server = AppServer(_app(), sock)
    await server.start()
    return server.close


async def _requests(port: int, n: int) -> list[float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    took = []
    for _ in range(n):
        start = time.perf_counter()
        writer.write(REQUEST)
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        took.append(time.perf_counter() - start)
    writer.close()
    return took


async def _connections(port: int, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        await reader.read()
        writer.close()
    return (time.perf_counter() - start) / n


async def _serve_both(n: int) -> None:
    for name, make in (("uvicorn h11 (floor)", _plain), ("AppServer guarded", _guarded)):
        sock = _listening()
        port = sock.getsockname()[1]
        close = await make(sock)
        await _requests(port, 200)  # warm up
        took = await _requests(port, n)
        per_connection = await _connections(port, max(100, n // 10))
        await close()
        p50, p99 = statistics.median(took), statistics.quantiles(took, n=100)[98]
        print(
            f"{name:22s} {n / sum(took):8.0f} req/s  p50 {p50 * 1e6:6.0f} us  p99 {p99 * 1e6:6.0f} us  "
            f"new connection + request {per_connection * 1e6:6.0f} us"
        )


def _checks() -> None:
    budgets = RecordBudgets(rate=1e12, burst=10**12, total=10**18)
    n = 200_000
    empty = timeit.timeit(lambda: None, number=n) / n
    charge = timeit.timeit(lambda: budgets.charge("r-0123456789ab", 300), number=n) / n
    with tempfile.TemporaryDirectory() as tmp:
        store = open_journaled_store(f"{tmp}/events.db")
        room = timeit.timeit(store.room_for_agents, number=n) / n
        store.close()
    intents = RecordBudgets.intents(rate=1e12, burst=10**12, total=10**18)
    args = {"path": "/srv/docs/readme.md"}

    def intent_charge() -> None:
        intents.charge("r-0123456789ab", _stored_size(args))

    per_intent = timeit.timeit(intent_charge, number=n) / n
    print(f"empty call             {empty * 1e9:6.0f} ns")
    print(f"intent budget (fs.read) {per_intent * 1e9:5.0f} ns")
    print(f"RecordBudgets.charge   {charge * 1e9:6.0f} ns")
    print(f"room_for_agents        {room * 1e9:6.0f} ns")


FLOODER = """
import sys
print("flooding", flush=True)
i = 0
while True:
    i += 1
    try:
        open(f"/etc/stockade-flood-{i}", "w")
    except OSError:
        pass
"""

CLIENT = r"""
import json, os, socket, struct, sys, time
n, path = int(sys.argv[1]), sys.argv[2]
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["STOCKADE_BROKER"])
token = os.environ["STOCKADE_TOKEN"]
took = []
for i in range(n + 200):
    body = json.dumps({"v": 1, "id": i + 1, "method": "intent",
                       "params": {"token": token, "intent": "fs.read", "args": {"path": path}}}).encode()
    t = time.perf_counter_ns()
    s.sendall(struct.pack(">I", len(body)) + body)
    size = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))[0]
    reply = json.loads(s.recv(size, socket.MSG_WAITALL))
    if i >= 200:  # after a warm-up
        took.append(time.perf_counter_ns() - t)
    if '"verdict": "allow"' not in json.dumps(reply):
        raise SystemExit(f"not allowed: {reply}")
print(json.dumps(took))
"""


def _relay_round(tmp: Path, intents: int, relay: bool) -> list[float]:
    """One daemon: the intent round trips (us) beside a refusal flood."""
    granted = tmp / "granted"
    granted.mkdir(exist_ok=True)
    (granted / "small.txt").write_text("a small granted file\n")
    ws = tmp / "ws"
    ws.mkdir(exist_ok=True)
    flood = tmp / "flood.json"
    flood.write_text(
        json.dumps(
            {
                "name": "flood",
                "workspace": str(ws),
                "command": ["/usr/bin/python3", "-I", "-S", "-c", FLOODER],
                "limits": {"timeout": "10m", "denials": 10**9},
            }
        )
    )
    client_policy = tmp / "client.json"
    client_policy.write_text(
        json.dumps(
            {
                "name": "client",
                "workspace": str(ws),
                "command": [
                    "/usr/bin/python3",
                    "-I",
                    "-S",
                    "-c",
                    CLIENT,
                    str(intents),
                    f"{granted}/small.txt",
                ],
                "filesystem": {"read": [str(granted)]},
                "tools": [
                    {"id": "r", "intent": "fs.read", "verdict": "allow", "match": {"path": f"{granted}/*"}}
                ],
                "limits": {"timeout": "10m"},
            }
        )
    )
    state, sock_path = tmp / "state", tmp / "d.sock"
    code = (
        "import sys\nfrom stockade.daemon._server import serve\n"
        "serve(state=sys.argv[1], socket_path=sys.argv[2], ready=lambda d: print('ready', flush=True))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "STOCKADE_AUDIT_RELAY"}
    if not relay:
        env["STOCKADE_AUDIT_RELAY"] = "off"
    daemon = subprocess.Popen(
        [sys.executable, "-c", code, str(state), str(sock_path)], stdout=subprocess.PIPE, env=env
    )
    try:
        assert daemon.stdout is not None
        ready, _, _ = select.select([daemon.stdout], [], [], 60)
        if not ready or daemon.stdout.readline() != b"ready\n":
            raise SystemExit("the daemon did not start")
        client = Client(sock_path)
        stream = client.subscribe("events.subscribe")
        flooder = client.call("run.start", policy_path=str(flood), detach=True)["id"]
        for pushed in stream:  # the flood is under way before the intents start
            event = pushed.get("event", pushed)
            if event.get("run") == flooder and event["kind"] == "cell.denied":
                break
        timed = client.call("run.start", policy_path=str(client_policy), detach=True)["id"]
        for pushed in stream:
            event = pushed.get("event", pushed)
            if event.get("run") == timed and event["kind"] == "run.end":
                break
        stream.close()
        relay_status = client.call("status")["audit_relay"]
        client.call("run.stop", run=flooder, grace=0)
        logs = client.call("run.logs", run=timed)["data"]
        client.close()
    finally:
        daemon.terminate()
        daemon.wait()
        shutil.rmtree(state, ignore_errors=True)
    if relay != (relay_status is not None and relay_status.get("pid") is not None):
        raise SystemExit(f"asked for relay={relay}, the daemon's status says {relay_status}")
    line = next((x for x in logs.splitlines() if x.startswith("[")), None)
    if line is None:
        raise SystemExit(f"the intent client failed:\n{logs[-2000:]}")
    return [ns / 1000 for ns in json.loads(line)]


def _relay_cost(intents: int, rounds: int) -> None:
    got: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(rounds):
        for relay in (True, False):
            tmp = Path(tempfile.mkdtemp(prefix="stockade-bench-", dir="/tmp"))
            os.chmod(tmp, 0o755)
            try:
                took = _relay_round(tmp, intents, relay)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            got[relay].extend(took)
    print(f"intent round trip (fs.read) beside a Landlock refusal flood, {rounds} runs of {intents} each:")
    figures = {}
    for relay in (True, False):
        took = got[relay]
        p50, p99 = statistics.median(took), statistics.quantiles(took, n=100)[98]
        figures[relay] = (p50, p99, statistics.fmean(took))
        print(
            f"  {'with' if relay else 'without'} the audit relay {'' if relay else '   '}"
            f"p50 {p50:6.0f} us  p99 {p99:6.0f} us  mean {figures[relay][2]:6.0f} us"
        )
    on, off = figures[True], figures[False]
    print(
        f"  with / without: p50 {on[0] / off[0]:.2f}x  p99 {on[1] / off[1]:.2f}x  mean {on[2] / off[2]:.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--intents", type=int, default=2000, help="intents timed beside the flood (0: skip)")
    parser.add_argument("--rounds", type=int, default=2, help="runs with and without the relay, alternating")
    args = parser.parse_args()
    uvloop.run(_serve_both(args.requests))
    _checks()
    if args.intents and os.geteuid() == 0:
        _relay_cost(args.intents, args.rounds)


if __name__ == "__main__":
    main()
