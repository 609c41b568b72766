"""``check_subset``: a helper's policy may grant nothing its parent's does not.

Tables of one change each (narrower: accepted; wider: refused with a message
naming the field), then Hypothesis: every policy is a subset of itself,
narrowing any one field keeps it one, widening any one field is caught.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stockade.policy import (
    EnvPolicy,
    ExecPolicy,
    FilesystemPolicy,
    HostRule,
    Limits,
    LlmPolicy,
    NetworkPolicy,
    Policy,
    SecretPolicy,
    ToolRule,
    loads_policy,
)
from stockade.policy._subset import check_subset, host_covers

WS = "/work/ws"

PARENT = Policy(
    name="parent",
    mode="enforce",
    workspace=WS,
    filesystem=FilesystemPolicy(
        read=("/usr", "/etc", "/data/ro"),
        write=("/data",),
        deny=("/etc/shadow", "/data/secret"),
        protect=(".git/hooks", "/data/keep"),
    ),
    exec=ExecPolicy(allow=("/usr/bin",)),
    env=EnvPolicy(passthrough=("TERM", "LANG")),
    limits=Limits(memory=1 << 30, pids=100, cpu=1.0, timeout=600.0, output=1 << 20, denials=5),
    network=NetworkPolicy(
        allow=(
            HostRule("**.example.com", (443, 8443), ("GET", "POST"), ("/api/",)),
            HostRule("10.0.0.0/8", (443,)),
        ),
        loopback_ports=(8000, 8001),
    ),
    tools=(
        ToolRule("no-keys", "fs.read", "deny", (("path", "/data/keys/**"),)),
        ToolRule("read-data", "fs.read", "allow", (("path", "/data/**"),)),
        ToolRule("tests", "exec", "ask", (("argv", "pytest *"),)),
        ToolRule("helpers", "agent.spawn", "allow"),
    ),
    llm=LlmPolicy(
        provider="openai",
        base_url="http://llm.example/v1",
        model="m1",
        api_key_env="KEY",
        max_requests=100,
        max_tokens=1000,
    ),
    secrets=(SecretPolicy("TOK", env="TOK", hosts=("api.example.com", "*.example.com")),),
    source=f"{WS}/policy.yaml",
)

Change = Callable[[Policy], Policy]


def _fs(**kw: tuple[str, ...]) -> Change:
    return lambda p: dataclasses.replace(p, filesystem=dataclasses.replace(p.filesystem, **kw))


def _net(**kw: object) -> Change:
    return lambda p: dataclasses.replace(p, network=dataclasses.replace(p.network, **kw))


def _limit(**kw: float | None) -> Change:
    return lambda p: dataclasses.replace(p, limits=dataclasses.replace(p.limits, **kw))


def _llm(**kw: object) -> Change:
    def change(p: Policy) -> Policy:
        assert p.llm is not None
        return dataclasses.replace(p, llm=dataclasses.replace(p.llm, **kw))

    return change


def _tools(*rules: ToolRule) -> Change:
    return lambda p: dataclasses.replace(p, tools=rules)


def _allow(
    host: str,
    ports: tuple[int, ...] = (443,),
    methods: tuple[str, ...] = ("GET",),
    paths: tuple[str, ...] = ("/api/v1",),
) -> Change:
    return _net(allow=(HostRule(host, ports, methods, paths),))


def _check(change: Change, workspace: str = WS) -> list[str]:
    return check_subset(change(PARENT), PARENT, parent_workspace=WS, child_workspace=workspace)


NARROWER: dict[str, Change] = {
    "read fewer": _fs(read=("/usr/lib", "/etc", "/data/ro")),
    "write inside": _fs(read=("/usr", "/etc"), write=("/data/sub",)),
    "deny more": _fs(deny=("/etc/shadow", "/data/secret", "/data/more")),
    "deny a parent's denied path's parent": _fs(deny=("/etc/shadow", "/data")),
    "protect more": _fs(protect=(".git", "/data/keep", "/data/other")),
    "exec one program": lambda p: dataclasses.replace(p, exec=ExecPolicy(allow=("/usr/bin/python3",))),
    "env fewer": lambda p: dataclasses.replace(p, env=EnvPolicy(passthrough=("TERM",))),
    "one name": _allow("api.example.com"),
    "one label": _allow("*.x.example.com", ports=(8443,), methods=("POST",), paths=("/api/x/",)),
    "many labels deeper": _allow("**.deep.example.com"),
    "an address in the network": _net(allow=(HostRule("10.1.2.3", (443,)),)),
    "a smaller network": _net(allow=(HostRule("10.1.0.0/16", (443,)),)),
    "no network": _net(allow=(), loopback_ports=(8000,)),
    "smaller limits": _limit(memory=1 << 20, pids=1, cpu=0.5, timeout=1.0, output=1, denials=1),
    "no llm": lambda p: dataclasses.replace(p, llm=None),
    "smaller llm budget": _llm(max_requests=1, max_tokens=10, api_key_env=None),
    "fewer secret hosts": lambda p: dataclasses.replace(
        p, secrets=(SecretPolicy("TOK", env="TOK", hosts=("api.example.com",)),)
    ),
    "no secrets": lambda p: dataclasses.replace(p, secrets=()),
    "a deny rule anywhere": _tools(ToolRule("x", "exec", "deny")),
    "allow below the parent's allow": _tools(
        ToolRule("docs", "fs.read", "allow", (("path", "/data/docs/**"),))
    ),
    "allow one file": _tools(ToolRule("one", "fs.read", "allow", (("path", "/data/docs/a.md"),))),
    "ask where the parent asks": _tools(ToolRule("t", "exec", "ask", (("argv", "pytest -q *"),))),
    "ask where the parent allows": _tools(ToolRule("s", "agent.spawn", "ask")),
    "no tools": _tools(),
}


@pytest.mark.parametrize("change", NARROWER.values(), ids=NARROWER.keys())
def test_narrower_is_a_subset(change: Change) -> None:
    assert _check(change) == []


def test_a_workspace_inside_the_parents_writable_paths_is_a_subset() -> None:
    assert _check(lambda p: p, workspace="/data/helper") == []
    assert _check(lambda p: p, workspace=f"{WS}/sub") == []


WIDER: dict[str, tuple[Change, str]] = {
    "audit": (lambda p: dataclasses.replace(p, mode="audit"), "mode 'audit'"),
    "read outside": (_fs(read=("/usr", "/etc", "/data/ro", "/opt")), "filesystem.read '/opt'"),
    "write outside": (_fs(write=("/data", "/srv")), "filesystem.write '/srv' is not within"),
    "write a read-only path": (_fs(write=("/data", "/usr/local")), "filesystem.write '/usr/local'"),
    "write the parent's read-only subtree": (_fs(write=("/data", "/data/ro/x")), "'/data/ro/x'"),
    "unhide the read-only subtree": (_fs(read=("/usr", "/etc")), "makes '/data/ro' writable"),
    "undeny": (_fs(deny=("/etc/shadow",)), "filesystem.deny does not hide '/data/secret'"),
    "undeny a system secret": (_fs(deny=("/data/secret",)), "does not hide '/etc/shadow'"),
    "unprotect": (_fs(protect=(".git/hooks",)), "filesystem.protect lacks '/data/keep'"),
    "unprotect relative": (
        _fs(protect=("/data/keep",)),
        "filesystem.protect lacks '.git/hooks' at '/work/ws/.git/hooks'",
    ),
    "any program": (lambda p: dataclasses.replace(p, exec=ExecPolicy()), "exec.allow is empty"),
    "another program": (
        lambda p: dataclasses.replace(p, exec=ExecPolicy(allow=("/bin/sh",))),
        "exec.allow '/bin/sh'",
    ),
    "env more": (lambda p: dataclasses.replace(p, env=EnvPolicy(passthrough=("HOME",))), "env.pass 'HOME'"),
    "another domain": (_allow("api.example.org"), "network.allow 'api.example.org"),
    "the bare domain": (_allow("example.com"), "network.allow 'example.com"),
    "another port": (_allow("api.example.com", ports=(80,)), "network.allow 'api.example.com ports 80"),
    "another method": (_allow("api.example.com", methods=("DELETE",)), "methods DELETE"),
    "any method": (_allow("api.example.com", methods=()), "network.allow 'api.example.com ports 443 paths"),
    "another path": (_allow("api.example.com", paths=("/admin",)), "paths /admin"),
    "a path just past a prefix": (_allow("api.example.com", paths=("/api",)), "paths /api'"),
    "any path": (
        _allow("api.example.com", paths=()),
        "network.allow 'api.example.com ports 443 methods GET'",
    ),
    "a larger network": (_net(allow=(HostRule("10.0.0.0/7", (443,)),)), "network.allow '10.0.0.0/7"),
    "an address outside": (_net(allow=(HostRule("11.0.0.1", (443,)),)), "network.allow '11.0.0.1"),
    "a name for an address rule": (_net(allow=(HostRule("ten.example.net", (443,)),)), "ten.example.net"),
    "loopback port": (_net(loopback_ports=(9000,)), "network.loopback_ports 9000"),
    "plain http": (_net(fetch_plain_http=True), "network.fetch_plain_http"),
    "memory": (_limit(memory=2 << 30), "limits.memory"),
    "no memory limit": (_limit(memory=None), "limits.memory unlimited"),
    "pids": (_limit(pids=101), "limits.pids 101"),
    "cpu": (_limit(cpu=None), "limits.cpu unlimited"),
    "timeout": (_limit(timeout=601.0), "limits.timeout 601"),
    "output": (_limit(output=None), "limits.output"),
    "denials": (_limit(denials=6), "limits.denials 6"),
    "llm provider": (_llm(provider="anthropic"), "llm.provider 'anthropic'"),
    "llm url": (_llm(base_url="http://evil.example/v1"), "llm.base_url"),
    "llm model": (_llm(model="m2"), "llm.model 'm2'"),
    "llm any model": (_llm(model=None), "llm.model None"),
    "llm key": (_llm(api_key_env="OTHER_KEY"), "llm.api_key_env 'OTHER_KEY'"),
    "llm requests": (_llm(max_requests=None), "llm.max_requests unlimited"),
    "llm tokens": (_llm(max_tokens=1001), "llm.max_tokens 1001"),
    "a new secret": (
        lambda p: dataclasses.replace(
            p, secrets=(SecretPolicy("AWS", env="AWS", hosts=("api.example.com",)),)
        ),
        "secrets 'AWS'",
    ),
    "a secret from elsewhere": (
        lambda p: dataclasses.replace(
            p, secrets=(SecretPolicy("TOK", env="OTHER", hosts=("api.example.com",)),)
        ),
        "secrets 'TOK' is not one of the parent's",
    ),
    "a secret to another host": (
        lambda p: dataclasses.replace(
            p, secrets=(SecretPolicy("TOK", env="TOK", hosts=("evil.example.net",)),)
        ),
        "'evil.example.net'",
    ),
    "a secret in another header": (
        lambda p: dataclasses.replace(
            p, secrets=(SecretPolicy("TOK", env="TOK", hosts=("api.example.com",), headers=("X-Key",)),)
        ),
        "may stand in the header 'X-Key'",
    ),
    "a secret in the body": (
        lambda p: dataclasses.replace(
            p, secrets=(SecretPolicy("TOK", env="TOK", hosts=("api.example.com",), body=True),)
        ),
        "remove body: true",
    ),
    "a secret in the url": (
        lambda p: dataclasses.replace(
            p, secrets=(SecretPolicy("TOK", env="TOK", hosts=("api.example.com",), url=True),)
        ),
        "remove url: true",
    ),
    "llm remote images": (_llm(remote_images=True), "llm.remote_images"),
    "allow where the parent asks": (
        _tools(ToolRule("t", "exec", "allow", (("argv", "pytest *"),))),
        "'t' (allow exec)",
    ),
    "allow outside the parent's": (
        _tools(ToolRule("etc", "fs.read", "allow", (("path", "/etc/**"),))),
        "tools rule 'etc'",
    ),
    "allow what an earlier parent rule denies": (
        _tools(ToolRule("k", "fs.read", "allow", (("path", "/data/keys/a"),))),
        "earlier rule 'no-keys'",
    ),
    "allow a broader pattern": (
        _tools(ToolRule("all", "fs.read", "allow", (("path", "/data*/**"),))),
        "tools rule 'all'",
    ),
    "allow without a pattern": (_tools(ToolRule("any", "exec", "ask")), "tools rule 'any'"),
    "an intent the parent has no rule for": (
        _tools(ToolRule("w", "fs.write", "allow")),
        "'w' (allow fs.write)",
    ),
}


@pytest.mark.parametrize(("change", "says"), WIDER.values(), ids=WIDER.keys())
def test_wider_is_refused_naming_the_grant(change: Change, says: str) -> None:
    problems = _check(change)
    assert problems, "a wider policy passed"
    assert any(says in p for p in problems), problems


def test_a_workspace_outside_the_parents_writable_paths_is_refused() -> None:
    assert _check(lambda p: p, workspace="/srv/ws") == [
        "workspace '/srv/ws' is not within the parent's writable paths (/data, /work/ws): it is not "
        "writable for it; write inside them"
    ]
    assert "read-only for the parent (under '/usr')" in _check(lambda p: p, workspace="/usr/ws")[0]


def test_the_parents_policy_file_stays_protected() -> None:
    child = dataclasses.replace(PARENT, source=None)
    problems = check_subset(child, PARENT, parent_workspace=WS, child_workspace=WS)
    assert problems == [
        f"filesystem.protect lacks '{WS}/policy.yaml', the parent's policy file, which stays read-only; "
        "add it to filesystem.protect"
    ]
    # A helper whose writable paths do not reach it need not list it.
    assert check_subset(child, PARENT, parent_workspace=WS, child_workspace="/data/h") == []


def test_relative_protections_stay_where_the_parent_placed_them() -> None:
    """The parent's '.git/hooks' protects its workspace's hooks; a helper with a
    workspace of its own that may write the parent's '.git' must protect them there."""
    child = dataclasses.replace(
        PARENT, filesystem=dataclasses.replace(PARENT.filesystem, write=("/data", f"{WS}/.git"))
    )
    problems = check_subset(child, PARENT, parent_workspace=WS, child_workspace="/data/h")
    assert problems == [
        f"filesystem.protect lacks '.git/hooks' at '{WS}/.git/hooks', which the parent's filesystem.protect "
        f"keeps read-only; add '.git/hooks' (or '{WS}/.git/hooks') to filesystem.protect"
    ]
    fixed = dataclasses.replace(
        child,
        filesystem=dataclasses.replace(
            child.filesystem, protect=(*child.filesystem.protect, f"{WS}/.git/hooks")
        ),
    )
    assert check_subset(fixed, PARENT, parent_workspace=WS, child_workspace="/data/h") == []


