"""The scenario file: what loads, and what is refused with which file:line:col and message."""

from __future__ import annotations

import itertools
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stockade.errors import PolicyError
from stockade.scenario import load_scenario, loads_scenario


def write(tmp_path: Path, text: str, name: str = "scenario.yaml") -> Path:
    (tmp_path / "agent.yaml").write_text("name: agent\ncommand: [/bin/true]\n")
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def refused(tmp_path: Path, text: str) -> PolicyError:
    with pytest.raises(PolicyError) as info:
        load_scenario(write(tmp_path, text))
    return info.value


def test_a_valid_file_loads_in_launch_order_with_paths_resolved_and_defaults(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "p.yaml").write_text(
        "name: p\ncommand: [/bin/sh, -c, 'echo ${GREETING:-hi} $STOCKADE_REPLICA']\nenv:\n  pass: [HOME]\n"
    )
    path = write(
        tmp_path,
        """
        name: pipeline
        agents:
          - name: summarise
            policy: sub/p.yaml
            depends_on: [fetch, fetch]
            launch_when: always
            replicas: 3
            restart: {max: 2}
          - name: fetch
            policy: agent.yaml
            command: [/bin/sh, -c, "echo fetched"]
        """,
    )
    scenario = load_scenario(path)
    assert scenario.name == "pipeline"
    assert [a.name for a in scenario.agents] == ["fetch", "summarise"], "dependencies come first"
    fetch, summarise = scenario.agents
    assert fetch.policy == str(tmp_path / "agent.yaml")
    assert fetch.command == ("/bin/sh", "-c", "echo fetched")
    assert (fetch.launch_when, fetch.replicas, fetch.restart_max, fetch.depends_on) == ("success", 1, 0, ())
    assert fetch.unit_names() == ("fetch",)
    assert summarise.policy == str(tmp_path / "sub" / "p.yaml")
    assert summarise.depends_on == ("fetch",), "a dependency named twice counts once"
    assert (summarise.launch_when, summarise.replicas, summarise.restart_max) == ("always", 3, 2)
    assert summarise.unit_names() == ("summarise-1", "summarise-2", "summarise-3")
    # The variables the policy names travel with its runs; the runner's own are not among them.
    assert "GREETING" in summarise.env_names and "HOME" in summarise.env_names
    assert not any(n.startswith("STOCKADE_") for n in summarise.env_names)
    assert summarise.location.endswith("scenario.yaml:3:5")


@pytest.mark.parametrize(
    ("text", "where", "words"),
    [
        pytest.param(
            """
            name: s
            agents:
              - {name: a, policy: agent.yaml, depends_on: [c]}
              - {name: b, policy: agent.yaml, depends_on: [a]}
              - {name: c, policy: agent.yaml, depends_on: [b]}
            """,
            ":3:",
            ["cycle", "a -> c -> b -> a", "remove one of these depends_on"],
            id="cycle",
        ),
        pytest.param(
            """
            name: s
            agents:
              - name: fetch
                policy: agent.yaml
              - name: summarise
                policy: agent.yaml
                depends_on: [fech]
            """,
            ":7:18",
            ["'summarise' depends on 'fech'", "not an agent", "did you mean 'fetch'?", "fetch, summarise"],
            id="unknown-dependency",
        ),
        pytest.param(
            "name: s\nagents:\n  - {name: a, policy: agent.yaml, depends_on: [a]}\n",
            ":3:",
            ["'a' depends on itself"],
            id="self-dependency",
        ),
        pytest.param(
            "name: s\nagents:\n  - {name: a, policy: agent.yaml}\n  - {name: a, policy: agent.yaml}\n",
            ":4:",
            ["'a' is used by agents[0] too", "its own name"],
            id="name-twice",
        ),
        pytest.param(
            "name: s\nagents:\n  - {name: a, policy: agent.yaml, replicas: 2}\n"
            "  - {name: a-1, policy: agent.yaml}\n",
            ":4:",
            ["runs as 'a-1'", "rename one"],
            id="replica-name-taken",
        ),
        pytest.param(
            "name: s\nagents:\n  - name: a\n    policy: agent.yaml\n  - name: b\n    policy: agent.yaml\n"
            "    depends_on: [a]\n    launch_when: sucess\n",
            ":8:18",
            ["launch_when 'sucess' is not one of success, failure, always", "did you mean 'success'?"],
            id="launch-when-typo",
        ),
        pytest.param(
            "name: s\nagents:\n  - name: a\n    policy: agent.yaml\n    launch_when: failure\n",
            ":5:5",
            ["launch_when but no depends_on"],
            id="launch-when-alone",
        ),
        pytest.param(
            "name: s\nagents:\n  - name: a\n    policy: agent.yaml\n    replica: 2\n",
            ":5:5",
            ["agents[0].replica is not a known key", "did you mean 'replicas'?"],
            id="unknown-key",
        ),
        pytest.param(
            "name: s\nagents:\n  - name: a\n    policy: agent.yaml\n    replicas: 0\n",
            ":5:15",
            ["agents[0].replicas 0 is out of range", "at least 1"],
            id="no-replicas",
        ),
        pytest.param(
            "name: s\nagents:\n  - name: a\n    policy: agent.yaml\n    restart: {max: -1}\n",
            ":5:20",
            ["restart.max -1 is out of range"],
            id="negative-restarts",
        ),
        pytest.param(
            "name: s\nagents:\n  - name: a\n",
            ":3:5",
            ["agents[0].policy is missing", "policy: "],
            id="no-policy",
        ),
        pytest.param("name: s\nagents: []\n", ":2:9", ["agents is empty"], id="no-agents"),
        pytest.param(
            "name: s\nagents:\n  - {name: a, policy: agent.yaml, command: [/bin/sleep, 10]}\n",
            ":3:57",
            ["agents[0].command[1] 10 must be text; quote it: '10'"],
            id="number-in-command",
        ),
        pytest.param(
            "name: s\nagents:\n  - just-a-string\n",
            ":3:5",
            ["agents[0] must be a mapping with keys such as name, policy", "not 'just-a-string'"],
            id="agent-not-a-mapping",
        ),
        pytest.param("name: 'a b'\nagents: []\n", ":1:7", ["'a b' is not a valid name"], id="bad-name"),
        pytest.param("", ":1:1", ["the file is empty"], id="empty"),
        pytest.param("name: s\nname: t\n", ":2:1", ["name appears twice, at lines 1 and 2"], id="dup-key"),
        pytest.param("name: s\nagents: [\n", ":", ["not valid YAML"], id="bad-yaml"),
        pytest.param(
            "name: s\nagents:\n  - {name: a, policy: nowhere.yaml}\n",
            "scenario.yaml:3:23",
            ["the policy", "nowhere.yaml", "of agent 'a' does not exist"],
            id="missing-policy",
        ),
    ],
)
def test_a_wrong_file_is_refused_with_where_and_why(
    tmp_path: Path, text: str, where: str, words: list[str]
) -> None:
    exc = refused(tmp_path, textwrap.dedent(text))
    assert exc.exit_code == 3
    assert where in str(exc.location), exc
    for word in words:
        assert word in exc.message, exc


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    exc = refused(
        tmp_path,
        "name: s\nagents:\n  - name: a\n    policy: agent.yaml\n    replicas: many\n    colour: red\n",
    )
    found = [exc.message, *getattr(exc, "__notes__", [])]
    assert any("replicas 'many' is not a whole number" in f for f in found), found
    assert any("colour is not a known key" in f for f in found), found


