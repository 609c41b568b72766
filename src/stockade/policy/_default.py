"""The built-in default policy, used by ``stockade exec`` without ``--policy``.

System directories read-only, the workspace read-write, a private /tmp, nothing
of the host's home, secrets or sockets, no network, and default limits. It is
built from the model classes directly, so using it costs no YAML or pydantic import.
docs/POLICY.md shows it as YAML.
"""

from __future__ import annotations

from stockade.policy._model import EnvPolicy, FilesystemPolicy, Limits, Policy

SYSTEM_READ = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
"""System directories shown read-only; missing ones are skipped."""

SECRETS_DENY = (
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssh",
    "/etc/ssl/private",
    "/etc/security/opasswd",
    "/etc/credstore",
    "/etc/credstore.encrypted",
    "/etc/machine-id",
)
"""Secrets under /etc hidden even though /etc is readable."""

SHELL_FILES = (
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".profile",
    ".zshrc",
    ".zshenv",
    ".zprofile",
    ".zlogin",
    ".zlogout",
    ".envrc",
    ".inputrc",
)
"""The files a shell (or direnv, or readline) of the operator's reads when it
starts or ends in a directory: protected by default and, wherever they lie,
named by the persistence report (cell/_persist.py)."""

PROTECT = (
    ".git/hooks",
    ".git/config",
    ".git/config.worktree",
    ".git/commondir",
    ".git/info",
    *SHELL_FILES,
    ".mcp.json",
    ".vscode/tasks.json",
    ".vscode/settings.json",
    ".vscode/launch.json",
    ".idea",
    ".claude/settings.json",
    ".claude/settings.local.json",
    ".cargo/config.toml",
    ".cargo/config",
    ".npmrc",
)
"""Files an agent could use to run code outside its cell later (a git hook
runs when the operator next commits; ``core.fsmonitor`` in a git config, or a
``commondir`` leading to another one, when they next run git status; a shell
rc file when they next open a shell there; an editor's tasks, a coding agent's
hooks and MCP servers, a package manager's config when they next open or
build the project). Read-only where they exist, at the top of the workspace
and of every write grant; an entry under ``.git/`` in every git directory
there (nested repositories, submodules, worktrees). One that does not exist
yet is not refused (nothing can cover it without creating it): its creation
is in the run's persistence report (docs/CELL.md)."""

DEFAULT_LIMITS = Limits(
    memory=2 * 1024**3,
    pids=512,
    cpu=None,
    timeout=3600.0,
    output=64 * 1024**2,
    denials=10,
)

DEFAULT_PASSTHROUGH = ("TERM", "LANG", "LC_ALL", "TZ")
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


def default_policy(name: str = "default") -> Policy:
    """The policy ``stockade exec`` uses when given no ``--policy``."""
    return Policy(
        name=name,
        mode="enforce",
        filesystem=FilesystemPolicy(read=SYSTEM_READ, deny=SECRETS_DENY, protect=PROTECT),
        env=EnvPolicy(passthrough=DEFAULT_PASSTHROUGH, set=(("PATH", DEFAULT_PATH),)),
        limits=DEFAULT_LIMITS,
    )
