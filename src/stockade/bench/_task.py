"""Benchmark tasks in the Harbor / Terminal-Bench 2 format, read natively.

A task is a directory::

    task.toml            [task] [metadata] [agent] [verifier] [environment] [solution], and [stockade]
    instruction.md       what the agent is asked to do
    environment/         Dockerfile (or [environment].docker_image), and the project
    tests/test.sh        the verifier: writes /logs/verifier/reward.txt or reward.json
    solution/solve.sh    the reference solution (the oracle runs it)

The Harbor fields are those of ``harbor.models.task.config.TaskConfig``
(harbor 0.25.0): unknown keys of Harbor's own tables are kept and ignored, as
Harbor itself ignores them, so that a real task parses. The ``[stockade]``
table says what the format cannot: the agent phase's policy, secrets, the
tripwire, the host view, and what a contained run must show
(``[stockade.expect]``); its keys are checked strictly.

``tomllib`` reports no line for a value it read, so ``_Lines`` finds each
table's and key's line in the text itself; every problem of a task is
reported at once, each as ``file:line: what, the value; the fix``.
"""

from __future__ import annotations

import hashlib
import os
import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from stockade.errors import TaskError

NetworkMode = Literal["no-network", "public", "allowlist"]
Outcome = Literal["solved", "failed", "contained", "halted", "invalid"]
CATEGORIES = (
    "outside-workspace",
    "hidden-tests",
    "network",
    "container-tools",
    "privilege",
    "secrets",
    "other-agents",
)
"""Where an agent may reach beyond its task (containment.json's categories; docs/BENCH.md)."""
_OUTCOMES = ("solved", "failed", "contained", "halted", "invalid")
_HOST_RE = re.compile(r"^(\*\.)?[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$")


@dataclass(frozen=True, slots=True)
class Phase:
    """The ``[agent]`` or ``[verifier]`` table."""

    timeout_sec: float
    user: str | None
    network_mode: NetworkMode | None
    allowed_hosts: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Environment:
    """The ``[environment]`` table."""

    docker_image: str | None
    dockerfile: Path | None
    cpus: float | None
    memory_mb: int | None
    storage_mb: int | None
    workdir: str
    network_mode: NetworkMode
    allowed_hosts: tuple[str, ...]
    env: Mapping[str, str]
    build_timeout_sec: float


@dataclass(frozen=True, slots=True)
class Secret:
    """A ``[[stockade.secrets]]`` entry: a value the agent's environment holds a placeholder of."""

    name: str
    value: str
    hosts: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Expect:
    """``[stockade.expect]``: what a contained run of this task must show."""

    outcome: Outcome | None
    reward: float | None
    refused: tuple[str, ...]
    """Categories that must hold at least one refused reach."""
    solver: str | None
    """The mock model's script that plays this task (``stockade mock-llm --script``):
    a built-in script's name, or a script file beside task.toml."""
    preflight: tuple[str, ...] = ()
    """Kinds of preflight finding the workbench must show (``branch``, ``tag``…)."""


@dataclass(frozen=True, slots=True)
class Stockade:
    """The ``[stockade]`` table."""

    policy: Path | None
    """A policy file beside the task, merged into the agent phase's."""
    tripwire: int
    host_view: bool
    """No image: the workbench is the host's system directories and the project."""
    project: str
    """The directory of the task (relative) copied into the workdir; ``environment/<project>``."""
    secrets: tuple[Secret, ...]
    env: Mapping[str, str]
    """Variables set in the agent's cell (bait included)."""
    expect: Expect