def test_a_parent_grant_above_a_hidden_place_does_not_reveal_it() -> None:
    """A cell hides /home under a grant of '/' unless a grant names a path inside it."""
    parent = dataclasses.replace(PARENT, filesystem=FilesystemPolicy(read=("/", "/srv/data")), source=None)

    def problems(*read: str) -> list[str]:
        child = dataclasses.replace(parent, filesystem=FilesystemPolicy(read=read))
        return check_subset(child, parent, parent_workspace=WS, child_workspace=WS, hidden=("/home", "/srv"))

    assert problems("/opt", "/srv/data/x") == []
    assert problems("/home/me") == [
        "filesystem.read '/home/me' is not within the parent's readable paths (/, /srv/data, /work/ws); "
        "read a path inside them"
    ]
    assert problems("/srv") and problems("/srv/other")
    # Without the list, '/' would cover it: the daemon always passes the cell's.
    child = dataclasses.replace(parent, filesystem=FilesystemPolicy(read=("/home/me",)))
    assert check_subset(child, parent, parent_workspace=WS, child_workspace=WS) == []


def test_no_llm_for_a_parent_without_one() -> None:
    parent = dataclasses.replace(PARENT, llm=None)
    problems = check_subset(PARENT, parent, parent_workspace=WS, child_workspace=WS)
    assert problems == ["llm is set where the parent has no LLM endpoint; remove it"]


