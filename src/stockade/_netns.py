"""Sockets made inside another network namespace (a cell's), from outside it.

A socket belongs to the network namespace its creator was in when it was made,
for its whole life. So the daemon makes the gateway's listening sockets inside
a cell by moving one of its threads into the cell's namespace (``setns``, which
for a network namespace changes only the calling thread), making and binding
the sockets, and moving back. The cell's programs then reach them on their own
loopback while the code serving them runs outside the cell.

Python 3.11 has no ``os.setns`` (3.12 does), hence ctypes.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from stockade.errors import CellError

_libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNET = 0x40000000


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


@contextmanager
def inside(netns_fd: int) -> Iterator[None]:
    """Run the body with the calling thread in the network namespace ``netns_fd``.

    Raises:
        OSError: the thread could not enter the namespace.
    """
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _setns(netns_fd)
        try:
            yield
        finally:
            # Failing to return would leave this thread (and every socket it
            # makes later) in the cell's namespace: never carry on after that.
            try:
                _setns(home)
            except OSError as exc:  # pragma: no cover - the kernel refused to go back
                os.write(2, f"stockade: cannot leave a cell's network namespace: {exc}\n".encode())
                os._exit(70)
    finally:
        os.close(home)


@contextmanager
def inside_path(netns_path: str) -> Iterator[None]:
    """``inside`` the network namespace named by a path (``/run/netns/NAME``,
    ``/proc/PID/ns/net``).

    Raises:
        OSError: it cannot be opened or entered.
    """
    fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        with inside(fd):
            yield
    finally:
        os.close(fd)


def _open_own() -> int:
    try:
        return os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return -1


_HOST = _open_own()
"""The network namespace this module was first imported in: the host's, as a
rule (a program imports stockade before any of its threads enters a cell's or
a test's namespace). Kept open for ``initial``."""


@contextmanager
def initial() -> Iterator[None]:
    """Run the body in the host's network namespace (``_HOST``), if the calling
    thread is elsewhere.

    The kernel delivers audit records only to netlink sockets of the host's
    network namespace: a reader made by a thread that entered a test's or the
    demo's namespace (a daemon started from such a thread) would hear nothing.
    """
    with contextlib.ExitStack() as stack:
        if _HOST >= 0:
            try:
                mine = os.stat("/proc/thread-self/ns/net").st_ino
            except OSError:
                mine = -1
            if os.fstat(_HOST).st_ino != mine:
                with contextlib.suppress(OSError):
                    stack.enter_context(inside(_HOST))
        yield


def listen_in(
    netns_fd: int, addresses: Sequence[tuple[str, int]], *, backlog: int = 512
) -> list[socket.socket]:
    """Listening TCP sockets bound to ``addresses`` inside the namespace ``netns_fd``.

    Raises:
        CellError: a socket could not be made or bound there.
    """
    made: list[socket.socket] = []
    try:
        with inside(netns_fd):
            for host, port in addresses:
                family = socket.AF_INET6 if ":" in host else socket.AF_INET
                sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
                made.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                # Accepted sockets inherit it (Linux). asyncio sets it only on
                # sockets it makes itself; without it a small answer can wait
                # for the client's delayed ACK (40 ms).
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.bind((host, port))
                sock.listen(backlog)
                sock.setblocking(False)
    except OSError as exc:
        for sock in made:
            sock.close()
        raise CellError(
            f"could not open the gateway's sockets in the cell's network namespace: {exc}"
        ) from exc
    return made


__all__ = ["initial", "inside", "inside_path", "listen_in"]
