"""A cell's plan, and what the launcher hands the child, do not depend on
what the process has computed before (issue 18: work moved out of start-up
must not change a cell).

``plan_cell`` reuses host listings across the cells of a process (the hidden
directories' names for a second, sysfs's decoys for 30 s) and takes
shortcuts in its walks (the Landlock grants' holes are bucketed by entry, a
glob check without ``glob``); each is checked here against the plain
computation: caches emptied, the walk done the old way.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stockade.cell import _launch, _plan
from stockade.cell._layers import prepare_layers
from stockade.cell._plan import CellPlan, plan_cell
from stockade.policy import Policy, default_policy, loads_policy

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plans as root (idmaps, the workspace's owner)")


def _cold() -> None:
    _plan._mirrors.clear()
    _plan._sys_cache.clear()


class _Spawned(Exception):
    """Raised by the stand-in for ``_native.spawn``, with what it was given."""

    def __init__(self, kwargs: dict[str, Any]) -> None:
        super().__init__("spawn")
        self.kwargs = kwargs


class _Native:
    """``_native`` with ``spawn`` recording its arguments instead of forking."""

    def __getattr__(self, name: str) -> Any:
        from stockade.cell import _native

        return getattr(_native, name)

    @staticmethod
    def spawn(**kwargs: Any) -> int:
        raise _Spawned(kwargs)


def _spawn_args(policy: Policy, plan: CellPlan, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What ``launch`` hands ``_native.spawn`` for this plan, the Landlock
    rules' descriptors as the paths they were opened on."""
    landlock, seccomp = prepare_layers(policy, plan)
    upper = ("/var/tmp/upper-base", "upper", "work") if plan.image_rootfs else None
    spec = _launch.LaunchSpec(
        argv=("/bin/true",),
        plan=plan,
        cgroup_procs=("/sys/fs/cgroup/x/cgroup.procs",),
        landlock=landlock,
        seccomp=seccomp,
        audit_loginuid=None,
        stdin=0,
        stdout=1,
        stderr=2,
        cap_last=40,
        upper=upper,
    )
    monkeypatch.setattr(_launch, "_native", _Native())
    with pytest.raises(_Spawned) as spawned:
        _launch._spawn(spec, (100, 101), (102, 103))
    monkeypatch.undo()
    args = dict(spawned.value.kwargs)
    ruleset_attr, rules, paths, ports, flags = args["landlock"]
    opened = sorted(os.readlink(f"/proc/self/fd/{fd}") for fd in _rule_fds(rules))
    args["landlock"] = (ruleset_attr, len(rules), opened, paths, ports, flags)
    return args


def _rule_fds(rules: tuple[bytes, ...]) -> list[int]:
    import struct

    return [struct.unpack("=Qi", rule)[1] for rule in rules]


@pytest.fixture
def workspace(tmp_path: Path) -> str:
    ws = tmp_path / "ws"
    (ws / ".git" / "hooks").mkdir(parents=True)
    (ws / ".envrc").write_text("x")
    os.chown(ws, 65534, 65534)
    return str(ws)


def _policies(tmp_path: Path) -> dict[str, Policy]:
    source = tmp_path / "source"
    (source / "sub" / ".git" / "hooks").mkdir(parents=True)
    (source / "secret.key").write_text("k")
    writable = tmp_path / "w"
    writable.mkdir()
    text = f"""
name: m
filesystem:
  read: [/usr, /etc, /opt]
  write: [{writable}]
  deny: [/etc/shadow, /tests, /var/run/docker.sock, /etc/ssl/private, "/etc/*.key", /data/secret.key]
  protect: [.git/hooks, .envrc, /etc/hosts]
  mounts:
    - {{source: {source}, target: /data, mode: rw}}
    - {{source: /usr/share/doc, target: /docs, mode: ro}}
exec: {{allow: [/usr/bin/python3]}}
env: {{pass: [LANG], set: {{FOO: bar}}}}
network: {{loopback_ports: [8080]}}
"""
    return {"default": default_policy(), "mounts": loads_policy(text, environ={"LANG": "C"})}


def _cold_and_warm(plan: Callable[[], CellPlan]) -> tuple[CellPlan, CellPlan]:
    """A plan made with the process's caches empty, and one made right after
    with them filled, at a moment the host did not change in between (other
    cells of this host come and go in the hidden workspaces' root: a plan
    made cold again after the warm one must be the first's)."""
    for _ in range(20):
        _cold()
        cold = plan()
        warm = plan()
        # The second plan could reuse them (a plan whose decoys are all of
        # file permissions mirrors nothing).
        assert _plan._sys_cache and (_plan._mirrors or not any(op.kind == "decoy_dir" for op in cold.mounts))
        _cold()
        if plan() == cold:
            return cold, warm
    raise AssertionError("the host's hidden directories changed under every one of 20 plans")


