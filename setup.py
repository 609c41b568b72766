"""The C extensions: the launcher's children (``stockade.cell._native``) and the
broker's plain fs.read (``stockade.broker._fastread``); every other piece of
metadata lives in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "stockade.cell._native",
            sources=["src/stockade/cell/_native.c"],
            depends=["src/stockade/cell/_session_init.h"],  # the init's session mode, included
            # No -Werror here: a newer compiler's new warning must not stop an
            # install. tests/cell/test_native.py builds it with -Werror instead.
            extra_compile_args=["-std=gnu11", "-Wall", "-Wextra", "-Wno-missing-field-initializers"],
        ),
        Extension(
            "stockade.broker._fastread",
            sources=["src/stockade/broker/_fastread.c"],
            extra_compile_args=["-std=gnu11", "-Wall", "-Wextra", "-Wno-missing-field-initializers"],
        ),
    ]
)
