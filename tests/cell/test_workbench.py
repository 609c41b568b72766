"""Workbench cells: an image as the cell's ``/`` (cell/_workbench.py).

Real cells on this host over a small image of the host's own programs
(tests/cell/_image.py): the overlay, the idmapped layers, root inside a
user namespace, the upper layer thrown away or kept in the image's ids.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

import pytest

from stockade.cell import Cell
from stockade.cell._owners import OWNER_BASE
from stockade.cell._workbench import ImageView, resolve_in_image, resolve_user
from stockade.errors import CellError, PolicyError
from stockade.policy import MountRule, Policy, default_policy
from tests.cell._image import PYTHON, build_rootfs, make_image

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="a workbench maps an id range: needs root (CAP_SETUID)"
)


def _policy(**changes: object) -> Policy:
    return dataclasses.replace(default_policy(), **changes)  # type: ignore[arg-type]


def _run(policy: Policy, script: str, **cell: object) -> tuple[int, str, str, list[str]]:
    with Cell(policy, image=cell.pop("image", make_image()), **cell) as c:  # type: ignore[arg-type]
        r = c.run(["/bin/sh", "-c", script])
    return r.exit_code, r.stdout.decode(), r.stderr.decode(), [e.summary for e in r.denials]


def test_the_image_is_the_root_and_its_config_the_defaults() -> None:
    image = make_image(env=("PATH=/usr/bin:/bin", "IMAGE_VAR=from-image"), workdir="/opt/app")
    code, out, err, _ = _run(
        _policy(), "pwd; echo $IMAGE_VAR; cat /etc/hostname data.txt; id -u", image=image
    )
    assert code == 0, err
    # An image whose User is empty runs as its root, as Docker runs it (in
    # the cell's user namespace: an unprivileged host uid).
    assert out.split("\n")[:5] == ["/opt/app", "from-image", "task-image", "image data", "0"]


def test_root_inside_owns_the_image_and_nothing_of_the_host(tmp_path: Path) -> None:
    code, out, err, _ = _run(
        _policy(user="root"),
        "id -u; grep CapEff /proc/self/status; echo new > /etc/new; chown 1234:50 /etc/new; "
        "stat -c '%u:%g' /etc/new /home/builder/notes.txt; chmod 600 /etc/hostname && echo chmod-ok; "
        "rm /etc/hostname && echo rm-ok",
    )
    assert code == 0, err
    lines = out.split("\n")
    assert lines[0] == "0"
    caps = int(lines[1].split()[1], 16)
    assert caps and not caps & (1 << 21), "CAP_SYS_ADMIN must never be kept"
    assert lines[2:6] == ["1234:50", "1234:1234", "chmod-ok", "rm-ok"]
    # The lower layer is never written: the image is as it was.
    rootfs = build_rootfs()
    assert (rootfs / "opt/app/data.txt").read_text() == "image data\n"
    assert not (rootfs / "etc/new").exists()
    assert stat.S_IMODE((rootfs / "etc/hostname").stat().st_mode) == 0o644


def test_the_upper_is_thrown_away_by_default() -> None:
    image = make_image()
    with Cell(_policy(user="root"), image=image) as cell:
        first = cell.run(["/bin/sh", "-c", "echo one > /etc/run-file"])
        second = cell.run(["/bin/sh", "-c", "cat /etc/run-file"])
    assert first.exit_code == 0
    assert second.exit_code != 0 and b"No such file" in second.stderr


def test_a_kept_upper_holds_the_image_ids_and_whiteouts(tmp_path: Path) -> None:
    upper = tmp_path / "layer"
    with Cell(_policy(user="root"), image=make_image(), upper_dir=upper) as cell:
        r = cell.run(
            [
                "/bin/sh",
                "-c",
                "echo x > /etc/kept; chown 1234:1234 /etc/kept; rm /etc/hostname; mkdir /srv/d",
            ]
        )
        again = cell.run(["/bin/sh", "-c", "cat /etc/kept"])
    assert r.exit_code == 0, r.stderr
    assert again.stdout == b"x\n"  # the next run continues from the kept upper
    kept = os.lstat(upper / "etc/kept")
    assert (kept.st_uid, kept.st_gid) == (1234, 1234)  # the image's own ids, not the host range's
    assert os.lstat(upper / "srv/d").st_uid == 0
    whiteout = os.lstat(upper / "etc/hostname")
    assert stat.S_ISCHR(whiteout.st_mode) and whiteout.st_rdev == 0  # overlayfs's whiteout
    # The view's own mount points (the workspace's) were tidied away.
    assert not (upper / "var/lib/stockade").exists()
    assert not list(tmp_path.glob(".layer.work-*"))


def test_the_cell_ids_are_the_slot_range_on_the_host(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    os.chown(workspace, 4321, 4321)
    code, out, err, _ = _run(
        _policy(user="root"),
        f"echo hi > {workspace}/made; stat -c %u {workspace}/made; cat /proc/self/uid_map",
        workspace=workspace,
    )
    assert code == 0, err
    inside, start, count = out.split("\n")[1].split()
    assert inside == "0" and int(start) > OWNER_BASE and count == "65535"
    # Written as root inside, the workspace's file is its owner's on the host (idmapped).
    assert os.stat(workspace / "made").st_uid == 4321
    assert out.split("\n")[0] == "0"


def test_root_inside_cannot_write_host_files_it_is_shown(tmp_path: Path) -> None:
    shown = tmp_path / "host-data"
    shown.mkdir()
    (shown / "f").write_text("host's\n")
    policy = _policy(
        user="root",
        filesystem=dataclasses.replace(
            default_policy().filesystem, mounts=(MountRule(str(shown), "/data", "ro"),)
        ),
    )
    code, out, err, denials = _run(
        policy, "cat /data/f; echo x > /data/f; echo rc=$?; chmod 777 /data/f; echo rc=$?; echo ok > /tmp/t"
    )
    assert code == 0, err  # the control: the cell's own /tmp stays writable
    assert "host's" in out and "rc=0" not in out, (out, err)
    assert err.count("Read-only file system") == 2, err
    assert (shown / "f").read_text() == "host's\n"
    assert stat.S_IMODE((shown / "f").stat().st_mode) == 0o644
    assert [d for d in denials if "/data/f" in d and "EROFS" in d], denials


def test_user_by_name_from_the_image_passwd() -> None:
    code, out, err, _ = _run(_policy(user="builder"), "id -u; id -g; echo $HOME; cat ~/notes.txt")
    assert code == 0, err
    assert out.split("\n")[:4] == ["1234", "1234", "/home/builder", "the image user's own file"]


def test_an_image_user_that_claims_uid_0_is_root_of_the_cell_only() -> None:
    # The image's passwd says "agent" is uid 0: inside it is, and so only the
    # cell's own root (the slot's range on the host), with the same limits.
    code, out, err, denials = _run(
        _policy(user="agent"), "id -u; cat /proc/self/uid_map; mount -t tmpfs x /mnt"
    )
    assert out.split("\n")[0] == "0", err
    assert int(out.split("\n")[1].split()[1]) > OWNER_BASE
    assert code != 0 and any("mount" in d for d in denials), denials


def test_user_root_without_an_image_keeps_the_host_read_only(tmp_path: Path) -> None:
    with Cell(_policy(user="root")) as cell:
        r = cell.run(["/bin/sh", "-c", "id -u; touch /usr/x; echo rc=$?; echo ok > $HOME/w; cat $HOME/w"])
    assert r.stdout.split(b"\n")[:3] == [b"0", b"rc=1", b"ok"], r.stderr
    assert not os.path.exists("/usr/x")
    assert any("in /usr refused by landlock" in e.summary for e in r.denials), r.denials


def test_resolve_in_image_never_leaves_the_image() -> None:
    rootfs = str(build_rootfs())
    assert resolve_in_image(rootfs, "/bin/cat") == ("/usr/bin/cat", True)
    # A link of the image to "/etc/shadow" is the image's own /etc/shadow;
    # one climbing with .. stops at the image's root.
    assert resolve_in_image(rootfs, "/opt/app/host-shadow") == ("/etc/shadow", True)
    assert resolve_in_image(rootfs, "/opt/app/climb-shadow") == ("/etc/shadow", True)
    assert resolve_in_image(rootfs, "/tests/x") == ("/tests/x", False)


def test_resolve_user_errors_name_the_user() -> None:
    rootfs = str(build_rootfs())
    assert resolve_user("root", rootfs).uid == 0
    assert resolve_user("1234:50", rootfs).gid == 50
    with pytest.raises(PolicyError, match="'nosuch' is not in the image's /etc/passwd"):
        resolve_user("nosuch", rootfs)


def test_a_user_name_without_an_image_is_a_policy_error() -> None:
    with (
        Cell(_policy(user="builder")) as cell,
        pytest.raises(PolicyError, match="only an image's /etc/passwd"),
    ):
        cell.run(["/bin/true"])


def test_exec_allow_with_an_image_is_a_policy_error() -> None:
    policy = _policy(exec=dataclasses.replace(default_policy().exec, allow=("/usr/bin/true",)))
    with (
        Cell(policy, image=ImageView(str(build_rootfs()))) as cell,
        pytest.raises(PolicyError, match=r"exec\.allow"),
    ):
        cell.run(["/bin/true"])


def test_python_runs_in_the_image() -> None:
    code, out, err, _ = _run(
        _policy(user="1000"), f"{PYTHON} -c 'import json, os; print(json.dumps(os.getuid()))'"
    )
    assert (code, out) == (0, "1000\n"), err


def test_a_kept_upper_with_a_planted_link_is_refused(tmp_path: Path) -> None:
    # A cell cannot replace a path that a Landlock rule names (the top of /,
    # or an entry of a directory with a hole: neither may it remove), but a
    # kept layer is a directory on the host: one changed there to make /srv a
    # link would carry the rule for /srv to /root, so the run does not start.
    # (A user's: root's whole image has one rule, on / itself, and no
    # mount point behind a link: the next test.)
    upper = tmp_path / "layer"
    with Cell(_policy(user="1000"), image=make_image(), upper_dir=upper) as cell:
        assert cell.run(["/bin/true"]).exit_code == 0
        os.symlink("/root", upper / "srv")
        with pytest.raises(CellError, match="symbolic link"):
            cell.run(["/bin/true"])


def test_a_kept_upper_with_a_planted_link_leads_root_only_inside_its_image(tmp_path: Path) -> None:
    # Root's Landlock rule is on / (the image's, its upper's), so a link
    # planted in a kept upper carries no rule anywhere: it resolves inside
    # the cell's view, never to the host's /root.
    image = make_image()
    upper = tmp_path / "layer"
    with Cell(_policy(user="root"), image=image, upper_dir=upper) as cell:
        assert cell.run(["/bin/true"]).exit_code == 0
        os.symlink("/root", upper / "srv")
        r = cell.run(["/bin/sh", "-c", "echo made > /srv/by-root && ls -A /srv"])
    assert r.exit_code == 0, r.stderr
    image_root = Path(image.rootfs) / "root"
    shown = set(os.listdir(image_root)) if image_root.is_dir() else set()
    assert set(r.stdout.decode().split()) == {*shown, "by-root"}, r.stdout
    assert (upper / "root" / "by-root").read_text() == "made\n"
    assert not os.path.exists("/root/by-root")


def test_without_overlayfs_a_copy_of_the_image_is_the_root(monkeypatch: pytest.MonkeyPatch) -> None:
    # Where the host has no overlayfs for a user namespace (stockade doctor:
    # "workbench layers: copy"), each run gets a copy of the image instead.
    from stockade.cell import _workbench

    monkeypatch.setattr(_workbench, "LAYERS", "copy")
    code, out, err, denials = _run(
        _policy(user="root"),
        "cat /opt/app/data.txt; echo changed > /opt/app/data.txt; stat -c %u /home/builder/notes.txt; "
        "/usr/bin/suid-sh -c 'grep NoNewPrivs /proc/self/status'; mount -t tmpfs x /mnt",
    )
    assert out.split("\n")[:3] == ["image data", "1234", "NoNewPrivs:\t1"], err
    assert (build_rootfs() / "opt/app/data.txt").read_text() == "image data\n"  # the image is untouched
    assert any("mount" in d for d in denials), denials
    assert code != 0


def test_dpkg_installs_a_package_as_root_inside(tmp_path: Path) -> None:
    # A package built here (dpkg-deb, no network): root of the workbench
    # installs it into the image's view; the agent as uid 1000 cannot.
    import shutil
    import subprocess

    if shutil.which("dpkg-deb") is None:
        pytest.skip("no dpkg-deb on this host to build the test package")
    tree = tmp_path / "pkg"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN/control").write_text(
        "Package: stockade-hello\nVersion: 1.0\nArchitecture: all\n"
        "Maintainer: t <t@example.invalid>\nDescription: a test package\n"
    )
    (tree / "usr/share/hello").mkdir(parents=True)
    (tree / "usr/share/hello/greeting").write_text("hi\n")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-b", str(tree), str(workspace / "hello.deb")],
        check=True,
        capture_output=True,
    )
    script = f"dpkg -i {workspace}/hello.deb >/dev/null; echo rc=$?; stat -c %u /usr/share/hello/greeting"
    code, out, err, _ = _run(_policy(user="root"), script, workspace=workspace)
    assert code == 0 and out.split("\n")[:2] == ["rc=0", "0"], err
    _code, out, err, _ = _run(_policy(user="1000"), script, workspace=workspace)
    assert out.startswith("rc=2"), (out, err)  # the agent: dpkg's lock and database are root's
    assert not (build_rootfs() / "usr/share/hello").exists()


def test_the_start_event_names_the_image_and_the_user() -> None:
    image = make_image()
    with Cell(_policy(user="root"), image=image) as cell:
        r = cell.run(["/bin/true"])
    start = next(e for e in r.events if e.kind == "cell.start")
    assert start.detail["image"] == image.digest and start.detail["uid"] == 0
    assert start.detail["host_uid"] > OWNER_BASE  # the slot's range, never host root


def test_a_root_workbench_adds_users_and_new_names_in_etc() -> None:
    """What Dockerfiles do as root: shadow's ``useradd`` (which opens the audit
    netlink socket: refused as a kernel without netlink would, EAFNOSUPPORT, so
    it carries on), and new names in /etc beside a file stockade shows (the
    gateway's CA bundle): in a workbench those live under /run/stockade only,
    so the image's /etc stays the cell's own to change."""
    shown = {
        "/etc/ssl/certs/ca-certificates.crt": b"host bundle\n",
        "/run/stockade/ca.pem": b"run ca\n",
    }
    code, out, err, denials = _run(
        _policy(user="root"),
        "useradd -m -s /bin/sh bob && grep -c '^bob:' /etc/passwd && stat -c '%u' /home/bob; "
        "echo ok > /etc/newfile && cat /etc/newfile; cat /run/stockade/ca.pem",
        files=shown,
    )
    assert code == 0, err
    assert out.split("\n")[:4] == ["1", "1235", "ok", "run ca"], (out, err)
    # The audit socket was still refused, and said so in the record.
    assert any("socket" in d for d in denials), denials


def test_an_image_without_user_runs_as_its_root_unless_the_policy_says() -> None:
    """Docker runs an image whose ``User`` is empty as root: so does a
    workbench, as the image's root in the cell's user namespace (never host
    root: its uid_map leads to the slot's unprivileged range); ``user:`` wins,
    and the image's ``User`` wins over the default."""
    script = "id -u; cat /proc/self/uid_map"
    code, out, err, _ = _run(_policy(), script)
    assert code == 0, err
    lines = out.split("\n")
    assert lines[0] == "0"
    inside, host, count = (int(x) for x in lines[1].split())
    assert inside == 0 and host >= OWNER_BASE and count > 1, lines
    assert _run(_policy(user="1000"), "id -u")[1] == "1000\n"
    assert _run(_policy(), "id -u", image=make_image(user="builder"))[1] == "1234\n"


def test_root_of_a_workbench_does_what_root_does_in_its_image(tmp_path: Path) -> None:
    """Root's whole image (Landlock grants / entire): mkdir at /, ls /, the
    writes apt-get makes (/var/lib, /etc/apt, /usr/bin), a rename and removal
    of its own; while the decoys (file permissions, host root's mode 0000),
    a protected path of the workspace and a read-only mount stay refused,
    each on record with the path tried."""
    ws = tmp_path / "ws"
    (ws / ".git/hooks").mkdir(parents=True)
    (ws / ".git/hooks/pre-commit").write_text("#!/bin/sh\n")
    shown = tmp_path / "shown"
    shown.mkdir()
    (shown / "f").write_text("shown\n")
    fs = default_policy().filesystem
    policy = _policy(
        user="root",
        filesystem=dataclasses.replace(
            fs, deny=(*fs.deny, "/tests", "/solution"), mounts=(MountRule(str(shown), "/data", "ro"),)
        ),
    )
    allowed = (
        "mkdir /app && echo built > /app/out && cat /app/out && echo $(ls /); "
        "mkdir -p /var/lib/dpkg/updates /etc/apt/sources.list.d && echo deb > /etc/apt/sources.list.d/x.list "
        "&& cp /bin/true /usr/bin/newtool && chmod 755 /usr/bin/newtool && /usr/bin/newtool && "
        "mv /app /srv-app && rm -r /srv-app && ln -s /etc /etc-link && rm /etc-link && echo root-ok; "
    )
    refused = (
        "cat /tests/test_outputs.py; ls /solution; mkdir /tests/x; rmdir /tests; "
        f"echo evil >> {ws}/.git/hooks/pre-commit; echo x > /data/f; echo done"
    )
    code, out, err, denials = _run(policy, allowed + refused, workspace=ws)
    lines = out.split("\n")
    assert lines[0] == "built", err
    listing = lines[1].split()
    assert {"app", "bin", "etc", "tests", "solution", "usr"} <= set(listing), lines[1]
    assert lines[2] == "root-ok", err
    assert lines[3] == "done" and code == 0
    assert (ws / ".git/hooks/pre-commit").read_text() == "#!/bin/sh\n"
    assert (shown / "f").read_text() == "shown\n"
    for tried in ("/tests/test_outputs.py", "/solution", "/tests/x", "pre-commit", "/data/f"):
        assert any(tried in d for d in denials), (tried, denials)
    assert any("/tests" in d and ("EBUSY" in d or "EACCES" in d) for d in denials if "rmdir" in d), denials
    # Root's own writes are not refusals.
    own = ("/app", "/var/lib/dpkg", "/usr/bin/newtool", "/etc")
    assert not any(p in d for d in denials for p in own), denials
