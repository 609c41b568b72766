"""Whether one policy grants nothing its parent's does not: the proof ``agent.spawn`` needs.

A running agent may start helpers (``agent.spawn``), each under a policy of its
own; the broker starts one only when ``check_subset(child, parent)`` finds
nothing the child may do that its parent may not. Pure: no I/O, no DNS, no
globbing on a disk.

The proof is **conservative**: where it cannot be sure that a grant of the
child lies inside the parent's (two globs that might overlap, a ``tools``
pattern it cannot compare), it says the grant is too wide. A refusal is
always one sentence per grant, naming the grant, the parent's limit, and what
to write instead, so an agent (or its author) can narrow the helper's policy
and ask again.

What is compared, field by field:

==================  =================================================================
``mode``            ``audit`` is wider than ``enforce``
``filesystem``      each readable path inside the parent's readable paths (its read and
                    write grants and workspace), each writable one (the child's
                    workspace too) inside the parent's writable paths and not read-only
                    there; every parent ``deny`` and ``protect`` kept where the child
                    could reach it; the parent's policy file stays protected
``exec.allow``      a parent list means a child list inside it
``env.pass``        only names the parent is passed
``network``         each ``allow`` rule inside one parent rule (host, ports, methods,
                    paths); ``loopback_ports`` a subset; ``fetch_plain_http`` not newly on
``secrets``         the parent's secrets only (same name and source), to fewer hosts, in
                    no header, body or URL the parent's may not stand in
``llm``             none without the parent's; the same provider, URL, model and key;
                    budgets no larger; ``remote_images`` not newly on
``limits``          each no larger (no limit is larger than any number)
``tools``           each ``allow`` or ``ask`` rule inside a parent rule at least as
                    permissive, and not shadowed by an earlier, stricter parent rule
==================  =================================================================
"""

from __future__ import annotations

import fnmatch
import ipaddress
from collections.abc import Iterable, Sequence

from stockade.policy._match import pattern_kind
from stockade.policy._model import HostRule, LlmPolicy, Policy, SecretPolicy, ToolRule

_GLOB_CHARS = "*?["
_PERMISSIVE = {"deny": 0, "ask": 1, "allow": 2}
_PATH_ARGS = frozenset({"path", "cwd"})
"""Arguments the broker matches as paths (``broker._rules.PATH_ARGS``, not imported:
``policy`` stays below ``broker``)."""


def check_subset(
    child: Policy,
    parent: Policy,
    *,
    parent_workspace: str,
    child_workspace: str,
    hidden: Sequence[str] = (),
) -> list[str]:
    """Every grant of ``child`` wider than ``parent``'s, one sentence each; empty when none.

    Paths are compared as written: the caller resolves symbolic links on the
    host (the cell mounts a grant's real path) and checks the resolved
    policies too.

    Args:
        child: the helper's policy, as loaded.
        parent: the policy of the run that asks to start it.
        parent_workspace: the parent run's workspace on the host (read-write for it).
        child_workspace: the workspace the helper would get (read-write for it).
        hidden: the places every cell hides except below a grant naming a path
            inside them (``/home``, ``/srv``, …: the cell's list, which this
            pure module does not import): a parent grant above one does not
            reveal it, so it does not cover a helper's grant inside it.
    """
    problems: list[str] = []
    if child.mode == "audit" and parent.mode == "enforce":
        problems.append("mode 'audit' is wider than the parent's 'enforce'; set mode: enforce")
    problems += _filesystem(child, parent, parent_workspace, child_workspace, tuple(hidden))
    problems += _exec(child, parent)
    problems += [
        f"env.pass {name!r} is not passed to the parent ({_list(parent.env.passthrough)}); remove it"
        for name in child.env.passthrough
        if name not in parent.env.passthrough
    ]
    problems += _network(child, parent)
    problems += _secrets(child.secrets, parent.secrets)
    problems += _llm(child.llm, parent.llm)
    problems += _limits(child, parent)
    problems += _tools(child.tools, parent.tools)
    return problems


def _list(items: Iterable[object]) -> str:
    shown = ", ".join(str(i) for i in items)
    return shown or "none"


# ------------------------------------------------------------------ paths


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p]


def _is_glob(text: str) -> bool:
    return any(c in text for c in _GLOB_CHARS)


