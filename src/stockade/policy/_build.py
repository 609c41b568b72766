"""Building the frozen ``Policy`` from a validated policy file.

What only makes sense for the file as a whole is checked here, after the
schema (``_schema``) accepted each value: a relative workspace, a grant inside
a hidden path, a program outside every readable path, a workdir the cell
could not enter, a rule id used twice, a secret that would enter the cell, a
mount onto the cell's own machinery. Every problem is collected and raised
together (``PolicyDocument.error``); then the defaults of ``_default`` fill
what the file left out.
"""

from __future__ import annotations

import os
from typing import Any

from stockade.policy._default import DEFAULT_LIMITS, PROTECT, SECRETS_DENY, SYSTEM_READ
from stockade.policy._locate import PolicyDocument
from stockade.policy._model import (
    DiskLimit,
    ExecPolicy,
    FilesystemPolicy,
    HostRule,
    Limits,
    LlmPolicy,
    MountRule,
    NetworkPolicy,
    Policy,
    SecretPolicy,
    ToolRule,
)
from stockade.policy._schema import (
    LLM_BASE_URLS,
    DiskSection,
    PathKey,
    PolicyFile,
    Problem,
    covered_by,
    default_env,
)
from stockade.policy._units import show
from stockade.policy._workspace import workspace_problem


def to_policy(doc: PolicyDocument, model: PolicyFile, source: str | None) -> Policy:
    """The ``Policy`` of a validated file read from ``source`` (None: not a file).

    Raises:
        PolicyError: the file's values do not fit together (every problem at once).
    """
    problems: list[Problem] = []
    workspace = _workspace(model, source, problems)
    problems.extend(_llm_key_problems(model))
    problems.extend(_secret_problems(model))
    problems.extend(_mount_problems(model, workspace))
    fs = model.filesystem
    system = fs.base == "system"
    read = _unique([*(SYSTEM_READ if system else ()), *fs.read])
    write = _unique(fs.write)
    deny = _unique([*(SECRETS_DENY if system else ()), *fs.deny])
    protect = _unique([*(PROTECT if system else ()), *fs.protect])
    problems.extend(_grant_problems(model, write, deny))
    grants = [*read, *write, *([workspace] if workspace and workspace.startswith("/") else [])]
    problems.extend(_reach_problems(model, grants, deny))
    problems.extend(_env_problems(model))
    problems.extend(_rule_id_problems(doc, model))
    if problems:
        raise doc.error(problems)

    env = model.env
    return Policy(
        name=model.name,
        command=tuple(model.command or ()),
        mode=model.mode,
        workspace=workspace,
        workdir=model.workdir,
        filesystem=FilesystemPolicy(
            read=read,
            write=write,
            deny=deny,
            protect=protect,
            mounts=tuple(MountRule(m.source, m.target, m.mode) for m in fs.mounts),
        ),
        exec=ExecPolicy(allow=_unique(model.exec_.allow)),
        env=default_env(base=env.base, passthrough=env.pass_, values=dict(env.set_)),
        limits=_limits(model),
        network=_network(model),
        tools=tuple(
            ToolRule(
                id=rule.id,
                intent=rule.intent,
                verdict=rule.verdict,
                match=tuple(rule.match.items()),
            )
            for rule in model.tools
        ),
        llm=_llm(model),
        secrets=tuple(
            SecretPolicy(
                name=secret.name,
                env=secret.env,
                file=secret.file,
                hosts=_unique(secret.hosts),
                headers=_unique(secret.headers),
                body=secret.body,
                url=secret.url,
            )
            for secret in model.secrets
        ),
        source=source,
        image=model.image,
        user=model.user,
    )


# ------------------------------------------------------------------ whole-file checks


def _workspace(model: PolicyFile, source: str | None, problems: list[Problem]) -> str | None:
    """``workspace``, relative to the file's directory; its problems into ``problems``."""
    workspace = model.workspace
    if workspace is not None and not workspace.startswith("/"):
        if source is None:
            problems.append(
                Problem(
                    ("workspace",),
                    f"{show(workspace)} is relative, and this policy was not read from a file; "
                    "write an absolute path",
                )
            )
        else:
            workspace = os.path.normpath(os.path.join(os.path.dirname(source), workspace))
    if workspace is not None and workspace.startswith("/"):
        # The one check of cell/_cell's Cell(workspace=...) and exec --workspace too.
        why = workspace_problem(workspace)
        if why is not None:
            problems.append(Problem(("workspace",), f"{show(workspace)} {why}"))
    return workspace


