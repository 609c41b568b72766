"""What a new user trips on (issue 13): one style of error line, one grammar of
durations, one exit code per kind of problem, ``exec``'s Docker-like ``-e``,
file modes, and the package's own surface."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

import stockade
from stockade.cli.main import main
from stockade.exit_codes import ExitCode
from stockade.policy import loads_policy
from stockade.policy._units import MAX_DURATION, parse_duration
from stockade.record._export import parse_since

JARGON = ("Error:", "Usage:", "Try '", "float range", "integer range", "x<=", "<=x", "x>=")


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_style(err: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines, "no error line was printed"
    for line in lines:
        assert line.startswith("stockade: "), line
        assert not line.startswith("stockade exec:"), line
    for word in JARGON:
        assert word not in err, (word, err)


@pytest.mark.parametrize(
    "args",
    [
        ("stop", "r-1", "--grace", "2h"),
        ("stop", "r-1", "--grace", "soon"),
        ("logs", "r-1", "--tail", "-3"),
        ("export", "--format", "xml"),
        ("export", "--since", "yesterday-ish"),
        ("no-such-command",),
        ("run",),
        ("ps", "--no-such-flag"),
        ("exec", "--no-such-flag"),
        ("exec", "--timeout", "soon", "--", "true"),
        ("exec", "--timeout", "0", "--", "true"),
        ("daemon", "--approval-timeout", "0"),
    ],
)
def test_every_usage_error_is_one_line_in_one_style_and_exit_2(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...]
) -> None:
    code, out, err = cli(capsys, *args)
    assert code == ExitCode.USAGE
    assert out == ""
    assert_one_style(err)
    assert len(err.splitlines()) == 1
    assert "--help`" in err  # where the options are listed


def test_a_range_is_said_in_words(capsys: pytest.CaptureFixture[str]) -> None:
    _, _, err = cli(capsys, "stop", "r-1", "--grace", "2h")
    assert "'2h' is too long; give at most 1h" in err
    _, _, err = cli(capsys, "logs", "r-1", "--tail", "-3")
    assert "-3 is out of range: give at least 0" in err


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90.0), ("1s", 1.0), ("500ms", 0.5), ("1h30m", 5400.0), ("1d2h", 93600.0), ("2w", 1209600.0)],
)
def test_one_grammar_of_durations_for_policies_and_flags(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds
    assert parse_since(text, now=10_000_000.0) == 10_000_000.0 - seconds
    policy = loads_policy(f"name: t\nlimits: {{timeout: {text}}}\n")
    assert policy.limits.timeout == seconds


def test_durations_on_flags_are_accepted(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # Parsed, then the command goes on: here to a daemon that is not there (4), not a usage error (2).
    sock = str(tmp_path / "none.sock")
    code, _, err = cli(capsys, "stop", "r-1", "--grace", "1s", "--socket", sock)
    assert code == ExitCode.DAEMON_UNREACHABLE, err
    code, _, err = cli(capsys, "export", "--since", "1d2h", "--db", str(tmp_path / "none.db"))
    assert code == ExitCode.NOT_FOUND, err


@pytest.mark.parametrize("value", ["100000000d", "400d", "1.0e+20"])
def test_an_implausibly_long_duration_is_a_policy_error_not_an_overflow(value: str) -> None:
    with pytest.raises(stockade.PolicyError, match="is longer than 366d"):
        loads_policy(f"name: t\nlimits: {{timeout: {value}}}\n")
    assert parse_duration("366d") == MAX_DURATION


def test_an_overlong_timeout_under_exec_is_exit_3_with_its_location(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text("name: t\nlimits: {timeout: 100000000d}\n")
    code, _, err = cli(capsys, "exec", "-p", str(policy), "--", "true")
    assert code == ExitCode.POLICY
    assert err.startswith(f"stockade: {policy}:2:19: limits.timeout '100000000d' is longer than")
    assert "Traceback" not in err


def test_exec_dash_e_sets_a_variable_as_docker_does(
    capfd: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STOCKADE_TEST_FROM_HERE", "here-value")
    monkeypatch.delenv("STOCKADE_TEST_UNSET", raising=False)
    code = main(
        [
            "exec",
            "-e",
            "FOO=bar",
            "--env=EMPTY=",
            "-e",
            "STOCKADE_TEST_FROM_HERE",
            "-e",
            "STOCKADE_TEST_UNSET",
            "--",
            "sh",
            "-c",
            'echo "$FOO|$EMPTY|$STOCKADE_TEST_FROM_HERE|${STOCKADE_TEST_UNSET-unset}"',
        ]
    )
    out, _ = capfd.readouterr()
    assert code == 0
    assert out == "bar||here-value|unset\n"
    assert not (tmp_path / "FOO=bar").exists()  # it used to be the events file


def test_exec_env_refuses_what_is_not_a_name(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "exec", "-e", "=x", "--", "true")
    assert code == ExitCode.USAGE
    assert "--env '=x' does not start with a variable's name" in err


def test_exec_events_to_a_missing_directory_is_refused_before_the_command_runs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    events = str(tmp_path / "no" / "f")
    code, _, err = cli(capsys, "exec", "-w", str(tmp_path), "--events", events, "--", "touch", str(marker))
    assert code == ExitCode.USAGE
    assert_one_style(err)
    assert "does not exist; create it first" in err
    assert not marker.exists()


def test_exec_events_file_is_0600_like_export(capfd: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    old = os.umask(0o022)
    try:
        code = main(["exec", "-q", "--events", str(events), "--", "true"])
    finally:
        os.umask(old)
    capfd.readouterr()
    assert code == 0
    assert stat.S_IMODE(events.stat().st_mode) == 0o600
    assert events.read_text().count("\n") >= 1


def test_the_package_lists_its_lazy_names() -> None:
    names = dir(stockade)
    for name in ("Cell", "load_policy", "StoreError", "PolicyError"):
        assert name in names
    for name in stockade.__all__:
        assert getattr(stockade, name) is not None
    assert stockade.StoreError.__name__ == "StoreError"


def test_cell_run_takes_input_as_bytes() -> None:
    data = b"line\n" * 50_000  # more than a pipe holds: fed while the command reads
    with stockade.Cell(stockade.default_policy()) as cell:
        result = cell.run(["sh", "-c", "wc -c"], input=data)
        assert result.exit_code == 0
        assert result.stdout == f"{len(data)}\n".encode()
        with pytest.raises(ValueError, match="stdin or input"):
            cell.run(["true"], stdin=0, input=b"")


def test_dead_code_is_gone() -> None:
    from stockade.broker._tripwire import Tripwire
    from stockade.cell import _cgroup
    from stockade.record import _jsonl

    assert not hasattr(Tripwire, "claim_halt")
    assert not hasattr(_cgroup, "LIMIT_CONTROLLERS")
    assert not hasattr(_jsonl, "read_jsonl")


@pytest.mark.parametrize(
    "text",
    [
        'command: !!python/object/apply:os.system ["id"]\n',
        "filesystem: !!python/object:os.system {read: [/opt]}\n",
        "env: !custom {}\n",
    ],
)
def test_yaml_tags_on_lists_and_mappings_are_refused(text: str) -> None:
    with pytest.raises(
        stockade.PolicyError, match=r"the YAML tag .* is not supported in a policy; remove it"
    ):
        loads_policy("name: t\n" + text)
    # Control: the plain tags of a list and a mapping are what no tag means.
    assert loads_policy("name: t\ncommand: !!seq [id]\nenv: !!map {}\n").command == ("id",)


def test_yaml_tags_on_lists_are_refused_in_scenarios_too(tmp_path: Path) -> None:
    from stockade.scenario._model import load_scenario

    file = tmp_path / "s.yaml"
    file.write_text("name: s\nagents: !!python/object/apply:os.system [id]\n")
    with pytest.raises(stockade.PolicyError, match="is not supported in a scenario"):
        load_scenario(str(file))


def warnings_of(capsys: pytest.CaptureFixture[str], path: Path) -> list[str]:
    code, out, _ = cli(capsys, "validate", str(path))
    assert code == 0
    return [line for line in out.splitlines() if line.startswith("warning: ")]


def test_validate_warns_about_values_that_cannot_work_here(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    file = tmp_path / "p.yaml"
    file.write_text(
        f"name: t\nworkspace: {ws}\nlimits: {{memory: 999999999999P, cpu: 150, pids: 1}}\n"
        "network: {loopback_ports: [3128, 8000]}\n"
        'tools:\n  - {id: notes, intent: fs.write, verdict: ask, match: {path: "/srv/notes/*"}}\n'
    )
    found = "\n".join(warnings_of(capsys, file))
    assert "limits.memory" in found and "limits nothing" in found
    assert f"limits.cpu 150 is more cores than this host has ({os.cpu_count()})" in found
    assert "limits.pids 1 fails every start" in found
    assert "loopback_ports 3128 is the gateway's proxy" in found and "8000" not in found
    assert "tools rule 'notes' lets fs.write reach '/srv/notes/*'" in found
    # Control: the same with plausible values and the grant the rule needs says none of it.
    file.write_text(
        f"name: t\nworkspace: {ws}\nlimits: {{memory: 1G, cpu: 1, pids: 64}}\n"
        f"filesystem: {{write: [{tmp_path}]}}\nnetwork: {{loopback_ports: [8000]}}\n"
        f'tools:\n  - {{id: notes, intent: fs.write, verdict: ask, match: {{path: "{tmp_path}/*"}}}}\n'
    )
    assert warnings_of(capsys, file) == []


def test_the_readmes_agent_yaml_rule_can_be_honoured(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme.split("# agent.yaml:", 1)[1].split("```", 1)[0]
    file = tmp_path / "agent.yaml"
    file.write_text("# agent.yaml:" + block)
    assert not [w for w in warnings_of(capsys, file) if "tools rule" in w]


def test_piped_output_is_not_cut_at_80_columns() -> None:
    import subprocess
    import sys

    stockade_bin = os.path.join(os.path.dirname(sys.executable), "stockade")
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    done = subprocess.run(
        [stockade_bin, "doctor"], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert "…" not in done.stdout
    assert "LANDLOCK_ACCESS_FS_REFER" in done.stdout  # cut to "LANDLOCK_ACCESS_FS_REF…" before
    assert max(len(line) for line in done.stdout.splitlines()) > 80


def test_demo_at_a_dead_model_says_it_is_unreachable(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as holder:  # a loopback port with nothing listening on it
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
        code, out, err = cli(capsys, "demo", "--model-url", f"http://127.0.0.1:{port}/v1")
    assert code == ExitCode.HOST
    assert out == ""
    assert err.startswith(f"stockade: the model at http://127.0.0.1:{port}/v1 is unreachable")
    assert "Traceback" not in err and "NOT CONTAINED" not in err


def test_the_demo_relay_answers_a_dead_model_with_a_502_not_a_traceback() -> None:
    import asyncio
    import socket

    import httpx

    from stockade.demo._relay import relay_app

    async def ask(app: object) -> httpx.Response:
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://relay") as client:
            answer = await client.post("/v1/chat/completions", json={"model": "m", "messages": []})
        await app.state.aclose()  # type: ignore[attr-defined]
        return answer

    with socket.socket() as holder:  # a loopback port with nothing listening on it
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
        answer = asyncio.run(ask(relay_app(f"http://127.0.0.1:{port}/v1")))
    assert answer.status_code == 502
    assert answer.json()["error"]["type"] == "model_unreachable"


def test_stockade_agent_imports_in_an_exec_cell_and_says_there_is_no_broker(
    capfd: pytest.CaptureFixture[str],
) -> None:
    from stockade.cli._exec import SDK_IN_CELL
    from stockade.sdk import IN_CELL_DIR

    assert SDK_IN_CELL == IN_CELL_DIR
    script = (
        "import stockade_agent\n"
        "try:\n    stockade_agent.Broker.connect()\n"
        "except stockade_agent.NotInCell as exc:\n    print('NotInCell', exc)\n"
    )
    code = main(["exec", "-q", "--", "python3", "-c", script])
    out, _ = capfd.readouterr()
    assert code == 0, out
    assert out.startswith("NotInCell ") and "started by `stockade exec`, which has no broker" in out


def test_scenario_validate_reports_every_mistake_at_once(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad_policy = tmp_path / "bad.yaml"
    bad_policy.write_text("name: t\nlimits: {memory: lots}\n")
    file = tmp_path / "s.yaml"
    file.write_text(
        "name: s\nagents:\n"
        "  - {name: a, policy: missing.yaml}\n"
        "  - {name: a, policy: bad.yaml, depends_on: [zzz]}\n"
        "  - {name: c, policy: bad.yaml, launch_when: success}\n"
    )
    code, _, err = cli(capsys, "scenario", "validate", str(file))
    assert code == ExitCode.POLICY
    assert "is used by agents[0] too" in err
    assert "depends on 'zzz'" in err
    assert "has launch_when but no depends_on" in err
    assert "missing.yaml" in err and "does not exist" in err
    # Control: with the group fixed, each agent's policy is checked, all of them.
    file.write_text(
        "name: s\nagents:\n  - {name: a, policy: missing.yaml}\n  - {name: b, policy: bad.yaml}\n"
        "  - {name: c, policy: bad.yaml}\n"
    )
    code, _, err = cli(capsys, "scenario", "validate", str(file))
    assert code == ExitCode.POLICY
    assert "missing.yaml" in err and err.count("limits.memory 'lots' is not a size") == 2
    # And with a schema mistake too, the group's and the files' mistakes come in the same round.
    file.write_text(
        "name: s\nagents:\n  - {name: a, policy: missing.yaml, replicas: -1}\n"
        "  - {name: a, policy: bad.yaml, depends_on: [zzz]}\n"
    )
    code, _, err = cli(capsys, "scenario", "validate", str(file))
    assert code == ExitCode.POLICY
    for part in (
        "replicas -1 is out of range",
        "is used by agents[0] too",
        "depends on 'zzz'",
        "does not exist",
    ):
        assert part in err, (part, err)


def test_exec_lists_the_gateways_upstream_failures_beside_the_refusals(
    capfd: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    # The gateway asks a DNS server on loopback that never answers: a DNS failure, hermetically.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:
        silent.bind(("127.0.0.1", 0))
        monkeypatch.setenv("STOCKADE_DNS", f"127.0.0.1:{silent.getsockname()[1]}")
        policy = tmp_path / "p.yaml"
        policy.write_text("name: t\nnetwork: {allow: [pkgs.test]}\n")
        code = main(
            ["exec", "-p", str(policy), "--", "sh", "-c", "curl -s -o /dev/null https://pkgs.test/x; true"]
        )
    _, err = capfd.readouterr()
    assert code == 0
    assert "stockade: 1 request(s) allowed by the gateway failed upstream" in err
    assert "CONNECT pkgs.test:443: pkgs.test could not be resolved" in err and "(502)" in err


def test_what_vulture_found_unused_is_gone() -> None:
    from stockade.cell._audit_core import AuditCorrelator

    assert not hasattr(AuditCorrelator, "watched")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("init", "-o", "/nonexistent-dir/x.yaml"), ExitCode.USAGE),
        (("demo", "--model-url", "notaurl"), ExitCode.USAGE),
        (("export", "--out", "/nonexistent-dir/f", "--db", "{db}"), ExitCode.USAGE),
        (("verify", "--db", "/nonexistent-dir/x.db"), ExitCode.NOT_FOUND),
        (("report", "r-000000000000", "--state", "{tmp}"), ExitCode.NOT_FOUND),
        (("revert", "r-000000000000", "--state", "{tmp}"), ExitCode.NOT_FOUND),
        (("validate", "{tmp}"), ExitCode.POLICY),
        (("doctor", "--policy", "/nonexistent-dir/p.yaml"), ExitCode.POLICY),
        (("exec", "-p", "/nonexistent-dir/p.yaml", "--", "true"), ExitCode.POLICY),
        (("run", "-f", "/nonexistent-dir/p.yaml"), ExitCode.POLICY),
        (("scenario", "validate", "/nonexistent-dir/s.yaml"), ExitCode.POLICY),
        (("logs", "r-000000000000", "--socket", "{tmp}/none.sock"), ExitCode.DAEMON_UNREACHABLE),
        (("completion", "tcsh"), ExitCode.USAGE),
        (("exec", "-t"), ExitCode.USAGE),
    ],
)
def test_a_mistake_is_a_message_and_its_code_never_a_traceback(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: tuple[str, ...], expected: int
) -> None:
    from stockade.record._store import open_store

    db = str(tmp_path / "events.db")
    with open_store(db):
        pass
    filled = [a.replace("{tmp}", str(tmp_path)).replace("{db}", db) for a in args]
    code, _, err = cli(capsys, *filled)
    assert code == expected, err
    assert_one_style(err)
    assert "Traceback" not in err


def test_a_shell_at_a_terminal_is_not_recorded_as_a_refused_listing(tmp_path: Path) -> None:
    import subprocess
    import sys

    stockade_bin = os.path.join(os.path.dirname(sys.executable), "stockade")
    events = tmp_path / "events.jsonl"
    primary, secondary = os.openpty()  # the operator's terminal on stdin, as at a shell
    try:
        done = subprocess.run(
            [stockade_bin, "exec", "--events", str(events), "--", "sh", "-c", "tty; bash -i -c true; ls /"],
            stdin=secondary,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(secondary)
        os.close(primary)
    import json

    refused = [json.loads(line) for line in events.read_text().splitlines()]
    listings = [e["detail"].get("path") for e in refused if e.get("outcome") == "denied"]
    assert "/dev" not in listings, done.stderr  # ttyname(3)'s scan of /dev is routine
    assert "/" in listings  # control: listing / is still refused and recorded
    assert "listing of / refused" in done.stderr


def test_agentos_allowed_hosts_warn_that_they_are_proxy_only(capsys: pytest.CaptureFixture[str]) -> None:
    from tests._agentos import manifest

    found = warnings_of(capsys, manifest("allowed-net.yaml"))
    assert any("allowed_hosts are reached through the gateway only" in w for w in found)
    # Control: a stockade policy's network.allow is documented as proxied; no such warning.
    assert not any(
        "allowed_hosts" in w
        for w in warnings_of(capsys, Path(__file__).resolve().parents[2] / "examples" / "policy.yaml")
    )


def test_every_duration_flag_reads_the_policys_grammar(capsys: pytest.CaptureFixture[str]) -> None:
    # Each command's duration flag refuses the same malformed value the same way.
    for args in (
        ("stop", "r-1", "--grace", "1x"),
        ("session", "exec", "--timeout", "1x", "s-1", "true"),
        ("prune", "--older-than", "1x"),
        ("daemon", "--approval-timeout", "1x"),
        ("exec", "--timeout", "1x", "--", "true"),
    ):
        code, _, err = cli(capsys, *args)
        assert code == ExitCode.USAGE, (args, err)
        assert "'1x' is not a duration; write a number of seconds or a number with a unit" in err, err


def _wheel(directory: Path, name: str = "tiny", version: str = "1.0") -> Path:
    """A pure wheel of one module, made by hand (no build backend, no network)."""
    import base64
    import hashlib
    import zipfile

    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": b"X = 1\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return wheel


def test_a_pip_run_is_not_recorded_as_a_refused_bind(
    capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """urllib3 (pip's, vendored) binds ('::1', 0) at import to learn whether
    IPv6 works; every pip run was recorded as a refused bind. A real pip
    downloads a local wheel from a file:// index (no traffic at all) and
    nothing is refused; the control, a bind of a port the policy does not
    list, still is, and is recorded with its port."""
    import json
    import socket

    workspace = tmp_path / "ws"
    (workspace / "index").mkdir(parents=True)
    wheel = _wheel(workspace / "index")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        unlisted = s.getsockname()[1]
    events = tmp_path / "events.jsonl"
    script = (
        "set -e; python3 -m pip download --no-index --no-cache-dir --disable-pip-version-check"
        f" --find-links file://{workspace}/index -d {workspace}/out tiny;"
        " python3 -c 'import pip._vendor.urllib3.util.connection as c; print(\"ipv6\", c.HAS_IPV6)'"
    )
    code = main(["exec", "--workspace", str(workspace), "--events", str(events), "--", "sh", "-c", script])
    out, err = capfd.readouterr()
    assert code == 0, err
    assert (workspace / "out" / wheel.name).read_bytes() == wheel.read_bytes(), out
    denied = [e for e in map(json.loads, events.read_text().splitlines()) if e.get("outcome") == "denied"]
    assert denied == [], denied
    assert "ipv6 True" in out, out  # the probe's bind succeeded: nothing to refuse
    assert "refusal" not in err, err

    bind = f"import socket; socket.socket(socket.AF_INET6).bind(('::1', {unlisted}))"
    code = main(["exec", "--events", str(events), "--", "python3", "-c", bind])
    _, err = capfd.readouterr()
    assert code != 0
    denied = [e for e in map(json.loads, events.read_text().splitlines()) if e.get("outcome") == "denied"]
    assert [(e["layer"], e["detail"].get("blockers"), e["detail"].get("saddr")) for e in denied] == [
        ("landlock", ["net.bind_tcp"], "::1")
    ], denied
    assert "TCP bind on ::1" in err, err


ROOT = Path(__file__).resolve().parents[2]
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD", re.IGNORECASE)


def _yaml_blocks() -> list[tuple[str, object]]:
    import yaml

    blocks = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in re.findall(r"```yaml\n(.*?)```", doc.read_text(), re.DOTALL):
            try:
                blocks.append((doc.name, yaml.safe_load(block)))
            except yaml.YAMLError:
                continue  # a fragment with placeholders (`…`), not a policy
    return blocks


def test_no_documented_policy_puts_a_key_into_the_cells_env() -> None:
    """POLICY.md's `env` example set OPENAI_API_KEY for the cell, against the
    project's own advice (a key belongs in llm.api_key_env or secrets)."""
    blocks = _yaml_blocks()
    with_env = [
        (name, b["env"]) for name, b in blocks if isinstance(b, dict) and isinstance(b.get("env"), dict)
    ]
    assert with_env, "no documented policy has an env section: the test looks at nothing"
    for name, env in with_env:
        given = [*env.get("pass", []), *(env.get("set") or {})]
        assert not [n for n in given if SECRET_NAME.search(str(n))], (name, env)


def test_the_readmes_exec_lines_do_what_they_say(capfd: pytest.CaptureFixture[str]) -> None:
    """The README's ``exec --json -- ls /`` failed by design (/ may not be
    listed) and its ``exec --policy … -- make test`` ran in an empty fresh
    workspace. Its --json line runs as written, exit 0 and one JSON object; a
    line that runs a project's command names the project as its workspace."""
    import json
    import shlex

    lines = [
        line.split("#", 1)[0].strip()
        for line in (ROOT / "README.md").read_text().splitlines()
        if line.startswith(".venv/bin/stockade exec ")
    ]
    (json_line,) = [line for line in lines if "--json" in line]
    argv = shlex.split(json_line)[1:]
    code = main(argv)
    out, err = capfd.readouterr()
    assert code == 0, err
    result = json.loads(out)
    assert result["exit_code"] == 0 and result["stdout"], result
    projects = [line for line in lines if "--policy" in line]
    assert projects and all("--workspace" in line for line in projects), projects


def test_shipped_files_say_what_the_code_does() -> None:
    """examples/policy.yaml called the gateway "coming"; SDK.md left recording
    an intent's ``tool_call`` to the integrator, which the daemon does
    (tests/daemon: the intent events carry detail.tool_call)."""
    example = (ROOT / "examples" / "policy.yaml").read_text()
    assert "(coming)" not in example and "gateway" in example
    sdk = (ROOT / "docs" / "SDK.md").read_text()
    assert "integrator's\npart" not in sdk and "integrator's part" not in sdk
    assert "check_tool_call_id" in sdk


@pytest.mark.parametrize(
    "section",
    [
        "llm:\n  base_url: http://127.0.0.1:9/v1\n  api_key_env: STOCKADE_TEST_UNSET_KEY\n",
        "secrets:\n  - {name: T, env: STOCKADE_TEST_UNSET_KEY, hosts: [api.example.com]}\n",
    ],
    ids=["llm-key", "secret"],
)
def test_an_unset_key_is_exit_3_under_exec_and_run_alike(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, section: str
) -> None:
    """An unset key was exit 3 under exec and 2 under run: one code per kind of
    problem (a policy that cannot be honoured here), one message, both commands."""
    monkeypatch.delenv("STOCKADE_TEST_UNSET_KEY", raising=False)
    ws = tmp_path / "ws"
    ws.mkdir()
    file = tmp_path / "keyed.yaml"
    file.write_text(f"name: keyed\nworkspace: {ws}\ncommand: [/bin/true]\n{section}")
    place = ("--state", str(tmp_path / "state"), "--socket", str(tmp_path / "d.sock"))
    said = []
    for args in (("exec", "-p", str(file), "--", "true"), ("run", "-f", str(file), *place)):
        code, _, err = cli(capsys, *args)
        assert code == ExitCode.POLICY, (args, err)
        assert "STOCKADE_TEST_UNSET_KEY" in err and "not set" in err, err
        assert_one_style(err)
        said.append(err)
    assert said[0] == said[1]
    # Control: set, both start.
    monkeypatch.setenv("STOCKADE_TEST_UNSET_KEY", "value")
    assert cli(capsys, "exec", "-p", str(file), "--", "true")[0] == 0


def test_a_denied_tree_shows_names_as_policy_md_says(
    capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`deny` shows a denied tree's file names (empty stand-ins, two levels
    deep), which POLICY.md said was not so ("what is inside a denied directory
    is not shown"). What the cell lists is what the doc says; what is read is
    refused and recorded; a tree no grant covers is not there at all."""
    import json

    shown = tmp_path / "shown"
    (shown / "a" / "b" / "c").mkdir(parents=True)
    (shown / "a" / "top.txt").write_text("secret one")
    (shown / "a" / "b" / "mid.txt").write_text("secret two")
    (shown / "a" / "b" / "c" / "deep.txt").write_text("secret three")
    ungranted = tmp_path / "ungranted"
    ungranted.mkdir()
    file = tmp_path / "p.yaml"
    file.write_text(f"name: t\nfilesystem:\n  read: [{shown}]\n  deny: [{shown}/a]\n")
    script = f"find {shown} | sort; cat {shown}/a/top.txt; ls {ungranted}; true"
    events = tmp_path / "events.jsonl"
    code = main(["exec", "-p", str(file), "--events", str(events), "--", "sh", "-c", script])
    out, err = capfd.readouterr()
    assert code == 0, err
    listed = [line.removeprefix(str(shown)) for line in out.splitlines()]
    assert listed == ["", "/a", "/a/b", "/a/b/c", "/a/b/mid.txt", "/a/top.txt"], out
    assert "secret" not in out
    assert "No such file or directory" in err and str(ungranted) in err, err
    denied = [e for e in map(json.loads, events.read_text().splitlines()) if e.get("outcome") == "denied"]
    assert [e["detail"].get("path") for e in denied] == [f"{shown}/a/top.txt"], denied
    row = next(
        line for line in (ROOT / "docs" / "POLICY.md").read_text().splitlines() if line.startswith("| `deny`")
    )
    assert "two levels deep" in row and "not shown" not in row, row
