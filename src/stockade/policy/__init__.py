"""The policy: its model, loading with precise errors, matching. Pure, no I/O
beyond reading the file it is asked to load."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stockade.policy._default import default_policy
from stockade.policy._model import (
    EnvPolicy,
    ExecPolicy,
    FilesystemPolicy,
    Limits,
    Mode,
    NetworkPolicy,
    Policy,
)

if TYPE_CHECKING:
    from stockade.policy._load import load_policy, loads_policy, policy_json_schema
    from stockade.policy._rules import (
        DiskLimit,
        HostRule,
        LlmPolicy,
        MountRule,
        SecretPolicy,
        ToolRule,
        Verdict,
    )


def __getattr__(name: str) -> Any:
    # The loader pulls in YAML and pydantic; import it only when a file is read.
    if name in ("load_policy", "loads_policy", "policy_json_schema"):
        from stockade.policy import _load

        return getattr(_load, name)
    # The rule classes only a policy file brings: off the exec path (issue 18).
    if name in ("DiskLimit", "HostRule", "LlmPolicy", "MountRule", "SecretPolicy", "ToolRule", "Verdict"):
        from stockade.policy import _rules

        return getattr(_rules, name)
    raise AttributeError(f"module 'stockade.policy' has no attribute {name!r}")


__all__ = [
    "DiskLimit",
    "EnvPolicy",
    "ExecPolicy",
    "FilesystemPolicy",
    "HostRule",
    "Limits",
    "LlmPolicy",
    "Mode",
    "MountRule",
    "NetworkPolicy",
    "Policy",
    "SecretPolicy",
    "ToolRule",
    "Verdict",
    "default_policy",
    "load_policy",
    "loads_policy",
    "policy_json_schema",
]