def test_a_bad_policy_is_the_policys_error_with_the_agent_named(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("name: bad\nnot_a_key: 1\n")
    exc = refused(tmp_path, "name: s\nagents:\n  - name: worker\n    policy: bad.yaml\n")
    assert str(exc.location).startswith(str(tmp_path / "bad.yaml") + ":2:")
    assert any("scenario.yaml:4:13: the policy of agent 'worker'" in n for n in exc.__notes__)


def test_the_runners_variables_may_be_used_in_a_policy(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text("name: p\ncommand: [/bin/echo, '${STOCKADE_REPLICA}']\n")
    scenario = load_scenario(write(tmp_path, "name: s\nagents:\n  - {name: a, policy: p.yaml}\n"))
    assert scenario.agents[0].name == "a"


@st.composite
def graphs(draw: st.DrawFn) -> dict[str, list[str]]:
    n = draw(st.integers(1, 7))
    names = [f"a{i}" for i in range(n)]
    return {name: draw(st.lists(st.sampled_from(names), max_size=3, unique=True)) for name in names}


@settings(max_examples=150, deadline=None)
@given(graphs())
def test_any_graph_is_ordered_or_its_cycle_named(deps: dict[str, list[str]]) -> None:
    lines = ["name: g", "agents:"]
    for name, on in deps.items():
        lines.append(f"  - {{name: {name}, policy: p.yaml, depends_on: [{', '.join(on)}]}}")
    text = "\n".join(lines) + "\n"
    try:
        scenario = loads_scenario(text, source="/nowhere/g.yaml", check_policies=False)
    except PolicyError as exc:
        assert "cycle" in exc.message or "depends on itself" in exc.message, exc
        if "cycle" in exc.message:
            cycle = exc.message.split("cycle, ")[1].split(", so")[0].split(" -> ")
            assert cycle[0] == cycle[-1]
            for a, b in itertools.pairwise(cycle):
                assert b in deps[a], f"{a} does not depend on {b}: not a cycle"
        return
    seen: set[str] = set()
    for agent in scenario.agents:
        assert set(agent.depends_on) <= seen, f"{agent.name} comes before one of {agent.depends_on}"
        seen.add(agent.name)
    assert seen == set(deps)


def test_the_scenario_reader_is_the_policy_reader(tmp_path: Path) -> None:
    """One YAML reader (``policy._yaml``) for both kinds of file: duplicate keys
    are all reported in one round, a tag on a mapping is refused, ``<<`` merges,
    and a non-UTF-8 byte is placed at its line and column, as in a policy."""
    exc = refused(tmp_path, "name: s\nname: t\nagents: []\nagents: []\n")
    found = [exc.message, *getattr(exc, "__notes__", [])]
    assert exc.location is not None and exc.location.endswith(":2:1"), exc
    assert any("agents appears twice, at lines 3 and 4" in f for f in found), found

    exc = refused(tmp_path, "name: s\nagents: !!python/object/apply:os.system {a: 1}\n")
    tag = "'tag:yaml.org,2002:python/object/apply:os.system'"
    assert f"the YAML tag {tag} is not supported in a scenario" in exc.message, exc

    merged = load_scenario(
        write(
            tmp_path,
            """
            name: s
            agents:
              - &base {name: a, policy: agent.yaml}
              - {<<: *base, name: b}
            """,
        )
    )
    assert [a.name for a in merged.agents] == ["a", "b"]
    assert merged.agent("b").policy == str(tmp_path / "agent.yaml")

    (tmp_path / "latin.yaml").write_bytes(b"name: s\nagents: [caf\xe9]\n")
    with pytest.raises(PolicyError) as info:
        load_scenario(tmp_path / "latin.yaml")
    assert info.value.location == f"{tmp_path}/latin.yaml:2:13", info.value
