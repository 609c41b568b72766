"""AgentOS manifests load unchanged and mean the same thing.

The manifests are the AgentOS project's own, kept in ../shared/agentos (never
copied into this repository).
"""

from __future__ import annotations

import json

import pytest

from stockade.errors import PolicyError
from stockade.policy._default import DEFAULT_LIMITS, PROTECT, SECRETS_DENY, SYSTEM_READ
from stockade.policy._load import load_policy, load_policy_file, loads_policy, loads_policy_text
from stockade.policy._model import HostRule, Policy
from tests._agentos import BAD, GOOD, manifest, require

ENV = {"ANTHROPIC_API_KEY": "sk-ant-test", "TEST_API_KEY": "sk-test"}


def agentos(name: str) -> Policy:
    loaded = load_policy_file(manifest(name), environ=ENV)
    assert loaded.format == "agentos"
    return loaded.policy


def test_the_shared_manifests_are_there() -> None:
    require()
    assert len(GOOD) == 13 and len(BAD) == 5
    assert "curl-blocked.json" in GOOD


@pytest.mark.parametrize("name", GOOD)
def test_every_accepted_manifest_loads(name: str) -> None:
    policy = agentos(name)
    source = manifest(name)
    raw = json.loads(source.read_text()) if name.endswith(".json") else None
    assert policy.source == str(source)
    # What every manifest means here: the system directories read-only, the
    # secrets hidden, the protected files protected, the default limits.
    assert policy.filesystem.read[: len(SYSTEM_READ)] == SYSTEM_READ
    assert policy.filesystem.deny == SECRETS_DENY
    assert policy.filesystem.protect == PROTECT
    assert policy.limits.memory == DEFAULT_LIMITS.memory
    assert policy.limits.pids == DEFAULT_LIMITS.pids
    if raw is not None:
        assert policy.name == raw["name"]


@pytest.mark.parametrize(
    ("name", "where", "message"),
    [
        (
            "bad-cidr.yaml",
            "5:5",
            "allowed_hosts[0] '10.0.0.0/33' is not a valid network: the prefix length must be "
            "a number from 0 to 32 for IPv4; write a network such as '10.0.0.0/8'",
        ),
        (
            "internal_manifest_testdata_bad-cidr.yaml",
            "4:5",
            "allowed_hosts[0] '10.0.0.0/33' is not a valid network",
        ),
        (
            "bad-paths.yaml",
            "8:5",
            "allowed_paths[0] '/srv/**' uses '**', which paths do not support; a directory "
            "stands for its whole tree, so write '/srv/'",
        ),
        (
            "internal_manifest_testdata_bad-paths.yaml",
            "5:5",
            "allowed_paths[0] '/foo/**' uses '**'",
        ),
        (
            "internal_manifest_testdata_bad-typo.yaml",
            "4:1",
            "allowed_pots is not a known key; did you mean 'allowed_paths'? (valid keys: name, "
            "command, mode, allowed_hosts, allowed_paths,",
        ),
    ],
)
def test_bad_manifests_are_refused_with_a_clear_error(name: str, where: str, message: str) -> None:
    require()
    assert name in BAD
    with pytest.raises(PolicyError) as info:
        load_policy(manifest(name), environ=ENV)
    assert info.value.location == f"{manifest(name)}:{where}"
    assert message in info.value.message


def test_every_bad_manifest_is_in_the_table_above() -> None:
    require()
    covered = {
        "bad-cidr.yaml",
        "internal_manifest_testdata_bad-cidr.yaml",
        "bad-paths.yaml",
        "internal_manifest_testdata_bad-paths.yaml",
        "internal_manifest_testdata_bad-typo.yaml",
    }
    assert set(BAD) == covered