def test_globs_are_compared_conservatively() -> None:
    parent = dataclasses.replace(PARENT, filesystem=FilesystemPolicy(read=("/logs/*/app",), write=("/out",)))

    def problems(**fs: tuple[str, ...]) -> list[str]:
        child = dataclasses.replace(parent, filesystem=dataclasses.replace(parent.filesystem, **fs))
        return check_subset(child, parent, parent_workspace=WS, child_workspace=WS)

    assert problems(read=("/logs/a/app",)) == []
    assert problems(read=("/logs/*/app/x",)) == []
    assert problems(read=("/logs/a*/app",)) == []
    assert problems(read=("/logs/.hidden/app",))  # '*' skips dot names, as the cell expands it
    assert problems(read=("/logs/*",))
    assert problems(read=("/logs/?/app",)) == []
    assert problems(read=("/logs/[ab]/app",))  # two different globs: never assumed to nest
    # A glob in the parent's deny is kept where the child could reach it.
    denied = dataclasses.replace(parent.filesystem, deny=("/out/*/secret",))
    parent = dataclasses.replace(parent, filesystem=denied)
    assert problems(deny=()) and "'/out/*/secret'" in problems(deny=())[0]
    assert problems(deny=("/out/*/secret",)) == []
    assert problems(deny=("/out",)) == []


