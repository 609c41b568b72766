"""The tools rules: glob matching (tables and properties) and first-match decisions."""

from __future__ import annotations

import fnmatch
import posixpath

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from stockade.broker._rules import Decision, Rules, compile_glob, glob_matches, normalize_path
from stockade.policy import ToolRule


def rule(id: str, intent: str, verdict: str, **match: str) -> ToolRule:
    return ToolRule(id=id, intent=intent, verdict=verdict, match=tuple(match.items()))  # type: ignore[arg-type]


# --------------------------------------------------------------------- matching


@pytest.mark.parametrize(
    ("pattern", "value", "expected"),
    [
        ("/data/*", "/data/a.txt", True),
        ("/data/*", "/data/.env", True),  # unlike a shell, * matches a leading dot
        ("/data/*", "/data/sub/a.txt", False),  # * stays in one component
        ("/data/*", "/data", False),
        ("/data/*", "/data/", False),  # normalised to /data
        ("/data/*", "/data/../etc/passwd", False),  # normalised to /etc/passwd
        ("/data/*", "/data/./a", True),
        ("/data/*", "//data//a", True),
        ("/data/*", "/data/sub/../a", True),  # /data/a
        ("/data/*", "/etc/../data/a", True),  # /data/a
        ("/data/*", "data/a", False),  # relative: never an absolute pattern
        ("/data/*", "/data/a/..", False),  # /data
        ("/data/**", "/data", True),  # a final /** is the directory and its tree
        ("/data/**", "/data/a", True),
        ("/data/**", "/data/a/b/c", True),
        ("/data/**", "/database", False),
        ("/data/**", "/data/../etc/shadow", False),
        ("/data/**/x.py", "/data/x.py", True),  # /**/ is zero or more components
        ("/data/**/x.py", "/data/a/b/x.py", True),
        ("/data/**/x.py", "/data/a/b/y.py", False),
        ("/data/**.py", "/data/a/b.py", True),  # ** inside a component crosses /
        ("**", "/anything/at/all", True),
        ("*", "/etc", False),
        ("/data/?", "/data/a", True),
        ("/data/?", "/data/ab", False),
        ("/data?x", "/data/x", False),  # ? is not /
        ("/data[/]x", "/data/x", False),  # nor is a class
        ("/data[!a]x", "/data/x", False),  # nor a negated one
        ("/data/[a-c].txt", "/data/b.txt", True),
        ("/data/[a-c].txt", "/data/d.txt", False),
        ("/data/[!a-c].txt", "/data/d.txt", True),
        ("/data/[!a-c].txt", "/data/a.txt", False),
        ("/data/[]].txt", "/data/].txt", True),
        ("/data/[.txt", "/data/[.txt", True),  # an unclosed [ is literal
        ("/data/(x)+.txt", "/data/(x)+.txt", True),  # regex characters are literal
        ("/data/(x)+.txt", "/data/(x)(x).txt", False),
        ("/data/\\*", "/data/\\x", True),  # a backslash is a plain character, as in fnmatch
    ],
)
def test_path_patterns(pattern: str, value: str, expected: bool) -> None:
    assert glob_matches(pattern, "path", value) is expected


@pytest.mark.parametrize(
    ("name", "pattern", "value", "expected"),
    [
        ("argv", "git *", ["git", "status"], True),
        ("argv", "git *", ["git", "log", "--oneline"], True),  # * crosses spaces and /
        ("argv", "git *", ["gitx", "status"], False),
        ("argv", "git status", ["git", "status"], True),
        ("argv", "git status", ["git", "status", "-s"], False),
        ("argv", "/usr/bin/*", ["/usr/bin/env", "python3"], True),  # argv is not a path argument
        ("argv", "ls", "ls", True),  # a string given for argv is matched as written
        ("url", "https://example.com/*", "https://example.com/a/b", True),
        ("url", "https://example.com/*", "http://example.com/a", False),
        ("question", "*", "", True),
        ("count", "3", 3, True),  # non-strings are matched in their JSON form
        ("flag", "true", True, True),
        ("flag", "True", True, False),
        ("missing", "*", None, False),  # a missing argument never matches
        ("cwd", "/work/*", "/work/a/../../etc", False),  # cwd is a path argument
        ("cwd", "/work/*", "/work/a", True),
    ],
)
def test_other_arguments(name: str, pattern: str, value: object, expected: bool) -> None:
    assert glob_matches(pattern, name, value) is expected