def test_llm_agent() -> None:
    policy = agentos("llm-agent.yaml")
    assert policy.name == "llm-agent"
    assert policy.command == ("/usr/bin/python3", "/opt/agents/demo.py")
    assert policy.mode == "enforce"
    assert policy.network.allow == (HostRule("api.anthropic.com"), HostRule("api.openai.com"))
    # /opt/agents/ is the tree; the log file a single file; both read-write.
    assert policy.filesystem.write == ("/opt/agents", "/tmp/llm-agent.log")
    assert policy.workdir == "/opt/agents"
    env = dict(policy.env.set)
    assert env["ANTHROPIC_API_KEY"] == "sk-ant-test"  # ${ANTHROPIC_API_KEY} expanded
    assert env["PYTHONUNBUFFERED"] == "1"
    assert policy.limits.timeout == 300.0  # "5m"
    assert policy.exec.allow == ()  # no allowed_bins: any program


def test_testdata_llm_agent_allows_a_private_network() -> None:
    policy = agentos("internal_manifest_testdata_ok-llm-agent.yaml")
    assert HostRule("10.0.0.0/8") in policy.network.allow
    assert dict(policy.env.set)["ANTHROPIC_API_KEY"] == "sk-test"  # from ${TEST_API_KEY}


def test_unset_variable_in_a_manifest_env_is_an_error() -> None:
    with pytest.raises(PolicyError) as info:
        load_policy(manifest("llm-agent.yaml"), environ={})
    assert info.value.location == f"{manifest('llm-agent.yaml')}:13:22"
    assert "env.ANTHROPIC_API_KEY '${ANTHROPIC_API_KEY}' uses the variable" in info.value.message


def test_allowed_net_and_blocked_net() -> None:
    allowed, blocked = agentos("allowed-net.yaml"), agentos("blocked-net.yaml")
    assert allowed.network.allow == (HostRule("1.1.1.1", ports=(80,)),)
    assert blocked.network.allow == ()
    for policy in (allowed, blocked):
        assert policy.command[:2] == ("python3", "-c")
        assert policy.exec.allow == ("/usr/bin/python3",)
        assert policy.filesystem.write == ("/",)  # allowed_paths: [/]
        assert policy.limits.timeout is None  # AgentOS: no timeout


def test_curl_blocked_json() -> None:
    policy = agentos("curl-blocked.json")
    assert policy.command == ("curl", "-m", "3", "http://1.1.1.1")
    assert policy.exec.allow == ("/usr/bin/curl",)
    assert policy.network.allow == ()
    assert dict(policy.env.set).keys() == {"PATH"}  # env: {} adds nothing


def test_paths_in_system_directories_stay_read_only() -> None:
    policy = agentos("policies_strict-llm-agent.yaml")
    assert policy.filesystem.read == (
        *SYSTEM_READ,
        "/usr/lib/python3",
        "/usr/lib/x86_64-linux-gnu",
        "/etc/ssl/certs",
    )
    assert policy.filesystem.write == ("/tmp/agent-workdir",)
    assert policy.command == ()  # an AgentOS policy has no command
    assert policy.exec.allow == ("/usr/bin/python3",)


def test_demo_agent_and_file_reader() -> None:
    demo = agentos("demo-agent.yaml")
    assert demo.filesystem.write == ("/tmp",)
    assert demo.filesystem.read[len(SYSTEM_READ) :] == ("/usr/lib/python3", "/etc/ssl/certs")
    assert demo.network.allow == (HostRule("api.openai.com"),)
    reader = agentos("file-reader.yaml")
    assert reader.filesystem.read[len(SYSTEM_READ) :] == ("/etc/hostname",)
    assert reader.filesystem.write == ()


def test_shell_runner_keeps_its_glob_and_tree() -> None:
    policy = agentos("shell-runner.yaml")
    assert policy.command == ("/bin/sh", "-c", "ls /tmp/work && head -n1 /var/log/syslog")
    assert policy.filesystem.write == ("/tmp/work", "/var/log/*.log")
    assert policy.workdir == "/tmp/work"


