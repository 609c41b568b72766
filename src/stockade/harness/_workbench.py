"""The workbench a harness sample runs in: one long-lived stockade session.

``open_workbench`` gives a ``stockade.cell.Session`` (one cell for the whole
sample: its processes, ``/tmp`` and, with an image, its writable root live
until the sample ends). The harness talks to it through ``Workbench``, the
part of the Session contract it uses, so that the file operations can also be
made of plain execs (``ExecFiles``) where a session does not offer them.

This is the in-process session, used when no daemon runs; where one runs,
the sample's sessions are the daemon's (``_hosted``), with the same
``Workbench`` face.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from stockade.cell import CellResult
from stockade.policy import Policy
from stockade.record import Event


class ExecResult(Protocol):
    """What one ``exec`` gives back (``stockade.cell.SessionResult``)."""

    @property
    def returncode(self) -> int: ...
    @property
    def stdout(self) -> bytes: ...
    @property
    def stderr(self) -> bytes: ...
    @property
    def timed_out(self) -> bool: ...
    @property
    def truncated(self) -> bool: ...


class Workbench(Protocol):
    """One sample's long-lived cell."""

    def exec(
        self,
        argv: Sequence[str],
        *,
        input: bytes | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | int | None = None,
        timeout: float | None = None,
        output_limit: int | None = None,
    ) -> ExecResult: ...

    def read_file(self, path: str, *, user: str | int | None = None, limit: int | None = None) -> bytes: ...

    def write_file(
        self, path: str, data: bytes, *, user: str | int | None = None, mode: int | None = None
    ) -> None: ...

    def close(self) -> Any:
        """End the session: a ``CellResult`` in this process, the daemon's
        ``session.close`` reply for a session it hosts."""
        ...


def open_workbench(
    policy: Policy,
    *,
    run_id: str,
    on_event: Callable[[Event], None],
    workspace: str | None = None,
    state: str | None = None,
    upper: str | None = None,
) -> Workbench:
    """Start a session for ``policy`` whose events go to ``on_event``; with
    the gateway in it (on a loop of its own in this process, as for
    ``stockade exec``) when the policy allows any host. The policy's
    ``image:`` is looked up in the image store of ``state`` (the default
    state directory when None), the one the record goes to. ``upper``: with
    an image, the session's upper layer is kept there, and a later session
    given it starts from what this one changed.

    Raises:
        CellError, HostError, PolicyError, ImageError: the session cannot start.
    """
    import stockade.cell
    from stockade.cli._exec_gateway import exec_gateway, wants_gateway

    # getattr: the Session is the cell layer's newest part, and this module
    # must import (and say what is missing) on a tree from before it.
    session_type: Any = getattr(stockade.cell, "Session")  # noqa: B009
    with contextlib.ExitStack() as stack:
        network = hooks = None
        if wants_gateway(policy):
            network, hooks = stack.enter_context(exec_gateway(policy))
        image = None
        if policy.image is not None:
            from stockade.image import default_store

            image = default_store(state).get(policy.image)
        session: Any = session_type(
            policy,
            image=image,
            workspace=workspace,
            run_id=run_id,
            on_event=on_event,
            network=network,
            **({"upper_dir": upper} if upper is not None and image is not None else {}),
        )
        session.start()
        if hooks is None:
            wb: Workbench = session
            return wb
        return _WithGateway(session, hooks, stack.pop_all())
    raise AssertionError("unreachable")  # pragma: no cover


class _WithGateway:
    """A session and the gateway serving its loopback, ended together; the
    gateway's events (each request it let through or refused) join the
    session's result."""

    def __init__(self, session: Any, hooks: Any, stack: contextlib.ExitStack) -> None:
        self._session = session
        self._hooks = hooks
        self._stack = stack
        self.exec = session.exec
        self.read_file = session.read_file
        self.write_file = session.write_file

    def close(self) -> CellResult:
        try:
            result: CellResult = self._session.close()
        finally:
            self._stack.close()
        return dataclasses.replace(result, events=result.events + tuple(self._hooks.events))


class ExecFiles:
    """A session's file operations made of execs in it (``cat``), for a
    session that offers only ``exec``: the file is read and written inside the
    cell, as the user, with the cell's own permissions and view."""

    def __init__(self, session: Any) -> None:
        self._session = session

    def exec(self, argv: Sequence[str], **kw: Any) -> ExecResult:
        result: ExecResult = self._session.exec(list(argv), **kw)
        return result

    def close(self) -> Any:
        return self._session.close()

    def read_file(self, path: str, *, user: str | int | None = None, limit: int | None = None) -> bytes:
        argv = ["/bin/cat", "--", path] if limit is None else ["/usr/bin/head", "-c", str(limit), "--", path]
        result = self._session.exec(argv, user=user)
        if result.returncode != 0:
            raise _os_error(result.stderr, path)
        data: bytes = result.stdout
        return data

    def write_file(
        self, path: str, data: bytes, *, user: str | int | None = None, mode: int | None = None
    ) -> None:
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
        if mode is not None:
            script += f' && chmod {mode:o} -- "$1"'
        result = self._session.exec(["/bin/sh", "-c", script, "sh", path], input=data, user=user)
        if result.returncode != 0:
            raise _os_error(result.stderr, path)


def _os_error(stderr: bytes, path: str) -> OSError:
    """The OSError a ``cat``'s complaint stands for, as Python raises it."""
    text = stderr.decode("utf-8", "replace")
    for code in (errno.ENOENT, errno.EACCES, errno.EPERM, errno.EISDIR, errno.ENOTDIR, errno.EROFS):
        if os.strerror(code) in text:
            return OSError(code, os.strerror(code), path)
    return OSError(errno.EIO, text.strip() or "the file operation failed", path)


__all__ = ["ExecFiles", "ExecResult", "Workbench", "open_workbench"]
