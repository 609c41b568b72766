"""Secrets the agent may use but never read: placeholders in the cell, values on the wire.

The cell sees ``NAME=stockade-secret-NAME-<32 hex>``, a placeholder that is
random per run. The gateway puts the value in place of the placeholder only
where the operator meant it to go: in a request to one of the secret's hosts
(``secrets[].hosts``, the grammar of ``network.allow``), over TLS, and in one
of the request headers the secret names (``secrets[].headers``,
``Authorization`` unless said), or in the body or URL where the secret opts in
(``secrets[].body``, ``secrets[].url``). A placeholder anywhere else is refused.

The value itself is never the agent's to send: a request that carries it, to
any host, in any of the forms of ``_forms`` (raw, base64, hex, URL- or
JSON-escaped...), is refused, whatever way the agent learnt it. Answers are
searched for it too (``EchoFilter``): a server may echo what it was sent, and
an agent may have stored its placeholder where it is substituted and read it
back encoded. Values never appear in events or errors: ``scrub`` replaces them
(in every form) and the placeholders with ``[secret NAME]`` /
``[placeholder NAME]``, before anything is cut to length.
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets as _random
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from stockade.errors import PolicyError
from stockade.gateway._forms import ValueForms
from stockade.policy._match import host_rule_matches, normalize_host_pattern
from stockade.policy._model import HostRule, SecretPolicy

PLACEHOLDER_PREFIX = "stockade-secret-"
CUT_START = 8
"""Characters of a value's start that ``scrub`` hides even where the rest was cut off."""
WATCH_LIMIT = 256 * 1024 * 1024
"""Bytes of a compressed answer the gateway decompresses to search it; past it the answer is cut off."""

# A secret's name becomes an environment variable and part of the placeholder:
# keeping it to these characters means a placeholder never needs URL-encoding.
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_BASIC = re.compile(rb"^([Bb][Aa][Ss][Ii][Cc][ \t]+)([A-Za-z0-9+/=]+)[ \t]*$")

Place = Literal["header", "body", "url", "host"]
Misuse = Literal["host", "unencrypted", "place", "value"]


class SecretMisuse(Exception):
    """A request carries a secret where it must not go: a placeholder toward a
    host it is not for (``host``), in plain HTTP (``unencrypted``), in a part of
    the request its policy does not open (``place``), or the value itself
    (``value``). The message names the secrets, never their values."""

    def __init__(
        self,
        names: Sequence[str],
        host: str,
        *,
        unencrypted: bool = False,
        kind: Misuse | None = None,
        where: str = "",
        fix: str = "",
    ) -> None:
        self.names = tuple(names)
        self.host = host
        self.kind: Misuse = kind or ("unencrypted" if unencrypted else "host")
        listed = ", ".join(self.names)
        if self.kind == "unencrypted":
            message = (
                f"the request to {host} carries the placeholder of secret {listed} in plain HTTP, where "
                f"its value would cross the network unencrypted; use https://{host}"
            )
        elif self.kind == "place":
            message = f"the request to {host} carries the placeholder of secret {listed} {where}; {fix}"
        elif self.kind == "value":
            message = (
                f"the request to {host} carries the value of secret {listed} {where}, which the agent "
                "was never given and the gateway never lets out on its behalf; send the placeholder "
                "in a header the secret names instead"
            )
        else:
            message = (
                f"the request to {host} carries the placeholder of secret {listed}, which is not meant "
                f"for {host}; send it only to the hosts listed in its secrets[].hosts, or add {host} there"
            )
        super().__init__(message)


class SecretInAnswer(Exception):
    """An answer holds a secret's value in a form the gateway cannot cut out (or
    cannot read: compressed past ``WATCH_LIMIT``); the answer must end there."""

    def __init__(self, names: Sequence[str], why: str = "") -> None:
        self.names = tuple(names)
        listed = ", ".join(self.names) or "?"
        super().__init__(
            why
            or f"the answer holds the value of secret {listed} in a form the gateway cannot cut out, "
            "so it was cut off there; ask the server for the data without the secret"
        )


@dataclass(frozen=True, slots=True)
class _Secret:
    name: str
    value: str
    placeholder: str
    rules: tuple[HostRule, ...]
    headers: frozenset[bytes] = frozenset({b"authorization"})
    """Lower-case names of the request headers the placeholder may stand in."""
    body: bool = False
    url: bool = False
    shown_headers: str = "Authorization"
    """The headers as the policy spells them, for messages."""


