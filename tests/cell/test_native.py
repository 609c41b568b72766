"""The launcher's C children (``stockade.cell._native``): arguments are checked
before anything is forked, and the children keep the launcher's protocol and
promises (stages and errno in reports, exit codes, descriptors).

What a cell does is tested through ``Cell`` in test_cell.py and tests/escapes;
these tests drive ``launch`` directly, where the launcher itself is visible.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import shutil
import signal
import subprocess
import sysconfig
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import stockade.broker
import stockade.cell
from stockade.cell import Cell, _native
from stockade.cell._cell import _cap_last, _idmaps
from stockade.cell._launch import Launched, LaunchSpec, launch
from stockade.errors import CellError
from stockade.policy import default_policy

SOURCE = Path(stockade.cell.__file__).with_name("_native.c")
FASTREAD_SOURCE = Path(stockade.broker.__file__).with_name("_fastread.c")
"""The extension's source (present in a checkout, not in an installed wheel)."""


def _valid() -> dict[str, Any]:
    """Arguments spawn() accepts, pointing at nothing real (never forked here)."""
    return {
        "argv": ("/bin/true",),
        "env": (("PATH", "/usr/bin"),),
        "workdir": "/",
        "mounts": (("tmpfs", "/tmp", "", True, b"", (), -1, False),),
        "landlock": (b"\0" * 24, (b"\0" * 12,), ((b"/tmp", 1, 1),), (b"\0" * 16,), 0),
        "seccomp": ((b"\0" * 8, True),),
        "cgroup_procs": ("/sys/fs/cgroup/x/cgroup.procs",),
        "loginuid": 1000,
        "stdio": (0, 1, 2),
        "status_pipe": (1000, 1001),
        "go_pipe": (1002, 1003),
        "cap_last": 40,
        "keep_fds": (),
    }


def _children() -> set[int]:
    kids: set[int] = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                kids.update(int(pid) for pid in f.read().split())
        except FileNotFoundError:
            # A thread that ended meanwhile (the cgroup warm-up's ends a
            # second after a launch): its children went to another thread.
            continue
    return kids


