"""A scenario file: a group of agents, each with its policy, and how they start.

Loading follows the policy loader (``stockade.policy._load``): the YAML is
composed with a mark on every key and value, validated by pydantic models, and
every problem is reported as ``file:line:col``, the offending value, then the
fix; the first problem is the error and the others are its notes. What only
makes sense for the whole group is checked after that: agent names used twice,
a ``depends_on`` naming no agent, a cycle (named agent by agent), and each
agent's policy, which is loaded as ``stockade run`` would load it.

The result is a frozen ``Scenario``; nothing here talks to the daemon.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from stockade.errors import PolicyError
from stockade.policy._schema import check_name
from stockade.policy._units import show
from stockade.policy._yaml import YamlDocument, located_error, read_text

MAX_BYTES = 1024 * 1024
"""A scenario file is a page; a larger one is the wrong file."""
MAX_NODES = 20_000
"""Bounds what YAML aliases can expand to."""
MAX_REPLICAS = 64
MAX_RESTARTS = 100

LaunchWhen = Literal["success", "failure", "always"]

RUN_VARIABLES = (
    "STOCKADE_SCENARIO",
    "STOCKADE_SCENARIO_DIR",
    "STOCKADE_AGENT",
    "STOCKADE_REPLICA",
    "STOCKADE_REPLICAS",
    "STOCKADE_ATTEMPT",
)
"""What the runner tells each run (``run_variables``), as variables a policy
may pass (``env.pass``) or use (``${STOCKADE_SCENARIO_DIR}/shared``)."""


def run_variables(
    scenario: str, directory: str, unit: str, replica: int, replicas: int, attempt: int
) -> dict[str, str]:
    """The variables of one run: the scenario instance's name, the scenario
    file's directory (for paths that do not depend on where it is run from),
    the run's name, its replica (from 1) of how many, its attempt (from 1)."""
    return {
        "STOCKADE_SCENARIO": scenario,
        "STOCKADE_SCENARIO_DIR": directory,
        "STOCKADE_AGENT": unit,
        "STOCKADE_REPLICA": str(replica),
        "STOCKADE_REPLICAS": str(replicas),
        "STOCKADE_ATTEMPT": str(attempt),
    }


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)")
_Path = tuple[str | int, ...]


# --------------------------------------------------------------------------- the result


@dataclass(frozen=True, slots=True)
class Agent:
    """One agent of a scenario, as it will run: ``replicas`` runs of ``policy``."""

    name: str
    policy: str
    """Absolute path of the policy file."""
    command: tuple[str, ...] | None
    """The command to run instead of the policy's own."""
    depends_on: tuple[str, ...]
    launch_when: LaunchWhen
    replicas: int
    restart_max: int
    """Restarts allowed after a crash, per replica (0: none)."""
    env_names: tuple[str, ...]
    """Variables the policy names (``env.pass``, ``${VAR}``): their values are
    sent from the caller's environment, as ``stockade run`` sends them."""
    location: str
    """``file:line:col`` of the agent in the scenario file, for messages."""

    def unit_names(self) -> tuple[str, ...]:
        """The names of its runs: the agent's own, or ``name-1`` … ``name-N`` when fanned out."""
        return unit_names(self.name, self.replicas)


def unit_names(name: str, replicas: int) -> tuple[str, ...]:
    if replicas == 1:
        return (name,)
    return tuple(f"{name}-{i}" for i in range(1, replicas + 1))


@dataclass(frozen=True, slots=True)
class Scenario:
    """A loaded, checked scenario file. ``agents`` are in a launchable order
    (every agent after the ones it depends on)."""

    name: str
    source: str
    agents: tuple[Agent, ...]

    def agent(self, name: str) -> Agent:
        return next(a for a in self.agents if a.name == name)


# --------------------------------------------------------------------------- the file's schema


def _name(value: str) -> str:
    check_name(value)
    return value


