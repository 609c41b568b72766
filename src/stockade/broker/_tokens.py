"""Capability tokens: what a cell shows the broker to say which run and cell it is.

A token is ``st1.<payload>.<mac>``: ``payload`` is the base64url (unpadded) of
the canonical JSON ``[run, cell, expiry in ms since the epoch]``, ``mac`` the
base64url of HMAC-SHA256 over ``st1.<payload>`` with the daemon's key. The key
is random per daemon (32 bytes from ``os.urandom``) unless one is given, so a
daemon restart invalidates every token.

``check`` tells apart what a caller can do about a bad token: ``malformed``
(not a token at all), ``forged`` (the MAC is not ours: a guess or an edit),
``wrong_run`` (ours, but issued to another run or cell), ``expired`` (ours,
this run's, too old). The MAC is compared in constant time, and checked before
anything of the payload is believed.

Tokens are secrets: nothing here logs one, and ``Tokens`` never shows its key.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import json
import math
import os
import time
from collections.abc import Callable

_PREFIX = "st1."
MAX_TOKEN_LENGTH = 1024
"""Anything longer is malformed without being decoded."""
_MAC_LENGTH = hashlib.sha256().digest_size


class TokenCheck(enum.StrEnum):
    """The outcome of ``Tokens.check``; equal to its string value (``TokenCheck.OK == "ok"``)."""

    OK = "ok"
    MALFORMED = "malformed"
    """Not the shape of a token (wrong prefix, bad base64, too long, not a string)."""
    FORGED = "forged"
    """Shaped like a token, but its MAC is not this daemon's."""
    WRONG_RUN = "wrong_run"
    """Issued by this daemon, to another run or another cell."""
    EXPIRED = "expired"
    """Issued by this daemon to this run and cell, past its expiry."""


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64decode(text: str) -> bytes:
    """Strict unpadded base64url; raises ValueError on anything else."""
    if not text or not all(c.isascii() and (c.isalnum() or c in "-_") for c in text):
        raise ValueError("not base64url")
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise ValueError("not base64url") from exc
    if _b64encode(data) != text:  # non-canonical trailing bits: not one we made
        raise ValueError("not canonical base64url")
    return data


class Tokens:
    """Issues and checks the capability tokens of one daemon."""

    __slots__ = ("_clock", "_key")

    def __init__(self, key: bytes | None = None, *, clock: Callable[[], float] = time.time) -> None:
        """
        Args:
            key: the HMAC key, at least 16 bytes; 32 random bytes when omitted.
            clock: seconds since the epoch (injected by tests).

        Raises:
            ValueError: the key is shorter than 16 bytes.
        """
        if key is None:
            key = os.urandom(32)
        if len(key) < 16:
            raise ValueError(f"a token key of {len(key)} bytes is too short to sign with; give at least 16")
        self._key = bytes(key)
        self._clock = clock

    def __repr__(self) -> str:
        return "Tokens(key=<hidden>)"

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("Tokens holds a secret key and cannot be pickled")

    def _mac(self, signed: bytes) -> bytes:
        return hmac.new(self._key, signed, hashlib.sha256).digest()

    def issue(self, run: str, cell: str, *, ttl: float) -> str:
        """A token for ``run`` and ``cell``, valid for ``ttl`` seconds from now.

        Raises:
            ValueError: ``ttl`` is not a positive finite number.
        """
        if isinstance(ttl, bool) or not (isinstance(ttl, int | float) and math.isfinite(ttl) and ttl > 0):
            raise ValueError(f"token ttl {ttl!r} is not a positive number of seconds; give one such as 3600")
        expiry_ms = math.ceil((self._clock() + ttl) * 1000)
        payload = json.dumps([run, cell, expiry_ms], separators=(",", ":"), ensure_ascii=False)
        signed = _PREFIX + _b64encode(payload.encode("utf-8"))
        return signed + "." + _b64encode(self._mac(signed.encode("ascii")))

    def check(self, token: object, *, run: str, cell: str) -> TokenCheck:
        """Whether ``token`` is a live token of this daemon for ``run`` and ``cell``.

        Never raises: anything that is not a token (``None``, a number, a huge
        string) is ``MALFORMED``.
        """
        if not isinstance(token, str) or len(token) > MAX_TOKEN_LENGTH or not token.startswith(_PREFIX):
            return TokenCheck.MALFORMED
        signed, dot, mac_text = token.rpartition(".")
        if not dot or len(signed) <= len(_PREFIX):
            return TokenCheck.MALFORMED
        try:
            payload = _b64decode(signed[len(_PREFIX) :])
            mac = _b64decode(mac_text)
        except ValueError:
            return TokenCheck.MALFORMED
        if len(mac) != _MAC_LENGTH:
            return TokenCheck.MALFORMED
        if not hmac.compare_digest(mac, self._mac(signed.encode("ascii"))):
            return TokenCheck.FORGED
        try:
            token_run, token_cell, expiry_ms = json.loads(payload.decode("utf-8"))
        except (ValueError, TypeError):
            return TokenCheck.FORGED  # signed by this key, yet not what ``issue`` writes
        if not (isinstance(token_run, str) and isinstance(token_cell, str) and isinstance(expiry_ms, int)):
            return TokenCheck.FORGED
        if token_run != run or token_cell != cell:
            return TokenCheck.WRONG_RUN
        if self._clock() * 1000 >= expiry_ms:
            return TokenCheck.EXPIRED
        return TokenCheck.OK


__all__ = ["MAX_TOKEN_LENGTH", "TokenCheck", "Tokens"]