class Secrets:
    """The run's secrets: their placeholders, values, the hosts and places they are for."""

    def __init__(self, secrets: Sequence[_Secret] = ()) -> None:
        self._secrets = tuple(secrets)
        self._by_placeholder = {s.placeholder.encode(): s for s in self._secrets}
        self._for_host: dict[str, bool] = {}
        self._pattern = (
            re.compile(b"|".join(re.escape(p) for p in self._by_placeholder)) if self._secrets else None
        )
        self._forms = ValueForms([(s.value.encode(), i) for i, s in enumerate(self._secrets)])
        # A placeholder also in lower case, as it comes back from a host name.
        pairs: dict[str, str] = {}
        for s in self._secrets:
            pairs.setdefault(s.placeholder, f"[placeholder {s.name}]")
            pairs.setdefault(s.placeholder.lower(), f"[placeholder {s.name}]")
        self._placeholders = sorted(pairs.items(), key=lambda pair: len(pair[0]), reverse=True)

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
            headers = frozenset(h.lower().encode("ascii") for h in spec.headers)
            shown = ", ".join(spec.headers)
            secret = _Secret(name, value, placeholder, tuple(rules), headers, spec.body, spec.url, shown)
            loaded.append(secret)
        return cls(loaded)

    @property
    def active(self) -> bool:
        """Whether the run has any secret (then every request and answer is searched for them)."""
        return bool(self._secrets)

    def env(self) -> dict[str, str]:
        """``{secret name: placeholder}``: the variables the cell gets in place of the values."""
        return {s.name: s.placeholder for s in self._secrets}

    def for_host(self, host: str) -> bool:
        """Whether a secret is meant for ``host``."""
        known = self._for_host.get(host)
        if known is None:
            known = any(self._meant_for(s, host) for s in self._secrets)
            if len(self._for_host) < 4096:
                self._for_host[host] = known
        return known

    def values_in(self, data: bytes) -> tuple[str, ...]:
        """The names of the secrets whose values ``data`` carries, in any form of ``_forms``."""
        if not self._secrets:
            return ()
        return tuple(self._secrets[label].name for label in self._forms.labels_in(data))

    def refuse_values(self, data: bytes, host: str, where: str) -> None:
        """Raise if ``data`` (a part of an agent's request, ``where``) carries a value.

        Raises:
            SecretMisuse: it does (``kind="value"``).
        """
        names = self.values_in(data)
        if names:
            raise SecretMisuse(names, host, kind="value", where=where)

    def put(self, data: bytes, host: str, place: Place, *, encrypted: bool, header: bytes = b"") -> bytes:
        """``data`` (one part of a request from the agent) with the values of its
        placeholders in place, where each secret's policy lets them stand.

        ``place``: ``header`` (``header`` its lower-case name), ``body``, ``url``.
        The agent's own bytes are searched for values first: a request that
        carries one is refused, whatever its host. In an allowed header of the
        form ``Basic <base64>``, a placeholder inside the credentials counts too.

        Raises:
            SecretMisuse: a value, or a placeholder toward a host it is not for,
                in plain HTTP, or where its policy does not let it stand.
        """
        if not self._secrets:
            return data
        where = {"header": f"in its header {header.decode('latin-1')}", "body": "in its body"}.get(
            place, "in its URL"
        )
        self.refuse_values(data, host, where)
        if place == "body" and len(data) >= 2 and _compressed(data[:2]):
            self._refuse_compressed(data, host)
        if place == "header":
            basic = _BASIC.match(data)
            if basic is not None:
                try:
                    inner = base64.b64decode(basic.group(2), validate=True)
                except (binascii.Error, ValueError):
                    inner = b""
                if PLACEHOLDER_PREFIX.encode() in inner:
                    self.refuse_values(inner, host, where)
                    out = self._put(inner, host, place, encrypted, header, where)
                    return basic.group(1) + base64.b64encode(out)
        return self._put(data, host, place, encrypted, header, where)

    def _refuse_compressed(self, data: bytes, host: str) -> None:
        """Refuse a body that is gzip or zlib data (declared as a content-coding or not)
        whose decompressed text carries a value."""
        watch = _Watch(self._forms, [s.name for s in self._secrets])
        try:
            watch.feed(data)
            watch.flush()
        except SecretInAnswer as exc:
            raise SecretMisuse(
                exc.names or [s.name for s in self._secrets],
                host,
                kind="value",
                where="in its body, compressed",
            ) from None

    def _put(self, data: bytes, host: str, place: Place, encrypted: bool, header: bytes, where: str) -> bytes:
        if self._pattern is None or PLACEHOLDER_PREFIX.encode() not in data:
            return data
        elsewhere: list[str] = []
        misplaced: list[_Secret] = []
        plain: list[str] = []

        def replace(match: re.Match[bytes]) -> bytes:
            secret = self._by_placeholder[match.group(0)]
            if not self._meant_for(secret, host):
                elsewhere.append(secret.name)
            elif not _opens(secret, place, header):
                misplaced.append(secret)
            elif not encrypted:
                plain.append(secret.name)
            else:
                return secret.value.encode()
            return match.group(0)

        out = self._pattern.sub(replace, data)
        if elsewhere:
            raise SecretMisuse(list(dict.fromkeys(elsewhere)), host)
        if misplaced:
            names = list(dict.fromkeys(s.name for s in misplaced))
            raise SecretMisuse(names, host, kind="place", where=where, fix=_place_fix(misplaced[0], place))
        if plain:
            raise SecretMisuse(list(dict.fromkeys(plain)), host, unencrypted=True)
        return out

    def names_in(self, data: bytes) -> tuple[str, ...]:
        """The names of the secrets whose placeholders ``data`` carries, in order of appearance."""
        if self._pattern is None or PLACEHOLDER_PREFIX.encode() not in data:
            return ()
        found = (self._by_placeholder[m.group(0)].name for m in self._pattern.finditer(data))
        return tuple(dict.fromkeys(found))

    def scrub(self, text: str) -> str:
        """``text`` with every value (in any form) and placeholder replaced by
        ``[secret NAME]``/``[placeholder NAME]``; cut a text to length only after this."""
        if not self._secrets:
            return text
        text = self._forms.scrub(text, lambda i: f"[secret {self._secrets[i].name}]")
        text = self._scrub_cut(text)
        if PLACEHOLDER_PREFIX in text.lower():
            for needle, label in self._placeholders:
                if needle in text:
                    text = text.replace(needle, label)
        return text

    def _scrub_cut(self, text: str) -> str:
        """``text`` without the start of a value that a cut left (a message that
        quoted ``target[:200]`` before it reached ``scrub``): defence in depth, for
        values of 12 characters or more, whose first ``CUT_START`` mark them."""
        for secret in self._secrets:
            value = secret.value
            if len(value) < 12 or value[:CUT_START] not in text:
                continue
            out: list[str] = []
            pos = 0
            while (start := text.find(value[:CUT_START], pos)) != -1:
                end = start + CUT_START
                while end < len(text) and end - start < len(value) and text[end] == value[end - start]:
                    end += 1
                out += [text[pos:start], f"[secret {secret.name}, cut]"]
                pos = end
            text = "".join(out) + text[pos:]
        return text

    def body_scan(self, host: str) -> BodyScan | None:
        """A search of a request body that streams through (chunked, or too large to
        be read whole); ``None`` when the run has no secret."""
        return BodyScan(self, host, self._forms.keep) if self._secrets else None

    def echo_filter(self) -> EchoFilter | None:
        """A filter for answers, putting placeholders back where a value comes back in
        any form; ``None`` when the run has no secret.

        A server may echo what it was sent (an API's error quoting the bad
        token, a debugging endpoint listing the headers), or hand back what
        the agent stored there: without this the agent would read the value
        it was never given.
        """
        if not self._secrets:
            return None
        placeholders = {i: s.placeholder.encode() for i, s in enumerate(self._secrets)}
        return EchoFilter(self._forms, placeholders, [s.name for s in self._secrets])

    @staticmethod
    def _meant_for(secret: _Secret, host: str) -> bool:
        return any(host_rule_matches(rule, host, 0) for rule in secret.rules)


