"""What of a Docker compose file a stockade sandbox honours.

Inspect hands a docker-compatible provider a compose file (or its parsed
``ComposeConfig``), and Harbor tasks and ``inspect-harbor`` come with one. A
stockade cell is not a container: of a service it takes the image (an image of
stockade's own store, ``stockade image ls``), the working directory, the
environment, the memory and CPU limits and whether there is a network at all.
Every other key is refused by name, so that a task that relies on something
stockade does not do (ports, volumes, privileged, a second service) fails at
the start with the key in the message instead of running differently.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any

import yaml

from stockade.errors import PolicyError
from stockade.policy import Policy

IGNORED = frozenset(
    {
        # What a container needs to stay up between execs, and a cell does not:
        # a session lives until its sample ends whatever its command.
        "command",
        "entrypoint",
        "init",
        "tty",
        "stdin_open",
        "container_name",
        "hostname",
        "healthcheck",
        "restart",
        "platform",
        "x-local",
        "pull_policy",
    }
)
HONOURED = frozenset(
    {"image", "build", "working_dir", "environment", "x-default", "mem_limit", "cpus", "network_mode", "user"}
)
_MEMORY = re.compile(r"^(\d+(?:\.\d+)?)\s*([bkmg]?)b?$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


@dataclasses.dataclass(frozen=True)
class ComposeService:
    """The one service of a compose file a sample's cell is made from."""

    name: str
    image: str | None
    build: str | None
    """The build context (a directory with a Dockerfile), for ``stockade image build``."""
    working_dir: str | None
    environment: tuple[tuple[str, str], ...]
    memory: int | None
    cpus: float | None
    network: bool
    user: str | None


def read_compose(path: str) -> dict[str, Any]:
    """The compose file at ``path``, parsed.

    Raises:
        PolicyError: it cannot be read or is not a YAML mapping with ``services``.
    """
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as exc:
        raise PolicyError(
            f"cannot read the compose file {path}: {exc}; give a readable compose.yaml"
        ) from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("services"), dict):
        raise PolicyError(f"{path} has no `services` mapping; a compose file names at least one service")
    return doc


def is_compose(path: str) -> bool:
    """Whether ``path`` names a compose file rather than a stockade policy (by
    its name, then by a top-level ``services``)."""
    base = os.path.basename(path)
    if base in ("compose.yaml", "compose.yml", "docker-compose.yaml", "docker-compose.yml"):
        return True
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(doc, dict) and "services" in doc and "filesystem" not in doc


def compose_service(doc: Mapping[str, Any], *, source: str) -> ComposeService:
    """The default service of a compose document (``x-default: true``, or the
    only one), checked key by key.

    Raises:
        PolicyError: a key stockade does not honour, more than one service
            without a default, or a malformed value; the message names it.
    """
    services = doc.get("services") or {}
    if not isinstance(services, Mapping) or not services:
        raise PolicyError(f"{source}: no services; name one service with an `image`")
    for key in doc:
        if key not in ("services", "version", "name") and not str(key).startswith("x-"):
            raise PolicyError(
                f"{source}: top-level key {key!r} is not supported by the stockade sandbox "
                "(a cell has no compose networks, volumes, configs or secrets); remove it"
            )
    chosen = [n for n, s in services.items() if isinstance(s, Mapping) and s.get("x-default")]
    if len(services) > 1 and len(chosen) != 1:
        raise PolicyError(
            f"{source}: {len(services)} services ({', '.join(map(str, services))}) and "
            f"{'none' if not chosen else 'several'} marked `x-default: true`; the stockade sandbox "
            "runs one cell per sample: keep one service"
        )
    if len(services) > 1:
        raise PolicyError(
            f"{source}: services {', '.join(n for n in map(str, services) if n != chosen[0])} beside "
            f"the default {chosen[0]!r}; the stockade sandbox runs one cell per sample (no sidecars): "
            "remove the others"
        )
    name = chosen[0] if chosen else next(iter(services))
    service = services[name]
    if not isinstance(service, Mapping):
        raise PolicyError(f"{source}: services.{name} is not a mapping")
    for key in service:
        if key not in HONOURED and key not in IGNORED:
            raise PolicyError(
                f"{source}: services.{name}.{key} is not supported by the stockade sandbox; "
                f"it honours {', '.join(sorted(HONOURED))}: remove {key!r} or use the docker sandbox"
            )
    build = service.get("build")
    if isinstance(build, Mapping):
        unknown = set(build) - {"context", "dockerfile"}
        if unknown:
            raise PolicyError(
                f"{source}: services.{name}.build.{sorted(unknown)[0]} is not supported; remove it"
            )
        build = str(build.get("context", "."))
    network_mode = service.get("network_mode")
    if network_mode not in (None, "none", "bridge", "default"):
        raise PolicyError(
            f"{source}: services.{name}.network_mode {network_mode!r} is not supported; a cell has no "
            "network but its gateway: use 'none', or leave it out and allow hosts in a stockade policy"
        )
    return ComposeService(
        name=str(name),
        image=str(service["image"]) if service.get("image") is not None else None,
        build=str(build) if build is not None else None,
        working_dir=str(service["working_dir"]) if service.get("working_dir") else None,
        environment=_environment(service.get("environment"), f"{source}: services.{name}.environment"),
        memory=_memory(service.get("mem_limit"), f"{source}: services.{name}.mem_limit"),
        cpus=float(service["cpus"]) if service.get("cpus") is not None else None,
        network=network_mode != "none",
        user=str(service["user"]) if service.get("user") is not None else None,
    )


def _environment(value: object, where: str) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if isinstance(value, Mapping):
        return tuple((str(k), "" if v is None else str(v)) for k, v in value.items())
    if isinstance(value, list):
        pairs = []
        for item in value:
            key, sep, val = str(item).partition("=")
            if not sep:
                raise PolicyError(
                    f"{where}: {item!r} takes its value from the host's environment, which never "
                    "reaches a cell; write KEY=VALUE"
                )
            pairs.append((key, val))
        return tuple(pairs)
    raise PolicyError(f"{where} is {type(value).__name__}; give a mapping or a list of KEY=VALUE")


def _memory(value: object, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, int):
        return value
    match = _MEMORY.match(str(value).strip())
    if match is None:
        raise PolicyError(f"{where} {value!r} is not a size; write e.g. 2g or 512m")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def policy_for_service(base: Policy, service: ComposeService) -> Policy:
    """``base`` with what ``service`` says applied (image, workdir, environment, limits)."""
    if service.build is not None and service.image is None:
        raise PolicyError(
            f"services.{service.name}.build {service.build!r} needs an image of stockade's store: build "
            f"it with `stockade image build {service.build}` and name it in `image:` beside `build:`"
        )
    limits = base.limits
    if service.memory is not None or service.cpus is not None:
        limits = dataclasses.replace(
            limits,
            memory=service.memory if service.memory is not None else limits.memory,
            cpu=service.cpus if service.cpus is not None else limits.cpu,
        )
    env = dataclasses.replace(base.env, set=tuple(base.env.set) + service.environment)
    network = base.network if service.network else dataclasses.replace(base.network, allow=())
    return dataclasses.replace(
        base,
        image=service.image or base.image,
        workdir=service.working_dir or base.workdir,
        user=service.user or base.user,
        env=env,
        limits=limits,
        network=network,
    )


__all__ = ["ComposeService", "compose_service", "is_compose", "policy_for_service", "read_compose"]
