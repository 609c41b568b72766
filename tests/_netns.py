"""Network namespaces made by a test, where "outside" addresses live on ``lo``.

The network rule of these tests (HOST.md): traffic goes only to loopback or to
addresses inside a namespace the test made. A test of address filtering puts
the addresses it needs (10.0.0.1, 169.254.169.254, a public-looking
93.184.216.34…) on the ``lo`` of such a namespace and runs the code under test
inside it, so that nothing can leave the machine even if the code were wrong.
"""

from __future__ import annotations

import itertools
import os
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from stockade._netns import inside_path

_counter = itertools.count()


class TestNetns:
    """A named network namespace (``ip netns``) with ``addresses`` on its ``lo``."""

    __test__ = False  # not a test class for pytest

    def __init__(self, addresses: Sequence[str] = ()) -> None:
        self.name = f"sk-test-{os.getpid()}-{next(_counter)}"
        self.path = f"/run/netns/{self.name}"
        subprocess.run(["ip", "netns", "add", self.name], check=True)
        try:
            self.ip("link", "set", "lo", "up")
            for address in addresses:
                prefix = "/128" if ":" in address else "/32"
                self.ip("addr", "add", address + prefix, "dev", "lo")
        except BaseException:
            self.close()
            raise

    def ip(self, *args: str) -> None:
        subprocess.run(["ip", "-n", self.name, *args], check=True, capture_output=True)

    @contextmanager
    def entered(self) -> Iterator[None]:
        """The current thread inside the namespace for the body (sockets made then stay there)."""
        with inside_path(self.path):
            yield

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the namespace (for subprocess)."""
        return ["nsenter", f"--net={self.path}", "--", *argv]

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        return subprocess.Popen(self.argv(argv), **kwargs)

    def close(self) -> None:
        subprocess.run(["ip", "netns", "del", self.name], check=False, capture_output=True)

    def __enter__(self) -> TestNetns:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
