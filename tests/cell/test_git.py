"""Git in a cell, with the real ``git``, on real repositories (file:// only).

Under the default policy every git command an agent needs works, and nothing
stockade puts in the view shows in ``git status`` or a commit; the protected
git paths of every repository in a writable place stay the operator's.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from stockade.cell import Cell, CellResult
from stockade.policy import EnvPolicy, Policy, default_policy

GIT = shutil.which("git") or "/usr/bin/git"
IDENTITY = (
    ("GIT_AUTHOR_NAME", "agent"),
    ("GIT_AUTHOR_EMAIL", "agent@example.invalid"),
    ("GIT_COMMITTER_NAME", "agent"),
    ("GIT_COMMITTER_EMAIL", "agent@example.invalid"),
)


def _policy(**fs: object) -> Policy:
    base = default_policy("git")
    env = EnvPolicy(passthrough=(), set=(*base.env.set, *IDENTITY))
    filesystem = dataclasses.replace(base.filesystem, **fs)  # type: ignore[arg-type]
    return dataclasses.replace(base, env=env, filesystem=filesystem)


def host_git(cwd: Path, *args: str) -> str:
    """git as the operator (no global or system config, so the host's own cannot matter)."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(cwd),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        **dict(IDENTITY),
    }
    done = subprocess.run(
        [GIT, "-c", "protocol.file.allow=always", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"host git {args}: {done.stderr}"
    return done.stdout


def _origin(tmp_path: Path) -> tuple[Path, Path]:
    """A bare repository with two commits and a submodule (another bare repository)."""
    lib_src = tmp_path / "lib-src"
    lib_src.mkdir()
    host_git(lib_src, "init", "-q", "-b", "main")
    (lib_src / "lib.txt").write_text("lib\n")
    host_git(lib_src, "add", "lib.txt")
    host_git(lib_src, "commit", "-qm", "lib")
    lib = tmp_path / "lib.git"
    host_git(tmp_path, "clone", "-q", "--bare", str(lib_src), str(lib))
    src = tmp_path / "src"
    src.mkdir()
    host_git(src, "init", "-q", "-b", "main")
    (src / "a.txt").write_text("one\n")
    host_git(src, "add", "a.txt")
    host_git(src, "commit", "-qm", "one")
    host_git(src, "submodule", "add", "-q", f"file://{lib}", "lib")
    host_git(src, "commit", "-qm", "with lib")
    origin = tmp_path / "origin.git"
    host_git(tmp_path, "clone", "-q", "--bare", str(src), str(origin))
    return origin, lib


def _run(cell: Cell, script: str) -> CellResult:
    result = cell.run(["/bin/sh", "-c", "set -ex\n" + script], timeout=120)
    assert result.exit_code == 0, result.stderr.decode(errors="replace")
    return result


def test_git_works_on_an_existing_repository(tmp_path: Path) -> None:
    origin, _lib = _origin(tmp_path)
    repo = tmp_path / "repo"
    host_git(tmp_path, "clone", "-q", "--recurse-submodules", f"file://{origin}", str(repo))
    with Cell(_policy(), workspace=repo, records=str(tmp_path / "records")) as cell:
        result = _run(
            cell,
            """
            git status
            echo two >> a.txt
            git diff | grep '^+two'
            git add a.txt
            git commit -qm two
            git branch feature
            git checkout -q feature
            echo f > f.txt && git add f.txt && git commit -qm feature
            git checkout -q main
            echo three >> a.txt && git commit -qam three
            git checkout -q feature
            git rebase -q main
            git checkout -q main
            echo wip >> a.txt
            git stash -q
            git stash pop -q
            git checkout -q -- a.txt
            git worktree add -q -b feature-wt wt
            git -C wt log --oneline -1
            git -c protocol.file.allow=always submodule update
            git log --all --oneline | wc -l
            git status --porcelain
            """,
        )
    assert result.stdout.decode().split()[-1] == "?? wt/" or "wt/" in result.stdout.decode()
    # Nothing of stockade's: the operator sees only the agent's own work (the
    # worktree it added inside the repository).
    status = host_git(repo, "status", "--porcelain", "--ignored", "--untracked-files=all")
    assert status.splitlines() == ["?? wt/"], status
    assert {"two", "three", "feature", "with", "one"} <= set(
        host_git(repo, "log", "--all", "--format=%s").split()
    )
    assert host_git(repo, "worktree", "list").count("\n") == 2
    assert (repo / "lib" / "lib.txt").read_text() == "lib\n"


def test_git_works_in_a_fresh_workspace(tmp_path: Path) -> None:
    origin, lib = _origin(tmp_path)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    policy = _policy(read=(*default_policy().filesystem.read, str(origin), str(lib)))
    # git refuses a repository another user owns ("dubious ownership"), and
    # clears safe.directory given by -c or the environment for a local clone:
    # the bare repositories are given to the cell's host uid (nobody here).
    for tree in (origin, lib):
        for path in (tree, *tree.rglob("*")):
            os.chown(path, 65534, 65534, follow_symlinks=False)
    with Cell(policy, workspace=workspace, records=str(tmp_path / "records")) as cell:
        _run(
            cell,
            f"""
            git init -q -b main mine
            cd mine
            echo x > x.txt
            git add -A
            git commit -qm first
            git status --porcelain
            cd ..
            git -c protocol.file.allow=always clone -q --recurse-submodules file://{origin} cloned
            git -C cloned log --all --oneline
            """,
        )
    assert host_git(workspace / "mine", "status", "--porcelain", "--untracked-files=all", "--ignored") == ""
    assert host_git(workspace / "mine", "ls-files").split() == ["x.txt"]
    assert host_git(workspace / "cloned", "status", "--porcelain", "--untracked-files=all", "--ignored") == ""
    assert sorted(os.listdir(workspace)) == ["cloned", "mine"]


def test_git_add_all_commits_nothing_of_stockade_with_base_none(tmp_path: Path) -> None:
    """The issue's ``base: none`` case: the agent's ``git add -A`` commits
    only what it wrote (stockade made empty ``.bashrc``/``.profile`` before)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    host_git(repo, "init", "-q", "-b", "main")
    policy = _policy(protect=(".bashrc", ".profile", ".git/hooks", ".git/config"))
    with Cell(policy, workspace=repo, records=str(tmp_path / "records")) as cell:
        _run(cell, "echo ok > work.txt; git add -A; git commit -qm work; git status --porcelain")
    assert host_git(repo, "ls-files").split() == ["work.txt"]
    assert host_git(repo, "status", "--porcelain", "--ignored") == ""


@pytest.mark.parametrize("layout", ["write-grant", "helper"])
def test_protect_applies_at_the_top_of_every_write_grant(tmp_path: Path, layout: str) -> None:
    """``write: [REPO]`` with another workspace, and a helper's view
    (``workspace: WS/sub``, ``write: [WS]``, which the subset proof accepts
    because it places protect entries at every write grant): the repository's
    hooks and config are read-only there too. Evidence: the host files are
    unchanged and each refusal is a mount-layer event; the control, a file of
    the grant, is written."""
    repo = tmp_path / "repo"
    repo.mkdir()
    host_git(repo, "init", "-q", "-b", "main")
    if layout == "write-grant":
        workspace = tmp_path / "ws"
        workspace.mkdir()
    else:
        workspace = repo / "sub"
        workspace.mkdir()
    config = (repo / ".git" / "config").read_bytes()
    policy = _policy(write=(str(repo),))
    with Cell(policy, workspace=workspace, records=str(tmp_path / "records")) as cell:
        result = cell.run(
            [
                "/bin/sh",
                "-c",
                f"cd {repo}; (echo evil > .git/hooks/pre-commit) 2>/dev/null; echo hook=$?; "
                "(git config core.fsmonitor 'touch /pwned') 2>/dev/null; echo config=$?; "
                "(mv .git .git-old) 2>/dev/null; echo rename=$?; echo ok > notes.txt; echo control=$?",
            ]
        )
    assert result.stdout.decode().split() == ["hook=2", "config=4", "rename=1", "control=0"], result.stderr
    assert not (repo / ".git" / "hooks" / "pre-commit").exists()
    assert (repo / ".git" / "config").read_bytes() == config
    assert (repo / "notes.txt").read_text() == "ok\n"
    refused = {str(e.detail.get("path")) for e in result.denials if e.layer == "mount"}
    assert str(repo / ".git" / "hooks") in refused or str(repo / ".git" / "hooks" / "pre-commit") in refused
    assert str(repo / ".git") in refused, refused


def test_nested_repository_and_gitlink_are_reported_and_reverted(tmp_path: Path) -> None:
    """The agent makes ``sub/`` a repository of its own with ``core.fsmonitor``
    and registers it as a gitlink in the operator's index (``.git/index`` is
    writable: ``git add`` needs it): the operator's plain ``git status`` would
    run the command. It cannot be refused, so it is reported (the nested git
    dir with the key that runs, the gitlink) and ``revert`` undoes it: after
    it, the operator's real ``git status`` runs nothing. The control: the
    agent's ordinary commit stays."""
    from stockade.cell._revert import revert

    repo = tmp_path / "repo"
    repo.mkdir()
    host_git(repo, "init", "-q", "-b", "main")
    pwned = tmp_path / "pwned"
    records = tmp_path / "records"
    with Cell(_policy(), workspace=repo, records=str(records)) as cell:
        result = _run(
            cell,
            f"""
            echo mine > mine.txt && git add mine.txt && git commit -qm mine
            mkdir sub && cd sub && git init -q && echo s > s && git add s && git commit -qm s
            git config core.fsmonitor 'touch {pwned}; false'
            cd .. && git add sub
            """,
        )
    (report,) = [e for e in result.events if e.kind == "cell.persistence"]
    changes = {c["path"]: c for c in report.detail["changes"]}
    assert changes[str(repo / "sub" / ".git")]["change"] == "created"
    assert any(r.startswith("core.fsmonitor=") for r in changes[str(repo / "sub" / ".git")]["runs"])
    assert changes[str(repo / "sub")]["kind"] == "gitlink"
    revert(str(records), result.cell_id)
    host_git(repo, "status")
    assert not pwned.exists(), "the operator's git status ran the agent's fsmonitor"
    assert "mine" in host_git(repo, "log", "--format=%s")


def test_protection_holds_while_a_cell_of_another_process_ends(tmp_path: Path) -> None:
    """Two stockade processes on one workspace: the first's cell ends while
    the second's runs. Nothing is made or removed on the host for protection
    any more, so nothing detaches the second cell's read-only mounts. The
    second cell waits on its stdin until the first process has exited, then
    tries the hook (refused, and on record) and a file beside it (the control)."""
    import sys

    repo = tmp_path / "repo"
    repo.mkdir()
    host_git(repo, "init", "-q", "-b", "main")
    read_end, write_end = os.pipe()
    records = str(tmp_path / "records")
    import threading

    results: list[CellResult] = []
    started = threading.Event()

    def second() -> None:
        with Cell(_policy(), workspace=repo, records=records) as cell:
            started.set()
            results.append(
                cell.run(
                    [
                        "/bin/sh",
                        "-c",
                        "read go; (echo evil > .git/hooks/pre-commit) 2>/dev/null; echo hook=$?; "
                        "echo ok > notes.txt; echo control=$?",
                    ],
                    stdin=read_end,
                    timeout=60,
                )
            )

    thread = threading.Thread(target=second)
    thread.start()
    try:
        assert started.wait(30)
        code = (
            "import sys; from stockade.cell import Cell; from stockade.policy import default_policy\n"
            f"with Cell(default_policy(), workspace={str(repo)!r}, records={records!r}) as c:\n"
            "    sys.exit(c.run(['/bin/true']).exit_code)\n"
        )
        first = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60, check=False)
        assert first.returncode == 0, first.stderr
    finally:
        os.write(write_end, b"go\n")
        os.close(write_end)
        thread.join(60)
        os.close(read_end)
    (result,) = results
    assert result.stdout.decode().split() == ["hook=2", "control=0"], result.stderr
    assert not (repo / ".git" / "hooks" / "pre-commit").exists()
    assert any(e.layer == "mount" and ".git/hooks" in str(e.detail.get("path")) for e in result.denials)


