"""The run's own certificate authority, for the hosts whose TLS the gateway terminates.

A rule with methods or paths, or a secret meant for a host, needs the requests
inside TLS. The gateway then answers the cell's TLS itself with a leaf made for
that host and signed by this CA, which the cell trusts (its CA bundle holds
it) and nobody else does. One CA per run, made fresh, its key only in memory:
it is worth nothing outside the run.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import threading
from collections import OrderedDict

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID_BEFORE = datetime.timedelta(hours=1)  # tolerate a cell clock a little behind ours
_VALID_FOR = datetime.timedelta(days=7)
_CACHE_SIZE = 1024


def _pem_context(chain_pem: bytes, key_pem: bytes) -> ssl.SSLContext:
    """A server context from PEM in memory.

    ``SSLContext.load_cert_chain`` reads only files; a memfd gives it one that
    never touches a filesystem, so the leaf's key is never on a disk.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["http/1.1"])  # the proxy parses HTTP/1.1 only
    fd = os.memfd_create("stockade-leaf", os.MFD_CLOEXEC)
    try:
        os.write(fd, chain_pem + key_pem)
        ctx.load_cert_chain(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)
    return ctx


class RunCA:
    """An EC P-256 CA for one run, and server contexts for the hosts it stands in for."""

    def __init__(self, run_id: str, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
        self.run_id = run_id
        self._key = key
        self.cert = cert
        self.cert_pem: bytes = cert.public_bytes(serialization.Encoding.PEM)
        self._contexts: OrderedDict[str, ssl.SSLContext] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def create(cls, run_id: str) -> RunCA:
        """A new CA named after ``run_id``, valid from an hour ago for 7 days."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        name = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "stockade"),
                x509.NameAttribute(NameOID.COMMON_NAME, f"stockade run {run_id} CA"),
            ]
        )
        ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _VALID_BEFORE)
            .not_valid_after(now + _VALID_FOR)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(ski, critical=False)
            .sign(key, hashes.SHA256())
        )
        return cls(run_id, key, cert)

    def server_context(self, host: str) -> ssl.SSLContext:
        """A TLS server context presenting a leaf for ``host`` (a DNS name or an IP SAN), cached."""
        with self._lock:
            ctx = self._contexts.get(host)
            if ctx is not None:
                self._contexts.move_to_end(host)
                return ctx
        chain, key = self._leaf(host)
        ctx = _pem_context(chain, key)
        with self._lock:
            self._contexts[host] = ctx
            while len(self._contexts) > _CACHE_SIZE:
                self._contexts.popitem(last=False)
        return ctx

    def _leaf(self, host: str) -> tuple[bytes, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        try:
            san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host.strip("[]")))
        except ValueError:
            san = x509.DNSName(host)
        now = datetime.datetime.now(datetime.UTC)
        not_after = min(now + _VALID_FOR, self.cert.not_valid_after_utc)
        cn = host if len(host) <= 64 else host[:64]  # CN is capped at 64; the SAN is what counts
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _VALID_BEFORE)
            .not_valid_after(not_after)
            .add_extension(x509.SubjectAlternativeName([san]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False
            )
            .sign(self._key, hashes.SHA256())
        )
        chain = cert.public_bytes(serialization.Encoding.PEM) + self.cert_pem
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return chain, key_pem


__all__ = ["RunCA"]
