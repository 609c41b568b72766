"""Secrets the agent may use but never read: placeholders in the cell, values on the wire.

The cell sees ``NAME=stockade-secret-NAME-<32 hex>``, a placeholder that is
random per run. When a request through the gateway carries a placeholder, the
proxy replaces it with the secret's value, but only on its way to a host the
secret is meant for (``secrets[].hosts``, the host pattern grammar of
``network.allow``). A placeholder on its way to any other host is refused: that
is an agent trying to send a credential where the operator did not mean it to
go. Values never appear in events or errors: ``scrub`` replaces them (and the
placeholders) with ``[secret NAME]`` / ``[placeholder NAME]``.
"""

from __future__ import annotations

import re
import secrets as _random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from stockade.errors import PolicyError
from stockade.policy._match import host_rule_matches, normalize_host_pattern
from stockade.policy._model import HostRule, SecretPolicy

PLACEHOLDER_PREFIX = "stockade-secret-"

# A secret's name becomes an environment variable and part of the placeholder:
# keeping it to these characters means a placeholder never needs URL-encoding.
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


class SecretMisuse(Exception):
    """A request carries placeholders of secrets that are not meant for its host
    (or, ``unencrypted``, that would cross the network in plain HTTP)."""

    def __init__(self, names: Sequence[str], host: str, *, unencrypted: bool = False) -> None:
        self.names = tuple(names)
        self.host = host
        listed = ", ".join(self.names)
        if unencrypted:
            message = (
                f"the request to {host} carries the placeholder of secret {listed} in plain HTTP, where "
                f"its value would cross the network unencrypted; use https://{host}"
            )
        else:
            message = (
                f"the request to {host} carries the placeholder of secret {listed}, which is not meant "
                f"for {host}; send it only to the hosts listed in its secrets[].hosts, or add {host} there"
            )
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class _Secret:
    name: str
    value: str
    placeholder: str
    rules: tuple[HostRule, ...]


class Secrets:
    """The run's secrets: their placeholders, values and the hosts they are for."""

    def __init__(self, secrets: Sequence[_Secret] = ()) -> None:
        self._secrets = tuple(secrets)
        self._by_placeholder = {s.placeholder.encode(): s for s in self._secrets}
        self._for_host: dict[str, bool] = {}
        self._pattern = (
            re.compile(b"|".join(re.escape(p) for p in self._by_placeholder)) if self._secrets else None
        )
        # Longest first, so that a value holding another one is scrubbed whole; a
        # placeholder also in lower case, as it comes back from a host name.
        pairs = {s.value: f"[secret {s.name}]" for s in self._secrets}
        for s in self._secrets:
            pairs.setdefault(s.placeholder, f"[placeholder {s.name}]")
            pairs.setdefault(s.placeholder.lower(), f"[placeholder {s.name}]")
        self._scrub = sorted(pairs.items(), key=lambda pair: len(pair[0]), reverse=True)

    @classmethod
    def load(cls, secrets: Sequence[SecretPolicy], environ: Mapping[str, str]) -> Secrets:
        """Read each secret's value from ``environ[secret.env]`` or the file ``secret.file``.

        Raises:
            PolicyError: a secret's name or host pattern is not valid, its value
                is missing or empty, or it holds a line break (which could smuggle
                a header into a request) or another control character.
        """
        loaded: list[_Secret] = []
        seen: set[str] = set()
        for spec in secrets:
            name = spec.name
            if not _NAME.match(name):
                raise PolicyError(
                    f"secrets: the name {name!r} is not valid; use letters, digits and '_', "
                    "starting with a letter, as for an environment variable"
                )
            if name in seen:
                raise PolicyError(f"secrets: {name} is listed twice; keep one entry per secret")
            seen.add(name)
            value = _read_value(spec, environ)
            rules = []
            for pattern in spec.hosts:
                try:
                    rules.append(HostRule(host=normalize_host_pattern(pattern), ports=(0,)))
                except ValueError as exc:
                    raise PolicyError(f"secrets: {name}: hosts: {exc}") from None
            if not rules:
                raise PolicyError(
                    f"secrets: {name} lists no hosts, so it could never be sent; "
                    "name the hosts it is for under 'hosts'"
                )
            placeholder = f"{PLACEHOLDER_PREFIX}{name}-{_random.token_hex(16)}"
            loaded.append(_Secret(name, value, placeholder, tuple(rules)))
        return cls(loaded)

    def env(self) -> dict[str, str]:
        """``{secret name: placeholder}``: the variables the cell gets in place of the values."""
        return {s.name: s.placeholder for s in self._secrets}

    def for_host(self, host: str) -> bool:
        """Whether a secret is meant for ``host`` (then its traffic must be inspected)."""
        known = self._for_host.get(host)
        if known is None:
            known = any(self._meant_for(s, host) for s in self._secrets)
            if len(self._for_host) < 4096:
                self._for_host[host] = known
        return known

    def substitute(self, data: bytes, host: str) -> bytes:
        """``data`` with the placeholders of secrets meant for ``host`` replaced by their values.

        Raises:
            SecretMisuse: ``data`` carries a placeholder of a secret not meant
                for ``host``; nothing should be sent.
        """
        if self._pattern is None or PLACEHOLDER_PREFIX.encode() not in data:
            return data
        misused: list[str] = []

        def replace(match: re.Match[bytes]) -> bytes:
            secret = self._by_placeholder[match.group(0)]
            if self._meant_for(secret, host):
                return secret.value.encode()
            if secret.name not in misused:
                misused.append(secret.name)
            return match.group(0)

        out = self._pattern.sub(replace, data)
        if misused:
            raise SecretMisuse(misused, host)
        return out

    def names_in(self, data: bytes) -> tuple[str, ...]:
        """The names of the secrets whose placeholders ``data`` carries, in order of appearance."""
        if self._pattern is None or PLACEHOLDER_PREFIX.encode() not in data:
            return ()
        found = (self._by_placeholder[m.group(0)].name for m in self._pattern.finditer(data))
        return tuple(dict.fromkeys(found))

    def scrub(self, text: str) -> str:
        """``text`` with every value and placeholder replaced by ``[secret NAME]``/``[placeholder NAME]``."""
        for needle, label in self._scrub:
            if needle in text:
                text = text.replace(needle, label)
        return text

    def echo_filter(self, host: str) -> EchoFilter | None:
        """A filter for what ``host`` answers, putting placeholders back in place of the
        values of the secrets meant for it; ``None`` when no secret is.

        A server may echo what it was sent (an API's error quoting the bad
        token, a debugging endpoint listing the headers): without this the
        agent would read the value it was never given.
        """
        meant = [s for s in self._secrets if self._meant_for(s, host)]
        pairs = [(s.value.encode(), s.placeholder.encode()) for s in meant]
        return EchoFilter(pairs) if pairs else None

    @staticmethod
    def _meant_for(secret: _Secret, host: str) -> bool:
        return any(host_rule_matches(rule, host, 0) for rule in secret.rules)


