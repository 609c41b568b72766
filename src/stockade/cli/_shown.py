"""What the operator is asked to decide on, rendered so that it cannot hide.

An approval's arguments are the agent's text. Printed as they are, a carriage
return, an ANSI escape or a bidirectional override in them rewrites what the
terminal shows (``rm -rf ~\\r`` followed by ``echo hello`` reads as
``echo hello``), and an argument padded with spaces pushes its payload past
any preview. So every character that moves the cursor, changes the terminal's
state or reorders or hides text is shown as an escape, and nothing is ever cut
without saying so, by how much and where the whole is (``stockade approvals
show ID``).
"""

from __future__ import annotations

import json
import unicodedata

LIST_WIDTH = 200
"""Characters of an approval's arguments the listing shows before its mark."""

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\x1b": "\\x1b", "\\": "\\\\"}


def _hides(char: str) -> bool:
    """Whether a terminal would not show ``char`` as one plain glyph: controls
    (C0, DEL, C1: U+009B is a CSI on many terminals), format characters
    (bidirectional overrides and isolates, zero-width ones, the BOM) and the
    line and paragraph separators."""
    return unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn")


def _escape(char: str) -> str:
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def visible(text: str) -> str:
    """``text`` with each hiding character (and the backslash, so that an
    escape the agent typed cannot pass for one made here) written as a
    Python-style escape; everything else as it is."""
    out: list[str] = []
    for char in text:
        named = _NAMED.get(char)
        if named is not None:
            out.append(named)
        elif _hides(char):
            out.append(_escape(char))
        else:
            out.append(char)
    return "".join(out)


def safe_json(value: object, *, indent: int | None = None) -> str:
    """``value`` as JSON whose every hiding character is a ``\\uXXXX`` escape.

    ``json.dumps`` escapes C0 controls but not DEL, C1 controls or the
    bidirectional and zero-width characters; those are escaped here too, so
    the text stays valid JSON that reads back to the same value.
    """
    text = json.dumps(value, ensure_ascii=False, indent=indent)
    if not any(_hides(c) for c in text if c not in "\n"):
        return text
    out: list[str] = []
    for char in text:
        if char != "\n" and _hides(char):
            code = ord(char)
            if code > 0xFFFF:  # JSON escapes a character outside the BMP as a surrogate pair
                code -= 0x10000
                out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
            else:
                out.append(f"\\u{code:04x}")
        else:
            out.append(char)
    return "".join(out)


def preview(text: str, approval_id: str, width: int = LIST_WIDTH) -> str:
    """``text`` (already made visible) cut at ``width`` characters with an
    explicit mark of what was left out and where to read it whole."""
    if len(text) <= width:
        return text
    return f"{text[:width]}… ({len(text) - width} more characters; stockade approvals show {approval_id})"


def argument_lines(args: object) -> list[str]:
    """Every argument of an approval, whole and visible, one per block:
    ``name (N characters):`` then the value, so that padding shows as a
    length even where it shows as nothing else."""
    lines: list[str] = []

    def walk(prefix: str, value: object) -> None:
        if isinstance(value, dict):
            if not value:
                lines.append(f"{prefix or 'args'}: {{}}")
            for key, item in value.items():
                walk(f"{prefix}.{visible(str(key))}" if prefix else visible(str(key)), item)
        elif isinstance(value, list):
            if not value:
                lines.append(f"{prefix}: []")
            for index, item in enumerate(value):
                walk(f"{prefix}[{index}]", item)
        elif isinstance(value, str):
            lines.append(f"{prefix} ({len(value)} characters):")
            lines.append(f"  {visible(value)}")
        else:
            lines.append(f"{prefix}: {safe_json(value)}")

    walk("", args)
    return lines


__all__ = ["LIST_WIDTH", "argument_lines", "preview", "safe_json", "visible"]