def test_a_read_only_glob_inside_a_writable_tree_stays_read_only() -> None:
    parent = dataclasses.replace(
        PARENT, filesystem=FilesystemPolicy(read=("/data/*/ro",), write=("/data",)), source=None
    )
    child = dataclasses.replace(parent, filesystem=FilesystemPolicy(write=("/data/a",)))
    problems = check_subset(child, parent, parent_workspace=WS, child_workspace=WS)
    assert problems == [
        "filesystem.write '/data/a' makes '/data/a/ro' writable, which the parent may only read "
        "(filesystem.read '/data/*/ro'); add '/data/a/ro' to filesystem.read"
    ]
    fixed = dataclasses.replace(parent, filesystem=FilesystemPolicy(read=("/data/a/ro",), write=("/data/a",)))
    assert check_subset(fixed, parent, parent_workspace=WS, child_workspace=WS) == []


@pytest.mark.parametrize(
    ("outer", "inner", "covered"),
    [
        ("api.example.com", "api.example.com", True),
        ("*.example.com", "api.example.com", True),
        ("*.example.com", "a.b.example.com", False),
        ("*.example.com", "example.com", False),
        ("**.example.com", "a.b.example.com", True),
        ("**.example.com", "*.example.com", True),
        ("**.example.com", "*.b.example.com", True),
        ("**.example.com", "**.b.example.com", True),
        ("*.example.com", "**.example.com", False),
        ("*.example.com", "*.b.example.com", False),
        ("**.example.com", "**.badexample.com", False),
        ("**.example.com", "api.badexample.com", False),
        ("api.example.com", "*.example.com", False),
        ("10.0.0.0/8", "10.0.0.1", True),
        ("10.0.0.0/8", "10.0.0.0/8", True),
        ("10.0.0.0/8", "11.0.0.0/8", False),
        ("2001:db8::/32", "2001:db8::1", True),
        ("2001:db8::/32", "10.0.0.1", False),
        ("10.0.0.1", "10.0.0.0/31", False),
        ("10.0.0.0/8", "ten.example.com", False),
    ],
)
def test_host_covers(outer: str, inner: str, covered: bool) -> None:
    assert host_covers(outer, inner) is covered


