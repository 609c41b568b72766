"""A family of runs shares its root's limits and budgets: the helpers alive at
once hold at most the root's memory, processes and CPU between them; a helper's
denials count toward the family's one tripwire; its LLM calls spend the
family's budget."""

from __future__ import annotations

from stockade.broker._rules import Decision
from stockade.daemon._agents import Agents
from stockade.daemon._run import Run
from stockade.llm._endpoint import LlmEndpoint
from stockade.policy import LlmPolicy, loads_policy
from tests.daemon._family import idle_agents, idle_run

ALLOW = Decision("allow", "s", "allowed")
ROOT = (
    "name: p\nworkspace: /work/ws\ntools: [{id: s, intent: agent.spawn, verdict: allow}]\n"
    "limits: {memory: 2G, pids: 100}\n"
)


def helper(memory: str = "1G", pids: int = 10) -> str:
    return f"name: h\ncommand: [true]\nlimits: {{memory: {memory}, pids: {pids}}}\n"


def _family(*helpers: str) -> tuple[Agents, Run, list[Run]]:
    root = idle_run("root", loads_policy(ROOT))
    kids = [idle_run(f"k{i}", loads_policy(text)) for i, text in enumerate(helpers)]
    for kid in kids:
        kid.parent = root.id
        root.children.append(kid.id)
    agents = idle_agents([root, *kids])
    return agents, root, kids


def test_helpers_alive_at_once_hold_at_most_the_roots_memory() -> None:
    agents, root, kids = _family(helper(), helper("768M"))
    refused = agents.decide(root, "agent.spawn", {"policy": helper("512M")}, ALLOW)
    assert refused.verdict == "deny"
    assert "the 2 helper(s) of run r-root alive hold 1879048192 bytes of limits.memory" in refused.reason
    assert "would pass the 2147483648 they share" in refused.reason
    assert agents.decide(root, "agent.spawn", {"policy": helper("256M")}, ALLOW) == ALLOW
    kids[0].done.set()  # one ended: its share is free again
    assert agents.decide(root, "agent.spawn", {"policy": helper("1G")}, ALLOW) == ALLOW


def test_a_grandchild_draws_from_the_roots_share_too() -> None:
    agents, _root, kids = _family(helper("1G"), helper("1G"))
    # k0's own helper: its parent's subset proof passes (512M < 1G), the family's share does not.
    refused = agents.decide(kids[0], "agent.spawn", {"policy": helper("512M", 5)}, ALLOW)
    assert refused.verdict == "deny" and "of run r-root alive" in refused.reason


def test_processes_are_shared_as_memory_is() -> None:
    agents, root, _kids = _family(helper(pids=60))
    refused = agents.decide(root, "agent.spawn", {"policy": helper("1M", 50)}, ALLOW)
    assert refused.verdict == "deny" and "60 processes of limits.pids" in refused.reason


class _Hooks:
    async def record(self, events: object) -> None:
        return None


def test_a_helpers_llm_endpoint_spends_the_roots_budget() -> None:
    llm = LlmPolicy(max_requests=2)
    root = LlmEndpoint(llm, run_id="r-root", token="t1", hooks=_Hooks(), environ={})
    child = LlmEndpoint(llm, run_id="r-k0", token="t2", hooks=_Hooks(), environ={})
    child.share_usage(root)
    root.requests_used += 1
    child.requests_used += 1
    assert root.requests_used == child.requests_used == 2
    over = child._over_budget()
    assert over is not None and "budget of 2 LLM requests is spent" in over