def _opens(secret: _Secret, place: Place, header: bytes) -> bool:
    if place == "header":
        return header in secret.headers
    if place == "body":
        return secret.body
    if place == "url":
        return secret.url
    return False


def _place_fix(secret: _Secret, place: Place) -> str:
    headers = secret.shown_headers
    if place == "header":
        return f"send it in a header {secret.name} is for ({headers}), or add this one to secrets[].headers"
    if place == "body":
        return f"send it in a header {secret.name} is for ({headers}), or set secrets[].body: true for it"
    if place == "url":
        return f"send it in a header {secret.name} is for ({headers}), or set secrets[].url: true for it"
    return f"send it in a header {secret.name} is for ({headers})"


class BodyScan:
    """Passes a streamed request body on, holding back its last bytes, and refuses
    it at the first value or placeholder.

    A streamed body is never substituted (its length is fixed before it is
    read), so a placeholder in it is refused as misplaced, whatever the secret's
    ``body`` says.
    """

    def __init__(self, secrets: Secrets, host: str, keep: int) -> None:
        self._secrets = secrets
        self._host = host
        self._keep = max(keep, len(PLACEHOLDER_PREFIX) + 128 + 33)
        self._tail = b""
        self._start = b""
        self._watch: _Watch | None = None

    def feed(self, data: bytes) -> bytes:
        """What can be sent on of ``data`` now.

        Raises:
            SecretMisuse: the body carries a value or a placeholder (also
                inside a body that is gzip or zlib data).
        """
        if len(self._start) < 2:
            self._start += data[: 2 - len(self._start)]
            if len(self._start) == 2 and _compressed(self._start):
                self._watch = _Watch(self._secrets._forms, [x.name for x in self._secrets._secrets])
        buf = self._tail + data
        self._check(buf)
        cut = max(0, len(buf) - self._keep)
        self._tail = buf[cut:]
        return self._watched(buf[:cut], end=False)

    def flush(self) -> bytes:
        """The bytes held back: the end of the body.

        Raises:
            SecretMisuse: as ``feed``.
        """
        tail, self._tail = self._tail, b""
        return self._watched(tail, end=True)

    def _watched(self, data: bytes, *, end: bool) -> bytes:
        if self._watch is None:
            return data
        try:
            return self._watch.feed(data) + (self._watch.flush() if end else b"")
        except SecretInAnswer as exc:
            names = exc.names or tuple(self._secrets.env())
            raise SecretMisuse(names, self._host, kind="value", where="in its body, compressed") from None

    def _check(self, buf: bytes) -> None:
        where = "in its body"
        self._secrets.refuse_values(buf, self._host, where)
        names = self._secrets.names_in(buf)
        if names:
            raise SecretMisuse(
                names,
                self._host,
                kind="place",
                where="in a body sent in chunks or larger than 1 MiB",
                fix="placeholders are put in place only in bodies of up to 1 MiB sent with a "
                "Content-Length, and only for a secret with secrets[].body: true",
            )