@dataclass(frozen=True, slots=True)
class Task:
    """A task directory, read and checked."""

    path: Path
    name: str
    instruction: str
    metadata: Mapping[str, Any]
    agent: Phase
    verifier: Phase
    environment: Environment
    solution_env: Mapping[str, str]
    stockade: Stockade
    checksum: str
    """SHA-256 over every file of the task (paths and contents, sorted)."""

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def solution_dir(self) -> Path:
        return self.path / "solution"

    @property
    def short_name(self) -> str:
        return self.name.rsplit("/", 1)[-1]

    @property
    def solver_script(self) -> str | None:
        """The ``stockade mock-llm --script`` that plays this task: a file's path or a built-in's name."""
        solver = self.stockade.expect.solver
        if solver is None:
            return None
        path = self.path / solver
        return str(path) if path.is_file() else solver

    @property
    def project_dir(self) -> Path:
        return self.path / "environment" / self.stockade.project


# --------------------------------------------------------------------------- line finding


class _Lines:
    """Where each table and key of a TOML text is (tomllib gives no lines)."""

    _HEADER = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
    _KEY = re.compile(r"^\s*([A-Za-z0-9_\-\.\"']+)\s*=")

    def __init__(self, text: str) -> None:
        self.where: dict[tuple[str, ...], int] = {}
        table: tuple[str, ...] = ()
        for number, line in enumerate(text.splitlines(), start=1):
            header = self._HEADER.match(line)
            if header:
                table = tuple(part.strip().strip("\"'") for part in header.group(1).split("."))
                self.where.setdefault(table, number)
                continue
            key = self._KEY.match(line)
            if key:
                parts = tuple(part.strip().strip("\"'") for part in key.group(1).split("."))
                self.where.setdefault(table + parts, number)

    def line(self, path: tuple[str, ...]) -> int:
        """The line of ``path``, or of its nearest table above; 1 when nothing is known."""
        while path:
            if path in self.where:
                return self.where[path]
            path = path[:-1]
        return 1


class _Checker:
    """Collects every problem of one file, each with its line."""

    def __init__(self, file: Path, text: str) -> None:
        self.file = file
        self.lines = _Lines(text)
        self.problems: list[str] = []

    def fail(self, path: tuple[str, ...], message: str) -> None:
        self.problems.append(f"{self.file}:{self.lines.line(path)}: {message}")

    def table(self, data: Mapping[str, Any], key: str, path: tuple[str, ...] = ()) -> Mapping[str, Any]:
        value = data.get(key, {})
        if not isinstance(value, dict):
            self.fail(
                (*path, key),
                f"[{'.'.join((*path, key))}] must be a table, not {value!r}; write it as [{key}]",
            )
            return {}
        return value

    def number(
        self, data: Mapping[str, Any], key: str, path: tuple[str, ...], default: float | None
    ) -> float | None:
        value = data.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            self.fail(
                (*path, key),
                f"{'.'.join((*path, key))} = {value!r} is not a positive number; write e.g. {key} = 600.0",
            )
            return default
        return float(value)

    def string(self, data: Mapping[str, Any], key: str, path: tuple[str, ...]) -> str | None:
        value = data.get(key)
        if value is None:
            return None
        if not isinstance(value, str):
            self.fail((*path, key), f"{'.'.join((*path, key))} = {value!r} is not a string; quote it")
            return None
        return value

    def strings(self, data: Mapping[str, Any], key: str, path: tuple[str, ...]) -> tuple[str, ...]:
        value = data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.fail(
                (*path, key),
                f'{".".join((*path, key))} = {value!r} is not a list of strings; write e.g. {key} = ["a"]',
            )
            return ()
        return tuple(value)

    def env(self, data: Mapping[str, Any], key: str, path: tuple[str, ...]) -> dict[str, str]:
        value = data.get(key, {})
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            self.fail((*path, key), f"{'.'.join((*path, key))} must be a table of strings, not {value!r}")
            return {}
        return {str(k): v for k, v in value.items()}

    def hosts(self, data: Mapping[str, Any], path: tuple[str, ...]) -> tuple[str, ...]:
        hosts = self.strings(data, "allowed_hosts", path)
        for host in hosts:
            if not _HOST_RE.match(host.strip().lower().rstrip(".")):
                self.fail(
                    (*path, "allowed_hosts"),
                    f"{'.'.join(path)}.allowed_hosts entry {host!r} is not a host name or '*.' pattern; "
                    "write a name such as 'docs.example.com', without a scheme, port or path",
                )
        return tuple(h.strip().lower().rstrip(".") for h in hosts)

    def mode(
        self, data: Mapping[str, Any], path: tuple[str, ...], default: NetworkMode | None
    ) -> NetworkMode | None:
        value = data.get("network_mode", default)
        if value is None:
            return None
        if value not in ("no-network", "public", "allowlist"):
            self.fail(
                (*path, "network_mode"),
                f"{'.'.join(path)}.network_mode = {value!r} is not one of no-network, public, allowlist",
            )
            return default
        if data.get("allowed_hosts") and value != "allowlist":
            self.fail(
                (*path, "allowed_hosts"),
                f"{'.'.join(path)}.allowed_hosts is only valid with network_mode = 'allowlist', "
                f"not {value!r}",
            )
        return value  # type: ignore[no-any-return]


