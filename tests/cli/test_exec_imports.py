"""The exec path's import list does not grow back (issue 18).

``stockade exec`` is on the path of every contained command, and about half
of its time was imports. This counts the modules one real ``stockade exec --
/bin/true`` (default policy: every layer) has loaded when it ends; it never
measures a time. When a change needs a new module on this path, add it to
``STOCKADE_MODULES`` (or raise ``MAX_MODULES``) and say why in the commit;
when a change removes one, lower them.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a cell reads the kernel audit log: needs root")

STOCKADE_MODULES = frozenset(
    {
        *("stockade", "stockade._netns", "stockade._slots", "stockade.errors", "stockade.exit_codes"),
        *("stockade.cli", "stockade.cli._exec", "stockade.cli._exec_gateway", "stockade.cli.main"),
        *("stockade.policy", "stockade.policy._default", "stockade.policy._model"),
        *("stockade.record", "stockade.record._event"),
        *("stockade.cell", "stockade.cell._audit", "stockade.cell._audit_core", "stockade.cell._audit_mount"),
        *("stockade.cell._cell", "stockade.cell._cgroup", "stockade.cell._host"),
        *(
            "stockade.cell._landlock",
            "stockade.cell._launch",
            "stockade.cell._migration",
            "stockade.cell._layers",
            "stockade.cell._native",
        ),
        *("stockade.cell._owners", "stockade.cell._persist", "stockade.cell._plan", "stockade.cell._revert"),
        *("stockade.cell._seccomp", "stockade.cell._syscall", "stockade.cell._syscall_table"),
        *("stockade.cell._unotify", "stockade.cell._attempts"),
    }
)
"""stockade's own modules that a default ``stockade exec`` needs."""

NEVER = frozenset(
    {
        *("click", "pydantic", "yaml", "json", "logging", "asyncio", "subprocess", "hashlib"),
        *("termios", "sqlite3", "http", "ssl", "email", "urllib", "tempfile", "uuid", "argparse"),
        *("shutil", "bz2", "lzma", "stockade.cell._disk", "stockade.policy._rules"),
        *("dataclasses", "inspect", "ast", "dis", "tokenize", "glob"),
        *("stockade.cell._workbench", "stockade.cell._terminal", "stockade.cell._session"),
        *(
            "stockade.image",
            "stockade.daemon",
            "stockade.broker",
            "stockade.gateway",
            "stockade.record._store",
        ),
    }
)
"""Imported only when asked for (--policy, --json, --events, --image, a
terminal, a disk limit, a network policy, a glob in the policy's paths) or
never on this path (``dataclasses``, with the ``inspect``, ``ast``, ``dis`` and
``tokenize`` it pulls in: every class of the path is a ``stockade._slots``
one)."""

MAX_MODULES = 114
"""Everything in ``sys.modules`` at the end, the interpreter's own included:
114 (``_migration``: the kernel's wait of C1's cgroup move paid by a thread
while the path imports), 113 (``gc``, built in: the collector's threshold while exec runs), 112 (the
last 13 dataclasses slotted: no ``dataclasses``, ``inspect``, ``ast``,
``dis``, ``tokenize``, ``linecache``, ``token``, ``opcode``, ``_opcode``,
``copy``, ``weakref``, ``importlib.machinery``…; ``glob`` only for a
pattern, ``importlib`` only for a lazy name), 129 (``shutil``, with the
zlib, bz2 and lzma it pulls in, only when a workspace is left non-empty or a
report is reverted; ``_disk`` only for a disk limit; ``_slots`` added: plain
classes instead of dataclasses; the policy's rule classes, which a default
policy never holds, in ``_rules``), 136 (atexit and resource, both built in,
close the audit reader at exit and make room for descriptors; ``_attempts``
was split out of ``_cell``), 148 before the lazy imports of issue 18."""

_PROBE = """
import sys
sys.argv = ["stockade", "exec", "-q", "--", "/bin/true"]
import stockade.cli.main as cli

end = cli._end_process

def report(code):  # when the run is over, before the exit hooks (the reader's close)
    sys.stderr.write("\\n=modules " + " ".join(sorted(sys.modules)) + "\\n")
    end(code)

cli._end_process = report
cli.main()
"""


def _exec_modules() -> tuple[int, list[str]]:
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60)
    line = next(x for x in done.stderr.splitlines() if x.startswith("=modules "))
    _, *modules = line.split()
    return done.returncode, modules


def test_stockade_exec_imports_no_more_than_it_needs() -> None:
    code, modules = _exec_modules()
    assert code == 0  # the command ran, in a cell, with every layer of the default policy
    ours = {m for m in modules if m == "stockade" or m.startswith("stockade.")}
    assert ours - STOCKADE_MODULES == set(), (
        f"new modules on the exec path: {sorted(ours - STOCKADE_MODULES)}"
    )
    heavy = {m for m in modules if m in NEVER or m.split(".")[0] in NEVER - {"stockade"}}
    assert heavy == set(), f"modules the exec path must not import: {sorted(heavy)}"
    assert len(modules) <= MAX_MODULES, f"{len(modules)} modules on the exec path (at most {MAX_MODULES})"
