"""Connections to the servers the agent reaches: to the checked address, with TLS verified.

``open_upstream`` takes a ``Destination`` (from ``Egress.destination``) and
connects to its address, never to its name: the socket is made and connected
here by address, so no resolver runs between the check and the connection. TLS
is then spoken with the name the client asked for (SNI and the certificate
check), so a server that cannot prove it is that name is refused.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import threading
from collections.abc import Callable

from stockade.gateway._egress import Destination


class UpstreamError(OSError):
    """The upstream server could not be reached, or its TLS certificate did not verify.

    An ``OSError``, as a failed connection is; ``verify`` is true for a
    certificate that did not verify (the answer is still a 502, but the record
    says why).
    """

    def __init__(self, message: str, *, verify: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.verify = verify

    def __str__(self) -> str:
        return self.message


def _where(dest: Destination) -> str:
    address = f"[{dest.address}]" if dest.address.version == 6 else str(dest.address)
    shown = f"{address}:{dest.port}"
    return shown if dest.host == str(dest.address) else f"{shown} ({dest.host})"


async def open_upstream(
    dest: Destination, *, tls: ssl.SSLContext | None, timeout: float
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to ``dest.address`` (and speak TLS for ``dest.host`` when ``tls`` is given).

    ``timeout`` bounds the connection and the TLS handshake together.

    Raises:
        UpstreamError: the connection failed or timed out, or the server's
            certificate did not verify for ``dest.host``.
    """
    family = socket.AF_INET6 if dest.address.version == 6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout):
            # By address, on a socket made here: asyncio.open_connection(host=…)
            # would go through getaddrinfo, and that is a second lookup.
            await loop.sock_connect(sock, (str(dest.address), dest.port))
            return await asyncio.open_connection(
                sock=sock, ssl=tls, server_hostname=dest.host if tls is not None else None
            )
    except ssl.SSLCertVerificationError as exc:
        sock.close()
        raise UpstreamError(
            f"the TLS certificate of {_where(dest)} did not verify: {exc.verify_message}; "
            f"the server is not who it claims to be, or it needs a CA the gateway does not trust",
            verify=True,
        ) from exc
    except ssl.SSLError as exc:
        sock.close()
        raise UpstreamError(
            f"the TLS handshake with {_where(dest)} failed ({exc.reason or exc}); "
            "check that the port speaks TLS"
        ) from exc
    except TimeoutError as exc:
        sock.close()
        raise UpstreamError(
            f"{_where(dest)} did not accept a connection within {timeout:g} s; the server may be down"
        ) from exc
    except OSError as exc:
        sock.close()
        raise UpstreamError(
            f"could not connect to {_where(dest)}: {exc.strerror or exc}; the server may be down"
        ) from exc


def upstream_tls_context(extra_ca: str | None = None) -> ssl.SSLContext:
    """A client context trusting the system's roots and ``extra_ca`` (a PEM file).

    ``extra_ca`` is the daemon's ``--upstream-ca`` (``STOCKADE_UPSTREAM_CA``):
    a private CA of the operator's, or a test's throwaway one.

    One context per set of roots serves every gateway of this process: making
    one reads the system's bundle (~20 ms here), which every run's and every
    daemon session's gateway paid. A bundle or ``extra_ca`` changed on disk
    (its size, mtime or inode) makes a new one. Nothing configures a context
    after this returns it.

    Raises:
        ValueError: ``extra_ca`` cannot be read or holds no certificate.
    """
    return tls_context_once(
        (ssl.get_default_verify_paths().cafile, extra_ca), lambda: _new_upstream_context(extra_ca)
    )


def _new_upstream_context(extra_ca: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # The gateway speaks HTTP/1.1 upstream (httpcore over h11); say so, so that
    # a server never picks h2 for a connection nobody here can read.
    context.set_alpn_protocols(["http/1.1"])
    if extra_ca is not None:
        try:
            context.load_verify_locations(cafile=extra_ca)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(
                f"the upstream CA file {extra_ca!r} could not be loaded ({exc}); "
                "give a readable PEM file of CA certificates"
            ) from exc
    return context


def tls_context_once(files: tuple[str | None, ...], make: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
    """The context ``make`` returns, made once per process for ``files`` as
    they are on disk (inode, size, mtime: a bundle changed makes a new one).
    The gateway's and the LLM endpoint's upstream contexts are both made so;
    nothing configures a context after it is shared."""
    key = tuple((path, _stamp(path)) for path in files)
    with _CONTEXTS_LOCK:
        found = _CONTEXTS.get(key)
    if found is not None:
        return found
    context = make()
    with _CONTEXTS_LOCK:
        if len(_CONTEXTS) >= 16:  # a test suite's throwaway CAs: keep the newest only
            _CONTEXTS.clear()
        return _CONTEXTS.setdefault(key, context)


_CONTEXTS: dict[tuple[object, ...], ssl.SSLContext] = {}
_CONTEXTS_LOCK = threading.Lock()


def _stamp(path: str | None) -> tuple[int, int, int] | None:
    """What says a file changed: its inode, size and mtime; None when absent."""
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


__all__ = ["UpstreamError", "open_upstream", "tls_context_once", "upstream_tls_context"]
