"""Keeping a persistence report, and ``stockade revert``: putting back what a run left.

For each cell whose report is not empty, ``save`` writes
``<state>/persistence/<cell>/report.json`` with the pre-run bytes of every
changed or removed file beside it (``blobs/<sha256>``). The state directory is
hidden in every cell (``/var/lib/stockade`` is a decoy; another one is hidden
by ``Cell`` when a grant covers it), so the agent cannot touch what revert
restores from.

``revert`` works on a run's or a cell's reports, newest first: what the agent
created is moved into the report's ``quarantine/`` (never deleted: it may be
work the operator wants), what it changed or removed gets its pre-run bytes
back. Every step resolves its path beneath the writable place it lies in, one
component at a time without following symbolic links: the agent may have put
links on the way, and revert runs as the operator.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Mapping

from stockade.cell._persist import Change, Snapshot

ROOT_STATE = "/var/lib/stockade"
"""The daemon's state directory for root (daemon/_paths.py, which ``cell`` may not import)."""
RECORDS = "persistence"


def records_dir(environ: Mapping[str, str] | None = None) -> str:
    """Where reports are kept: ``<state>/persistence``, the state directory
    chosen as the daemon's is (``$STOCKADE_STATE``, ``/var/lib/stockade`` for
    root, ``$XDG_STATE_HOME/stockade`` otherwise)."""
    env = os.environ if environ is None else environ
    chosen = env.get("STOCKADE_STATE")
    if chosen:
        base = os.path.abspath(chosen)
    elif os.geteuid() == 0:
        base = ROOT_STATE
    else:
        state = env.get("XDG_STATE_HOME") or os.path.join(
            env.get("HOME") or os.path.expanduser("~"), ".local", "state"
        )
        base = os.path.join(os.path.abspath(state), "stockade")
    return os.path.join(base, RECORDS)


def save(
    directory: str,
    *,
    cell: str,
    run: str,
    changes: list[Change],
    before: Snapshot,
    cut: list[str] | None = None,
) -> str:
    """Write the report of ``cell`` and the pre-run bytes revert needs; its directory."""
    where = os.path.join(directory, cell)
    blobs = os.path.join(where, "blobs")
    os.makedirs(blobs, mode=0o700, exist_ok=True)

    def keep(data: bytes) -> str:
        import hashlib

        name = hashlib.sha256(data).hexdigest()
        path = os.path.join(blobs, name)
        if not os.path.exists(path):
            with open(path, "wb") as f:
                f.write(data)
        return name

    rows: list[dict[str, object]] = []
    for change in changes:
        row: dict[str, object] = {**change.to_dict(), "root": change.root, "is_dir": change.is_dir}
        old = change.before
        if old is not None:
            row["before"] = {
                "is_dir": old.is_dir,
                "mode": old.mode,
                "blob": keep(old.content) if old.content is not None else None,
                "link": old.digest.startswith("link:"),
            }
        if change.kind == "gitlink":
            index = change.index
            data = before.indexes.get(index)
            row["index"] = index
            row["index_blob"] = keep(data) if data is not None else None
        rows.append(row)
    report = {
        "cell": cell,
        "run": run,
        "time": time.time(),
        "roots": list(before.roots),
        "changes": rows,
        "cut": list(cut or ()),
    }
    import json  # here: every `stockade exec` imports this module, few runs save a report

    tmp = os.path.join(where, "report.json.tmp")
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1)
    os.replace(tmp, os.path.join(where, "report.json"))
    return where


def reports(directory: str, ident: str) -> list[tuple[str, dict[str, object]]]:
    """The reports of run or cell ``ident``, oldest first."""
    import json

    found: list[tuple[str, dict[str, object]]] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    for name in names:
        path = os.path.join(directory, name, "report.json")
        try:
            with open(path) as f:
                report = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(report, dict) and ident in (report.get("cell"), report.get("run")):
            found.append((os.path.join(directory, name), report))
    found.sort(key=lambda item: float(str(item[1].get("time", 0))))
    return found


def revert(directory: str, ident: str) -> list[str]:
    """Put back what run or cell ``ident`` left; one line per step taken or refused.

    Raises:
        FileNotFoundError: no report of ``ident`` is kept (it left nothing, or
            the id is wrong).
    """
    import json

    found = reports(directory, ident)
    if not found:
        raise FileNotFoundError(ident)
    lines: list[str] = []
    for where, report in reversed(found):
        done_path = os.path.join(where, "reverted.json")
        if os.path.exists(done_path):
            lines.append(f"{report.get('cell')}: already reverted")
            continue
        steps: list[str] = []
        restored: set[str] = set()
        rows = report.get("changes")
        for row in reversed(rows if isinstance(rows, list) else []):
            if isinstance(row, dict):
                steps.append(_revert_one(where, row, restored))
        if not steps:
            steps.append(f"{report.get('cell')}: nothing to revert (its walk was cut: see its report)")
        with open(done_path, "w") as f:
            json.dump({"time": time.time(), "steps": steps}, f, indent=1)
        lines.extend(steps)
    return lines


