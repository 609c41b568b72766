"""What proctoring costs per trial, and how many trials an hour this host runs.

The floor: the same oracle and the same tests in the same workbench (the host
view of the sample task, fix-bug), without a proctor: the project copied in,
``solution/solve.sh`` run in a cell over it, the tests copied in, ``test.sh``
run in a second cell, the reward read. The contender: ``stockade bench``'s
trial of the same task with ``--agent oracle``: decoys, preflight, two runs
under the daemon (unattended, recorded), the record exported, containment,
score and a sealed manifest. Then a campaign of ``--trials`` trials at each
``--concurrency``, in trials per hour.

    sudo .venv/bin/python benchmarks/bench_overhead.py [--repeat 10] [--trials 24]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from stockade.bench import ProctorConfig, Trial, load_task
from stockade.bench._campaign import Campaign
from stockade.bench._proctor import read_reward
from stockade.bench._workbench import HostWorkbench
from stockade.cell import Cell
from stockade.daemon._server import DaemonThread
from stockade.policy import loads_policy

TASK = Path(__file__).resolve().parent.parent / "src" / "stockade" / "bench" / "tasks" / "fix-bug"


def floor_trial(base: Path) -> float:
    """One unproctored oracle trial; its seconds."""
    task = load_task(TASK)
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(dir=base))
    os.chmod(work, 0o755)
    bench = HostWorkbench(task, work / "root")
    bench.root.mkdir()
    shutil.copytree(task.project_dir, bench.workdir)
    shutil.copytree(task.solution_dir, work / "solution")
    policy = json.dumps(
        {
            "name": "floor",
            "workspace": str(bench.root),
            "workdir": str(bench.workdir),
            "filesystem": {"base": "system", "read": [str(work / "solution")]},
        }
    )
    Cell(loads_policy(policy)).run(["/bin/bash", str(work / "solution" / "solve.sh")])
    logs = bench.install_tests()
    verifier = json.dumps(
        {
            "name": "floor-v",
            "workspace": str(bench.root),
            "workdir": str(bench.workdir),
            "filesystem": {"base": "system"},
            "env": {"set": {"STOCKADE_BENCH_ROOT": str(bench.root)}},
        }
    )
    Cell(loads_policy(verifier)).run(["/bin/bash", str(bench.root / "tests" / "test.sh")])
    reward, _, why = read_reward(logs)
    assert reward == 1.0, why
    elapsed = time.perf_counter() - started
    shutil.rmtree(work)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--concurrency", type=int, nargs="*", default=[1, 4, 8])
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    os.chmod(base, 0o755)
    task = load_task(TASK)
    daemon = DaemonThread(state=str(base / "state"), socket_path=str(base / "d.sock")).start()
    try:
        floor_trial(base)  # warm: imports, page cache
        floors = [floor_trial(base) for _ in range(args.repeat)]
        config = ProctorConfig(socket_path=daemon.socket_path, out=base / "runs")
        proctored, parts = [], []
        for attempt in range(1, args.repeat + 1):
            started = time.perf_counter()
            summary = Trial(task, attempt, config).run()
            proctored.append(time.perf_counter() - started)
            assert summary["reward"] == 1.0, summary
            parts.append(summary["timings"])
        floor, contender = statistics.median(floors), statistics.median(proctored)
        print(f"unproctored oracle trial (floor): median {floor * 1000:.0f} ms over {args.repeat}")
        print(f"proctored oracle trial:           median {contender * 1000:.0f} ms over {args.repeat}")
        print(f"proctoring's own cost:            {(contender - floor) * 1000:.0f} ms a trial")
        for key in ("prepare", "agent", "grading"):
            print(f"  {key:8} median {statistics.median(p[key] for p in parts) * 1000:.0f} ms")
        # What no phase's clock holds: containment, score, log, manifest, the workbench's removal.
        rest = [total - sum(p.values()) for total, p in zip(proctored, parts, strict=True)]
        print(f"  bundle   median {statistics.median(rest) * 1000:.0f} ms (and the workbench's removal)")
        for k in args.concurrency:
            out = base / f"campaign-{k}"
            config = ProctorConfig(socket_path=daemon.socket_path, out=out)
            started = time.perf_counter()
            results = Campaign([task], config, attempts=args.trials, concurrency=k).run()
            elapsed = time.perf_counter() - started
            assert results["summary"]["passed"] == args.trials, results["summary"]
            rate = args.trials * 3600 / elapsed
            print(f"--concurrency {k}: {args.trials} trials in {elapsed:.1f} s = {rate:.0f} trials/hour")
    finally:
        daemon.stop()


if __name__ == "__main__":
    main()
