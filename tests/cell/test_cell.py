"""The Cell API: what a caller gets back, and what a cell does with its workspace,
environment, limits and lifecycle. Escapes live in tests/escapes/."""

from __future__ import annotations

import dataclasses
import os
import re
import stat
import threading
import time
from pathlib import Path

import pytest

from stockade.cell import Cell, CellResult
from stockade.cell._cell import WORKSPACES_ROOT
from stockade.errors import CellError
from stockade.policy import EnvPolicy, FilesystemPolicy, Limits, Policy, default_policy
from stockade.record import Event

PY = "/usr/bin/python3"


def _policy(**changes: object) -> Policy:
    return dataclasses.replace(default_policy("test"), **changes)  # type: ignore[arg-type]


def _reading(path: Path) -> Policy:
    """The test policy with ``path`` granted for reading besides its own."""
    fs = default_policy().filesystem
    return _policy(filesystem=FilesystemPolicy(read=(*fs.read, str(path)), deny=fs.deny, protect=fs.protect))


def test_exit_code_and_output_are_passed_through(tmp_path: Path) -> None:
    with Cell(workspace=tmp_path) as cell:
        result = cell.run(["/bin/sh", "-c", "echo out; echo err >&2; exit 7"])
    assert result.exit_code == 7
    assert result.stdout == b"out\n"
    assert result.stderr == b"err\n"
    kinds = [event.kind for event in result.events]
    assert kinds[0] == "cell.start" and kinds[-1] == "cell.end"
    assert result.events[-1].detail["exit_code"] == 7


def test_command_not_found_is_127_and_says_so(tmp_path: Path) -> None:
    with Cell(workspace=tmp_path) as cell:
        result = cell.run(["no-such-command-anywhere"])
    assert result.exit_code == 127
    assert b"no-such-command-anywhere" in result.stderr


def test_exec_outside_exec_allow_is_126_and_recorded(tmp_path: Path) -> None:
    policy = _policy(exec=dataclasses.replace(default_policy().exec, allow=("/usr/bin/python3",)))
    with Cell(policy, workspace=tmp_path) as cell:
        allowed = cell.run([PY, "-c", "print('hi')"])
        refused = cell.run(["/bin/ls"])
    assert allowed.exit_code == 0 and allowed.stdout == b"hi\n"
    assert refused.exit_code == 126
    assert any(
        e.layer == "landlock" and "fs.execute" in e.detail.get("blockers", []) for e in refused.denials
    ), refused.events


def test_workspace_is_at_the_same_path_and_writable(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "input.txt").write_text("from the host\n")
    with Cell(workspace=workspace) as cell:
        result = cell.run(
            ["/bin/sh", "-c", f"cd {workspace} && cat input.txt && echo made > output.txt && pwd"]
        )
    assert result.exit_code == 0, result.stderr
    assert result.stdout.decode().splitlines() == ["from the host", str(workspace)]
    assert (workspace / "output.txt").read_text() == "made\n"
    # A root-owned workspace is idmapped: what the agent makes belongs to root on disk.
    assert (workspace / "output.txt").stat().st_uid == workspace.stat().st_uid


def test_the_agent_is_uid_1000_with_no_capabilities(tmp_path: Path) -> None:
    with Cell(workspace=tmp_path) as cell:
        result = cell.run(["/bin/sh", "-c", "id -u; grep -E '^(Cap|NoNewPrivs)' /proc/self/status"])
    lines = result.stdout.decode().splitlines()
    assert lines[0] == "1000"
    fields = dict(line.split(":\t") for line in lines[1:])
    assert fields["NoNewPrivs"] == "1"
    for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(fields[name], 16) == 0, name


def test_fresh_workspace_is_made_and_removed(tmp_path: Path) -> None:
    cell = Cell()
    workspace = cell.workspace
    assert workspace.startswith(WORKSPACES_ROOT + "/")
    result = cell.run(["/bin/sh", "-c", 'echo x > "$HOME/f" && cat "$HOME/f"'])
    assert result.stdout == b"x\n"
    assert os.path.isdir(workspace)
    cell.close()
    assert not os.path.exists(workspace)


