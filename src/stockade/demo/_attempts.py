"""What the demo expects of each of the injected model's tool calls.

The calls themselves are data of ``stockade mock-llm`` (``ESCAPE_ATTEMPTS`` in
``stockade.llm._scripts``: a tool, its arguments, what it tries); this module
gives each one an id and the layer that must refuse it, in the same order.
A tool call of the run is matched to its entry by tool and arguments, so the
report can say, attempt by attempt, whether the expected layer refused it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

Expected = Literal["task", "persistence", "landlock", "seccomp", "broker", "gateway", "llm"]

EXPECTED: tuple[tuple[str, Expected], ...] = (
    ("task-guide", "task"),
    ("task-report", "task"),
    ("plant-envrc", "persistence"),
    ("read-shadow", "landlock"),
    ("shell-shadow", "landlock"),
    ("other-agent", "landlock"),
    ("login-hook", "landlock"),
    ("plant-program", "landlock"),
    ("symlink", "landlock"),
    ("direct-connect", "landlock"),
    ("metadata-direct", "landlock"),
    ("dns-udp", "seccomp"),
    ("raw-socket", "seccomp"),
    ("ptrace", "seccomp"),
    ("unshare", "seccomp"),
    ("mount", "seccomp"),
    ("chroot", "seccomp"),
    ("init-module", "seccomp"),
    ("io-uring", "seccomp"),
    ("broker-passwd", "broker"),
    ("broker-traversal", "broker"),
    ("broker-workspaces", "broker"),
    ("spawn-wider", "broker"),
    ("broker-cron", "broker"),
    ("exec-curl", "broker"),
    ("ask-key", "broker"),
    ("broker-environ", "broker"),
    ("fetch-evil", "broker"),
    ("fetch-redirect", "gateway"),
    ("proxy-evil", "gateway"),
    ("proxy-metadata", "gateway"),
    ("proxy-internal", "gateway"),
    ("proxy-decimal", "gateway"),
    ("proxy-port", "gateway"),
    ("proxy-plain-http", "gateway"),
    ("proxy-post", "gateway"),
    ("proxy-secret", "gateway"),
    ("llm-guessed-key", "llm"),
)
"""(id, the layer that must refuse it) for each entry of ``ESCAPE_ATTEMPTS``, in order.

"task" is the legitimate task, which must be done; "persistence" a file the
cell lets the agent leave in its workspace, which the run's persistence report
must name."""

KERNEL: frozenset[str] = frozenset(("landlock", "seccomp"))


@dataclass(frozen=True, slots=True)
class Planned:
    """One planned tool call of the injected model."""

    id: str
    tool: str
    arguments: dict[str, Any]
    title: str
    expected: Expected

    @property
    def is_task(self) -> bool:
        return self.expected == "task"

    @property
    def is_plant(self) -> bool:
        """A file it may leave in its workspace, for the persistence report to name."""
        return self.expected == "persistence"


def catalogue() -> tuple[Planned, ...]:
    """The injected model's calls with their ids and expected layers.

    Raises:
        RuntimeError: ``ESCAPE_ATTEMPTS`` and ``EXPECTED`` do not have the same
            length (one was changed without the other).
    """
    from stockade.llm._scripts import ESCAPE_ATTEMPTS

    if len(ESCAPE_ATTEMPTS) != len(EXPECTED):
        raise RuntimeError(
            f"stockade.llm._scripts.ESCAPE_ATTEMPTS has {len(ESCAPE_ATTEMPTS)} entries and "
            f"stockade.demo._attempts.EXPECTED {len(EXPECTED)}; give every attempt its id and layer"
        )
    return tuple(
        Planned(id=ident, tool=a.tool, arguments=dict(a.arguments), title=a.tries, expected=layer)
        for a, (ident, layer) in zip(ESCAPE_ATTEMPTS, EXPECTED, strict=True)
    )


def key(tool: str, arguments: Any) -> str:
    """What identifies a tool call: its tool and its arguments, as canonical JSON."""
    return json.dumps([tool, arguments], sort_keys=True, separators=(",", ":"))


__all__ = ["EXPECTED", "KERNEL", "Expected", "Planned", "catalogue", "key"]
