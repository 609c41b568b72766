"""The trial's workbench in the host view: a directory tree and cells over it.

A task without an image runs on the **host view**: the host's system
directories read-only (as every cell sees them) and the trial's own tree,
``root``::

    root/<workdir>       the project (environment/<project>/ of the task), the agent's working directory
    root/tests/          a decoy while the agent works (refused, and the refusal recorded);
                         the hidden tests, copied in only for grading
    root/solution/       a decoy (the oracle gets the solution elsewhere)
    root/logs/verifier/  made fresh for grading: reward.txt or reward.json
    root/run/docker.sock a decoy container socket (``$DOCKER_HOST`` names it)

A task's scripts find this tree through ``$STOCKADE_BENCH_ROOT`` (empty in an
image, where the paths are ``/tests``, ``/logs``…): in the host view there is
no ``/`` of the task's own to put them at. ``exec`` runs one command in a
fresh cell over ``root`` (no network), for set-up and the preflight.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path
from typing import Any

from stockade.bench._task import Task

DECOY = b"# stockade bench: a decoy. The hidden tests are copied in only after the agent has stopped.\n"


def _policy_text(root: Path, workdir: Path, *, timeout: float, read: tuple[str, ...] = ()) -> str:
    # JSON is YAML: one dict, no quoting problems with the paths.
    return json.dumps(
        {
            "name": "bench-workbench",
            "workspace": str(root),
            "workdir": str(workdir),
            "filesystem": {"base": "system", "read": list(read)},
            "limits": {"timeout": f"{max(1, int(timeout))}s", "denials": 1000},
        }
    )


class HostWorkbench:
    """A trial's tree and commands in cells over it (the ``Workbench`` of the preflight)."""

    def __init__(self, task: Task, root: Path) -> None:
        self.task = task
        self.root = root
        self.workdir = root / task.environment.workdir.lstrip("/")
        self._decoy_socket: socket.socket | None = None

    # ------------------------------------------------------------------ layout

    def build(self, image: Any = None) -> None:
        """Copy the project in (from the image's workdir when it has one) and lay the decoys."""
        self.root.mkdir(parents=True, exist_ok=True)
        source = self.task.project_dir
        if image is not None:
            # The image's own workdir is the project; it is shown at the
            # workdir by a mount, so that the agent's work outlives its cell.
            inside = Path(image.rootfs) / self.task.environment.workdir.lstrip("/")
            if inside.is_dir() and not inside.is_symlink():
                source = inside
        if source.is_dir():
            shutil.copytree(source, self.workdir, symlinks=True, dirs_exist_ok=True)
        else:
            self.workdir.mkdir(parents=True, exist_ok=True)
        self.lay_decoys()

    def lay_decoys(self) -> None:
        for name, source in (("tests", self.task.tests_dir), ("solution", self.task.solution_dir)):
            decoy = self.root / name
            decoy.mkdir(exist_ok=True)
            names = sorted(p.name for p in source.iterdir()) if source.is_dir() else []
            for file_name in names or ["README"]:
                (decoy / file_name).write_bytes(DECOY)
        run = self.root / "run"
        run.mkdir(exist_ok=True)
        path = run / "docker.sock"
        if path.exists() or path.is_symlink():
            path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(path))
        sock.listen(1)
        self._decoy_socket = sock

    @property
    def decoys(self) -> tuple[Path, ...]:
        return (self.root / "tests", self.root / "solution")

    @property
    def docker_host(self) -> str:
        return f"unix://{self.root / 'run' / 'docker.sock'}"

    def remove_decoys(self) -> None:
        if self._decoy_socket is not None:
            self._decoy_socket.close()
            self._decoy_socket = None
        for name in ("tests", "solution", "logs", "run"):
            _remove(self.root / name)

    def install_tests(self) -> Path:
        """The hidden tests, copied in for the first time, and a fresh logs/verifier/."""
        self.remove_decoys()
        tests = self.root / "tests"
        shutil.copytree(self.task.tests_dir, tests, symlinks=False)
        logs = self.root / "logs" / "verifier"
        logs.mkdir(parents=True)
        for path in (self.root / "logs", logs):
            os.chmod(path, 0o777)  # the verifier's cell writes here as its own user
        return logs

    def close(self) -> None:
        if self._decoy_socket is not None:
            self._decoy_socket.close()
            self._decoy_socket = None

    # ------------------------------------------------------------------ commands

    def exec(
        self, argv: list[str], *, cwd: str | None = None, timeout: float = 120.0, read: tuple[str, ...] = ()
    ) -> tuple[int, str, str]:
        from stockade.cell import Cell
        from stockade.policy import loads_policy

        workdir = Path(cwd) if cwd else self.workdir
        policy = loads_policy(_policy_text(self.root, workdir, timeout=timeout, read=read))
        result = Cell(policy, workspace=str(self.root)).run(argv, timeout=timeout)
        return (
            result.exit_code,
            result.stdout.decode("utf-8", "replace"),
            result.stderr.decode("utf-8", "replace"),
        )


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file() or path.is_socket():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


__all__ = ["DECOY", "HostWorkbench"]
