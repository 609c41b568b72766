"""Inside the broker and the daemon a refusal is a ``Refusal`` told by its type,
never its wire form ``{"error": {"code": "refused"}}`` matched back (issue 13)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "stockade"
# The wire helper `refusal()` (for clients and tests) is where the wire form is read.
WIRE_READER = ("broker/_intents.py", "refusal")


def _matches_back(path: Path, rel: str) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    skipped: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and (rel, node.name) == WIRE_READER:
            skipped.update(ast.walk(node))
    found = []
    for node in ast.walk(tree):
        if node in skipped:
            continue
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(isinstance(o, ast.Constant) and o.value == "refused" for o in operands):
                found.append(f"{rel}:{node.lineno}: compares with 'refused'")
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name == "refusal":
                found.append(f"{rel}:{node.lineno}: calls refusal() on a wire value")
    return found


def test_no_refusal_is_told_by_its_wire_form_inside_broker_or_daemon() -> None:
    files = sorted([*(SRC / "broker").glob("*.py"), *(SRC / "daemon").glob("*.py")])
    assert len(files) > 20
    found = [hit for path in files for hit in _matches_back(path, path.relative_to(SRC).as_posix())]
    assert found == [], found


def test_the_check_finds_a_match_back(tmp_path: Path) -> None:
    """Control: the check sees the two forms it looks for."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        'def f(value, error):\n    r = refusal(value)\n    return error["code"] == "refused" or r\n'
    )
    assert [hit.split(": ", 1)[1] for hit in _matches_back(sample, "daemon/sample.py")] == [
        "calls refusal() on a wire value",
        "compares with 'refused'",
    ]
