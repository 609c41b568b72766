"""Runs and an ``Agents`` with no daemon behind them, for the tests of family
rules (limits, budgets, mailboxes) that need only the bookkeeping.

test_families and test_agents both build runs this way; one builder keeps the
``Run`` fields they must fill in one place, so a new required field is added
once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

from stockade.broker._rules import Rules
from stockade.broker._tripwire import Tripwire
from stockade.daemon._agents import Agents
from stockade.daemon._run import Run
from stockade.policy import Policy


def idle_run(name: str, policy: Policy, *, shown_as: str | None = None) -> Run:
    """A run ``r-<name>`` under ``policy`` (named ``shown_as``, else ``name``)
    that no cell backs: detached, a tripwire of 10, the policy's tool rules."""
    return Run(
        id=f"r-{name}",
        name=name if shown_as is None else shown_as,
        policy=policy,
        argv=(),
        workspace="/work/ws",
        detach=True,
        unattended=False,
        created=0.0,
        token="t",
        token_expiry=0.0,
        tripwire=Tripwire(10),
        rules=Rules(policy.tools),
    )


def idle_agents(runs: Iterable[Run]) -> Agents:
    """An ``Agents`` over ``runs`` whose start and stop fail the test: these
    tests start and stop no run, they ask for decisions only."""

    async def never(*args: object, **kwargs: object) -> Any:
        raise AssertionError("these tests start and stop no run")

    return Agents(
        runs={r.id: r for r in runs},
        recorder=cast("Any", None),
        state_dir="/var/lib/stockade",
        start=never,
        stop=never,
    )


__all__ = ["idle_agents", "idle_run"]