BAD: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("argv not a tuple", {"argv": ["/bin/true"]}, TypeError, "argv must be a tuple"),
    ("argv empty", {"argv": ()}, ValueError, "argv must not be empty"),
    ("argv[0] empty", {"argv": ("",)}, ValueError, r"argv\[0\] must not be empty"),
    ("argv with NUL", {"argv": ("/bin/true", "a\0b")}, ValueError, "null"),
    ("argv of ints", {"argv": (1,)}, TypeError, "int"),
    ("env name with =", {"env": (("A=B", "c"),)}, ValueError, "illegal environment variable name"),
    ("env value with NUL", {"env": (("A", "b\0c"),)}, ValueError, "null"),
    ("env not pairs", {"env": ("A=B",)}, TypeError, "env entry"),
    (
        "unknown mount kind",
        {"mounts": (("aufs", "/x", "", False, b"", (), -1, False),)},
        ValueError,
        "kind",
    ),
    (
        "overlay without its layers",
        {"mounts": (("overlay", "/", "/img", True, b"", (), -1, False),)},
        ValueError,
        "overlay without an absolute image and upper",
    ),
    ("mount of 7 items", {"mounts": (("dir", "/x", "", False, b"", (), -1),)}, TypeError, "8 items"),
    ("relative dst", {"mounts": (("dir", "x", "", False, b"", (), -1, False),)}, ValueError, "absolute"),
    (
        "relative bind src",
        {"mounts": (("bind", "/x", "x", False, b"", (), -1, False),)},
        ValueError,
        "absolute",
    ),
    (
        "symlink without target",
        {"mounts": (("symlink", "/x", "", False, b"", (), -1, False),)},
        ValueError,
        "target",
    ),
    ("writable not a bool", {"mounts": (("dir", "/x", "", 1, b"", (), -1, False),)}, TypeError, "bool"),
    ("data not bytes", {"mounts": (("file", "/x", "", False, "text", (), -1, False),)}, TypeError, "bytes"),
    (
        "decoy name ..",
        {"mounts": (("decoy_dir", "/x", "", False, b"", ("a/../../etc",), -1, False),)},
        ValueError,
        "plain",
    ),
    (
        "decoy name absolute",
        {"mounts": (("decoy_dir", "/x", "", False, b"", ("/etc",), -1, False),)},
        ValueError,
        "plain",
    ),
    (
        "decoy name empty part",
        {"mounts": (("decoy_dir", "/x", "", False, b"", ("a//b",), -1, False),)},
        ValueError,
        "plain",
    ),
    (
        "userns fd below -1",
        {"mounts": (("bind", "/x", "/x", True, b"", (), -2, False),)},
        ValueError,
        "userns_fd",
    ),
    ("path too long", {"workdir": "/" + "x" * 5000}, ValueError, "longer than"),
    ("ruleset attr of 12 bytes", {"landlock": (b"\0" * 12, (), (), (), 0)}, ValueError, "8, 16 or 24"),
    ("rule of 8 bytes", {"landlock": (b"\0" * 8, (b"\0" * 8,), (), (), 0)}, ValueError, "12 bytes"),
    ("port of 12 bytes", {"landlock": (b"\0" * 8, (), (), (b"\0" * 12,), 0)}, ValueError, "16 bytes"),
    ("negative rights", {"landlock": (b"\0" * 8, (), ((b"/tmp", -1, 0),), (), 0)}, ValueError, "unsigned"),
    ("landlock a list", {"landlock": [b"\0" * 8, (), (), (), 0]}, TypeError, "landlock"),
    ("seccomp of 7 bytes", {"seccomp": ((b"\0" * 7, True),)}, ValueError, "BPF instructions"),
    ("seccomp too long", {"seccomp": ((b"\0" * 8 * 4097, True),)}, ValueError, "BPF instructions"),
    ("seccomp log not a bool", {"seccomp": ((b"\0" * 8, 1),)}, TypeError, "bool"),
    ("relative cgroup file", {"cgroup_procs": ("cgroup.procs",)}, ValueError, "absolute"),
    ("loginuid -1", {"loginuid": -1}, ValueError, "loginuid"),
    ("loginuid unset value", {"loginuid": 2**32 - 1}, ValueError, "loginuid"),
    ("two stdio fds", {"stdio": (0, 1)}, TypeError, "3 items"),
    ("negative fd", {"status_pipe": (-1, 5)}, ValueError, "status_pipe"),
    ("cap_last 64", {"cap_last": 64}, ValueError, "cap_last"),
    ("keep stdio", {"keep_fds": (2,)}, ValueError, "keep_fds"),
    ("keep a bool", {"keep_fds": (True,)}, TypeError, "keep_fds"),
]


