"""The cell's hook for the gateway: sockets made in its network namespace from
outside, files and variables handed in. The gateway itself is tested in
tests/gateway; here a stand-in serves one line on the gateway's port."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from stockade._netns import listen_in
from stockade.cell import Cell
from stockade.cell._layers import GATEWAY_PORT, LLM_PORT
from stockade.errors import CellError
from stockade.policy import default_policy

PY = "/usr/bin/python3"


class LineServer:
    """Answers every connection on the cell's gateway port with one line."""

    def __init__(self, *, fail: bool = False) -> None:
        self.fail = fail
        self.attached: list[str] = []
        self.detached = 0
        self.served = 0

    def env(self) -> Mapping[str, str]:
        return {"GATEWAY_HINT": f"127.0.0.1:{GATEWAY_PORT}"}

    def files(self) -> Mapping[str, bytes]:
        return {"/run/stockade/lib/hello.txt": b"hello from the host\n"}

    def attach(self, cell_id: str, netns_fd: int) -> Callable[[], None]:
        if self.fail:
            raise CellError("the stand-in gateway refuses to start")
        self.attached.append(cell_id)
        (listener,) = listen_in(netns_fd, [("127.0.0.1", GATEWAY_PORT)])
        listener.setblocking(True)
        listener.settimeout(0.2)
        stop = threading.Event()

        def serve() -> None:
            while not stop.is_set():
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    continue
                with conn:
                    conn.sendall(b"gateway here\n")
                    self.served += 1

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()

        def detach() -> None:
            stop.set()
            thread.join()
            listener.close()
            self.detached += 1

        return detach


def _run(code: str, network: LineServer, tmp_path: Path) -> tuple[int, str, str]:
    with Cell(default_policy(), workspace=tmp_path, network=network) as cell:
        result = cell.run([PY, "-c", code])
    return result.exit_code, result.stdout.decode(), result.stderr.decode()


def test_a_socket_made_outside_answers_on_the_cells_loopback(tmp_path: Path) -> None:
    server = LineServer()
    code = (
        "import socket, os\n"
        f"s = socket.create_connection(('127.0.0.1', {GATEWAY_PORT}), timeout=5)\n"
        "print(s.recv(100).decode().strip(), os.environ['GATEWAY_HINT'])\n"
    )
    status, out, err = _run(code, server, tmp_path)
    assert (status, out) == (0, f"gateway here 127.0.0.1:{GATEWAY_PORT}\n"), err
    assert server.served == 1
    assert len(server.attached) == 1 and server.attached[0].startswith("c-")
    assert server.detached == 1


def test_the_listener_is_not_on_the_hosts_loopback(tmp_path: Path) -> None:
    class Probe(LineServer):
        def attach(self, cell_id: str, netns_fd: int) -> Callable[[], None]:
            detach = super().attach(cell_id, netns_fd)
            # A connect on the host's own loopback must not reach the socket
            # made in the cell's namespace (whatever else may answer there).
            probe = socket.socket()
            probe.settimeout(1)
            try:
                probe.connect_ex(("127.0.0.1", GATEWAY_PORT))
            finally:
                probe.close()
            return detach

    probe = Probe()
    status, _out, err = _run("pass", probe, tmp_path)
    assert status == 0, err
    assert probe.served == 0 and probe.detached == 1


def test_a_shown_file_is_readable_and_not_writable(tmp_path: Path) -> None:
    code = (
        "print(open('/run/stockade/lib/hello.txt').read().strip())\n"
        "import os; print(os.listdir('/run/stockade/lib'))\n"
        "try:\n    open('/run/stockade/lib/hello.txt', 'w')\n"
        "except OSError as e:\n    print('refused', e.errno)\n"
    )
    status, out, err = _run(code, LineServer(), tmp_path)
    assert status == 0, err
    assert out.splitlines() == ["hello from the host", "['hello.txt']", "refused 13"]


def test_the_llm_port_may_be_connected_to(tmp_path: Path) -> None:
    # Nothing listens there in this test: the connect must be refused by the
    # empty port (ECONNREFUSED, 111), not by Landlock (EACCES, 13).
    code = (
        "import socket\ns = socket.socket()\n"
        f"print(s.connect_ex(('127.0.0.1', {LLM_PORT})))\n"
        "t = socket.socket()\nprint(t.connect_ex(('127.0.0.1', 3130)))\n"
    )
    status, out, err = _run(code, LineServer(), tmp_path)
    assert status == 0, err
    assert out.split() == ["111", "13"]


def test_a_gateway_that_cannot_start_stops_the_cell_before_its_command(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    with (
        pytest.raises(CellError, match="refuses to start"),
        Cell(default_policy(), workspace=tmp_path, network=LineServer(fail=True)) as cell,
    ):
        cell.run(["/bin/sh", "-c", f"touch {marker}"])
    assert not marker.exists()


def test_accepted_gateway_sockets_do_not_wait_for_delayed_acks() -> None:
    """TCP_NODELAY on the listener, inherited by what it accepts: asyncio sets it
    only on sockets it makes, and uvicorn not at all."""
    import os

    from tests._netns import TestNetns

    with TestNetns() as ns:
        fd = os.open(ns.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            (listener,) = listen_in(fd, [("127.0.0.1", GATEWAY_PORT)])
        finally:
            os.close(fd)
        listener.setblocking(True)
        with ns.entered():
            client = socket.create_connection(("127.0.0.1", GATEWAY_PORT))
        accepted, _ = listener.accept()
        try:
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        finally:
            for sock in (accepted, client, listener):
                sock.close()


def test_kernel_refusals_are_heard_by_a_reader_made_inside_a_namespace(tmp_path: Path) -> None:
    """The kernel sends audit records to the host's network namespace only: a
    reader made by a thread inside another (a daemon started from a test's or the
    demo's namespace) must still open its socket in the host's."""
    from stockade.cell._audit import AuditReader
    from tests._netns import TestNetns

    made: list[AuditReader] = []
    with TestNetns() as ns:

        def make() -> None:
            with ns.entered():
                made.append(AuditReader())

        thread = threading.Thread(target=make)
        thread.start()
        thread.join()
    (reader,) = made
    reader.start()
    try:
        with Cell(default_policy(), workspace=tmp_path, audit=reader) as cell:
            result = cell.run(["/bin/sh", "-c", "cat /etc/shadow"])
        assert any("/etc/shadow" in e.summary for e in result.denials), result.events
    finally:
        reader.close()
