"""The daemon's side of the gateway: one ``Gateway`` per run, its hooks into the
record and the tripwire, and the ``http.fetch`` intent.

Kept apart from ``_runs`` (the broker's intent path) because everything here is
network: the gateway's listeners live in each run's cell, and ``http.fetch``
runs on the daemon's loop under the same ``network.allow`` as the proxy.
"""

from __future__ import annotations

import dataclasses
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from stockade.broker._intents import FetchArgs, blob, failure
from stockade.broker._refusal import Refusal
from stockade.broker._rules import Decision, Rules
from stockade.record import Event

if TYPE_CHECKING:
    import asyncio

    from stockade.daemon._bus import Recorder
    from stockade.daemon._run import Run
    from stockade.gateway import Gateway, GatewayOptions
    from stockade.gateway._answers import GatewayHooks
    from stockade.gateway._fetch import FetchHop


class RunHooks:
    """What a run's gateway and LLM endpoint call back into: the record, the
    tripwire, and whether the run is still allowed to do anything."""

    def __init__(self, run: Run, recorder: Recorder, count_denial: Callable[[Run], Awaitable[None]]) -> None:
        self._run = run
        self._recorder = recorder
        self._count_denial = count_denial

    async def record(self, events: Sequence[Event]) -> None:
        """Store ``events`` durably (as the run's); raises StoreError when the store cannot."""
        run = self._run
        await self._recorder.record_soon([dataclasses.replace(e, run=run.id) for e in events])
        for event in events:
            if event.kind == "http.request":
                run.requests += 1

    async def denied(self) -> None:
        await self._count_denial(self._run)

    def halted(self) -> str | None:
        run = self._run
        if run.halted:
            return f"run {run.id} is halted ({run.halted})"
        if run.done.is_set():
            return f"run {run.id} has ended"
        return None


def make_gateway(
    run: Run,
    *,
    hooks: RunHooks,
    loop: asyncio.AbstractEventLoop,
    environ: Mapping[str, str],
    options: GatewayOptions,
) -> Gateway:
    """The run's gateway (the daemon's environment holds the secrets and the LLM key).

    Raises:
        PolicyError: a secret of the policy has no value here.
    """
    from stockade.gateway import Gateway

    return Gateway(
        run.policy, run_id=run.id, token=run.token, hooks=hooks, loop=loop, environ=environ, options=options
    )


# ----------------------------------------------------------------- http.fetch


def fetch_decision(
    gateway: Gateway | None, rules: Rules, args: Mapping[str, Any], *, plain_http: bool
) -> Decision:
    """``http.fetch`` must pass ``network.allow``, as the proxy's requests do; and
    where the policy has ``tools`` rules for ``http.fetch`` the first that matches
    decides too (so that a fetch can need approval), no match being a deny.

    The URL is read as the fetch itself reads it (``parse_url``), so that what
    is decided is what would be asked for."""
    from stockade.gateway._fetch import FetchError, parse_url

    if gateway is None:
        return Decision("deny", None, "this run has no gateway, so nothing can be fetched")
    try:
        where = parse_url(str(args.get("url", "")), plain_http)
    except FetchError as exc:
        # A reason quotes the URL: never a secret's value or placeholder in it.
        return Decision("deny", None, gateway.secrets.scrub(exc.reason))
    decided = gateway.egress.decide(
        where.host, where.port, method=str(args.get("method", "GET")), path=where.target.partition("?")[0]
    )
    if decided.verdict == "deny" or not rules.has_intent("http.fetch"):
        return Decision(decided.verdict, decided.rule, gateway.secrets.scrub(decided.reason))
    return rules.decide("http.fetch", args)


async def fetch_value(
    gateway: Gateway,
    run: Run,
    cell: str,
    args: Mapping[str, Any],
    hooks: GatewayHooks,
    *,
    tool_call: str | None = None,
) -> dict[str, object] | Refusal:
    """Fetch for the agent; every hop an ``http.request`` event. A refusal on the
    way (a redirect to a forbidden place) is a ``Refusal`` value, as the broker's
    own refusals are, so the caller records and counts it."""
    from stockade.gateway._fetch import FetchFailed, FetchRefused, fetch

    parsed = FetchArgs.model_validate(args)
    started = time.monotonic()
    try:
        result = await fetch(
            gateway.egress,
            parsed.url,
            method=parsed.method,
            headers=parsed.headers,
            body=parsed.data(),
            plain_http=run.policy.network.fetch_plain_http,
            tls=gateway.upstream_tls,
            secrets=gateway.secrets,
        )
    except FetchRefused as exc:
        await hooks.record([hop_event(run, cell, hop, tool_call) for hop in exc.hops])
        return Refusal("network", exc.reason)
    except FetchFailed as exc:
        # Allowed, but it did not work (unreachable, a bad certificate, a
        # timeout): recorded, and not a denial.
        await hooks.record([hop_event(run, cell, hop, tool_call) for hop in exc.hops])
        return failure("failed", exc.reason)
    await hooks.record([hop_event(run, cell, hop, tool_call) for hop in result.hops])
    return {
        "status": result.status,
        "url": result.url,
        "headers": [[k, v] for k, v in result.headers],
        "truncated": result.truncated,
        "hops": len(result.hops),
        "duration": round(time.monotonic() - started, 6),
        **blob(result.body),
    }


def hop_event(run: Run, cell: str, hop: FetchHop, tool_call: str | None = None) -> Event:
    """One hop of an ``http.fetch`` as the ``http.request`` event the proxy also writes."""
    parts = urllib.parse.urlsplit(hop.url)
    rule = f" by {hop.rule}" if hop.rule else ""
    status = f": {hop.status}" if hop.status is not None else ""
    words = "allowed" if hop.verdict == "allow" else "refused"
    return Event(
        kind="http.request",
        cell=cell,
        layer="gateway",
        outcome="allowed" if hop.verdict == "allow" else "denied",
        run=run.id,
        summary=f"{hop.method} {hop.url[:200]} {words}{rule}{status} (http.fetch)",
        detail={
            "method": hop.method,
            "scheme": parts.scheme,
            "host": hop.host,
            "port": hop.port,
            "path": parts.path or "/",
            "address": hop.address,
            "status": hop.status,
            "bytes_up": hop.bytes_up,
            "bytes_down": hop.bytes_down,
            "duration": round(hop.duration, 6),
            "verdict": hop.verdict,
            "rule": hop.rule,
            "reason": hop.reason,
            "via": "http.fetch",
            **({"tool_call": tool_call} if tool_call is not None else {}),
        },
    )


__all__ = ["RunHooks", "fetch_decision", "fetch_value", "hop_event", "make_gateway"]
