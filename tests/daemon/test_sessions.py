"""Sessions hosted by the daemon: ``session.*`` requests and ``RemoteSession``."""

from __future__ import annotations

import json
import os
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from stockade.daemon._client import Client, RemoteSession
from stockade.daemon._server import DaemonThread
from stockade.errors import RemoteError
from tests.daemon.test_server import (
    AGENT_WIRE,
    PY,
    agent_policy,
    daemon_at,
    kind_is,
    release,
    wait_output,
    workspace,
)


def _events(client: Client, run: str | None = None) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"format": "jsonl", "limit": 1000}
    if run:
        params["run"] = run
    out: list[dict[str, Any]] = []
    while True:
        page = client.call("events.export", **params)
        out.extend(json.loads(line)["event"] for line in page["data"].splitlines())
        if not page["more"]:
            return out
        params["after_seq"] = page["last_seq"]


def _policy_text(ws: Path) -> str:
    return json.dumps({"name": "bench", "workspace": str(ws)})


def _held_agent_and_bystander(
    tmp_path: Path, ws: Path, script: str, intents: list[str]
) -> tuple[Path, Path, Path, Path]:
    """The set-up of the tests where a run's agent sends intents naming
    sessions: a policy running ``script`` (a ``HELD_AGENT``) on the fifo and
    plan file it returns, allowed ``intents``, and a second run's policy
    (``other``) whose agent holds on a fifo of its own so that its session can
    be named as a foreign one. Returns ``(fifo, plan, policy, other)``."""
    shared = tmp_path / "shared"
    shared.mkdir()
    fifo = shared / "go"
    os.mkfifo(fifo)
    plan = shared / "plan.json"
    policy = tmp_path / "agent.json"
    policy.write_text(
        json.dumps(
            {
                "name": "agent",
                "command": [PY, "-c", script, str(fifo), str(plan)],
                "workspace": str(ws),
                "filesystem": {"read": [str(shared)]},
                "tools": [{"id": i, "intent": i, "verdict": "allow"} for i in intents],
            }
        )
    )
    other_ws = workspace(tmp_path, "o")
    other_fifo = other_ws / "hold"  # in its workspace: the cell sees it
    os.mkfifo(other_fifo)
    other = agent_policy(tmp_path, [{"op": "block", "fifo": str(other_fifo)}], name="other", ws=other_ws)
    return fifo, plan, policy, other


def _start_with_sessions(
    dt: DaemonThread, client: Client, policy: Path, other: Path
) -> tuple[dict[str, Any], dict[str, Any], RemoteSession, RemoteSession]:
    """Both runs of ``_held_agent_and_bystander`` started, and a session opened
    on each: ``(run, elsewhere, own, foreign)``."""
    run = client.call("run.start", policy_path=str(policy), detach=True)
    elsewhere = client.call("run.start", policy_path=str(other), detach=True)
    wait_output(dt.socket_path, elsewhere["id"], "blocking")  # alive while its session is opened
    own = client.open_session(run=run["id"])
    foreign = client.open_session(run=elsewhere["id"])
    return run, elsewhere, own, foreign