class EchoFilter:
    """Replaces values (in any form) by placeholders in a stream of bytes, across chunks.

    The last ``ValueForms.keep`` bytes of a chunk are held back until the next
    one (or ``flush``), since a value may start there and end in the next. A
    body that starts as gzip or zlib data is also decompressed on the side and
    searched (``_Watch``). A value the patterns cannot cut out raises
    ``SecretInAnswer``: the answer ends there.
    """

    def __init__(self, forms: ValueForms, placeholders: Mapping[int, bytes], names: Sequence[str]) -> None:
        self._forms = forms
        self._placeholder = dict(placeholders)
        self._names = list(names)
        self._keep = forms.keep
        self._tail = b""
        self._start = b""
        self._watch: _Watch | None = None
        self._decided = False

    def whole(self, data: bytes) -> bytes:
        """``data`` filtered on its own (a header value).

        Raises:
            SecretInAnswer: a value in a form that cannot be cut out.
        """
        return self._replace(data, len(data))[0]

    def feed(self, data: bytes) -> bytes:
        """What can be passed on of ``data`` now, filtered.

        Raises:
            SecretInAnswer: as ``whole``, or in the decompressed body.
        """
        if not self._decided:
            self._start += data[: 2 - len(self._start)]
            if len(self._start) >= 2:
                self._decided = True
                if _compressed(self._start):
                    self._watch = _Watch(self._forms, self._names)
        buf = self._tail + data
        # A value starting before ``safe`` ends within ``buf``: all of those are found.
        safe = max(0, len(buf) - self._keep)
        out, cut = self._replace(buf, safe)
        self._tail = buf[cut:]
        return self._watch.feed(out) if self._watch is not None else out

    def flush(self) -> bytes:
        """The bytes held back, filtered: the end of the stream.

        Raises:
            SecretInAnswer: as ``feed``.
        """
        tail, self._tail = self._tail, b""
        out = self.whole(tail)
        if self._watch is not None:
            return self._watch.feed(out) + self._watch.flush()
        return out

    def _replace(self, buf: bytes, safe: int) -> tuple[bytes, int]:
        """``buf`` up to ``safe`` (or past it, to the end of a match) with values
        replaced; and where in ``buf`` that ended."""
        if not self._forms.labels_in(buf):
            return buf[:safe], safe
        out = bytearray()
        pos = 0
        for start, end, label in self._forms.finditer(buf):
            if start >= safe:
                break
            out += buf[pos:start]
            out += self._placeholder[label]
            pos = end
        cut = max(pos, safe)
        out += buf[pos:cut]
        left = self._forms.labels_in(bytes(out))
        if left:
            raise SecretInAnswer([self._names[label] for label in left])
        return bytes(out), cut


