"""What the flood limits cost on the paths they guard, each beside its floor.

Run from the repository:

    .venv/bin/python benchmarks/flood_limits.py [--requests N]

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

Nothing here asserts a time; it prints the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import tempfile
import time
import timeit
from collections.abc import Awaitable, Callable

import uvicorn
import uvloop
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    args = parser.parse_args()
    uvloop.run(_serve_both(args.requests))
    _checks()


if __name__ == "__main__":
    main()
