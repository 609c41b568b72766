"""From one line of the rogue and the kernel records of its moment to a verdict.

Pure: no I/O. ``classify`` decides whether an attempt was refused or got out,
which layer stopped it, and which kernel records are its own (``matches``: the
record names the attempt's path, port, system call or target pid). When the
kernel recorded nothing, the layer comes from what the attempt met (its errno)
and from ``EXPECTED``, which says what stops each attempt on a host like the
project's: a refusal is never credited to a record that does not exist.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal

from stockade.record import Event

Verdict = Literal["refused", "escaped", "done", "failed"]
"""``refused``/``escaped`` for an escape attempt; ``done``/``failed`` for the task."""

KERNEL_LAYERS = ("landlock", "seccomp")
"""The layers whose refusals the kernel records (audit types 1423 and 1326)."""


@dataclass(frozen=True, slots=True)
class Expect:
    """What stops an attempt on a host like the project's (see docs/DEMO.md).

    ``kernel`` names the layer whose record must come (the tests check it).
    Otherwise the kernel logs nothing: ``errname`` is the errno the attempt
    meets, and ``layer`` and ``why`` say what refused it.
    """

    kernel: Literal["landlock", "seccomp"] | None = None
    errname: str | None = None
    layer: str = ""
    why: str = ""


_LANDLOCK = Expect("landlock")
_SECCOMP = Expect("seccomp")
_VIEW = "filesystem view"
_HOME = (
    "no such file on this host: the home in the cell is an empty stand-in showing the names "
    "of the real one's entries, two levels deep"
)

# fmt: off
EXPECTED: dict[str, Expect] = {
    # -- filesystem
    "read-shadow": _LANDLOCK,
    "read-ssh-key": Expect(None, "ENOENT", _VIEW, _HOME),
    "read-aws": Expect(None, "ENOENT", _VIEW, _HOME),
    "read-home-file": _LANDLOCK,
    "list-workspaces": _LANDLOCK,
    "read-other-agent": _LANDLOCK,
    "write-passwd": _LANDLOCK,
    "create-usr-bin": _LANDLOCK,
    "persist-login": _LANDLOCK,
    "symlink-read": _LANDLOCK,
    "symlink-write": _LANDLOCK,
    "hardlink": Expect(None, "EXDEV", _VIEW,
                       "/etc/passwd is on another mount than the workspace; links cannot cross"),
    "git-hook": Expect(None, "EROFS", "read-only mount",
                       ".git/hooks is a protected path, mounted read-only"),
    "bashrc": Expect(None, "EACCES", "file permissions",
                     ".bashrc is protected: a root-owned placeholder under a read-only mount"),
    "core-pattern": Expect(None, "EACCES", "file permissions",
                           "the file is root's, and /proc/sys is a read-only mount in the cell"),
    "sysfs": Expect(None, "EACCES", "file permissions",
                    "the file is root's (and Landlock grants /sys for reading only)"),
    "dev-mem": Expect(None, "ENOENT", _VIEW,
                      "the cell's /dev holds only null, zero, full, random, urandom, tty, pts"),
    "mknod": Expect(None, "EPERM", "capabilities",
                    "device nodes need CAP_MKNOD, and the cell has no capability"),
    "chmod-system": Expect(None, "EPERM", "file permissions",
                           "only a file's owner may change its mode"),
    "proc-root": Expect(None, "ENOENT", "pid namespace",
                        "the host's processes are not in the cell's /proc"),
    "shocker": _SECCOMP,
    # -- network
    "tcp-v4": _LANDLOCK,
    "tcp-v6": _LANDLOCK,
    "tcp-mapped": _LANDLOCK,
    "dns": _SECCOMP,
    "raw-socket": _SECCOMP,
    "packet-socket": _SECCOMP,
    "netlink": _SECCOMP,
    "bind": _LANDLOCK,
    "unix-abstract": Expect(None, "ECONNREFUSED", "network namespace",
                            "abstract sockets live in a network namespace; the host's are not here"),
    "unix-path": Expect(None, "ECONNREFUSED", _VIEW,
                        "/run in the cell is a stand-in: the socket's name, not the socket"),
    # -- processes and privilege
    "env-secrets": Expect(None, None, "environment",
                          "only variables the policy names reach the cell; the API keys did not"),
    "capabilities": Expect(None, None, "capabilities",
                           "every capability was dropped at launch, and no_new_privs is set"),
    "setuid": Expect(None, "EINVAL", "user namespace",
                     "uid 0 does not exist in the cell's user namespace"),
    # su is setuid root, which no_new_privs makes inert; running as the agent, it
    # then fails to read /etc/shadow (Landlock) and to open an audit socket (seccomp).
    "su": _LANDLOCK,
    "ptrace": _SECCOMP,
    "vm-read": _SECCOMP,
    "signal": Expect(None, "ESRCH", "pid namespace",
                     "the operator's process is not in the cell's pid namespace"),
    "unshare": _SECCOMP,
    "setns": _SECCOMP,
    "mount": _SECCOMP,
    "chroot": _SECCOMP,
    "bpf": _SECCOMP,
    "io-uring": _SECCOMP,
    "userfaultfd": _SECCOMP,
    "perf": _SECCOMP,
    "keyctl": _SECCOMP,
    "init-module": _SECCOMP,
    "kexec": _SECCOMP,
    "reboot": _SECCOMP,
    "clock": _SECCOMP,
    "tiocsti": _SECCOMP,
}
"""Every attempt of the rogue but the task, and what stops it on this project's hosts."""

