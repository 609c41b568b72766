"""The preflight's copy search, on its own (the git part runs end to end in
test_protocol.py's adv-git-future)."""

from __future__ import annotations

from pathlib import Path

from stockade.bench._preflight import find_copies, find_repos


def test_copies_of_the_answers_are_removed_and_recorded(tmp_path: Path) -> None:
    tests = tmp_path / "task" / "tests"
    tests.mkdir(parents=True)
    (tests / "test_outputs.py").write_text("assert answer() == 42  # the hidden test\n")
    (tests / "__init__.py").write_text("")
    root = tmp_path / "root"
    (root / "app" / "deep").mkdir(parents=True)
    (root / "app" / "deep" / "cached.py").write_text("assert answer() == 42  # the hidden test\n")
    (root / "app" / "__init__.py").write_text("")  # empty: too common to be a copy
    (root / "app" / "main.py").write_text("def answer() -> int:\n    raise NotImplementedError\n")
    findings = find_copies(root, [tests])
    assert [(f.kind, Path(f.where).name) for f in findings] == [("copy", "cached.py")]
    assert "tests/test_outputs.py" in findings[0].detail
    assert not (root / "app" / "deep" / "cached.py").exists()
    assert (root / "app" / "main.py").exists() and (root / "app" / "__init__.py").exists()


def test_repositories_are_found_nested_and_by_gitlink(tmp_path: Path) -> None:
    (tmp_path / "a" / ".git").mkdir(parents=True)
    (tmp_path / "a" / "vendor" / "b").mkdir(parents=True)
    (tmp_path / "a" / "vendor" / "b" / ".git").write_text("gitdir: ../../.git/modules/b\n")
    (tmp_path / "decoy" / ".git").mkdir(parents=True)
    found = find_repos(tmp_path, skip=[tmp_path / "decoy"])
    assert found == [tmp_path / "a", tmp_path / "a" / "vendor" / "b"]


def test_a_copy_in_an_image_cannot_be_removed_and_fails(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_outputs.py").write_text("assert answer() == 42  # the hidden test\n")
    rootfs = tmp_path / "rootfs" / "opt"
    rootfs.mkdir(parents=True)
    (rootfs / "leak.py").write_text("assert answer() == 42  # the hidden test\n")
    findings = find_copies(tmp_path / "rootfs", [tests], remove=False)
    assert [f.kind for f in findings] == ["failed"] and "in the image" in findings[0].detail
    assert (rootfs / "leak.py").exists()