def _part_covers(entry: str, part: str) -> bool:
    """Whether every name the component ``part`` can stand for is one ``entry`` stands for.

    Globs match one component as the cell expands them (``*`` skips names
    starting with ``.``); two different globs are never assumed to nest except
    a bare ``*`` over a glob that cannot start with a dot.
    """
    if entry == part:
        return True
    if not _is_glob(entry):
        return False
    if not _is_glob(part):
        if part.startswith(".") and not entry.startswith("."):
            return False
        return fnmatch.fnmatchcase(part, entry)
    return entry == "*" and not part.startswith(".") and not part.startswith("[")


def _part_overlaps(a: str, b: str) -> bool:
    """Whether two components may name the same thing (two globs: assumed so)."""
    if a == b:
        return True
    if _is_glob(a) and _is_glob(b):
        return True
    if _is_glob(a):
        return _part_covers(a, b)
    if _is_glob(b):
        return _part_covers(b, a)
    return False


def _covers(entry: str, path: str) -> bool:
    """Whether the grant ``entry`` (a directory stands for its tree) covers all of ``path``."""
    e, p = _parts(entry), _parts(path)
    return len(p) >= len(e) and all(_part_covers(x, y) for x, y in zip(e, p, strict=False))


def _overlaps(a: str, b: str) -> bool:
    """Whether the trees ``a`` and ``b`` may share a path (one within the other)."""
    return all(_part_overlaps(x, y) for x, y in zip(_parts(a), _parts(b), strict=False))


def _deepest(
    path: str, entries: Sequence[tuple[str, str]], *, prefer: str, hidden: tuple[str, ...] = ()
) -> tuple[str, str] | None:
    """The deepest ``(entry, kind)`` covering ``path`` (the deeper grant wins, as in the
    cell); on a tie, the one of kind ``prefer``. An entry above a ``hidden`` place
    holding ``path`` does not count: the cell hides that place from it."""
    best: tuple[str, str] | None = None
    for entry, kind in entries:
        if not _covers(entry, path):
            continue
        if any(_covers(h, path) and not _covers(h, entry) for h in hidden):
            continue
        if (
            best is None
            or len(_parts(entry)) > len(_parts(best[0]))
            or (len(_parts(entry)) == len(_parts(best[0])) and kind == prefer)
        ):
            best = (entry, kind)
    return best


def _meet(outer: str, inner: str) -> str:
    """A path inside both ``outer`` and the deeper ``inner``: ``outer``'s components,
    then the rest of ``inner``'s (where they may overlap)."""
    o, i = _parts(outer), _parts(inner)
    return "/" + "/".join(o + i[len(o) :])


def _filesystem(
    child: Policy, parent: Policy, parent_ws: str, child_ws: str, hidden: tuple[str, ...]
) -> list[str]:
    problems: list[str] = []
    pfs, cfs = parent.filesystem, child.filesystem
    p_entries = [
        *((e, "read") for e in pfs.read),
        *((e, "write") for e in pfs.write),
        *(((parent_ws, "write"),) if parent_ws else ()),
    ]
    p_readable = _list(e for e, _ in p_entries)
    p_writable = _list(e for e, k in p_entries if k == "write")
    c_reads = [*cfs.read]
    c_writes = [*cfs.write, *([child_ws] if child_ws else [])]

    for path in c_reads:
        if _deepest(path, p_entries, prefer="read", hidden=hidden) is None:
            problems.append(
                f"filesystem.read {path!r} is not within the parent's readable paths ({p_readable}); "
                "read a path inside them"
            )
    for path in c_writes:
        what = "workspace" if path == child_ws and path not in cfs.write else "filesystem.write"
        best = _deepest(path, p_entries, prefer="read", hidden=hidden)
        if best is None or best[1] != "write":
            why = (
                f"read-only for the parent (under {best[0]!r})" if best is not None else "not writable for it"
            )
            problems.append(
                f"{what} {path!r} is not within the parent's writable paths ({p_writable}): it is "
                f"{why}; write inside them"
            )
            continue
        # A read-only grant of the parent deeper inside this writable tree must stay read-only.
        for ro in pfs.read:
            if len(_parts(ro)) <= len(_parts(path)) or not _overlaps(path, ro):
                continue
            if len(_parts(ro)) <= len(_parts(best[0])):
                continue  # shallower than the parent's own write grant: overridden by it
            spot = _meet(path, ro)
            c_entries = [*((e, "read") for e in cfs.read), *((e, "write") for e in c_writes)]
            mine = _deepest(spot, c_entries, prefer="write")
            kept_hidden = any(_covers(d, spot) for d in cfs.deny)
            if not kept_hidden and mine is not None and mine[1] == "write":
                problems.append(
                    f"{what} {path!r} makes {spot!r} writable, which the parent may only read "
                    f"(filesystem.read {ro!r}); add {spot!r} to filesystem.read"
                )

    c_seen = [*c_reads, *c_writes]
    for denied in pfs.deny:
        if any(_covers(d, denied) for d in cfs.deny):
            continue
        if any(_overlaps(g, denied) for g in c_seen):
            problems.append(
                f"filesystem.deny does not hide {denied!r}, which the parent's filesystem.deny hides; "
                "add it to filesystem.deny"
            )
    problems += _protect(child, parent, parent_ws, child_ws, c_writes)
    return problems


