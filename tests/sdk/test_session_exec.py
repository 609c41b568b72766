"""The SDK's ``exec(session=…)``: the run's own workbench session."""

from __future__ import annotations

from pathlib import Path

import pytest

from stockade.sdk import Broker, Denied
from tests.sdk.test_agent_sdk import _allow, fake


def test_exec_names_the_session_and_reads_its_result(tmp_path: Path) -> None:
    value = {
        "exit_code": 0,
        "stdout": {"content": "2\n", "encoding": "utf-8"},
        "stderr": {"content": "", "encoding": "utf-8"},
        "timed_out": False,
        "limits_hit": [],
        "duration": 0.004,
        "session": "s-0123456789ab",
        "call": "s-0123456789ab.2",
    }
    refused = {"result": {"verdict": "deny", "rule": None, "reason": "refused by the broker: not ours"}}
    with fake(tmp_path, [_allow(value), refused]) as server:
        broker = Broker(server.path, "st1.tok.en")
        got = broker.exec(["make"], session="s-0123456789ab", cwd="/app")
        assert got.exit_code == 0 and got.stdout == b"2\n" and got.session == "s-0123456789ab"
        with pytest.raises(Denied):
            broker.exec(["ls"], session="s-ffffffffffff")
        broker.close()
    (_, first), (_, second) = server.requests
    assert first["params"]["args"] == {"argv": ["make"], "cwd": "/app", "session": "s-0123456789ab"}
    assert second["params"]["args"]["session"] == "s-ffffffffffff"
