"""Landlock for the cell: the prepared masks (pure), the exec closure, and the
rules on the real kernel, in a forked child that applies them and reports back
through a pipe. Every refused attempt is paired with its legitimate neighbour.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import socket
import struct
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stockade.cell import _landlock as ll
from stockade.cell._landlock import LandlockRules, exec_closure, landlock_abi, prepare, resolve
from stockade.errors import HostError
from tests.cell._child import run_in_child

ABI = landlock_abi()


def needs_abi(abi: int, what: str) -> pytest.MarkDecorator:
    linux = {1: "5.13", 3: "6.2", 4: "6.7", 6: "6.12", 7: "6.15"}[abi]
    return pytest.mark.skipif(abi > ABI, reason=f"host lacks Landlock ABI {abi} ({what}, Linux ≥ {linux})")


LOG = ABI >= 7


def fs_rules(**kwargs: Any) -> LandlockRules:
    """Rules without scopes (and without logging below ABI 7), so that a test of
    one feature needs no more than that feature's ABI."""
    defaults: dict[str, Any] = {
        "scope_signals": False,
        "scope_abstract_unix": False,
        "log_denials": LOG,
    }
    return LandlockRules(**(defaults | kwargs))


# --- running code under Landlock ------------------------------------------------------


def confined(rules: LandlockRules, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a child restricted by ``rules``."""
    prepared = prepare(rules, ABI)

    def child() -> Any:
        ll.apply(prepared)
        return fn()

    return run_in_child(child)


def err(fn: Callable[[], object]) -> int:
    """0 if ``fn()`` succeeds, else the errno of the OSError it raised."""
    try:
        fn()
    except OSError as exc:
        assert exc.errno is not None
        return exc.errno
    return 0


def exec_status(path: str, *args: str) -> int:
    """Exit code of ``path`` run in a grandchild; 100 + errno if execve failed."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the grandchild
        try:
            os.execv(path, [path, *args])
        except OSError as exc:
            os._exit(100 + (exc.errno or 0))
        finally:
            os._exit(99)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


# --- prepare: pure -----------------------------------------------------------------------


class TestPrepare:
    @pytest.mark.parametrize(
        "abi,size,handled",
        [
            (1, 8, (1 << 13) - 1),
            (2, 8, (1 << 14) - 1),
            (3, 8, (1 << 15) - 1),
            (4, 16, (1 << 15) - 1),
            (5, 16, (1 << 16) - 1),
            (6, 24, (1 << 16) - 1),
            (7, 24, (1 << 16) - 1),
            (9, 24, (1 << 16) - 1),
        ],
    )
    def test_ruleset_handles_everything_the_abi_knows(self, abi: int, size: int, handled: int) -> None:
        rules = LandlockRules(
            write=("/w",),
            scope_signals=abi >= 6,
            scope_abstract_unix=abi >= 6,
            log_denials=abi >= 7,
        )
        prepared = prepare(rules, abi)
        assert len(prepared.ruleset_attr) == size
        fields = struct.unpack(f"={size // 8}Q", prepared.ruleset_attr)
        assert fields[0] == handled
        if abi >= 4:
            assert fields[1] == ll.ACCESS_NET_BIND_TCP | ll.ACCESS_NET_CONNECT_TCP
        if abi >= 6:
            assert fields[2] == ll.SCOPE_SIGNAL | ll.SCOPE_ABSTRACT_UNIX_SOCKET
        [(path, on_dir, on_file)] = prepared.paths
        assert path == b"/w"
        # every right but execute, and no device nodes (recorded refusals)
        assert on_dir == handled & ~ll.ACCESS_FS_EXECUTE & ~(ll.ACCESS_FS_MAKE_CHAR | ll.ACCESS_FS_MAKE_BLOCK)
        assert on_file == on_dir & ll.ACCESS_FILE
        assert prepared.restrict_flags == (ll.RESTRICT_SELF_LOG_NEW_EXEC_ON if abi >= 7 else 0)

    def test_logging_keeps_same_exec_and_adds_new_exec(self) -> None:
        prepared = prepare(LandlockRules(), 7)
        assert prepared.restrict_flags & ll.RESTRICT_SELF_LOG_NEW_EXEC_ON
        assert not prepared.restrict_flags & ll.RESTRICT_SELF_LOG_SAME_EXEC_OFF
        assert not prepared.restrict_flags & ll.RESTRICT_SELF_LOG_SUBDOMAINS_OFF
        quiet = prepare(LandlockRules(log_denials=False), 7)
        assert quiet.restrict_flags == 0

    @pytest.mark.parametrize(
        "rules,abi,feature,fix",
        [
            (
                LandlockRules(scope_signals=False, scope_abstract_unix=False, log_denials=False),
                0,
                "landlock",
                "5.13",
            ),
            (
                LandlockRules(connect_tcp=(443,), scope_signals=False, scope_abstract_unix=False),
                3,
                "landlock.net",
                "6.7",
            ),
            (
                LandlockRules(bind_tcp=(0,), scope_signals=False, scope_abstract_unix=False),
                3,
                "landlock.net",
                "6.7",
            ),
            (LandlockRules(scope_abstract_unix=False), 5, "landlock.scope", "6.12"),
            (LandlockRules(scope_signals=False), 5, "landlock.scope", "6.12"),
            (LandlockRules(), 6, "landlock.audit", "6.15"),
        ],
    )
    def test_missing_feature_is_a_host_error(
        self, rules: LandlockRules, abi: int, feature: str, fix: str
    ) -> None:
        with pytest.raises(HostError) as info:
            prepare(rules, abi)
        assert info.value.feature == feature
        assert f"Linux ≥ {fix}" in str(info.value)
        assert f"ABI {abi}" in str(info.value) or "no Landlock" in str(info.value)

    @pytest.mark.parametrize(
        "rules,abi,size",
        [
            (fs_rules(read=("/",), log_denials=False), 1, 8),
            (fs_rules(connect_tcp=(443,), log_denials=False), 4, 16),
            (LandlockRules(scope_abstract_unix=False, log_denials=False), 6, 24),
            (LandlockRules(), 7, 24),
        ],
    )
    def test_the_neighbours_of_missing_features_prepare(
        self, rules: LandlockRules, abi: int, size: int
    ) -> None:
        prepared = prepare(rules, abi)
        assert prepared.abi == abi
        assert len(prepared.ruleset_attr) == size

    @pytest.mark.parametrize(
        "rules,message",
        [
            (LandlockRules(read=("etc",)), "not absolute"),
            (LandlockRules(connect_tcp=(65536,)), "out of range"),
            (LandlockRules(bind_tcp=(-1,)), "out of range"),
        ],
    )
    def test_bad_values(self, rules: LandlockRules, message: str) -> None:
        with pytest.raises(ValueError, match=message):
            prepare(rules, 7)

    def test_ports_merge_connect_and_bind(self) -> None:
        prepared = prepare(LandlockRules(connect_tcp=(80, 8080), bind_tcp=(8080,)), 7)
        assert sorted(struct.unpack("=QQ", p) for p in prepared.ports) == [
            (ll.ACCESS_NET_CONNECT_TCP, 80),
            (ll.ACCESS_NET_CONNECT_TCP | ll.ACCESS_NET_BIND_TCP, 8080),
        ]

    @given(
        lists=st.lists(
            st.lists(st.sampled_from(["/a", "/a/b", "/c", "/bin/true"]), max_size=3),
            min_size=5,
            max_size=5,
        ),
        abi=st.integers(1, 8),
    )
    def test_masks_follow_the_lists(self, lists: list[list[str]], abi: int) -> None:
        read, read_exec, write, write_exec, exec_files = (tuple(x) for x in lists)
        rules = LandlockRules(
            read=read,
            read_exec=read_exec,
            write=write,
            write_exec=write_exec,
            exec_files=exec_files,
            scope_signals=False,
            scope_abstract_unix=False,
            log_denials=False,
        )
        prepared = prepare(rules, abi)
        handled = struct.unpack_from("=Q", prepared.ruleset_attr)[0]
        by_path = {path.decode(): (d, f) for path, d, f in prepared.paths}
        assert set(by_path) == {p for group in lists for p in group}
        for path, (on_dir, on_file) in by_path.items():
            assert on_dir and on_dir & ~handled == 0
            assert on_file == on_dir & ll.ACCESS_FILE
            executes = path in read_exec + write_exec + exec_files
            writes = path in write + write_exec
            assert bool(on_dir & ll.ACCESS_FS_EXECUTE) is executes
            assert bool(on_dir & ll.ACCESS_FS_WRITE_FILE) is writes
            assert bool(on_dir & ll.ACCESS_FS_REMOVE_FILE) is writes
            assert on_dir & ll.ACCESS_FS_READ_FILE


# --- exec closure ------------------------------------------------------------------------


def _copy_elf(dst: Path) -> None:
    shutil.copy("/bin/true", dst)
    dst.chmod(0o755)


class TestExecClosure:
    def test_elf_adds_its_interpreter(self) -> None:
        closure = exec_closure(["/bin/true"])
        assert closure == (
            os.path.realpath("/bin/true"),
            os.path.realpath("/lib64/ld-linux-x86-64.so.2"),
        )

    def test_script_adds_its_interpreter_chain(self, tmp_path: Path) -> None:
        script = tmp_path / "run.sh"
        script.write_text("#!/bin/sh -e\nexit 3\n")
        closure = exec_closure([str(script)])
        assert closure == (
            str(script),
            os.path.realpath("/bin/sh"),
            os.path.realpath("/lib64/ld-linux-x86-64.so.2"),
        )

    def test_env_script_adds_the_named_program(self, tmp_path: Path) -> None:
        script = tmp_path / "tool"
        script.write_text("#!/usr/bin/env -S sh -e\necho\n")
        closure = exec_closure([str(script)])
        assert os.path.realpath("/usr/bin/env") in closure
        assert os.path.realpath("/bin/sh") in closure

    def test_resolves_inside_the_given_root(self, tmp_path: Path) -> None:
        root = tmp_path / "root"
        (root / "usr/bin").mkdir(parents=True)
        (root / "bin").symlink_to("usr/bin")
        _copy_elf(root / "usr/bin/real")
        (root / "usr/bin/tool").symlink_to("/usr/bin/real")  # absolute: inside the root
        (root / "usr/bin/script").write_text("#!/bin/tool\n")
        closure = exec_closure(["/bin/script"], root=str(root))
        # The interpreter of the ELF is not in the fake root: kept as named.
        assert closure == (
            "/usr/bin/script",
            "/usr/bin/real",
            "/lib64/ld-linux-x86-64.so.2",
        )

    def test_missing_and_unreadable_files_are_kept_unexpanded(self, tmp_path: Path) -> None:
        assert exec_closure(["/nonexistent/tool", "/nonexistent/tool"]) == ("/nonexistent/tool",)
        data = tmp_path / "data"
        data.write_bytes(b"\x7fELF" + b"\0" * 8)  # truncated header
        assert exec_closure([str(data)]) == (str(data),)

    @pytest.mark.parametrize(
        "path", ["/bin/sh", "/lib64/ld-linux-x86-64.so.2", "/usr/bin/../bin/true", "/nope/x"]
    )
    def test_resolve_matches_realpath_on_the_host(self, path: str) -> None:
        assert resolve(path) == os.path.realpath(path)

    def test_resolve_never_leaves_the_root(self, tmp_path: Path) -> None:
        (tmp_path / "up").symlink_to("../../../../../etc")
        (tmp_path / "abs").symlink_to("/etc")
        assert resolve("/up/passwd", str(tmp_path)) == "/etc/passwd"
        assert resolve("/abs/passwd", str(tmp_path)) == "/etc/passwd"
        assert resolve("/../../x", str(tmp_path)) == "/x"

    def test_resolve_stops_symlink_loops(self, tmp_path: Path) -> None:
        (tmp_path / "loop").symlink_to("loop")
        with pytest.raises(OSError) as info:
            resolve("/loop", str(tmp_path))
        assert info.value.errno == errno.ELOOP


# --- the real kernel -------------------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for name in ("ro/sub", "rw", "secret"):
        (tmp_path / name).mkdir(parents=True)
    (tmp_path / "ro/file.txt").write_text("hello")
    (tmp_path / "secret/key").write_text("s3cret")
    (tmp_path / "solo.txt").write_text("solo")
    (tmp_path / "other.txt").write_text("other")
    return tmp_path


@needs_abi(1, "Landlock")
class TestFilesystem:
    def test_abi_is_cached(self) -> None:
        assert landlock_abi() == ABI >= 1
        assert ll._abi == ABI

    def test_read_allowed_and_denied(self, tree: Path) -> None:
        rules = fs_rules(read=(str(tree / "ro"),))

        def attempt() -> dict[str, Any]:
            return {
                "read ro": (tree / "ro/file.txt").read_text(),
                "list ro": sorted(os.listdir(tree / "ro")),
                "read secret": err(lambda: (tree / "secret/key").read_text()),
                "list secret": err(lambda: os.listdir(tree / "secret")),
                "read sibling file": err(lambda: (tree / "other.txt").read_text()),
            }

        assert confined(rules, attempt) == {
            "read ro": "hello",
            "list ro": ["file.txt", "sub"],
            "read secret": errno.EACCES,
            "list secret": errno.EACCES,
            "read sibling file": errno.EACCES,
        }

    @needs_abi(3, "truncate")
    def test_write_denied_under_read_only_and_allowed_under_write(self, tree: Path) -> None:
        rules = fs_rules(read=(str(tree / "ro"),), write=(str(tree / "rw"),))

        def writes(base: Path, source: Path) -> dict[str, int]:
            target = base / "file.txt"
            return {
                "create": err(lambda: (base / "new.txt").write_text("x")),
                "overwrite": err(lambda: target.write_text("changed")),
                "truncate": err(lambda: os.truncate(target, 0)),
                "rename": err(lambda: os.rename(target, base / "renamed.txt")),
                "mkdir": err(lambda: os.mkdir(base / "dir")),
                "symlink": err(lambda: os.symlink("/etc/passwd", base / "link")),
                "mkfifo": err(lambda: os.mkfifo(base / "fifo")),
                "hard link from outside": err(lambda: os.link(source, base / "hard")),
                "delete": err(lambda: os.unlink(base / "renamed.txt")),
            }

        def attempt() -> dict[str, dict[str, int]]:
            (tree / "rw/file.txt").write_text("mine")
            return {
                "ro": writes(tree / "ro", tree / "rw/file.txt"),
                "rw": writes(tree / "rw", tree / "ro/file.txt"),
            }

        (tree / "ro/renamed.txt").write_text("keep")  # so that "delete" fails for Landlock only
        result = confined(rules, attempt)
        assert result["ro"] == dict.fromkeys(result["ro"], errno.EACCES)
        allowed = {k: v for k, v in result["rw"].items() if k != "hard link from outside"}
        assert allowed == dict.fromkeys(allowed, 0)
        # A hard link to a read-only file made in the workspace: Landlock refuses
        # the reparenting (REFER) with EXDEV, as it does a rename across trees.
        assert result["rw"]["hard link from outside"] == errno.EXDEV
        assert (tree / "ro/file.txt").read_text() == "hello"
        assert sorted(os.listdir(tree / "ro")) == ["file.txt", "renamed.txt", "sub"]

    def test_a_file_rule_gets_file_rights_only(self, tree: Path) -> None:
        rules = fs_rules(write=(str(tree / "solo.txt"),))

        def attempt() -> dict[str, int]:
            return {
                "append solo": err(lambda: (tree / "solo.txt").open("a").write("+")),
                "read other": err(lambda: (tree / "other.txt").read_text()),
                "create sibling": err(lambda: (tree / "new.txt").write_text("x")),
            }

        assert confined(rules, attempt) == {
            "append solo": 0,
            "read other": errno.EACCES,
            "create sibling": errno.EACCES,
        }
        assert (tree / "solo.txt").read_text() == "solo+"

    def test_missing_paths_are_skipped(self, tree: Path) -> None:
        rules = fs_rules(
            read=(str(tree / "missing"), str(tree / "solo.txt/below"), str(tree / "ro")),
        )
        assert confined(rules, lambda: (tree / "ro/file.txt").read_text()) == "hello"

    def test_exec_only_for_exec_files(self) -> None:
        rules = fs_rules(read=("/",), exec_files=exec_closure(["/bin/true"]))

        def attempt() -> dict[str, int]:
            return {"true": exec_status("/bin/true"), "ls": exec_status("/bin/ls", "-d", "/")}

        assert confined(rules, attempt) == {"true": 0, "ls": 100 + errno.EACCES}

    def test_read_exec_lets_everything_below_run(self) -> None:
        rules = fs_rules(read_exec=("/",))
        assert confined(rules, lambda: exec_status("/bin/ls", "-d", "/")) == 0

    def test_script_needs_its_interpreter(self, tmp_path: Path) -> None:
        script = tmp_path / "run.sh"
        script.write_text("#!/bin/sh\nexit 3\n")
        script.chmod(0o755)
        with_closure = fs_rules(read=("/",), exec_files=exec_closure([str(script)]))
        script_only = fs_rules(read=("/",), exec_files=(str(script),))
        assert confined(with_closure, lambda: exec_status(str(script))) == 3
        assert confined(script_only, lambda: exec_status(str(script))) == 100 + errno.EACCES


# --- network and scopes -------------------------------------------------------------------


@contextlib.contextmanager
def listener() -> Iterator[int]:
    """A TCP listener on 127.0.0.1; yields its port. Connections wait in the backlog."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield server.getsockname()[1]


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def connect(host: str, port: int) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        return s.connect_ex((host, port))


def bind(port: int) -> int:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        return err(lambda: s.bind(("127.0.0.1", port)))


@needs_abi(4, "TCP port rules")
class TestNetwork:
    def test_connect_only_to_the_listed_port(self) -> None:
        with listener() as allowed, listener() as other:
            rules = fs_rules(connect_tcp=(allowed,))

            def attempt() -> dict[str, int]:
                return {
                    "allowed": connect("127.0.0.1", allowed),
                    "other": connect("127.0.0.1", other),
                    "other via ::ffff:127.0.0.1": connect("::ffff:127.0.0.1", other),
                    "other via ::1": connect("::1", other),
                }

            assert run_in_child(lambda: connect("127.0.0.1", other)) == 0  # reachable unconfined
            assert confined(rules, attempt) == {
                "allowed": 0,
                "other": errno.EACCES,
                "other via ::ffff:127.0.0.1": errno.EACCES,
                "other via ::1": errno.EACCES,
            }

    def test_bind_only_the_listed_port(self) -> None:
        allowed, other = free_ports(2)
        rules = fs_rules(bind_tcp=(allowed,))

        def attempt() -> dict[str, int]:
            return {"allowed": bind(allowed), "other": bind(other), "ephemeral": bind(0)}

        assert confined(rules, attempt) == {
            "allowed": 0,
            "other": errno.EACCES,
            "ephemeral": errno.EACCES,
        }


@needs_abi(6, "scoping")
class TestScopes:
    def test_no_signal_outside_the_domain(self) -> None:
        def attempt() -> dict[str, int]:
            read_end, write_end = os.pipe()
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the grandchild waits to be killed
                os.close(write_end)
                os.read(read_end, 1)
                os._exit(0)
            os.close(read_end)
            result = {
                "outside": err(lambda: os.kill(os.getppid(), 0)),
                "inside": err(lambda: os.kill(pid, signal.SIGTERM)),
            }
            os.close(write_end)
            status = os.waitpid(pid, 0)[1]
            result["inside died of"] = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
            return result

        scoped = fs_rules(scope_signals=True)
        unscoped = fs_rules()
        assert confined(scoped, attempt) == {
            "outside": errno.EPERM,
            "inside": 0,
            "inside died of": signal.SIGTERM,
        }
        assert confined(unscoped, attempt)["outside"] == 0

    def test_no_abstract_unix_socket_outside_the_domain(self) -> None:
        name = f"\0stockade-test-{uuid.uuid4().hex}"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
            server.bind(name)
            server.listen(8)

            def attempt() -> dict[str, int]:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as inner:
                    inner.bind(name + "-inner")
                    inner.listen(1)
                    with socket.socket(socket.AF_UNIX) as a, socket.socket(socket.AF_UNIX) as b:
                        return {
                            "outside": a.connect_ex(name),
                            "inside": b.connect_ex(name + "-inner"),
                        }

            scoped = LandlockRules(scope_abstract_unix=True, scope_signals=False, log_denials=LOG)
            unscoped = LandlockRules(scope_abstract_unix=False, scope_signals=False, log_denials=LOG)
            assert confined(scoped, attempt) == {"outside": errno.EPERM, "inside": 0}
            assert confined(unscoped, attempt) == {"outside": 0, "inside": 0}
