"""Where a harness sample's sessions live: the daemon's when one runs (the
sample is a run `stockade ps` lists, its events are stored as they happen),
this process's when none runs; and the policy document a daemon session gets."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from inspect_ai.util._sandbox.registry import registry_find_sandboxenv

from stockade.daemon import _paths
from stockade.daemon._client import Client
from stockade.daemon._server import DaemonThread
from stockade.harness._hosted import policy_document
from stockade.policy import DiskLimit, HostRule, MountRule, ToolRule, default_policy, loads_policy

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _stored(client: Client, run: str) -> list[dict[str, Any]]:
    page = client.call("events.export", run=run, format="jsonl")
    return [json.loads(line)["event"] for line in page["data"].splitlines() if line.strip()]


@pytest.mark.parametrize("flavour", ["inspect", "harbor"])
def test_a_policy_document_reads_back_as_the_same_policy(tmp_path: Path, flavour: str) -> None:
    base = default_policy(flavour)
    changed = dataclasses.replace(
        base,
        image="bench/py:3.11",
        user="root",
        workdir="/app",
        filesystem=dataclasses.replace(
            base.filesystem, mounts=(MountRule(str(tmp_path), "/app", "rw"),), deny=("/tests",)
        ),
        network=dataclasses.replace(base.network, allow=(HostRule("*.example.com", (80, 443)),)),
        limits=dataclasses.replace(base.limits, timeout=None, cpu=1.5, disk=DiskLimit(bytes=1 << 30)),
        env=dataclasses.replace(base.env, set=(("PATH", "/usr/bin:/bin"), ("A", "b c"))),
        tools=(ToolRule("t", "exec", "allow", (("argv0", "make"),)),),
    )
    for policy in (base, changed):
        back = loads_policy(json.dumps(policy_document(policy)), source="<document>")
        assert dataclasses.replace(back, source=None) == dataclasses.replace(policy, source=None)


@contextlib.contextmanager
def _daemon_for_samples(tmp_path: Path) -> Iterator[tuple[Any, Any, Client, Path]]:
    """The sandbox type, its config for a state directory, a daemon there
    (the harness finds it by the state directory's own socket) and a client
    of it; the daemon stops at the end."""
    state = tmp_path / "state"
    sandbox_type: Any = registry_find_sandboxenv("stockade")
    config = sandbox_type.config_deserialize({"state": str(state)})
    dt = DaemonThread(state=str(state), socket_path=_paths.socket_path(state=str(state)))
    dt.start()
    try:
        with Client(dt.socket_path, timeout=60) as client:
            yield sandbox_type, config, client, state
    finally:
        dt.stop()


async def test_with_a_daemon_the_sample_is_its_run_and_recorded_live(tmp_path: Path) -> None:
    with _daemon_for_samples(tmp_path) as (sandbox_type, config, client, state):
        envs = await sandbox_type.sample_init("hosted", config, {})
        env = envs["default"]
        try:
            run = env.record.run_id
            # Live: `stockade ps` lists the sample's run, its session is the daemon's.
            (listed,) = [r for r in client.call("run.list")["runs"] if r["id"] == run]
            assert listed["name"] == "inspect/hosted" and listed["state"] == "running"
            assert [s["run"] for s in client.sessions(run)] == [run]
            refused = await env.exec(["cat", "/etc/shadow"])
            assert refused.returncode != 0
            done = await env.exec(["sh", "-c", "echo ok > done.txt && cat done.txt"])  # the control
            assert done.stdout == "ok\n"
            await env.write_file("sub/f.bin", b"\x00\xff" * 300_000)  # over one frame: blobs
            assert await env.read_file("sub/f.bin", text=False) == b"\x00\xff" * 300_000
            # In the store while the sample still runs, with the run's id.
            stored = _stored(client, run)
            assert any(
                e["kind"] == "session.exec" and e["detail"]["argv"] == ["cat", "/etc/shadow"] for e in stored
            )
        finally:
            await sandbox_type.sample_cleanup("hosted", config, envs, False)
        report = env.report
        assert report["record"]["via"] == "daemon"
        assert report["record"]["store"] == _paths.store_path(str(state))
        assert any("/etc/shadow" in a["summary"] for a in report["attempts"])
        # When sample_cleanup returns, the sample's session is gone and every
        # event of it is in the store and in the report; the run's placeholder
        # may still be ending (the sample's end hands it on).
        assert client.sessions(run) == []
        reported = _stored(client, run)
        session_kinds = {e["kind"] for e in reported}
        assert {"session.open", "session.exec", "session.close", "cell.denied"} <= session_kinds
        assert "stored after this report" in report["record"]["run_end"]
        assert report["events"] == len([e for e in env.record.events()])
        # task_cleanup waits for what was handed on: the run has ended, its
        # end stored after everything the report counted.
        await sandbox_type.task_cleanup("hosted", config, True)
        (ended,) = [r for r in client.call("run.list", all=True)["runs"] if r["id"] == run]
        assert ended["state"] != "running"
        page = client.call("events.export", run=run, format="jsonl")
        stored = [json.loads(line) for line in page["data"].splitlines() if line.strip()]
        seqs = {s["event"]["kind"]: s["seq"] for s in stored}
        assert stored[-1]["event"]["kind"] == "run.end" and seqs["run.end"] > report["record"]["last_seq"]
        assert seqs["session.close"] <= report["record"]["last_seq"]
        kinds_in_report = [e.kind for e in env.record.events() if not e.kind.startswith("harness.")]
        assert "run.end" not in kinds_in_report and "session.close" in kinds_in_report


async def test_without_a_daemon_the_sample_lives_in_this_process(tmp_path: Path) -> None:
    sandbox_type: Any = registry_find_sandboxenv("stockade")
    config = sandbox_type.config_deserialize({"state": str(tmp_path / "state")})
    envs = await sandbox_type.sample_init("alone", config, {})
    env = envs["default"]
    assert (await env.exec(["echo", "hi"])).stdout == "hi\n"
    # No daemon hosts the session: no outside connection, and the message says
    # how to get one (Inspect's contract: NotImplementedError).
    with pytest.raises(NotImplementedError, match=r"start the daemon .*`stockade session shell`"):
        await env.connection()
    await sandbox_type.sample_cleanup("alone", config, envs, False)
    assert env.report["record"]["via"] == "process"
    assert env.report["record"]["store"] == _paths.store_path(str(tmp_path / "state"))
    with pytest.raises(ConnectionError, match="has ended"):
        await env.connection()


async def test_with_a_daemon_the_connection_is_a_shell_in_the_samples_session(tmp_path: Path) -> None:
    with _daemon_for_samples(tmp_path) as (sandbox_type, config, client, _state):
        envs = await sandbox_type.sample_init("connect", config, {})
        env = envs["default"]
        try:
            run = env.record.run_id
            connection = await env.connection()
            assert connection.type == "stockade"
            argv = shlex.split(connection.command)
            (session,) = client.sessions(run)
            assert argv[1:4] == ["session", "shell", "--socket"] and argv[-1] == session["session"]
            as_user = shlex.split((await env.connection(user="agent")).command)
            assert as_user[as_user.index("--user") + 1] == "agent" and "--user" not in argv
            # What a human would do: run the command and type into it.
            typed = "echo from-the-shell > typed.txt\ncd /tmp\npwd\ncat /etc/shadow\n"
            shell = await anyio.run_process(argv, input=typed.encode(), check=False)
            assert shell.stdout.decode() == "/tmp\n", shell.stderr
            assert shell.returncode != 0 and b"/etc/shadow" in shell.stderr  # the cell's refusal
            # The lines ran in the sample's own cell, where the sandbox sees them.
            assert await env.read_file("typed.txt") == "from-the-shell\n"
            stored = _stored(client, run)
            lines = [e["detail"]["argv"] for e in stored if e["kind"] == "session.exec"]
            assert ["/bin/sh", "-c", "echo from-the-shell > typed.txt"] in lines
            assert ["/bin/sh", "-c", "cat /etc/shadow"] in lines
            assert any(
                e["outcome"] == "denied" and "/etc/shadow" in e["summary"] for e in stored
            )  # the kernel's refusal is in the sample's record
        finally:
            await sandbox_type.sample_cleanup("connect", config, envs, False)
