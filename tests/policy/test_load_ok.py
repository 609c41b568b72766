"""What a valid stockade policy file means once loaded."""

from __future__ import annotations

import dataclasses
import re
import textwrap
from pathlib import Path

import pytest

from stockade.errors import PolicyError
from stockade.policy import default_policy
from stockade.policy._default import (
    DEFAULT_LIMITS,
    DEFAULT_PASSTHROUGH,
    DEFAULT_PATH,
    PROTECT,
    SECRETS_DENY,
    SYSTEM_READ,
)
from stockade.policy._load import load_policy, load_policy_file, loads_policy
from stockade.policy._model import HostRule, LlmPolicy, ToolRule

DOCS = Path(__file__).parents[2] / "docs" / "POLICY.md"


def load(text: str, **environ: str) -> object:
    return loads_policy(textwrap.dedent(text), environ=environ)


def test_smallest_policy_is_the_default_policy() -> None:
    policy = loads_policy("name: default\n", environ={})
    assert policy == default_policy()


def test_base_system_adds_the_file_lists_to_the_defaults() -> None:
    policy = loads_policy(
        textwrap.dedent(
            """\
            name: a
            filesystem:
              read: [/opt/data/, /usr]
              write: [/srv/out]
              deny: [/opt/data/keys]
              protect: [.github/workflows]
            """
        ),
        environ={},
    )
    fs = policy.filesystem
    assert fs.read == (*SYSTEM_READ, "/opt/data")  # /usr only once
    assert fs.write == ("/srv/out",)
    assert fs.deny == (*SECRETS_DENY, "/opt/data/keys")
    assert fs.protect == (*PROTECT, ".github/workflows")


def test_base_none_uses_only_the_file_lists() -> None:
    policy = loads_policy(
        "name: a\nfilesystem:\n  base: none\n  read: [/usr]\n  protect: [/x/.git]\n", environ={}
    )
    assert policy.filesystem.read == ("/usr",)
    assert policy.filesystem.deny == ()
    assert policy.filesystem.protect == ("/x/.git",)


@pytest.mark.parametrize(
    ("written", "normalised"),
    [
        ("/opt/data/", "/opt/data"),
        ("//opt///data", "/opt/data"),
        ("/opt/./data/.", "/opt/data"),
        ("/var/log/*.log", "/var/log/*.log"),
        ("/srv/[ab]?/x", "/srv/[ab]?/x"),
        ("/", "/"),
    ],
)
def test_paths_are_normalised(written: str, normalised: str) -> None:
    policy = loads_policy(f"name: a\nfilesystem: {{write: ['{written}']}}\n", environ={})
    assert policy.filesystem.write == (normalised,)


def test_protect_entries_may_be_relative_and_are_normalised() -> None:
    policy = loads_policy("name: a\nfilesystem: {protect: ['./.env/', 'a//b']}\n", environ={})
    assert policy.filesystem.protect[-2:] == (".env", "a/b")


def test_command_list_and_command_string() -> None:
    assert load("name: a\ncommand: [python3, agent.py]\n").command == ("python3", "agent.py")  # type: ignore[attr-defined]
    assert load("name: a\ncommand: echo hi | wc -c\n").command == (  # type: ignore[attr-defined]
        "/bin/sh",
        "-c",
        "echo hi | wc -c",
    )


def test_plain_scalars_are_taken_as_written_where_text_is_wanted() -> None:
    policy = loads_policy(
        textwrap.dedent(
            """\
            name: 007
            command: [sleep, 10, 1.50, yes]
            env:
              set:
                PYTHONUNBUFFERED: 1
                ON: on
            """
        ),
        environ={},
    )
    assert policy.name == "007"
    assert policy.command == ("sleep", "10", "1.50", "yes")
    assert ("PYTHONUNBUFFERED", "1") in policy.env.set
    assert ("ON", "on") in policy.env.set