def test_loaded_policies_with_base_system_nest() -> None:
    """Real files: the default lists of ``base: system`` are the same on both sides."""
    parent = loads_policy(
        f"name: p\nworkspace: {WS}\nfilesystem: {{read: [/opt/papers], write: [/data]}}\n"
        "tools: [{id: s, intent: agent.spawn, verdict: allow}]\n"
    )
    child = loads_policy("name: c\nfilesystem: {read: [/opt/papers/a]}\nlimits: {memory: 1G}\n")
    assert check_subset(child, parent, parent_workspace=WS, child_workspace=WS) == []
    wider = loads_policy("name: c\nfilesystem: {read: [/opt]}\nlimits: {memory: 4G}\n")
    assert check_subset(wider, parent, parent_workspace=WS, child_workspace=WS) == [
        "filesystem.read '/opt' is not within the parent's readable paths (/usr, /bin, /sbin, /lib, /lib32, "
        f"/lib64, /libx32, /etc, /opt/papers, /data, {WS}); read a path inside them",
        "limits.memory 4294967296 is more than the parent's 2147483648; set it to 2147483648 or less",
    ]


# ----------------------------------------------------------------- Hypothesis

LABEL = st.from_regex(r"[a-z][a-z0-9]{0,9}", fullmatch=True)
COMPONENT = st.from_regex(r"[a-z][a-z0-9_]{0,9}", fullmatch=True)


