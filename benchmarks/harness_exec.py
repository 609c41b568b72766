"""Inspect's ``stockade`` sandbox beside its built-in ``local`` one, through
the same SandboxEnvironment API a task's tools use.

Run as root from the repository:  .venv/bin/python benchmarks/harness_exec.py [--rounds N]
Against an older stockade: ``git archive REV src | tar -x -C OLD``, copy the
built ``*.so`` beside (src/stockade/cell/_native*, broker/_fastread*), then
``PYTHONPATH=OLD/src .venv/bin/python benchmarks/harness_exec.py``.

Two figures, each the median and 90th percentile over interleaved rounds from
this one warm process (local first, then stockade, every round):

- per call: ``exec`` of a command in a live sample's sandbox (``/bin/true``,
  ``sh -c 'echo hi'``), then ``write_file`` and ``read_file`` of 4 KiB;
- per sample: what a whole sample costs its harness around its agent:
  ``sample_init``, 5 execs, a file written and read, ``sample_cleanup``
  (for stockade: the session's cell started and ended, its persistence
  walk, the record appended to the store under a temporary state directory,
  the containment report complete in the sample's environment). Three ways:
  "alone", a sample with no ``task_init`` before it (it starts its own
  session); "first", ``task_init`` and the task's first sample, timed
  together (the first spare session is started by ``task_init``, and the
  sample waits for it); "steady", the task's next samples, back to back with
  no agent time between them (each takes the spare started behind the one
  before, while it runs: the worst case for the spares, which an eval's model
  time would otherwise hide); "warm", the same with the machine left to
  finish that background work between samples (as an agent's model time
  would), not timed; "paced", back to back again, each sample waiting
  ``THINK`` seconds after its start (its model's first answer, not timed),
  as an Inspect eval runs them: the next sample starts as soon as one ends,
  and a sample's own time is mostly its model's.

Three sandboxes: ``local`` contains nothing (a subprocess in a temporary
directory); ``stockade`` with no daemon (the sample's session in this
process); ``stockade@daemon``, the same with a daemon running for its state
directory (``stockade daemon``, a process of its own as deployed, so the
sample is a run of it and each call a round trip of its control socket). The aim is stockade
within 2x of ``local`` per call. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

from inspect_ai.util._sandbox.registry import registry_find_sandboxenv

from stockade.harness._hosted import daemon_socket


def _type(kind: str) -> Any:
    return registry_find_sandboxenv(kind.split("@", 1)[0])


async def _sample(kind: str, config: Any, task: str = "bench") -> dict[str, Any]:
    return dict(await _type(kind).sample_init(task, config, {}))


async def _cleanup(kind: str, config: Any, envs: dict[str, Any], task: str = "bench") -> None:
    await _type(kind).sample_cleanup(task, config, envs, False)
    env = envs["default"]
    if kind != "local":
        # The report is complete when sample_cleanup returns: the session's
        # cell is gone and its events (its start and end among them) are in it.
        report = env.report
        assert report is not None and report["events"] > 0, report
        kinds = {e.kind for e in env.record.events()}
        assert {"harness.sample.start", "harness.sample.end", "cell.start", "cell.end"} <= kinds, kinds
        assert report["record"].get("first_seq") is not None or report["record"].get("events_file"), report


async def _settled(task: str) -> None:
    """Until the task's spares are ready and every sample's hand-on has run:
    what an eval's model time between samples gives the machine."""
    from stockade.harness import _inspect

    # getattr: an older stockade (PYTHONPATH=OLD/src, to compare) has neither.
    later = getattr(_inspect, "_LATER", None)
    while True:
        pools = [pool.stats() for pool in getattr(_inspect, "_POOLS", {}).values()]
        if all(p["starting"] == 0 for p in pools) and (later is None or later.wait(0)):
            return
        await asyncio.sleep(0.01)


THINK = 0.2
"""Seconds of model time a "paced" sample waits after its start, as an agent
waits for its model's first answer before its first call (real ones: 0.5-5 s)."""


def _stats(samples: list[float]) -> str:
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
    return f"median {statistics.median(ordered) * 1e3:7.2f} ms   p90 {p90 * 1e3:7.2f} ms"


async def _timed(fn: Callable[[], Awaitable[object]]) -> float:
    start = time.perf_counter()
    await fn()
    return time.perf_counter() - start


async def main(rounds: int) -> None:
    state = tempfile.mkdtemp(prefix="stockade-bench-state-")
    hosted = tempfile.mkdtemp(prefix="stockade-bench-daemon-")
    stockade_bin = os.path.join(os.path.dirname(sys.executable), "stockade")
    daemon = subprocess.Popen([stockade_bin, "daemon", "--state", hosted], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while daemon_socket(hosted) is None:
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"stockade daemon --state {hosted} did not come up")
            time.sleep(0.1)
        await _measure(rounds, state, hosted)
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)