def _protected(policy: Policy, workspace: str) -> list[tuple[str, str]]:
    """What ``policy``'s cell keeps read-only, as absolute paths, each with the entry
    that says so: absolute entries, relative ones at the top of the workspace and of
    each write grant (as the cell and the broker place them), and the policy file."""
    fs = policy.filesystem
    roots = [*([workspace] if workspace else []), *fs.write]
    out: list[tuple[str, str]] = []
    for entry in fs.protect:
        if entry.startswith("/"):
            out.append((entry, entry))
        else:
            out.extend((f"{root.rstrip('/')}/{entry}", entry) for root in roots)
    if policy.source and policy.source.startswith("/"):
        out.append((policy.source, policy.source))
    return out


def _protect(child: Policy, parent: Policy, parent_ws: str, child_ws: str, c_writes: list[str]) -> list[str]:
    """Every path the parent keeps read-only stays so for the child wherever it may write."""
    problems: list[str] = []
    mine = [path for path, _ in _protected(child, child_ws)]
    for path, entry in _protected(parent, parent_ws):
        if not any(_overlaps(w, path) for w in c_writes) or any(_covers(p, path) for p in mine):
            continue
        if entry == parent.source:
            problems.append(
                f"filesystem.protect lacks {path!r}, the parent's policy file, which stays read-only; "
                "add it to filesystem.protect"
            )
        elif entry == path:
            problems.append(
                f"filesystem.protect lacks {path!r}, which the parent's filesystem.protect keeps "
                "read-only; add it to filesystem.protect"
            )
        else:
            problems.append(
                f"filesystem.protect lacks {entry!r} at {path!r}, which the parent's filesystem.protect "
                f"keeps read-only; add {entry!r} (or {path!r}) to filesystem.protect"
            )
    return problems


def _exec(child: Policy, parent: Policy) -> list[str]:
    allowed = parent.exec.allow
    if not allowed:
        return []
    if not child.exec.allow:
        return [
            f"exec.allow is empty (any program), wider than the parent's ({_list(allowed)}); "
            "list programs among them"
        ]
    return [
        f"exec.allow {program!r} is not among the parent's programs ({_list(allowed)}); remove it"
        for program in child.exec.allow
        if not any(_covers(entry, program) for entry in allowed)
    ]


# ---------------------------------------------------------------- network


def host_covers(outer: str, inner: str) -> bool:
    """Whether every host the normalised pattern ``inner`` matches is matched by ``outer``.

    ``api.example.com`` ⊆ ``*.example.com`` ⊆ ``**.example.com``; an address ⊆
    a network holding it; names and addresses never cover each other.
    """
    if outer == inner:
        return True
    ko, ki = pattern_kind(outer), pattern_kind(inner)
    if ko in ("ip", "cidr") or ki in ("ip", "cidr"):
        if ko != "cidr" or ki not in ("ip", "cidr"):
            return False
        net = ipaddress.ip_network(outer)
        sub = ipaddress.ip_network(inner)
        return sub.version == net.version and sub.subnet_of(net)  # type: ignore[arg-type]
    if ko == "name":
        return False
    suffix = outer[outer.index(".") :]  # ".example.com"
    if ko == "one":
        if ki == "name":
            extra = inner[: -len(suffix)] if inner.endswith(suffix) else ""
            return bool(extra) and "." not in extra
        return ki == "one" and inner[inner.index(".") :] == suffix
    # ko == "many": any name below the suffix, however deep
    if ki == "name":
        return inner.endswith(suffix) and len(inner) > len(suffix)
    inner_suffix = inner[inner.index(".") :]
    return inner_suffix == suffix or inner_suffix.endswith(suffix)


