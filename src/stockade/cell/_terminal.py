"""A terminal of the cell's own: the operator's is never handed to a cell.

Given the operator's terminal as stdin, a cell could change it for good:
``stty -echo -isig`` (no echo, no Ctrl-C) stays after the cell ended, a
window size it sets stays, and ``O_NONBLOCK`` set on the shared open file
description makes the operator's shell read ``EAGAIN`` and exit. Instead the
cell gets the slave side of a new pseudo-terminal whose modes and window
size start as the operator's; a relay thread copies what the operator types
to its master and the window size when it changes. Whatever the cell does to
its terminal (modes, window size, flow control, exclusive mode, flags) is
done to that pty, which is closed with the run.

The operator's terminal stays in its own mode: it echoes and edits lines
itself, and Ctrl-C there interrupts stockade, whatever the cell set. The
pty's own echo is read and dropped (the operator's terminal has shown those
characters already). Bytes typed after the cell ended are left for the shell,
except those the relay had already read while it ran.
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
import struct
import termios
import threading
from collections.abc import Callable
from types import FrameType

_WINSIZE = struct.Struct("HHHH")
_IFLAGS = (("icrnl", termios.ICRNL), ("ixon", termios.IXON), ("istrip", termios.ISTRIP))
_OFLAGS = (("opost", termios.OPOST),)
_LFLAGS = (
    ("echo", termios.ECHO),
    ("icanon", termios.ICANON),
    ("isig", termios.ISIG),
    ("iexten", termios.IEXTEN),
    ("tostop", termios.TOSTOP),
)


def window_size(fd: int) -> bytes:
    """The ``struct winsize`` of terminal ``fd`` (TIOCGWINSZ, tty_ioctl(4))."""
    return fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * _WINSIZE.size)


class TerminalRelay:
    """The cell's pseudo-terminal, fed from the operator's terminal ``source``.

    ``slave`` is what the cell gets as stdin. ``close`` stops the relay and
    closes the pty; it is idempotent and safe on every path out of a run.
    """

    def __init__(self, source: int) -> None:
        """
        Raises:
            OSError: no pseudo-terminal could be made (``/dev/ptmx``).
        """
        self._source = source
        master, slave = os.openpty()
        os.set_inheritable(master, False)
        os.set_inheritable(slave, False)
        self.master, self.slave = master, slave
        try:
            termios.tcsetattr(slave, termios.TCSANOW, termios.tcgetattr(source))
            fcntl.ioctl(master, termios.TIOCSWINSZ, window_size(source))
        except (OSError, termios.error):
            pass  # the pty's defaults, then: the operator's terminal is untouched either way
        self._start = self._state()
        # Never block on the master: a cell that does not read its input
        # would otherwise hold the relay (and so the end of the run) forever.
        os.set_blocking(master, False)
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._previous_winch: Callable[[int, FrameType | None], object] | int | None = None
        self._winch_installed = False
        if threading.current_thread() is threading.main_thread():
            # SIGWINCH reaches the main thread only; it pokes the relay.
            try:
                self._previous_winch = signal.signal(signal.SIGWINCH, self._on_winch)
                self._winch_installed = True
            except ValueError:
                pass
        self._thread = threading.Thread(target=self._relay, name="stockade-tty", daemon=True)
        self._closed = False
        self._thread.start()

    def _on_winch(self, signum: int, frame: FrameType | None) -> None:
        try:
            os.write(self._stop_w, b"w")
        except OSError:
            pass
        previous = self._previous_winch
        if callable(previous):
            previous(signum, frame)

    def _relay(self) -> None:
        poller = select.poll()
        poller.register(self._source, select.POLLIN)
        poller.register(self.master, select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        source_open = True
        while True:
            try:
                ready = poller.poll()
            except InterruptedError:
                continue
            for fd, mask in ready:
                if fd == self._stop_r:
                    try:
                        pokes = os.read(self._stop_r, 64)
                    except BlockingIOError:
                        pokes = b""
                    if b"q" in pokes:
                        return
                    self._copy_window_size()
                elif fd == self.master:
                    try:
                        os.read(self.master, 65536)  # the pty's echo and what the cell wrote to it
                    except OSError:
                        poller.unregister(self.master)
                elif fd == self._source and source_open:
                    try:
                        data = os.read(self._source, 65536) if mask & select.POLLIN else b""
                    except OSError:
                        data = b""
                    if not data:
                        # The operator ended input: an end-of-file for a
                        # canonical reader in the cell, then nothing more.
                        source_open = False
                        poller.unregister(self._source)
                        self._send_eof()
                        continue
                    self._write(data)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                written = os.write(self.master, view)
            except InterruptedError:
                continue
            except BlockingIOError:
                return  # its input queue is full: the rest is dropped, as a terminal drops it
            except OSError:
                return  # the cell's side is gone
            view = view[written:]

    def _send_eof(self) -> None:
        try:
            attrs = termios.tcgetattr(self.master)
        except termios.error:
            return
        if attrs[3] & termios.ICANON:
            self._write(attrs[6][termios.VEOF])

    def _copy_window_size(self) -> None:
        try:
            fcntl.ioctl(self.master, termios.TIOCSWINSZ, window_size(self._source))
        except OSError:
            pass

    def _state(self) -> tuple[list[object] | None, bytes | None]:
        try:
            attrs: list[object] | None = termios.tcgetattr(self.slave)
        except termios.error:
            attrs = None
        try:
            size: bytes | None = window_size(self.master)
        except OSError:
            size = None
        return attrs, size

    def changes(self) -> tuple[str, ...]:
        """What the cell changed of its pty since it started, in words (for
        the record: an agent turning off echo or Ctrl-C is worth seeing)."""
        (attrs0, size0), (attrs1, size1) = self._start, self._state()
        said: list[str] = []
        if attrs0 is not None and attrs1 is not None:
            for index, flags in ((0, _IFLAGS), (1, _OFLAGS), (3, _LFLAGS)):
                before, after = attrs0[index], attrs1[index]
                assert isinstance(before, int) and isinstance(after, int)
                for name, bit in flags:
                    if before & bit != after & bit:
                        said.append(f"{'' if after & bit else '-'}{name}")
            if attrs0[6] != attrs1[6] and not said:
                said.append("control characters")
        if size0 is not None and size1 is not None and size0 != size1:
            rows, cols, _, _ = _WINSIZE.unpack(size1)
            said.append(f"window size {rows}x{cols}")
        return tuple(said)

    def close(self) -> tuple[str, ...]:
        """Stop relaying and close the pty (after the cell ended); what the
        cell changed of it (``changes``), empty on a second call."""
        if self._closed:
            return ()
        self._closed = True
        try:
            changed = self.changes()
        except OSError:
            changed = ()
        if self._winch_installed:
            try:
                signal.signal(signal.SIGWINCH, self._previous_winch or signal.SIG_DFL)
            except ValueError:
                pass
        try:
            os.write(self._stop_w, b"q")
        except OSError:
            pass
        self._thread.join()
        for fd in (self.master, self.slave, self._stop_r, self._stop_w):
            try:
                os.close(fd)
            except OSError:
                pass
        return changed


def relay_if_terminal(stdin: int | None) -> TerminalRelay | None:
    """A relay when ``stdin`` is a terminal, else None (a file or a pipe is
    the cell's as it is: changing it changes nothing of the operator's)."""
    if stdin is None or not os.isatty(stdin):
        return None
    return TerminalRelay(stdin)


__all__ = ["TerminalRelay", "relay_if_terminal", "window_size"]