@pytest.mark.parametrize(("changes", "error", "match"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_arguments_are_refused_before_forking(
    changes: dict[str, Any], error: type[Exception], match: str
) -> None:
    before = _children()
    with pytest.raises(error, match=match):
        _native.spawn(**{**_valid(), **changes})
    assert _children() == before


def test_every_argument_is_required_and_keyword_only() -> None:
    args = _valid()
    for name in args:
        partial = {k: v for k, v in args.items() if k != name}
        with pytest.raises(TypeError, match=f"missing required keyword argument '{name}'"):
            _native.spawn(**partial)
    with pytest.raises(TypeError):
        _native.spawn(("/bin/true",))  # type: ignore[misc]
    with pytest.raises(TypeError):
        _native.spawn(**args, extra=1)  # type: ignore[call-arg]


def test_a_value_the_kernel_cannot_take_is_a_cell_error(tmp_path: Path) -> None:
    with (
        Cell(workspace=tmp_path, audit=None) as cell,
        pytest.raises(CellError, match="cannot start the cell"),
    ):
        cell.run(["/bin/echo", "a\0b"])


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no C compiler on this host")
@pytest.mark.skipif(not SOURCE.exists(), reason="an installed package without its C source")
@pytest.mark.parametrize("source", [SOURCE, FASTREAD_SOURCE], ids=["_native.c", "_fastread.c"])
def test_the_source_compiles_without_warnings(tmp_path: Path, source: Path) -> None:
    # Both of the package's C extensions (setup.py builds them without -Werror).
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        pytest.skip(f"no Python headers in {include}")
    flags = ["-std=gnu11", "-Wall", "-Wextra", "-Wshadow", "-Wformat=2", "-Wno-missing-field-initializers"]
    result = subprocess.run(
        [
            "gcc",
            *flags,
            "-Werror",
            "-O2",
            "-fPIC",
            "-shared",
            f"-I{include}",
            str(source),
            "-o",
            str(tmp_path / "x.so"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr


# ------------------------------------------------------------- through launch()


@dataclasses.dataclass
class _Run:
    launched: Launched
    stdin_w: int
    stdout_r: int

    def output(self) -> bytes:
        chunks = []
        while chunk := os.read(self.stdout_r, 65536):
            chunks.append(chunk)
        return b"".join(chunks)

    def status(self) -> int:
        _, status = os.waitpid(self.launched.pid, 0)
        return os.waitstatus_to_exitcode(status)


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Any]:
    """Launch a cell on tmp_path through launch() alone (no cgroup, no audit)."""
    cell = Cell(default_policy("native"), workspace=tmp_path, audit=None)
    plan, landlock, seccomp = cell._prepared_plan()
    runs: list[_Run] = []

    def _start(argv: list[str], **changes: Any) -> _Run:
        stdin_r, stdin_w = os.pipe2(os.O_CLOEXEC)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        spec = LaunchSpec(
            argv=tuple(argv),
            plan=plan,
            cgroup_procs=(),
            landlock=landlock,
            seccomp=seccomp,
            audit_loginuid=None,
            stdin=stdin_r,
            stdout=out_w,
            stderr=out_w,
            cap_last=_cap_last(),
            idmap_userns=_idmaps(plan),
        )
        try:
            launched = launch(dataclasses.replace(spec, **changes))
        finally:
            os.close(stdin_r)
            os.close(out_w)
        run = _Run(launched, stdin_w, out_r)
        runs.append(run)
        return run

    yield _start
    for run in runs:
        for fd in (run.stdin_w, run.stdout_r):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.kill(run.launched.pid, signal.SIGKILL)
            os.waitpid(run.launched.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
    cell.close()


def test_the_launcher_holds_nothing_while_the_cell_runs(start: Any) -> None:
    """Once the command runs, C1 (which lives as long as the cell, outside its
    restrictions) holds no descriptor at all; the command holds its stdio only."""
    caller_fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)  # inheritable, as a careless caller's would be
    try:
        os.set_inheritable(caller_fd, True)
        run = start(["/bin/cat"])
        assert run.launched.exec_error is None
        assert os.listdir(f"/proc/{run.launched.pid}/fd") == []
        # Until cat blocks reading stdin, the dynamic loader may hold a library
        # open (fd 3, briefly): wait for read(0, …) (x86-64 syscall 0) first.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with open(f"/proc/{run.launched.init_pid}/syscall") as f:
                if f.read().split()[:2] == ["0", "0x0"]:
                    break
            time.sleep(0.005)
        assert sorted(int(fd) for fd in os.listdir(f"/proc/{run.launched.init_pid}/fd")) == [0, 1, 2]
        os.write(run.stdin_w, b"through\n")
        os.close(run.stdin_w)
        assert run.output() == b"through\n"
        assert run.status() == 0
    finally:
        os.close(caller_fd)


def _memory_holds(pid: int | str, needle: bytes) -> bool:
    """Whether a process's writable memory holds ``needle`` (read as root)."""
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if "w" not in perms or line.rstrip().endswith(("[vvar]", "[vsyscall]")):
                continue
            lo, hi = (int(x, 16) for x in span.split("-"))
            try:
                mem.seek(lo)
                if needle in mem.read(hi - lo):
                    return True
            except OSError:
                continue
    return False


@pytest.mark.parametrize("from_thread", [False, True], ids=["main-thread", "worker-thread"])
def test_the_cells_processes_hold_no_copy_of_the_callers_memory(start: Any, from_thread: bool) -> None:
    """C1 and the cell's init are forks of the caller, which may be a daemon
    holding credentials; they get only the spec, their stacks and the C
    library's data, never the Python heap (``lean_begin`` in _native.c). Fewer
    pages copied is also what makes a launch from a large process cheap."""
    small = b"stockade-secret-" + os.urandom(16).hex().encode()  # in Python's small-object arenas
    large = small * 20000  # its own mmap'd block
    shared = mmap.mmap(-1, 1 << 20)  # a shared mapping (multiprocessing's kind)
    shared[: len(small) + 1] = b"!" + small
    assert _memory_holds("self", small) and _memory_holds("self", large[:65536])  # the scan sees it here
    launched: list[Any] = []
    scanned = threading.Event()
    worker = None
    if from_thread:
        # As the daemon launches: from a worker thread, on its stack and TLS
        # (which lie beside other mappings). It stays until the scan is done:
        # the cell's death signal follows the thread that launched it.
        def launch_and_stay() -> None:
            launched.append(start(["/bin/cat"]))
            scanned.wait(30)

        worker = threading.Thread(target=launch_and_stay)
        worker.start()
        while not launched and worker.is_alive():
            time.sleep(0.01)
    else:
        launched.append(start(["/bin/cat"]))
    try:
        run = launched[0]
        assert run.launched.exec_error is None
        for pid in (run.launched.pid, run.launched.init_pid):
            assert not _memory_holds(pid, small), pid
        os.close(run.stdin_w)
        assert run.status() == 0
    finally:
        scanned.set()
        if worker is not None:
            worker.join()
    del large
    shared.close()


def test_kept_descriptors_reach_the_command(start: Any) -> None:
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    os.set_inheritable(write_end, True)  # kept from closing, not from O_CLOEXEC: the caller decides
    code = f"import os; os.write({write_end}, b'kept'); print(*os.listdir('/proc/self/fd'))"
    try:
        run = start(["/usr/bin/python3", "-I", "-c", code], keep_fds=(write_end,))
        os.close(run.stdin_w)
        listed = sorted(int(fd) for fd in run.output().split())
        assert os.read(read_end, 100) == b"kept"
        assert run.status() == 0
        assert len(listed) == 5 and {0, 1, 2, write_end} < set(listed)  # and the listing's own
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_killed_init_ends_the_launcher_with_128_plus_the_signal(start: Any) -> None:
    run = start(["/bin/cat"])
    os.kill(run.launched.init_pid, signal.SIGKILL)  # from the host: pid 1 cannot ignore it
    assert run.status() == 128 + signal.SIGKILL


@pytest.mark.parametrize(
    ("argv", "err", "message"),
    [
        (["no-such-command-anywhere"], 2, "no-such-command-anywhere: No such file or directory"),
        (["/usr"], 13, "/usr: Permission denied"),
        (["/etc/hostname"], 13, "/etc/hostname: Permission denied"),
    ],
)
def test_exec_errors_are_reported_with_stage_and_errno(
    start: Any, argv: list[str], err: int, message: str
) -> None:
    run = start(argv)
    assert run.launched.exec_error == ("exec", err, message)
    assert run.status() == 127


def test_a_failed_setup_step_names_its_stage_and_error(tmp_path: Path) -> None:
    policy = dataclasses.replace(default_policy("native"), workdir=str(tmp_path / "missing"))
    with Cell(policy, workspace=tmp_path, audit=None) as cell, pytest.raises(CellError) as caught:
        cell.run(["/bin/true"])
    assert str(caught.value) == (
        f"cell setup failed while entering the workdir: workdir {tmp_path}/missing: No such file or directory"
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="mapping another uid's range needs CAP_SETUID")
def test_userns_makes_a_mapped_namespace_without_a_fork() -> None:
    from stockade.cell import _native

    fd = _native.userns(b"0 1048577 65535\n", b"0 1048577 65535\n")
    try:
        assert os.readlink(f"/proc/self/fd/{fd}").startswith("user:[")
        # A namespace of its own, not this process's (a bad map is refused below).
        assert os.stat(f"/proc/self/fd/{fd}").st_ino != os.stat("/proc/self/ns/user").st_ino
    finally:
        os.close(fd)
    with pytest.raises(OSError):
        _native.userns(b"not a map\n", b"0 1048577 1\n")
