"""Launch-to-exit time of a fully enforced cell, side by side with bwrap and no sandbox.

Run as root from the repository:  .venv/bin/python benchmarks/cell_launch.py [--rounds N]

Every round runs each contender once, in an interleaved order, from this one
warm Python process, so that the machine's drift (it is shared and noisy)
touches all of them alike. Printed: the median and 90th percentile of each, the
ratio of stockade to bwrap (the target is at most 1.5x) and stockade's absolute
overhead over no sandbox; then the CPU time of each launch (user + system, of
this process and of the children it reaped, ``getrusage``), which a loaded
machine distorts much less than wall time: what a launch costs, not what it
waited for. bwrap's figure lacks its sandbox's own processes: they are not
reaped through the process this script waits for, so the kernel never adds
their time to it (python3 in bwrap comes out below python3 with no sandbox);
no CPU ratio to bwrap is printed for that reason.
Nothing here asserts a time.

- none:     subprocess.run(CMD) — fork/exec from Python, no sandbox
- bwrap:    subprocess.run(bwrap --unshare-all <a view like stockade's> CMD)
- stockade: Cell(default_policy()).run(CMD) — namespaces, the filesystem view
            with decoys, Landlock (files, TCP, scopes), seccomp, cgroups,
            dropped capabilities, and the kernel audit reader collecting refusals
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

from stockade.cell import Cell
from stockade.policy import default_policy

COMMANDS = {
    "/bin/true": ["/bin/true"],
    "python3 -c pass": ["/usr/bin/python3", "-c", "pass"],
}


def bwrap_argv(workspace: str, command: list[str]) -> list[str]:
    argv = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session"]
    for path in ("/usr", "/etc"):
        argv += ["--ro-bind", path, path]
    for link, target in (
        ("/bin", "usr/bin"),
        ("/sbin", "usr/sbin"),
        ("/lib", "usr/lib"),
        ("/lib64", "usr/lib64"),
    ):
        if os.path.islink(link):
            argv += ["--symlink", target, link]
    argv += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "--bind",
        workspace,
        workspace,
        "--chdir",
        workspace,
    ]
    return argv + command


def measure(rounds: int) -> None:
    policy = default_policy()
    with Cell(policy) as cell:
        workspace = cell.workspace
        for label, command in COMMANDS.items():
            contenders = {
                "none": lambda c=command: subprocess.run(c, check=True),
                "bwrap": lambda c=command: subprocess.run(bwrap_argv(workspace, c), check=True),
                "stockade": lambda c=command: _check(cell.run(c).exit_code),
            }
            for run in contenders.values():  # warm-up: caches, page cache, the audit reader
                run()
            times: dict[str, list[float]] = {name: [] for name in contenders}
            cpu: dict[str, list[float]] = {name: [] for name in contenders}
            names = list(contenders)
            for i in range(rounds):
                order = names[i % len(names) :] + names[: i % len(names)]
                for name in order:
                    used = _cpu()
                    start = time.perf_counter()
                    contenders[name]()
                    times[name].append((time.perf_counter() - start) * 1000)
                    cpu[name].append((_cpu() - used) * 1000)
            report(label, times, rounds)
            med = {name: statistics.median(values) for name, values in cpu.items()}
            print("  CPU per launch (median): " + ", ".join(f"{name} {med[name]:.2f} ms" for name in cpu))
            print(f"  stockade's CPU over no sandbox (median): {med['stockade'] - med['none']:.2f} ms")


def _cpu() -> float:
    """Seconds of CPU this process and its reaped children have used (every thread)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _check(code: int) -> None:
    if code != 0:
        raise SystemExit(f"the contained command failed with exit code {code}")


def report(label: str, times: dict[str, list[float]], rounds: int) -> None:
    med = {name: statistics.median(values) for name, values in times.items()}
    p90 = {name: statistics.quantiles(values, n=10)[-1] for name, values in times.items()}
    print(f"\n{label}  ({rounds} interleaved rounds, milliseconds)")
    print(f"  {'':10} {'median':>8} {'p90':>8}")
    for name in times:
        print(f"  {name:10} {med[name]:8.2f} {p90[name]:8.2f}")
    print(f"  stockade / bwrap (median): {med['stockade'] / med['bwrap']:.2f}x  (target <= 1.5x)")
    print(f"  stockade overhead over no sandbox: {med['stockade'] - med['none']:.2f} ms")
    print(f"  bwrap overhead over no sandbox:    {med['bwrap'] - med['none']:.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the cell reads the kernel audit log")
    measure(args.rounds)


if __name__ == "__main__":
    main()