def test_web_fetchers_and_orchestrator() -> None:
    assert agentos("web-fetcher.yaml").limits.timeout == 30.0
    assert agentos("web-fetcher.yaml").network.allow == (HostRule("example.com"),)
    orchestrator = agentos("orchestrator_demo_agent.yaml")
    assert orchestrator.network.allow == (
        HostRule("llm-proxy.dev.outshift.ai"),
        HostRule("ducktail-clutch-referee.ngrok-free.app"),
    )


def test_default_audit_policy() -> None:
    policy = agentos("policies_default.yaml")
    assert policy.mode == "audit"
    assert policy.name == "default-audit"
    assert policy.filesystem.write == ()


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("mode: ''\n", {"mode": "enforce"}),
        ("timeout: '0'\n", {"timeout": None}),
        ("timeout: 0\n", {"timeout": None}),
        ("timeout: 1h30m\n", {"timeout": 5400.0}),
        ("timeout: 45\n", {"timeout": 45.0}),
        ("user: nobody\n", {}),
        ("user: 65534\n", {}),
        ("stdin: 'file:/dev/null'\n", {}),
        ("id: 7\n", {}),
        ("forbidden_caps: [CAP_SYS_ADMIN, CAP_CHECKPOINT_RESTORE]\n", {}),
        ("env: {A: 1, B: yes}\n", {"env": {"A": "1", "B": "yes"}}),
    ],
)
def test_agentos_fields(extra: str, expected: dict[str, object]) -> None:
    policy = loads_policy("name: x\nallowed_paths: []\n" + extra, environ={})
    if "mode" in expected:
        assert policy.mode == expected["mode"]
    if "timeout" in expected:
        assert policy.limits.timeout == expected["timeout"]
    if "env" in expected:
        assert {k: v for k, v in policy.env.set if k != "PATH"} == expected["env"]


def test_agentos_does_not_expand_variables_outside_env() -> None:
    policy = loads_policy("name: x\nallowed_paths: ['/srv/${X}']\nenv: {A: '${X}'}\n", environ={"X": "y"})
    assert policy.filesystem.write == ("/srv/${X}",)
    assert dict(policy.env.set)["A"] == "y"


@pytest.mark.parametrize(
    ("text", "fmt"),
    [
        ("name: x\ncommand: [a]\nmode: audit\ndescription: d\n", "stockade"),
        ("name: x\nenv: {set: {A: b}}\n", "stockade"),
        ("name: x\nallowed_hosts: []\n", "agentos"),
        ("name: x\nid: 3\n", "agentos"),
        ("name: x\ntimeout: 5m\n", "agentos"),
    ],
)
def test_the_format_is_told_by_the_keys(text: str, fmt: str) -> None:
    assert loads_policy_text(text, environ={}).format == fmt


@pytest.mark.parametrize(
    ("agentos_key", "stockade_key", "fix"),
    [
        ("allowed_hosts: []", "network: {}", "(line 3); write it as network.allow, so that"),
        ("allowed_bins: []", "limits: {}", "write it as exec.allow"),
        ("working_dir: /x", "workspace: /x", "write it as workdir"),
        ("timeout: 5m", "tools: []", "write it as limits.timeout"),
        ("forbidden_caps: []", "exec: {}", "remove it (a cell holds no capability at all), so that"),
        ("id: 1", "network: {}", "remove it (stockade names a policy by its name)"),
        ("stdin: close", "network: {}", "remove it (stockade exec passes its own stdin)"),
    ],
)
def test_mixing_the_formats_says_what_to_write(agentos_key: str, stockade_key: str, fix: str) -> None:
    with pytest.raises(PolicyError) as info:
        loads_policy(f"name: x\n{agentos_key}\n{stockade_key}\n", environ={})
    assert info.value.location == "<string>:2:1"
    assert "is a key of AgentOS manifests, but this file also has the stockade key" in str(info.value)
    assert fix in info.value.message
