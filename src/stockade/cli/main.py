"""The ``stockade`` console script.

``stockade exec`` is on the hot path of every contained command, so it is parsed
by a small hand-written parser (``_exec``) that imports neither click nor
pydantic; every other command goes through the click application in ``_app``.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "exec":
        from stockade.cli._exec import exec_main

        return exec_main(args[1:])
    from stockade.cli._app import run_app

    return run_app(args)


if __name__ == "__main__":
    sys.exit(main())
