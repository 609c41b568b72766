"""The bench pages' data: proctored campaigns' ``results.json`` and their trials' bundles.

A campaign is a directory ``stockade bench run --out DIR`` wrote: its
``results.json`` (every trial's score and the campaign's summary) and one
bundle per trial (``score.json``, ``containment.json``, ``trial.json``,
``log.json``…, sealed by ``manifest.json``; docs/BENCH.md). The dashboard
only reads them: each trial's bundle is re-checked with the bench's own
``verify_bundle`` when its page is opened, and a file is served only when the
manifest lists it (nothing else under the directory is reachable).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stockade.bench._bundle import MANIFEST, verify_bundle

RESULTS = "results.json"
FILE_MAX = 64 * 1024 * 1024
"""Bytes of one bundle file the page serves at most."""


class Campaigns:
    """The campaign directories an operator named (``stockade dashboard --bench DIR``)."""

    def __init__(self, dirs: list[Path] | None = None) -> None:
        self.dirs: list[Path] = []
        for d in dirs or []:
            self.add(d)

    def add(self, directory: str | Path) -> None:
        path = Path(directory).resolve()
        if path not in self.dirs:
            self.dirs.append(path)

    def listing(self) -> list[dict[str, Any]]:
        out = []
        for index, root in enumerate(self.dirs):
            results = _json(root / RESULTS)
            if results is None:
                out.append({"index": index, "dir": str(root), "error": f"no readable {RESULTS} in {root}"})
                continue
            trials = []
            for trial in results.get("trials") or []:
                if not isinstance(trial, dict):
                    continue
                bundle = self._bundle(root, trial.get("bundle"))
                trials.append(
                    {
                        key: trial.get(key)
                        for key in (
                            "task",
                            "attempt",
                            "status",
                            "outcome",
                            "reward",
                            "attempted",
                            "blocked",
                            "grade",
                        )
                    }
                    | {
                        "expected_met": (trial.get("expected") or {}).get("met"),
                        "bundle": bundle.name if bundle is not None else None,
                    }
                )
            out.append(
                {
                    "index": index,
                    "dir": str(root),
                    "agent": results.get("agent"),
                    "model": results.get("model"),
                    "stockade_version": results.get("stockade_version"),
                    "summary": results.get("summary") or {},
                    "trials": trials,
                }
            )
        return out

    def trial(self, index: int, name: str) -> dict[str, Any] | None:
        bundle = self._named(index, name)
        if bundle is None:
            return None
        manifest = _json(bundle / MANIFEST) or {}
        trial = _json(bundle / "trial.json") or {}
        return {
            "campaign": index,
            "bundle": bundle.name,
            "dir": str(bundle),
            "score": _json(bundle / "score.json"),
            "containment": _json(bundle / "containment.json"),
            "trial": trial,
            "runs": trial.get("runs") if isinstance(trial.get("runs"), dict) else {},
            "files": sorted((manifest.get("files") or {}).keys()),
            "problems": verify_bundle(bundle),
        }

    def file(self, index: int, name: str, file: str) -> bytes | None:
        """A file the bundle's manifest lists (no other path is reachable), or None."""
        bundle = self._named(index, name)
        if bundle is None:
            return None
        listed = (_json(bundle / MANIFEST) or {}).get("files") or {}
        if file not in listed and file != MANIFEST:
            return None
        path = (bundle / file).resolve()
        if bundle not in path.parents or not path.is_file() or path.stat().st_size > FILE_MAX:
            return None
        return path.read_bytes()

    def _named(self, index: int, name: str) -> Path | None:
        if not 0 <= index < len(self.dirs) or "/" in name or name in ("", ".", ".."):
            return None
        bundle = (self.dirs[index] / name).resolve()
        return bundle if bundle.parent == self.dirs[index] and (bundle / MANIFEST).is_file() else None

    @staticmethod
    def _bundle(root: Path, given: object) -> Path | None:
        if not isinstance(given, str) or not given:
            return None
        bundle = root / Path(given).name
        return bundle if (bundle / MANIFEST).is_file() else None


def _json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


__all__ = ["Campaigns"]