@st.composite
def policies(draw: st.DrawFn) -> Policy:
    """Policies built from a few of each kind of grant."""
    dirs = draw(st.lists(COMPONENT, min_size=1, max_size=3, unique=True))
    write = tuple(f"/w/{d}" for d in dirs)
    read = tuple(f"/r/{d}" for d in draw(st.lists(COMPONENT, max_size=3, unique=True)))
    deny = tuple(f"{write[0]}/{d}" for d in draw(st.lists(COMPONENT, max_size=2, unique=True)))
    hosts = draw(st.lists(LABEL, max_size=3, unique=True))
    rules = tuple(
        HostRule(
            f"{kind}{h}.example.com",
            tuple(sorted(draw(st.sets(st.integers(1, 65535), min_size=1, max_size=3)))),
        )
        for h, kind in zip(
            hosts,
            draw(st.lists(st.sampled_from(["", "*.", "**."]), min_size=len(hosts), max_size=len(hosts))),
            strict=True,
        )
    )
    number = st.none() | st.integers(1, 1 << 40)
    tools = tuple(
        ToolRule(
            f"r{i}", intent, verdict, (("path", f"{read[0]}/**"),) if read and intent == "fs.read" else ()
        )
        for i, (intent, verdict) in enumerate(
            draw(
                st.lists(
                    st.tuples(
                        st.sampled_from(["fs.read", "exec", "agent.send"]),
                        st.sampled_from(["allow", "ask", "deny"]),
                    ),
                    max_size=4,
                )
            )
        )
    )
    return Policy(
        name="p",
        mode=draw(st.sampled_from(["enforce", "audit"])),
        filesystem=FilesystemPolicy(read=read, write=write, deny=deny, protect=(".git/hooks",)),
        exec=ExecPolicy(allow=tuple(draw(st.lists(st.sampled_from(["/usr/bin", "/bin/sh"]), unique=True)))),
        env=EnvPolicy(
            passthrough=tuple(draw(st.lists(st.sampled_from(["TERM", "LANG", "HOME"]), unique=True)))
        ),
        limits=Limits(
            memory=draw(number),
            pids=draw(number),
            cpu=draw(st.none() | st.floats(0.1, 64)),
            timeout=draw(st.none() | st.floats(1, 1e6)),
            output=draw(number),
            denials=draw(number),
        ),
        network=NetworkPolicy(
            allow=rules,
            loopback_ports=tuple(draw(st.lists(st.integers(1, 65535), max_size=2, unique=True))),
            fetch_plain_http=draw(st.booleans()),
        ),
        tools=tools,
        llm=draw(
            st.none() | st.just(LlmPolicy(model="m", max_requests=draw(number), max_tokens=draw(number)))
        ),
        secrets=(SecretPolicy("TOK", env="TOK", hosts=tuple(r.host for r in rules)),) if rules else (),
        source=draw(st.none() | st.just(f"{write[0]}/policy.yaml")),
    )


@given(policies())
def test_every_policy_is_a_subset_of_itself(policy: Policy) -> None:
    ws = policy.filesystem.write[0]
    assert check_subset(policy, policy, parent_workspace=ws, child_workspace=ws) == []


def _narrowings(p: Policy, data: st.DataObject) -> dict[str, Policy]:
    """One field narrowed each, by a drawn amount."""
    fs, lim, net = p.filesystem, p.limits, p.network
    sub = data.draw(COMPONENT)
    out: dict[str, Policy] = {
        "mode": dataclasses.replace(p, mode="enforce"),
        "read": dataclasses.replace(
            p, filesystem=dataclasses.replace(fs, read=tuple(f"{r}/{sub}" for r in fs.read))
        ),
        "deny": dataclasses.replace(p, filesystem=dataclasses.replace(fs, deny=(*fs.deny, f"/w/{sub}"))),
        "protect": dataclasses.replace(p, filesystem=dataclasses.replace(fs, protect=(*fs.protect, sub))),
        "exec": dataclasses.replace(p, exec=ExecPolicy(allow=("/usr/bin/python3",)))
        if not p.exec.allow or "/usr/bin" in p.exec.allow
        else p,
        "env": dataclasses.replace(p, env=EnvPolicy(passthrough=p.env.passthrough[1:])),
        "network.allow": dataclasses.replace(
            p,
            network=dataclasses.replace(
                net,
                allow=tuple(
                    dataclasses.replace(
                        r,
                        host=r.host if not r.host.startswith("*") else f"{sub}{r.host[r.host.index('.') :]}",
                        ports=r.ports[:1],
                    )
                    for r in net.allow
                ),
            ),
        ),
        "loopback_ports": dataclasses.replace(
            p, network=dataclasses.replace(net, loopback_ports=net.loopback_ports[1:])
        ),
        "fetch_plain_http": dataclasses.replace(p, network=dataclasses.replace(net, fetch_plain_http=False)),
        "llm": dataclasses.replace(p, llm=None),
        "tools": dataclasses.replace(p, tools=tuple(dataclasses.replace(t, verdict="deny") for t in p.tools)),
        "secrets": dataclasses.replace(p, secrets=()),
    }
    for name in ("memory", "pids", "output", "denials"):
        value = getattr(lim, name)
        smaller = data.draw(st.integers(1, value if value is not None else 1 << 41))
        out[f"limits.{name}"] = dataclasses.replace(p, limits=dataclasses.replace(lim, **{name: smaller}))
    return out