def test_a_plan_is_the_same_cold_and_with_the_process_caches_warm(
    tmp_path: Path, workspace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    environ = {"HOME": "/root", "LANG": "C"}
    sockets = (("/run/b.sock", "/tmp/b.sock"),)
    files = (("/etc/ssl/ca.pem", b"x"),)
    for name, policy in _policies(tmp_path).items():
        cold, warm = _cold_and_warm(
            lambda p=policy: plan_cell(p, workspace=workspace, environ=environ, sockets=sockets, files=files)
        )
        assert warm == cold, name
        assert cold.hidden and any(op.kind == "decoy_dir" and op.names for op in cold.mounts), name
        assert _spawn_args(policy, warm, monkeypatch) == _spawn_args(policy, cold, monkeypatch), name


def test_a_workbench_plan_is_the_same_cold_and_warm(workspace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from stockade.cell._workbench import ImageView, plan_workbench
    from tests.cell._image import build_rootfs

    image = ImageView(rootfs=str(build_rootfs()), digest="sha256:" + "0" * 64)
    policy = default_policy()
    cold, warm = _cold_and_warm(
        lambda: plan_workbench(policy, image, workspace=workspace, environ={"HOME": "/root"})
    )
    assert warm == cold and cold.image_rootfs
    assert _spawn_args(policy, warm, monkeypatch) == _spawn_args(policy, cold, monkeypatch)


def _grants_walk(read_dirs: list[str], hidden: list[str]) -> tuple[list[str], list[str]]:
    """The grants walk as it was before its holes were bucketed: every entry of
    a holed directory matched against every hole of that directory."""
    read: list[str] = []
    list_dirs: list[str] = []

    def add(path: str, candidates: list[str]) -> None:
        holes = [h for h in candidates if _plan._is_under(h, path)]
        if not holes:
            read.append(path)
            return
        if path in holes or not os.path.isdir(path):
            return
        list_dirs.append(path)
        for name in os.listdir(path):
            add(os.path.join(path, name), holes)

    for path in read_dirs:
        add(path, hidden)
    return read, list_dirs


def test_the_grants_walk_leaves_the_same_holes_as_matching_every_entry(tmp_path: Path) -> None:
    root = tmp_path / "etc"
    for rel in ("a/b/c", "a/b/d", "a/e", "f/g", "h", "i/j/k/l"):
        (root / rel).mkdir(parents=True)
    for rel in ("a/b/c/x", "a/b/y", "a/z", "f/g/w", "top"):
        (root / rel).write_text("x")
    hidden = [
        str(root / "a" / "b" / "c"),  # a directory hidden whole
        str(root / "a" / "z"),  # a file
        str(root / "i" / "j" / "k" / "l"),  # deep, alone in its parents
        str(root / "missing" / "thing"),  # under an entry that does not exist
        str(root / "f") + "/",  # a trailing slash
        "/elsewhere/x",  # under no grant
    ]
    grants = _plan._grants(Policy(name="t"), [str(root)], [], str(tmp_path / "ws"), hidden, [])
    read, list_dirs = _grants_walk([str(root)], hidden)
    assert [p for p in grants.read_exec if _plan._is_under(p, str(root))] == read
    assert [d for d in grants.list_dirs if _plan._is_under(d, str(root))] == list_dirs
    assert str(root / "a" / "b" / "y") in read and str(root / "a" / "b" / "c") not in read
    assert str(root / "a" / "z") not in read and str(root / "top") in read


@pytest.mark.parametrize(
    "pattern", ["/etc/*.key", "/etc/shadow", "/a?b", "/x[ab]", "/plain/path", "/dot.ted", "", "[", "/]"]
)
def test_the_glob_check_is_globs_own(pattern: str) -> None:
    assert _plan._has_magic(pattern) == glob.has_magic(pattern)


@pytest.mark.parametrize(
    "path", ["/etc/ssl/certs", "/etc", "/", "//x", "///", "/a//b", "/a/b/", "rel/x", "x", ""]
)
def test_the_rulesets_dirname_is_os_paths(path: str) -> None:
    from stockade.cell._layers import _dirname

    assert _dirname(path) == os.path.dirname(path)


def test_a_path_shows_the_host_where_the_last_mount_over_it_is_a_bind() -> None:
    from stockade.cell._layers import _covers, _shows_host
    from stockade.cell._plan import MountOp

    mounts = (
        MountOp("bind", "/etc", src="/etc"),
        MountOp("decoy_dir", "/etc/ssh"),
        MountOp("bind", "/etc/ssh/keep", src="/etc/ssh/keep"),
        MountOp("symlink", "/etc/ssh/keep/link", src="/x"),
        MountOp("tmpfs", "/tmp"),
    )
    covers = _covers(mounts)
    shown = {p: _shows_host(covers, p) for p in ("/etc", "/etc/ssl", "/etc/ssh", "/etc/ssh/a", "/etc/sshd")}
    assert shown == {
        "/etc": True,
        "/etc/ssl": True,
        "/etc/ssh": False,
        "/etc/ssh/a": False,
        "/etc/sshd": True,
    }
    assert _shows_host(covers, "/etc/ssh/keep/link") and not _shows_host(covers, "/tmp/x")
    assert not _shows_host(covers, "/usr")


def test_a_run_hands_its_snapshot_the_protected_paths_it_would_note() -> None:
    from stockade.cell._cell import _inside

    protected = ("/w/.bashrc", "/w/.git/hooks", "/wx/.envrc", "/etc/hosts", "/w")
    assert _inside(protected, ("/w",)) == ("/w/.bashrc", "/w/.git/hooks")
    assert _inside(protected, ("/w/", "/etc")) == ("/w/.bashrc", "/w/.git/hooks", "/etc/hosts")
    assert _inside(protected, ()) == ()  # a fresh workspace, not walked: nothing looked up
