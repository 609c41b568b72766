"""Run a benchmark with ``stockade.cell._native`` loaded from another build,
to measure a change of the launcher's C side before and after, on one tree.

    git show REV:src/stockade/cell/_native.c > /tmp/old/_native.c
    cp src/stockade/cell/_session_init.h /tmp/old/
    gcc -std=gnu11 -O2 -fPIC -shared -I"$(.venv/bin/python -c \\
        'import sysconfig; print(sysconfig.get_paths()["include"])')" \\
        /tmp/old/_native.c -o /tmp/old/_native$(.venv/bin/python -c \\
        'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
    .venv/bin/python benchmarks/with_native.py /tmp/old benchmarks/cell_launch.py --rounds 30
    .venv/bin/python benchmarks/with_native.py current benchmarks/cell_launch.py --rounds 30

The Python side is the tree's own either way: only for changes whose
interface to Python (``_native.spawn``'s arguments) is the same in both.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import runpy
import sys
import sysconfig
from pathlib import Path


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit("usage: with_native.py DIR|current SCRIPT [ARGS...]")
    where, script = sys.argv[1], sys.argv[2]
    if where != "current":
        path = Path(where) / f"_native{sysconfig.get_config_var('EXT_SUFFIX')}"
        if not path.is_file():
            sys.exit(f"no {path.name} in {where}: build it there first (see this script's docstring)")
        loader = importlib.machinery.ExtensionFileLoader("stockade.cell._native", str(path))
        spec = importlib.util.spec_from_loader("stockade.cell._native", loader)
        if spec is None:
            sys.exit(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        sys.modules["stockade.cell._native"] = module
    from stockade.cell import _launch

    print(f"stockade.cell._native: {_launch._native.__file__}", flush=True)
    sys.argv = sys.argv[2:]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
