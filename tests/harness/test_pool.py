"""Sessions started ahead of their samples (harness/_pool.py): each sample
takes a fresh one, never another sample's; refusals in it are recorded as in
a session of its own; what no sample took is ended and recorded; a daemon's
runs all end by task_cleanup."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any

import pytest
from inspect_ai.util._sandbox.registry import registry_find_sandboxenv

from stockade.daemon import _paths
from stockade.daemon._client import Client
from stockade.daemon._server import DaemonThread
from stockade.harness import _inspect, _pool
from stockade.harness._pool import Spare, SparePool
from stockade.harness._record import SampleRecord
from stockade.policy import default_policy
from stockade.record import open_store


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _sample(sandbox_type: Any, config: Any, task: str, marker: str) -> tuple[Any, str]:
    """One sample: looks for the last sample's marker, leaves its own, tries a
    secret; its environment (cleaned up) and what it found."""
    envs = await sandbox_type.sample_init(task, config, {})
    env = envs["default"]
    try:
        found = await env.exec(["sh", "-c", "cat marker.txt 2>/dev/null; ls /tmp"])
        await env.write_file("marker.txt", marker)
        await env.exec(["sh", "-c", f"echo {marker} > /tmp/{marker}"])
        refused = await env.exec(["cat", "/etc/shadow"])
        assert refused.returncode != 0
    finally:
        await sandbox_type.sample_cleanup(task, config, envs, False)
    return env, found.stdout


def _start(record: SampleRecord) -> dict[str, Any]:
    (start,) = [e for e in record.events() if e.kind == "harness.sample.start"]
    return dict(start.detail)


async def _three_samples(sandbox_type: Any, config: Any, task: str) -> list[Any]:
    await sandbox_type.task_init("startup", config)  # as Inspect calls it, once per config
    envs = []
    try:
        for n in range(3):
            env, found = await _sample(sandbox_type, config, task, f"m{n}")
            # A fresh workbench: nothing of the sample before it.
            assert "m" not in found, found
            envs.append(env)
    finally:
        await sandbox_type.task_cleanup("shutdown", config, True)
    return envs


def _check_samples(envs: list[Any], task: str) -> None:
    assert [_start(env.record)["ahead"] for env in envs] == [True, True, True]
    # Started before any sample named its task (Inspect's task_init has none), named by its sample.
    assert [env.report["task"] for env in envs] == [task] * 3
    assert [_start(env.record)["task"] for env in envs] == [task] * 3
    runs = [env.record.run_id for env in envs]
    cells = [tuple(env.report["cells"]) for env in envs]
    assert len(set(runs)) == 3 and len(set(cells)) == 3  # never one sample's session for another
    for env in envs:
        report = env.report
        # The kernel's refusal of the secret, in the session that was started ahead.
        assert any("/etc/shadow" in a["summary"] for a in report["attempts"]), report["attempts"]
        kinds = {e.kind for e in env.record.events()}
        assert {"cell.start", "session.open", "session.exec", "cell.end", "harness.sample.end"} <= kinds
        # Its session began before its sample, and the record says when.
        start = next(e for e in env.record.events() if e.kind == "harness.sample.start")
        assert _start(env.record)["session_started"] <= start.time


@pytest.mark.anyio
async def test_in_process_samples_take_fresh_spares_and_the_unused_one_is_recorded(tmp_path: Path) -> None:
    sandbox_type: Any = registry_find_sandboxenv("stockade")
    state = tmp_path / "state"
    config = sandbox_type.config_deserialize({"state": str(state)})
    envs = await _three_samples(sandbox_type, config, "spares")
    _check_samples(envs, "spares")
    assert [env.report["record"]["via"] for env in envs] == ["process"] * 3
    assert not _inspect._POOLS
    # The spares the last samples' ends started, which no sample took: ended
    # at task_cleanup, each one's record in the store as a sample's would be.
    with open_store(_paths.store_path(str(state)), readonly=True) as store:
        unused = [s for s in store.query() if s.event.kind == "harness.sample.unused"]
        assert len(unused) == 1  # one at a time, back to back: the pool stays at one
        for stored in unused:
            assert "the task ended" in stored.event.summary
            assert stored.event.run not in {env.record.run_id for env in envs}
            kinds = {s.event.kind for s in store.query(run=stored.event.run)}
            assert {"cell.start", "session.open", "cell.end"} <= kinds
        assert store.verify().ok


@pytest.mark.anyio
async def test_through_a_daemon_every_spare_run_has_ended_after_task_cleanup(tmp_path: Path) -> None:
    sandbox_type: Any = registry_find_sandboxenv("stockade")
    state = tmp_path / "state"
    config = sandbox_type.config_deserialize({"state": str(state)})
    dt = DaemonThread(state=str(state), socket_path=_paths.socket_path(state=str(state)))
    dt.start()
    try:
        envs = await _three_samples(sandbox_type, config, "hosted-spares")
        _check_samples(envs, "hosted-spares")
        assert [env.report["record"]["via"] for env in envs] == ["daemon"] * 3
        with Client(dt.socket_path, timeout=60) as client:
            runs = client.call("run.list", all=True)["runs"]
            names = {r["id"]: r["name"] for r in runs}
            # `stockade ps`: the spare task_init started has no task to be named after yet.
            assert [names[env.record.run_id] for env in envs] == [
                "inspect/spare",
                "inspect/hosted-spares",
                "inspect/hosted-spares",
            ]
            assert [r for r in runs if r["state"] == "running"] == []
            assert client.sessions() == []
            unused = [r["id"] for r in runs if r["id"] not in {env.record.run_id for env in envs}]
            # The spare no sample took: one at a time, the pool stays at one.
            assert len(runs) == 4 and len(unused) == 1
            for run in unused:
                page = client.call("events.export", run=run, format="jsonl")
                assert '"session.open"' in page["data"] and '"harness' not in page["data"]
                assert '"run.end"' in page["data"]
    finally:
        dt.stop()


class _Host:
    via = "fake"

    def __init__(self, n: int) -> None:
        self.record = SampleRecord(f"r-{n:012d}", harness="inspect", task="t")
        self.closed = self.finished = False

    def open(self, policy: Any, *, upper: str | None = None) -> Any:
        raise AssertionError("not used")

    def close(self, workbench: Any) -> None:
        self.closed = True

    def finish(self, *, later: Any = None) -> dict[str, Any]:
        self.finished = True
        return {}


def _fake_pool(most: int = 3) -> tuple[SparePool, list[Spare], threading.Event]:
    made: list[Spare] = []
    gate = threading.Event()
    gate.set()

    def start(task: str) -> Spare:
        gate.wait(30)
        spare = Spare(_Host(len(made)), object(), "/", default_policy("inspect"), _pool.time.monotonic(), 0.0)  # type: ignore[arg-type]
        made.append(spare)
        return spare

    return SparePool(start, most=most, task="t"), made, gate


def test_a_spare_of_another_policy_or_too_old_is_ended_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    pool, made, _gate = _fake_pool()
    pool.fill()
    policy = default_policy("inspect")
    other = dataclasses.replace(policy, name="another")
    assert pool.take(other) is None  # the one there is of another policy
    taken = pool.take(policy)
    assert taken is not None and taken is not made[0]
    pool.fill()
    monkeypatch.setattr(_pool, "SPARE_MAX_AGE", -1.0)
    assert pool.take(policy) is None  # every one there waited past its age
    pool.close()
    ended = [s for s in made if s.host.closed]  # type: ignore[attr-defined]
    assert made[0] in ended and taken not in ended and len(ended) == len(made) - 1
    for spare in ended:
        (event,) = [e for e in spare.host.record.events() if e.kind == "harness.sample.unused"]
        assert "ended unused" in event.summary


def test_the_pool_grows_only_when_a_sample_found_no_spare() -> None:
    pool, made, _gate = _fake_pool(most=2)
    policy = default_policy("inspect")
    pool.fill()
    first = pool.take(policy)  # none ready yet: it waits for the one being started
    assert first is made[0] and pool.stats()["wanted"] == 1  # which asks for no more
    second = pool.take(policy)  # the one the first take started behind it
    assert second is made[1] and pool.stats()["wanted"] == 1
    assert pool.wait_ready(30)  # and the one the second take started
    empty, behind, _ = _fake_pool(most=2)  # a pool no task_init filled
    assert empty.take(policy) is None  # none ready, none starting: the sample starts its own
    assert empty.stats()["wanted"] == 2  # and asks for one more
    empty.close()
    assert len(behind) == 2 and all(s.host.closed for s in behind)  # type: ignore[attr-defined]
    pool.close()  # ends the one no sample took
    assert pool.take(policy) is None and pool.stats()["ready"] == 0
    unused = [s for s in made if s not in (first, second)]
    assert len(unused) == 1 and unused[0].host.closed and unused[0].host.finished  # type: ignore[attr-defined]
    assert not first.host.closed and not second.host.closed  # type: ignore[attr-defined]


def test_a_spare_that_cannot_start_stops_the_filling() -> None:
    tries: list[str] = []

    def start(task: str) -> Spare:
        tries.append(task)
        raise OSError("no such image")

    pool = SparePool(start, most=4, task="t")
    pool.fill()
    assert pool.take(default_policy("inspect")) is None  # the sample starts its own, and says why
    pool.fill()
    pool.fill(task="t2")
    assert isinstance(pool.failure, OSError) and tries == ["t"]  # tried once, not again and again
    pool.close()


@pytest.mark.anyio
async def test_samples_at_once_each_take_a_session_of_their_own(tmp_path: Path) -> None:
    import anyio

    sandbox_type: Any = registry_find_sandboxenv("stockade")
    config = sandbox_type.config_deserialize({"state": str(tmp_path / "state")})
    await sandbox_type.task_init("startup", config)
    got: dict[int, tuple[Any, str]] = {}
    try:

        async def one(n: int) -> None:
            got[n] = await _sample(sandbox_type, config, "together", f"m{n}")

        async with anyio.create_task_group() as group:
            for n in range(3):
                group.start_soon(one, n)
    finally:
        await sandbox_type.task_cleanup("shutdown", config, True)
    envs = [got[n][0] for n in range(3)]
    assert all("m" not in found for _, found in got.values())
    assert len({env.record.run_id for env in envs}) == 3
    assert len({tuple(env.report["cells"]) for env in envs}) == 3
    # The first took the spare task_init started; the others one started
    # behind a take, or their own when they found none at all.
    assert True in [env.report["session"]["started_ahead"] for env in envs]


@pytest.mark.anyio
async def test_a_spare_whose_daemon_restarted_is_not_used(tmp_path: Path) -> None:
    import anyio.to_thread

    sandbox_type: Any = registry_find_sandboxenv("stockade")
    state = tmp_path / "state"
    config = sandbox_type.config_deserialize({"state": str(state)})
    socket_path = _paths.socket_path(state=str(state))
    first = DaemonThread(state=str(state), socket_path=socket_path)
    first.start()
    try:
        await sandbox_type.task_init("startup", config)
        (pool,) = _inspect._POOLS.values()
        assert await anyio.to_thread.run_sync(lambda: pool.wait_ready(60))
    finally:
        first.stop()  # its sessions end with it: the spare's too
    second = DaemonThread(state=str(state), socket_path=socket_path)
    second.start()
    try:
        env, _ = await _sample(sandbox_type, config, "restarted", "m0")
        # Not the dead spare: a session of its own, in the daemon that runs now.
        assert env.report["session"]["started_ahead"] is False
        assert env.report["record"]["via"] == "daemon"
        assert any("/etc/shadow" in a["summary"] for a in env.report["attempts"])
        with Client(second.socket_path, timeout=60) as client:
            (run,) = [r for r in client.call("run.list", all=True)["runs"] if r["id"] == env.record.run_id]
            assert run["name"] == "inspect/restarted"
    finally:
        await sandbox_type.task_cleanup("shutdown", config, True)
        second.stop()
