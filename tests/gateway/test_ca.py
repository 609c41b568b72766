"""The run's CA: what it is, and leaves a client that trusts it accepts for exactly their host.

Handshakes run over memory BIOs: no socket, no network.
"""

from __future__ import annotations

import datetime
import ssl
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from stockade.gateway._ca import RunCA


def handshake(
    ca: RunCA, host: str, server_hostname: str | None, *, trust: bytes | None = None
) -> dict[str, Any]:
    """A TLS handshake between a client trusting ``trust`` (the CA) and ``ca``'s server for ``host``."""
    client_ctx = ssl.create_default_context(cadata=(trust or ca.cert_pem).decode())
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname=server_hostname)
    server = ca.server_context(host).wrap_bio(s_in, s_out, server_side=True)
    done = [False, False]
    for _ in range(10):
        for i, side in enumerate((client, server)):
            if not done[i]:
                try:
                    side.do_handshake()
                    done[i] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done):
            break
    assert all(done)
    cert = client.getpeercert()
    assert cert is not None
    return cert


def test_ca_certificate() -> None:
    ca = RunCA.create("r-0123456789ab")
    cert = x509.load_pem_x509_certificate(ca.cert_pem)
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    assert cert.public_key().curve.name == "secp256r1"  # type: ignore[union-attr]
    assert "r-0123456789ab" in cert.subject.rfc4514_string()
    constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca and constraints.value.path_length == 0
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign and usage.crl_sign and not usage.digital_signature
    now = datetime.datetime.now(datetime.UTC)
    before = now - cert.not_valid_before_utc
    after = cert.not_valid_after_utc - now
    assert datetime.timedelta(minutes=59) < before < datetime.timedelta(minutes=61)
    assert datetime.timedelta(days=6, hours=23) < after <= datetime.timedelta(days=7)
    assert RunCA.create("r-0123456789ab").cert_pem != ca.cert_pem  # a fresh key every run


@pytest.mark.parametrize(
    ("host", "san"),
    [("api.example.com", ("DNS", "api.example.com")), ("93.184.216.34", ("IP Address", "93.184.216.34"))],
)
def test_leaf_is_trusted_for_its_host(host: str, san: tuple[str, str]) -> None:
    ca = RunCA.create("r-test")
    cert = handshake(ca, host, host)
    assert cert["subjectAltName"] == (san,)


def test_ipv6_leaf() -> None:
    ca = RunCA.create("r-test")
    cert = handshake(ca, "2606:2800:220:1::1", "2606:2800:220:1::1")
    assert cert["subjectAltName"][0][0] == "IP Address"


def test_leaf_is_refused_for_another_host_and_by_a_client_without_the_ca() -> None:
    ca = RunCA.create("r-test")
    with pytest.raises(ssl.SSLCertVerificationError, match="match"):
        handshake(ca, "api.example.com", "evil.example")
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(ca, "api.example.com", "api.example.com", trust=RunCA.create("r-other").cert_pem)


def test_contexts_are_cached_per_host() -> None:
    ca = RunCA.create("r-test")
    first = ca.server_context("api.example.com")
    assert ca.server_context("api.example.com") is first
    assert ca.server_context("other.example.com") is not first
    # A long name still gets a leaf (CN is capped at 64 characters; the SAN carries the name).
    long_name = ".".join(["a" * 60] * 3) + ".example.com"
    assert handshake(ca, long_name, long_name)["subjectAltName"] == (("DNS", long_name),)
