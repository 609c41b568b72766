"""Start-to-first-command of a workbench (an image as /), side by side with
bwrap over the same unpacked rootfs.

Run as root from the repository:
    .venv/bin/python benchmarks/workbench_launch.py [--rounds N] [--image REF]

Without --image the test image of tests/cell/_image.py is used (the host's
own shell, coreutils and Python, hard-linked: built in about a second); with
--image REF, an image of the store (``stockade image ls``).

Every round runs each contender once, interleaved, from this one warm Python
process. Printed: the median and 90th percentile of each, and the ratio of
the workbench to bwrap (the target is at most 1.5x). Nothing here asserts.

- bwrap:     bwrap --unshare-all --ro-bind ROOTFS / (+ /proc, /dev, a /tmp
             tmpfs) CMD: the image as a read-only root, no writable layer
- workbench: Cell(policy, image=IMAGE).run(CMD): the overlay (idmapped image
             + a fresh upper, made and removed each run), the id range, the
             workspace bind, decoys, Landlock, seccomp, cgroups, the connect
             supervisor and the audit reader collecting refusals
- host view: Cell(policy).run(CMD), the cell without an image, for reference
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stockade.cell import Cell
from stockade.policy import default_policy

COMMANDS = {
    "/bin/true": ["/bin/true"],
    "python3 -c pass": ["/usr/bin/python3", "-c", "pass"],
}


def bwrap_argv(rootfs: str, command: list[str]) -> list[str]:
    return [
        "bwrap",
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--ro-bind",
        rootfs,
        "/",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "--chdir",
        "/",
        *command,
    ]


def _image(ref: str | None) -> object:
    if ref is not None:
        from stockade.image import default_store

        return default_store().get(ref)
    from tests.cell._image import make_image

    return make_image()


def measure(rounds: int, ref: str | None) -> None:
    image = _image(ref)
    rootfs = str(getattr(image, "rootfs"))  # noqa: B009 - an Image of the store or the tests
    policy = default_policy()
    with Cell(policy, image=image) as workbench, Cell(policy) as host:
        for label, command in COMMANDS.items():
            contenders = {
                "bwrap": lambda c=command: subprocess.run(bwrap_argv(rootfs, c), check=True),
                "workbench": lambda c=command: _check(workbench.run(c).exit_code),
                "host view": lambda c=command: _check(host.run(c).exit_code),
            }
            for run in contenders.values():  # warm-up: page cache, the audit reader, plans
                run()
            times: dict[str, list[float]] = {name: [] for name in contenders}
            names = list(contenders)
            for i in range(rounds):
                order = names[i % len(names) :] + names[: i % len(names)]
                for name in order:
                    start = time.perf_counter()
                    contenders[name]()
                    times[name].append((time.perf_counter() - start) * 1000)
            report(label, times, rounds)


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
    print(f"  workbench / bwrap (median): {med['workbench'] / med['bwrap']:.2f}x  (target <= 1.5x)")
    print(f"  workbench / host view (median): {med['workbench'] / med['host view']:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--image", default=None, help="an image of the store (default: the test image)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: a workbench maps an id range and the cell reads the kernel audit log")
    measure(args.rounds, args.image)


if __name__ == "__main__":
    main()