def test_yaml_words_are_keys_as_written() -> None:
    # YAML 1.1 reads a bare 'on' as true; a key is always taken as written.
    policy = loads_policy("name: a\nenv:\n  set: {on: x, yes: y}\n", environ={})
    assert ("on", "x") in policy.env.set and ("yes", "y") in policy.env.set


def test_mode_workdir_workspace(tmp_path: Path) -> None:
    file = tmp_path / "agent.yaml"
    file.write_text("name: a\nmode: audit\nworkspace: proj/\nworkdir: /srv/x/src\n")
    (tmp_path / "other.yaml").write_text("name: b\nworkspace: /srv/x\nworkdir: /srv/x/src\n")
    with pytest.raises(PolicyError, match="workdir '/srv/x/src' is outside the workspace"):
        load_policy(file)
    policy = load_policy(tmp_path / "other.yaml")
    assert policy.mode == "enforce"
    assert policy.workspace == "/srv/x"
    assert policy.workdir == "/srv/x/src"


def test_relative_workspace_is_relative_to_the_policy_file(tmp_path: Path) -> None:
    (tmp_path / "cfg").mkdir()
    file = tmp_path / "cfg" / "agent.yaml"
    file.write_text("name: a\nworkspace: ../proj\n")
    policy = load_policy(file)
    assert policy.workspace == str(tmp_path / "proj")
    file.write_text("name: a\nworkspace: .\n")
    assert load_policy(file).workspace == str(tmp_path / "cfg")


def test_source_is_the_absolute_path_of_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "agent.yaml").write_text("name: a\n")
    monkeypatch.chdir(tmp_path)
    assert load_policy("agent.yaml").source == str(tmp_path / "agent.yaml")
    assert loads_policy("name: a\n").source is None


def test_env_defaults_and_what_the_file_adds() -> None:
    policy = loads_policy("name: a\nenv:\n  pass: [HOME, TERM]\n  set: {LANG: C.UTF-8, X: '1'}\n", environ={})
    names = [n for n in DEFAULT_PASSTHROUGH if n != "LANG"]
    assert policy.env.passthrough == (*names, "HOME")
    assert dict(policy.env.set) == {"PATH": DEFAULT_PATH, "LANG": "C.UTF-8", "X": "1"}


def test_env_pass_path_replaces_the_default_path() -> None:
    policy = loads_policy("name: a\nenv: {pass: [PATH]}\n", environ={})
    assert "PATH" in policy.env.passthrough
    assert "PATH" not in dict(policy.env.set)


def test_env_base_none_starts_empty() -> None:
    policy = loads_policy("name: a\nenv: {base: none, set: {A: b}}\n", environ={})
    assert policy.env.passthrough == ()
    assert policy.env.set == (("A", "b"),)


def test_limits_default_per_field_and_null_or_unlimited_means_none() -> None:
    policy = loads_policy(
        "name: a\nlimits:\n  memory: 512M\n  pids: unlimited\n  timeout: null\n", environ={}
    )
    assert policy.limits.memory == 512 * 1024**2
    assert policy.limits.pids is None
    assert policy.limits.timeout is None
    assert policy.limits.output == DEFAULT_LIMITS.output
    assert policy.limits.cpu == DEFAULT_LIMITS.cpu


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        ("{memory: 2G}", {"memory": 2 * 1024**3}),
        ("{memory: 1.5GiB}", {"memory": 3 * 1024**3 // 2}),
        ("{memory: 1048576}", {"memory": 1024**2}),
        ("{output: 64k}", {"output": 64 * 1024}),
        ("{output: 0}", {"output": 0}),
        ("{cpu: 50%}", {"cpu": 0.5}),
        ("{cpu: 2}", {"cpu": 2.0}),
        ("{cpu: '1.5'}", {"cpu": 1.5}),
        ("{timeout: 30s}", {"timeout": 30.0}),
        ("{timeout: 5m}", {"timeout": 300.0}),
        ("{timeout: 1h30m}", {"timeout": 5400.0}),
        ("{timeout: 90}", {"timeout": 90.0}),
        ("{timeout: 2.5}", {"timeout": 2.5}),
        ("{pids: 64}", {"pids": 64}),
    ],
)
def test_limit_units(limits: str, expected: dict[str, object]) -> None:
    policy = loads_policy(f"name: a\nlimits: {limits}\n", environ={})
    assert {k: getattr(policy.limits, k) for k in expected} == expected