class EchoFilter:
    """Replaces values by placeholders in a stream of bytes, across the chunks it comes in.

    The last ``longest value - 1`` bytes of a chunk are held back until the
    next one (or ``flush``), since a value may start there and end in the next.
    """

    def __init__(self, pairs: Sequence[tuple[bytes, bytes]]) -> None:
        self._placeholder = dict(pairs)
        values = sorted(self._placeholder, key=len, reverse=True)
        self._pattern = re.compile(b"|".join(re.escape(v) for v in values))
        self._keep = len(values[0]) - 1
        self._tail = b""

    def whole(self, data: bytes) -> bytes:
        """``data`` filtered on its own (a header value)."""
        return self._pattern.sub(self._swap, data)

    def feed(self, data: bytes) -> bytes:
        """What can be passed on of ``data`` now, filtered."""
        buf = self._tail + data
        # A value starting before ``safe`` ends within ``buf``: all of those are found.
        safe = max(0, len(buf) - self._keep)
        out = bytearray()
        pos = 0
        for match in self._pattern.finditer(buf):
            if match.start() >= safe:
                break
            out += buf[pos : match.start()]
            out += self._placeholder[match.group(0)]
            pos = match.end()
        cut = max(pos, safe)
        out += buf[pos:cut]
        self._tail = buf[cut:]
        return bytes(out)

    def flush(self) -> bytes:
        """The bytes held back, filtered: the end of the stream."""
        tail, self._tail = self._tail, b""
        return self.whole(tail)

    def _swap(self, match: re.Match[bytes]) -> bytes:
        return self._placeholder[match.group(0)]


def _read_value(spec: SecretPolicy, environ: Mapping[str, str]) -> str:
    name = spec.name
    if (spec.env is None) == (spec.file is None):
        raise PolicyError(f"secrets: {name} must name exactly one of 'env' and 'file'")
    if spec.env is not None:
        value = environ.get(spec.env)
        if value is None:
            raise PolicyError(
                f"secrets: {name} comes from the environment variable {spec.env}, which is not set; "
                "set it where the daemon runs"
            )
        where = f"the environment variable {spec.env}"
    else:
        assert spec.file is not None
        try:
            with open(spec.file, encoding="utf-8") as f:
                value = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "it is not UTF-8 text"
            raise PolicyError(
                f"secrets: {name} comes from the file {spec.file}, which cannot be read ({reason}); "
                "check the path and its permissions"
            ) from None
        if value.endswith("\n"):
            value = value[:-1]
        where = f"the file {spec.file}"
    if not value:
        raise PolicyError(f"secrets: {name} is empty in {where}; give it its value there")
    if any(c < " " or c == "\x7f" for c in value):
        raise PolicyError(
            f"secrets: {name} in {where} holds a line break or another control character, which "
            "could forge a header when substituted (or break it); store the value on one line"
        )
    return value


__all__ = ["PLACEHOLDER_PREFIX", "EchoFilter", "SecretMisuse", "Secrets"]
