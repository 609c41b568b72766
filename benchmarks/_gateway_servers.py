"""The world of benchmarks/gateway.py: a namespace, a throwaway PKI, the upstream servers.

Everything runs inside a network namespace the benchmark makes, where the
"internet" is one public-looking address (93.184.216.34) on the namespace's
``lo`` (the network rule of docs/HOST.md: nothing here can leave the machine).

Run as a script inside that namespace, this module is the upstream: a process
of its own, so that it shares no GIL with the proxy under test or the client.

- ``ADDRESS:80``: HTTP/1.1, keep-alive, answers every GET with the same small
  body (an asyncio protocol that reads requests by their blank line: the
  cheapest server Python can be, so that the proxies' cost stands out).
- ``ADDRESS:443``: TLS 1.3 with a leaf for the address (IP SAN), a thread per
  connection on blocking sockets; line protocol inside the TLS: ``small`` is
  answered with ``SMALL_BODY``, ``bulk N`` with N bytes, then the connection
  ends.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import ipaddress
import os
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ADDRESS = "93.184.216.34"
HTTP_PORT = 80
TLS_PORT = 443
SMALL_BODY = b"x" * 64
SMALL_RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "
    + str(len(SMALL_BODY)).encode()
    + b"\r\n\r\n"
    + SMALL_BODY
)
CLOSE_RESPONSE = SMALL_RESPONSE.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1)


class Netns:
    """A named network namespace (``ip netns``) with ``addresses`` on its ``lo``."""

    def __init__(self, addresses: list[str]) -> None:
        self.name = f"sk-bench-gw-{os.getpid()}"
        self.path = f"/run/netns/{self.name}"
        subprocess.run(["ip", "netns", "add", self.name], check=True)
        try:
            self._ip("link", "set", "lo", "up")
            for address in addresses:
                self._ip("addr", "add", address + "/32", "dev", "lo")
        except BaseException:
            self.close()
            raise

    def _ip(self, *args: str) -> None:
        subprocess.run(["ip", "-n", self.name, *args], check=True, capture_output=True)

    def argv(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the namespace."""
        return ["nsenter", f"--net={self.path}", "--", *argv]

    @contextmanager
    def entered(self) -> Iterator[None]:
        """The calling thread inside the namespace for the body (its sockets stay there)."""
        from stockade._netns import inside_path

        with inside_path(self.path):
            yield

    def close(self) -> None:
        subprocess.run(["ip", "netns", "del", self.name], check=False, capture_output=True)


def make_pki(directory: Path, address: str) -> tuple[str, str, str]:
    """Files (CA, leaf cert, leaf key): a throwaway CA and a leaf for ``address`` (EC P-256)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "stockade benchmark CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, address)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(address))]), critical=False
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    files = (directory / "ca.pem", directory / "leaf.pem", directory / "leaf.key")
    files[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    files[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return str(files[0]), str(files[1]), str(files[2])


# --------------------------------------------------------------------------- HTTP on :80


class _Http(asyncio.Protocol):
    def __init__(self) -> None:
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end == -1:
                return
            head, self.buffer = self.buffer[:end].lower(), self.buffer[end + 4 :]
            if b"\r\nconnection: close" in head or head.endswith(b"http/1.0"):
                self.transport.write(CLOSE_RESPONSE)
                self.transport.close()
                return
            self.transport.write(SMALL_RESPONSE)


# --------------------------------------------------------------------------- TLS on :443


def _tls_connection(context: ssl.SSLContext, raw: socket.socket) -> None:
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        with context.wrap_socket(raw, server_side=True) as conn:
            line = b""
            while not line.endswith(b"\n"):
                chunk = conn.recv(256)
                if not chunk:
                    return
                line += chunk
            words = line.split()
            if words == [b"small"]:
                conn.sendall(SMALL_BODY)
            elif len(words) == 2 and words[0] == b"bulk":
                left = int(words[1])
                block = memoryview(bytes(1024 * 1024))
                while left:
                    n = min(left, len(block))
                    conn.sendall(block[:n])
                    left -= n
            # Wait for the client to close first (no RST racing the last bytes).
            while conn.recv(4096):
                pass
    except (OSError, ssl.SSLError):
        pass
    finally:
        raw.close()


def _tls_server(context: ssl.SSLContext, listener: socket.socket) -> None:
    while True:
        raw, _ = listener.accept()
        threading.Thread(target=_tls_connection, args=(context, raw), daemon=True).start()


async def _serve(address: str, cert: str, key: str) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.load_cert_chain(cert, key)
    listener = socket.create_server((address, TLS_PORT), backlog=1024)
    threading.Thread(target=_tls_server, args=(context, listener), daemon=True).start()
    loop = asyncio.get_running_loop()
    await loop.create_server(_Http, address, HTTP_PORT, backlog=1024)
    print("ready", flush=True)
    # Until the benchmark closes our stdin.
    await loop.run_in_executor(None, sys.stdin.read)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--address", default=ADDRESS)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    args = parser.parse_args()
    asyncio.run(_serve(args.address, args.cert, args.key))


if __name__ == "__main__":
    main()