def _llm_key_problems(model: PolicyFile) -> list[Problem]:
    """The LLM key named in ``env.pass``, which would put a secret into the cell."""
    if model.llm is None or model.llm.api_key_env is None:
        return []
    key = model.llm.api_key_env
    return [
        Problem(
            ("env", "pass", index),
            f"{show(name)} is the LLM key named in llm.api_key_env, and a secret never "
            "enters a cell (the LLM endpoint adds it on the way out); remove it from env.pass",
        )
        for index, name in enumerate(model.env.pass_)
        if name == key
    ]


def _grant_problems(model: PolicyFile, write: tuple[str, ...], deny: tuple[str, ...]) -> list[Problem]:
    """A read grant that a write grant already gives, and a grant that would stay hidden."""
    problems: list[Problem] = []
    fs = model.filesystem
    system = fs.base == "system"
    for index, path in enumerate(fs.read):
        if path in write:
            problems.append(
                Problem(
                    ("filesystem", "read", index),
                    f"{show(path)} is also in filesystem.write, which lets it be read too; "
                    "remove it from read",
                )
            )
    for section, entries in (("read", fs.read), ("write", fs.write)):
        for index, path in enumerate(entries):
            hidden = covered_by(path, deny)
            if hidden is not None:
                whose = (
                    "the secrets that base: system hides"
                    if hidden in SECRETS_DENY and hidden not in fs.deny
                    else "filesystem.deny"
                )
                problems.append(
                    Problem(
                        ("filesystem", section, index),
                        f"{show(path)} is inside {show(hidden)}, one of {whose}, so it would stay "
                        "hidden; remove it"
                        + (", or set filesystem.base: none and list what you need" if system else ""),
                    )
                )
    return problems


def _reach_problems(model: PolicyFile, grants: list[str], deny: tuple[str, ...]) -> list[Problem]:
    """An ``exec.allow`` program, or the ``workdir``, that the cell could not reach."""
    problems: list[Problem] = []
    for index, program in enumerate(model.exec_.allow):
        if covered_by(program, grants) is None:
            problems.append(
                Problem(
                    ("exec", "allow", index),
                    f"{show(program)} is outside every readable path, so it could not run; "
                    "add its directory to filesystem.read",
                )
            )
        elif covered_by(program, deny) is not None:
            problems.append(
                Problem(
                    ("exec", "allow", index),
                    f"{show(program)} is hidden by filesystem.deny; remove it",
                )
            )
    # A mount's target is a grant of the cell's view too, and on an image the
    # whole of the image's / is there to enter (the harnesses' task workdirs).
    entered = [*grants, *(str(m.target) for m in model.filesystem.mounts)]
    if model.workdir is not None and model.image is None and covered_by(model.workdir, entered) is None:
        problems.append(
            Problem(
                ("workdir",),
                f"{show(model.workdir)} is outside the workspace and every filesystem.read or "
                "write path, so the cell could not enter it; add it to filesystem.write, "
                "or remove workdir",
            )
        )
    return problems


def _env_problems(model: PolicyFile) -> list[Problem]:
    """A variable both set and passed."""
    env = model.env
    return [
        Problem(
            ("env", "set", name),
            f"{show(name)} is also in env.pass; keep it in one of them",
            at_key=True,
        )
        for name in env.set_
        if name in env.pass_
    ]


def _rule_id_problems(doc: PolicyDocument, model: PolicyFile) -> list[Problem]:
    """A ``tools`` rule id used twice (naming the line of its first use)."""
    problems: list[Problem] = []
    first_use: dict[str, int] = {}
    for index, rule in enumerate(model.tools):
        if rule.id in first_use:
            other = first_use[rule.id]
            line = doc.position(("tools", other, "id"))[0]
            problems.append(
                Problem(
                    ("tools", index, "id"),
                    f"{show(rule.id)} is already the id of tools[{other}] (line {line}); give each "
                    "rule its own id",
                )
            )
        else:
            first_use[rule.id] = index
    return problems


# ------------------------------------------------------------------------ sections


def _limits(model: PolicyFile) -> Limits:
    """``limits``: what the file gives, the defaults for the rest."""
    limits = model.limits
    given = limits.model_fields_set

    def limit(name: str) -> Any:
        return getattr(limits, name) if name in given else getattr(DEFAULT_LIMITS, name)

    return Limits(
        memory=limit("memory"),
        pids=limit("pids"),
        cpu=limit("cpu"),
        timeout=limit("timeout"),
        output=limit("output"),
        denials=limit("denials"),
        disk=_disk(limits.disk) if "disk" in given else DEFAULT_LIMITS.disk,
    )


