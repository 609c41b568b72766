"""The Dockerfile parser: what it reads, and errors that name file:line."""

from __future__ import annotations

import pytest

from stockade.errors import ImageError
from stockade.image._base import choose_base
from stockade.image._dockerfile import key_values, parse_dockerfile, words


def test_directives_comments_continuations_and_forms() -> None:
    text = (
        "# syntax=docker/dockerfile:1\n"
        "# escape=`\n"
        "ARG SUITE=bookworm\n"
        "FROM debian:${SUITE}-slim\n"
        "# a comment\n"
        "run apt-get update && `\n"
        "    # a comment inside the continuation\n"
        "    apt-get install -y curl\n"
        'CMD ["python3", "-m", "http.server"]\n'
        "COPY --chown=1000:1000 --chmod=0644 a.txt /app/\n"
        "ENTRYPOINT [not json\n"
    )
    parsed = parse_dockerfile(text, source="ctx/Dockerfile")
    assert dict(parsed.directives) == {"syntax": "docker/dockerfile:1", "escape": "`"}
    kinds = [(i.keyword, i.line) for i in parsed.instructions]
    assert kinds == [("ARG", 3), ("FROM", 4), ("RUN", 6), ("CMD", 9), ("COPY", 10), ("ENTRYPOINT", 11)]
    run = parsed.instructions[2]
    assert run.rest == "apt-get update && apt-get install -y curl"
    assert run.exec_form is None
    assert parsed.instructions[3].exec_form == ("python3", "-m", "http.server")
    assert dict(parsed.instructions[4].flags) == {"chown": "1000:1000", "chmod": "0644"}
    # Not valid JSON: the shell form, as Docker reads it.
    assert parsed.instructions[5].exec_form is None


@pytest.mark.parametrize(
    ("text", "line", "said"),
    [
        ("FROM debian\nVOLUME /data\n", 2, "instruction VOLUME is not supported"),
        ("FROM debian\nRUN true\nFROBNICATE x\n", 3, "unknown instruction 'FROBNICATE'"),
        ("FROM debian AS a\nRUN true\nFROM debian\n", 3, "a second FROM starts a multi-stage build"),
        ("FROM debian\nCOPY --from=builder /a /b\n", 2, "COPY --from needs a multi-stage build"),
        ("FROM debian\nRUN --mount=type=cache,target=/x true\n", 2, "RUN --mount is not supported"),
        ("FROM debian\nADD https://example.com/x.tgz /x\n", 2, "fetches a URL"),
        ("FROM debian\nCOPY --owner=1 a b\n", 2, "COPY has no flag --owner"),
        ("FROM debian\nRUN <<EOF\n", 2, "here-document"),
        ("RUN true\nFROM debian\n", 1, "the first instruction is RUN, not FROM"),
        ("ARG X\nENV A=1\nFROM debian\n", 2, "ENV comes before FROM"),
        ('FROM debian\nSHELL ["/bin/bash", "-c"]\n', 2, "instruction SHELL is not supported"),
        ("FROM debian\nENV\n", 2, "ENV needs arguments"),
        ("# escape=x\nFROM debian\n", 1, "parser directive escape='x'"),
        ("# nothing\n\n", 1, "holds no instructions"),
    ],
)
def test_errors_name_file_and_line(text: str, line: int, said: str) -> None:
    with pytest.raises(ImageError) as info:
        parse_dockerfile(text, source="/ctx/Dockerfile")
    assert info.value.location == f"/ctx/Dockerfile:{line}"
    assert said in str(info.value)
    assert str(info.value).startswith(f"/ctx/Dockerfile:{line}: ")


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("a b  c", {}, ["a", "b", "c"]),
        ('"a b" c', {}, ["a b", "c"]),
        ("'$HOME' \"$HOME\" $HOME ${HOME}", {"HOME": "/root"}, ["$HOME", "/root", "/root", "/root"]),
        (
            "${UNSET:-dflt} ${HOME:-dflt} ${HOME:+set} ${UNSET:+set}x",
            {"HOME": "/h"},
            ["dflt", "/h", "set", "x"],
        ),
        (r"a\ b \$HOME", {"HOME": "/h"}, ["a b", "$HOME"]),
    ],
)
def test_words_quotes_and_substitution(text: str, env: dict[str, str], expected: list[str]) -> None:
    assert words(text, env) == expected


def test_env_and_label_pairs() -> None:
    assert key_values('A=1 B="two words" C=$A', {"A": "0"}, keyword="ENV", escape="\\", where="f:1") == [
        ("A", "1"), ("B", "two words"), ("C", "0"),
    ]  # fmt: skip
    assert key_values("OLD form with spaces", {}, keyword="ENV", escape="\\", where="f:1") == [
        ("OLD", "form with spaces")
    ]
    with pytest.raises(ImageError, match="is not NAME=VALUE"):
        key_values("justaword", {}, keyword="LABEL", escape="\\", where="f:1")


@pytest.mark.parametrize(
    ("ref", "suite", "approximate"),
    [
        ("debian:bookworm", "bookworm", False),
        ("debian:12-slim", "bookworm", False),
        ("debian:trixie-slim", "trixie", False),
        ("debian:13", "trixie", False),
        ("python:3.11-slim", "bookworm", False),
        ("python:3.13-slim-trixie", "trixie", False),
        ("python:3.12-slim", "trixie", True),
        ("python:3.11", "bookworm", True),
        ("ubuntu:22.04", "bookworm", True),
        ("ubuntu:24.04", "trixie", True),
        ("alpine:3.19", "bookworm", True),
    ],
)
def test_from_maps_to_a_debian_suite(ref: str, suite: str, approximate: bool) -> None:
    choice = choose_base(ref)
    assert (choice.suite, choice.approximate) == (suite, approximate)
    assert bool(choice.reason) == approximate
    if ref.startswith("python"):
        assert "python3" in choice.packages and choice.pip_anywhere


def test_a_pinned_digest_cannot_be_built_here() -> None:
    with pytest.raises(ImageError, match="pins a registry digest"):
        choose_base("debian@sha256:" + "0" * 64)
