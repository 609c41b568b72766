"""A throwaway CA and server certificates for tests (made with ``cryptography``).

``TestPki(tmp_path)`` makes a CA; ``ca_file`` is its PEM for
``upstream_tls_context(extra_ca=…)``; ``server_context(names)`` is a server
``SSLContext`` with a leaf for those DNS names and IP addresses, signed by the
CA. EC P-256 keys, so that making them is quick.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


class TestPki:
    __test__ = False

    def __init__(self, directory: Path, *, name: str = "stockade test CA") -> None:
        self.directory = directory
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(self._name)
            .issuer_name(self._name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
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
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self.ca_pem = self._cert.public_bytes(serialization.Encoding.PEM)
        self.ca_file = str(directory / "test-ca.pem")
        Path(self.ca_file).write_bytes(self.ca_pem)
        self._count = 0

    def leaf(self, names: list[str]) -> tuple[str, str]:
        """Files (cert, key) of a leaf certificate for ``names`` (DNS names or IP addresses)."""
        key = ec.generate_private_key(ec.SECP256R1())
        alt: list[x509.GeneralName] = []
        for name in names:
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                alt.append(x509.DNSName(name))
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False
            )
            .sign(self._key, hashes.SHA256())
        )
        self._count += 1
        cert_file = self.directory / f"leaf-{self._count}.pem"
        key_file = self.directory / f"leaf-{self._count}.key"
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_file.write_bytes(_pem_key(key))
        return str(cert_file), str(key_file)

    def server_context(self, names: list[str]) -> ssl.SSLContext:
        """A TLS server context presenting a leaf for ``names``."""
        cert_file, key_file = self.leaf(names)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_file, key_file)
        return context
