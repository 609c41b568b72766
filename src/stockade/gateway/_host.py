"""What the gateway needs of the host, for ``stockade doctor``.

Three facts: whether this process can open a listening socket inside another
network namespace (the daemon does that for every cell; it takes
``CAP_SYS_ADMIN``), where the trusted roots for upstream TLS are, and which
resolver the gateway will ask. Probed for real, cheaply: a throwaway namespace
made by a thread of its own.
"""

from __future__ import annotations

import ctypes
import os
import ssl
import threading
from dataclasses import dataclass

from stockade._netns import CLONE_NEWNET, listen_in

_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class GatewayCheck:
    name: str
    ok: bool
    here: str
    fix: str | None = None
    needed: bool = True
    """A missing ``needed`` one stops a policy with any way out from running."""


def _namespace_listener() -> GatewayCheck:
    result: list[GatewayCheck] = []

    def probe() -> None:
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            if _libc.unshare(CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err))
            made = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                for sock in listen_in(made, [("127.0.0.1", 0)]):
                    sock.close()
            finally:
                os.close(made)
            result.append(GatewayCheck("sockets in a cell's network", True, "made one in a new namespace"))
        except Exception as exc:
            result.append(
                GatewayCheck(
                    "sockets in a cell's network",
                    False,
                    f"could not: {exc}",
                    "run the daemon as root (it needs CAP_SYS_ADMIN to serve a cell's loopback)",
                )
            )
        finally:
            os.close(home)

    # A thread of its own: it leaves its namespace for a new one and exits.
    thread = threading.Thread(target=probe, name="stockade-doctor-netns")
    thread.start()
    thread.join()
    return result[0]


def _trusted_roots() -> GatewayCheck:
    path = ssl.get_default_verify_paths().cafile or "/etc/ssl/certs/ca-certificates.crt"
    try:
        with open(path, "rb") as f:
            count = f.read().count(b"-----BEGIN CERTIFICATE-----")
    except OSError:
        count = 0
    if count:
        return GatewayCheck("trusted roots for upstream TLS", True, f"{count} certificates in {path}")
    return GatewayCheck(
        "trusted roots for upstream TLS",
        False,
        f"none found at {path}",
        "install Debian's ca-certificates (or give the daemon --upstream-ca FILE)",
    )


def _resolver() -> GatewayCheck:
    spec = os.environ.get("STOCKADE_DNS")
    if spec:
        return GatewayCheck("resolver", True, f"{spec} (STOCKADE_DNS)", needed=False)
    servers: list[str] = []
    try:
        with open("/etc/resolv.conf") as f:
            servers = [
                line.split()[1] for line in f if line.startswith("nameserver") and len(line.split()) > 1
            ]
    except OSError:
        pass
    if servers:
        return GatewayCheck("resolver", True, "the system's: " + " ".join(servers), needed=False)
    return GatewayCheck(
        "resolver",
        False,
        "no nameserver in /etc/resolv.conf",
        "configure one, or give the daemon --dns HOST:PORT",
        needed=False,
    )


def probe_gateway() -> list[GatewayCheck]:
    """The gateway's facts on this host."""
    return [_namespace_listener(), _trusted_roots(), _resolver()]


__all__ = ["GatewayCheck", "probe_gateway"]
