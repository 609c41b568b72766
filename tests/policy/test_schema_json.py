"""The JSON Schema for editors, and what loading ``stockade.policy`` costs."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from stockade.policy import policy_json_schema
from stockade.policy._agentos import AGENTOS_KEYS
from stockade.policy._schema import (
    DURATION_PATTERN,
    SIZE_PATTERN,
    STOCKADE_KEYS,
    parse_duration,
    parse_size,
)


def test_schema_describes_every_key_and_nothing_else() -> None:
    schema = policy_json_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["title"] == "stockade policy"
    assert set(schema["properties"]) == set(STOCKADE_KEYS)
    assert schema["required"] == ["name"]
    assert schema["additionalProperties"] is False
    for name, section in schema["$defs"].items():
        if section.get("type") == "object" and "properties" in section:
            assert section["additionalProperties"] is False, name
    json.dumps(schema)  # plain JSON


def test_schema_shows_both_forms_of_a_network_entry_and_of_command() -> None:
    schema = policy_json_schema()
    allow = schema["$defs"]["NetworkSection"]["properties"]["allow"]["items"]
    assert {"type": "string", "description": "host[:port]; the port defaults to 443"} in allow["anyOf"]
    assert {"$ref": "#/$defs/HostRuleSection"} in allow["anyOf"]
    command = schema["properties"]["command"]
    assert "string" in json.dumps(command) and "array" in json.dumps(command)


def test_schema_limits_show_the_real_defaults() -> None:
    limits = policy_json_schema()["$defs"]["LimitsSection"]["properties"]
    assert limits["memory"]["default"] == "2G"
    assert limits["pids"]["default"] == 512
    assert limits["timeout"]["default"] == "1h"
    assert limits["output"]["default"] == "64M"
    assert limits["cpu"]["default"] == "unlimited"


def test_schema_intents_and_verdicts() -> None:
    tool = policy_json_schema()["$defs"]["ToolRuleSection"]["properties"]
    assert tool["verdict"]["enum"] == ["allow", "deny", "ask"]
    assert "agent.recv" in tool["intent"]["enum"]


def test_agentos_schema() -> None:
    schema = policy_json_schema(agentos=True)
    assert schema["title"] == "AgentOS manifest"
    assert list(schema["properties"]) == list(AGENTOS_KEYS)


@given(st.text(alphabet="0123456789.kKmMgGtTpPiIbBytes ", max_size=12))
def test_size_pattern_is_never_looser_than_the_parser(text: str) -> None:
    if re.search(SIZE_PATTERN, text):
        parse_size(text)  # must not raise


@given(st.text(alphabet="0123456789.nsuµmhd ", max_size=14))
def test_duration_pattern_is_never_looser_than_the_parser(text: str) -> None:
    # The pattern is the syntax; the parser also caps the value (366d), which
    # a pattern cannot say: only that refusal may come from a match.
    if re.search(DURATION_PATTERN, text):
        try:
            parse_duration(text)
        except ValueError as error:
            assert "is longer than" in str(error)


def test_importing_the_policy_package_stays_cheap() -> None:
    # ``stockade exec`` without --policy must not pay for pydantic or YAML.
    code = (
        "import sys, stockade.policy\n"
        "from stockade.policy import default_policy, Policy\n"
        "default_policy()\n"
        "print(sorted(m for m in ('pydantic', 'yaml', 'pydantic_core') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_host_matcher_needs_no_pydantic() -> None:
    # The gateway matches hosts on every request; it should not need the loader.
    code = (
        "import sys\n"
        "from stockade.policy._match import host_rule_matches\n"
        "from stockade.policy._model import HostRule\n"
        "assert host_rule_matches(HostRule('*.example.com'), 'a.example.com', 443)\n"
        "print('pydantic' in sys.modules, 'yaml' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"
