"""Escapes through a task's own image, tried for real in a workbench (an
image as ``/``, tests/cell/_image.py): its setuid binary, its links to host
paths, its hard links to host files, its device node, its /etc/passwd that
claims uid 0, and root inside trying what root outside could.

Each asserts the attempt failed (or, where the image's own file is what the
attempt gets, that nothing of the host's came back or changed), that the
record says what was tried where the kernel logs it, and a control.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.cell import Cell, CellResult
from stockade.cell._owners import OWNER_BASE
from stockade.policy import MountRule, Policy, default_policy
from tests.cell._image import build_rootfs, make_image

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="a workbench maps an id range: needs root (CAP_SETUID)"
)


def _policy(**changes: object) -> Policy:
    return dataclasses.replace(default_policy(), **changes)  # type: ignore[arg-type]


def _run(policy: Policy, script: str, **cell: object) -> CellResult:
    with Cell(policy, image=make_image(), environ={}, **cell) as c:  # type: ignore[arg-type]
        return c.run(["/bin/sh", "-c", script])


def _denials(result: CellResult) -> list[str]:
    return [f"{e.layer}: {e.summary}" for e in result.denials]


@pytest.fixture
def host_dir() -> Iterator[Path]:
    path = Path("/var/tmp") / f"stockade-wb-escape-{os.urandom(4).hex()}"
    path.mkdir(mode=0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_setuid_root_binary_of_the_image_raises_nothing() -> None:
    """The kernel logs no refusal here (a setuid bit on a nosuid mount under
    no_new_privs is ignored, not refused): the evidence is the uid and the
    capability sets of the process it started."""
    r = _run(
        _policy(user="1000"),
        "stat -c %A /usr/bin/suid-sh; "
        "/usr/bin/suid-sh -c 'id -u; grep -E \"CapEff|NoNewPrivs\" /proc/self/status'; "
        "/bin/sh -c 'echo control'",
    )
    lines = r.stdout.decode().split("\n")
    assert lines[0] == "-rwsr-xr-x", r.stderr  # the bit is there in the view
    assert lines[1] == "1000"  # and gave nothing
    assert lines[2].split() == ["CapEff:", "0000000000000000"]
    assert lines[3].split() == ["NoNewPrivs:", "1"]
    assert lines[4] == "control"


def test_links_of_the_image_to_host_paths_stay_in_the_image() -> None:
    """The image links /opt/app/host-key to "/root/.ssh/id_rsa" and another
    climbs there with "../../../..": both are the image's /root/.ssh, which
    the policy hides here as a decoy, so both reads are refused and
    recorded, and nothing of the host's /root/.ssh comes back. The image's
    /etc/shadow through its link is the image's own (never the host's)."""
    fs = default_policy().filesystem
    # As the cell's root: the image's /root (0700, its root's) lets it pass.
    policy = _policy(user="root", filesystem=dataclasses.replace(fs, deny=(*fs.deny, "/root/.ssh")))
    r = _run(
        policy,
        "cat /opt/app/host-key; cat /opt/app/climb-key; cat /opt/app/host-shadow; cat /opt/app/data.txt",
    )
    assert r.stdout == b"root:*:19000:0:99999:7:::\nimage data\n", r.stderr  # the image's own files
    host_shadow = Path("/etc/shadow").read_bytes()
    assert host_shadow.strip() and host_shadow not in r.stdout
    assert r.stderr.count(b"Permission denied") == 2
    # Root's whole image: the decoy is one of file permissions (host root's,
    # mode 0000), and the walk through each link is refused and recorded
    # under the name it asked for (resolved inside the image to the decoy).
    reads = [d for d in _denials(r) if "dac" in d and "a decoy" in d and "/opt/app/" in d]
    assert len(reads) == 2, _denials(r)


def test_hard_links_of_the_image_never_change_the_host_files_they_share() -> None:
    """The test image's /usr/bin/cat is a hard link of the host's (one inode).
    Root of the workbench appends to it: overlayfs copies it up into the run's
    own layer first, so the cell sees its change and the host's file stays as
    it was. Nothing is refused (the write is the cell's own), so no event."""
    image_cat = build_rootfs() / "usr/bin/cat"
    host_cat = Path(os.path.realpath("/usr/bin/cat"))
    assert os.stat(image_cat).st_ino == os.stat(host_cat).st_ino, "the test image shares the host's inode"
    before = hashlib.sha256(host_cat.read_bytes()).hexdigest()
    r = _run(_policy(user="root"), "echo APPENDED >> /usr/bin/cat && grep -a -c APPENDED /usr/bin/cat")
    assert r.stdout == b"1\n", r.stderr
    assert hashlib.sha256(host_cat.read_bytes()).hexdigest() == before
    assert os.stat(image_cat).st_ino == os.stat(host_cat).st_ino


def test_a_device_node_of_the_image_cannot_be_opened() -> None:
    r = _run(_policy(user="root"), "cat /opt/app/mem; echo rc=$?; echo ok > /dev/null && echo control")
    assert r.stdout == b"rc=1\ncontrol\n", r.stderr
    # Root's whole image: the device's decoy is one of file permissions.
    assert any("dac" in d and "a decoy" in d and "/opt/app/mem" in d for d in _denials(r)), _denials(r)


def test_an_image_passwd_that_claims_uid_0_gives_the_cells_root_only() -> None:
    """The image's passwd makes "agent" uid 0: the cell's root, a leased
    range's id on the host, with root's limits: mount is refused and recorded."""
    r = _run(
        _policy(user="agent"), "id -u; cat /proc/self/uid_map; mount -t tmpfs x /mnt; echo ok > /etc/motd"
    )
    lines = r.stdout.decode().split("\n")
    assert lines[0] == "0", r.stderr
    inside, start, _count = lines[1].split()
    assert inside == "0" and int(start) > OWNER_BASE  # never host root
    assert r.exit_code == 0  # the control: the image's /etc is root's to write
    assert any("seccomp" in d and "mount" in d for d in _denials(r)), _denials(r)


@pytest.mark.parametrize(
    ("attempt", "needle"),
    [
        ("mount -t tmpfs x /mnt", "mount"),
        ("unshare -U -r true", "unshare"),
        (
            "python3 -c 'import ctypes,sys; l=ctypes.CDLL(None,use_errno=True); "
            'sys.exit(0 if l.init_module(0,0,b"")==0 else 1)\'',
            "init_module",
        ),
    ],
    ids=["mount", "unshare", "init_module"],
)
def test_root_inside_cannot_use_root_outside(attempt: str, needle: str) -> None:
    r = _run(_policy(user="root"), f"{attempt}; echo rc=$?; chown 1234 /etc/hostname && echo control")
    assert b"rc=0" not in r.stdout and b"control" in r.stdout, (r.stdout, r.stderr)
    assert any("seccomp" in d and needle in d for d in _denials(r)), _denials(r)


def test_root_inside_cannot_write_host_owned_files(host_dir: Path) -> None:
    """A file of the workspace owned by an id the cell does not map (host
    root's) is nobody's inside: root of the cell can neither chown nor write
    it; a read-only mount refuses writes whatever the owner. Both recorded."""
    ws = host_dir / "ws"
    ws.mkdir()
    os.chown(ws, 4321, 4321)
    (ws / "rootowned").write_text("host root's\n")
    shown = host_dir / "shown"
    shown.mkdir()
    (shown / "f").write_text("shown\n")
    fs = default_policy().filesystem
    policy = _policy(
        user="root", filesystem=dataclasses.replace(fs, mounts=(MountRule(str(shown), "/data", "ro"),))
    )
    r = _run(
        policy,
        f"cd {ws}; chown 0:0 rootowned; echo x >> rootowned; echo x >> /data/f; echo mine > own && cat own",
        workspace=ws,
    )
    assert r.stdout == b"mine\n", r.stderr  # the control: the workspace is root's to write
    assert (ws / "rootowned").read_text() == "host root's\n" and os.stat(ws / "rootowned").st_uid == 0
    assert (shown / "f").read_text() == "shown\n"
    assert os.stat(ws / "own").st_uid == 4321
    found = _denials(r)
    assert any("dac" in d and "fchownat" in d and "rootowned" in d for d in found), found
    # Host root's file on a read-only mount: file permissions refuse root of
    # the cell first (the owner is not one of its ids), then the mount would.
    assert any(("EROFS" in d or "dac" in d) and "/data/f" in d for d in found), found


def test_no_network_but_the_gateway_from_a_workbench() -> None:
    """A TCP connect to the host's loopback canary from the image's Python:
    the cell has a loopback of its own, and Landlock refuses every port but
    the gateway's, recorded; the canary sees nothing. Control: the gateway's
    port is allowed (nothing answers there in this test: ECONNREFUSED)."""
    from stockade.cell._layers import GATEWAY_PORT
    from tests.escapes._net_cell import host_canary

    with host_canary() as canary:
        script = (
            "import socket, errno\n"
            "def connect(port):\n"
            "    s = socket.socket()\n"
            "    try:\n"
            "        s.connect(('127.0.0.1', port)); return 'connected'\n"
            "    except OSError as e:\n"
            "        return errno.errorcode[e.errno]\n"
            f"print(connect({canary.port}), connect({GATEWAY_PORT}))\n"
        )
        r = _run(_policy(), f'python3 -c "{script}"')
        assert r.stdout.split() == [b"EACCES", b"ECONNREFUSED"], r.stderr
        assert canary.touched() == []
    assert any("landlock" in d and str(canary.port) in d for d in _denials(r)), _denials(r)


def test_protected_paths_hold_in_a_workbench(host_dir: Path) -> None:
    """The workspace's git hooks are protected in a workbench as in any cell
    (its binds are at their own paths): a write is refused and recorded; the
    rest of the workspace stays writable."""
    ws = host_dir / "ws"
    (ws / ".git/hooks").mkdir(parents=True)
    (ws / ".git/hooks/pre-commit").write_text("#!/bin/sh\nexit 0\n")
    os.chown(ws, 4321, 4321)
    r = _run(
        _policy(user="root"),
        f"echo 'curl evil' >> {ws}/.git/hooks/pre-commit; echo rc=$?; echo ok > {ws}/notes && cat {ws}/notes",
        workspace=ws,
    )
    assert r.stdout.endswith(b"ok\n") and b"rc=0" not in r.stdout, (r.stdout, r.stderr)
    assert (ws / ".git/hooks/pre-commit").read_text() == "#!/bin/sh\nexit 0\n"
    assert any("pre-commit" in d for d in _denials(r)), _denials(r)


def test_host_secrets_are_not_in_a_workbench_view(host_dir: Path) -> None:
    """A host file that no grant shows is not in the image's view at all (its
    directories are the image's): it cannot be named, so the kernel has
    nothing to refuse or record; the image's own file there is readable."""
    secret = host_dir / "secret.txt"
    secret.write_text("HOST-SECRET-VALUE\n")
    r = _run(_policy(user="root"), f"cat {secret}; cat /opt/app/data.txt; ls /var/tmp")
    assert b"HOST-SECRET-VALUE" not in r.stdout + r.stderr
    assert b"No such file" in r.stderr and r.stdout.startswith(b"image data\n")
    assert host_dir.name.encode() not in r.stdout  # the host's /var/tmp is not listed either


SETUID_SCRIPT = (
    "cp /usr/bin/true /usr/bin/x && chmod 4755 /usr/bin/x; echo rc=$?; stat -c %A /usr/bin/x; "
    "cp /usr/bin/true w && chmod 4755 w; echo rc=$?; "
    "/usr/bin/x && echo control"
)


def test_a_root_workbench_sets_setuid_bits_where_no_other_host_user_reaches(tmp_path: Path) -> None:
    """``chmod 4755`` as Dockerfiles do: allowed in a workbench whose writable
    host places (here the workspace, under pytest's 0700 directory) no other
    host user can reach: the overlay's set-id file is inert (nosuid,
    no_new_privs), the workspace's runs on the host for its owner only."""
    ws = tmp_path / "ws"
    ws.mkdir()
    r = _run(_policy(user="root"), SETUID_SCRIPT, workspace=ws)
    lines = r.stdout.decode().split("\n")
    assert lines[:4] == ["rc=0", "-rwsr-xr-x", "rc=0", "control"], r.stderr
    assert os.stat(ws / "w").st_mode & 0o4000


def test_a_setuid_bit_in_a_workspace_other_users_reach_is_refused() -> None:
    """The same, with the workspace in a directory every host user may search
    (/var/tmp): a set-id file there, owned by the workspace's owner on the
    host, would run as that owner for anyone. seccomp refuses the mode (EPERM),
    logged and recorded; the chmod without the bit still works (control)."""
    top = Path("/var/tmp") / f"stockade-setid-{os.urandom(4).hex()}"
    top.mkdir(mode=0o755)
    top.chmod(0o755)
    try:
        r = _run(_policy(user="root"), SETUID_SCRIPT + "; chmod 755 w && echo plain-ok", workspace=top)
        lines = r.stdout.decode().split("\n")
        assert lines[:5] == ["rc=1", "-rwxr-xr-x", "rc=1", "control", "plain-ok"], r.stderr
        assert not os.stat(top / "w").st_mode & 0o4000
        assert [d for d in _denials(r) if "chmod" in d], _denials(r)
    finally:
        shutil.rmtree(top, ignore_errors=True)