def test_environment_crosses_only_when_named(tmp_path: Path) -> None:
    environ = {"SECRET_TOKEN": "sk-do-not-leak", "VISIBLE": "yes", "HOME": "/root"}
    policy = _policy(env=EnvPolicy(passthrough=("VISIBLE",), set=(("FIXED", "1"),)))
    with Cell(policy, workspace=tmp_path, environ=environ) as cell:
        result = cell.run(["/usr/bin/env"])
    env = dict(line.split("=", 1) for line in result.stdout.decode().splitlines())
    assert env["VISIBLE"] == "yes"
    assert env["FIXED"] == "1"
    assert "SECRET_TOKEN" not in env
    assert b"sk-do-not-leak" not in result.stdout
    assert env["HOME"] == str(tmp_path.resolve())


def test_timeout_kills_the_cell_and_is_an_event(tmp_path: Path) -> None:
    # Also the test that a signal ending the cell's pid 1 is reported as
    # 128+N: a signal sent from inside cannot end a namespace's init.
    with Cell(workspace=tmp_path) as cell:
        result = cell.run(["/bin/sh", "-c", "sleep 30 & sleep 30"], timeout=0.5)
    assert result.timed_out
    assert "timeout" in result.limits_hit
    assert result.exit_code == 128 + 9
    assert any(e.kind == "cell.limit" and e.layer == "timeout" for e in result.events)


def test_output_past_the_limit_is_dropped_and_recorded(tmp_path: Path) -> None:
    policy = _policy(limits=Limits(output=1000, timeout=30))
    with Cell(policy, workspace=tmp_path) as cell:
        result = cell.run([PY, "-c", "import sys; sys.stdout.write('x' * 100000)"])
    assert result.exit_code == 0
    assert len(result.stdout) == 1000
    assert "output" in result.limits_hit
    assert any(e.kind == "cell.limit" and "output" in e.summary for e in result.events)


def test_on_output_streams_chunks(tmp_path: Path) -> None:
    chunks: list[tuple[int, bytes]] = []
    with Cell(workspace=tmp_path) as cell:
        result = cell.run(
            ["/bin/sh", "-c", "echo a; echo b >&2"], on_output=lambda s, d: chunks.append((s, d))
        )
    assert result.stdout == b"" and result.stderr == b""
    assert b"".join(d for s, d in chunks if s == 1) == b"a\n"
    assert b"".join(d for s, d in chunks if s == 2) == b"b\n"


def test_stdin_is_passed(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    os.write(write_end, b"hello\n")
    os.close(write_end)
    with Cell(workspace=tmp_path) as cell:
        result = cell.run(["/bin/cat"], stdin=read_end)
    os.close(read_end)
    assert result.stdout == b"hello\n"


def test_stockade_makes_nothing_in_the_workspace(tmp_path: Path) -> None:
    # No placeholder for a protected path that does not exist: git would give
    # it a meaning, ``git add -A`` would commit it (docs/CELL.md).
    with Cell(workspace=tmp_path, records=str(tmp_path.parent / "records")) as cell:
        inside = cell.run(["/bin/sh", "-c", "ls -A"])
    assert inside.stdout == b""
    assert os.listdir(tmp_path) == []


def test_existing_protected_file_keeps_its_content(tmp_path: Path) -> None:
    (tmp_path / ".bashrc").write_text("# mine\n")
    with Cell(workspace=tmp_path) as cell:
        result = cell.run(["/bin/sh", "-c", "echo evil >> .bashrc"])
    assert result.exit_code != 0
    assert (tmp_path / ".bashrc").read_text() == "# mine\n"


def test_extra_read_grant_is_readable_not_writable(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "data.txt").write_text("data")
    # Owned by the cell's host uid: file modes do not stop it; the read grant's
    # read-only mount does (EROFS, on record as layer mount).
    os.chown(shared / "data.txt", 65534, 65534)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    policy = _reading(shared)
    data = shared / "data.txt"
    with Cell(policy, workspace=workspace) as cell:
        result = cell.run(["/bin/sh", "-c", f"cat {shared}/data.txt; echo x >> {shared}/data.txt"])
    assert result.stdout == b"data"
    assert result.exit_code != 0
    assert (shared / "data.txt").read_text() == "data"
    assert any(
        e.layer == "mount" and e.detail.get("errno") == "EROFS" and e.detail.get("path") == str(data)
        for e in result.denials
    ), result.events


def test_python_reads_the_systems_bytecode_and_writes_none(tmp_path: Path) -> None:
    # A module in a read-only grant with no __pycache__: Python must not try
    # to write one (a refusal on record that nobody attempted), nor anywhere
    # else; and the standard library comes from its precompiled bytecode, not
    # compiled again at every start (a cache prefix in the per-run scratch did
    # that: 8 ms of every python3 in a cell).
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "helper.py").write_text("VALUE = 42\n")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "local.py").write_text("VALUE = 7\n")
    policy = _reading(shared)
    script = (
        f"import sys; sys.path[:0] = [{str(shared)!r}, '.']; "
        "import json, helper, local; print(helper.VALUE + local.VALUE)"
    )
    with Cell(policy, workspace=workspace) as cell:
        result = cell.run([PY, "-v", "-c", script])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == b"49\n"
    assert result.denials == (), result.denials
    # -v says where each module's code came from: a .pyc, or a compiled .py.
    assert re.search(rb"# code object from '/usr/lib/python3[.0-9]*/json/__pycache__/__init__", result.stderr)
    assert not re.search(rb"# code object from /usr/lib/python3[.0-9]*/json/__init__.py", result.stderr)
    assert not (shared / "__pycache__").exists() and not (workspace / "__pycache__").exists()


