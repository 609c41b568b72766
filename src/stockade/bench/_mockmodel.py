"""The scripted model of a campaign: each task's own script, served offline.

``stockade bench run --mock`` (and the tests) serve one ``MockLlm`` on the
loopback whose script routes each conversation to the script of its task
(``[stockade.expect].solver``), told apart by the task's instruction, which
the tool loop sends as its first user message. A conversation of no known
task gets a plain answer and no tool call, so its agent stops.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Sequence

from stockade.bench._task import Task
from stockade.llm import load_script
from stockade.llm._scripts import Reply, Said, Script


def routing_script(tasks: Sequence[Task]) -> Script:
    """One script that plays each task's own (tasks without a solver get none)."""
    scripts: list[tuple[str, Script]] = [
        (task.instruction.strip(), load_script(task.solver_script)) for task in tasks if task.solver_script
    ]

    def route(conversation: Sequence[Said]) -> Reply:
        first = next((said.text for said in conversation if said.role == "user"), "")
        for instruction, script in scripts:
            if first.strip() == instruction:
                return script(conversation)
        return Reply(content="mock-llm: no script for this task.")

    return route


class MockModel:
    """A ``MockLlm`` on 127.0.0.1 (a free port), on a loop of its own; ``url`` is its /v1."""

    def __init__(self, script: Script) -> None:
        from stockade.llm._mock import MockLlm
        from stockade.llm._serve import AppServer

        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="bench-mock-llm", daemon=True)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        sock.setblocking(False)
        self.mock = MockLlm(script)
        self.server = AppServer(self.mock.app(), sock)

    def start(self) -> MockModel:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(30)
        return self

    @property
    def url(self) -> str:
        host, port = self.server.address
        return f"http://{host}:{port}/v1"

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.close(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    def __enter__(self) -> MockModel:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["MockModel", "routing_script"]
