"""Cell cgroups on this host: real limits, real kills, nothing left behind.

Every process a test starts joins the cell the way the launcher's child does:
it writes ``0`` to each of ``procs_files()`` between fork and exec. Waits are
bounded and wait on the thing itself (a pipe, a pidfd, ``cgroup.events``).
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.cell import _cgroup
from stockade.cell._cgroup import (
    PARENT,
    CellCgroup,
    CgroupLayout,
    Hierarchy,
    KillMechanism,
    layout,
    sweep_stale,
)
from stockade.errors import CellError, HostError
from stockade.policy._model import Limits

BOUND = 30.0
"""Seconds any single wait in these tests may take before it counts as a failure."""

MiB = 1024 * 1024


def _controller_dirs() -> list[str]:
    """Every ``<own>/stockade`` directory a cell could use on this host."""
    lay = layout()
    owns = {h.own for h in lay.v1.values()}
    if lay.v2 is not None:
        owns.add(lay.v2.own)
    return sorted(f"{own}/{PARENT}" for own in owns)


def _ours() -> list[str]:
    """Cell cgroups this test process owns, in any hierarchy."""
    suffix = f"@{os.getpid()}"
    found = []
    for parent in _controller_dirs():
        try:
            found += [f"{parent}/{e}" for e in os.listdir(parent) if e.endswith(suffix)]
        except FileNotFoundError:
            continue
    return found


def _has_limit(controller: str) -> bool:
    lay = layout()
    in_v2 = lay.v2 is not None and controller in lay.v2.controllers
    return in_v2 or controller in lay.v1


_spawned: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _nothing_left_behind() -> Iterator[None]:
    before = set(_ours())
    yield
    for proc in _spawned:
        if proc.stdout is not None:
            proc.stdout.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=BOUND)
    _spawned.clear()
    assert set(_ours()) == before, "a test left a cell cgroup behind"


def _spawn(cg: CellCgroup, code: str) -> subprocess.Popen[str]:
    files = cg.procs_files()

    def join() -> None:  # runs in the child between fork and exec, as the launcher's does
        for f in files:
            fd = os.open(f, os.O_WRONLY)
            os.write(fd, b"0")
            os.close(fd)

    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", textwrap.dedent(code)],
        preexec_fn=join,
        stdout=subprocess.PIPE,
        text=True,
    )
    _spawned.append(proc)
    return proc


def _readline(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], BOUND)
    assert ready, "the child said nothing within the bound"
    return proc.stdout.readline().strip()


def test_memory_hog_is_oom_killed_at_the_limit() -> None:
    if not _has_limit("memory"):
        pytest.skip("this host has no memory controller (v2 or v1)")
    cg = CellCgroup.create("mem", Limits(memory=64 * MiB))
    try:
        proc = _spawn(cg, "b = b'x' * (256 << 20)\nprint('survived')")
        out, _ = proc.communicate(timeout=BOUND)
        stats = cg.stats()
    finally:
        cg.destroy()
    assert proc.returncode == -9, out
    assert "survived" not in out
    assert stats.oom_killed
    assert stats.memory_peak is not None
    assert stats.memory_peak <= 64 * MiB + MiB


def test_fork_bomb_stops_at_the_pids_limit() -> None:
    if not _has_limit("pids"):
        pytest.skip("this host has no pids controller (v2 or v1)")
    cg = CellCgroup.create("bomb", Limits(pids=16))
    try:
        proc = _spawn(
            cg,
            """
            import errno, os, signal
            n = 0
            while n < 1000:
                try:
                    pid = os.fork()
                except OSError as e:
                    print("EAGAIN" if e.errno == errno.EAGAIN else f"errno {e.errno}", n)
                    break
                if pid == 0:
                    os.close(1)
                    signal.pause()
                n += 1
            else:
                print("no limit", n)
            """,
        )
        out, _ = proc.communicate(timeout=BOUND)
        stats = cg.stats()
        alive = cg.pids()
    finally:
        cg.destroy()
    assert out.split() == ["EAGAIN", "15"], out
    assert stats.pids_limit_hit
    assert len(alive) == 15  # the forked children; their parent has exited


def test_cpu_quota_throttles() -> None:
    if not _has_limit("cpu"):
        pytest.skip("this host has no cpu controller (v2 or v1)")
    cg = CellCgroup.create("cpu", Limits(cpu=0.05))
    try:
        proc = _spawn(
            cg,
            """
            import time
            while time.process_time() < 0.05:
                pass
            print("done")
            """,
        )
        out, _ = proc.communicate(timeout=BOUND)
        stats = cg.stats()
    finally:
        cg.destroy()
    assert out.strip() == "done"
    assert stats.cpu_throttled
    assert stats.cpu_usage_ns is not None
    assert stats.cpu_usage_ns >= 50_000_000
    assert not stats.oom_killed
    assert not stats.pids_limit_hit


DAEMON = """
import os, signal, sys
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        print(os.getpid(), flush=True)
        os.close(1)
        signal.pause()
    os._exit(0)