def _path_prefix_covers(outer: str, inner: str) -> bool:
    """Whether URL paths under the prefix ``inner`` are all under ``outer`` (the gateway's rule:
    ``/v1/`` is what starts with it, ``/v1`` is ``/v1`` and ``/v1/…``)."""
    if outer.endswith("/"):
        return inner.startswith(outer)
    return inner == outer or inner.startswith(outer + "/")


def _rule_covers(outer: HostRule, inner: HostRule) -> bool:
    if not host_covers(outer.host, inner.host) or not set(inner.ports) <= set(outer.ports):
        return False
    if outer.methods and (not inner.methods or not set(inner.methods) <= set(outer.methods)):
        return False
    return not outer.paths or (
        bool(inner.paths) and all(any(_path_prefix_covers(o, i) for o in outer.paths) for i in inner.paths)
    )


def _show_rule(rule: HostRule) -> str:
    text = f"{rule.host} ports {'/'.join(str(p) for p in rule.ports)}"
    if rule.methods:
        text += f" methods {'/'.join(rule.methods)}"
    if rule.paths:
        text += f" paths {' '.join(rule.paths)}"
    return text


def _network(child: Policy, parent: Policy) -> list[str]:
    problems: list[str] = []
    pn, cn = parent.network, child.network
    parents = "; ".join(_show_rule(r) for r in pn.allow) or "none"
    for rule in cn.allow:
        if not any(_rule_covers(p, rule) for p in pn.allow):
            problems.append(
                f"network.allow '{_show_rule(rule)}' is not within any of the parent's network.allow "
                f"rules ({parents}); narrow it to one of them"
            )
    problems += [
        f"network.loopback_ports {port} is not among the parent's ({_list(pn.loopback_ports)}); remove it"
        for port in cn.loopback_ports
        if port not in pn.loopback_ports
    ]
    if cn.fetch_plain_http and not pn.fetch_plain_http:
        problems.append("network.fetch_plain_http is true where the parent's is false; set it to false")
    return problems


def _secrets(child: Sequence[SecretPolicy], parent: Sequence[SecretPolicy]) -> list[str]:
    problems: list[str] = []
    by_name = {s.name: s for s in parent}
    for secret in child:
        mine = by_name.get(secret.name)
        if mine is None or (mine.env, mine.file) != (secret.env, secret.file):
            problems.append(
                f"secrets {secret.name!r} is not one of the parent's secrets with the same source "
                f"({_list(s.name for s in parent)}); remove it"
            )
            continue
        problems += [
            f"secrets {secret.name!r} may go to {host!r}, which the parent's sends it to none of "
            f"({_list(mine.hosts)}); remove that host"
            for host in secret.hosts
            if not any(host_covers(h, host) for h in mine.hosts)
        ]
        parent_headers = {h.lower() for h in mine.headers}
        problems += [
            f"secrets {secret.name!r} may stand in the header {header!r}, which the parent's may not "
            f"({_list(mine.headers)}); remove that header"
            for header in secret.headers
            if header.lower() not in parent_headers
        ]
        opened = (("body", secret.body, mine.body), ("url", secret.url, mine.url))
        for part, child_opens, parent_opens in opened:
            if child_opens and not parent_opens:
                problems.append(
                    f"secrets {secret.name!r} may stand in the {part}, which the parent's may not; "
                    f"remove {part}: true"
                )
    return problems


def _llm(child: LlmPolicy | None, parent: LlmPolicy | None) -> list[str]:
    if child is None:
        return []
    if parent is None:
        return ["llm is set where the parent has no LLM endpoint; remove it"]
    problems = [
        f"llm.{name} {mine!r} differs from the parent's {theirs!r}; use the parent's"
        for name, mine, theirs in (
            ("provider", child.provider, parent.provider),
            ("base_url", child.base_url, parent.base_url),
        )
        if mine != theirs
    ]
    if parent.model is not None and child.model != parent.model:
        problems.append(f"llm.model {child.model!r} differs from the parent's {parent.model!r}; use it")
    if child.api_key_env is not None and child.api_key_env != parent.api_key_env:
        problems.append(
            f"llm.api_key_env {child.api_key_env!r} is not the parent's key "
            f"({parent.api_key_env!r}); use the parent's or none"
        )
    for name in ("max_requests", "max_tokens"):
        problems += _at_most(f"llm.{name}", getattr(child, name), getattr(parent, name))
    if child.remote_images and not parent.remote_images:
        problems.append("llm.remote_images is true where the parent's is false; remove it")
    return problems


