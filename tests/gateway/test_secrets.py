"""Secrets: values read once, placeholders in the cell, values only toward their hosts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stockade.errors import PolicyError
from stockade.gateway._secrets import SecretMisuse, Secrets
from stockade.policy._model import SecretPolicy

ENV = {"GH": "ghp_abcdef0123456789", "OAI": "sk-proj-xyz", "LONG": "sk-proj-xyz-and-more"}


def load(*specs: SecretPolicy, environ: dict[str, str] | None = None) -> Secrets:
    return Secrets.load(specs, ENV if environ is None else environ)


def sub(secrets: Secrets, data: bytes, host: str) -> bytes:
    """``data`` as an Authorization header to ``host`` over TLS, placeholders put in place."""
    return secrets.put(data, host, "header", encrypted=True, header=b"authorization")


def test_values_from_env_and_file_and_placeholders(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("from-a-file\n")  # the newline an editor adds is not part of the value
    secrets = load(
        SecretPolicy("GITHUB_TOKEN", env="GH", hosts=("api.github.com",)),
        SecretPolicy("FILE_KEY", file=str(key_file), hosts=("example.com",)),
    )
    env = secrets.env()
    assert set(env) == {"GITHUB_TOKEN", "FILE_KEY"}
    for name, placeholder in env.items():
        assert re.fullmatch(rf"stockade-secret-{name}-[0-9a-f]{{32}}", placeholder)
    assert sub(secrets, env["GITHUB_TOKEN"].encode(), "api.github.com") == ENV["GH"].encode()
    assert sub(secrets, env["FILE_KEY"].encode(), "example.com") == b"from-a-file"
    # Random per run: another load gives other placeholders.
    again = load(SecretPolicy("FILE_KEY", file=str(key_file), hosts=("example.com",)))
    assert again.env()["FILE_KEY"] != env["FILE_KEY"]
    # A second newline is part of the value, and a value with a line break is refused.
    key_file.write_text("from-a-file\n\n")
    with pytest.raises(PolicyError, match="line break"):
        load(SecretPolicy("FILE_KEY", file=str(key_file), hosts=("example.com",)))


@pytest.mark.parametrize(
    ("spec", "environ", "message"),
    [
        (
            SecretPolicy("K", env="MISSING", hosts=("a.com",)),
            {},
            "K comes from the environment variable MISSING",
        ),
        (
            SecretPolicy("K", file="/nonexistent/key", hosts=("a.com",)),
            {},
            "K comes from the file /nonexistent/key",
        ),
        (SecretPolicy("K", env="E", hosts=("a.com",)), {"E": ""}, "K is empty in the environment variable E"),
        (SecretPolicy("K", env="E", hosts=("a.com",)), {"E": "a\r\nX-Evil: 1"}, "line break"),
        (SecretPolicy("K", env="E", hosts=("a.com",)), {"E": "tab\there"}, "control character"),
        (SecretPolicy("K", env="E"), {"E": "s3cr3t-value"}, "K lists no hosts"),
        (SecretPolicy("K", env="E", hosts=("*",)), {"E": "s3cr3t-value"}, "matches every host"),
        (
            SecretPolicy("K", env="E", file="/x", hosts=("a.com",)),
            {"E": "s3cr3t-value"},
            "exactly one of 'env' and 'file'",
        ),
        (SecretPolicy("not-a-name", env="E", hosts=("a.com",)), {"E": "s3cr3t-value"}, "is not valid"),
    ],
)
def test_load_errors_name_the_secret_and_the_fix(
    spec: SecretPolicy, environ: dict[str, str], message: str
) -> None:
    with pytest.raises(PolicyError) as info:
        Secrets.load([spec], environ)
    assert message in str(info.value)
    assert "secrets:" in str(info.value)
    for value in environ.values():
        if value:
            assert value not in str(info.value)  # never the value itself


def test_two_secrets_with_one_name_are_refused() -> None:
    spec = SecretPolicy("K", env="GH", hosts=("a.com",))
    with pytest.raises(PolicyError, match="listed twice"):
        load(spec, spec)


@pytest.mark.parametrize(
    ("patterns", "host", "meant"),
    [
        (("api.github.com",), "api.github.com", True),
        (("api.github.com",), "API.GitHub.com.", True),
        (("api.github.com",), "github.com", False),
        (("*.example.com",), "a.example.com", True),
        (("*.example.com",), "a.b.example.com", False),
        (("*.example.com",), "example.com", False),
        (("**.example.com",), "a.b.example.com", True),
        (("93.184.216.34",), "93.184.216.34", True),
        (("93.184.216.0/24",), "93.184.216.77", True),
        (("93.184.216.34",), "api.github.com", False),
        (("api.github.com",), "evil.example", False),
    ],
)
def test_for_host_uses_the_network_allow_grammar(patterns: tuple[str, ...], host: str, meant: bool) -> None:
    secrets = load(SecretPolicy("K", env="GH", hosts=patterns))
    assert secrets.for_host(host) is meant
    placeholder = secrets.env()["K"].encode()
    if meant:
        assert sub(secrets, b"Bearer " + placeholder, host) == b"Bearer " + ENV["GH"].encode()
    else:
        with pytest.raises(SecretMisuse) as info:
            sub(secrets, b"Bearer " + placeholder, host)
        assert info.value.names == ("K",)


def test_misuse_names_every_misplaced_secret_and_substitutes_nothing() -> None:
    secrets = load(
        SecretPolicy("GH_TOKEN", env="GH", hosts=("api.github.com",)),
        SecretPolicy("OAI_KEY", env="OAI", hosts=("api.openai.com",)),
    )
    env = secrets.env()
    data = f"a={env['GH_TOKEN']}&b={env['OAI_KEY']}&c={env['OAI_KEY']}".encode()
    with pytest.raises(SecretMisuse) as info:
        sub(secrets, data, "api.github.com")
    assert info.value.names == ("OAI_KEY",)
    assert "OAI_KEY" in str(info.value) and "api.github.com" in str(info.value)
    assert ENV["OAI"] not in str(info.value) and env["OAI_KEY"] not in str(info.value)
    # Toward a host neither is for: both named, in order of appearance.
    with pytest.raises(SecretMisuse) as info:
        sub(secrets, data, "evil.example")
    assert info.value.names == ("GH_TOKEN", "OAI_KEY")


def test_names_in_lists_each_secret_once_in_order() -> None:
    secrets = load(
        SecretPolicy("GH_TOKEN", env="GH", hosts=("api.github.com",)),
        SecretPolicy("OAI_KEY", env="OAI", hosts=("api.openai.com",)),
    )
    env = secrets.env()
    data = f"{env['OAI_KEY']} {env['GH_TOKEN']} {env['OAI_KEY']} stockade-secret-OTHER-{'0' * 32}".encode()
    assert secrets.names_in(data) == ("OAI_KEY", "GH_TOKEN")
    assert secrets.names_in(b"nothing here") == ()


def test_scrub_hides_values_and_placeholders() -> None:
    secrets = load(
        SecretPolicy("SHORT", env="OAI", hosts=("a.com",)),
        SecretPolicy("LONGER", env="LONG", hosts=("a.com",)),
    )
    env = secrets.env()
    text = f"got {ENV['LONG']} and {ENV['OAI']} and {env['SHORT']}"
    assert secrets.scrub(text) == "got [secret LONGER] and [secret SHORT] and [placeholder SHORT]"


def test_no_secrets_is_a_no_op() -> None:
    secrets = Secrets.load([], {})
    data = b"stockade-secret-X-" + b"0" * 32
    assert sub(secrets, data, "a.com") is data
    assert secrets.env() == {} and not secrets.for_host("a.com") and secrets.scrub("x") == "x"


@given(
    st.lists(
        st.sampled_from([b"a", b"sk-", b"proj", b"-xyz", b"sk-proj-xyz", b"sk-proj-xyz-and-more", b"\n"]),
        max_size=40,
    ),
    st.lists(st.integers(min_value=0, max_value=60), max_size=10),
)
def test_echo_filter_finds_values_across_chunks(parts: list[bytes], cuts: list[int]) -> None:
    secrets = load(
        SecretPolicy("SHORT", env="OAI", hosts=("a.com",)),
        SecretPolicy("LONGER", env="LONG", hosts=("a.com",)),
        SecretPolicy("ELSEWHERE", env="GH", hosts=("b.com",)),
    )
    env = secrets.env()
    data = b"".join(parts) + ENV["GH"].encode()
    # Every secret's value is hidden, whichever host answers (stored-and-read-back data).
    expected = (
        data.replace(ENV["LONG"].encode(), b"\0L")
        .replace(ENV["OAI"].encode(), env["SHORT"].encode())
        .replace(ENV["GH"].encode(), env["ELSEWHERE"].encode())
    ).replace(b"\0L", env["LONGER"].encode())
    echo = secrets.echo_filter()
    assert echo is not None
    out = b""
    start = 0
    for cut in sorted(c for c in cuts if c <= len(data)):
        out += echo.feed(data[start:cut])
        start = cut
    out += echo.feed(data[start:]) + echo.flush()
    assert out == expected
    assert Secrets.load([], {}).echo_filter() is None


@given(st.binary(max_size=300), st.text(max_size=200))
def test_substitution_and_scrub_properties(data: bytes, text: str) -> None:
    secrets = load(SecretPolicy("K", env="GH", hosts=("api.github.com",)))
    placeholder = secrets.env()["K"]
    # Data without a placeholder passes unchanged, whatever the host.
    if b"stockade-secret-" not in data:
        assert sub(secrets, data, "evil.example") == data
    # With the placeholder spliced in, the value reaches its host and nothing else does.
    spliced = data + placeholder.encode() + data
    assert sub(secrets, spliced, "api.github.com") == data + ENV["GH"].encode() + data
    # Scrubbed text never holds the value or the placeholder.
    scrubbed = secrets.scrub(text + ENV["GH"] + text + placeholder)
    assert ENV["GH"] not in scrubbed and placeholder not in scrubbed


# --------------------------------------------------------------------------- issue 11: forms and places


def _encodings(value: bytes) -> dict[str, bytes]:
    import base64
    import json
    import urllib.parse

    return {
        "raw": value,
        "upper": value.upper(),
        "b64": base64.b64encode(value),
        "b64-1": base64.b64encode(b"a" + value),
        "b64-2": base64.b64encode(b"ab" + value),
        "b64url": base64.urlsafe_b64encode(b"\xff" + value).rstrip(b"="),
        "hex": value.hex().encode(),
        "HEX": value.hex().upper().encode(),
        "url": urllib.parse.quote(value, safe="").encode(),
        "url-all": b"".join(b"%%%02x" % b for b in value),
        "url-twice": b"".join(b"%%25%02X" % b for b in value),
        "json": json.dumps({"k": value.decode()}).encode().replace(b"-", b"\\u002d"),
        "html": b"".join(b"&#x%x;" % b for b in value),
        "quoted-printable": b"".join(b"=%02X" % b for b in value),
    }


@pytest.mark.parametrize("form", list(_encodings(b"x")))
def test_values_are_found_and_scrubbed_in_every_form(form: str) -> None:
    secrets = load(SecretPolicy("GH", env="GH", hosts=("api.github.com",)))
    encoded = _encodings(ENV["GH"].encode())[form]
    data = b"before " + encoded + b" after"
    assert secrets.values_in(data) == ("GH",)
    # A base64 form's first and last characters depend on its neighbours too: what
    # is cut out is the part that holds the value.
    scrubbed = secrets.scrub(data.decode())
    assert "[secret GH]" in scrubbed and scrubbed.startswith("before ") and scrubbed.endswith(" after")
    assert secrets.values_in(scrubbed.encode()) == ()
    echo = secrets.echo_filter()
    assert echo is not None
    out = echo.feed(data) + echo.flush()
    assert secrets.env()["GH"].encode() in out and secrets.values_in(out) == ()
    with pytest.raises(SecretMisuse) as info:
        sub(secrets, data, "api.github.com")  # the agent never sends the value, even to its host
    assert info.value.kind == "value" and "GH" in str(info.value) and ENV["GH"] not in str(info.value)
    # Text that only resembles it is left alone.
    assert secrets.values_in(b"before " + encoded[: len(encoded) // 2] + b" after") == ()


def test_the_policy_says_which_headers_and_parts_a_placeholder_may_stand_in() -> None:
    secrets = load(
        SecretPolicy("GH", env="GH", hosts=("api.github.com",)),
        SecretPolicy("OAI", env="OAI", hosts=("api.openai.com",), headers=("X-Api-Key",), body=True),
    )
    gh, oai = secrets.env()["GH"].encode(), secrets.env()["OAI"].encode()

    def put(data: bytes, host: str, place: str, header: bytes = b"") -> bytes:
        return secrets.put(data, host, place, encrypted=True, header=header)  # type: ignore[arg-type]

    assert put(b"token " + gh, "api.github.com", "header", b"authorization") == b"token " + ENV["GH"].encode()
    assert put(oai, "api.openai.com", "header", b"x-api-key") == ENV["OAI"].encode()
    assert put(b'{"k": "' + oai + b'"}', "api.openai.com", "body") == b'{"k": "' + ENV["OAI"].encode() + b'"}'
    refused = [
        (gh, "api.github.com", "header", b"x-api-key", "in its header x-api-key"),
        (gh, "api.github.com", "body", b"", "secrets[].body: true"),
        (gh, "api.github.com", "url", b"", "secrets[].url: true"),
        (oai, "api.openai.com", "header", b"authorization", "X-Api-Key"),
        (oai, "api.github.com", "header", b"x-api-key", "not meant for api.github.com"),
    ]
    for data, host, place, header, words in refused:
        with pytest.raises(SecretMisuse) as info:
            put(data, host, place, header)
        assert words in str(info.value)
    with pytest.raises(SecretMisuse, match="unencrypted"):
        secrets.put(gh, "api.github.com", "header", encrypted=False, header=b"authorization")


def test_a_streamed_body_is_refused_at_a_value_cut_across_chunks() -> None:
    secrets = load(SecretPolicy("GH", env="GH", hosts=("api.github.com",)))
    scan = secrets.body_scan("evil.example")
    assert scan is not None
    data = b"x" * 5000 + ENV["GH"].encode().hex().encode() + b"y" * 100
    sent = b""
    with pytest.raises(SecretMisuse):
        for i in range(0, len(data), 5):
            sent += scan.feed(data[i : i + 5])
    assert _encodings(ENV["GH"].encode())["hex"][:8] not in sent  # not even a start of it went out
    clean = secrets.body_scan("evil.example")
    assert clean is not None
    out = b"".join(clean.feed(data[i : i + 5]) for i in range(0, 5000, 5)) + clean.flush()
    assert out == data[:5000]  # the control passes whole


@given(st.integers(min_value=1, max_value=97), st.sampled_from(["raw", "b64-1", "hex", "url-all", "json"]))
def test_echo_filter_finds_every_form_across_any_chunking(size: int, form: str) -> None:
    secrets = load(SecretPolicy("GH", env="GH", hosts=("api.github.com",)))
    data = b"head " * 30 + _encodings(ENV["GH"].encode())[form] + b" tail" * 30
    echo = secrets.echo_filter()
    assert echo is not None
    out = b"".join(echo.feed(data[i : i + size]) for i in range(0, len(data), size)) + echo.flush()
    assert secrets.values_in(out) == () and secrets.env()["GH"].encode() in out
    assert out.startswith(b"head " * 30) and out.endswith(b" tail" * 30)


def test_a_gzip_body_holding_a_value_is_cut_off_before_any_of_it_passes() -> None:
    import gzip

    from stockade.gateway._secrets import SecretInAnswer

    secrets = load(SecretPolicy("GH", env="GH", hosts=("api.github.com",)))
    zipped = gzip.compress(b"a" * 50000 + ENV["GH"].encode() + b"b" * 50000)
    echo = secrets.echo_filter()
    assert echo is not None
    passed = b""
    with pytest.raises(SecretInAnswer):
        for i in range(0, len(zipped), 64):
            passed += echo.feed(zipped[i : i + 64])
        passed += echo.flush()
    import zlib

    assert ENV["GH"].encode() not in zlib.decompressobj(16 + 15).decompress(passed)
    # The control: a gzip body without the value passes byte for byte.
    plain = gzip.compress(b"a" * 50000)
    echo = secrets.echo_filter()
    assert echo is not None
    assert b"".join(echo.feed(plain[i : i + 64]) for i in range(0, len(plain), 64)) + echo.flush() == plain


def test_a_compressed_request_body_holding_a_value_is_refused() -> None:
    import gzip
    import zlib

    secrets = load(SecretPolicy("GH", env="GH", hosts=("api.github.com",)))
    hidden = b"a" * 30000 + ENV["GH"].encode() + b"b" * 30000
    for packed in (gzip.compress(hidden), zlib.compress(hidden)):
        with pytest.raises(SecretMisuse, match="GH in its body, compressed"):
            secrets.put(packed, "evil.example", "body", encrypted=True)
        scan = secrets.body_scan("evil.example")
        assert scan is not None
        sent = b""
        with pytest.raises(SecretMisuse, match="compressed"):
            for i in range(0, len(packed), 50):
                sent += scan.feed(packed[i : i + 50])
            sent += scan.flush()
        assert ENV["GH"].encode() not in zlib.decompressobj(32 + 15).decompress(sent)
    # The control: compressed data without it goes, whole and as it is.
    plain = gzip.compress(b"a" * 60000)
    assert secrets.put(plain, "evil.example", "body", encrypted=True) == plain
    scan = secrets.body_scan("evil.example")
    assert scan is not None
    assert b"".join(scan.feed(plain[i : i + 50]) for i in range(0, len(plain), 50)) + scan.flush() == plain


def test_scrub_hides_the_start_of_a_value_a_cut_left() -> None:
    secrets = load(SecretPolicy("LONG", env="LONG", hosts=("a.com",)))
    value = ENV["LONG"]
    cut = f"'http://a.com/?k={value}'"[:30] + "' is not a proxy request"
    assert value[:10] in cut and value not in cut
    scrubbed = secrets.scrub(cut)
    assert value[:8] not in scrubbed and "[secret LONG, cut]" in scrubbed
    assert secrets.scrub("sk-proj is a word here") == "sk-proj is a word here"  # shorter than 8: kept