_STOCKADE_KEYS = frozenset(("policy", "tripwire", "host_view", "project", "secrets", "env", "expect"))
_EXPECT_KEYS = frozenset(("outcome", "reward", "refused", "solver", "preflight"))


def _phase(check: _Checker, data: Mapping[str, Any], key: str, timeout: float) -> Phase:
    table = check.table(data, key)
    user = table.get("user")
    return Phase(
        timeout_sec=check.number(table, "timeout_sec", (key,), timeout) or timeout,
        user=None if user is None else str(user),
        network_mode=check.mode(table, (key,), None),
        allowed_hosts=check.hosts(table, (key,)),
        env=check.env(table, "env", (key,)),
    )


def _size_mb(check: _Checker, table: Mapping[str, Any], key: str) -> int | None:
    """``memory_mb`` / ``storage_mb``, or Harbor's deprecated ``memory = "2G"`` / ``storage``."""
    if f"{key}_mb" in table:
        value = check.number(table, f"{key}_mb", ("environment",), None)
        return None if value is None else int(value)
    legacy = table.get(key)
    if legacy is None:
        return None
    match = re.fullmatch(r"\s*([0-9.]+)\s*([KMG])\s*", str(legacy).upper())
    if not match:
        check.fail(
            ("environment", key), f"environment.{key} = {legacy!r} is not a size; write e.g. {key}_mb = 2048"
        )
        return None
    factor = {"K": 1 / 1024, "M": 1, "G": 1024}[match.group(2)]
    return int(float(match.group(1)) * factor)


def _expect(check: _Checker, table: Mapping[str, Any]) -> Expect:
    path = ("stockade", "expect")
    for key in table:
        if key not in _EXPECT_KEYS:
            check.fail(
                (*path, key),
                f"stockade.expect has no key {key!r}; the keys are {', '.join(sorted(_EXPECT_KEYS))}",
            )
    outcome = table.get("outcome")
    if outcome is not None and outcome not in _OUTCOMES:
        check.fail(
            (*path, "outcome"), f"stockade.expect.outcome = {outcome!r} is not one of {', '.join(_OUTCOMES)}"
        )
        outcome = None
    refused = check.strings(table, "refused", path)
    for category in refused:
        if category not in CATEGORIES:
            check.fail(
                (*path, "refused"),
                f"stockade.expect.refused names {category!r}, not a category; use {', '.join(CATEGORIES)}",
            )
    reward = table.get("reward")
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))):
        check.fail((*path, "reward"), f"stockade.expect.reward = {reward!r} is not a number")
        reward = None
    return Expect(
        outcome=outcome,
        reward=None if reward is None else float(reward),
        refused=tuple(c for c in refused if c in CATEGORIES),
        solver=check.string(table, "solver", path),
        preflight=check.strings(table, "preflight", path),
    )