def _at_most(name: str, mine: float | None, theirs: float | None) -> list[str]:
    if theirs is None or (mine is not None and mine <= theirs):
        return []
    shown = "unlimited" if mine is None else _number(mine)
    limit = _number(theirs)
    return [f"{name} {shown} is more than the parent's {limit}; set it to {limit} or less"]


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def _limits(child: Policy, parent: Policy) -> list[str]:
    problems: list[str] = []
    for name in ("memory", "pids", "cpu", "timeout", "output", "denials"):
        problems += _at_most(f"limits.{name}", getattr(child.limits, name), getattr(parent.limits, name))
    return problems


# ------------------------------------------------------------------ tools


def _literal_prefix(pattern: str) -> str:
    for index, c in enumerate(pattern):
        if c in _GLOB_CHARS:
            return pattern[:index]
    return pattern


def _pattern_covers(outer: str, inner: str, *, path: bool) -> bool:
    """Whether every value the glob ``inner`` matches, ``outer`` matches too.

    Conservatively: equal patterns, or an ``outer`` made of a literal prefix of
    ``inner`` then a final ``**`` (anything), or a final ``*`` where the rest of
    ``inner`` cannot leave one path component. (A path pattern holding ``..``
    matches nothing, since the broker normalises paths first, so it is
    harmlessly "covered".)"""
    if outer == inner:
        return True
    head = _literal_prefix(outer)
    rest = outer[len(head) :]
    if not inner.startswith(head):
        return False
    if rest == "**":
        return True
    if rest == "*":
        tail = inner[len(head) :]
        return not path or (bool(tail) and "/" not in tail and "**" not in tail)
    return False


def _may_overlap(a: ToolRule, b: ToolRule) -> bool:
    """Whether two rules of one intent may match the same call (patterns on different
    arguments, or patterns whose literal prefixes nest, are assumed to)."""
    mine = dict(a.match)
    for name, pattern in b.match:
        other = mine.get(name)
        if other is None:
            continue
        x, y = _literal_prefix(pattern), _literal_prefix(other)
        if not (x.startswith(y) or y.startswith(x)):
            return False
        if not _is_glob(pattern) and not _is_glob(other) and pattern != other:
            return False
    return True


def _rule_within(outer: ToolRule, inner: ToolRule) -> bool:
    """Whether ``outer`` matches every call ``inner`` does."""
    mine = dict(inner.match)
    for name, pattern in outer.match:
        if name not in mine or not _pattern_covers(pattern, mine[name], path=name in _PATH_ARGS):
            return False
    return True


def _tools(child: Sequence[ToolRule], parent: Sequence[ToolRule]) -> list[str]:
    problems: list[str] = []
    for index, rule in enumerate(child):
        need = _PERMISSIVE[rule.verdict]
        if need == 0:
            continue  # a denial never widens anything
        what = f"tools rule {rule.id!r} ({rule.verdict} {rule.intent})"
        same = [p for p in parent if p.intent == rule.intent]
        cover = next((p for p in same if _rule_within(p, rule) and _PERMISSIVE[p.verdict] >= need), None)
        if cover is None:
            problems.append(
                f"{what} is not within any parent rule that {rule.verdict}s {rule.intent} "
                f"({_list(p.id for p in same if _PERMISSIVE[p.verdict] >= need)}); narrow it to one "
                "of them, or make it deny"
            )
            continue
        # The parent's first matching rule decides: a stricter one before ``cover`` may shadow it.
        for earlier in same[: same.index(cover)]:
            if _PERMISSIVE[earlier.verdict] >= need or not _may_overlap(earlier, rule):
                continue
            kept = any(
                mine.intent == rule.intent
                and _PERMISSIVE[mine.verdict] <= _PERMISSIVE[earlier.verdict]
                and _rule_within(mine, earlier)
                for mine in child[:index]
            )
            if not kept:  # the helper does not decide it first, as strictly, itself
                problems.append(
                    f"{what} may allow what the parent's earlier rule {earlier.id!r} "
                    f"({earlier.verdict}) decides first; add that rule to the helper's tools before it"
                )
                break
    return problems


__all__ = ["check_subset", "host_covers"]
