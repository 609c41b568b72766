"""Preflight: the workbench holds nothing of the future and no copy of the answers.

Before the agent starts, in every git repository of the workbench only the
ancestry of ``HEAD`` may remain. Removed, and each recorded as a finding:
other branches, remote-tracking refs, tags that are not ancestors of ``HEAD``
(a tag after the base names a future commit), stashes, notes and any other
ref, reflogs, ``ORIG_HEAD``/``FETCH_HEAD``-like files, remotes, alternates
(their objects are copied in first), and unreachable objects (``git gc
--prune=now``). Then the repository is checked again: anything left is a
``failed`` finding, and the trial is invalid rather than run on a leaky
workbench. Git runs **inside a cell of the workbench** (``Workbench.exec``),
never on the host: a task's repository is not the operator's to run hooks or
filters of.

Any file of the workbench with the content of a file of the task's ``tests/``
or ``solution/`` (SHA-256, files of 32 bytes or more, so that an empty
``__init__.py`` is no finding) is removed and recorded too. A task's image
is searched as well; it cannot be changed, so a copy in it is ``failed``.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

MIN_COPY = 32
"""Bytes: smaller files are too common to be a copy of a test."""

_SCRIPT = r"""
set -u
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null GIT_TERMINAL_PROMPT=0
g() { git -c core.hooksPath=/dev/null -c core.fsmonitor= -c gc.auto=0 -c safe.directory='*' "$@"; }
for repo in "$@"; do
  cd "$repo" || { echo "failed	$repo	cannot enter"; continue; }
  gitdir=$(g rev-parse --absolute-git-dir 2>/dev/null) ||
    { echo "failed	$repo	not a repository"; continue; }
  head=$(g rev-parse -q --verify HEAD 2>/dev/null || true)
  current=$(g symbolic-ref -q HEAD 2>/dev/null || true)
  if [ -s "$gitdir/objects/info/alternates" ]; then
    echo "alternates	$repo	$(tr '\n' ' ' < "$gitdir/objects/info/alternates")"
    g repack -a -d -q && rm -f "$gitdir/objects/info/alternates"
  fi
  g for-each-ref --format='%(refname) %(objectname)' | while read -r ref obj; do
    [ "$ref" = "$current" ] && continue
    case "$ref" in
      refs/tags/*)
        target=$(g rev-parse -q --verify "$ref^{commit}" 2>/dev/null || true)
        if [ -n "$head" ] && [ -n "$target" ] &&
           g merge-base --is-ancestor "$target" "$head" 2>/dev/null; then
          continue
        fi
        echo "tag	$repo	$ref" ;;
      refs/heads/*) echo "branch	$repo	$ref" ;;
      refs/remotes/*) echo "remote-ref	$repo	$ref" ;;
      refs/stash) echo "stash	$repo	$ref" ;;
      *) echo "ref	$repo	$ref" ;;
    esac
    g update-ref -d "$ref"
  done
  for f in ORIG_HEAD FETCH_HEAD MERGE_HEAD CHERRY_PICK_HEAD REVERT_HEAD; do
    [ -e "$gitdir/$f" ] && { echo "head-file	$repo	$f"; rm -f "$gitdir/$f"; }
  done
  if [ -d "$gitdir/logs" ]; then
    n=$(find "$gitdir/logs" -type f | wc -l)
    [ "$n" -gt 0 ] && echo "reflog	$repo	$n files"
    g reflog expire --expire=now --expire-unreachable=now --all >/dev/null 2>&1
    rm -rf "$gitdir/logs"
  fi
  unreachable=$(g fsck --unreachable --no-reflogs --no-progress 2>/dev/null | grep -c '^unreachable' || true)
  [ "$unreachable" -gt 0 ] && echo "unreachable	$repo	$unreachable objects"
  g gc --prune=now --quiet >/dev/null 2>&1 || g prune --expire=now
  # Checked again: anything left means the workbench would leak.
  left=$(g for-each-ref --format='%(refname)' | grep -v -x -F "${current:-none}" | while read -r ref; do
    case "$ref" in refs/tags/*) ;; *) echo "$ref" ;; esac; done)
  [ -n "$left" ] && echo "failed	$repo	refs left: $left"
  [ -n "$(g remote)" ] && echo "failed	$repo	remotes left"
  [ -s "$gitdir/objects/info/alternates" ] && echo "failed	$repo	alternates left"
  again=$(g fsck --unreachable --no-reflogs --no-progress 2>/dev/null | grep -c '^unreachable' || true)
  [ "$again" -gt 0 ] && echo "failed	$repo	$again unreachable objects left"
  echo "checked	$repo	${head:-no HEAD}"
done
"""


class Workbench(Protocol):
    """Where commands of a trial run: a cell of the workbench (``_workbench``)."""

    root: Path

    def exec(
        self, argv: list[str], *, cwd: str | None = None, timeout: float = 120.0
    ) -> tuple[int, str, str]:
        """(exit code, stdout, stderr) of ``argv`` run in the workbench."""
        ...


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str
    """``branch``, ``tag``, ``remote``, ``remote-ref``, ``stash``, ``ref``, ``reflog``,
    ``head-file``, ``alternates``, ``unreachable``, ``copy`` (of tests/ or solution/),
    ``checked`` (a repository that was looked at), ``failed`` (left after cleaning)."""
    where: str
    detail: str

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "where": self.where, "detail": self.detail}


def find_repos(root: Path, skip: Iterable[Path] = ()) -> list[Path]:
    """Every git repository (a ``.git`` directory or gitlink file) under ``root``."""
    skipped = {p.resolve() for p in skip}
    repos = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if here.resolve() in skipped:
            dirnames[:] = []
            continue
        if ".git" in dirnames or ".git" in filenames:
            repos.append(here)
        dirnames[:] = [d for d in dirnames if d != ".git"]
    return sorted(repos)


def _digests(dirs: Iterable[Path]) -> dict[str, str]:
    found: dict[str, str] = {}
    for top in dirs:
        if not top.is_dir():
            continue
        for dirpath, _dirs, files in os.walk(top):
            for name in files:
                path = Path(dirpath) / name
                if path.stat().st_size >= MIN_COPY:
                    found[hashlib.sha256(path.read_bytes()).hexdigest()] = str(path.relative_to(top.parent))
    return found


def find_copies(
    root: Path, answers: Iterable[Path], skip: Iterable[Path] = (), *, remove: bool = True
) -> list[Finding]:
    """Files under ``root`` with the content of a file of ``answers`` (tests/, solution/).

    Removed (``remove``), or, where they cannot be (an image's read-only
    rootfs), each a ``failed`` finding. Only files of an answer's size are read."""
    answers = tuple(answers)
    wanted = _digests(answers)
    sizes = _sizes(answers)
    skipped = {p.resolve() for p in skip}
    findings = []
    for dirpath, dirnames, files in os.walk(root):
        if Path(dirpath).resolve() in skipped:
            dirnames[:] = []
            continue
        for name in files:
            path = Path(dirpath) / name
            try:
                if path.is_symlink() or path.stat().st_size not in sizes:
                    continue
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
            except OSError:
                continue
            if digest in wanted:
                what = f"the content of the task's {wanted[digest]}"
                if remove:
                    findings.append(Finding("copy", str(path), what))
                    path.unlink()
                else:
                    findings.append(Finding("failed", str(path), f"{what}, in the image: rebuild it without"))
    return findings


def _sizes(dirs: Iterable[Path]) -> set[int]:
    found = set()
    for top in dirs:
        for dirpath, _dirs, files in os.walk(top):
            for name in files:
                size = (Path(dirpath) / name).stat().st_size
                if size >= MIN_COPY:
                    found.add(size)
    return found


def _git_dir(repo: Path) -> Path | None:
    dotgit = repo / ".git"
    if dotgit.is_dir() and not dotgit.is_symlink():
        return dotgit
    if dotgit.is_file() and not dotgit.is_symlink():
        # A gitlink ("gitdir: PATH"): followed only when it stays in the workbench.
        text = dotgit.read_text(encoding="utf-8", errors="replace").strip()
        if text.startswith("gitdir:"):
            target = (repo / text.split(":", 1)[1].strip()).resolve()
            return target if target.is_dir() else None
    return None


def remove_remotes(repo: Path, root: Path) -> list[Finding]:
    """The repository's remotes, removed from its config on the host.

    A cell may not write ``.git/config`` (it is protected: it names programs
    that git runs), so this one edit is the proctor's: ``git config --file``
    reads and writes that one file and runs nothing it names.
    """
    gitdir = _git_dir(repo)
    if gitdir is None or not gitdir.resolve().is_relative_to(root.resolve()):
        return []
    config = gitdir / "config"
    if not config.is_file() or config.is_symlink():
        return []
    env = {"PATH": "/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "HOME": "/"}
    listed = subprocess.run(
        ["git", "config", "--file", str(config), "--name-only", "--get-regexp", r"^remote\."],
        capture_output=True, text=True, env=env, check=False, timeout=30,
    )  # fmt: skip
    names = sorted({line.split(".", 1)[1].rsplit(".", 1)[0] for line in listed.stdout.split() if "." in line})
    findings = []
    for name in names:
        subprocess.run(
            ["git", "config", "--file", str(config), "--remove-section", f"remote.{name}"],
            capture_output=True, env=env, check=False, timeout=30,
        )  # fmt: skip
        findings.append(Finding("remote", str(repo), name))
    return findings


def preflight(
    bench: Workbench, answers: Iterable[Path], skip: Iterable[Path] = (), *, image_root: Path | None = None
) -> list[Finding]:
    """Clean the workbench's repositories and remove copies of the answers; every finding.

    With ``image_root`` (the task's image), the image is searched for copies
    too; it cannot be changed, so a copy there is a ``failed`` finding."""
    skip = tuple(skip)
    answers = tuple(answers)
    findings = find_copies(bench.root, answers, skip)
    if image_root is not None:
        findings.extend(find_copies(image_root, answers, remove=False))
    repos = find_repos(bench.root, skip)
    for repo in repos:
        findings.extend(remove_remotes(repo, bench.root))
    if repos:
        code, out, err = bench.exec(["/bin/sh", "-c", _SCRIPT, "preflight", *map(str, repos)], timeout=300)
        for line in out.splitlines():
            parts = line.split("\t", 2)
            if len(parts) == 3:
                findings.append(Finding(*parts))
        if code != 0:
            findings.append(
                Finding("failed", str(bench.root), f"the preflight exited {code}: {err.strip()[:500]}")
            )
    return findings


def failed(findings: Iterable[Finding]) -> list[Finding]:
    return [f for f in findings if f.kind == "failed"]


def summary(findings: Iterable[Finding]) -> dict[str, Any]:
    findings = list(findings)
    counts: dict[str, int] = {}
    for f in findings:
        if f.kind != "checked":
            counts[f.kind] = counts.get(f.kind, 0) + 1
    return {
        "repositories": sum(1 for f in findings if f.kind == "checked"),
        "removed": counts,
        "clean": not failed(findings),
        "findings": [f.to_dict() for f in findings],
    }


__all__ = ["Finding", "Workbench", "failed", "find_copies", "find_repos", "preflight", "summary"]