os.wait()
"""


def _layout_for(mechanism: KillMechanism) -> CgroupLayout | None:
    """A view of this host that makes ``kill`` use ``mechanism``."""
    lay = layout()
    if mechanism in ("cgroup.kill", "cgroup.freeze"):
        return None if lay.v2 is not None else pytest.skip("this host has no cgroup v2")
    if mechanism == "freezer":
        if "freezer" not in lay.v1:
            pytest.skip("this host has no cgroup v1 freezer")
        return lay._replace(v2=None)
    if "pids" not in lay.v1:
        pytest.skip("this host has no cgroup v1 pids hierarchy to hold the cell")
    return CgroupLayout(None, {"pids": lay.v1["pids"]})


@pytest.mark.parametrize("mechanism", ["cgroup.kill", "cgroup.freeze", "freezer", "signals"])
def test_kill_ends_a_double_forked_daemon(mechanism: KillMechanism, monkeypatch: pytest.MonkeyPatch) -> None:
    lay = _layout_for(mechanism)
    limits = Limits(pids=64) if lay is not None else Limits()
    cg = CellCgroup.create(f"daemon-{mechanism}", limits, _layout=lay)
    if mechanism == "freezer":
        freezer = layout().v1["freezer"].own
        assert any(p.startswith(freezer) for p in cg.paths)  # joined only for this
    monkeypatch.setattr(CellCgroup, "_kill_mechanism", lambda self: mechanism)
    try:
        proc = _spawn(cg, DAEMON)
        daemon = int(_readline(proc))
        assert proc.wait(timeout=BOUND) == 0
        pidfd = os.pidfd_open(daemon)
        try:
            assert cg.pids() == [daemon]  # it left its parent but not the cell
            cg.kill()
            exited, _, _ = select.select([pidfd], [], [], BOUND)
        finally:
            os.close(pidfd)
        assert exited, f"daemon {daemon} outlived kill() by {mechanism}"
        assert cg.pids() == []
    finally:
        cg.destroy()


def test_kill_ends_a_fork_loop_at_once() -> None:
    # A process that forks as fast as it can must not outrun the kill.
    cg = CellCgroup.create("forkloop", Limits(pids=256) if _has_limit("pids") else Limits())
    try:
        proc = _spawn(
            cg,
            """
            import os
            print("go", flush=True)
            while True:
                try:
                    if os.fork() == 0:
                        continue
                except OSError:
                    pass
            """,
        )
        assert _readline(proc) == "go"
        cg.kill()
        assert proc.wait(timeout=BOUND) == -9
        assert cg.pids() == []
    finally:
        cg.destroy()


def test_destroy_leaves_nothing_and_is_idempotent() -> None:
    limits = Limits(
        memory=128 * MiB if _has_limit("memory") else None,
        pids=32 if _has_limit("pids") else None,
        cpu=0.5 if _has_limit("cpu") else None,
    )
    cg = CellCgroup.create("gone", limits)
    assert all(os.path.isdir(p) for p in cg.paths)
    assert cg.name in {e for parent in _controller_dirs() for e in _listdir(parent)}
    proc = _spawn(cg, "import signal\nprint('in', flush=True)\nsignal.pause()")
    assert _readline(proc) == "in"
    cg.destroy()
    assert proc.wait(timeout=BOUND) == -9
    for parent in _controller_dirs():
        assert cg.name not in _listdir(parent), parent
    cg.destroy()  # a second destroy is a no-op
    assert not any(os.path.exists(p) for p in cg.paths)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []


def test_paths_nest_under_this_process_own_cgroups() -> None:
    cg = CellCgroup.create("nest", Limits(pids=8) if _has_limit("pids") else Limits())
    try:
        lay = layout()
        owns = {h.own for h in lay.v1.values()} | ({lay.v2.own} if lay.v2 else set())
        for path in cg.paths:
            parent = os.path.dirname(os.path.dirname(path))
            assert parent in owns, path
            assert os.path.basename(path) == f"nest@{os.getpid()}"
        assert cg.procs_files() == tuple(f"{p}/cgroup.procs" for p in cg.paths)
        if lay.v2 is not None:
            assert cg.paths[0].startswith(lay.v2.own)  # the v2 cgroup always exists
    finally:
        cg.destroy()


def test_add_moves_a_running_process_in() -> None:
    cg = CellCgroup.create("add", Limits())
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", "import signal; signal.pause()"],
        )
        try:
            cg.add(proc.pid)
            assert cg.pids() == [proc.pid]
        finally:
            cg.kill()
            assert proc.wait(timeout=BOUND) == -9
    finally:
        cg.destroy()


def test_a_duplicate_cell_id_is_refused_and_rolled_back() -> None:
    first = CellCgroup.create("dup", Limits())
    try:
        with pytest.raises(CellError, match="already exists"):
            CellCgroup.create("dup", Limits())
        assert all(os.path.isdir(p) for p in first.paths)
    finally:
        first.destroy()


@pytest.mark.parametrize("bad", ["", ".hidden", "a/b", "a\nb", "x" * 65, "café"])
def test_a_bad_cell_id_is_refused(bad: str) -> None:
    with pytest.raises(CellError, match="cell id"):
        CellCgroup.create(bad, Limits())


@pytest.mark.parametrize(
    ("limits", "feature"),
    [
        (Limits(memory=64 * MiB), "cgroup.memory"),
        (Limits(pids=10), "cgroup.pids"),
        (Limits(cpu=0.5), "cgroup.cpu"),
    ],
)
def test_a_limit_no_hierarchy_enforces_is_a_host_error(limits: Limits, feature: str) -> None:
    lay = layout()
    bare = CgroupLayout(
        v2=lay.v2._replace(controllers=(), enabled=()) if lay.v2 else None,
        v1={k: v for k, v in lay.v1.items() if k not in ("memory", "pids", "cpu")},
    )
    with pytest.raises(HostError) as info:
        CellCgroup.create("nolimit", limits, _layout=bare)
    assert info.value.feature == feature
    assert "subtree_control" in str(info.value)


def test_no_hierarchy_at_all_is_a_host_error() -> None:
    with pytest.raises(HostError) as info:
        CellCgroup.create("none", Limits(), _layout=CgroupLayout(None, {}))
    assert info.value.feature == "cgroup"


def test_v2_controllers_get_their_limits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # This host has no v2 memory/pids/cpu controllers, so the v2 files are
    # checked on a stand-in directory tree: which file gets which value.
    monkeypatch.setattr(_cgroup, "_swap_active", lambda: False)
    # Plain directories have no control files: let writes create them.
    monkeypatch.setattr(_cgroup, "_write", lambda path, value: Path(path).write_text(value))
    own = tmp_path / "own"
    own.mkdir()
    fake = CgroupLayout(
        v2=Hierarchy(2, str(tmp_path), str(own), ("cpu", "memory", "pids"), ("cpu",)),
        v1={},
    )
    cg = CellCgroup.create("v2", Limits(memory=64 * MiB, pids=20, cpu=1.5), _layout=fake)
    cell = Path(cg.paths[0])
    assert cell == own / PARENT / f"v2@{os.getpid()}"
    assert (own / "cgroup.subtree_control").read_text() == "+pids"  # memory went first
    assert (cell / "memory.max").read_text() == str(64 * MiB)
    assert (cell / "pids.max").read_text() == "20"
    assert (cell / "cpu.max").read_text() == "150000 100000"
    assert cg.paths == (str(cell),)  # no v1 hierarchy is needed


def test_discover_layout_matches_proc_self_cgroup() -> None:
    lay = _cgroup.discover_layout()
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    for line in lines:
        hid, names, path = line.split(":", 2)
        if hid == "0":
            assert lay.v2 is not None
            assert lay.v2.own.rstrip("/").endswith(path.rstrip("/"))
            continue
        for name in names.split(","):
            if name in lay.v1:
                assert lay.v1[name].own.rstrip("/").endswith(path.rstrip("/"))


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", "pass"])
    proc.wait(timeout=BOUND)
    return proc.pid


def test_sweep_stale_removes_a_crashed_run_leftovers() -> None:
    dead = _dead_pid()
    lay = layout()
    parents = [f"{lay.v2.own}/{PARENT}"] if lay.v2 else []
    if "pids" in lay.v1:
        parents.append(f"{lay.v1['pids'].own}/{PARENT}")
    empty = [f"{p}/crashed@{dead}" for p in parents]
    busy = [f"{p}/crashedbusy@{dead}" for p in parents]
    live = CellCgroup.create("alive", Limits())
    sleeper = None
    try:
        for d in (*empty, *busy):
            os.makedirs(d)
        sleeper = subprocess.Popen([sys.executable, "-I", "-S", "-c", "import signal; signal.pause()"])
        for d in busy:
            Path(d, "cgroup.procs").write_text(str(sleeper.pid))

        removed = sweep_stale()
        assert f"crashed@{dead}" in removed
        assert not any(os.path.exists(d) for d in empty)
        assert all(os.path.isdir(d) for d in busy)  # processes inside: kept without kill
        assert all(os.path.isdir(p) for p in live.paths)  # its owner (us) is alive

        removed = sweep_stale(kill=True)
        assert f"crashedbusy@{dead}" in removed
        assert sleeper.wait(timeout=BOUND) == -9
        assert not any(os.path.exists(d) for d in busy)
        assert all(os.path.isdir(p) for p in live.paths)
    finally:
        if sleeper is not None and sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait(timeout=BOUND)
        for d in (*empty, *busy):
            if os.path.isdir(d):
                os.rmdir(d)
        live.destroy()


def test_create_and_destroy_are_fast() -> None:
    # Not a timing assertion on one run: the median of many must stay far below
    # the launch budget (a few ms), or something is doing far too much work.
    import time

    limits = Limits(
        memory=2 * 1024 * MiB if _has_limit("memory") else None,
        pids=512 if _has_limit("pids") else None,
    )
    times = []
    for i in range(30):
        start = time.perf_counter()
        CellCgroup.create(f"fast{i}", limits).destroy()
        times.append(time.perf_counter() - start)
    times.sort()
    assert times[len(times) // 2] < 0.010, times


DELEGATED_CHILD = """
import os, sys
from stockade.cell import _cgroup
base, controller = sys.argv[1], sys.argv[2]
with open(f"{base}/cgroup.procs", "w") as f:  # a cgroup holding only this process
    f.write("0")