def _compressed(start: bytes) -> bool:
    """Whether a body starting with ``start`` looks like gzip or zlib data (RFC 1952, RFC 1950)."""
    if start[:2] == b"\x1f\x8b":
        return True
    return start[0] & 0x0F == 8 and (start[0] << 8 | start[1]) % 31 == 0


class _Watch:
    """Decompresses a body that is gzip or zlib data on the side, and holds back
    the compressed bytes until what they decompress to was searched.

    A compressed piece goes on once the decompressed text ``keep`` bytes past
    its end has been searched clean: a value starting in it would have been
    found. Data that turns out not to decompress is passed on as it is (the
    raw search saw it).
    """

    def __init__(self, forms: ValueForms, names: Sequence[str]) -> None:
        self._forms = forms
        self._names = names
        self._inflate = zlib.decompressobj(32 + 15)  # a gzip or a zlib header, told apart by zlib
        self._window = b""
        self._held: list[tuple[bytes, int]] = []
        self._total = 0
        self._dead = False

    def feed(self, data: bytes) -> bytes:
        if self._dead:
            return self._release() + data
        try:
            self._search(self._inflate.decompress(data, 1 << 20))
            while self._inflate.unconsumed_tail or (self._inflate.eof and self._inflate.unused_data):
                if self._inflate.eof:  # another gzip member follows
                    rest = self._inflate.unused_data
                    self._inflate = zlib.decompressobj(32 + 15)
                    self._search(self._inflate.decompress(rest, 1 << 20))
                else:
                    self._search(self._inflate.decompress(self._inflate.unconsumed_tail, 1 << 20))
        except zlib.error:
            self._dead = True
            return self._release() + data
        self._held.append((data, self._total))
        out = bytearray()
        while self._held and self._held[0][1] + self._forms.keep <= self._total:
            out += self._held.pop(0)[0]
        return bytes(out)

    def flush(self) -> bytes:
        if not self._dead:
            try:
                self._search(self._inflate.flush())
            except zlib.error:
                pass
        return self._release()

    def _search(self, plain: bytes) -> None:
        if not plain:
            return
        self._total += len(plain)
        if self._total > WATCH_LIMIT:
            raise SecretInAnswer(
                [],
                f"the answer is compressed data of more than {WATCH_LIMIT // (1024 * 1024)} MiB "
                "decompressed, too much to search for the run's secrets, so it was cut off; "
                "fetch it in smaller parts",
            )
        window = self._window + plain
        found = self._forms.labels_in(window)
        if found:
            raise SecretInAnswer([self._names[label] for label in found])
        self._window = window[-self._forms.keep :] if self._forms.keep else b""

    def _release(self) -> bytes:
        out = b"".join(piece for piece, _ in self._held)
        self._held.clear()
        return out


def _read_value(spec: SecretPolicy, environ: Mapping[str, str]) -> str:
    name = spec.name
    if (spec.env is None) == (spec.file is None):
        raise PolicyError(f"secrets: {name} must name exactly one of 'env' and 'file'")
    if spec.env is not None:
        value = environ.get(spec.env)
        if value is None:
            raise PolicyError(
                f"secrets: {name} comes from the environment variable {spec.env}, which is not set; "
                "export it in the shell that runs `stockade run` or `stockade exec` "
                "(or where the daemon starts)"
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


__all__ = [
    "PLACEHOLDER_PREFIX",
    "BodyScan",
    "EchoFilter",
    "Place",
    "SecretInAnswer",
    "SecretMisuse",
    "Secrets",
]