def _release_to_the_end(
    dt: DaemonThread, client: Client, run: str, fifo: Path
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Once the held agent of ``run`` is ready, its fifo released and the run
    waited to its end: the ``result`` of each reply it printed, and its events."""
    wait_output(dt.socket_path, run, "ready")
    with client.subscribe("events.subscribe", run=run) as stream:
        release(fifo)
        for pushed in stream:
            if kind_is("run.end", run)(pushed):
                break
    logs = client.call("run.logs", run=run)["data"]
    replies = [json.loads(line)["result"] for line in logs.splitlines() if line.startswith("{")]
    return replies, _events(client, run)


def test_open_exec_files_close_and_the_record(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    with daemon_at(tmp_path) as dt, Client(dt.socket_path, timeout=60) as client:
        session = client.open_session(policy_text=_policy_text(ws))
        assert session.workspace == str(ws)
        listed = client.sessions()
        assert [s["session"] for s in listed] == [session.session_id]
        result = session.exec(["sh", "-c", "echo out; echo err >&2; exit 3"])
        assert (result.returncode, result.stdout, result.stderr) == (3, b"out\n", b"err\n")
        binary = bytes(range(256)) * 8
        assert session.exec(["cat"], input=binary).stdout == binary
        session.write_file("note.txt", b"kept\n", mode=0o600)
        assert session.read_file(f"{ws}/note.txt") == b"kept\n"
        assert session.exec(["stat", "-c", "%a", "note.txt"]).stdout == b"600\n"
        with pytest.raises(FileNotFoundError):
            session.read_file("/no/such/file")
        with pytest.raises(PermissionError):
            session.write_file("/etc/passwd", b"x")
        with pytest.raises(IsADirectoryError):
            session.read_file("/tmp")
        closed = session.close()
        assert closed["calls"] >= 6 and closed["exit_code"] == 0
        assert client.sessions() == []
        events = _events(client)
    kinds = [e["kind"] for e in events]
    assert kinds.count("session.open") == 1 and kinds.count("session.close") == 1
    execs = [e for e in events if e["kind"] == "session.exec"]
    assert execs[0]["detail"]["argv"] == ["sh", "-c", "echo out; echo err >&2; exit 3"]
    assert execs[0]["detail"]["exit_code"] == 3 and execs[0]["detail"]["duration"] > 0
    assert "cell.persistence" in kinds and "cell.end" in kinds
    # The refused write of /etc/passwd is in the record, with its call.
    refused = [
        e for e in events if e["outcome"] == "denied" and e["detail"].get("session") == closed["session"]
    ]
    assert any("/etc" in json.dumps(e["detail"]) for e in refused), refused


def test_large_payloads_go_in_parts(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    data = os.urandom(1 << 20) * 3  # over the 1 MiB frame: blobs both ways
    with (
        daemon_at(tmp_path) as dt,
        Client(dt.socket_path, timeout=60) as client,
        client.open_session(policy_text=_policy_text(ws)) as session,
    ):
        echoed = session.exec(["cat"], input=data)
        assert echoed.stdout == data and not echoed.truncated
        session.write_file("big.bin", data)
        assert session.read_file("big.bin") == data
        assert (ws / "big.bin").read_bytes() == data
        cut = session.exec(["head", "-c", "5000000", "/dev/zero"], output_limit=1000)
        assert cut.truncated and len(cut.stdout) == 1000


def test_bad_requests_are_refused_with_the_reason(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    with daemon_at(tmp_path) as dt, Client(dt.socket_path, timeout=60) as client:
        with pytest.raises(RemoteError) as missing:
            client.call("session.exec", session="s-000000000000", argv=["true"])
        assert missing.value.code == "not_found"
        with pytest.raises(RemoteError) as nopolicy:
            client.call("session.open")
        assert nopolicy.value.code == "bad_params"
        with pytest.raises(RemoteError) as norun:
            client.call("session.open", run="r-000000000000")
        assert norun.value.code == "not_found"
        session = client.open_session(policy_text=_policy_text(ws))
        cases: list[tuple[dict[str, Any], str]] = [
            ({"argv": "ls"}, "list of strings"),
            ({"argv": ["ls"], "cwd": "relative"}, "absolute"),
            ({"argv": ["ls"], "timeout": -1}, "positive"),
            ({"argv": ["ls"], "input": "not base64!"}, "base64"),
            ({"argv": ["ls"], "colour": "red"}, "unknown parameter"),
        ]
        for params, words in cases:
            with pytest.raises(RemoteError) as bad:
                client.call("session.exec", session=session.session_id, **params)
            assert bad.value.code == "bad_params" and words in str(bad.value), bad.value
        assert session.exec(["true"]).returncode == 0  # nothing broke
        session.close()


def test_a_session_bound_to_a_run_ends_with_it(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    fifo = ws / "go"  # in its workspace: the cell sees it (a path beside it is hidden)
    os.mkfifo(fifo)
    policy = agent_policy(tmp_path, [{"op": "block", "fifo": str(fifo)}], ws=ws)
    with daemon_at(tmp_path) as dt, Client(dt.socket_path, timeout=60) as client:
        run = client.call("run.start", policy_path=str(policy), detach=True)
        # Held until stopped: otherwise the run could end (and its gateway
        # close) before the session's calls below.
        wait_output(dt.socket_path, run["id"], "blocking")
        with client.subscribe("events.subscribe") as stream:
            session = client.open_session(run=run["id"])
            assert session.info["run"] == run["id"]
            assert session.workspace == run["workspace"]  # the run's own workbench
            made = session.exec(["sh", "-c", "echo from-session > made.txt"])
            assert made.returncode == 0
            assert (Path(run["workspace"]) / "made.txt").read_text() == "from-session\n"
            # The run's gateway serves the session's loopback too.
            probe = (
                "import os, socket, urllib.parse as u; p = u.urlsplit(os.environ['HTTPS_PROXY']); "
                "socket.create_connection((p.hostname, p.port), 5).close(); print(p.port)"
            )
            reached = session.exec([PY, "-I", "-c", probe])
            assert reached.returncode == 0 and reached.stdout.strip().isdigit(), reached
            client.call("run.stop", run=run["id"], grace=0)
            for pushed in stream:
                if kind_is("session.close", run["id"])(pushed):
                    break
        assert client.sessions() == []
        with pytest.raises(RemoteError) as gone:
            RemoteSession(client, session.info).exec(["true"])
        assert gone.value.code == "not_found"
        events = _events(client, run["id"])
    kinds = [e["kind"] for e in events]
    assert "session.open" in kinds and "session.exec" in kinds and "session.close" in kinds
    assert all(e["run"] == run["id"] for e in events)


def test_the_daemon_closes_its_sessions_when_it_stops(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    with daemon_at(tmp_path) as dt, Client(dt.socket_path, timeout=60) as client:
        session = client.open_session(policy_text=_policy_text(ws))
        pid = session.exec(["sh", "-c", "sleep 300 > /dev/null 2>&1 & echo $!"]).stdout
        assert pid.strip().isdigit()
        cell = session.cell_id
        assert cell
        with client.subscribe("events.subscribe") as stream:
            dt.stop()  # the stream ends when the daemon is gone
            seen = [e.get("kind") for e in (p.get("event", p) for p in stream) if e.get("cell") == cell]
    assert "session.close" in seen and "cell.end" in seen


HELD_AGENT = AGENT_WIRE + textwrap.dedent(
    """
    import select
    fifo, plan = sys.argv[1], sys.argv[2]

    def frame(obj):
        body = json.dumps(obj).encode()
        return struct.pack(">I", len(body)) + body

    def intent(i, name, args):
        return frame({"v": 1, "id": i, "method": "intent",
                      "params": {"token": TOKEN, "intent": name, "args": args}})

    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader now, before saying so
    print("ready", flush=True)
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    poller.poll()
    s = connect()
    """
)
"""The start of an agent that says ``ready``, then waits on the fifo
``argv[1]`` until the test has opened its sessions and written their ids to
the plan file ``argv[2]`` (which it reads only then); each agent below adds
its own loop over the plan."""

SESSION_AGENT = HELD_AGENT + textwrap.dedent(
    """
    for i, session in enumerate(json.load(open(plan)), 1):
        args = {"argv": ["sh", "-c", "echo $$ >> calls; cat calls | wc -l"], "session": session}
        s.sendall(intent(i, "exec", args))
        print(json.dumps(read_frame(s)), flush=True)
    """
)


def test_the_exec_intent_runs_in_the_runs_own_session_only(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    fifo, plan, policy, other = _held_agent_and_bystander(tmp_path, ws, SESSION_AGENT, ["exec"])
    with daemon_at(tmp_path) as dt, Client(dt.socket_path, timeout=60) as client:
        run, elsewhere, own, foreign = _start_with_sessions(dt, client, policy, other)
        plan.write_text(json.dumps([own.session_id, own.session_id, foreign.session_id]))
        replies, events = _release_to_the_end(dt, client, run["id"], fifo)
        client.call("run.stop", run=elsewhere["id"], grace=0)
    first, second, refused = replies
    assert first["verdict"] == "allow" and first["value"]["exit_code"] == 0
    assert first["value"]["session"] == own.session_id
    # State lasts between the two intents: the second sees the first's line.
    assert first["value"]["stdout"]["content"].strip() == "1"
    assert second["value"]["stdout"]["content"].strip() == "2"
    assert refused["verdict"] == "deny" and "not an open session of this run" in refused["reason"]
    denied = [e for e in events if e["outcome"] == "denied" and foreign.session_id in json.dumps(e)]
    assert denied, [e["kind"] for e in events]
    calls = [e for e in events if e["kind"] == "session.exec"]
    assert len(calls) == 2 and all(e["detail"]["session"] == own.session_id for e in calls)


def test_calls_in_flight_past_the_sessions_limit_are_refused(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    with daemon_at(tmp_path) as dt, Client(dt.socket_path, timeout=60) as client:
        session = client.open_session(policy_text=_policy_text(ws), max_calls=1)
        session.exec(["mkfifo", "gate"])
        got: list[Any] = []

        def hold() -> None:
            with Client(dt.socket_path, timeout=60) as other:
                got.append(RemoteSession.attach(other, session.session_id).exec(["cat", "gate"], timeout=30))

        holder = threading.Thread(target=hold)
        holder.start()
        # The first call is in flight once its cat holds the fifo open for
        # reading (until then a writer that will not wait gets ENXIO).
        deadline = time.monotonic() + 30
        while True:
            try:
                gate = os.open(ws / "gate", os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError:
                assert time.monotonic() < deadline, "the first call never started"
        with pytest.raises(RemoteError) as full:
            session.exec(["true"])
        assert full.value.code == "unavailable" and "in flight" in str(full.value)
        os.write(gate, b"open\n")
        os.close(gate)
        holder.join(30)
        assert got and got[0].stdout == b"open\n"
        assert session.exec(["true"]).returncode == 0  # the slot is free again
        session.close()


def test_a_kept_upper_carries_an_image_sessions_changes_to_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``upper``: what a root session on an image wrote outside any mount
    (/etc) is there for the next session given the same upper, and not for one
    without it; the image itself is never written."""
    import subprocess

    from stockade.image import ImageConfig, ImageStore
    from tests.cell._image import build_rootfs

    monkeypatch.setenv("STOCKADE_STATE", str(tmp_path / "state"))
    store = ImageStore(tmp_path / "state" / "images")
    store.ensure()
    copy = store.tmp_dir / "rootfs-copy"
    subprocess.run(["cp", "-al", str(build_rootfs()), str(copy)], check=True)
    image = store.add("sha256:" + "c" * 64, copy, ImageConfig(env=("PATH=/usr/bin:/bin",)), {"kind": "test"})
    policy = json.dumps({"name": "upper", "image": image.digest, "user": "root"})
    (tmp_path / "kept").mkdir(mode=0o700)
    upper = tmp_path / "kept" / "upper"
    with daemon_at(tmp_path) as dt, Client(dt.socket_path, timeout=60) as client:
        with pytest.raises(RemoteError) as relative:
            client.call("session.open", policy_text=policy, upper="kept/upper")
        assert relative.value.code == "bad_params" and "absolute" in str(relative.value)
        # An upper holds the image's owners (setuid-root files too): never in a
        # directory other users may enter.
        (tmp_path / "open").mkdir(mode=0o755)
        with pytest.raises(RemoteError) as shared:
            client.call("session.open", policy_text=policy, upper=str(tmp_path / "open" / "upper"))
        assert shared.value.code == "bad_params" and "0700" in str(shared.value)
        assert not (tmp_path / "open" / "upper").exists()
        first = client.open_session(policy_text=policy, upper=str(upper))
        wrote = first.exec(["sh", "-c", "echo installed > /etc/marker"])
        assert wrote.returncode == 0, wrote
        first.close()
        with client.open_session(policy_text=policy, upper=str(upper)) as second:
            assert second.read_file("/etc/marker") == b"installed\n"
        with client.open_session(policy_text=policy) as fresh, pytest.raises(FileNotFoundError):
            fresh.read_file("/etc/marker")  # the control: a session without the upper
    assert (upper / "etc" / "marker").read_bytes() == b"installed\n"
    assert not (image.rootfs / "etc" / "marker").exists()


FS_AGENT = HELD_AGENT + textwrap.dedent(
    """
    for i, (name, args) in enumerate(json.load(open(plan)), 1):
        s.sendall(intent(i, name, args))
        print(json.dumps(read_frame(s)), flush=True)
    """
)


def test_fs_intents_in_the_runs_session_are_done_inside_its_cell(tmp_path: Path) -> None:
    """fs.write / fs.read / fs.list naming the run's session: done in the
    session's view, as its user (its workspace is the run's); a path the
    session's cell may not read fails there; a session of another run is the
    broker's refusal, recorded."""
    ws = workspace(tmp_path)
    fifo, plan, policy, other = _held_agent_and_bystander(
        tmp_path, ws, FS_AGENT, ["fs.read", "fs.write", "fs.list"]
    )
    marker = f"{ws}/from-intent.txt"
    with daemon_at(tmp_path) as dt, Client(dt.socket_path, timeout=60) as client:
        run, elsewhere, own, foreign = _start_with_sessions(dt, client, policy, other)
        sid = own.session_id
        plan.write_text(
            json.dumps(
                [
                    ["fs.write", {"path": marker, "content": "in the session\n", "session": sid}],
                    ["fs.write", {"path": marker, "content": "again\n", "session": sid}],
                    ["fs.write", {"path": marker, "content": "more\n", "mode": "append", "session": sid}],
                    ["fs.read", {"path": marker, "session": sid}],
                    ["fs.list", {"path": str(ws), "session": sid}],
                    ["fs.read", {"path": "/etc/shadow", "session": sid}],
                    ["fs.read", {"path": marker, "session": foreign.session_id}],
                    # A fifo where a file was expected: answered at once, no daemon thread held.
                    ["fs.read", {"path": f"{ws}/trap", "session": sid}],
                ]
            )
        )
        assert own.exec(["mkfifo", f"{ws}/trap"]).returncode == 0
        replies, events = _release_to_the_end(dt, client, run["id"], fifo)
        client.call("run.stop", run=elsewhere["id"], grace=0)
    made, exists, appended, read, listed, shadow, refused, trap = replies
    assert trap["value"]["size"] == 0, trap
    assert made["value"] == {"path": marker, "bytes": 15, "created": True, "mode": "create"}
    assert exists["value"]["error"]["code"] == "exists"
    assert appended["value"]["created"] is False
    assert read["value"]["content"] == "in the session\nmore\n"
    names = {e["name"]: e for e in listed["value"]["entries"]}
    assert names["trap"]["type"] == "fifo"
    assert names[os.path.basename(marker)]["type"] == "file" and names[os.path.basename(marker)]["size"] == 20
    written = Path(marker)
    assert written.read_bytes() == b"in the session\nmore\n"
    assert (
        shadow["value"]["error"]["code"] == "io"
        and "permission denied" in shadow["value"]["error"]["message"]
    )
    assert refused["verdict"] == "deny" and "not an open session of this run" in refused["reason"]
    denied = [e for e in events if e["outcome"] == "denied" and foreign.session_id in json.dumps(e)]
    assert denied, [e["kind"] for e in events]