h = _cgroup.discover_layout().v2
assert h is not None and h.own == base, h
print(_cgroup._v2_enable(h, controller))
print(open("/proc/self/cgroup").read().splitlines()[-1])
print(_cgroup.discover_layout().v2.own)
"""


def test_v2_delegation_moves_this_process_to_a_leaf() -> None:
    # In a delegated v2 cgroup (systemd Delegate=yes) the process itself blocks
    # enabling controllers for children; it moves to a leaf when it is alone.
    # Shown here with whichever controller the v2 root offers (hugetlb here).
    lay = layout()
    if lay.v2 is None or not lay.v2.is_root or not lay.v2.controllers:
        pytest.skip("needs to run in the v2 root cgroup with a controller to delegate")
    controller = lay.v2.controllers[0]
    root = lay.v2.own
    was_enabled = controller in lay.v2.enabled
    base = f"{root}/stockade-delegation-test-{os.getpid()}"
    if not was_enabled:
        Path(root, "cgroup.subtree_control").write_text(f"+{controller}")
    os.mkdir(base)
    try:
        out = subprocess.run(
            [sys.executable, "-c", DELEGATED_CHILD, base, controller],
            capture_output=True,
            text=True,
            timeout=BOUND,
            check=True,
        ).stdout.splitlines()
        assert out[0] == "None"  # enabled, no reason to refuse
        assert out[1].endswith(f"/stockade-delegation-test-{os.getpid()}/{_cgroup.LEAF}")
        assert out[2] == base  # cells still nest under the delegated cgroup
        assert controller in Path(base, "cgroup.subtree_control").read_text().split()
        assert controller in Path(base, PARENT, "cgroup.subtree_control").read_text().split()
    finally:
        for d in (f"{base}/{PARENT}", f"{base}/{_cgroup.LEAF}", base):
            if os.path.isdir(d):
                os.rmdir(d)
        if not was_enabled:
            Path(root, "cgroup.subtree_control").write_text(f"-{controller}")
