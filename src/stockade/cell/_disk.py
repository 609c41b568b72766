"""``limits.disk``: filesystems of the run's own, and whether a cell filled them.

The cell's ``/tmp`` is a tmpfs of its own with ``size=`` and ``nr_inodes=``
(``_plan._tmp_options``): the kernel refuses a write past them (ENOSPC)
whoever makes it. A fresh workspace is an ext4 image of its own, loop-mounted
on the host at the workspace's path (``LimitedWorkspace``): a tmpfs there
would hold the agent's work in memory for as long as the workspace is kept,
and project quotas need a host filesystem mounted with them. A workspace the
caller gives is a directory of theirs, which no kernel limit can be put on
after the fact: a policy asking for one is refused.

What stays to do is the record: the launcher opens the cell's ``/tmp``
through ``/proc/<pid 1>/root`` as soon as the command runs and keeps the
descriptor, which keeps that filesystem alive after the cell's mount
namespace is gone. While the cell runs, a thread looks at both filesystems
every ``WATCH_INTERVAL`` (an ``fstatvfs`` and a ``statvfs``, a few
microseconds) and reports a limit the moment it sees it reached, once, so
the record has it live even if the agent empties the filesystem again; once
the cell has ended it looks a last time. A fill emptied again within one
interval can still go unseen (the kernel logs no ENOSPC).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Callable

from stockade.errors import CellError, HostError, PolicyError
from stockade.policy import DiskLimit

IMAGES = "/var/lib/stockade/workspaces/.images"
"""Where limited fresh workspaces' images are: inside the directory every
cell sees as a decoy."""


WATCH_INTERVAL = 0.25
"""Seconds between two looks at a running cell's filesystems: a fill is in
the record within this, at the cost of eight system calls a second."""

EXT4_SLACK = 1 << 20
"""Bytes still free on a workspace's ext4 when a write meets ENOSPC: ext4
reserves room for the metadata a delayed write may need and refuses the
write before the last blocks are gone (610 KiB were left of 32 MiB here)."""


def _full(st: os.statvfs_result, limit: DiskLimit, where: str, slack: int = 0) -> list[str]:
    found: list[str] = []
    if limit.bytes is not None and st.f_bavail * st.f_frsize <= slack:
        found.append(f"disk limit of {where} reached: {limit.bytes} bytes, writes refused (ENOSPC)")
    if limit.files is not None and st.f_favail == 0:
        found.append(f"file limit of {where} reached: {limit.files} files, creation refused (ENOSPC)")
    return found


class TmpWatch:
    """The cell's ``/tmp`` (and its workspace's own filesystem, if it has
    one), held open from the launcher for one run and watched while it runs.

    ``on_reached`` is called from the watching thread with each limit's
    sentence the first time it is seen reached (``start``).
    """

    def __init__(
        self,
        init_pid: int,
        limit: DiskLimit,
        *,
        workspace: LimitedWorkspace | None = None,
        on_reached: Callable[[str], None] | None = None,
    ) -> None:
        self.limit = limit
        self._workspace = workspace
        self._on_reached = on_reached
        self._seen: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            self._fd = os.open(f"/proc/{init_pid}/root/tmp", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            self._fd = -1  # the cell ended already: nothing to look at

    def start(self) -> None:
        """Watch while the cell runs (until ``reached`` or ``close``)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="stockade-disk", daemon=True)
            self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_INTERVAL):
            for sentence in self._look():
                callback = self._on_reached
                if callback is not None:
                    callback(sentence)

    def _look(self) -> list[str]:
        """The sentences newly reached since the last look (each once)."""
        found: list[str] = []
        with self._lock:
            if self._fd >= 0:
                try:
                    found += _full(os.fstatvfs(self._fd), self.limit, "/tmp")
                except OSError:
                    pass
            if self._workspace is not None:
                found += self._workspace.reached()
            new = [f for f in found if f not in self._seen]
            self._seen += new
        return new

    def seen(self) -> list[str]:
        """The sentences already reported to ``on_reached``, while the cell ran."""
        with self._lock:
            return list(self._seen)

    def reached(self) -> list[str]:
        """Sentences for each limit reached during the run or at its end, e.g.
        ``"disk limit of /tmp reached: 1048576 bytes"``; then let go of ``/tmp``."""
        self._halt()
        self._look()
        seen = self.seen()
        self.close()
        return seen

    def _halt(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def close(self) -> None:
        self._halt()
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


class LimitedWorkspace:
    """A fresh workspace on an ext4 image of its own, mounted at ``path``.

    ext4 keeps to the image's size and to its inode count (``mkfs.ext4 -N``,
    rounded up to a whole number of inodes per block group: 100,000 files
    are 100,096 inodes), with no blocks reserved for root (``-m 0``), so the
    agent meets ENOSPC there whoever it acts as; the filesystem's own
    metadata takes a few percent of the bytes. 85 ms for mkfs and 60 ms for
    the mount of a 1 GiB image, measured here.
    """

    def __init__(self, path: str, limit: DiskLimit, owner: tuple[int, int]) -> None:
        """Make the image and mount it over the (empty) directory ``path``.

        Raises:
            PolicyError: ``limits.disk`` gives files but no bytes.
            HostError: not root, or the host lacks ``mkfs.ext4``/``mount``.
            CellError: the image could not be made or mounted.
        """
        if limit.bytes is None:
            # ext4 makes at least 16 inodes per block group (128 MiB), so an
            # image without a size worth naming could not keep to the count.
            raise PolicyError(
                f"limits.disk.files ({limit.files}) for a fresh workspace needs limits.disk.bytes too "
                "(the workspace is an ext4 image of that size, whose inode count grows with it); "
                "add bytes, such as '1G'"
            )
        if os.geteuid() != 0:
            raise HostError(
                "limits.disk needs a filesystem of the workspace's own, which only root can mount; "
                "run stockade as root, or remove limits.disk",
                feature="disk.workspace",
            )
        if shutil.which("mkfs.ext4") is None or shutil.which("mount") is None:
            raise HostError(
                "limits.disk needs mkfs.ext4 (e2fsprogs) and mount (util-linux); install them",
                feature="disk.workspace",
            )
        self.path = path
        self.limit = limit
        os.makedirs(IMAGES, mode=0o700, exist_ok=True)
        self.image = os.path.join(IMAGES, os.path.basename(path) + ".img")
        fd = os.open(self.image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, limit.bytes)
        finally:
            os.close(fd)
        mkfs = ["mkfs.ext4", "-q", "-F", "-m", "0", "-E", f"root_owner={owner[0]}:{owner[1]},nodiscard"]
        if limit.files is not None:
            mkfs += ["-N", str(limit.files)]
        try:
            self._run([*mkfs, self.image], "make")
            self._run(["mount", "-o", "loop,nosuid,nodev", self.image, path], "mount")
        except BaseException:
            os.unlink(self.image)
            raise
        # mkfs's lost+found would be the agent's first sight of its workspace.
        os.rmdir(os.path.join(path, "lost+found"))
        os.chmod(path, 0o755)

    def reached(self) -> list[str]:
        """Sentences for each limit the workspace's filesystem is at."""
        try:
            return _full(os.statvfs(self.path), self.limit, "the workspace", EXT4_SLACK)
        except OSError:
            return []

    def keep(self) -> str | None:
        """The workspace is kept: copy its files out of the image onto the
        host's directory at ``path``, then unmount it and delete the image,
        so that nothing of a kept workspace stays loop-mounted (a mount the
        operator would have to find and undo, and a loop device held). None
        when so; else why the image is kept, one sentence.

        Chosen over keeping the image (mounted or not): the operator gets the
        agent's work where the run said it was, as plain files with their
        owners and modes (``cp -a``: the same bytes again, at most
        ``limits.disk.bytes``). When the filesystem is still in use after our
        mounts of it are gone (a helper's cell still has it), the image is
        kept at ``self.image``, since later writes go there, and the sentence
        says so.

        Raises:
            CellError: a mount, the copy or an unmount failed; the image is
                kept (with what was copied so far at ``path``).
        """
        if not os.path.ismount(self.path):
            return None  # not ours any more (unmounted by hand): nothing to copy
        stage = self.image[: -len(".img")] + ".copy"
        os.makedirs(stage, mode=0o700, exist_ok=True)
        try:
            # A second mount of the same filesystem, so that ours at the
            # workspace's path can go and leave the host's directory under it.
            self._run(["mount", "--bind", self.path, stage], "bind")
            try:
                self._run(["umount", self.path], "unmount")
            except CellError:
                self._run(["umount", stage], "unmount")
                raise
            try:
                self._run(["cp", "-a", "--", f"{stage}/.", self.path], "copy out")
            finally:
                loop = _loop_device(stage)
                self._run(["umount", stage], "unmount")
        finally:
            with contextlib.suppress(OSError):
                os.rmdir(stage)
        if loop is not None and os.path.exists(f"/sys/block/{loop}/loop/backing_file"):
            return (
                f"the workspace's files were copied to {self.path}, but its filesystem is still in use "
                f"(a helper's cell?), so its image {self.image} is kept: later writes are there"
            )
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.image)
        return None

    def remove(self) -> None:
        """Unmount it and delete the image (what the agent wrote goes with it)."""
        if os.path.ismount(self.path):
            self._run(["umount", self.path], "unmount")
        try:
            os.unlink(self.image)
        except FileNotFoundError:
            pass

    def _run(self, argv: list[str], what: str) -> None:
        import subprocess  # only a workspace with a disk limit: not on every start

        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise CellError(
                f"could not {what} the workspace's filesystem {self.image} ({' '.join(argv)}): "
                f"{done.stderr.strip() or done.returncode}; see docs/CELL.md, Limits"
            )


def _loop_device(mountpoint: str) -> str | None:
    """The loop device (``loop3``) mounted at ``mountpoint``, from mountinfo."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 4 and fields[4] == mountpoint:
                    source = line.split(" - ", 1)[1].split()[1] if " - " in line else ""
                    if source.startswith("/dev/loop"):
                        return os.path.basename(source)
    except OSError:
        pass
    return None


__all__ = ["IMAGES", "LimitedWorkspace", "TmpWatch"]