def _revert_one(where: str, row: dict[str, object], restored: set[str]) -> str:
    path, root = str(row.get("path", "")), str(row.get("root", ""))
    kind, change = row.get("kind"), row.get("change")
    try:
        if kind == "gitlink":
            index, blob = row.get("index"), row.get("index_blob")
            if not isinstance(index, str) or not isinstance(blob, str):
                return f"not reverted: gitlink {path} (the index was not kept; run `git rm --cached` on it)"
            if index not in restored:
                _write_back(where, root, index, _blob(where, blob), 0o644)
                restored.add(index)
            return f"restored {index} (drops the gitlink {path}, and what else was staged since)"
        if change == "created":
            moved = _quarantine(where, root, path)
            return f"moved {path} to {moved}" if moved else f"already gone: {path}"
        before = row.get("before")
        if not isinstance(before, dict):
            return f"not reverted: {path} (nothing kept of it)"
        if before.get("is_dir"):
            return f"not reverted: {path} was a directory; restore it from your own copy"
        blob = before.get("blob")
        if not isinstance(blob, str):
            return f"not reverted: {path} (its pre-run content was too large to keep)"
        mode = before.get("mode")
        _write_back(where, root, path, _blob(where, blob), int(mode) if isinstance(mode, int) else 0o644)
        return f"restored {path}"
    except OSError as exc:
        return f"not reverted: {path}: {exc.strerror or exc} (a symbolic link or a file may stand on the way)"


def _blob(where: str, name: str) -> bytes:
    with open(os.path.join(where, "blobs", os.path.basename(name)), "rb") as f:
        return f.read()


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _beneath(root: str, path: str) -> tuple[int, str]:
    """A descriptor of ``path``'s parent, reached from ``root`` without following
    links, and ``path``'s last name. The caller closes the descriptor.

    Raises:
        OSError: ``path`` is not beneath ``root``, or a link or file stands on the way.
    """
    rel = os.path.relpath(path, root)
    if rel == "." or rel.startswith(".."):
        raise OSError(errno.EINVAL, f"{path} is not inside {root}")
    parts = rel.split(os.sep)
    fd = os.open(root, _DIR)
    try:
        for part in parts[:-1]:
            next_fd = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd, parts[-1]


def _quarantine(where: str, root: str, path: str) -> str:
    fd, name = _beneath(root, path)
    try:
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return ""
        box = os.path.join(where, "quarantine")
        os.makedirs(box, mode=0o700, exist_ok=True)
        dest = os.path.join(box, f"{len(os.listdir(box))}-{name}")
        try:
            os.rename(name, dest, src_dir_fd=fd)
            return dest
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
        import shutil  # only here: it pulls in zlib, bz2 and lzma, off the exec path (issue 18)

        if stat.S_ISDIR(st.st_mode):
            # A copy through the descriptor (its links copied as links), then
            # the removal, which shutil does by descriptors too.
            shutil.copytree(f"/proc/self/fd/{fd}/{name}", dest, symlinks=True)
            shutil.rmtree(name, dir_fd=fd)
        else:
            if stat.S_ISREG(st.st_mode):
                src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                with os.fdopen(src, "rb") as f, open(dest, "wb") as out:
                    shutil.copyfileobj(f, out)
            os.unlink(name, dir_fd=fd)
        return dest
    finally:
        os.close(fd)


def _write_back(where: str, root: str, path: str, data: bytes, mode: int) -> None:
    try:
        st: os.stat_result | None = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        # A link or a directory where the file was: into quarantine first.
        _quarantine(where, root, path)
    fd, name = _beneath(root, path)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        out = os.open(name, flags, mode & 0o7777, dir_fd=fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(out, view) :]
            os.fchmod(out, mode & 0o7777)
            if st is None:
                # A new file belongs to whoever owns the directory, not to root.
                with contextlib.suppress(OSError):
                    parent = os.fstat(fd)
                    os.fchown(out, parent.st_uid, parent.st_gid)
        finally:
            os.close(out)
    finally:
        os.close(fd)
