"""The daemon SIGKILLed during a run with kernel refusals: nothing the reader
had received is lost, and the restarted daemon says what it recovered and
what it cannot know (issue 12). test_relay.py kills it in mid-storm."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.test_faults import daemon_process
from tests.daemon.test_kernel_live import _kernel_denials, _policy
from tests.daemon.test_server import (
    Wire,
    close_wires,  # noqa: F401  (the fixture that closes every Wire)
    stored_events,
    wait_output,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="cells under the daemon need root on this host")


def test_a_sigkilled_daemon_loses_no_kernel_refusal_it_had_and_says_what_it_cannot_know(
    tmp_path: Path,
) -> None:
    state, sock = tmp_path / "state", tmp_path / "d.sock"
    policy, _fifo = _policy(tmp_path, 5)
    with daemon_process(state, sock) as proc:
        wire, events = Wire(str(sock)), Wire(str(sock))
        events.call("events.subscribe")
        info = wire.call("run.start", {"policy_path": str(policy), "detach": True})
        run = info["id"]
        wait_output(str(sock), run, "refused 5")
        # The live stream shows only what is stored: once all five are on it,
        # the kernel reported them and the daemon made them durable.
        seen: list[dict[str, Any]] = []
        while len(_kernel_denials(seen)) < 5:
            seen += events.until(lambda e: e["event"]["kind"] == "cell.denied" and e["event"]["run"] == run)
        streamed = [e for e in seen if e["event"]["kind"] == "cell.denied"]
        os.kill(proc.pid, signal.SIGKILL)  # the run still blocks on its fifo
        proc.wait()
    with daemon_process(state, sock):
        wire = Wire(str(sock))
        assert wire.call("verify")["ok"] is True
        stored = stored_events(wire, run)
        for event in streamed:
            assert event in stored, "a kernel refusal the daemon had streamed is gone"
        assert len(_kernel_denials(stored)) == 5
        kinds = [e["event"]["kind"] for e in stored]
        gap = [e["event"] for e in stored if e["event"]["kind"] == "cell.audit_lost"]
        assert len(gap) == 1, kinds
        detail = gap[0]["detail"]
        # All five were stored before the kill: the relay had nothing to add,
        # and says it saw the cell die (tests/daemon/test_relay.py kills mid-storm).
        assert detail["reason"] == "daemon" and (detail["kept"], detail["recovered"]) == (5, 0)
        assert detail["relay"] == "complete"
        assert detail["last_recorded"] is not None and detail["last_recorded"] <= detail["restarted"]
        assert "5 kernel refusals" in gap[0]["summary"] and "is missing" in gap[0]["summary"]
        # Said before the run's lost end, and only for the run that was alive.
        assert kinds.index("cell.audit_lost") < len(kinds) - 1 and kinds[-1] == "run.end"
        assert stored[-1]["event"]["detail"]["state"] == "lost"
