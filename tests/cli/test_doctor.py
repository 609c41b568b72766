"""``stockade doctor``: the report, as JSON and as tables, and its exit codes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import click
import pytest

from stockade.cell import _host
from stockade.cell._host import Fact
from stockade.errors import StockadeError

OTHER_COMMANDS = {"stockade.cli._demo", "stockade.cli._policy_cmds"}
"""Commands of the application other engineers are writing; until they exist,
the doctor is run on its own, the way the application runs it."""


def _run(args: list[str]) -> int:
    from stockade.cli.main import main

    try:
        return main(args)
    except ModuleNotFoundError as exc:
        if exc.name not in OTHER_COMMANDS:
            raise
    from stockade.cli._doctor import doctor

    try:
        doctor.main(args[1:], prog_name="stockade doctor", standalone_mode=False)
    except click.ClickException as exc:
        exc.show()
        return 2
    except StockadeError as exc:
        click.echo(f"stockade: {exc}", err=True)
        return exc.exit_code
    return 0


def _json(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, dict[str, Any], str]:
    code = _run(["doctor", "--json", *args])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def test_json_has_the_facts_and_exits_0_here(capsys: pytest.CaptureFixture[str]) -> None:
    code, report, err = _json(capsys, [])
    assert code == 0, err
    facts = _host.probe(deep=True)
    got = report["facts"]
    assert got["kernel"]["value"] == facts.kernel.value
    assert got["landlock_abi"]["value"] == facts.landlock_abi.value
    assert got["seccomp_actions"]["value"] == list(facts.seccomp_actions.value)
    assert got["cgroup_v1"]["value"] == list(facts.cgroup_v1.value)
    assert got["cgroup_memory"]["value"] == facts.cgroup_memory.value
    assert got["cgroup_kill"]["value"] == facts.cgroup_kill.value
    assert got["audit"]["value"] is facts.audit.value
    assert "userns_tested" in got  # the doctor runs the deep probe
    assert all(fact["how"] for fact in got.values())
    assert report["policy"]["name"] == "default"
    features = [r["feature"] for r in report["requirements"]]
    assert "landlock.net" in features and "cgroup.memory" in features
    assert report["ok"] is True
    assert all(r["met"] for r in report["requirements"])


def test_tables_show_each_layer(capsys: pytest.CaptureFixture[str]) -> None:
    code = _run(["doctor"])
    out, err = capsys.readouterr()
    assert code == 0, err
    for layer in ("Landlock", "seccomp", "user namespaces", "cgroup v2", "cgroup v1", "audit"):
        assert layer in out
    assert f"ABI {_host.probe().landlock_abi.value}" in out
    assert "What policy 'default' needs" in out
    assert "every layer" in out


def test_a_missing_feature_exits_5_and_says_what_to_do(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = _host.probe(deep=True)
    old = real._replace(landlock_abi=Fact(3, "test: an older kernel"))
    monkeypatch.setattr(_host, "probe", lambda deep=False: old)
    code, report, err = _json(capsys, [])
    assert code == 5
    assert report["ok"] is False
    unmet = {r["feature"]: r for r in report["requirements"] if not r["met"]}
    assert set(unmet) == {"landlock.net", "landlock.scope", "landlock.audit"}
    assert "Linux 6.7" in unmet["landlock.net"]["fix"]
    assert "landlock.net" in err

    code = _run(["doctor"])
    out, _ = capsys.readouterr()
    assert code == 5
    assert "Missing" in out and "landlock.net" in out


def test_a_policy_file_says_what_it_needs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("stockade.policy._load", reason="the policy loader is not here yet")
    policy = tmp_path / "p.yaml"
    policy.write_text("name: doctored\nmode: audit\nlimits:\n  cpu: 0.5\n  pids: 64\n")
    code, report, err = _json(capsys, ["--policy", str(policy)])
    assert code == 0, err
    assert report["policy"] == {"name": "doctored", "source": str(policy), "mode": "audit"}
    needs = {r["feature"]: r for r in report["requirements"]}
    assert "cgroup.cpu" in needs and "cgroup.pids" in needs
    assert needs["seccomp.log"]["why"].startswith("mode: audit")


def test_a_bad_policy_file_exits_3(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("stockade.policy._load", reason="the policy loader is not here yet")
    policy = tmp_path / "bad.yaml"
    policy.write_text("name: [oops\n")
    code = _run(["doctor", "--policy", str(policy)])
    out, err = capsys.readouterr()
    assert code == 3
    assert "bad.yaml" in err
    assert out == ""


def test_a_missing_policy_file_is_exit_3_as_under_validate_and_exec(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = _run(["doctor", "--policy", str(tmp_path / "nope.yaml")])
    _, err = capsys.readouterr()
    assert code == 3  # one code per kind of problem (docs/CLI.md)
    assert "nope.yaml" in err


def test_the_gateway_checks_are_real_and_pass_here(capsys: pytest.CaptureFixture[str]) -> None:
    code, report, _err = _json(capsys, [])
    assert code == 0
    checks = {c["name"]: c for c in report["gateway"]}
    assert checks["sockets in a cell's network"]["ok"] is True
    assert checks["trusted roots for upstream TLS"]["ok"] is True
    assert "certificates in" in checks["trusted roots for upstream TLS"]["here"]


def test_a_policy_with_a_way_out_needs_the_gateway(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from stockade.gateway import _host as gateway_host

    failing = [
        gateway_host.GatewayCheck("sockets in a cell's network", False, "could not: test", "run as root"),
        gateway_host.GatewayCheck("trusted roots for upstream TLS", True, "1 certificates in /x"),
    ]
    monkeypatch.setattr(gateway_host, "probe_gateway", lambda: failing)
    closed = tmp_path / "closed.yaml"
    closed.write_text("name: closed\n")
    code, report, _err = _json(capsys, ["--policy", str(closed)])
    assert code == 0 and report["ok"] is True  # no way out: the gateway's state does not matter
    open_ = tmp_path / "open.yaml"
    open_.write_text("name: open\nnetwork:\n  allow: [api.example.com]\n")
    code, report, err = _json(capsys, ["--policy", str(open_)])
    assert code == 5 and report["ok"] is False
    assert "gateway: sockets in a cell's network" in err


def test_the_record_checks_look_at_the_state_directory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, report, err = _json(capsys, ["--state", str(tmp_path / "state")])
    assert code == 0, err
    checks = {c["name"]: c for c in report["record"]}
    assert checks["state directory"]["ok"] is True and "will create it" in checks["state directory"]["here"]
    assert checks["a local filesystem"]["ok"] is True
    assert checks["room for the record"]["ok"] is True and "free" in checks["room for the record"]["here"]
    # A file where the directory should be.
    (tmp_path / "file").write_text("")
    code, report, err = _json(capsys, ["--state", str(tmp_path / "file")])
    assert code == 5 and report["ok"] is False
    assert "record: state directory" in err
    bad = next(c for c in report["record"] if c["name"] == "state directory")
    assert "not a directory" in bad["here"] and bad["fix"]


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_full_or_read_only_state_directory_exits_5_with_the_fix(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import subprocess

    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(small)], check=True)
    try:
        code, report, err = _json(capsys, ["--state", str(small / "state")])
        assert code == 5 and "record: room for the record" in err
        room = next(c for c in report["record"] if c["name"] == "room for the record")
        assert room["ok"] is False and "MiB" in room["here"] and "free at least" in room["fix"]
        subprocess.run(["mount", "-o", "remount,ro", str(small)], check=True)
        code, report, err = _json(capsys, ["--state", str(small / "state")])
        assert code == 5 and "record: a local filesystem" in err
        local = next(c for c in report["record"] if c["name"] == "a local filesystem")
        assert "read-only" in local["here"] and local["fix"]
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)
