"""Image import and build times (docs/PERFORMANCE.md, "Images").

Import: a real rootfs (the python:3.11-slim base of the test store, ~10k
files) packed as one uncompressed layer into a ``docker save`` tarball, then
``import_image`` of it (verify the digest, unpack with openat2 checks on every
path, commit) against the floor, GNU ``tar -x --same-owner`` of the same layer
into a directory.

Build: one Dockerfile (apt-get install, pip install, COPY) in three states:
``cold`` (a fresh store: mmdebstrap base and every step), ``steps`` (the base
cached, every step run again: --no-cache) and ``warm`` (every step cached).

Run as root: ``.venv/bin/python benchmarks/image_build.py [--cold]``. The
fetches go to the registries through the gateway (the build policy's
allow list); nothing else leaves the machine.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from stockade.image import ImageStore, import_image
from stockade.image._build import build_image

TEST_STORE = Path(os.environ.get("STOCKADE_TEST_IMAGES", "/var/tmp/stockade-test-images"))
DOCKERFILE = """\
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends tini && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir six==1.17.0
COPY hello.py /usr/local/bin/hello.py
"""


def _docker_tar(rootfs: Path, work: Path) -> tuple[Path, Path]:
    layer = work / "layer.tar"
    subprocess.run(
        ["tar", "--numeric-owner", "--xattrs", "-C", str(rootfs), "-cf", str(layer), "."], check=True
    )
    raw = layer.read_bytes()
    diff = "sha256:" + hashlib.sha256(raw).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": [diff]},
        }
    ).encode()
    cname = hashlib.sha256(config).hexdigest() + ".json"
    out = work / "image.tar"
    with tarfile.open(out, "w") as tar:
        for name, data in (
            (
                "manifest.json",
                json.dumps([{"Config": cname, "RepoTags": [], "Layers": ["l/layer.tar"]}]).encode(),
            ),
            (cname, config),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        tar.add(layer, "l/layer.tar")
    return out, layer


def bench_import(rounds: int) -> dict[str, object]:
    base = next((i for i in ImageStore(TEST_STORE).list() if i.provenance.get("kind") == "base"), None)
    if base is None:
        sys.exit(f"no base image in {TEST_STORE}: run tests/image/test_build_real.py once first")
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        work = Path(tmp)
        archive, layer = _docker_tar(base.rootfs, work)
        files = sum(len(f) + len(d) for _, d, f in os.walk(base.rootfs))
        imp, floor = [], []
        for i in range(rounds):
            store = ImageStore(work / f"store{i}")
            t = time.perf_counter()
            import_image(store, archive)
            imp.append(time.perf_counter() - t)
            shutil.rmtree(store.root)
            dest = work / f"tar{i}"
            dest.mkdir()
            t = time.perf_counter()
            subprocess.run(
                ["tar", "--same-owner", "--xattrs", "-xpf", str(layer), "-C", str(dest)], check=True
            )
            floor.append(time.perf_counter() - t)
            shutil.rmtree(dest)
        return {
            "entries": files,
            "layer_mb": round(layer.stat().st_size / 1e6, 1),
            "import_s": round(statistics.median(imp), 2),
            "tar_x_s": round(statistics.median(floor), 2),
            "ratio": round(statistics.median(imp) / statistics.median(floor), 2),
        }


def bench_build(cold: bool) -> dict[str, object]:
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        ctx = Path(tmp) / "ctx"
        ctx.mkdir()
        (ctx / "Dockerfile").write_text(DOCKERFILE)
        (ctx / "hello.py").write_text("print('hello')\n")
        out: dict[str, object] = {}
        if cold:
            fresh = ImageStore(Path(tmp) / "fresh")
            t = time.perf_counter()
            build_image(fresh, ctx)
            out["cold_s"] = round(time.perf_counter() - t, 1)
        store = ImageStore(TEST_STORE)
        t = time.perf_counter()
        image = build_image(store, ctx, name="stockade-bench/build:1", no_cache=True)
        out["steps_s"] = round(time.perf_counter() - t, 1)
        t = time.perf_counter()
        build_image(store, ctx, name="stockade-bench/build:1")
        out["warm_s"] = round(time.perf_counter() - t, 2)
        fetches = image.provenance.get("fetches")
        out["urls"] = len(fetches) if isinstance(fetches, list) else 0
        store.rm("stockade-bench/build:1")
        store.prune()
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--cold", action="store_true", help="also a build on a fresh store (mmdebstrap, ~50 s)"
    )
    args = parser.parse_args()
    print(json.dumps({"import": bench_import(args.rounds), "build": bench_build(args.cold)}, indent=1))


if __name__ == "__main__":
    main()