def test_an_exec_workbench_keeps_the_run_workspaces_git_read_only(tmp_path: Path) -> None:
    """Under the daemon an ``exec`` intent runs in a workbench cell whose
    policy is the run's with a fresh workspace (``IntentExecutor.workbench_policy``):
    the run's repository is then a plain write grant, and its hooks and config
    are read-only there as at the top of a workspace. Evidence: the refusals
    (mount-layer events) and the unchanged host files; the control, a file of
    the repository, is written."""
    from stockade.broker._intents import IntentExecutor

    repo = tmp_path / "repo"
    repo.mkdir()
    host_git(repo, "init", "-q", "-b", "main")
    config = (repo / ".git" / "config").read_bytes()
    policy = dataclasses.replace(_policy(write=(str(repo),)), workspace=str(repo))
    results: list[CellResult] = []

    def workbench(argv: list[str], wb: Policy) -> CellResult:
        with Cell(wb, records=str(tmp_path / "records")) as cell:
            results.append(cell.run(argv))
        return results[-1]

    executor = IntentExecutor(policy, workspace=str(repo), run_workbench=workbench)
    script = (
        f"cd {repo}; (echo evil > .git/hooks/pre-commit) 2>/dev/null; echo hook=$?; "
        "(git config core.fsmonitor 'touch /pwned') 2>/dev/null; echo config=$?; echo ok > notes.txt"
    )
    answer = executor.execute("exec", {"argv": ["/bin/sh", "-c", script]})
    assert answer["exit_code"] == 0, answer
    (result,) = results
    assert result.stdout.decode().split() == ["hook=2", "config=4"], result.stderr
    assert not (repo / ".git" / "hooks" / "pre-commit").exists()
    assert (repo / ".git" / "config").read_bytes() == config
    assert (repo / "notes.txt").read_text() == "ok\n"
    assert any(e.layer == "mount" and ".git" in str(e.detail.get("path")) for e in result.denials)