def test_network_entries_in_both_forms() -> None:
    policy = loads_policy(
        textwrap.dedent(
            """\
            name: a
            network:
              allow:
                - api.openai.com
                - "*.Example.COM:8443"
                - "**.example.org."
                - 203.0.113.7:80
                - "[2001:db8::1]:8080"
                - 2001:db8::/32
                - 10.0.0.0/8:5432
                - host: api.anthropic.com
                  ports: 443
                  methods: [post, GET]
                  paths: [/v1/]
              loopback_ports: [8000, 8000, 9000]
            """
        ),
        environ={},
    )
    assert policy.network.allow == (
        HostRule("api.openai.com"),
        HostRule("*.example.com", ports=(8443,)),
        HostRule("**.example.org"),
        HostRule("203.0.113.7", ports=(80,)),
        HostRule("2001:db8::1", ports=(8080,)),
        HostRule("2001:db8::/32"),
        HostRule("10.0.0.0/8", ports=(5432,)),
        HostRule("api.anthropic.com", ports=(443,), methods=("POST", "GET"), paths=("/v1/",)),
    )
    assert policy.network.loopback_ports == (8000, 9000)


def test_tools_and_llm() -> None:
    policy = loads_policy(
        textwrap.dedent(
            """\
            name: a
            tools:
              - id: read-docs
                intent: fs.read
                verdict: allow
                match: {path: "/srv/docs/*"}
              - {id: ask-rest, intent: http.fetch, verdict: ask}
            llm:
              provider: anthropic
              model: claude-sonnet
              api_key_env: ANTHROPIC_API_KEY
              max_requests: 100
            """
        ),
        environ={},
    )
    assert policy.tools == (
        ToolRule("read-docs", "fs.read", "allow", (("path", "/srv/docs/*"),)),
        ToolRule("ask-rest", "http.fetch", "ask"),
    )
    assert policy.llm == LlmPolicy(
        provider="anthropic",
        base_url="https://api.anthropic.com",
        model="claude-sonnet",
        api_key_env="ANTHROPIC_API_KEY",
        max_requests=100,
    )
    custom = loads_policy("name: a\nllm: {base_url: 'http://127.0.0.1:11434/v1/'}\n", environ={})
    assert custom.llm == LlmPolicy(provider="openai", base_url="http://127.0.0.1:11434/v1")


def test_variables_are_expanded_in_values() -> None:
    policy = loads_policy(
        textwrap.dedent(
            """\
            name: a
            workspace: ${HOME}/proj
            command: echo $${NOT_EXPANDED} $$HOME $HOME
            env:
              set:
                TOKEN: "${TOKEN}"
                LEVEL: "${LEVEL:-info}"
                EMPTY: "${EMPTY:-fallback}"
                KEPT: "${EMPTY}"
            """
        ),
        environ={"HOME": "/home/me", "TOKEN": "s3cret", "EMPTY": ""},
    )
    assert policy.workspace == "/home/me/proj"
    assert policy.command == ("/bin/sh", "-c", "echo ${NOT_EXPANDED} $$HOME $HOME")
    env = dict(policy.env.set)
    assert env["TOKEN"] == "s3cret"
    assert env["LEVEL"] == "info"
    assert env["EMPTY"] == "fallback"
    assert env["KEPT"] == ""


def test_environ_defaults_to_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOCKADE_TEST_VAR", "/srv/from-env")
    assert loads_policy("name: a\nworkspace: ${STOCKADE_TEST_VAR}\n").workspace == "/srv/from-env"


