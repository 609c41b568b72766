"""A session's file calls: opened inside the cell by a child that shares the
init's memory, and forked only for what may wait at its open (a fifo, a
device, a lease), so that nothing in the cell can put the init to sleep."""

from __future__ import annotations

import errno
import hashlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.cell import Session
from stockade.errors import UsageError


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    ws = tmp_path / "ws"
    ws.mkdir()
    with Session(workspace=ws) as s:
        yield s


def test_a_fifo_read_waits_for_its_writer_and_the_session_goes_on(session: Session) -> None:
    """A blocking read of a fifo with no writer waits in a fork of its own:
    meanwhile the init serves other calls (an exec and a file call return),
    and the writer that comes later is what ends the read."""
    assert session.exec(["mkfifo", "pipe"]).returncode == 0
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(session.read_file("pipe")), daemon=True)
    reader.start()
    # While the read waits (it cannot have returned: nothing wrote yet):
    assert session.exec(["echo", "served"], timeout=20).stdout == b"served\n"
    session.write_file("plain.txt", b"also served")
    assert session.read_file("plain.txt") == b"also served"
    assert not got and reader.is_alive()
    writer = session.exec(["sh", "-c", "echo through > pipe"], timeout=20)
    reader.join(20)
    assert writer.returncode == 0 and got == [b"through\n"]


def test_a_fifo_write_waits_for_its_reader(session: Session) -> None:
    assert session.exec(["mkfifo", "pipe"]).returncode == 0
    done = threading.Event()
    threading.Thread(
        target=lambda: (session.write_file("pipe", b"to the reader\n"), done.set()), daemon=True
    ).start()
    reader = session.exec(["cat", "pipe"], timeout=20)
    assert done.wait(20)
    assert reader.stdout == b"to the reader\n" and not reader.timed_out


def test_fifty_mebibytes_each_way(session: Session) -> None:
    data = bytes(range(256)) * (50 << 12)  # 50 MiB
    session.write_file("big.bin", data)
    inside = session.exec(["sha256sum", "big.bin"])
    assert inside.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()
    assert session.read_file("big.bin") == data
    session.write_file("big.bin", b"short")  # replaced: truncated at the open
    assert session.read_file("big.bin") == b"short"


def test_a_file_the_user_may_not_read(session: Session) -> None:
    session.write_file("secret.txt", b"mine", mode=0o000)
    with pytest.raises(PermissionError):
        session.read_file("secret.txt")  # its owner, without CAP_DAC_OVERRIDE: what it means inside
    with pytest.raises(PermissionError):
        session.write_file("secret.txt", b"x")
    with pytest.raises(PermissionError):
        session.read_file("/etc/shadow")  # root:shadow 0640 on the host, as the cell's user
    # The same refusals by a command in the cell (the control: the file calls
    # mean what a program there meets), and the owner may chmod it back.
    assert session.exec(["cat", "secret.txt"]).returncode != 0
    assert session.exec(["cat", "/etc/shadow"]).returncode != 0
    assert session.exec(["chmod", "600", "secret.txt"]).returncode == 0
    assert session.read_file("secret.txt") == b"mine"


def test_a_symlink_out_of_the_view(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"host's")
    ws = tmp_path / "ws"
    ws.mkdir()
    with Session(workspace=ws) as s:
        links = f"ln -s {outside}/secret away && ln -s /etc/passwd passwd && ln -s notes.txt here"
        assert s.exec(["sh", "-c", links]).returncode == 0
        # The host file is not in the cell's view: through the link the cell
        # finds nothing, as `cat` there does.
        with pytest.raises(FileNotFoundError):
            s.read_file("away")
        with pytest.raises(FileNotFoundError):
            s.write_file("away", b"planted")
        assert (outside / "secret").read_bytes() == b"host's"
        # A link to a file the cell sees read-only: a read follows it, a write is refused.
        assert b"root:" in s.read_file("passwd")
        with pytest.raises(PermissionError):
            s.write_file("passwd", b"root::0:0::/:/bin/sh\n")
        s.write_file("here", b"through a link in the workspace")  # the control: a link that stays inside
        assert s.read_file("notes.txt") == b"through a link in the workspace"
    result = s.close()
    refused = [e for e in result.denials if "passwd" in str(e.detail)]
    assert refused and all(e.detail.get("session") == s.session_id for e in refused), result.denials


def test_devices_are_opened_by_a_fork_and_still_work(session: Session) -> None:
    assert session.read_file("/dev/null") == b""
    session.write_file("/dev/null", b"into nothing")
    with pytest.raises(UsageError, match="limit of 4096"):
        session.read_file("/dev/zero", limit=4096)  # endless: the limit ends it
    with pytest.raises(FileNotFoundError):
        session.read_file("/dev/no-such-device")


def test_a_lease_on_the_file_does_not_hold_the_session(session: Session) -> None:
    """A read lease makes an open for writing wait until its holder lets go
    (at most lease-break-time, 45 s): the init's child meets EWOULDBLOCK at
    once (it adds O_NONBLOCK) and a fork waits instead, so other calls are
    served meanwhile. The holder here takes the lease break's SIGIO and lets
    go only when told to."""
    session.write_file("leased.txt", b"before")
    holder = (
        "import fcntl, os, signal, time\n"
        "signal.signal(signal.SIGIO, lambda *_: open('broken', 'w').close())\n"
        "fd = os.open('leased.txt', os.O_RDONLY)\n"
        "fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)\n"
        "open('held', 'w').close()\n"
        "while not os.path.exists('release'): time.sleep(0.02)\n"
        "fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)\n"
        "time.sleep(60)\n"
    )
    session.write_file("holder.py", holder.encode())
    assert session.exec(["sh", "-c", "python3 holder.py > /dev/null 2>&1 &"]).returncode == 0
    wait = "for i in $(seq 200); do [ -e {0} ] && exit 0; sleep 0.05; done; exit 1"
    assert session.exec(["sh", "-c", wait.format("held")]).returncode == 0
    done = threading.Event()
    threading.Thread(
        target=lambda: (session.write_file("leased.txt", b"after"), done.set()), daemon=True
    ).start()
    assert session.exec(["sh", "-c", wait.format("broken")]).returncode == 0  # the write is waiting on it
    assert session.read_file("leased.txt") == b"before" and not done.is_set()  # served meanwhile
    session.write_file("release", b"")
    assert done.wait(20)
    assert session.read_file("leased.txt") == b"after"


