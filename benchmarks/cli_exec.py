"""`stockade exec -- /bin/true` from the shell, as a user pays it, against the peers.

Run as root from the repository, after `bash benchmarks/install_peers.sh`:

    .venv/bin/python benchmarks/cli_exec.py [--rounds N]

Each round runs every contender once, in a rotating order, so that the shared
machine's drift touches them alike; printed are medians, 90th percentiles, and
each peer's time as a multiple of stockade's. Nothing here asserts a time.

- stockade:       .venv/bin/stockade exec -- /bin/true  (default policy: every layer)
- codex (npm):    codex sandbox -c sandbox_mode="workspace-write" -- /bin/true, via the npm shim users run
- codex (native): the same through the native binary, without node
- srt:            srt --settings F -- /bin/true  (Anthropic's sandbox-runtime)
- bwrap:          bwrap --unshare-all --ro-bind / / /bin/true  (less isolation; a floor)
- none:           /bin/true
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEERS = ROOT / "benchmarks" / ".peers"


def contenders(workdir: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    env = dict(os.environ)
    codex_home = PEERS / "codex-home"
    codex_home.mkdir(parents=True, exist_ok=True)
    codex_env = {**env, "CODEX_HOME": str(codex_home), "PATH": f"{PEERS / 'bin'}:{env['PATH']}"}
    settings = workdir / "srt-settings.json"
    settings.write_text(
        json.dumps(
            {
                "filesystem": {"allowWrite": [str(workdir)], "denyRead": [], "denyWrite": []},
                "network": {"allowedDomains": [], "deniedDomains": []},
            }
        )
    )
    bins = PEERS / "node_modules" / ".bin"
    found: dict[str, tuple[list[str], dict[str, str]]] = {
        "stockade": ([str(ROOT / ".venv" / "bin" / "stockade"), "exec", "--", "/bin/true"], env),
    }
    if (bins / "codex").exists():
        sandbox = ["sandbox", "-c", 'sandbox_mode="workspace-write"', "--", "/bin/true"]
        found["codex (npm)"] = ([str(bins / "codex"), *sandbox], codex_env)
        found["codex (native)"] = ([str(PEERS / "bin" / "codex-native"), *sandbox], codex_env)
    if (bins / "srt").exists():
        found["srt"] = ([str(bins / "srt"), "--settings", str(settings), "--", "/bin/true"], env)
    found["bwrap"] = (["bwrap", "--unshare-all", "--ro-bind", "/", "/", "/bin/true"], env)
    found["none"] = (["/bin/true"], env)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    workdir = PEERS / "work"
    workdir.mkdir(parents=True, exist_ok=True)
    runs = contenders(workdir)
    if "codex (npm)" not in runs or "srt" not in runs:
        print("peers missing: run `bash benchmarks/install_peers.sh` first", file=sys.stderr)
    for argv, env in runs.values():  # warm-up, and a check that each works here
        subprocess.run(argv, env=env, cwd=workdir, check=True, capture_output=True)
    times: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for i in range(args.rounds):
        order = names[i % len(names) :] + names[: i % len(names)]
        for name in order:
            argv, env = runs[name]
            start = time.perf_counter()
            subprocess.run(argv, env=env, cwd=workdir, check=True, capture_output=True)
            times[name].append((time.perf_counter() - start) * 1000)
    base = statistics.median(times["stockade"])
    print(f"/bin/true from the shell ({args.rounds} interleaved rounds, milliseconds)")
    print(f"  {'':16} {'median':>8} {'p90':>8} {'x stockade':>11}")
    for name, values in times.items():
        med = statistics.median(values)
        p90 = statistics.quantiles(values, n=10)[-1]
        print(f"  {name:16} {med:8.1f} {p90:8.1f} {med / base:10.2f}x")


if __name__ == "__main__":
    main()
