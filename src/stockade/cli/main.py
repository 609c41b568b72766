"""The ``stockade`` console script.

``stockade exec`` is on the hot path of every contained command, so it is parsed
by a small hand-written parser (``_exec``) that imports neither click nor
pydantic; every other command goes through the click application in ``_app``.
"""

from __future__ import annotations

import sys
from typing import NoReturn

EXEC_GC_THRESHOLD = 25_000
"""The collector's first threshold while ``stockade exec`` runs (Python's is
700). Its start-up makes ~13,000 objects that live until it exits (modules,
classes, functions, the plan), and each 700 of them cost a collection that
finds nearly nothing to free; a long run's own garbage is still collected,
25,000 objects at a time."""


EXEC_WARM_SECONDS = 0.2
"""How long ``stockade exec`` holds the cgroup-move semaphore warm from its
start (``cell._migration``): past its launch, ~60-100 ms in (issue 18)."""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "exec":
        return _exec(args[1:], whole_process=argv is None)
    from stockade.cli._app import run_app

    return run_app(args)


def _exec(args: list[str], *, whole_process: bool) -> int:
    import gc

    from stockade.cell._migration import keep_warm

    # The kernel's wait for C1's move into the cell's cgroups (~10 ms) is
    # paid by a thread of its own while the imports and the plan are made.
    keep_warm(EXEC_WARM_SECONDS)
    threshold = gc.get_threshold()
    gc.set_threshold(EXEC_GC_THRESHOLD, *threshold[1:])
    try:
        from stockade.cli._exec import exec_main

        code = exec_main(args)
    finally:
        gc.set_threshold(*threshold)
        if whole_process:
            # The process ends now: what it made need not be traversed again
            # by the collections of the interpreter's exit (5-10 ms here,
            # measured for issue 18). Not for a caller that goes on.
            gc.freeze()
    if whole_process:
        _end_process(code)
    return code


def _end_process(code: int) -> NoReturn:
    """End ``stockade exec``'s process as the interpreter's exit would, less
    its teardown of every module and object (~3.5 ms of a 100 ms run here,
    measured for issue 18), which nothing of the run needs: what the
    interpreter's exit does that has an effect outside the process is done
    here, in its order: wait for the threads that are not daemons, run every
    exit hook (the audit reader's close, which hands the kernel audit rules
    to their remover; logging's; ``weakref.finalize``'s; any a caller
    registered, in the reverse order of their registration), flush stdout
    and stderr (a failed stdout makes the status 120, as Python's own exit
    does). Only on a normal return: an exception leaves by Python's way."""
    import atexit
    import os
    import threading

    current = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not current and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            if stream is sys.stdout:
                code = 120
    os._exit(code & 0xFF)


if __name__ == "__main__":
    sys.exit(main())