def test_audit_mode_lets_seccomp_refusals_through_and_records_them(tmp_path: Path) -> None:
    code = "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\nprint('udp socket made')\n"
    enforce = Cell(_policy(), workspace=tmp_path).run([PY, "-c", code])
    audit = Cell(_policy(mode="audit"), workspace=tmp_path).run([PY, "-c", code])
    assert enforce.exit_code != 0
    assert any(e.layer == "seccomp" and e.outcome == "denied" for e in enforce.events)
    assert audit.exit_code == 0 and audit.stdout == b"udp socket made\n"
    assert any(e.layer == "seccomp" and e.outcome == "audited" for e in audit.events), audit.events


def test_no_command_is_an_error() -> None:
    with Cell() as cell, pytest.raises(CellError, match="no command"):
        cell.run([])


def test_workspace_must_be_a_directory(tmp_path: Path) -> None:
    file = tmp_path / "file"
    file.write_text("")
    from stockade.errors import PolicyError

    with pytest.raises(PolicyError, match="not a directory"):
        Cell(workspace=file).run(["/bin/true"])


def test_nothing_of_the_cell_remains_after_it(tmp_path: Path) -> None:
    marker = tmp_path / "pid"
    # A duration no other program on the host would be sleeping for.
    seconds = f"60.{os.getpid()}{time.monotonic_ns() % 1000}"
    with Cell(workspace=tmp_path) as cell:
        result = cell.run(
            [
                "/bin/sh",
                "-c",
                f"(setsid sh -c 'echo $$ > {marker}.inner; exec sleep {seconds}' &) ; sleep 0.2; echo done",
            ]
        )
    assert result.stdout == b"done\n"
    # The daemon's pid is in the cell's namespace; find it on the host by its
    # command line instead: no `sleep 60` started by a cell may remain.
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            assert cmdline != f"sleep\x00{seconds}\x00".encode(), f"pid {entry} outlived its cell"


def test_the_cells_mount_namespace_is_gone_when_run_returns(tmp_path: Path) -> None:
    """The caller holds the cell's mount namespace so that its unmounting is
    not part of C1's exit (_launch._Releaser), and lets go of it before
    ``run`` returns: no descriptor of this process still names it."""
    with Cell(workspace=tmp_path) as cell:
        result = cell.run(["/bin/sh", "-c", "readlink /proc/self/ns/mnt"])
    cells_ns = result.stdout.decode().strip()
    assert cells_ns.startswith("mnt:[") and cells_ns != os.readlink("/proc/self/ns/mnt")
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            held.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue
    assert cells_ns not in held


def test_workspace_mode_is_untouched(tmp_path: Path) -> None:
    before = stat.S_IMODE(tmp_path.stat().st_mode)
    Cell(workspace=tmp_path).run(["/bin/true"])
    assert stat.S_IMODE(tmp_path.stat().st_mode) == before