@pytest.mark.parametrize(
    ("written", "normalised"),
    [
        ("/data/../etc/passwd", "/etc/passwd"),
        ("//etc//passwd", "/etc/passwd"),
        ("///etc", "/etc"),
        ("/a/./b/", "/a/b"),
        ("/..", "/"),
        ("/../../etc", "/etc"),
        ("a/../../x", "../x"),
        ("", ""),
    ],
)
def test_paths_are_normalised_lexically(written: str, normalised: str) -> None:
    assert normalize_path(written) == normalised


# ------------------------------------------------------------------- properties

_COMPONENT = st.sampled_from(["..", ".", "", "data", "etc", "passwd", "a", "b", ".env", "x*"])


@given(st.lists(_COMPONENT, max_size=8), st.sampled_from(["*", "**", "*/*", "a/**", "**/passwd", "?"]))
def test_a_normalised_path_never_matches_a_pattern_it_is_outside_of(parts: list[str], tail: str) -> None:
    path = "/" + "/".join(parts)
    for base in ("/data", "/data/a"):
        if glob_matches(f"{base}/{tail}", "path", path):
            norm = posixpath.normpath(path)
            norm = "/" + norm.lstrip("/")
            assert norm == base or norm.startswith(base + "/"), (path, norm, base, tail)


@given(
    st.lists(_COMPONENT, min_size=1, max_size=8),
    st.lists(st.sampled_from(["*", "?", "a", "[ab]", "d*"]), min_size=1, max_size=4),
)
def test_single_star_patterns_match_component_by_component(
    parts: list[str], pattern_parts: list[str]
) -> None:
    """Without ``**`` a path pattern is exactly fnmatch applied to each component."""
    pattern = "/" + "/".join(pattern_parts)
    norm = normalize_path("/" + "/".join(parts))
    components = [p for p in norm.split("/") if p]
    expected = len(components) == len(pattern_parts) and all(
        fnmatch.fnmatchcase(c, p) for c, p in zip(components, pattern_parts, strict=True)
    )
    assert glob_matches(pattern, "path", "/" + "/".join(parts)) is expected


@given(st.text(alphabet="ab*?[]!-/\\^.", max_size=10), st.text(alphabet="ab*?[]!-/\\^.", max_size=10))
def test_non_path_patterns_agree_with_fnmatch(pattern: str, value: str) -> None:
    assert (compile_glob(pattern, path=False).fullmatch(value) is not None) is fnmatch.fnmatchcase(
        value, pattern
    )


@given(st.text(alphabet="ab*?[]!-/.", max_size=10), st.text(alphabet="ab/.", max_size=12))
def test_path_patterns_without_doublestar_never_cross_a_slash(pattern: str, value: str) -> None:
    assume("**" not in pattern)
    if compile_glob(pattern, path=True).fullmatch(value):
        assert value.count("/") == pattern.replace("[/]", "").count("/") or "[" in pattern


# -------------------------------------------------------------------- decisions


def test_first_matching_rule_wins_and_names_itself() -> None:
    rules = Rules(
        (
            rule("no-secrets", "fs.read", "deny", path="/data/secret/**"),
            rule("docs", "fs.read", "allow", path="/data/**"),
            rule("shell", "exec", "ask", argv="sh *"),
        )
    )
    assert rules.decide("fs.read", {"path": "/data/secret/key"}) == Decision(
        "deny", "no-secrets", "fs.read denied by tools rule 'no-secrets'"
    )
    allowed = rules.decide("fs.read", {"path": "/data/readme"})
    assert (allowed.verdict, allowed.rule) == ("allow", "docs")
    assert "docs" in allowed.reason
    asked = rules.decide("exec", {"argv": ["sh", "-c", "ls"]})
    assert (asked.verdict, asked.rule) == ("ask", "shell")
    # .. does not lead from an allowed tree into a denied one, nor around the deny rule
    sneaky = rules.decide("fs.read", {"path": "/data/x/../secret/key"})
    assert (sneaky.verdict, sneaky.rule) == ("deny", "no-secrets")


