"""A secret's value recognised in the forms a server (or an agent) can turn it into.

Hiding only the exact value is not enough: an agent that gets its placeholder
substituted toward the secret's host can ask that host to answer the value
base64-, hex-, URL- or JSON-encoded and decode it itself, or send it on to
another host that way. ``ValueForms`` matches, for each value:

- the value character by character, each one either itself (letters in any
  case: hex digits, host names and upper-cased echoes lose no secrecy by
  it) or escaped: ``%XX`` (and ``%25XX``, encoded twice), ``\\uXXXX`` and
  ``\\/`` of JSON, ``\\xXX``, HTML entities (``&#115;``, ``&#x73;``, ``&quot;``),
  ``+`` for a space, quoted-printable ``=XX``; any mixture of these;
- its hex digits (any case);
- its base64, standard and URL-safe alphabets, at each of the three
  alignments the value can have inside a longer encoded text (the characters
  that depend on the value's bits only), padding or not, with MIME line breaks
  anywhere between characters.

What a server does beyond these (encryption, compression: see ``_proxy`` and
``_fetch`` for gzip and deflate, decoded before scanning) no pattern can see.
Values shorter than ``MIN_ENCODED`` bytes are matched raw and escaped only:
their base64 and hex cores would match ordinary text.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

MIN_ENCODED = 6
"""Values of fewer bytes get no base64 or hex patterns (a 4-character core matches noise)."""

_NAMED = {ord("&"): b"&amp;", ord('"'): b"&quot;", ord("<"): b"&lt;", ord(">"): b"&gt;", ord("'"): b"&apos;"}
_JSON_SHORT = {ord("/"): rb"\\/", ord('"'): rb"\\\"", ord("\\"): rb"\\\\"}
_MIME_BREAK = rb"(?:\r?\n)?"
_LONGEST_ESCAPE = 11
"""Bytes of the longest escape of one character (``&#x0000ff;``), for the hold-back of streams."""


def _hex_digit(d: str) -> bytes:
    return f"[{d}{d.upper()}]".encode() if d.isalpha() else d.encode()


def _hex_pair(b: int) -> bytes:
    return b"".join(_hex_digit(d) for d in f"{b:02x}")


def _one_char(b: int) -> bytes:
    """The pattern of one byte of a value: itself or one of its escapes."""
    ch = chr(b)
    options: list[bytes] = []
    if ch.isascii() and ch.isalpha():
        options.append(f"[{ch.lower()}{ch.upper()}]".encode())
    else:
        options.append(re.escape(bytes([b])))
    pair = _hex_pair(b)
    options += [b"%" + pair, b"%25" + pair, rb"\\x" + pair, rb"\\u00" + pair, b"=" + pair]
    options.append(b"&#0{0,4}" + str(b).encode() + b";")
    options.append(b"&#[xX]0{0,4}" + b"".join(_hex_digit(d) for d in f"{b:x}") + b";")
    if b in _NAMED:
        options.append(re.escape(_NAMED[b]))
    if b in _JSON_SHORT:
        options.append(_JSON_SHORT[b])
    if b == ord(" "):
        options.append(rb"\+")
    return b"(?:" + b"|".join(options) + b")"


def base64_cores(value: bytes) -> list[bytes]:
    """The base64 characters of ``value`` that are the same wherever it stands in a
    longer text: one core per alignment (0, 1 or 2 bytes before it, mod 3)."""
    cores: list[bytes] = []
    n = len(value)
    for pad in range(3):
        encoded = base64.b64encode(b"\0" * pad + value)
        # Character i covers bits [6i, 6i+6); keep those inside the value's [8 pad, 8 (pad + n)).
        first = -(-8 * pad // 6)
        end = (8 * (pad + n)) // 6
        core = encoded[first:end]
        if core:
            cores.append(core)
    return cores


def value_patterns(value: bytes) -> list[bytes]:
    """Every pattern of ``value`` (regular-expression source, bytes)."""
    patterns = [b"".join(_one_char(b) for b in value)]
    if len(value) >= MIN_ENCODED:
        patterns.append(b"".join(_hex_digit(d) for d in value.hex()))
        urlsafe = bytes.maketrans(b"+/", b"-_")
        for core in base64_cores(value):
            for alphabet in (core, core.translate(urlsafe)):
                patterns.append(_MIME_BREAK.join(re.escape(bytes([c])) for c in alphabet))
    return list(dict.fromkeys(patterns))


# The escapes of the per-character forms, decoded by ``_decode`` for the fast
# check: one expression per leading character, as each then starts with a
# literal that the regular-expression engine skips to (one expression for all
# of them tried every position: 6 times slower on binary data here).
_PERCENT = re.compile(rb"%(?:25)?([0-9A-Fa-f]{2})")
_BACKSLASH = re.compile(rb"\\(?:u00([0-9A-Fa-f]{2})|x([0-9A-Fa-f]{2})|([/\"\\nr]))")
_AMPERSAND = re.compile(rb"&(?:#0{0,4}([0-9]{1,3})|#[xX]0{0,4}([0-9A-Fa-f]{1,2})|(amp|quot|lt|gt|apos));")
_ENTITIES = {b"amp": b"&", b"quot": b'"', b"lt": b"<", b"gt": b">", b"apos": b"'"}
_SHORT = {b"n": b"\n", b"r": b"\r"}


def _percent(match: re.Match[bytes]) -> bytes:
    return bytes([int(match.group(1), 16)])


def _backslash(match: re.Match[bytes]) -> bytes:
    hex_pair = match.group(1) or match.group(2)
    if hex_pair is not None:
        return bytes([int(hex_pair, 16)])
    return _SHORT.get(match.group(3), match.group(3))


def _ampersand(match: re.Match[bytes]) -> bytes:
    if match.group(1) is not None:
        number = int(match.group(1))
        return bytes([number]) if number < 256 else match.group(0)
    if match.group(2) is not None:
        return bytes([int(match.group(2), 16)])
    return _ENTITIES[match.group(3)]


def _decode(data: bytes) -> bytes:
    """``data`` with every escape of the per-character forms decoded (once each kind)."""
    if b"%" in data:
        data = _PERCENT.sub(_percent, data)
    if b"\\" in data:
        data = _BACKSLASH.sub(_backslash, data)
    if b"&" in data:
        data = _AMPERSAND.sub(_ampersand, data)
    return data


# Quoted-printable (RFC 2045 6.7), decoded in a pass of its own: read in the same
# pass as '%XX', a URL's 'k=de%61d' would lose the 'de' of a value 'dead'.
_QUOTED = re.compile(rb"=([0-9A-Fa-f]{2})|=\r?\n")


def _unquote(match: re.Match[bytes]) -> bytes:
    return bytes([int(match.group(1), 16)]) if match.group(1) is not None else b""  # a soft line break


@dataclass(frozen=True, slots=True)
class _Value:
    label: int
    lowered: tuple[bytes, ...]
    """The value in lower case (and with its spaces as '+', when it has any), and its hex."""
    cores: tuple[bytes, ...]
    """Its base64 cores, both alphabets (case matters)."""


class ValueForms:
    """Finds any of several values, in any of their forms, in bytes.

    ``labels_in`` is the fast check (escapes decoded once, then plain
    searches: 20-40 MB/s here on binary data, hundreds on plain text); ``finditer`` the regular expression
    that locates each form, run only where the check found something (about
    5 MB/s here). ``keep``: how many bytes a match can span less one, the
    hold-back a stream scanner needs so that a value cut across two chunks is
    still found.
    """

    def __init__(self, values: Sequence[tuple[bytes, int]]) -> None:
        """``values``: (value, label) pairs; a match reports the label of its value."""
        # Longest first, so that a value holding another is found whole.
        ordered = sorted(values, key=lambda pair: len(pair[0]), reverse=True)
        self._labels: dict[str, int] = {}
        self._values: list[_Value] = []
        groups: list[bytes] = []
        longest = 0
        for index, (value, label) in enumerate(ordered):
            group = f"v{index}"
            self._labels[group] = label
            groups.append(b"(?P<" + group.encode() + b">" + b"|".join(value_patterns(value)) + b")")
            lowered = value.lower()
            spaced = [lowered, lowered.replace(b" ", b"+")] if b" " in value else [lowered]
            cores: list[bytes] = []
            if len(value) >= MIN_ENCODED:
                urlsafe = bytes.maketrans(b"+/", b"-_")
                spaced.append(value.hex().encode())  # hex digits: any case, so searched lowered
                for core in base64_cores(value):
                    cores += [core, core.translate(urlsafe)]
            self._values.append(_Value(label, tuple(spaced), tuple(dict.fromkeys(cores))))
            # MIME breaks (2 bytes) between base64 characters: about 3 bytes a value byte.
            longest = max(longest, len(value) * _LONGEST_ESCAPE, len(value) * 4)
        self._pattern = re.compile(b"|".join(groups)) if groups else None
        self.keep = max(0, longest - 1)

    def __bool__(self) -> bool:
        return self._pattern is not None

    def labels_in(self, data: bytes) -> list[int]:
        """The labels of the values ``data`` carries in any form, each once."""
        if not self._values or not data:
            return []
        decoded = _decode(data)
        lowered = [decoded.lower()]
        if decoded != data:
            # A value may itself hold what looks like an escape ('%41'): the text
            # as it is is searched too.
            lowered.append(data.lower())
        if b"=" in data:
            quoted = _QUOTED.sub(_unquote, data)
            if quoted != data:
                lowered.append(quoted.lower())
        unbroken = decoded.replace(b"\r", b"").replace(b"\n", b"") if b"\n" in decoded else decoded
        found: list[int] = []
        for value in self._values:
            if any(form in text for text in lowered for form in value.lowered) or any(
                core in unbroken for core in value.cores
            ):
                found.append(value.label)
        return found

    def scrub(self, text: str, label: Callable[[int], str]) -> str:
        """``text`` with every match replaced by ``label(its label)``; a text the
        patterns cannot clean (a form only the fast check sees) is withheld whole."""
        data = text.encode("utf-8", "surrogateescape")
        if not self.labels_in(data):
            return text
        out = bytearray()
        pos = 0
        for start, end, found in self.finditer(data):
            out += data[pos:start] + label(found).encode("utf-8")
            pos = end
        out += data[pos:]
        left = self.labels_in(bytes(out))
        if left:
            names = ", ".join(dict.fromkeys(label(i) for i in left))
            return f"[a text withheld: it holds {names} in a form that cannot be cut out]"
        return bytes(out).decode("utf-8", "surrogateescape")

    def finditer(self, data: bytes, start: int = 0) -> Iterator[tuple[int, int, int]]:
        """(start, end, label) of each match in ``data`` from ``start``, left to right."""
        if self._pattern is None:
            return
        for match in self._pattern.finditer(data, start):
            assert match.lastgroup is not None
            yield match.start(), match.end(), self._labels[match.lastgroup]


__all__ = ["MIN_ENCODED", "ValueForms", "base64_cores", "value_patterns"]