def test_anchors_aliases_and_merge_keys() -> None:
    policy = loads_policy(
        textwrap.dedent(
            """\
            name: a
            tools:
              - &base {id: one, intent: fs.read, verdict: allow}
              - <<: *base
                id: two
                verdict: deny
            filesystem:
              read: &dirs [/opt/a, /opt/b]
              write: [/srv/out]
            exec:
              allow: *dirs
            """
        ),
        environ={},
    )
    assert [(t.id, t.intent, t.verdict) for t in policy.tools] == [
        ("one", "fs.read", "allow"),
        ("two", "fs.read", "deny"),
    ]
    assert policy.exec.allow == ("/opt/a", "/opt/b")


def test_json_and_schema_key(tmp_path: Path) -> None:
    file = tmp_path / "p.json"
    file.write_text('{\n\t"$schema": "./policy.schema.json",\n\t"name": "j",\n\t"mode": "audit"\n}\n')
    loaded = load_policy_file(file)
    assert loaded.format == "stockade"
    assert loaded.policy.name == "j" and loaded.policy.mode == "audit"


def test_byte_order_mark_is_ignored(tmp_path: Path) -> None:
    file = tmp_path / "p.yaml"
    file.write_bytes("\ufeffname: bom\n".encode())
    assert load_policy(file).name == "bom"


def test_exec_allow_names_files_and_directories_inside_readable_paths() -> None:
    policy = loads_policy(
        "name: a\nworkspace: /srv/proj\nexec: {allow: [/usr/bin/python3, /srv/proj/bin, /usr/lib/]}\n",
        environ={},
    )
    assert policy.exec.allow == ("/usr/bin/python3", "/srv/proj/bin", "/usr/lib")


def test_policies_are_frozen_and_hashable() -> None:
    policy = loads_policy("name: a\nnetwork: {allow: [a.example.com]}\n", environ={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.name = "b"  # type: ignore[misc]
    assert hash(policy) == hash(loads_policy("name: a\nnetwork: {allow: [a.example.com]}\n", environ={}))


# ------------------------------------------------------------- docs/POLICY.md


def _yaml_blocks(title: str) -> list[str]:
    text = DOCS.read_text()
    section = text.split(f"<!-- {title} -->", 1)[1]
    return re.findall(r"```yaml\n(.*?)```", section.split("<!-- end -->", 1)[0], re.DOTALL)


def test_the_default_policy_in_the_docs_is_the_built_in_one() -> None:
    (block,) = _yaml_blocks("default-policy")
    assert loads_policy(block, environ={}) == default_policy()


def test_every_yaml_example_in_the_docs_loads() -> None:
    text = DOCS.read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.DOTALL)
    assert len(blocks) >= 5
    environ = {"HOME": "/home/me", "OPENAI_API_KEY": "sk-test", "ANTHROPIC_API_KEY": "sk-test"}
    for block in blocks:
        if block.lstrip().startswith("# error"):
            with pytest.raises(PolicyError):
                loads_policy(block, environ=environ)
        else:
            loads_policy(block, source=str(DOCS), environ=environ)


def test_secret_places_default_to_authorization_only_and_opt_in_per_secret() -> None:
    policy = load(
        """
        name: s
        llm: {provider: openai, remote_images: true}
        secrets:
          - {name: GH, env: GH, hosts: [api.github.com]}
          - name: OAI
            env: OAI
            hosts: [api.openai.com]
            headers: [X-Api-Key, x-api-key, Authorization]
            body: true
            url: true
        """
    )
    gh, oai = policy.secrets
    assert (gh.headers, gh.body, gh.url) == (("Authorization",), False, False)
    assert (oai.headers, oai.body, oai.url) == (("X-Api-Key", "x-api-key", "Authorization"), True, True)
    assert policy.llm is not None and policy.llm.remote_images is True
    assert load("name: s\nllm: {provider: openai}\n").llm.remote_images is False  # type: ignore[union-attr]
