"""Decoys mirror what another agent would go for, even among many idle entries."""

from __future__ import annotations

import os
from pathlib import Path

from stockade.cell._plan import _DECOY_NAMES_MAX, _mirror


def test_the_most_recent_workspace_is_mirrored_among_hundreds_of_old_ones(tmp_path: Path) -> None:
    for i in range(_DECOY_NAMES_MAX + 50):
        old = tmp_path / f"ws-{i:04d}"
        old.mkdir()
        (old / "notes.md").write_text("old")
        os.utime(old, (1_000_000, 1_000_000))
    fresh = tmp_path / "ws-zzzz"
    fresh.mkdir()
    (fresh / "secret.txt").write_text("s")
    names = _mirror(str(tmp_path))
    assert "ws-zzzz/" in names and "ws-zzzz/secret.txt" in names
    assert len(names) <= _DECOY_NAMES_MAX


def test_a_small_directory_is_mirrored_whole(tmp_path: Path) -> None:
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "id_rsa").write_text("k")
    (tmp_path / ".netrc").write_text("n")
    assert _mirror(str(tmp_path)) == [".netrc", ".ssh/", ".ssh/id_rsa"]
