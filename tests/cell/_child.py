"""Run a function in a forked child and bring back its result: kernel layers
such as Landlock and seccomp are for ever, so tests apply them in a child."""

from __future__ import annotations

import os
import pickle
import select
import signal
import time
import traceback
from collections.abc import Callable
from typing import Any

import pytest


def run_in_child(fn: Callable[[], Any], timeout: float = 20.0) -> Any:
    """Run ``fn`` in a forked child; return its result, or fail with what it raised."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            os.close(read_end)
            try:
                payload = pickle.dumps(("ok", fn()))
            except BaseException as exc:
                payload = pickle.dumps(("error", "".join(traceback.format_exception(exc))))
            view = memoryview(payload)
            while view:
                view = view[os.write(write_end, view) :]
        except BaseException:
            code = 70
        finally:
            os._exit(code)
    os.close(write_end)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            ready, _, _ = select.select([read_end], [], [], max(deadline - time.monotonic(), 0))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail(f"child gave no answer within {timeout} s")
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
    _, status = os.waitpid(pid, 0)
    if not chunks:
        pytest.fail(f"child died without answering (wait status {status:#x})")
    kind, value = pickle.loads(b"".join(chunks))
    if kind == "error":
        pytest.fail(f"child raised:\n{value}")
    return value