def _stockade(check: _Checker, root: Path, data: Mapping[str, Any], has_image: bool) -> Stockade:
    table = check.table(data, "stockade")
    for key in table:
        if key not in _STOCKADE_KEYS:
            check.fail(
                ("stockade", key),
                f"[stockade] has no key {key!r}; the keys are {', '.join(sorted(_STOCKADE_KEYS))}",
            )
    policy = check.string(table, "policy", ("stockade",))
    policy_path = None
    if policy is not None:
        policy_path = (root / policy).resolve()
        if not policy_path.is_file():
            check.fail(
                ("stockade", "policy"),
                f"stockade.policy names {policy!r}, and {policy_path} is not a file; "
                "put the policy beside task.toml",
            )
    tripwire = table.get("tripwire", 10)
    if isinstance(tripwire, bool) or not isinstance(tripwire, int) or tripwire < 1:
        check.fail(
            ("stockade", "tripwire"),
            f"stockade.tripwire = {tripwire!r} is not a whole number of refusals ≥ 1; the default is 10",
        )
        tripwire = 10
    host_view = table.get("host_view", not has_image)
    if not isinstance(host_view, bool):
        check.fail(("stockade", "host_view"), f"stockade.host_view = {host_view!r} is not true or false")
        host_view = not has_image
    secrets: list[Secret] = []
    raw = table.get("secrets", [])
    if not isinstance(raw, list):
        check.fail(
            ("stockade", "secrets"), "stockade.secrets must be an array of tables: write [[stockade.secrets]]"
        )
        raw = []
    for entry in raw:
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("name"), str)
            or not isinstance(entry.get("value"), str)
        ):
            check.fail(
                ("stockade", "secrets"),
                f"a [[stockade.secrets]] entry needs name and value strings, not {entry!r}",
            )
            continue
        secrets.append(
            Secret(entry["name"], entry["value"], check.strings(entry, "hosts", ("stockade", "secrets")))
        )
    project = check.string(table, "project", ("stockade",)) or "app"
    if "/" in project or project in (".", ".."):
        check.fail(
            ("stockade", "project"),
            f"stockade.project = {project!r} must name one directory under environment/",
        )
        project = "app"
    return Stockade(
        policy=policy_path,
        tripwire=tripwire,
        host_view=host_view,
        project=project,
        secrets=tuple(secrets),
        env=check.env(table, "env", ("stockade",)),
        expect=_expect(check, check.table(table, "expect", ("stockade",))),
    )


def task_checksum(root: Path) -> str:
    """SHA-256 over the task's files: each relative path, a NUL, its SHA-256, a newline; sorted."""
    digest = hashlib.sha256()
    for path in sorted(_files(root)):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).hexdigest().encode() + b"\n")
    return "sha256:" + digest.hexdigest()


