"""``stockade validate`` and ``stockade schema``."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from stockade.cli._policy_cmds import schema, validate
from stockade.policy import policy_json_schema
from tests._agentos import manifest

# The two commands as _app registers them.
app = click.Group(commands={"validate": validate, "schema": schema})


def run(*args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> Result:
    return CliRunner().invoke(app, list(args), env=env, input=stdin, catch_exceptions=False)


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    file = tmp_path / "agent.yaml"
    file.write_text(
        textwrap.dedent(
            """\
            name: researcher
            command: [python3, agent.py]
            workspace: /srv/proj
            filesystem:
              read: [/opt/papers]
            exec:
              allow: [/usr/bin/python3]
            env:
              set: {OPENAI_API_KEY: sk-very-secret}
            limits: {memory: 1G, cpu: 50%, timeout: 90m}
            network:
              allow: [api.openai.com, "*.arxiv.org:8443"]
              loopback_ports: [8000]
            tools:
              - {id: web, intent: http.fetch, verdict: ask}
            llm: {provider: openai, model: gpt-4o-mini}
            """
        )
    )
    return file


def test_validate_summarises_what_the_policy_grants(policy_file: Path) -> None:
    result = run("validate", str(policy_file))
    assert result.exit_code == 0
    out = result.stdout
    assert out.startswith(f"{policy_file}: valid stockade policy 'researcher', mode enforce\n")
    assert "  command      python3 agent.py\n" in out
    assert "  workspace    /srv/proj (read-write)\n" in out
    assert "/etc /opt/papers\n" in out
    assert "  programs     /usr/bin/python3 (against mistakes, not a boundary: the ELF loader" in out
    assert "memory 1 GiB, processes 512, cpu 0.5 cores, timeout 1h30m, output 64 MiB" in out
    assert "  network      loopback and the gateway, ports 8000\n" in out
    assert "api.openai.com:443, *.arxiv.org:8443 through the gateway; everything else refused" in out
    assert "web: http.fetch → ask (the broker; no match is a deny)" in out
    assert "openai at https://api.openai.com/v1 model gpt-4o-mini" in out
    assert "OPENAI_API_KEY" in out and "sk-very-secret" not in out
    assert "warning:" not in out


def test_validate_shows_env_values_only_when_asked(policy_file: Path) -> None:
    assert "OPENAI_API_KEY=sk-very-secret" in run("validate", "--show-env", str(policy_file)).stdout


def test_validate_json(policy_file: Path) -> None:
    result = run("validate", "--json", str(policy_file))
    assert result.exit_code == 0
    body = json.loads(result.stdout)
    assert body["valid"] is True and body["format"] == "stockade"
    policy = body["policy"]
    assert policy["name"] == "researcher"
    assert policy["limits"]["memory"] == 1024**3
    assert policy["env"]["set"]["OPENAI_API_KEY"] == "<hidden>"
    assert policy["network"]["allow"][1] == {
        "host": "*.arxiv.org",
        "ports": [8443],
        "methods": [],
        "paths": [],
    }
    assert policy["tools"] == [{"id": "web", "intent": "http.fetch", "verdict": "ask", "match": {}}]
    assert policy["source"] == str(policy_file)
    assert body["warnings"] == []
    shown = json.loads(run("validate", "--json", "--show-env", str(policy_file)).stdout)
    assert shown["policy"]["env"]["set"]["OPENAI_API_KEY"] == "sk-very-secret"


def test_validate_prints_every_problem_and_exits_3(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: a\nmode: enforcing\nfilesystem:\n  wirte: []\nnetwork: {allow: ['*']}\n")
    result = run("validate", str(bad))
    assert result.exit_code == 3
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"stockade: {bad}:2:7: mode 'enforcing' is not one of 'enforce' or 'audit'; did you mean 'enforce'?",
        f"stockade: {bad}:4:3: filesystem.wirte is not a known key; did you mean 'write'? "
        "(valid keys: base, read, write, deny, protect, mounts)",
        f"stockade: {bad}:5:19: network.allow[0].host '*' matches every host; "
        "name a domain such as '*.example.com'",
    ]


def test_validate_json_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: a\nlimits: {pids: lots, memory: 1X}\n")
    result = run("validate", "--json", str(bad))
    assert result.exit_code == 3
    body = json.loads(result.stdout)
    assert body["valid"] is False
    assert [e["location"] for e in body["errors"]] == [f"{bad}:2:16", f"{bad}:2:30"]
    assert body["errors"][0]["message"].startswith("limits.pids 'lots' is not a whole number")


def test_validate_missing_file() -> None:
    result = run("validate", "/nonexistent/agent.yaml")
    assert result.exit_code == 3
    assert result.stderr == (
        "stockade: cannot read the policy file '/nonexistent/agent.yaml': it does not exist; check the path\n"
    )
    body = json.loads(run("validate", "--json", "/nonexistent/agent.yaml").stdout)
    assert body["errors"] == [
        {"location": None, "message": body["errors"][0]["message"]},
    ]


def test_validate_reads_stdin() -> None:
    result = run("validate", "-", stdin="name: piped\nmode: audit\n")
    assert result.exit_code == 0
    assert result.stdout.startswith("<stdin>: valid stockade policy 'piped', mode audit")
    assert "warning: mode is audit" in result.stdout
    error = run("validate", "-", stdin="name: piped\nmode: x\n")
    assert error.exit_code == 3
    assert error.stderr.startswith("stockade: <stdin>:2:7: mode 'x'")


def test_validate_uses_the_callers_environment_for_variables(tmp_path: Path) -> None:
    file = tmp_path / "p.yaml"
    file.write_text("name: a\nworkspace: ${PROJ}\n")
    assert run("validate", str(file), env={"PROJ": "/srv/p"}).exit_code == 0
    result = run("validate", str(file), env={"PROJ": None})  # type: ignore[dict-item]
    assert result.exit_code == 3
    assert "uses the variable PROJ, which is not set" in result.stderr


def test_validate_agentos_manifest_warns_about_a_writable_root() -> None:
    result = run("validate", str(manifest("blocked-net.yaml")))
    assert result.exit_code == 0
    assert "valid AgentOS manifest 'blocked-net', mode enforce" in result.stdout
    assert "  read-write   /\n" in result.stdout
    assert "warning: filesystem.write '/' makes the whole host filesystem writable" in result.stdout
    assert "\\n" in result.stdout.splitlines()[1]  # a multi-line command stays on one line


def test_validate_agentos_bad_manifest() -> None:
    result = run("validate", str(manifest("bad-paths.yaml")))
    assert result.exit_code == 3
    assert "allowed_paths[0] '/srv/**' uses '**'" in result.stderr
    assert "so write '/srv/'" in result.stderr


@pytest.mark.parametrize(
    ("text", "warning"),
    [
        ("name: a\nlimits: {memory: null}\n", "there is no memory limit"),
        ("name: a\nlimits: {pids: unlimited}\n", "there is no process limit"),
        ("name: a\nfilesystem: {read: [/home/me]}\n", "'/home/me' holds a home directory"),
        ("name: a\nfilesystem: {base: none, read: [/]}\n", "filesystem.read '/' shows the whole host"),
        ("name: a\nallowed_paths: []\nworking_dir: /opt/x\n", "workdir '/opt/x' is outside every"),
        ("name: a\nallowed_paths: [/tmp]\n", "'/tmp' in the cell is its own private /tmp"),
    ],
)
def test_validate_warnings(text: str, warning: str) -> None:
    result = run("validate", "-", stdin=text)
    assert result.exit_code == 0
    assert f"warning: {warning}" in result.stdout


def test_schema_prints_the_json_schema() -> None:
    result = run("schema")
    assert result.exit_code == 0
    assert json.loads(result.stdout) == policy_json_schema()
    agentos = json.loads(run("schema", "--agentos").stdout)
    assert agentos["title"] == "AgentOS manifest"


def test_through_the_console_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from stockade.cli.main import main

    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("name: good\n")
    bad.write_text("name: bad\nmode: x\n")
    assert main(["validate", str(good)]) == 0
    assert capsys.readouterr().out.startswith(f"{good}: valid stockade policy 'good'")
    assert main(["validate", str(bad)]) == 3
    assert capsys.readouterr().err.startswith(f"stockade: {bad}:2:7: mode 'x' is not one of")
    assert main(["schema"]) == 0
    assert json.loads(capsys.readouterr().out)["title"] == "stockade policy"


def test_validate_refuses_the_operators_home_as_workspace() -> None:
    # Once a warning; now the one workspace check refuses it at every door
    # (policy/_workspace.py), validate included.
    result = run("validate", "-", stdin="name: a\nworkspace: /root\n")
    assert result.exit_code == 3
    assert "workspace '/root' holds the operator's home" in result.stderr
