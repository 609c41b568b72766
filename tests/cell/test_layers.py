"""The host descriptors that Landlock rules name: shared, counted, never reused
while a ruleset needs them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stockade.cell import _layers


def test_rulesets_share_one_descriptor_per_path_and_the_last_closes_it(tmp_path: Path) -> None:
    a, b = _layers.HostDescriptors(), _layers.HostDescriptors()
    first = a.open(str(tmp_path))
    second = b.open(str(tmp_path))
    assert first is not None and second is not None
    assert first == second and first[1] is True
    fd = first[0]
    a.close()
    os.fstat(fd)  # b still uses it: open
    b.close()
    try:
        os.fstat(fd)
    except OSError:
        pass
    else:  # the number may have been reused by now, but not for this path
        assert os.readlink(f"/proc/self/fd/{fd}") != str(tmp_path)


def test_a_replaced_path_gets_a_new_descriptor_and_old_users_keep_theirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "f"
    path.write_text("old")
    old_user = _layers.HostDescriptors()
    opened = old_user.open(str(path))
    assert opened is not None
    old_fd = opened[0]
    path.unlink()
    path.write_text("new")
    monkeypatch.setattr(_layers, "_REVALIDATE_AFTER", 0.0)
    new_user = _layers.HostDescriptors()
    reopened = new_user.open(str(path))
    assert reopened is not None and reopened[0] != old_fd
    assert os.fstat(old_fd).st_nlink == 0  # still the old, deleted file
    assert os.fstat(reopened[0]).st_ino == path.stat().st_ino
    old_user.close()
    new_user.close()


def test_a_missing_path_is_left_to_the_child(tmp_path: Path) -> None:
    held = _layers.HostDescriptors()
    assert held.open(str(tmp_path / "absent")) is None
    held.close()
