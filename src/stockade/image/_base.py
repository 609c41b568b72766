"""Base images for ``FROM``: a Debian suite made by Debian's ``mmdebstrap``,
cached in the store per suite, variant and package set.

``FROM debian:SUITE`` is that suite; ``python:3.X-slim*`` is Debian's own
``python3`` of the suite that ships 3.X (or the nearest), with pip allowed to
install system-wide as in the python images; anything else (``ubuntu:*``,
``node:*``, …) is mapped to the nearest suite and marked ``approximate`` in
the image's record, with the reason. An image already in the store under the
``FROM`` name is used as it is.

mmdebstrap runs on the host, as root, and fetches through apt directly (the
host's own network, not a cell's). The record lists every URL it fetched:
the archive's index files and each package's ``.deb``, read back from apt's
lists (kept for that, then removed as Debian's container images do).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from stockade.errors import ImageError
from stockade.image._model import Image, ImageConfig
from stockade.image._store import ImageStore

MIRROR = "http://deb.debian.org/debian"
SECURITY = "http://deb.debian.org/debian-security"
SUITES = {"bookworm": "12", "trixie": "13"}
PYTHON_OF = {"bookworm": (3, 11), "trixie": (3, 13)}
"""Debian's python3 in each suite."""
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""The PATH Docker's images set (and a cell's command is looked up in)."""
BASE_TIMEOUT = 1200.0
PYTHON_PACKAGES = ("python3", "python3-pip", "python3-venv", "python-is-python3", "ca-certificates")

Log = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class BaseChoice:
    """What a ``FROM`` reference becomes."""

    ref: str
    suite: str
    variant: str = "minbase"
    packages: tuple[str, ...] = ()
    approximate: bool = False
    reason: str = ""
    pip_anywhere: bool = False
    """Remove Debian's EXTERNALLY-MANAGED marker, so ``pip install`` works
    system-wide as in the python images (PEP 668)."""

    def key(self) -> str:
        blob = json.dumps([self.suite, self.variant, sorted(self.packages), self.pip_anywhere, 1])
        return hashlib.sha256(blob.encode()).hexdigest()


def choose_base(ref: str) -> BaseChoice:
    """The Debian base for the ``FROM`` reference ``ref`` (not in the store).

    Raises:
        ImageError: ``ref`` pins a digest, which no local base can match.
    """
    if "@sha256:" in ref:
        raise ImageError(
            f"FROM {ref} pins a registry digest, and no registry is reachable from here; import "
            "that image (`stockade image import`) under a name and build FROM the name"
        )
    repo, _, tag = ref.rpartition(":") if ":" in ref.rsplit("/", 1)[-1] else (ref, "", "latest")
    repo = repo.removeprefix("docker.io/").removeprefix("library/")
    if repo == "debian":
        return _debian(ref, tag)
    if repo == "python":
        return _python(ref, tag)
    if repo == "ubuntu":
        newer = tag in ("24.04", "noble", "latest", "rolling", "24.10", "25.04", "25.10", "26.04")
        suite = "trixie" if newer else "bookworm"
        return BaseChoice(
            ref,
            suite,
            approximate=True,
            reason=f"Ubuntu {tag} is approximated by Debian {suite}, its nearest Debian release",
        )
    if repo == "node":
        suite = _suffix_suite(tag) or "bookworm"
        return BaseChoice(
            ref,
            suite,
            packages=("nodejs", "npm", "ca-certificates"),
            approximate=True,
            reason=f"node:{tag} is approximated by Debian {suite}'s nodejs and npm",
        )
    suite = _suffix_suite(tag) or "bookworm"
    return BaseChoice(
        ref,
        suite,
        approximate=True,
        reason=f"{ref} is not a Debian image; approximated by Debian {suite} (minbase)",
    )


def _suffix_suite(tag: str) -> str | None:
    for suite in SUITES:
        if suite in tag:
            return suite
    return None


def _debian(ref: str, tag: str) -> BaseChoice:
    base = tag.removesuffix("-slim")
    for suite, number in SUITES.items():
        if base in (suite, number) or base.startswith(number + "."):
            return BaseChoice(ref, suite)
    if base in ("latest", "stable"):
        return BaseChoice(ref, "trixie")
    if base == "oldstable":
        return BaseChoice(ref, "bookworm")
    return BaseChoice(
        ref,
        "trixie",
        approximate=True,
        reason=f"debian:{tag} is not bookworm or trixie; the nearest built here is trixie",
    )


def _python(ref: str, tag: str) -> BaseChoice:
    m = re.match(r"^(\d+)(?:\.(\d+))?", tag)
    want = (int(m.group(1)), int(m.group(2) or 0)) if m else None
    suite = _suffix_suite(tag)
    if suite is None:
        if want is None:
            suite = "trixie"
        else:
            suite = min(PYTHON_OF, key=lambda s: (abs(PYTHON_OF[s][1] - want[1]), -PYTHON_OF[s][1]))
    have = PYTHON_OF[suite]
    reasons = []
    if want is not None and want[:2] != have:
        reasons.append(f"Python {want[0]}.{want[1]} is approximated by Debian {suite}'s {have[0]}.{have[1]}")
    if "slim" not in tag:
        reasons.append(f"the full python:{tag} image's build tools are not in the base (it is -slim)")
    return BaseChoice(
        ref,
        suite,
        packages=PYTHON_PACKAGES,
        approximate=bool(reasons),
        reason="; ".join(reasons),
        pip_anywhere=True,
    )


def base_image(store: ImageStore, choice: BaseChoice, *, log: Log) -> tuple[Image, bool]:
    """The cached base of ``choice``, made now if the store has none; and whether it was cached.

    Raises:
        ImageError: mmdebstrap is missing or failed.
    """
    cached = store.cache_get("base", choice.key())
    if cached is not None:
        return store.get(cached), True
    if shutil.which("mmdebstrap") is None:
        raise ImageError(
            "mmdebstrap is not installed, and a Debian base is made with it; run "
            "`apt-get install -y mmdebstrap` (scripts/setup.sh does)"
        )
    if os.geteuid() != 0:
        # --mode=root: the base's files get their real owners (root, _apt…),
        # which a workbench's idmapped lower layer needs.
        raise ImageError(
            "making a Debian base runs mmdebstrap as root, and this is uid "
            f"{os.geteuid()}; run `stockade image build` as root (sudo)"
        )
    with store.workdir("base") as work:
        rootfs = work / "rootfs"
        mirrors = [
            f"deb {MIRROR} {choice.suite} main",
            f"deb {MIRROR} {choice.suite}-updates main",
            f"deb {SECURITY} {choice.suite}-security main",
        ]
        argv = [
            "mmdebstrap", f"--variant={choice.variant}", "--mode=root", "--format=directory",
            "--skip=cleanup/apt/lists", "--aptopt=Acquire::Languages \"none\"",
        ]  # fmt: skip
        if choice.packages:
            argv.append("--include=" + ",".join(choice.packages))
        if choice.pip_anywhere:
            argv.append('--customize-hook=rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED')
        argv += [choice.suite, str(rootfs), *mirrors]
        listed = "".join(f", {p}" for p in choice.packages)
        log(f"base: mmdebstrap {choice.suite} ({choice.variant}{listed}), ~40 s")
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=BASE_TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            raise ImageError(
                f"mmdebstrap {choice.suite} did not finish in {BASE_TIMEOUT:.0f} s; check that {MIRROR} "
                "is reachable from this host, and try again"
            ) from None
        if done.returncode != 0:
            tail = " / ".join(done.stderr.strip().splitlines()[-3:])
            raise ImageError(
                f"mmdebstrap {choice.suite} failed with exit code {done.returncode} ({tail}); check that "
                f"{MIRROR} is reachable from this host"
            )
        fetches, packages = _fetched(rootfs)
        shutil.rmtree(rootfs / "var/lib/apt/lists", ignore_errors=True)
        (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
        from stockade.image._tree import tree_digest

        layer = tree_digest(rootfs)
        config = ImageConfig(env=(f"PATH={DEFAULT_PATH}",), cmd=("bash",))
        digest = (
            "sha256:"
            + hashlib.sha256(
                json.dumps({"base": layer, "config": config.to_json()}, sort_keys=True).encode()
            ).hexdigest()
        )
        provenance: dict[str, object] = {
            "kind": "base",
            "tool": "mmdebstrap",
            "suite": choice.suite,
            "variant": choice.variant,
            "packages": list(choice.packages),
            "installed": packages,
            "mirrors": mirrors,
            "layer": layer,
            "fetches": fetches,
            "approximate": False,
        }
        image = store.add(digest, rootfs, config, provenance)
    store.cache_put("base", choice.key(), image.digest, suite=choice.suite, packages=list(choice.packages))
    return image, False


def _fetched(rootfs: Path) -> tuple[list[str], list[str]]:
    """The URLs apt fetched for this rootfs (index files, then each installed
    package's .deb), and the installed packages as ``name=version``."""
    lists = rootfs / "var/lib/apt/lists"
    urls: list[str] = []
    pool: dict[tuple[str, str], str] = {}
    for entry in sorted(lists.iterdir()) if lists.is_dir() else []:
        if not entry.is_file() or entry.name == "lock":
            continue
        host_path, sep, rest = entry.name.partition("_dists_")
        if not sep:
            continue
        base = "http://" + host_path.replace("_", "/")
        urls.append(f"{base}/dists/{rest.replace('_', '/')}")
        if entry.name.endswith("_Packages"):
            for stanza in entry.read_text(encoding="utf-8", errors="replace").split("\n\n"):
                fields = _fields(stanza)
                if "Package" in fields and "Filename" in fields:
                    pool[(fields["Package"], fields.get("Version", ""))] = f"{base}/{fields['Filename']}"
    installed: list[str] = []
    status = rootfs / "var/lib/dpkg/status"
    text = status.read_text(encoding="utf-8", errors="replace") if status.is_file() else ""
    for stanza in text.split("\n\n"):
        fields = _fields(stanza)
        if "Package" in fields and "installed" in fields.get("Status", ""):
            installed.append(f"{fields['Package']}={fields.get('Version', '')}")
            url = pool.get((fields["Package"], fields.get("Version", "")))
            if url:
                urls.append(url)
    return urls, installed


def _fields(stanza: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in stanza.splitlines():
        if line and not line[0].isspace():
            key, _, value = line.partition(":")
            out[key] = value.strip()
    return out


__all__ = ["BaseChoice", "base_image", "choose_base"]
