"""One workspace check for the three doors: a policy's ``workspace``,
``Cell(workspace=…)`` and ``stockade exec --workspace``. Each refuses the same
directories with the same sentence (the path, why, the fix), written or
reached through a symbolic link; a project directory passes all three."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stockade.cell import Cell
from stockade.errors import PolicyError
from stockade.policy import load_policy
from stockade.policy._workspace import workspace_problem

STOCKADE = str(Path(sys.executable).with_name("stockade"))

REFUSED = [
    ("/", "is a system directory"),
    ("/etc", "is a system directory"),
    ("/etc/ssl", "is a system directory"),
    ("/usr", "is a system directory"),
    ("/usr/local/lib", "is a system directory"),
    ("/boot", "is a system directory"),
    ("/proc/1", "is a system directory"),
    ("/sys", "is a system directory"),
    ("/dev", "is a system directory"),
    ("/run", "is a system directory"),
    ("/var/log", "is a system directory"),
    ("/home", "holds other users' or programs' files"),
    ("/tmp", "holds other users' or programs' files"),
    ("/var", "holds the system directory '/var/run'"),
    ("/var/lib", "holds or is inside stockade's state directory '/var/lib/stockade'"),
    ("/var/lib/stockade", "stockade's state directory"),
    ("/var/lib/stockade/workspaces", "stockade's state directory"),
    ("/var/lib/stockade/runs", "stockade's state directory"),
    ("/home/someone", "is a home directory"),
    ("/etc/../etc", "is a system directory"),
]


def _policy_file(tmp_path: Path, workspace: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(f"name: ws\nworkspace: {workspace}\n")
    return path


def _three_doors(tmp_path: Path, workspace: str, environ: dict[str, str]) -> tuple[str, str, str]:
    """The refusal of each door, as the operator reads it."""
    with pytest.raises(PolicyError) as from_policy:
        load_policy(str(_policy_file(tmp_path, workspace)))
    with pytest.raises(PolicyError) as from_api:
        Cell(workspace=workspace, environ=environ, audit=None)
    done = subprocess.run(
        [STOCKADE, "exec", "-w", workspace, "--", "/bin/true"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **environ},
    )
    assert done.returncode == 3, done.stderr
    return str(from_policy.value), str(from_api.value), done.stderr


@pytest.mark.parametrize(("workspace", "why"), REFUSED)
def test_every_door_refuses_a_system_or_shared_directory(tmp_path: Path, workspace: str, why: str) -> None:
    policy, api, cli = _three_doors(tmp_path, workspace, {})
    fix = "choose the directory of a project, or omit it to get a fresh one"
    for said in (policy, api, cli):
        assert why in said and fix in said, said
    assert f"workspace {os.path.normpath(workspace)!r} {workspace_problem(workspace)}" in api
    assert api in cli  # the CLI says what the API says


def test_a_symbolic_link_to_a_system_directory_is_that_directory(tmp_path: Path) -> None:
    link = tmp_path / "project"
    link.symlink_to("/etc")
    for said in _three_doors(tmp_path, str(link), {}):
        assert "leads through a symbolic link to '/etc', which is a system directory" in said, said


def test_the_operators_home_its_settings_and_what_holds_it_are_refused(tmp_path: Path) -> None:
    home = tmp_path / "home" / "op"
    (home / ".ssh").mkdir(parents=True)
    (home / "project").mkdir()
    environ = {"HOME": str(home)}
    old = os.environ.get("HOME")
    os.environ["HOME"] = str(home)  # the policy loader reads the caller's environment
    try:
        for workspace, why in (
            (home, f"holds the operator's home {str(home)!r}"),
            (home.parent, f"holds the operator's home {str(home)!r}"),
            (home / ".ssh", "the operator's settings and keys"),
            (home / ".local" / "state" / "stockade", "stockade's state directory"),
        ):
            workspace.mkdir(parents=True, exist_ok=True)
            for said in _three_doors(tmp_path, str(workspace), environ):
                assert why in said, said
        # The control: a project inside the home is a workspace at every door.
        assert workspace_problem(str(home / "project"), environ=environ) is None
        project = str(home / "project")
        assert load_policy(str(_policy_file(tmp_path, project))).workspace == project
        with Cell(workspace=home / "project", environ=environ, audit=None) as cell:
            assert cell.workspace == str(home / "project")
    finally:
        if old is None:
            del os.environ["HOME"]
        else:
            os.environ["HOME"] = old


def test_a_project_directory_passes_every_door(tmp_path: Path) -> None:
    """The control: the CLI runs in it, and a fresh workspace handed back (a
    helper sharing its parent's) is accepted too."""
    project = tmp_path / "project"
    project.mkdir()
    assert load_policy(str(_policy_file(tmp_path, str(project)))).workspace == str(project)
    done = subprocess.run(
        [STOCKADE, "exec", "-q", "-w", str(project), "--", "/bin/sh", "-c", "echo ok > made"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert (project / "made").read_text() == "ok\n"
    assert workspace_problem("/var/lib/stockade/workspaces/ws-0123456789ab") is None
    assert workspace_problem("/var/tmp/build") is None


def test_the_daemons_run_start_refuses_the_same_workspaces(tmp_path: Path) -> None:
    """A fourth door, ``run.start``'s ``workspace``: the same sentence, as
    ``bad_params``, and no run; a project directory starts one (the control)."""
    from tests.daemon.test_server import Wire, agent_policy, daemon_at, kind_is

    policy = agent_policy(tmp_path, [])
    link = tmp_path / "to-etc"
    link.symlink_to("/etc")
    with daemon_at(tmp_path) as dt:
        wire, events = Wire(dt.socket_path), Wire(dt.socket_path)
        events.call("events.subscribe")
        for workspace in ("/", "/etc", str(link)):
            reply = wire.request("run.start", {"policy_path": str(policy), "workspace": workspace})
            assert reply["error"]["code"] == "bad_params", reply
            assert reply["error"]["message"] == f"workspace {workspace!r} {workspace_problem(workspace)}"
        assert wire.call("run.list")["runs"] == []
        project = tmp_path / "project"
        project.mkdir()
        info = wire.call("run.start", {"policy_path": str(policy), "workspace": str(project), "detach": True})
        events.until(kind_is("run.end", info["id"]))


def test_a_policy_made_in_python_gets_the_same_check(tmp_path: Path) -> None:
    """A Policy built in code never went through the loader: Cell checks its
    workspace too."""
    import dataclasses

    from stockade.policy import default_policy

    for workspace in ("/", "/etc"):
        policy = dataclasses.replace(default_policy(), workspace=workspace)
        with pytest.raises(PolicyError, match="is a system directory"):
            Cell(policy, environ={}, audit=None)
    fine = dataclasses.replace(default_policy(), workspace=str(tmp_path))
    with Cell(fine, environ={}, audit=None) as cell:
        assert cell.workspace == str(tmp_path)