async def _measure(rounds: int, state: str, hosted: str) -> None:
    stockade = registry_find_sandboxenv("stockade")
    configs: dict[str, Any] = {
        "local": None,
        "stockade": stockade.config_deserialize({"state": state}),
        "stockade@daemon": stockade.config_deserialize({"state": hosted}),
    }
    live = {kind: await _sample(kind, cfg) for kind, cfg in configs.items()}
    assert [envs["default"].host.via for kind, envs in live.items() if kind != "local"] == [
        "process",
        "daemon",
    ]
    calls: dict[tuple[str, str], list[float]] = {}
    payload = b"x" * 4096
    for _ in range(rounds):
        for kind, envs in live.items():
            env = envs["default"]
            for name, argv in (("/bin/true", ["/bin/true"]), ("sh -c 'echo hi'", ["sh", "-c", "echo hi"])):
                calls.setdefault((name, kind), []).append(
                    await _timed(lambda argv=argv, env=env: env.exec(argv))
                )

            async def write(env: Any = env) -> None:
                await env.write_file("bench.bin", payload)

            async def read(env: Any = env) -> None:
                assert await env.read_file("bench.bin", text=False) == payload

            calls.setdefault(("write_file 4 KiB", kind), []).append(await _timed(write))
            calls.setdefault(("read_file 4 KiB", kind), []).append(await _timed(read))
    for kind, envs in live.items():
        await _cleanup(kind, configs[kind], envs)

    whole: dict[tuple[str, str], list[float]] = {}
    ahead: dict[str, int] = {}
    block = 6
    for round_ in range(max(3, rounds // 20)):
        for kind, cfg in configs.items():
            kind_type = _type(kind)

            async def one_sample(
                kind: str = kind, cfg: Any = cfg, task: str = "bench", think: float = 0
            ) -> None:
                envs = await _sample(kind, cfg, task)
                env = envs["default"]
                if think:
                    await asyncio.sleep(think)
                for _ in range(5):
                    await env.exec(["sh", "-c", "echo hi"])
                await env.write_file("answer.txt", "42\n")
                await env.read_file("answer.txt")
                await _cleanup(kind, cfg, envs, task)
                if kind != "local":
                    start = next(e for e in env.record.events() if e.kind == "harness.sample.start")
                    ahead[kind] = ahead.get(kind, 0) + bool(start.detail.get("ahead"))
                    ahead["of"] = ahead.get("of", 0) + (kind == "stockade")

            await _settled("bench")
            whole.setdefault(("alone", kind), []).append(await _timed(one_sample))
            task = f"bench-{round_}"
            await _settled("bench")
            begun = time.perf_counter()
            await kind_type.task_init("startup", cfg)  # as Inspect calls them, once per config
            await one_sample(task=task)
            whole.setdefault(("first", kind), []).append(time.perf_counter() - begun)
            for _ in range(block - 1):
                whole.setdefault(("steady", kind), []).append(await _timed(lambda t=task: one_sample(task=t)))
            for _ in range(block - 1):
                await _settled(task)
                whole.setdefault(("warm", kind), []).append(await _timed(lambda t=task: one_sample(task=t)))
            for _ in range(block - 1):
                # The model's first turn, between the sample's start and its
                # first call: not the harness's, so not counted.
                begun = time.perf_counter()
                await one_sample(task=task, think=THINK)
                whole.setdefault(("paced", kind), []).append(time.perf_counter() - begun - THINK)
            await kind_type.task_cleanup("shutdown", cfg, True)

    print(f"per call ({rounds} rounds)")
    for (name, kind), samples in calls.items():
        print(f"  {name:18s} {kind:15s} {_stats(samples)}")
    for name in dict.fromkeys(n for n, _ in calls):
        for kind in ("stockade", "stockade@daemon"):
            ratio = statistics.median(calls[(name, kind)]) / statistics.median(calls[(name, "local")])
            print(f"  {name:18s} {kind}/local {ratio:5.2f}x")
    print(
        "per sample (init, 5 execs, a file written and read, cleanup; "
        f"alone and first: {len(whole[('alone', 'local')])} each, steady: {len(whole[('steady', 'local')])})"
    )
    for (way, kind), samples in whole.items():
        print(f"  {way:6s} {kind:15s} {_stats(samples)}")
    for way in ("alone", "first", "steady", "warm", "paced"):
        for kind in ("stockade", "stockade@daemon"):
            ratio = statistics.median(whole[(way, kind)]) / statistics.median(whole[(way, "local")])
            print(f"  {way:6s} {kind}/local {ratio:5.2f}x")
    print(f"  samples that took a session started ahead: {ahead}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=100)
    asyncio.run(main(parser.parse_args().rounds))