Name = Annotated[str, AfterValidator(_name)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class RestartSection(_Strict):
    max: int = Field(ge=0, le=MAX_RESTARTS, description="Restarts allowed after a crash, per replica.")


class AgentSection(_Strict):
    name: Name = Field(description="The agent's name in this scenario: letters, digits, '.', '_', '-'.")
    policy: str = Field(min_length=1, description="Its policy file, relative to the scenario file.")
    command: list[str] | None = Field(
        None, min_length=1, description="The command to run instead of the policy's."
    )
    depends_on: list[Name] = Field(
        default_factory=list, description="Agents that must all have ended before this one starts."
    )
    launch_when: LaunchWhen = Field(
        "success",
        description="success: every dependency succeeded; failure: one of them failed; always: they ended.",
    )
    replicas: int = Field(1, ge=1, le=MAX_REPLICAS, description="Runs started in parallel.")
    restart: RestartSection | None = Field(None, description="Restart a run that crashed, up to max times.")


class ScenarioFile(_Strict):
    name: Name = Field(description="The scenario's name: `stockade scenario stop NAME` stops it.")
    agents: list[AgentSection] = Field(min_length=1, description="The agents, each with its policy.")


# --------------------------------------------------------------------------- loading


@dataclass(frozen=True, slots=True)
class _Problem:
    """One thing wrong, at ``file:line:col``."""

    at: str
    message: str


def load_scenario(
    path: str | os.PathLike[str], *, environ: dict[str, str] | None = None, check_policies: bool = True
) -> Scenario:
    """Load and check the scenario file at ``path``.

    Each agent's policy is loaded too (``check_policies``), with ``environ``
    (default: ``os.environ``) and placeholders for the runner's variables.

    Raises:
        PolicyError: the file (or an agent's policy) is wrong; ``location`` is
            ``file:line:col`` and further problems are in ``__notes__``.
    """
    name = os.fspath(path)
    return loads_scenario(_read(name), source=name, environ=environ, check_policies=check_policies)


def loads_scenario(
    text: str,
    *,
    source: str,
    environ: dict[str, str] | None = None,
    check_policies: bool = True,
) -> Scenario:
    """``load_scenario`` of ``text``; relative policy paths are relative to ``source``'s directory."""
    doc = _Document(source)
    data = doc.compose(text)
    base = os.path.dirname(os.path.abspath(source))
    try:
        model = ScenarioFile.model_validate(data)
    except ValidationError as exc:
        problems = [doc.pydantic_problem(e) for e in exc.errors(include_url=False)]
        problems.extend(_raw_group_problems(doc, data))
        if check_policies:
            problems.extend(_missing_policies(doc, data, base))
        raise doc.error(problems) from None
    # Every mistake at once, as `validate` reports a policy's: the group's
    # checks and each agent's policy, not one round per kind of mistake.
    errors: list[PolicyError] = []
    try:
        agents = _agents(doc, model, base)
    except PolicyError as exc:
        errors.append(exc)
        agents = []
        missing = _missing_policies(doc, data, base) if check_policies else []
        if missing:
            errors.append(doc.error(missing))
    if check_policies:
        checked = []
        for i, agent in enumerate(agents):
            try:
                checked.append(_with_policy(doc, model.name, i, agent, environ))
            except PolicyError as exc:
                errors.append(exc)
        agents = checked
    if errors:
        raise _together(errors)
    return Scenario(name=model.name, source=os.path.abspath(source), agents=tuple(_ordered(agents)))


def _raw_group_problems(doc: _Document, data: Any) -> list[_Problem]:
    """The group's name checks (a name twice, depends_on an unknown agent) from
    the raw document, when the schema failed elsewhere (no model to run
    ``_agents`` on): so that they are reported in the same round."""
    agents = data.get("agents") if isinstance(data, dict) else None
    specs = [a if isinstance(a, dict) else {} for a in (agents if isinstance(agents, list) else [])]
    names = [a.get("name") for a in specs]
    out: list[_Problem] = []
    first: dict[str, int] = {}
    for i, name in enumerate(names):
        if not isinstance(name, str):
            continue
        if name in first:
            out.append(
                _Problem(
                    doc.at(("agents", i, "name")),
                    f"agents[{i}].name {show(name)} is used by agents[{first[name]}] too; "
                    "give each agent its own name",
                )
            )
        first.setdefault(name, i)
    for i, spec in enumerate(specs):
        deps = spec.get("depends_on")
        for j, dep in enumerate(deps if isinstance(deps, list) else []):
            if isinstance(dep, str) and dep not in first:
                out.append(
                    _Problem(
                        doc.at(("agents", i, "depends_on", j)),
                        f"agents[{i}] depends on {show(dep)}, which is not an agent of this scenario; "
                        "name one of them",
                    )
                )
    return out


def _missing_policies(doc: _Document, data: Any, base: str) -> list[_Problem]:
    """Agents whose ``policy`` names no file, from the raw document (the
    schema failed elsewhere, so there is no model to read it from)."""
    agents = data.get("agents") if isinstance(data, dict) else None
    out: list[_Problem] = []
    for i, spec in enumerate(agents if isinstance(agents, list) else []):
        policy = spec.get("policy") if isinstance(spec, dict) else None
        if isinstance(policy, str) and policy and not os.path.isfile(os.path.join(base, policy)):
            out.append(
                _Problem(
                    doc.at(("agents", i, "policy")),
                    f"the policy {show(os.path.normpath(os.path.join(base, policy)))} of agents[{i}] does "
                    "not exist; check the path (it is relative to the scenario file)",
                )
            )
    return out


def _together(errors: list[PolicyError]) -> PolicyError:
    """One error for several: the first, the others (and their notes) as notes."""
    first = errors[0]
    for other in errors[1:]:
        first.add_note(str(other))
        for note in getattr(other, "__notes__", ()):
            first.add_note(note)
    return first


def _read(name: str) -> str:
    return read_text(name, kind="scenario", max_bytes=MAX_BYTES)


class _Document(YamlDocument):
    """A scenario file's data and marks, read as a policy file is (``policy._yaml``)."""

    def __init__(self, source: str) -> None:
        super().__init__(source, kind="scenario", example="'name: my-scenario'", max_nodes=MAX_NODES)

    def at(self, path: _Path, *, key: bool = False) -> str:
        return self.location(path, at_key=key)

    def error(self, problems: list[_Problem]) -> PolicyError:
        def position(p: _Problem) -> tuple[int, int]:
            _, line, col = p.at.rsplit(":", 2)
            return int(line), int(col)

        return located_error(self.source, [(position(p), p.message) for p in problems])

    def pydantic_problem(self, error: Any) -> _Problem:
        path: _Path = tuple(error["loc"])
        kind, value, ctx = error["type"], error.get("input"), error.get("ctx") or {}
        field = _dotted(path) or "the file"
        if kind == "extra_forbidden":
            valid = _keys_at(path[:-1])
            close = difflib.get_close_matches(str(path[-1]), valid, n=1)
            fix = f"did you mean {show(close[0])}?" if close else f"use one of {', '.join(valid)}"
            return _Problem(self.at(path, key=True), f"{field} is not a known key; {fix}")
        if kind == "missing":
            example = {"name": "'name: fetch'", "policy": "'policy: fetch.yaml'", "agents": "'agents:'"}
            shown = example.get(str(path[-1]), f"'{path[-1]}: …'")
            return _Problem(self.at(path[:-1]), f"{field} is missing; add it, as in {shown}")
        if kind == "literal_error":
            options = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
            close = difflib.get_close_matches(str(value), options, n=1, cutoff=0.5)
            fix = f"did you mean {show(close[0])}?" if close else f"write one of {', '.join(options)}"
            return _Problem(self.at(path), f"{field} {show(value)} is not one of {', '.join(options)}; {fix}")
        if kind in ("dict_type", "model_type", "model_attributes_type"):
            keys = ", ".join(_keys_at(path)[:4])
            return _Problem(
                self.at(path), f"{field} must be a mapping with keys such as {keys}, not {show(value)}"
            )
        if kind == "list_type":
            return _Problem(self.at(path), f"{field} must be a list, such as [a, b], not {show(value)}")
        if kind == "too_short":
            return _Problem(self.at(path), f"{field} is empty; list at least one item, or remove the line")
        if kind in ("greater_than_equal", "less_than_equal"):
            bound = ctx.get("ge", ctx.get("le"))
            side = "at least" if kind == "greater_than_equal" else "at most"
            return _Problem(self.at(path), f"{field} {show(value)} is out of range; write {side} {bound}")
        if kind in ("int_type", "int_parsing"):
            return _Problem(
                self.at(path), f"{field} {show(value)} is not a whole number; write one, such as 2"
            )
        if kind == "string_type":
            return _Problem(self.at(path), f"{field} {show(value)} must be text; quote it: '{value}'")
        msg = str(error["msg"]).removeprefix("Value error, ")
        return _Problem(self.at(path), f"{field} is not valid: {msg}")


def _dotted(path: _Path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + part
    return out


def _keys_at(path: _Path) -> list[str]:
    """The keys of the mapping at ``path`` (the top, an agent, a restart)."""
    named = [p for p in path if isinstance(p, str)]
    model: type[BaseModel] = ScenarioFile
    if named[:1] == ["agents"]:
        model = RestartSection if named[1:2] == ["restart"] else AgentSection
    return list(model.model_fields)


# --------------------------------------------------------------------------- the group's checks


def _agents(doc: _Document, model: ScenarioFile, base: str) -> list[Agent]:
    problems: list[_Problem] = []
    names = [a.name for a in model.agents]
    seen: dict[str, int] = {}
    units: dict[str, str] = {}
    for i, spec in enumerate(model.agents):
        if spec.name in seen:
            problems.append(
                _Problem(
                    doc.at(("agents", i, "name")),
                    f"agents[{i}].name {show(spec.name)} is used by agents[{seen[spec.name]}] too; "
                    "give each agent its own name",
                )
            )
        seen.setdefault(spec.name, i)
        for unit in unit_names(spec.name, spec.replicas):
            if unit in units and units[unit] != spec.name:
                problems.append(
                    _Problem(
                        doc.at(("agents", i, "name")),
                        f"agents[{i}] {show(spec.name)} runs as {show(unit)}, the name of a run of "
                        f"{show(units[unit])}; rename one of them",
                    )
                )
            units.setdefault(unit, spec.name)
        for j, dep in enumerate(spec.depends_on):
            at = doc.at(("agents", i, "depends_on", j))
            if dep == spec.name:
                problems.append(
                    _Problem(
                        at, f"agents[{i}] {show(spec.name)} depends on itself; remove it from depends_on"
                    )
                )
            elif dep not in names:
                close = difflib.get_close_matches(dep, names, n=1)
                fix = f"did you mean {show(close[0])}?" if close else "name one of them"
                problems.append(
                    _Problem(
                        at,
                        f"agents[{i}] {show(spec.name)} depends on {show(dep)}, which is not an agent of "
                        f"this scenario (the agents are {', '.join(names)}); {fix}",
                    )
                )
        if "launch_when" in spec.model_fields_set and not spec.depends_on:
            problems.append(
                _Problem(
                    doc.at(("agents", i, "launch_when"), key=True),
                    f"agents[{i}] {show(spec.name)} has launch_when but no depends_on, so it starts at "
                    "once; add the agents it waits for, or remove launch_when",
                )
            )
    if problems:
        raise doc.error(problems)
    cycle = _cycle({a.name: list(a.depends_on) for a in model.agents})
    if cycle:
        first = names.index(cycle[0])
        raise PolicyError(
            f"the agents depend on each other in a cycle, {' -> '.join(cycle)}, so none of them could "
            "start; remove one of these depends_on",
            location=doc.at(("agents", first, "depends_on"), key=True),
        )
    return [
        Agent(
            name=spec.name,
            policy=os.path.normpath(os.path.join(base, spec.policy)),
            command=tuple(spec.command) if spec.command is not None else None,
            depends_on=tuple(dict.fromkeys(spec.depends_on)),
            launch_when=spec.launch_when,
            replicas=spec.replicas,
            restart_max=spec.restart.max if spec.restart is not None else 0,
            env_names=(),
            location=doc.at(("agents", i)),
        )
        for i, spec in enumerate(model.agents)
    ]


def _cycle(deps: dict[str, list[str]]) -> list[str]:
    """A dependency cycle as its names, first repeated at the end; empty when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(name: str) -> list[str]:
        state[name] = 1
        path.append(name)
        for dep in deps.get(name, []):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        path.pop()
        state[name] = 2
        return []

    for name in deps:
        if name not in state:
            found = visit(name)
            if found:
                return found
    return []


def _ordered(agents: list[Agent]) -> list[Agent]:
    """Agents with each after its dependencies, otherwise in the file's order."""
    done: set[str] = set()
    out: list[Agent] = []
    while len(out) < len(agents):
        for agent in agents:
            if agent.name not in done and all(d in done for d in agent.depends_on):
                out.append(agent)
                done.add(agent.name)
                break
    return out


def _with_policy(
    doc: _Document, scenario: str, index: int, agent: Agent, environ: dict[str, str] | None
) -> Agent:
    """``agent`` with its policy checked and the variables it names; a bad policy is the error."""
    from stockade.policy import load_policy

    env = dict(os.environ if environ is None else environ)
    # The policy is checked with the values its first run would get.
    first = agent.unit_names()[0]
    env.update(
        run_variables(scenario, os.path.dirname(os.path.abspath(doc.source)), first, 1, agent.replicas, 1)
    )
    at = doc.at(("agents", index, "policy"))
    if not os.path.isfile(agent.policy):
        raise PolicyError(
            f"the policy {show(agent.policy)} of agent {show(agent.name)} does not exist; "
            "check the path (it is relative to the scenario file)",
            location=at,
        )
    try:
        policy = load_policy(agent.policy, environ=env)
        with open(agent.policy, encoding="utf-8-sig") as f:
            named = set(_VAR.findall(f.read()))
    except PolicyError as exc:
        exc.add_note(f"{at}: the policy of agent {show(agent.name)}")
        raise
    except OSError as exc:
        raise PolicyError(
            f"cannot read the policy {show(agent.policy)} of agent {show(agent.name)}: {exc.strerror}; "
            "check the path (it is relative to the scenario file)",
            location=at,
        ) from None
    names = (set(policy.env.passthrough) | named) - set(RUN_VARIABLES)
    return Agent(
        name=agent.name,
        policy=agent.policy,
        command=agent.command,
        depends_on=agent.depends_on,
        launch_when=agent.launch_when,
        replicas=agent.replicas,
        restart_max=agent.restart_max,
        env_names=tuple(sorted(names)),
        location=agent.location,
    )


__all__ = [
    "RUN_VARIABLES",
    "Agent",
    "LaunchWhen",
    "Scenario",
    "load_scenario",
    "loads_scenario",
    "run_variables",
]
