"""Which directories may be a workspace: the one check behind the policy's
``workspace``, ``Cell(workspace=…)`` and ``stockade exec --workspace``.

A workspace is shown read-write to the agent, at its own path. A system
directory, a place that holds other people's things (``/home``, ``/tmp``), the
operator's home or the daemon's state directory would then be the agent's to
read and write on the host; so would any directory that holds one of them
(``/`` holds them all). A path is judged as written and as it resolves:
a symbolic link to ``/etc`` is ``/etc``.

The only I/O is ``os.path.realpath`` (and the caller's home from the password
database when ``$HOME`` is unset); nothing is created.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping

from stockade.policy._default import SYSTEM_READ

ROOT_STATE = "/var/lib/stockade"
"""The daemon's state directory when it runs as root (``daemon/_paths``)."""
WORKSPACES = "workspaces"
"""Where, in a state directory, fresh workspaces are made (``cell/_cell``):
each of them may be given back as a workspace, the directory itself not."""

SYSTEM_TREES = (*SYSTEM_READ, "/boot", "/proc", "/sys", "/dev", "/run", "/var/run", "/var/log", "/var/spool")
"""System directories: none of them, nothing inside them, nothing holding them."""
SHARED_PLACES = (
    "/home",
    "/root",
    "/tmp",
    "/var",
    "/var/tmp",
    "/var/lib",
    "/var/cache",
    "/var/mail",
    "/opt",
    "/srv",
    "/mnt",
    "/media",
    "/snap",
    "/nix",
)
"""Directories that hold other users' or programs' things: a project inside
one is fine (``/var/tmp/build``), the directory itself is not."""


def _inside(path: str, root: str) -> bool:
    return path == root or root == "/" or path.startswith(root + "/")


def operator_homes(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The homes of whoever runs stockade: ``$HOME``, the caller's entry in the
    password database and, under sudo, the invoking user's (``$SUDO_USER``)."""
    env = os.environ if environ is None else environ
    homes: list[str] = []
    if env.get("HOME"):
        homes.append(env["HOME"])
    try:
        homes.append(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:
        pass
    if env.get("SUDO_USER"):
        try:
            homes.append(pwd.getpwnam(env["SUDO_USER"]).pw_dir)
        except KeyError:
            pass
    resolved = {os.path.realpath(h) for h in homes if h.startswith("/")}
    return tuple(sorted(h for h in resolved if h != "/"))


def state_dirs(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Every place the daemon's state directory may be (docs/DAEMON.md)."""
    env = os.environ if environ is None else environ
    found = [ROOT_STATE]
    if env.get("STOCKADE_STATE", "").startswith("/"):
        found.append(env["STOCKADE_STATE"])
    if env.get("XDG_STATE_HOME", "").startswith("/"):
        found.append(os.path.join(env["XDG_STATE_HOME"], "stockade"))
    found.extend(os.path.join(home, ".local", "state", "stockade") for home in operator_homes(env))
    return tuple(sorted({os.path.realpath(p) for p in found}))


def _why(path: str, homes: tuple[str, ...], states: tuple[str, ...]) -> str | None:
    """Why the absolute, normalised ``path`` cannot be a workspace, or None."""
    if path == "/":
        return "is a system directory (the host's root, which holds them all), and a workspace is read-write"
    for tree in SYSTEM_TREES:
        if _inside(path, tree):
            return "is a system directory, and a workspace is read-write"
        if _inside(tree, path):
            return f"holds the system directory {tree!r}, and a workspace is read-write"
    for home in homes:
        if _inside(home, path):
            return f"holds the operator's home {home!r}"
    for state in states:
        fresh = os.path.join(state, WORKSPACES)
        if path != fresh and _inside(path, fresh):
            continue  # a fresh workspace, given back (a helper sharing its parent's)
        if _inside(path, state) or _inside(state, path):
            return f"holds or is inside stockade's state directory {state!r} (its record and sockets)"
    if path in SHARED_PLACES:
        return "holds other users' or programs' files"
    if os.path.dirname(path) == "/home":
        return "is a home directory"
    for home in homes:
        hidden = os.path.relpath(path, home).split(os.sep)[0] if _inside(path, home) else ""
        if hidden.startswith(".") and hidden not in (".", ".."):
            return f"is inside {os.path.join(home, hidden)!r}, the operator's settings and keys"
    return None


def workspace_problem(path: str, *, environ: Mapping[str, str] | None = None) -> str | None:
    """What is wrong with ``path`` (absolute) as a workspace, as the rest of a
    sentence that starts with the path and ends with the fix; None when
    nothing is. Judged as written and as its symbolic links resolve."""
    homes = operator_homes(environ)
    states = state_dirs(environ)
    written = os.path.normpath(path)
    why = _why(written, homes, states)
    if why is None:
        real = os.path.realpath(written)
        if real != written:
            why = _why(real, homes, states)
            if why is not None:
                why = f"leads through a symbolic link to {real!r}, which {why}"
    if why is None:
        return None
    return f"{why}; choose the directory of a project, or omit it to get a fresh one"


__all__ = ["SHARED_PLACES", "SYSTEM_TREES", "operator_homes", "state_dirs", "workspace_problem"]