@given(policies(), st.data())
def test_narrowing_any_one_field_keeps_a_subset(policy: Policy, data: st.DataObject) -> None:
    ws = policy.filesystem.write[0]
    for field, child in _narrowings(policy, data).items():
        assert check_subset(child, policy, parent_workspace=ws, child_workspace=ws) == [], field


def _widenings(p: Policy, data: st.DataObject) -> dict[str, tuple[Policy, str]]:
    """One field widened each, with the words its refusal must hold."""
    fs, lim, net = p.filesystem, p.limits, p.network
    other = data.draw(COMPONENT)
    label = data.draw(LABEL)
    out: dict[str, tuple[Policy, str]] = {
        "read": (
            dataclasses.replace(
                p, filesystem=dataclasses.replace(fs, read=(*fs.read, f"/elsewhere/{other}"))
            ),
            "filesystem.read",
        ),
        "write": (
            dataclasses.replace(p, filesystem=dataclasses.replace(fs, write=(*fs.write, f"/r/{other}/x"))),
            "filesystem.write",
        ),
        "env": (
            dataclasses.replace(p, env=EnvPolicy(passthrough=(*p.env.passthrough, "SECRET_THING"))),
            "env.pass",
        ),
        "network.allow": (
            dataclasses.replace(
                p, network=dataclasses.replace(net, allow=(*net.allow, HostRule(f"{label}.example.org")))
            ),
            "network.allow",
        ),
        "loopback_ports": (
            dataclasses.replace(p, network=dataclasses.replace(net, loopback_ports=(*net.loopback_ports, 0))),
            "network.loopback_ports",
        ),
        "tools": (
            dataclasses.replace(p, tools=(*p.tools, ToolRule("new", "fs.write", "allow"))),
            "tools rule 'new'",
        ),
    }
    if fs.deny:
        out["deny"] = (
            dataclasses.replace(p, filesystem=dataclasses.replace(fs, deny=fs.deny[1:])),
            "filesystem.deny",
        )
    out["protect"] = (
        dataclasses.replace(p, filesystem=dataclasses.replace(fs, protect=())),
        "filesystem.protect",
    )
    if p.mode == "enforce":
        out["mode"] = (dataclasses.replace(p, mode="audit"), "mode")
    if p.exec.allow:
        out["exec"] = (dataclasses.replace(p, exec=ExecPolicy()), "exec.allow")
    if not net.fetch_plain_http:
        out["fetch_plain_http"] = (
            dataclasses.replace(p, network=dataclasses.replace(net, fetch_plain_http=True)),
            "network.fetch_plain_http",
        )
    if p.llm is None:
        out["llm"] = (dataclasses.replace(p, llm=LlmPolicy()), "llm")
    elif p.llm.max_requests is not None:
        out["llm.max_requests"] = (
            dataclasses.replace(p, llm=dataclasses.replace(p.llm, max_requests=p.llm.max_requests + 1)),
            "llm.max_requests",
        )
    for name in ("memory", "pids", "output", "denials"):
        value = getattr(lim, name)
        if value is not None:
            bigger = data.draw(st.none() | st.integers(value + 1, value * 2 + 1))
            out[f"limits.{name}"] = (
                dataclasses.replace(p, limits=dataclasses.replace(lim, **{name: bigger})),
                f"limits.{name}",
            )
    if p.secrets:
        secret = dataclasses.replace(p.secrets[0], hosts=(*p.secrets[0].hosts, f"{label}.example.org"))
        out["secrets"] = (dataclasses.replace(p, secrets=(secret,)), "secrets 'TOK'")
    return out


@given(policies(), st.data())
def test_widening_any_one_field_is_caught_naming_it(policy: Policy, data: st.DataObject) -> None:
    ws = policy.filesystem.write[0]
    for field, (child, says) in _widenings(policy, data).items():
        problems = check_subset(child, policy, parent_workspace=ws, child_workspace=ws)
        assert problems, f"widening {field} passed"
        assert any(p.startswith(says) or f" {says}" in p for p in problems), (field, problems)
