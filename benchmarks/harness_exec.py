"""Inspect's ``stockade`` sandbox beside its built-in ``local`` one, through
the same SandboxEnvironment API a task's tools use.

Run as root from the repository:  .venv/bin/python benchmarks/harness_exec.py [--rounds N]

Two figures, each the median and 90th percentile over interleaved rounds from
this one warm process (local first, then stockade, every round):

- per call: ``exec`` of a command in a live sample's sandbox (``/bin/true``,
  ``sh -c 'echo hi'``), then ``write_file`` and ``read_file`` of 4 KiB;
- per sample: what a whole sample costs its harness around its agent:
  ``sample_init``, 5 execs, a file written and read, ``sample_cleanup``
  (for stockade: the session's cell started and ended, its persistence
  walk, the record appended to the store under a temporary state directory).

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


async def _sample(kind: str, config: Any) -> dict[str, Any]:
    return dict(await _type(kind).sample_init("bench", config, {}))


async def _cleanup(kind: str, config: Any, envs: dict[str, Any]) -> None:
    await _type(kind).sample_cleanup("bench", config, envs, False)


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

    whole: dict[str, list[float]] = {}
    for _ in range(max(5, rounds // 10)):
        for kind, cfg in configs.items():

            async def one_sample(kind: str = kind, cfg: Any = cfg) -> None:
                envs = await _sample(kind, cfg)
                env = envs["default"]
                for _ in range(5):
                    await env.exec(["sh", "-c", "echo hi"])
                await env.write_file("answer.txt", "42\n")
                await env.read_file("answer.txt")
                await _cleanup(kind, cfg, envs)

            whole.setdefault(kind, []).append(await _timed(one_sample))

    print(f"per call ({rounds} rounds)")
    for (name, kind), samples in calls.items():
        print(f"  {name:18s} {kind:15s} {_stats(samples)}")
    for name in dict.fromkeys(n for n, _ in calls):
        for kind in ("stockade", "stockade@daemon"):
            ratio = statistics.median(calls[(name, kind)]) / statistics.median(calls[(name, "local")])
            print(f"  {name:18s} {kind}/local {ratio:5.2f}x")
    print(f"per sample ({len(whole['local'])} rounds: init, 5 execs, a file written and read, cleanup)")
    for kind, samples in whole.items():
        print(f"  {kind:15s} {_stats(samples)}")
    for kind in ("stockade", "stockade@daemon"):
        ratio = statistics.median(whole[kind]) / statistics.median(whole["local"])
        print(f"  {kind}/local {ratio:5.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=100)
    asyncio.run(main(parser.parse_args().rounds))