_BY_ERRNO: dict[str, tuple[str, str]] = {
    "ENOENT": (_VIEW, "not in the cell's view"),
    "EROFS": ("read-only mount", "a read-only mount"),
    "EBUSY": (_VIEW, "a mount point cannot be moved or removed"),
    "EXDEV": (_VIEW, "no link or rename across mounts"),
    "EACCES": ("file permissions", "permission denied by file permissions"),
    "EPERM": ("capabilities", "not permitted: the cell holds no capability"),
    "ESRCH": ("pid namespace", "no such process in the cell"),
    "ECONNREFUSED": ("network namespace", "nothing listens there in the cell"),
    "ENETUNREACH": ("network namespace", "no route out of the cell"),
    "EHOSTUNREACH": ("network namespace", "no route out of the cell"),
}
"""What an errno points to when no record came and the attempt did not fail the
way ``EXPECTED`` says (another host, another kernel)."""
# fmt: on


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt of the rogue, its verdict, and the kernel records that are its own."""

    id: str
    title: str
    category: str
    """``task``, ``filesystem``, ``network`` or ``process``."""
    call: str
    """What the rogue called, e.g. ``open('/etc/shadow')``."""
    verdict: Verdict
    layer: str
    """What stopped it: ``landlock`` or ``seccomp`` when the kernel recorded it,
    else the layer its errno points to (``filesystem view``, ``pid namespace``…)."""
    how: str
    """One line: the kernel record's summary, or what stopped it and the errno."""
    ok: bool
    """The rogue's own word: the attempt did what it set out to do."""
    errno: int | None = None
    errname: str | None = None
    error: str | None = None
    result: str | None = None
    events: tuple[Event, ...] = ()
    """The kernel records that name the attempt's target."""
    other_events: tuple[Event, ...] = ()
    """Kernel records of the same moment that name something else."""
    expected_kernel: str | None = None
    """The layer whose record must come, per ``EXPECTED``; None when none will."""

    @property
    def recorded(self) -> bool:
        return bool(self.events)

    @property
    def missing_record(self) -> bool:
        """Refused, a kernel record was expected, and none came."""
        return self.verdict == "refused" and self.expected_kernel is not None and not self.recorded

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "category": self.category,
            "call": self.call,
            "verdict": self.verdict,
            "layer": self.layer,
            "how": self.how,
            "recorded": self.recorded,
            "expected_kernel": self.expected_kernel,
            "ok": self.ok,
            "errno": self.errno,
            "errname": self.errname,
            "error": self.error,
            "result": self.result,
            "events": [e.to_dict() for e in self.events],
            "other_events": [e.to_dict() for e in self.other_events],
        }


def matches(event: Event, target: dict[str, Any]) -> bool:
    """Does a kernel record name the attempt's target (its path, port, syscall or pid)?"""
    d = event.detail
    if event.layer == "seccomp":
        return target.get("syscall") is not None and d.get("syscall") == target["syscall"]
    if event.layer != "landlock":
        return False
    if "port" in target and d.get("port") == target["port"]:
        return True
    if "target_pid" in target and d.get("target_pid") == target["target_pid"]:
        return True
    path = d.get("path")
    if path is not None:
        for wanted in target.get("paths", ()):
            # A creation is recorded on the directory it happens in.
            if path == wanted or path == os.path.dirname(str(wanted)):
                return True
    return False


def classify(line: dict[str, Any], window: list[Event]) -> Attempt:
    """One line of the rogue and the records of its moment, as an ``Attempt``."""
    ident = str(line.get("id"))
    category = str(line.get("category", ""))
    target = line.get("target") or {}
    kernel = [e for e in window if e.layer in KERNEL_LAYERS]
    matched = tuple(e for e in kernel if matches(e, target))
    others = tuple(e for e in kernel if e not in matched)
    ok = bool(line.get("ok"))
    errname = line.get("errname")
    expect = EXPECTED.get(ident, Expect())
    if category == "task":
        verdict: Verdict = "done" if ok else "failed"
        layer = "-"
        how = str(line.get("result") if ok else line.get("error"))
    elif ok:
        verdict = "escaped"
        layer = "nothing"
        how = str(line.get("result"))
    else:
        verdict = "refused"
        if matched:
            layer = matched[0].layer
            how = matched[0].summary
            if len(matched) > 1:
                how += f" (+{len(matched) - 1} more records)"
        elif expect.layer and errname == expect.errname:
            layer, how = expect.layer, expect.why
        elif errname in _BY_ERRNO:
            layer, how = _BY_ERRNO[str(errname)]
        else:
            layer, how = expect.layer or "kernel", str(line.get("error") or "failed")
        if not matched and errname:
            how += f" ({errname})"
    return Attempt(
        id=ident,
        title=str(line.get("title", ident)),
        category=category,
        call=str(line.get("call", "")),
        verdict=verdict,
        layer=layer,
        how=how,
        ok=ok,
        errno=line.get("errno"),
        errname=errname,
        error=line.get("error"),
        result=line.get("result"),
        events=matched,
        other_events=others,
        expected_kernel=expect.kernel if category != "task" else None,
    )


__all__ = ["EXPECTED", "KERNEL_LAYERS", "Attempt", "Expect", "Verdict", "classify", "matches"]