def _network(model: PolicyFile) -> NetworkPolicy:
    return NetworkPolicy(
        allow=tuple(
            HostRule(
                host=rule.host,
                ports=tuple(rule.ports),
                methods=_unique(rule.methods),
                paths=_unique(rule.paths),
            )
            for rule in model.network.allow
        ),
        loopback_ports=_unique(model.network.loopback_ports),
        fetch_plain_http=model.network.fetch_plain_http,
    )


def _llm(model: PolicyFile) -> LlmPolicy | None:
    if model.llm is None:
        return None
    return LlmPolicy(
        provider=model.llm.provider,
        base_url=model.llm.base_url or LLM_BASE_URLS[model.llm.provider],
        model=model.llm.model,
        api_key_env=model.llm.api_key_env,
        max_requests=model.llm.max_requests,
        max_tokens=model.llm.max_tokens,
        remote_images=model.llm.remote_images,
    )


CELL_MACHINERY = ("/", "/proc", "/dev", "/sys", "/tmp", "/run/stockade")
"""Places of the cell's own making that a ``filesystem.mounts`` target may not
be or lie in (``/tmp`` itself is the cell's tmpfs, but a target inside it is
fine): the kernel's views, the cell's devices, the broker's socket and CA."""


def _mount_problems(model: PolicyFile, workspace: str | None) -> list[Problem]:
    """``filesystem.mounts``: a source that exists and is not hidden, a target
    that is not the cell's own machinery, the workspace, or another's target."""
    problems: list[Problem] = []
    fs = model.filesystem
    targets: dict[str, int] = {}
    deny = [*SECRETS_DENY, *fs.deny] if fs.base == "system" else list(fs.deny)
    for index, mount in enumerate(fs.mounts):
        where: PathKey = ("filesystem", "mounts", index)
        source, target = mount.source, mount.target
        if not os.path.lexists(source):
            problems.append(
                Problem((*where, "source"), f"{show(source)} does not exist; create it, or fix the path")
            )
        elif covered_by(source, deny) is not None:
            problems.append(
                Problem(
                    (*where, "source"),
                    f"{show(source)} is inside {show(covered_by(source, deny))} of filesystem.deny, "
                    "which stays hidden; mount something else",
                )
            )
        machinery = next(
            (
                m
                for m in CELL_MACHINERY
                if target == m or (m not in ("/", "/tmp") and target.startswith(m + "/"))
            ),
            None,
        )
        if machinery is not None:
            problems.append(
                Problem(
                    (*where, "target"),
                    f"{show(target)} is "
                    + ("" if target == machinery else f"inside {show(machinery)}, ")
                    + "part of the cell's own view (its root, /proc, /dev, /sys, /tmp, /run/stockade); "
                    "choose another target, such as '/mnt/data'",
                )
            )
        if workspace is not None and target == workspace:
            problems.append(
                Problem(
                    (*where, "target"),
                    f"{show(target)} is the workspace, which is mounted there already; choose another target",
                )
            )
        if target in targets:
            problems.append(
                Problem(
                    (*where, "target"),
                    f"{show(target)} is already the target of filesystem.mounts[{targets[target]}]; "
                    "give each mount its own target",
                )
            )
        else:
            targets[target] = index
    return problems


def _secret_problems(model: PolicyFile) -> list[Problem]:
    """A secret needs one source, a name of its own, and must never enter the cell."""
    problems: list[Problem] = []
    seen: set[str] = set()
    for index, secret in enumerate(model.secrets):
        where = ("secrets", index)
        if (secret.env is None) == (secret.file is None):
            problems.append(
                Problem(where, "needs exactly one source: 'env' (the daemon's variable) or 'file'")
            )
        if secret.name in seen:
            problems.append(Problem((*where, "name"), f"{show(secret.name)} is named twice in secrets"))
        seen.add(secret.name)
        if secret.name in model.env.set_ or secret.name in model.env.pass_:
            problems.append(
                Problem(
                    (*where, "name"),
                    f"{show(secret.name)} is also in env; the secret's placeholder fills that variable, "
                    "so remove it from env",
                )
            )
        if secret.env is not None and secret.env in model.env.pass_:
            problems.append(
                Problem(
                    (*where, "env"),
                    f"{show(secret.env)} holds a secret's value and is also in env.pass, which would copy "
                    "it into the cell; remove it from env.pass",
                )
            )
    return problems


def _disk(section: DiskSection | None) -> DiskLimit | None:
    """``limits.disk``; null, or both kinds unlimited, is no limit."""
    if section is None or (section.bytes is None and section.files is None):
        return None
    return DiskLimit(bytes=section.bytes, files=section.files)


def _unique(items: Any) -> tuple[Any, ...]:
    return tuple(dict.fromkeys(items))


__all__ = ["CELL_MACHINERY", "to_policy"]