def test_a_host_socket_and_variables_can_be_handed_to_the_cell(tmp_path: Path) -> None:
    import socket
    import threading

    path = str(tmp_path / "broker.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    os.chmod(path, 0o666)
    server.listen()
    got: list[bytes] = []

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            got.append(conn.recv(100))
            conn.sendall(b"pong")

    thread = threading.Thread(target=serve)
    thread.start()
    code = (
        "import os, socket\n"
        "s = socket.socket(socket.AF_UNIX); s.connect(os.environ['STOCKADE_BROKER'])\n"
        "s.sendall(b'ping ' + os.environ['STOCKADE_RUN'].encode()); print(s.recv(10).decode())\n"
    )
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with Cell(
        workspace=workspace,
        run_id="r-test",
        sockets={"/run/stockade/broker.sock": path},
        extra_env={"STOCKADE_BROKER": "/run/stockade/broker.sock", "STOCKADE_RUN": "r-test"},
    ) as cell:
        result = cell.run([PY, "-c", code])
    thread.join(timeout=10)
    server.close()
    assert result.exit_code == 0, result.stderr
    assert result.stdout == b"pong\n"
    assert got == [b"ping r-test"]
    assert {e.run for e in result.events} == {"r-test"}


def test_the_callers_umask_does_not_reach_the_view(tmp_path: Path) -> None:
    previous = os.umask(0o077)
    try:
        with Cell(workspace=tmp_path) as cell:
            result = cell.run(["/bin/sh", "-c", "umask; cat /etc/hostname; echo x > f && cat f"])
    finally:
        os.umask(previous)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == b"0022\nstockade\nx\n"


def test_a_policy_writing_slash_starts_and_never_writes_as_host_root(tmp_path: Path) -> None:
    """``write: [/]`` (AgentOS's ``allowed_paths: [/]``): the merged-/usr links in
    / could not have been planted by a cell, so the cell starts; and it acts as its
    own unprivileged uid there, never as root, so root's files stay as they are."""
    probe = f"/opt/stockade-probe-{os.getpid()}"
    policy = _policy(filesystem=FilesystemPolicy(read=default_policy().filesystem.read, write=("/",)))
    with Cell(policy, workspace=tmp_path) as cell:
        result = cell.run(["/bin/sh", "-c", f"touch {probe} 2>/dev/null; echo $?; ls /bin/sh"])
    assert result.stdout == b"1\n/bin/sh\n", result.stderr
    assert not os.path.exists(probe)


def test_kernel_refusals_reach_on_event_while_the_cell_runs(tmp_path: Path) -> None:
    # The cell is refused a write and a UDP socket, then blocks on stdin: the
    # refusals must arrive while it still runs, not when it ends.
    code = (
        "import socket, sys\n"
        "try: open('/etc/stockade-live-test', 'w')\n"
        "except OSError: pass\n"
        "try: socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "except OSError: pass\n"
        "print('refused'); sys.stdout.flush(); sys.stdin.read()\n"
    )
    seen: list[Event] = []
    both = threading.Event()

    def on_event(event: Event) -> None:
        seen.append(event)
        if {"landlock", "seccomp"} <= {e.layer for e in seen if e.outcome == "denied"}:
            both.set()

    read_end, write_end = os.pipe()
    results: list[CellResult] = []
    with Cell(workspace=tmp_path, run_id="r-live") as cell:
        runner = threading.Thread(
            target=lambda: results.append(cell.run([PY, "-c", code], stdin=read_end, on_event=on_event))
        )
        runner.start()
        try:
            assert both.wait(10), seen
            assert runner.is_alive() and not results  # still running
        finally:
            os.close(write_end)
            runner.join(30)
    os.close(read_end)
    (result,) = results
    assert result.stdout == b"refused\n"
    assert seen[0].kind == "cell.start" and seen[0].run == "r-live"
    assert all(e.run == "r-live" and e.cell == result.cell_id for e in seen)
    # Delivered live, listed once in the result, and left out by not_live().
    assert list(result.live) == seen
    for event in seen:
        assert sum(e is event for e in result.events) == 1
    assert not any(e.outcome == "denied" and e.layer in ("landlock", "seccomp") for e in result.not_live())
    assert result.not_live()[-1].kind == "cell.end"
