"""What one cell can hold of the daemon through its LLM endpoint: a bounded
number of connections, none idle for long, none while descriptors are low;
each refusal closed at once, recorded once and counted (loopback only)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from stockade import _fds
from stockade.llm import AppServer
from stockade.record import Event
from tests.llm import listening

WAIT = 10.0


def _app(name: str) -> Starlette:
    async def hello(request: Request) -> Response:
        return PlainTextResponse(name)

    return Starlette(routes=[Route("/", hello)])


async def _get(port: int) -> bytes:
    """One request on a new connection; the whole answer (the server closes it)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    data = await asyncio.wait_for(reader.read(), WAIT)
    writer.close()
    return data


async def _closed_by_server(reader: asyncio.StreamReader) -> bool:
    return await asyncio.wait_for(reader.read(), WAIT) == b""


class Sink:
    def __init__(self) -> None:
        self.events: list[Event] = []

    async def record(self, events: Sequence[Event]) -> None:
        self.events.extend(events)


def test_past_the_cap_a_connection_is_closed_at_once_and_recorded_once() -> None:
    async def main() -> None:
        sink = Sink()
        server = AppServer(
            _app("flooded"), listening(), max_connections=4, record=sink.record, run_id="r-1", cell="c-1"
        )
        neighbour = AppServer(_app("neighbour"), listening(), max_connections=4)
        await server.start()
        await neighbour.start()
        port = server.address[1]
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
        refused = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        for reader, _writer in refused:
            assert await _closed_by_server(reader), "a connection past the cap was kept"
        # While the flood is held, another cell's endpoint answers.
        assert (await _get(neighbour.address[1])).endswith(b"neighbour")
        # One held connection still works, and freeing one lets a new one in.
        reader, writer = held[0]
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        assert (await asyncio.wait_for(reader.read(), WAIT)).endswith(b"flooded")
        writer.close()
        assert (await _get(port)).endswith(b"flooded")
        assert server.refused == 3
        assert [e.kind for e in sink.events] == ["connection.refused"]
        assert sink.events[0].detail["count"] == 1 and "4 connections are open" in sink.events[0].summary
        for _reader, w in held[1:] + refused:
            w.close()
        await server.close()
        await neighbour.close()
        counted = sink.events[1:]
        assert [(e.kind, e.detail["count"], e.run, e.cell) for e in counted] == [
            ("connection.refused", 2, "r-1", "c-1")
        ], "the later refusals were not counted into the record"

    asyncio.run(main())


def test_a_connection_with_no_request_is_closed_after_the_idle_timeout() -> None:
    async def main() -> None:
        server = AppServer(_app("x"), listening(), idle_timeout=0.2)
        await server.start()
        port = server.address[1]
        silent_reader, silent = await asyncio.open_connection("127.0.0.1", port)
        # Half a request line, then nothing (a slow loris).
        slow_reader, slow = await asyncio.open_connection("127.0.0.1", port)
        slow.write(b"GET / HT")
        assert await _closed_by_server(silent_reader)
        assert await _closed_by_server(slow_reader)
        assert (await _get(port)).endswith(b"x"), "the listener stopped serving"
        silent.close()
        slow.close()
        await server.close()

    asyncio.run(main())


def test_no_connection_is_taken_while_descriptors_are_low(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        sink = Sink()
        server = AppServer(_app("x"), listening(), record=sink.record)
        await server.start()
        port = server.address[1]
        monkeypatch.setattr(_fds, "low", lambda fd: True)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await _closed_by_server(reader)
        writer.close()
        monkeypatch.setattr(_fds, "low", lambda fd: False)
        assert (await _get(port)).endswith(b"x")
        await server.close()
        assert "within 256 descriptors of its limit" in sink.events[0].detail["reason"]

    asyncio.run(main())


def test_the_reserve_is_measured_from_the_soft_limit() -> None:
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert not _fds.low(3)
    assert _fds.low(soft - _fds.RESERVE) and not _fds.low(soft - _fds.RESERVE - 1)
