"""Every error message of the policy loader, each with its file:line:col.

One table row per message: a YAML snippet, where the error must point
(``line:col``) and a fragment of the message. Every message must also read as
house style asks: one sentence, the problem, then the fix after a ';'.
"""

from __future__ import annotations

import errno
import textwrap
from pathlib import Path
from typing import Any

import pytest

from stockade.errors import PolicyError
from stockade.policy._load import load_policy, loads_policy
from stockade.policy._locate import problem_of as _problem
from stockade.policy._schema import PolicyFile

LAUGHS = (
    "name: a\na: &a [1,1,1,1,1,1,1,1,1,1]\n"
    + "".join(f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n" for p, c in zip("abcd", "bcde", strict=True))
    + "f: [*e, *e]\n"
)

# (id, yaml, "line:col", fragment)
CASES: list[tuple[str, str, str, str]] = [
    # --- the file as YAML
    (
        "empty",
        "",
        "1:1",
        "the file is empty; a policy needs at least a line such as 'name: my-agent'",
    ),
    ("comments-only", "# nothing here\n", "1:1", "the file is empty"),
    (
        "denials-zero",
        "name: x\nlimits:\n  denials: 0\n",
        "3:12",
        "0 is less than 1; write a number of denials",
    ),
    ("denials-text", "name: x\nlimits:\n  denials: '5'\n", "3:12", "'5' is text, not a number"),
    ("denials-word", "name: x\nlimits:\n  denials: many\n", "3:12", "'many' is not a whole number"),
    (
        "llm-key-passed",
        "name: x\nenv:\n  pass: [HOME, OPENAI_KEY]\nllm:\n  provider: openai\n  api_key_env: OPENAI_KEY\n",
        "3:16",
        "'OPENAI_KEY' is the LLM key named in llm.api_key_env, and a secret never enters a cell",
    ),
    ("top-list", "- a\n", "1:1", "the top level is a list, but a policy is a mapping of keys"),
    ("top-scalar", "hello\n", "1:1", "the top level is the value 'hello'"),
    ("yaml-syntax", "name: x: y\n", "1:8", "not valid YAML: mapping values are not allowed here"),
    ("yaml-unclosed", "name: [x\n", "2:1", "expected ',' or ']'"),
    ("yaml-tab", "name: a\nfilesystem:\n\tread: []\n", "3:1", "indent with spaces, not tabs"),
    (
        "yaml-undefined-alias",
        "name: *nope\n",
        "1:7",
        "found undefined alias 'nope'; define the anchor",
    ),
    ("two-documents", "name: a\n---\nname: b\n", "2:1", "more than one YAML document ('---')"),
    ("nul-character", "name: a\x00\n", "1:8", "the character #x0000 is not allowed in YAML"),
    (
        "deep-nesting",
        "name: a\ncommand: " + "[" * 5000 + "]" * 5000 + "\n",
        "1:1",
        "nested too deeply",
    ),
    (
        "alias-loop",
        "name: a\ncommand: &a [*a]\n",
        "2:10",
        "an alias refers to a node that contains it",
    ),
    ("alias-bomb", LAUGHS, "2:24", "expands to more than 100000 values"),
    ("yaml-tag", "name: !Ref x\n", "1:7", "the YAML tag '!Ref' is not supported in a policy"),
    ("merge-scalar", "name: a\nlimits:\n  <<: 5\n", "3:7", "'<<' merges only mappings"),
    (
        "duplicate-key",
        "name: a\nmode: audit\nname: b\n",
        "3:1",
        "name appears twice, at lines 1 and 3",
    ),
    (
        "duplicate-nested-key",
        "name: a\nlimits:\n  pids: 1\n  pids: 2\n",
        "4:3",
        "limits.pids appears twice, at lines 3 and 4; keep one of them",
    ),
    (
        "key-not-text",
        "name: a\n? [a]\n: b\n",
        "2:3",
        "the top level has a key that is a list or a mapping",
    ),
    ("key-empty", "name: a\nenv:\n  '': b\n", "3:3", "env has a key that is empty"),
    (
        "formats-mixed",
        "name: a\nallowed_paths: [/x]\nfilesystem: {}\n",
        "2:1",
        "allowed_paths is a key of AgentOS manifests, but this file also has the stockade key "
        "'filesystem' (line 3); write it as filesystem.write, so that the whole file is in "
        "stockade's format",
    ),
    # --- ${VAR}
    (
        "var-unset",
        "name: a\ncommand: echo ${NOPE}\n",
        "2:15",
        "command 'echo ${NOPE}' uses the variable NOPE, which is not set; set it, "
        "give a default as '${NOPE:-value}'",
    ),
    (
        "var-unset-quoted",
        'name: a\nworkspace: "/w/${NOPE}"\n',
        "2:16",
        "the variable NOPE, which is not set",
    ),
    (
        "var-unterminated",
        "name: a\ncommand: echo ${NOPE\n",
        "2:15",
        "has a '${' with no closing '}'",
    ),
    (
        "var-bad-name",
        "name: a\ncommand: echo ${1X}\n",
        "2:15",
        "'${1X}', which does not name a variable",
    ),
    # --- shapes and types (pydantic, mapped back)
    ("missing-name", "mode: audit\n", "1:1", "name is missing; add it, as in 'name: my-agent'"),
    (
        "missing-intent",
        "name: a\ntools:\n  - id: r\n    verdict: allow\n",
        "3:5",
        "tools[0].intent is missing; add it, as in 'intent: fs.read'",
    ),
    (
        "missing-host",
        "name: a\nnetwork:\n  allow:\n    - ports: [443]\n",
        "4:7",
        "network.allow[0].host is missing; add it, as in 'host: api.example.com'",
    ),
    (
        "unknown-key-close",
        "name: a\nfilesytem: {}\n",
        "2:1",
        "filesytem is not a known key; did you mean 'filesystem'? (valid keys: name, description,",
    ),
    (
        "unknown-nested-key",
        "name: a\nfilesystem:\n  wirte: [/data]\n",
        "3:3",
        "filesystem.wirte is not a known key; did you mean 'write'? "
        "(valid keys: base, read, write, deny, protect, mounts)",
    ),
    (
        "unknown-key-case",
        "name: a\nMode: audit\n",
        "2:1",
        "Mode is not a known key; did you mean 'mode'?",
    ),
    (
        "unknown-key-far",
        "name: a\nzzz: 1\n",
        "2:1",
        "zzz is not a known key; use one of name, description,",
    ),
    (
        "env-agentos-style",
        "name: a\nenv:\n  FOO: bar\n",
        "3:3",
        "env.FOO is not a key of env; to set the variable FOO, put it under env.set",
    ),
    ("text-null", "name:\nmode: audit\n", "1:6", "name is empty; give it a value"),
    (
        "var-unset-no-second-error",
        "name: a\nfilesystem: {read: ['${NOPE}/x']}\n",
        "2:21",
        "filesystem.read[0] '${NOPE}/x' uses the variable NOPE",
    ),
    ("text-list", "name: [a]\n", "1:7", "name must be text, not a list"),
    (
        "int-text",
        "name: a\nllm:\n  max_tokens: lots\n",
        "3:15",
        "'lots' is text, not a whole number",
    ),
    ("int-quoted", 'name: a\nllm:\n  max_tokens: "100"\n', "3:15", "write it without quotes: 100"),
    (
        "list-expected",
        "name: a\nfilesystem:\n  read: /usr\n",
        "3:9",
        "filesystem.read must be a list, not text",
    ),
    (
        "section-not-mapping",
        "name: a\nfilesystem: /usr\n",
        "2:13",
        "filesystem must be a mapping, not text; write its keys (such as 'base', 'read', 'write') "
        "on the lines below, indented",
    ),
    (
        "dict-not-mapping",
        "name: a\nenv:\n  set: [A]\n",
        "3:8",
        "env.set must be a mapping, not a list; write its keys",
    ),
    (
        "literal-close",
        "name: a\nmode: enforcing\n",
        "2:7",
        "mode 'enforcing' is not one of 'enforce' or 'audit'; did you mean 'enforce'?",
    ),
    (
        "literal-far",
        "name: a\nmode: xyz\n",
        "2:7",
        "'xyz' is not one of 'enforce' or 'audit'; write one",
    ),
    (
        "ports-empty",
        "name: a\nnetwork:\n  allow:\n    - host: a.example.com\n      ports: []\n",
        "5:14",
        "network.allow[0].ports is empty; list at least one value",
    ),
    (
        "int-minimum",
        "name: a\nllm:\n  max_requests: 0\n",
        "3:17",
        "llm.max_requests 0 is less than 1; write 1",
    ),
    (
        "dict-key",
        "name: a\nenv:\n  set:\n    1X: v\n",
        "4:5",
        "env.set key '1X' is not a variable name",
    ),
    # --- what only makes sense as a whole
    (
        "workspace-system",
        "name: a\nworkspace: /usr\n",
        "2:12",
        "workspace '/usr' is a system directory",
    ),
    ("workspace-root", "name: a\nworkspace: /\n", "2:12", "'/' is a system directory"),
    ("workspace-proc", "name: a\nworkspace: /proc/1\n", "2:12", "'/proc/1' is a system directory"),
    (
        "read-and-write",
        "name: a\nfilesystem:\n  read: [/data]\n  write: [/data]\n",
        "3:10",
        "filesystem.read[0] '/data' is also in filesystem.write, which lets it be read too",
    ),
    (
        "read-secret",
        "name: a\nfilesystem:\n  read: [/etc/ssh/ssh_config]\n",
        "3:10",
        "'/etc/ssh/ssh_config' is inside '/etc/ssh', one of the secrets that base: system hides, "
        "so it would stay hidden; remove it, or set filesystem.base: none",
    ),
    (
        "write-denied",
        "name: a\nfilesystem:\n  base: none\n  deny: [/data/secret]\n  write: [/data/secret/x]\n",
        "5:11",
        "filesystem.write[0] '/data/secret/x' is inside '/data/secret', one of filesystem.deny",
    ),
    (
        "exec-unreadable",
        "name: a\nexec:\n  allow: [/opt/tool/bin/x]\n",
        "3:11",
        "exec.allow[0] '/opt/tool/bin/x' is outside every readable path, so it could not run",
    ),
    (
        "exec-hidden",
        "name: a\nexec:\n  allow: [/etc/ssh/x]\n",
        "3:11",
        "'/etc/ssh/x' is hidden by filesystem.deny",
    ),
    (
        "workdir-outside",
        "name: a\nworkdir: /srv/app\n",
        "2:10",
        "workdir '/srv/app' is outside the workspace",
    ),
    (
        "env-pass-and-set",
        "name: a\nenv:\n  pass: [HOME]\n  set:\n    HOME: /x\n",
        "5:5",
        "env.set.HOME 'HOME' is also in env.pass; keep it in one of them",
    ),
    (
        "tool-id-twice",
        "name: a\ntools:\n  - {id: r, intent: exec, verdict: ask}\n"
        "  - {id: r, intent: exec, verdict: deny}\n",
        "4:10",
        "tools[1].id 'r' is already the id of tools[0] (line 3); give each rule its own id",
    ),
    # --- limits and their units
    (
        "size-text",
        "name: a\nlimits: {memory: lots}\n",
        "2:18",
        "limits.memory 'lots' is not a size; write",
    ),
    ("size-bool", "name: a\nlimits: {output: yes}\n", "2:18", "limits.output true is not a size"),
    ("size-negative", "name: a\nlimits: {output: -1}\n", "2:18", "-1 is negative"),
    (
        "size-fraction",
        "name: a\nlimits: {output: 1.5}\n",
        "2:18",
        "1.5 is not a whole number of bytes",
    ),
    (
        "memory-tiny",
        "name: a\nlimits: {memory: 512}\n",
        "2:18",
        "512 is less than 1 MiB; write a unit, such as '512M'",
    ),
    (
        "duration-text",
        "name: a\nlimits: {timeout: soon}\n",
        "2:19",
        "'soon' is not a duration; write a number",
    ),
    ("duration-negative", "name: a\nlimits: {timeout: -5}\n", "2:19", "-5 is not a duration"),
    ("timeout-zero", "name: a\nlimits: {timeout: 0}\n", "2:19", "0 is less than a millisecond"),
    ("cpu-text", "name: a\nlimits: {cpu: half}\n", "2:15", "'half' is not a CPU amount"),
    ("cpu-zero", "name: a\nlimits: {cpu: 0}\n", "2:15", "0 is not more than zero"),
    (
        "pids-quoted",
        'name: a\nlimits: {pids: "512"}\n',
        "2:16",
        "'512' is text, not a number; write it without quotes: 512",
    ),
    ("pids-text", "name: a\nlimits: {pids: many}\n", "2:16", "'many' is not a whole number"),
    (
        "pids-huge",
        "name: a\nlimits: {pids: 99999999}\n",
        "2:16",
        "99999999 is more than the kernel's limit of 4194304 processes",
    ),
    ("pids-zero", "name: a\nlimits: {pids: 0}\n", "2:16", "0 is less than 1"),
    # --- paths
    ("path-empty", "name: a\nfilesystem: {read: ['']}\n", "2:21", "filesystem.read[0] '' is empty"),
    ("path-nul", 'name: a\nfilesystem: {read: ["/a\\0b"]}\n', "2:21", "contains a NUL byte"),
    (
        "path-control",
        'name: a\nfilesystem: {read: ["/a\\tb"]}\n',
        "2:21",
        "contains a control character",
    ),
    (
        "path-tilde",
        "name: a\nfilesystem: {read: [~/x]}\n",
        "2:21",
        "starts with '~', which stockade does not expand; write the absolute path, or '${HOME}/x'",
    ),
    (
        "path-relative",
        "name: a\nfilesystem: {read: [etc]}\n",
        "2:21",
        "'etc' is relative; write an absolute path",
    ),
    ("path-dotdot", "name: a\nfilesystem: {read: [/a/../b]}\n", "2:21", "contains '..'"),
    (
        "path-doublestar",
        "name: a\nfilesystem: {read: ['/srv/**']}\n",
        "2:21",
        "uses '**', which paths do not support; a directory stands for its whole tree, so write '/srv/'",
    ),
    (
        "path-doublestar-inner",
        "name: a\nfilesystem: {read: ['/srv/**/x.log']}\n",
        "2:21",
        "so write '/srv/'",
    ),
    (
        "path-long",
        "name: a\nfilesystem: {read: [/" + "a" * 5000 + "]}\n",
        "2:21",
        "longer than 4095 bytes",
    ),
    (
        "protect-workspace",
        "name: a\nfilesystem: {protect: [.]}\n",
        "2:24",
        "'.' names the workspace itself",
    ),
    (
        "workdir-glob",
        "name: a\nworkdir: /srv/*\n",
        "2:10",
        "'/srv/*' is a glob; name one directory",
    ),
    (
        "workspace-relative-string",
        "name: a\nworkspace: proj\n",
        "2:12",
        "'proj' is relative, and this policy was not read from a file",
    ),
    # --- small values
    ("name-invalid", "name: my agent\n", "1:7", "name 'my agent' is not a valid name"),
    ("env-name", "name: a\nenv: {pass: [1X]}\n", "2:14", "env.pass[0] '1X' is not a variable name"),
    (
        "env-value-nul",
        'name: a\nenv: {set: {A: "x\\0"}}\n',
        "2:16",
        "contains a NUL byte, which cannot be passed",
    ),
    (
        "tool-id",
        "name: a\ntools: [{id: 'a b', intent: exec, verdict: ask}]\n",
        "2:14",
        "'a b' is not a valid rule id",
    ),
    (
        "tool-arg-name",
        "name: a\ntools: [{id: a, intent: exec, verdict: ask, match: {'a b': x}}]\n",
        "2:53",
        "tools[0].match key 'a b' is not an argument name",
    ),
    (
        "method-close",
        "name: a\nnetwork: {allow: [{host: a.example.com, methods: [GTE]}]}\n",
        "2:51",
        "'GTE' is not an HTTP method; did you mean 'GET'?",
    ),
    (
        "method-far",
        "name: a\nnetwork: {allow: [{host: a.example.com, methods: [FROB]}]}\n",
        "2:51",
        "'FROB' is not an HTTP method; use one of GET, HEAD",
    ),
    (
        "urlpath-slash",
        "name: a\nnetwork: {allow: [{host: a.example.com, paths: [v1]}]}\n",
        "2:49",
        "does not start with '/'",
    ),
    (
        "urlpath-query",
        "name: a\nnetwork: {allow: [{host: a.example.com, paths: ['/v1?x=1']}]}\n",
        "2:49",
        "is not a plain URL path",
    ),
    (
        "urlpath-star",
        "name: a\nnetwork: {allow: [{host: a.example.com, paths: ['/v1/*']}]}\n",
        "2:49",
        "paths are prefixes already; write '/v1/'",
    ),
    (
        "port-text",
        "name: a\nnetwork: {allow: [{host: a.example.com, ports: ['443']}]}\n",
        "2:49",
        "network.allow[0].ports[0] '443' is not a port",
    ),
    (
        "port-range",
        "name: a\nnetwork: {allow: [{host: a.example.com, ports: [70000]}]}\n",
        "2:49",
        "70000 is not a port; write a number from 1 to 65535",
    ),
    (
        "loopback-port",
        "name: a\nnetwork: {loopback_ports: [0]}\n",
        "2:28",
        "network.loopback_ports[0] 0 is not a port",
    ),
    ("url-invalid", "name: a\nllm: {base_url: 'http://[x'}\n", "2:17", "is not a valid URL"),
    ("url-port", "name: a\nllm: {base_url: 'https://x:99999'}\n", "2:17", "is not a valid URL"),
    ("url-scheme", "name: a\nllm: {base_url: 'ftp://x'}\n", "2:17", "is not an http or https URL"),
    (
        "url-password",
        "name: a\nllm: {base_url: 'https://u:p@x'}\n",
        "2:17",
        "holds a user name or password",
    ),
    (
        "url-query",
        "name: a\nllm: {base_url: 'https://x/v1?a=b'}\n",
        "2:17",
        "has a query or fragment",
    ),
    (
        "command-empty-text",
        "name: a\ncommand: ''\n",
        "2:10",
        "'' is empty; write the program and its arguments",
    ),
    ("command-nul-text", 'name: a\ncommand: "a\\0"\n', "2:10", "contains a NUL byte"),
    ("command-empty-list", "name: a\ncommand: []\n", "2:10", "[] is empty; list the program"),
    (
        "command-empty-program",
        "name: a\ncommand: ['', x]\n",
        "2:10",
        "command '' is an empty program name; write the program first",
    ),
    ("command-nul-arg", 'name: a\ncommand: [a, "b\\0"]\n', "2:14", "command[1] 'b\\x00'"),
    (
        "host-bracket",
        "name: a\nnetwork: {allow: ['[2001:db8::1]x']}\n",
        "2:19",
        "is not 'host:port'",
    ),
    (
        "host-port-text",
        "name: a\nnetwork: {allow: ['a.example.com:https']}\n",
        "2:19",
        "has the port 'https', which is not a number",
    ),
    # --- host patterns
    ("host-empty", "name: a\nnetwork: {allow: ['']}\n", "2:19", "'' is empty; name a domain"),
    (
        "host-url",
        "name: a\nnetwork: {allow: ['https://api.example.com/v1']}\n",
        "2:19",
        "is a URL; write the host name alone, such as 'api.example.com'",
    ),
    (
        "host-slash",
        "name: a\nnetwork: {allow: [api.example.com/v1]}\n",
        "2:19",
        "holds a '/', which a host name cannot",
    ),
    (
        "host-colon",
        "name: a\nnetwork: {allow: [{host: 'a.example.com:443'}]}\n",
        "2:26",
        "a ':' belongs only in an IPv6 address",
    ),
    (
        "host-star",
        "name: a\nnetwork:\n  allow:\n  - api.example.com\n  - b.example.com\n  - '*'\n",
        "6:5",
        "network.allow[2].host '*' matches every host; name a domain such as '*.example.com'",
    ),
    (
        "host-inner-star",
        "name: a\nnetwork: {allow: ['a*.example.com']}\n",
        "2:19",
        "not the whole leftmost label",
    ),
    (
        "host-tld",
        "name: a\nnetwork: {allow: ['*.com']}\n",
        "2:19",
        "every name under the top-level domain 'com'",
    ),
    (
        "host-long",
        "name: a\nnetwork: {allow: [" + ("a" * 60 + ".") * 5 + "com]}\n",
        "2:19",
        "longer than 253 characters",
    ),
    (
        "host-empty-label",
        "name: a\nnetwork: {allow: [a..example.com]}\n",
        "2:19",
        "has an empty label",
    ),
    (
        "host-long-label",
        "name: a\nnetwork: {allow: [" + "a" * 64 + ".com]}\n",
        "2:19",
        "label longer than 63",
    ),
    (
        "host-chars",
        "name: a\nnetwork: {allow: [exa_mple.com]}\n",
        "2:19",
        "is not a valid host name",
    ),
    (
        "host-odd-ip",
        "name: a\nnetwork: {allow: ['127.1']}\n",
        "2:19",
        "'127.1' is not a valid IP address",
    ),
    (
        "host-decimal-ip",
        "name: a\nnetwork: {allow: ['2130706433']}\n",
        "2:19",
        "is not a valid IP address",
    ),
    ("host-localhost", "name: a\nnetwork: {allow: [localhost]}\n", "2:19", "names this machine"),
    (
        "host-idn",
        "name: a\nnetwork: {allow: ['\ufffd.example.com']}\n",
        "2:19",
        "write its 'xn--' form",
    ),
    ("net-everything", "name: a\nnetwork: {allow: [0.0.0.0/0]}\n", "2:19", "matches every address"),
    (
        "ip-loopback",
        "name: a\nnetwork: {allow: [127.0.0.1]}\n",
        "2:19",
        "'127.0.0.1' is a loopback address",
    ),
    ("ip-metadata", "name: a\nnetwork: {allow: [169.254.169.254]}\n", "2:19", "is link-local"),
    ("net-loopback", "name: a\nnetwork: {allow: [0.0.0.0/1]}\n", "2:19", "includes 127.0.0.0/8"),
    (
        "net-address",
        "name: a\nnetwork: {allow: [10.0.0/8]}\n",
        "2:19",
        "'10.0.0' is not an IP address",
    ),
    ("net-prefix", "name: a\nnetwork: {allow: [10.0.0.0/33]}\n", "2:19", "from 0 to 32 for IPv4"),
    (
        "net-mapped",
        "name: a\nnetwork: {allow: ['::ffff:10.0.0.0/64']}\n",
        "2:19",
        "beyond the IPv4-mapped range",
    ),
    (
        "net-host-bits",
        "name: a\nnetwork: {allow: [10.0.0.1/8]}\n",
        "2:19",
        "write the network as '10.0.0.0/8'",
    ),
    # --- AgentOS manifests
    (
        "agentos-cap-close",
        "name: a\nallowed_paths: []\nforbidden_caps: [CAP_SYS_ADIM]\n",
        "3:18",
        "forbidden_caps[0] 'CAP_SYS_ADIM' is not a capability name; did you mean 'CAP_SYS_ADMIN'?",
    ),
    (
        "agentos-cap-far",
        "name: a\nallowed_paths: []\nforbidden_caps: [NOPE]\n",
        "3:18",
        "see capabilities(7)",
    ),
    (
        "agentos-uid",
        "name: a\nallowed_paths: []\nuser: '99999999999'\n",
        "3:7",
        "is not a valid uid",
    ),
    (
        "agentos-user",
        "name: a\nallowed_paths: []\nuser: 'bad user'\n",
        "3:7",
        "is not a user name or uid",
    ),
    (
        "agentos-stdin",
        "name: a\nallowed_paths: []\nstdin: keep\n",
        "3:8",
        "'keep' is not a stdin mode",
    ),
    (
        "agentos-timeout",
        "name: a\nallowed_paths: []\ntimeout: soon\n",
        "3:10",
        "timeout 'soon' is not a duration",
    ),
    (
        "agentos-host-mapping",
        "name: a\nallowed_hosts: [{host: x}]\n",
        "2:17",
        "allowed_hosts[0] a mapping is not a host; write 'host[:port]'",
    ),
    (
        "agentos-host-pattern",
        "name: a\nallowed_hosts: ['*']\n",
        "2:17",
        "allowed_hosts[0] '*' matches every host",
    ),
    (
        "agentos-secret",
        "name: a\nallowed_paths: [/etc/ssh]\n",
        "2:17",
        "allowed_paths[0] '/etc/ssh' is inside '/etc/ssh', which stockade always hides as a secret",
    ),
    (
        "agentos-unknown",
        "name: a\nallowed_hosts: []\nallowed_pots: [/tmp/foo]\n",
        "3:1",
        "allowed_pots is not a known key; did you mean 'allowed_paths'?",
    ),
    # --- secrets: where a placeholder may stand
    (
        "secret-header-not-a-name",
        "name: a\nsecrets:\n  - name: K\n    env: K\n    hosts: [api.example.com]\n    headers: ['X Key']\n",
        "6:15",
        "secrets[0].headers[0] 'X Key' is not an HTTP header name; write a name of letters",
    ),
    (
        "secret-header-framing",
        "name: a\nsecrets:\n  - name: K\n    env: K\n    hosts: [api.example.com]\n"
        "    headers: [Authorization, Content-Length]\n",
        "6:30",
        "'Content-Length' is a header the gateway sets or drops itself",
    ),
    (
        "secret-headers-empty",
        "name: a\nsecrets:\n  - name: K\n    env: K\n    hosts: [api.example.com]\n    headers: []\n",
        "6:14",
        "secrets[0].headers",
    ),
    (
        "secret-body-not-bool",
        "name: a\nsecrets:\n  - name: K\n    env: K\n    hosts: [api.example.com]\n    body: 'yes'\n",
        "6:11",
        "secrets[0].body",
    ),
    (
        "llm-remote-images-not-bool",
        "name: a\nllm:\n  remote_images: 1\n",
        "3:18",
        "llm.remote_images",
    ),
]


def _error(text: str, *, source: str = "<string>") -> PolicyError:
    with pytest.raises(PolicyError) as info:
        loads_policy(text, source=source, environ={"HOME": "/home/me"})
    return info.value


@pytest.mark.parametrize(("text", "where", "fragment"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_error_is_located_and_says_the_fix(text: str, where: str, fragment: str) -> None:
    exc = _error(text)
    assert exc.location == f"<string>:{where}", exc
    assert fragment in exc.message, exc
    # House style: one sentence, the problem then the fix.
    assert "; " in exc.message
    assert not exc.message.endswith(".")
    assert str(exc) == f"{exc.location}: {exc.message}"


def test_case_ids_are_unique() -> None:
    ids = [c[0] for c in CASES]
    assert len(ids) == len(set(ids))


def test_the_documented_example_word_for_word() -> None:
    text = textwrap.dedent(
        """\
        name: a
        network:
          allow:
          - api.example.com
          - b.example.com
          - '*'
        """
    )
    exc = _error(text, source="policy.yaml")
    assert str(exc) == (
        "policy.yaml:6:5: network.allow[2].host '*' matches every host; name a domain such as '*.example.com'"
    )


def test_every_problem_is_reported_in_file_order() -> None:
    text = textwrap.dedent(
        """\
        name: a
        limits:
          pids: many
        mode: enforcing
        filesystem:
          wirte: []
        """
    )
    exc = _error(text)
    assert exc.location == "<string>:3:9"
    assert exc.__notes__ == [
        "<string>:4:7: mode 'enforcing' is not one of 'enforce' or 'audit'; did you mean 'enforce'?",
        "<string>:6:3: filesystem.wirte is not a known key; did you mean 'write'? "
        "(valid keys: base, read, write, deny, protect, mounts)",
    ]


def test_unset_variable_is_reported_with_the_other_problems() -> None:
    exc = _error("name: a\ncommand: ${NOPE}\nmode: x\n")
    assert "NOPE" in exc.message
    assert len(exc.__notes__) == 1 and "mode 'x'" in exc.__notes__[0]


def test_duplicate_keys_are_all_reported() -> None:
    exc = _error("name: a\nmode: audit\nmode: enforce\nname: b\n")
    assert exc.location == "<string>:3:1"
    assert exc.__notes__ == ["<string>:4:1: name appears twice, at lines 1 and 4; keep one of them"]


def test_an_unlisted_pydantic_error_still_reads_as_a_sentence() -> None:
    # A safety net for error types the table above cannot provoke.
    error: dict[str, Any] = {
        "type": "frob",
        "loc": ("name",),
        "msg": "Value error, odd",
        "input": "x",
    }
    problem = _problem(_Doc(), PolicyFile, error)
    assert problem.path == ("name",)
    assert problem.detail == "'x' is not valid: odd"


class _Doc:
    """The part of the loader's document that ``_problem`` reads."""

    raw: dict[Any, str] = {}  # noqa: RUF012 - read-only stand-in

    def shown(self, path: Any, value: object) -> str:
        return f"'{value}'"


# ------------------------------------------------------------------ reading a file


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError) as info:
        load_policy(tmp_path / "nope.yaml")
    assert info.value.location is None
    assert info.value.message == (
        f"cannot read the policy file '{tmp_path}/nope.yaml': it does not exist; check the path"
    )


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="it is a directory; name the policy file inside it"):
        load_policy(tmp_path)


def test_unreadable_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests run as root here, where chmod 000 does not stop a read: fake the refusal.
    from stockade.policy import _yaml

    def refuse(*args: object, **kwargs: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(_yaml, "open", refuse, raising=False)
    with pytest.raises(PolicyError, match="permission denied; make it readable by this user"):
        load_policy(tmp_path / "p.yaml")


def test_symlink_loop(tmp_path: Path) -> None:
    loop = tmp_path / "loop.yaml"
    loop.symlink_to(loop)
    with pytest.raises(PolicyError, match="Too many levels of symbolic links; check the path"):
        load_policy(loop)


def test_file_too_large(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("name: a\n" + "#" * (1024 * 1024) + "\n")
    with pytest.raises(PolicyError, match="is larger than 1 MiB"):
        load_policy(big)


def test_file_not_utf8(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"name: a\ncommand: caf\xe9\n")
    with pytest.raises(PolicyError) as info:
        load_policy(bad)
    assert info.value.location == f"{bad}:2:13"
    assert info.value.message == "byte 0xe9 is not UTF-8; save the file as UTF-8"


def test_location_names_the_file_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "policy.yaml").write_text("name: a\nmode: nope\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PolicyError) as info:
        load_policy("policy.yaml")
    assert info.value.location == "policy.yaml:2:7"
