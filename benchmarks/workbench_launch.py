"""Workbenches measured side by side: start-to-first-command from an imported
image against bwrap over the same rootfs, ``exec`` in a live session against
a fresh cell per command, and the image's import (and, with --build, a
Dockerfile build).

Run as root from the repository:
    .venv/bin/python benchmarks/workbench_launch.py [--rounds N] [--image REF] [--build]

The image: without --image, the test image of tests/cell/_image.py (the
host's own shell, coreutils and Python, hard-linked) is packed as one layer
into a ``docker save`` tarball and imported with ``import_image`` into a
temporary store, timed against ``tar -x`` of the same layer (the floor);
the workbench below then runs from that imported image. With --image REF,
an image of the default store (``stockade image ls``) is used as it is.

Every round runs each contender once, interleaved, from this one warm
Python process. Printed: the median and 90th percentile of each, and the
ratios the aims of issue 14 name. Nothing here asserts.

Start-to-first-command (aim: workbench <= 1.5x bwrap):
- bwrap:     bwrap --unshare-all --ro-bind ROOTFS / (+ /proc, /dev, a /tmp
             tmpfs) CMD: the image as a read-only root, no writable layer
- workbench: Cell(policy, image=IMAGE).run(CMD): the overlay (idmapped image
             + a fresh upper, made and removed each run), the id range, the
             workspace bind, decoys, Landlock, seccomp, cgroups, the connect
             supervisor and the audit reader collecting refusals
- host view: Cell(policy).run(CMD), the cell without an image, for reference

exec in a live session (aim: under 10 ms a call): Session(policy,
image=IMAGE).exec(CMD) against Cell(policy, image=IMAGE).run(CMD), a fresh
workbench per command, beside subprocess.run of it on the host (the floor,
interleaved with the session's calls; the fresh workbenches in a block of
their own after them: an ended cell's namespaces are torn down by the kernel
in the background, and a call right after one pays for it).

--build: benchmarks/image_build.py's Dockerfile (apt-get, pip, COPY), every
step again (--no-cache: the base cached) and warm (every step cached); the
first time on a machine it also makes the mmdebstrap base (~50 s).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from stockade.cell import Cell, Session
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


def _ms(samples: list[float]) -> tuple[float, float]:
    return statistics.median(samples), statistics.quantiles(samples, n=10)[-1]


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def imported_image(work: Path, rounds: int) -> object:
    """The test image packed as a docker save tarball and imported (timed)."""
    from image_build import _docker_tar  # benchmarks/image_build.py
    from tests.cell._image import make_image

    from stockade.image import ImageStore, import_image

    source = Path(str(make_image().rootfs))
    archive, layer = _docker_tar(source, work)
    entries = sum(len(f) + len(d) for _, d, f in os.walk(source))
    imports: list[float] = []
    floor: list[float] = []
    image: object = None
    for i in range(rounds):
        store = ImageStore(work / f"store{i}")
        imports.append(_timed(lambda store=store: import_image(store, archive, name="bench/workbench:1")))  # type: ignore[misc]
        if i == rounds - 1:
            image = store.get("bench/workbench:1")
        else:
            shutil.rmtree(store.root)
        dest = work / f"tar{i}"
        dest.mkdir()
        argv = ["tar", "--same-owner", "--xattrs", "-xpf", str(layer), "-C", str(dest)]
        floor.append(_timed(lambda argv=argv: subprocess.run(argv, check=True)))  # type: ignore[misc]
        shutil.rmtree(dest)
    imp, tar = statistics.median(imports), statistics.median(floor)
    print(
        f"\nimport of a docker save tarball ({entries} entries, "
        f"one {layer.stat().st_size / 1e6:.1f} MB layer; median of {rounds})"
    )
    print(f"  tar -x of the layer (floor)  {tar:9.1f} ms")
    print(f"  stockade import_image        {imp:9.1f} ms")
    print(f"  import / tar -x: {imp / tar:.2f}x")
    return image


def launch(image: object, rounds: int) -> None:
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
                    times[name].append(_timed(contenders[name]))
            med = {name: _ms(values)[0] for name, values in times.items()}
            print(f"\nstart-to-first-command: {label}  ({rounds} interleaved rounds, milliseconds)")
            print(f"  {'':10} {'median':>8} {'p90':>8}")
            for name, values in times.items():
                print(f"  {name:10} {_ms(values)[0]:8.2f} {_ms(values)[1]:8.2f}")
            print(f"  workbench / bwrap (median): {med['workbench'] / med['bwrap']:.2f}x  (aim <= 1.5x)")
            print(f"  workbench / host view (median): {med['workbench'] / med['host view']:.2f}x")


def session_exec(image: object, rounds: int) -> None:
    policy = default_policy()
    with Session(policy, image=image) as session, Cell(policy, image=image) as fresh:
        for label, command in COMMANDS.items():
            _check(session.exec(command).returncode)  # warm-up
            host: list[float] = []
            calls: list[float] = []
            for _ in range(rounds):  # the floor and the session's calls, interleaved
                host.append(_timed(lambda c=command: subprocess.run(c, check=True)))  # type: ignore[misc]
                calls.append(_timed(lambda c=command: _check(session.exec(c).returncode)))  # type: ignore[misc]
            _check(fresh.run(command).exit_code)
            cells = [_timed(lambda c=command: _check(fresh.run(c).exit_code)) for _ in range(rounds)]  # type: ignore[misc]
            (hm, hp), (sm, sp), (cm, cp) = _ms(host), _ms(calls), _ms(cells)
            print(f"\nexec {label} in a workbench  ({rounds} rounds each, milliseconds)")
            print(f"  {'':28} {'median':>8} {'p90':>8}")
            print(f"  {'subprocess.run (host floor)':28} {hm:8.2f} {hp:8.2f}")
            print(f"  {'Session.exec (live session)':28} {sm:8.2f} {sp:8.2f}   (aim < 10 ms)")
            print(f"  {'Cell.run (fresh workbench)':28} {cm:8.2f} {cp:8.2f}")
            print(f"  a session call's cost over the floor (median): {sm - hm:.2f} ms")
            print(f"  fresh cell / session call (median): {cm / sm:.1f}x")


def build() -> None:
    from image_build import bench_build  # benchmarks/image_build.py

    result = bench_build(cold=False)
    print("\nDockerfile build (benchmarks/image_build.py's; base cached)")
    print(f"  every step again (--no-cache)  {result['steps_s']} s  ({result['urls']} URLs recorded)")
    print(f"  warm (every step cached)       {result['warm_s']} s")


def _check(code: int) -> None:
    if code != 0:
        raise SystemExit(f"the contained command failed with exit code {code}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--import-rounds", type=int, default=3)
    parser.add_argument(
        "--image", default=None, help="an image of the store (default: the test image, imported)"
    )
    parser.add_argument(
        "--build", action="store_true", help="also time a Dockerfile build (network, ~10-60 s)"
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: a workbench maps an id range and the cell reads the kernel audit log")
    if args.rounds < 2 or args.import_rounds < 1:
        sys.exit("--rounds must be at least 2 and --import-rounds at least 1")
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="stockade-bench-") as tmp:
        if args.image is not None:
            from stockade.image import default_store

            image: object = default_store().get(args.image)
        else:
            image = imported_image(Path(tmp), args.import_rounds)
        launch(image, args.rounds)
        session_exec(image, args.rounds)
    if args.build:
        build()


if __name__ == "__main__":
    main()
