"""The ``stockade`` console script.

``stockade exec`` is on the hot path of every contained command, so it is parsed
by a small hand-written parser (``_exec``) that imports neither click nor
pydantic; every other command goes through the click application in ``_app``.
"""

from __future__ import annotations

import sys

EXEC_GC_THRESHOLD = 25_000
"""The collector's first threshold while ``stockade exec`` runs (Python's is
700). Its start-up makes ~13,000 objects that live until it exits (modules,
classes, functions, the plan), and each 700 of them cost a collection that
finds nearly nothing to free; a long run's own garbage is still collected,
25,000 objects at a time."""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "exec":
        return _exec(args[1:], whole_process=argv is None)
    from stockade.cli._app import run_app

    return run_app(args)


def _exec(args: list[str], *, whole_process: bool) -> int:
    import gc

    threshold = gc.get_threshold()
    gc.set_threshold(EXEC_GC_THRESHOLD, *threshold[1:])
    try:
        from stockade.cli._exec import exec_main

        return exec_main(args)
    finally:
        gc.set_threshold(*threshold)
        if whole_process:
            # The process ends now: what it made need not be traversed again
            # by the collections of the interpreter's exit (5-10 ms here,
            # measured for issue 18). Not for a caller that goes on.
            gc.freeze()


if __name__ == "__main__":
    sys.exit(main())
