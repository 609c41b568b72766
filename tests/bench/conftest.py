"""The bench's world, once per module: a daemon, the docs host and the scripted model.

Everything lives in a network namespace the test made (HOST.md's rule): the
test's DNS server, the docs host at a public-looking address on that
namespace's ``lo``, the mock model on its 127.0.0.1, and the daemon, started
from a thread inside it, so that every connection its gateway makes stays
there. Trials run on the host view (no image), several at once.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stockade.bench import ProctorConfig, Task, Trial, load_task
from stockade.bench._mockmodel import MockModel, routing_script
from stockade.daemon._server import DaemonThread
from stockade.gateway import GatewayOptions
from stockade.image import Image, ImageConfig, ImageStore
from tests._netns import TestNetns
from tests.gateway._dns import TestDns
from tests.gateway._servers import HttpServer, Reply

TASKS = Path(__file__).resolve().parents[2] / "src" / "stockade" / "bench" / "tasks"
PROTOCOL = sorted(p.parent.name for p in (TASKS / "protocol").glob("*/task.toml"))
DOCS = "93.184.216.34"
"""docs.example.com, on the namespace's lo (a documentation-range-looking public address)."""


def task(name: str) -> Task:
    return load_task(TASKS / name)


def all_tasks() -> list[Task]:
    return [task("fix-bug"), *(task(f"protocol/{n}") for n in PROTOCOL)]


@dataclass
class World:
    daemon: DaemonThread
    model: MockModel
    web: HttpServer
    state: Path


def store_in_world(
    world: World, rootfs: Path, digest: str, config: ImageConfig, provenance: dict[str, Any], ref: str
) -> Image:
    """``rootfs`` as the image ``digest`` in the world daemon's own store, tagged
    ``ref``: the set-up of every bench test on an image. The store moves what it
    is given and ``rootfs`` is shared (a kept build, the test image), so it gets
    a copy made of hard links."""
    store = ImageStore(world.state / "images")
    store.ensure()
    copy = store.tmp_dir / f"rootfs-{digest[7:19]}"
    if not copy.exists():
        subprocess.run(["cp", "-al", str(rootfs), str(copy)], check=True)
    image = store.add(digest, copy, config, provenance)
    store.tag(ref, image.digest)
    return image


def scripted_trial(world: World, task: Task, out: Path, agent: str) -> dict[str, Any]:
    """One trial of ``task`` by ``agent`` under the world's daemon, against a
    mock model of its own that routes this task's script; its summary."""
    with MockModel(routing_script([task])) as model:
        config = ProctorConfig(
            socket_path=world.daemon.socket_path,
            out=out,
            agent=agent,
            model="mock-llm",
            llm_url=model.url,
        )
        return Trial(task, 1, config).run()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    base = tmp_path_factory.mktemp("bench")
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    with TestNetns([DOCS]) as ns, ns.entered():
        thread.start()
        dns = TestDns({"docs.example.com": [DOCS]})
        web = HttpServer(
            {
                "/api/version": Reply(body=b"v42\n"),
                "/answers/primes.py": Reply(body=b"def is_prime(n): return n in (2, 3, 5, 7)\n"),
            }
        )

        async def start() -> None:
            await dns.start()
            await web.listen(DOCS, 80)

        asyncio.run_coroutine_threadsafe(start(), loop).result(30)
        model = MockModel(routing_script(all_tasks())).start()
        state = base / "state"
        daemon = DaemonThread(
            state=str(state), socket_path=str(base / "d.sock"), gateway=GatewayOptions(dns=dns.spec)
        ).start()
        try:
            yield World(daemon=daemon, model=model, web=web, state=state)
        finally:
            daemon.stop()
            model.close()

            async def stop() -> None:
                await web.close()
                await dns.close()

            asyncio.run_coroutine_threadsafe(stop(), loop).result(30)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()
