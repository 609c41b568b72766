"""``stockade exec`` serves the gateway too when the policy asks for the
network: same proxy, no daemon, the refusals among the cell's events."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._netns import TestNetns
from tests.gateway.test_in_a_run import INTERNAL, METADATA, PUBLIC, World

STOCKADE = os.path.join(os.path.dirname(sys.executable), "stockade")


@pytest.fixture
def world_ns(tmp_path: Path) -> Iterator[tuple[World, TestNetns]]:
    with TestNetns([PUBLIC, INTERNAL, METADATA]) as ns:
        with ns.entered():
            world = World(tmp_path)
            world.start()
        try:
            yield world, ns
        finally:
            world.stop()


def _exec(ns: TestNetns, world: World, policy: Path, script: str) -> tuple[int, dict[str, object]]:
    env = {**os.environ, "STOCKADE_DNS": world.dns.spec, "STOCKADE_UPSTREAM_CA": world.pki.ca_file}
    proc = subprocess.run(
        ns.argv([STOCKADE, "exec", "--json", "--policy", str(policy), "--", "/bin/sh", "-c", script]),
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    return proc.returncode, json.loads(proc.stdout)


def test_exec_with_network_allow_gets_the_proxy(world_ns: tuple[World, TestNetns], tmp_path: Path) -> None:
    world, ns = world_ns
    policy = tmp_path / "p.yaml"
    policy.write_text("name: exec-net\nnetwork:\n  allow: ['docs.example.com:80']\n")
    status, report = _exec(
        ns,
        world,
        policy,
        "curl -s http://docs.example.com/hello; curl -s -o /dev/null -w '%{http_code}\\n' http://evil.example.org/",
    )
    assert status == 0, report
    assert report["stdout"] == "hello from docs\n403\n"
    events = report["events"]
    assert isinstance(events, list)
    requests = [(e["detail"]["host"], e["outcome"]) for e in events if e["kind"] == "http.request"]
    assert requests == [("docs.example.com", "allowed"), ("evil.example.org", "denied")]
    assert events[0]["kind"] == "cell.start" and events[-1]["kind"] == "cell.end"


def test_exec_without_network_has_no_proxy(world_ns: tuple[World, TestNetns], tmp_path: Path) -> None:
    world, ns = world_ns
    policy = tmp_path / "p.yaml"
    policy.write_text("name: exec-closed\n")
    script = (
        'echo "proxy=${HTTP_PROXY:-none}"; '
        "curl -s --proxy http://127.0.0.1:3128 -o /dev/null -w '%{http_code}' http://docs.example.com/; "
        'echo " $?"'
    )
    _status, report = _exec(ns, world, policy, script)
    # No proxy variables, and nothing answers on the proxy's port: curl cannot connect (exit 7).
    assert report["stdout"] == "proxy=none\n000 7\n", report
    assert world.seen == []
