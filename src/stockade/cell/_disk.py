"""Whether a cell filled its own ``/tmp`` (``limits.disk``).

The cell's ``/tmp`` is a tmpfs of its own with ``size=`` and ``nr_inodes=``
(``_plan._tmp_options``): the kernel refuses a write past them (ENOSPC)
whoever makes it. What stays to do is the record: the launcher opens the
cell's ``/tmp`` through ``/proc/<pid 1>/root`` as soon as the command runs
and keeps the descriptor, which keeps that filesystem alive after the cell's
mount namespace is gone; once the cell has ended, ``fstatvfs`` says whether
it was full. A cell that filled ``/tmp`` and emptied it again before it ended
leaves no such record (the kernel logs no ENOSPC).
"""

from __future__ import annotations

import os

from stockade.policy import DiskLimit


class TmpWatch:
    """The cell's ``/tmp``, held open from the launcher for one run."""

    def __init__(self, init_pid: int, limit: DiskLimit) -> None:
        self.limit = limit
        try:
            self._fd = os.open(f"/proc/{init_pid}/root/tmp", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            self._fd = -1  # the cell ended already: nothing to look at

    def reached(self) -> list[str]:
        """Sentences for each limit the cell's ``/tmp`` is at, e.g. ``"disk limit
        of /tmp reached: 1048576 bytes"``; then let go of it."""
        if self._fd < 0:
            return []
        try:
            st = os.fstatvfs(self._fd)
        except OSError:
            return []
        finally:
            self.close()
        found: list[str] = []
        if self.limit.bytes is not None and st.f_bavail == 0:
            found.append(f"disk limit of /tmp reached: {self.limit.bytes} bytes, writes refused (ENOSPC)")
        if self.limit.files is not None and st.f_favail == 0:
            found.append(f"file limit of /tmp reached: {self.limit.files} files, creation refused (ENOSPC)")
        return found

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


__all__ = ["TmpWatch"]