def _files(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            yield Path(dirpath) / name


def load_task(path: str | os.PathLike[str]) -> Task:
    """Read and check a task directory (or its ``task.toml``).

    Raises:
        TaskError: every problem of the task, each at ``file:line``.
    """
    root = Path(path).resolve()
    if root.name == "task.toml":
        root = root.parent
    config = root / "task.toml"
    try:
        text = config.read_text(encoding="utf-8")
    except OSError as exc:
        raise TaskError(
            [f"{config}:1: cannot read the task ({exc.strerror}); a task is a directory holding task.toml"]
        ) from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # tomllib's message ends "(at line L, column C)": moved to the front.
        found = re.search(r"\(at line (\d+), column (\d+)\)", str(exc))
        where = f"{found.group(1)}:{found.group(2)}" if found else "1"
        what = re.sub(r" \(at line.*", "", str(exc))
        raise TaskError([f"{config}:{where}: not TOML: {what}; fix the syntax"]) from exc
    check = _Checker(config, text)
    if data.get("steps"):
        check.fail(
            ("steps",),
            "the task has [[steps]] (a multi-step Harbor task), which stockade bench does not run yet; "
            "give it as one task per step",
        )
    task_table = check.table(data, "task")
    name = task_table.get("name") if task_table else None
    if name is not None and (
        not isinstance(name, str)
        or not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", name)
        or ".." in name
    ):
        check.fail(
            ("task", "name"),
            f"task.name = {name!r} is not 'org/name'; write e.g. name = \"stockade/fix-bug\"",
        )
        name = None
    metadata = check.table(data, "metadata")
    agent = _phase(check, data, "agent", 600.0)
    verifier = _phase(check, data, "verifier", 600.0)
    env_table = check.table(data, "environment")
    image = check.string(env_table, "docker_image", ("environment",))
    dockerfile = root / "environment" / "Dockerfile"
    allow_internet = env_table.get("allow_internet")
    mode_default: NetworkMode = "public" if allow_internet in (None, True) else "no-network"
    environment = Environment(
        docker_image=image,
        dockerfile=dockerfile if dockerfile.is_file() else None,
        cpus=check.number(env_table, "cpus", ("environment",), None),
        memory_mb=_size_mb(check, env_table, "memory"),
        storage_mb=_size_mb(check, env_table, "storage"),
        workdir=check.string(env_table, "workdir", ("environment",)) or "/app",
        network_mode=check.mode(env_table, ("environment",), mode_default) or mode_default,
        allowed_hosts=check.hosts(env_table, ("environment",)),
        env=check.env(env_table, "env", ("environment",)),
        build_timeout_sec=check.number(env_table, "build_timeout_sec", ("environment",), 600.0) or 600.0,
    )
    if not environment.workdir.startswith("/"):
        check.fail(
            ("environment", "workdir"),
            f'environment.workdir = {environment.workdir!r} is not absolute; write e.g. workdir = "/app"',
        )
    stockade = _stockade(check, root, data, image is not None or environment.dockerfile is not None)
    solution_env = check.env(check.table(data, "solution"), "env", ("solution",))
    instruction_path = root / "instruction.md"
    instruction = ""
    if not instruction_path.is_file():
        check.problems.append(
            f"{instruction_path}:1: the task has no instruction.md; write what the agent is asked to do there"
        )
    else:
        instruction = instruction_path.read_text(encoding="utf-8")
    test_sh = root / "tests" / "test.sh"
    if not test_sh.is_file():
        check.problems.append(
            f"{test_sh}:1: the task has no tests/test.sh; "
            "the verifier writes /logs/verifier/reward.txt from it"
        )
    if not stockade.host_view and image is None and environment.dockerfile is None:
        check.fail(
            ("environment",),
            "the task names no image: set environment.docker_image, add environment/Dockerfile, "
            "or set stockade.host_view = true",
        )
    if stockade.host_view and not (root / "environment" / stockade.project).is_dir():
        check.fail(
            ("stockade", "project"),
            f"a host-view task copies environment/{stockade.project}/ into its workdir, and "
            f"{root / 'environment' / stockade.project} is not a directory; make it, or set stockade.project",
        )
    if check.problems:
        raise TaskError(check.problems)
    return Task(
        path=root,
        name=str(name or f"local/{root.name}"),
        instruction=instruction,
        metadata=dict(metadata),
        agent=agent,
        verifier=verifier,
        environment=environment,
        solution_env=solution_env,
        stockade=stockade,
        checksum=task_checksum(root),
    )


def validate_tasks(paths: list[str]) -> tuple[list[Task], list[str]]:
    """Every task that loads, and every problem of those that do not."""
    tasks: list[Task] = []
    problems: list[str] = []
    for path in paths:
        try:
            tasks.append(load_task(path))
        except TaskError as exc:
            problems.extend(exc.problems)
    return tasks, problems


__all__ = [
    "CATEGORIES",
    "Environment",
    "Expect",
    "Phase",
    "Secret",
    "Stockade",
    "Task",
    "TaskError",
    "load_task",
    "task_checksum",
    "validate_tasks",
]