def test_a_rule_without_match_matches_every_call_of_its_intent() -> None:
    rules = Rules((rule("ask-anything", "ask", "allow"),))
    assert rules.decide("ask", {"question": "why?"}).verdict == "allow"
    assert rules.decide("ask", {}).verdict == "allow"
    assert rules.decide("fs.read", {"path": "/x"}).verdict == "deny"


def test_every_named_argument_must_match() -> None:
    rules = Rules((rule("w", "fs.write", "allow", path="/out/*", mode="create"),))
    assert rules.decide("fs.write", {"path": "/out/a", "mode": "create"}).verdict == "allow"
    assert rules.decide("fs.write", {"path": "/out/a", "mode": "overwrite"}).verdict == "deny"
    assert rules.decide("fs.write", {"path": "/out/a"}).verdict == "deny"  # missing: no match


@pytest.mark.parametrize(
    ("intent", "args", "reason"),
    [
        (
            "fs.read",
            {"path": "/x"},
            "no tools rule allows fs.read of '/x'; add {id: allow-fs-read, intent: fs.read, verdict: allow, "
            "match: {path: '/x'}}",
        ),
        (
            "fs.list",
            {"path": "/a/../b/"},
            "no tools rule allows fs.list of '/b'; add {id: allow-fs-list, intent: fs.list, verdict: allow, "
            "match: {path: '/b'}}",
        ),
        (
            "fs.read",
            {"path": "/d/it's*"},
            "no tools rule allows fs.read of '/d/it''s[*]'; add {id: allow-fs-read, intent: fs.read, "
            "verdict: allow, match: {path: '/d/it''s[*]'}}",
        ),
        (
            "exec",
            {"argv": ["git", "status"]},
            "no tools rule allows exec of 'git status'; add {id: allow-exec, intent: exec, verdict: allow, "
            "match: {argv: 'git status'}}",
        ),
        (
            "ask",
            {"question": "?"},
            "no tools rule allows ask; add {id: allow-ask, intent: ask, verdict: allow}",
        ),
        (
            "fs.read",
            {},
            "no tools rule allows fs.read; add {id: allow-fs-read, intent: fs.read, verdict: allow}",
        ),
    ],
)
def test_no_match_is_a_denial_that_names_the_rule_to_add(
    intent: str, args: dict[str, object], reason: str
) -> None:
    decision = Rules(()).decide(intent, args)
    assert decision == Decision("deny", None, reason)


def test_the_suggested_rule_allows_exactly_that_call() -> None:
    import yaml

    for path in ("/d/it's*", "/d/[x]?", "/plain"):
        reason = Rules(()).decide("fs.read", {"path": path}).reason
        suggested = yaml.safe_load(reason.split("; add ", 1)[1])
        rules = Rules((rule(suggested["id"], "fs.read", "allow", path=suggested["match"]["path"]),))
        assert rules.decide("fs.read", {"path": path}).verdict == "allow"
        assert rules.decide("fs.read", {"path": path + "x"}).verdict == "deny"


def test_rules_for_other_intents_are_skipped() -> None:
    rules = Rules((rule("r", "fs.read", "allow"),))
    decision = rules.decide("fs.write", {"path": "/x", "content": "", "mode": "create"})
    assert decision.verdict == "deny" and decision.rule is None
    assert len(rules) == 1 and "r" in repr(rules)


@given(st.lists(st.sampled_from(["allow", "deny", "ask"]), min_size=1, max_size=6), st.text(max_size=20))
def test_decision_is_always_the_first_matching_rules(verdicts: list[str], question: str) -> None:
    rules = Rules(tuple(rule(f"r{i}", "ask", v) for i, v in enumerate(verdicts)))
    decision = rules.decide("ask", {"question": question})
    assert decision.rule == "r0" and decision.verdict == verdicts[0]