def test_file_calls_from_many_threads_at_once(session: Session) -> None:
    results: dict[int, list[bytes]] = {}
    failures: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            mine = []
            for i in range(20):
                session.write_file(f"f-{n}", f"{n}-{i}".encode())
                mine.append(session.read_file(f"f-{n}"))
            results[n] = mine
        except BaseException as exc:  # handed to the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not failures, failures
    assert results == {n: [f"{n}-{i}".encode() for i in range(20)] for n in range(8)}


def test_a_nonblocking_write_to_a_fifo_with_no_reader_fails_at_once(session: Session) -> None:
    """With block=False a fifo is opened by the init's child itself: a read
    sees nothing, a write fails with ENXIO; the read's child let go of its
    end before the read returned (its "D"), so the write finds no reader."""
    assert session.exec(["mkfifo", "trap"]).returncode == 0
    for _ in range(5):
        assert session.read_file("trap", block=False) == b""
        with pytest.raises(OSError) as caught:
            session.write_file("trap", b"x", block=False)
        assert caught.value.errno == errno.ENXIO


def _resident_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_the_init_lets_go_of_the_launchers_memory(tmp_path: Path) -> None:
    """The init starts as a copy-on-write clone of this process: 64 MiB of
    ballast written here is resident in it too, until it unmaps the
    launcher's anonymous memory between calls (_session_init.h). Calls work
    the same after (its code, stack and the loaded objects' data are kept)."""
    ballast = bytearray(b"\x01") * (64 << 20)
    with Session(workspace=tmp_path) as s:
        assert s.exec(["echo", "before"]).stdout == b"before\n"
        init = s._init_pid
        assert init > 0

        # Relative to this process, not a fixed figure: a launcher that has
        # run a whole test suite keeps a large [heap] and many libraries'
        # data, which the init keeps too; the ballast is what must go.
        def dropped() -> bool:
            return _resident_kib(init) < _resident_kib(os.getpid()) - (48 << 10)

        for _ in range(500):  # bounded: 500 idle polls of the init's own figure
            if dropped():
                break
            threading.Event().wait(0.01)
        assert dropped(), (_resident_kib(init), _resident_kib(os.getpid()))
        assert _resident_kib(os.getpid()) > 64 << 10  # control: this process still holds it
        assert s.exec(["echo", "after"]).stdout == b"after\n"
        s.write_file("x.txt", b"still served")
        assert s.read_file("x.txt") == b"still served"
        assert s.exec(["sh", "-c", "exit 3"]).returncode == 3
    assert s.close().exit_code == 0
    del ballast


def test_an_open_that_waits_past_its_timeout_is_killed(session: Session) -> None:
    """A fifo with no writer: the opener (a fork in the call's process group)
    is killed at the call's timeout, so no reader of the fifo is left behind
    (a non-blocking write meets none: ENXIO), and the session goes on."""
    assert session.exec(["mkfifo", "nobody-writes"]).returncode == 0
    with pytest.raises(TimeoutError) as caught:
        session.read_file("nobody-writes", timeout=0.5)
    assert caught.value.errno == errno.ETIMEDOUT and "nobody-writes" in str(caught.value)
    with pytest.raises(OSError) as none_left:
        session.write_file("nobody-writes", b"x", block=False)
    assert none_left.value.errno == errno.ENXIO
    assert session.exec(["mkfifo", "nobody-reads"]).returncode == 0
    with pytest.raises(TimeoutError):
        session.write_file("nobody-reads", b"x", timeout=0.5)
    # No opener is left in the cell: its processes are the init and this one.
    alive = "import os; print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()) == [1, os.getpid()])"
    assert session.exec(["python3", "-c", alive]).stdout == b"True\n"
    session.write_file("plain.txt", b"fine", timeout=0.5)  # the control: nothing waits, nothing times out
    assert session.read_file("plain.txt", timeout=0.5) == b"fine"
    with pytest.raises(UsageError, match="timeout"):
        session.read_file("plain.txt", timeout=0)


def test_a_mapped_file_cut_short_in_the_launcher_does_not_fault_the_init(tmp_path: Path) -> None:
    """The init reads the ELF headers of what the launcher has mapped from
    offset 0 (to keep the loaded objects' segments); a mapped file truncated
    since would SIGBUS a plain read of its first page, so the init reads
    through a pipe (EFAULT instead). A mapping of an ELF object truncated
    under this process: the session starts, serves and ends all the same."""
    import mmap

    victim = tmp_path / "cut.so"
    victim.write_bytes(Path("/bin/true").read_bytes()[:65536].ljust(65536, b"\0"))
    with open(victim, "r+b") as f:
        mapped = mmap.mmap(f.fileno(), 65536)
    os.truncate(victim, 0)
    try:
        with Session(workspace=tmp_path) as s:
            assert s.exec(["echo", "served"]).stdout == b"served\n"
            s.write_file("after.txt", b"and files")
            assert s.read_file("after.txt") == b"and files"
        assert s.close().exit_code == 0
    finally:
        mapped.close()
