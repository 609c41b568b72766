"""`stockade exec -- CMD` from the shell, as a user pays it, against the peers.

Run as root from the repository, after `bash benchmarks/install_peers.sh`
(which puts the peers in a scratch directory outside the repository,
$STOCKADE_PEERS, default /var/tmp/stockade-peers):

    .venv/bin/python benchmarks/cli_exec.py [--rounds N] [--command true|python|both] [--baseline SRC]

Each round runs every contender once, in a rotating order, so that the shared
machine's drift touches them alike; printed are medians, 90th percentiles, and
each one's time as a multiple of stockade's (below 1.00: faster than stockade).
A peer that is not installed is named as missing and the rest still run.
Nothing here asserts a time.

- stockade:       .venv/bin/stockade exec -- CMD  (default policy: every layer)
- codex (native): codex sandbox -c sandbox_mode="workspace-write" -- CMD, Codex's native binary
- codex (npm):    the same through the npm shim users run (node stays the parent)
- srt:            srt --settings F -- CMD  (Anthropic's sandbox-runtime)
- bwrap:          bwrap --unshare-all --ro-bind / / CMD  (less isolation; a floor)
- none:           CMD
- stockade (no warm-up): the same exec with cell/_migration.py's thread off
- stockade (baseline): with --baseline SRC, the same `stockade exec` run from
                  another checkout's src/ directory (say `git archive OLD src`
                  with its built cell/_native*.so copied in), side by side
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEERS = Path(os.environ.get("STOCKADE_PEERS", "/var/tmp/stockade-peers"))
COMMANDS = {"true": ["/bin/true"], "python": ["/usr/bin/python3", "-c", "pass"]}

Runs = dict[str, tuple[list[str], dict[str, str]]]


def contenders(workdir: Path, command: list[str], baseline: Path | None = None) -> tuple[Runs, list[str]]:
    """What runs here, and a sentence for each peer that is missing."""
    env = dict(os.environ)
    missing: list[str] = []
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
    found: Runs = {"stockade": ([str(ROOT / ".venv" / "bin" / "stockade"), "exec", "--", *command], env)}
    # The same exec without the cgroup-move warm-up (cell/_migration.py),
    # from the same interpreter: what that thread saves.
    cold = (
        "import sys; import stockade.cell._migration as m; m.keep_warm = lambda *a, **k: None; "
        "from stockade.cli.main import main; sys.argv[0] = 'stockade'; main()"
    )
    found["stockade (no warm-up)"] = (
        [str(ROOT / ".venv" / "bin" / "python"), "-c", cold, "exec", "--", *command],
        env,
    )
    if baseline is not None:
        found["stockade (baseline)"] = (
            [*found["stockade"][0]],
            {**env, "PYTHONPATH": str(baseline)},
        )
    sandbox = ["sandbox", "-c", 'sandbox_mode="workspace-write"', "--", *command]
    native = PEERS / "bin" / "codex-native"
    if native.exists():
        found["codex (native)"] = ([str(native), *sandbox], codex_env)
    else:
        missing.append(f"codex (native): no {native}")
    if (bins / "codex").exists():
        found["codex (npm)"] = ([str(bins / "codex"), *sandbox], codex_env)
    else:
        missing.append(f"codex (npm): no {bins / 'codex'}")
    if (bins / "srt").exists():
        found["srt"] = ([str(bins / "srt"), "--settings", str(settings), "--", *command], env)
    else:
        missing.append(f"srt: no {bins / 'srt'}")
    if shutil.which("bwrap"):
        found["bwrap"] = (["bwrap", "--unshare-all", "--ro-bind", "/", "/", *command], env)
    else:
        missing.append("bwrap: not on PATH (apt-get install bubblewrap)")
    found["none"] = (command, env)
    return found, missing


def measure(label: str, command: list[str], rounds: int, workdir: Path, baseline: Path | None = None) -> None:
    runs, missing = contenders(workdir, command, baseline)
    for name, (argv, env) in list(runs.items()):  # warm-up, and a check that each works here
        done = subprocess.run(argv, env=env, cwd=workdir, capture_output=True, check=False)
        if done.returncode != 0:
            del runs[name]
            missing.append(f"{name}: failed here ({done.stderr.decode(errors='replace').strip()[:200]})")
    if "stockade" not in runs:
        raise SystemExit(f"stockade exec fails here: {missing[-1]}")
    times: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for i in range(rounds):
        order = names[i % len(names) :] + names[: i % len(names)]
        for name in order:
            argv, env = runs[name]
            start = time.perf_counter()
            subprocess.run(argv, env=env, cwd=workdir, check=True, capture_output=True)
            times[name].append((time.perf_counter() - start) * 1000)
    base = statistics.median(times["stockade"])
    print(f"\n{label} from the shell ({rounds} interleaved rounds, milliseconds)")
    print(f"  {'':20} {'median':>8} {'p90':>8} {'x stockade':>11}")
    for name, values in times.items():
        med = statistics.median(values)
        p90 = statistics.quantiles(values, n=10)[-1]
        print(f"  {name:20} {med:8.1f} {p90:8.1f} {med / base:10.2f}x")
    for line in missing:
        print(f"  MISSING {line}; run `bash benchmarks/install_peers.sh`")
    if "codex (native)" in times:
        ratio = base / statistics.median(times["codex (native)"])
        verdict = "met" if ratio < 1.0 else "NOT met"
        print(f"  stockade / codex (native): {ratio:.2f}  (target < 1.0: {verdict})")
    if "stockade (baseline)" in times:
        ratio = base / statistics.median(times["stockade (baseline)"])
        print(f"  stockade / stockade (baseline): {ratio:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--command", choices=("true", "python", "both"), default="both")
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        metavar="SRC",
        help="another checkout's src/ directory, run as 'stockade (baseline)' beside this one",
    )
    args = parser.parse_args()
    if args.baseline is not None and not (args.baseline / "stockade" / "cli" / "main.py").is_file():
        sys.exit(
            f"--baseline {args.baseline}: no stockade/cli/main.py there; name a checkout's src/ directory"
        )
    if os.geteuid() != 0:
        sys.exit("run as root: stockade exec reads the kernel audit log")
    # What an installed stockade has (scripts/setup.sh byte-compiles it): a
    # source file edited since would otherwise be compiled at every start.
    compileall.compile_dir(str(ROOT / "src" / "stockade"), quiet=2)
    if args.baseline is not None:
        compileall.compile_dir(str(args.baseline / "stockade"), quiet=2)
    workdir = PEERS / "work"
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {os.getloadavg()[0]:.1f}")
    for key in ("true", "python") if args.command == "both" else (args.command,):
        measure(" ".join(COMMANDS[key]), COMMANDS[key], args.rounds, workdir, args.baseline)


if __name__ == "__main__":
    main()
