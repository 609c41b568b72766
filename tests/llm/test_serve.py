"""AppServer: ASGI apps on pre-bound sockets, many at once, signals left alone, a clean close."""

from __future__ import annotations

import asyncio
import signal
import socket
from collections.abc import AsyncGenerator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from stockade.llm import AppServer
from tests.llm import listening


def _app(name: str, forever: asyncio.Event | None = None) -> Starlette:
    async def hello(request: Request) -> Response:
        return PlainTextResponse(name)

    async def endless(request: Request) -> Response:
        async def body() -> AsyncGenerator[bytes, None]:
            yield b"first\n"
            assert forever is not None
            await forever.wait()  # never set: only close() ends this response
            yield b"never\n"

        return StreamingResponse(body())

    return Starlette(routes=[Route("/", hello), Route("/endless", endless)])


def test_many_servers_in_one_loop() -> None:
    async def main() -> None:
        servers = [AppServer(_app(f"cell-{i}"), listening()) for i in range(8)]
        await asyncio.gather(*(server.start() for server in servers))
        ports = [server.address[1] for server in servers]
        async with httpx.AsyncClient(trust_env=False) as client:
            answers = await asyncio.gather(*(client.get(f"http://127.0.0.1:{port}/") for port in ports))
        assert [answer.text for answer in answers] == [f"cell-{i}" for i in range(8)]
        await asyncio.gather(*(server.close() for server in servers))
        for port in ports:
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=5).close()

    asyncio.run(main())


def test_signal_handlers_are_left_to_the_host() -> None:
    async def main() -> None:
        # Taken inside the loop: asyncio.run installs its own SIGINT handler.
        before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        server = AppServer(_app("x"), listening())
        await server.start()
        # This runs on the main thread: uvicorn's own Server.serve would have
        # installed its handlers by now.
        assert {sig: signal.getsignal(sig) for sig in before} == before
        await server.close()
        assert {sig: signal.getsignal(sig) for sig in before} == before

    asyncio.run(main())


def test_close_ends_a_response_in_flight() -> None:
    async def main() -> None:
        forever = asyncio.Event()
        server = AppServer(_app("x", forever), listening(), grace=1)
        await server.start()
        port = server.address[1]
        url = f"http://127.0.0.1:{port}/endless"
        async with httpx.AsyncClient(trust_env=False) as client, client.stream("GET", url) as response:
            lines = response.aiter_lines()
            assert await anext(lines) == "first"
            closing = asyncio.create_task(server.close())
            with pytest.raises(httpx.RemoteProtocolError):
                async for _ in lines:
                    pass
            await closing
        assert not forever.is_set()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()

    asyncio.run(main())


def test_a_server_starts_once() -> None:
    async def main() -> None:
        server = AppServer(_app("x"), listening())
        await server.start()
        try:
            with pytest.raises(RuntimeError, match="started already"):
                await server.start()
        finally:
            await server.close()

    asyncio.run(main())


def test_a_close_with_no_connection_open_does_not_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    # uvicorn's own shutdown sleeps 0.1 s for open connections even when
    # there are none; every gateway's close paid it (docs/PERFORMANCE.md).
    import uvicorn.server

    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(delay: float, *args: object) -> object:
        slept.append(delay)
        return await real_sleep(delay, *args)

    monkeypatch.setattr(uvicorn.server.asyncio, "sleep", sleep)

    async def main() -> None:
        idle = AppServer(_app("idle"), listening())
        await idle.start()
        port = idle.address[1]
        await idle.close()  # no connection was ever opened: nothing to wait for
        assert slept == []
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        # With a connection still open, uvicorn's own shutdown (and its grace) runs.
        busy = AppServer(_app("busy"), listening())
        await busy.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", busy.address[1])
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        assert b"busy" in await reader.read(4096)
        await busy.close()
        assert 0.1 in slept
        writer.close()

    asyncio.run(main())
