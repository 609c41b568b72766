"""The connect supervisor's two kernel parts, each on its own: the cgroup BPF
guard and the seccomp user-notification filter. Real kernel, no cell (the
cells are in tests/escapes/test_unix_sockets.py)."""

from __future__ import annotations

import ctypes
import errno
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.cell import _seccomp as seccomp
from stockade.cell import _unotify
from stockade.cell._cgroup import CellCgroup
from stockade.cell._syscall import SYS_SECCOMP, set_no_new_privs, syscall
from stockade.cell._syscall_table import SYSCALLS
from stockade.policy._model import Limits
from tests.cell._child import run_in_child
from tests.cell.test_seccomp import run_bpf


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    path = str(tmp_path / "host.sock")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(path)
        s.listen(8)
        yield path, s


def test_notify_filter_sends_connect_and_nothing_else() -> None:
    program = seccomp.build_notify_filter()
    assert run_bpf(program, SYSCALLS["connect"]) == seccomp.SECCOMP_RET_USER_NOTIF
    for name in ("socket", "sendto", "sendmsg", "bind", "accept4", "read"):
        assert run_bpf(program, SYSCALLS[name]) == seccomp.SECCOMP_RET_ALLOW, name


def test_guard_refuses_the_cells_socket_but_not_the_supervisor(listener: tuple[str, socket.socket]) -> None:
    """A process in a guarded cgroup cannot connect its unix socket (EPERM, the
    kernel's own copy of the address); this process, the supervisor, connects
    that very socket. What closes the race of a unix socket dup2'd onto a
    descriptor number the supervisor let through as TCP."""
    path, srv = listener
    cg = CellCgroup.create("c-guard-" + os.urandom(4).hex(), Limits())
    try:
        _unotify.attach_guard(cg.paths[0])
        r, w = socket.socketpair()

        def child() -> object:
            with open(cg.procs_files()[0], "w") as f:
                f.write("0")
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect(path)
                got: object = "connected"
            except OSError as exc:
                got = exc.errno
            fresh = socket.socket(socket.AF_UNIX)
            socket.send_fds(w, [b"s"], [fresh.fileno()])
            return got

        got = run_in_child(child)
        _msg, fds, _flags, _addr = socket.recv_fds(r, 1, 1)
        r.close()
        w.close()
        assert got == errno.EPERM
        with socket.socket(fileno=fds[0]) as theirs:
            theirs.connect(path)  # the control: the supervisor's connect passes
            conn, _ = srv.accept()
            conn.close()
    finally:
        cg.destroy()


def test_a_closed_listener_fails_connects_closed() -> None:
    """If the supervisor is gone (its copy of the listener closed), a filtered
    connect fails with ENOSYS at once: closed, never hung, never let through."""

    def child() -> object:
        set_no_new_privs()
        program = seccomp.build_notify_filter()
        buffer = ctypes.create_string_buffer(program, len(program))

        class Fprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

        prog = Fprog(len(program) // 8, ctypes.addressof(buffer))
        fd = syscall(
            SYS_SECCOMP,
            seccomp.SECCOMP_SET_MODE_FILTER,
            seccomp.SECCOMP_FILTER_FLAG_NEW_LISTENER,
            ctypes.byref(prog),
        )
        os.close(fd)
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect("/nonexistent-stockade-test")
        except OSError as exc:
            return exc.errno
        return "connected"

    assert run_in_child(child) == errno.ENOSYS
