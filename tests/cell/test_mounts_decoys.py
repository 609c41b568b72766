"""``filesystem.mounts`` and decoys for paths that exist nowhere, in the
host's view and in a workbench's (an image as ``/``)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from stockade.cell import Cell
from stockade.errors import PolicyError
from stockade.policy import MountRule, Policy, default_policy, loads_policy
from tests.cell._image import make_image

VIEWS = ["host", "image"]


def _policy(*, mounts: tuple[MountRule, ...] = (), deny: tuple[str, ...] = ()) -> Policy:
    fs = default_policy().filesystem
    return dataclasses.replace(
        default_policy(), filesystem=dataclasses.replace(fs, mounts=mounts, deny=(*fs.deny, *deny))
    )


def _cell(policy: Policy, view: str, **kwargs: object) -> Cell:
    return Cell(policy, image=make_image() if view == "image" else None, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("view", VIEWS)
def test_a_host_path_shown_at_another_path(view: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "in.txt").write_text("from the host\n")
    out = tmp_path / "out"
    out.mkdir()
    os.chown(out, 4321, 4321)
    policy = _policy(mounts=(MountRule(str(data), "/mnt/data", "ro"), MountRule(str(out), "/srv/out", "rw")))
    with _cell(policy, view) as cell:
        r = cell.run(
            [
                "/bin/sh",
                "-c",
                "cat /mnt/data/in.txt; echo made > /srv/out/f && echo w-ok; echo x > /mnt/data/in.txt",
            ]
        )
    assert r.stdout == b"from the host\nw-ok\n", r.stderr
    assert b"Read-only file system" in r.stderr
    assert (data / "in.txt").read_text() == "from the host\n"
    assert (out / "f").read_text() == "made\n"
    assert os.stat(out / "f").st_uid == 4321  # idmapped: the source's owner's file
    assert [e for e in r.denials if "/mnt/data/in.txt" in e.summary], r.denials


@pytest.mark.parametrize("view", VIEWS)
def test_a_rw_mount_is_in_the_persistence_report(view: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    policy = _policy(mounts=(MountRule(str(out), "/srv/out", "rw"),))
    with _cell(policy, view) as cell:
        r = cell.run(["/bin/sh", "-c", "echo 'echo owned' > /srv/out/.envrc"])
    assert r.exit_code == 0, r.stderr
    report = next(e for e in r.events if e.kind == "cell.persistence")
    assert ".envrc" in report.summary and str(out) in str(report.detail["changes"]), report.summary


@pytest.mark.parametrize("view", VIEWS)
def test_decoys_for_paths_that_exist_nowhere(view: str) -> None:
    policy = _policy(deny=("/tests", "/solution", "/var/run/docker.sock"))
    with _cell(policy, view) as cell:
        r = cell.run(
            ["/bin/sh", "-c", "ls /tests; cat /var/run/docker.sock; echo ok > /tmp/ok && cat /tmp/ok"]
        )
    assert r.stdout.endswith(b"ok\n"), r.stderr  # the control: the cell's own /tmp works
    assert b"Permission denied" in r.stderr
    summaries = [e.summary for e in r.denials]
    assert any(e.detail.get("path") == "/tests" for e in r.denials), summaries
    assert any("docker.sock" in s for s in summaries), summaries
    for path in ("/tests", "/solution"):
        assert not os.path.lexists(path)  # nothing made on the host


@pytest.mark.parametrize("view", VIEWS)
def test_a_reach_inside_an_absent_decoy_is_an_event_not_a_silent_enoent(view: str) -> None:
    """``cat /tests/test_outputs.py`` in a cell whose policy denies /tests,
    which exists nowhere: refused (EACCES, by file permissions: the decoy is
    host root's, mode 0000, no id of the cell's) and on record with the very
    path tried, in the host's view and an image's (root there: its
    capabilities hold only inside its user namespace)."""
    policy = _policy(deny=("/tests", "/solution"))
    script = (
        "cat /tests/test_outputs.py; ls /tests/sub; stat /solution/solve.sh; "
        "sh /tests/run.sh; cd /solution; mkdir /tests/new; echo x > /tests/new.txt; "
        "echo ok > /tmp/ok && cat /tmp/ok"
    )
    with _cell(policy, view) as cell:
        r = cell.run(["/bin/sh", "-c", script])
    assert r.stdout.endswith(b"ok\n"), r.stderr  # the control: the cell's own /tmp works
    assert b"No such file" not in r.stderr, r.stderr
    assert r.stderr.count(b"Permission denied") >= 6, r.stderr
    tried = {e.detail.get("path") for e in r.denials}
    for path in (
        "/tests/test_outputs.py",
        "/tests/sub",
        "/solution/solve.sh",
        "/tests/run.sh",
        "/solution",
        "/tests/new",
        "/tests/new.txt",
    ):
        assert path in tried, (path, [e.summary for e in r.denials])
    reach = next(e for e in r.denials if e.detail.get("path") == "/tests/test_outputs.py")
    assert reach.layer == "dac" and "a decoy" in reach.summary, reach.summary
    assert reach.detail.get("syscall") in ("open", "openat"), reach.detail
    for path in ("/tests", "/solution"):
        assert not os.path.lexists(path)  # nothing made on the host


def test_mount_errors_name_the_entry_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match=r"mounts\[0\]\.target '/proc/x' is inside '/proc'"):
        loads_policy(f"name: t\nfilesystem:\n  mounts: [{{source: {tmp_path}, target: /proc/x}}]\n")
    with pytest.raises(PolicyError, match=r"mounts\[0\]\.source '/nonexistent-src' does not exist"):
        loads_policy("name: t\nfilesystem:\n  mounts: [{source: /nonexistent-src, target: /mnt/x}]\n")
    with pytest.raises(PolicyError, match=r"already the target of filesystem\.mounts"):
        loads_policy(
            "name: t\nfilesystem:\n  mounts:\n"
            f"    - {{source: {tmp_path}, target: /a}}\n    - {{source: /etc, target: /a}}\n"
        )
    with pytest.raises(PolicyError, match="inside '/etc/ssh'"):
        loads_policy("name: t\nfilesystem:\n  mounts: [{source: /etc/ssh, target: /mnt/ssh}]\n")
    policy = loads_policy(
        f"name: t\nfilesystem:\n  mounts: [{{source: {tmp_path}, target: /mnt/x, mode: rw}}]\n"
    )
    assert policy.filesystem.mounts == (MountRule(str(tmp_path), "/mnt/x", "rw"),)


def test_a_target_inside_a_host_bind_that_is_not_there_is_refused(tmp_path: Path) -> None:
    policy = _policy(mounts=(MountRule(str(tmp_path), "/usr/no-such-dir", "ro"),))
    with Cell(policy) as cell, pytest.raises(PolicyError, match="cannot be made"):
        cell.run(["/bin/true"])
    assert not os.path.exists("/usr/no-such-dir")


@pytest.mark.parametrize("view", VIEWS)
def test_a_deny_entry_inside_the_workspace_is_a_decoy(view: str, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "secret").mkdir(parents=True)
    (ws / "secret/key").write_text("KEY\n")
    (ws / "notes").write_text("mine\n")
    os.chown(ws, 65534, 65534)
    os.chown(ws / "notes", 65534, 65534)
    with _cell(_policy(deny=(str(ws / "secret"),)), view, workspace=ws) as cell:
        r = cell.run(["/bin/sh", "-c", f"cat {ws}/secret/key; echo more >> {ws}/notes && cat {ws}/notes"])
    assert r.stdout == b"mine\nmore\n", r.stderr  # the control: the workspace's own file
    assert b"KEY" not in r.stdout
    assert any(f"{ws}/secret/key" in e.summary for e in r.denials), r.denials


@pytest.mark.parametrize("view", VIEWS)
def test_protected_paths_inside_a_rw_mount_are_read_only(view: str, tmp_path: Path) -> None:
    """As in a write grant: the git directory's hooks and config and a shell
    file at the top of a ``rw`` mount are read-only at its target, a write
    there is refused (EROFS) and recorded; the rest of the mount is writable."""
    src = tmp_path / "repo"
    (src / ".git/hooks").mkdir(parents=True)
    (src / ".git/config").write_text("[core]\n")
    (src / ".bashrc").write_text("# mine\n")
    policy = _policy(mounts=(MountRule(str(src), "/srv/repo", "rw"),))
    with _cell(policy, view) as cell:
        r = cell.run(
            [
                "/bin/sh",
                "-c",
                "echo evil > /srv/repo/.git/hooks/pre-commit; echo rc=$?; "
                "echo evil >> /srv/repo/.bashrc; echo rc=$?; "
                "echo '[x]' >> /srv/repo/.git/config; echo rc=$?; "
                "echo fine > /srv/repo/notes.txt && echo control",
            ]
        )
    assert r.stdout.decode().split("\n")[:4] == ["rc=2", "rc=2", "rc=2", "control"], r.stderr
    assert not (src / ".git/hooks/pre-commit").exists()
    assert (src / ".bashrc").read_text() == "# mine\n"
    assert (src / ".git/config").read_text() == "[core]\n"
    assert (src / "notes.txt").read_text() == "fine\n"
    summaries = " ".join(e.summary for e in r.denials)
    # A creation is named by the directory refused (the new name is not a path yet).
    for path in ("/srv/repo/.git/hooks", "/srv/repo/.bashrc", "/srv/repo/.git/config"):
        assert path in summaries, r.denials


@pytest.mark.parametrize("view", VIEWS)
def test_a_deny_entry_inside_a_mount_target_is_a_decoy(view: str, tmp_path: Path) -> None:
    """A ``filesystem.deny`` path inside a mount's target hides what the
    source has there (it was silently shown in the host's view): the read is
    refused by Landlock and recorded; the mount's other files stay readable."""
    src = tmp_path / "data"
    (src / "keys").mkdir(parents=True)
    src.chmod(0o755)
    tmp_path.chmod(0o755)
    (src / "secret.txt").write_text("TOPSECRET\n")
    (src / "keys/id").write_text("KEY\n")
    (src / "open.txt").write_text("shown\n")
    policy = _policy(
        mounts=(MountRule(str(src), "/srv/data", "ro"),), deny=("/srv/data/secret.txt", "/srv/data/keys")
    )
    with _cell(policy, view) as cell:
        r = cell.run(
            ["/bin/sh", "-c", "cat /srv/data/secret.txt; cat /srv/data/keys/id; cat /srv/data/open.txt"]
        )
    assert r.stdout == b"shown\n", r.stderr
    summaries = " ".join(e.summary for e in r.denials)
    assert "/srv/data/secret.txt" in summaries and "/srv/data/keys/id" in summaries, r.denials


@pytest.mark.parametrize("view", VIEWS)
def test_a_deny_entry_on_a_mount_target_is_an_error(view: str, tmp_path: Path) -> None:
    src = tmp_path / "data"
    src.mkdir()
    for deny in ("/srv/data", "/srv"):
        policy = _policy(mounts=(MountRule(str(src), "/srv/data", "ro"),), deny=(deny,))
        with _cell(policy, view) as cell, pytest.raises(PolicyError, match=r"filesystem\.deny entry"):
            cell.run(["/bin/true"])


@pytest.mark.parametrize("view", VIEWS)
def test_a_workspace_inside_a_read_grant_no_one_may_enter_is_a_policy_error(
    view: str, tmp_path: Path
) -> None:
    """The workspace is bound on top of a read grant that holds it, reached
    through the grant's directories: a 0700 one of host root's stops the
    view (it was "mkdir …/ws: Permission denied" at setup). Said before the
    cell starts, naming the directory; control: the grant of the searchable
    directory inside it works, the workspace writable in it."""
    top = tmp_path / "private"
    (top / "proj/ws").mkdir(parents=True)
    top.chmod(0o700)
    tmp_path.chmod(0o755)
    (top / "proj").chmod(0o755)
    (top / "proj/README").write_text("readme\n")
    fs = default_policy().filesystem
    for grant, works in ((top, False), (top / "proj", True)):
        policy = dataclasses.replace(
            default_policy(), filesystem=dataclasses.replace(fs, read=(*fs.read, str(grant)))
        )
        with _cell(policy, view, workspace=top / "proj/ws") as cell:
            if not works:
                with pytest.raises(PolicyError, match=r"chmod o\+x") as caught:
                    cell.run(["/bin/true"])
                assert str(top) in str(caught.value) and "0700" in str(caught.value)
                continue
            r = cell.run(["/bin/sh", "-c", f"cat {top}/proj/README; echo hi > f && cat f"])
            assert (r.exit_code, r.stdout) == (0, b"readme\nhi\n"), r.stderr
