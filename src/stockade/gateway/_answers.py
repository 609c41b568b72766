"""The proxy's answers of its own and its record: refusals, 502s, 503s, and the events.

Every refusal is recorded (awaited) and counted toward the run's tripwire before
the client reads it; an allowed request is recorded when it ends, in a task of
its own, so that the record never sits on the request's path. A record that
fails there is kept, and the next request stops at 503 until it is stored:
nothing more goes out that the record could not hold.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import h11

from stockade.gateway._egress import EgressDecision
from stockade.gateway._http import Outcome, RequestInfo, Upstream, own_answer, request_event
from stockade.gateway._secrets import Secrets
from stockade.record._event import Event

MAX_HEADERS = 64 * 1024
"""Bytes of a request's line and headers (h11's ``max_incomplete_event_size``); past it, 431."""
MAX_UNRECORDED = 10_000


class GatewayHooks(Protocol):
    """What the gateway needs of the daemon: the record, the tripwire, the run's state."""

    async def record(self, events: Sequence[Event]) -> None:
        """Store ``events`` durably before returning.

        Raises:
            StoreError: the store cannot write; the proxy answers 503 and forwards nothing.
        """
        ...

    async def denied(self) -> None:
        """Count one denial toward the run's tripwire."""
        ...

    def halted(self) -> str | None:
        """Why the run is halted, or ``None``: a halted run's requests are all refused."""
        ...


@dataclass(slots=True)
class Client:
    """One client connection (or the TLS session inside one of its CONNECTs)."""

    cell: str
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    h: h11.Connection = field(
        default_factory=lambda: h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADERS)
    )
    upstream: Upstream | None = None

    def close_upstream(self) -> None:
        if self.upstream is not None:
            self.upstream.close()
            self.upstream = None


class Answers:
    """The part of the proxy that answers for itself and records (``Proxy`` builds on it)."""

    def __init__(self, *, run_id: str, hooks: GatewayHooks, secrets: Secrets) -> None:
        self.run_id = run_id
        self._hooks = hooks
        self._secrets = secrets
        self._pending: list[Event] = []
        self._recorder: asyncio.Task[None] | None = None
        self._unrecorded: list[Event] = []

    async def _refuse(
        self, c: Client, req: RequestInfo, status: int, reason: str, rule: str | None = None
    ) -> bool:
        """Record a denial, count it, then answer ``status``; whether the connection may go on.

        After a 403 to a request read whole, it may (the next request is
        decided on its own); after anything malformed, or a body left unread, it ends.
        """
        reason = self._secrets.scrub(reason)
        event = self._event(c, req, status, Outcome(), None, "deny", reason, rule=rule)
        try:
            await self._hooks.record([event])
        except Exception as exc:
            return self._answer(c, 503, _store_failed(exc), verdict="deny", rule=rule)
        await self._hooks.denied()
        keep = status == 403 and c.h.their_state is h11.DONE
        text = self._secrets.scrub(f"stockade: {req.method} {req.url()} refused: {reason}")
        return self._answer(c, status, text, rule=rule, keep=keep)

    async def _refuse_in_tunnel(
        self, c: Client, req: RequestInfo, reason: str, decision: EgressDecision
    ) -> bool:
        """A refusal after the 200 of a CONNECT: recorded and counted (True), then the connection closes.

        False when it could not be recorded: there is no HTTP answer to give then, only the close.
        """
        event = self._event(c, req, None, Outcome(), decision, "deny", reason)
        try:
            await self._hooks.record([event])
        except Exception:
            return False
        await self._hooks.denied()
        return True

    async def _fail(
        self,
        c: Client,
        req: RequestInfo,
        decision: EgressDecision,
        reason: str,
        outcome: Outcome | None = None,
    ) -> bool:
        """An allowed request the upstream could not serve: 502, recorded when answered."""
        outcome = outcome or Outcome()
        outcome.status = 502
        reason = self._secrets.scrub(reason)
        self._answer(c, 502, self._secrets.scrub(f"stockade: {req.method} {req.url()} failed: {reason}"))
        self._record_later(self._event(c, req, 502, outcome, decision, "allow", reason))
        return False

    def _answer(
        self,
        c: Client,
        status: int,
        text: str,
        *,
        verdict: str | None = None,
        rule: str | None = None,
        keep: bool = False,
    ) -> bool:
        """Send the proxy's own answer; whether the connection may carry another request."""
        if c.h.our_state is not h11.SEND_RESPONSE:
            return False
        try:
            c.writer.write(own_answer(c.h, status, text, deny=verdict is not None, rule=rule, keep=keep))
        except h11.LocalProtocolError:
            return False
        return keep

    async def _flush_unrecorded(self, c: Client, req: RequestInfo) -> bool:
        """Store what a failed background record left; False (after a 503) while the store cannot."""
        if not self._unrecorded:
            return True
        pending, self._unrecorded = self._unrecorded, []
        try:
            await self._hooks.record(pending)
        except Exception as exc:
            self._unrecorded = pending + self._unrecorded
            return self._answer(c, 503, _store_failed(exc), verdict="deny")
        return True

    def _record_later(self, event: Event) -> None:
        """Record ``event`` off the request's path: one task stores what gathered, in batches."""
        self._pending.append(event)
        if self._recorder is None or self._recorder.done():
            self._recorder = asyncio.get_running_loop().create_task(self._record_pending())

    async def _record_pending(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                await self._hooks.record(batch)
            except Exception:
                # Kept for the next request, which stops (503) until it can be stored:
                # nothing more is forwarded that the record could not hold.
                self._unrecorded.extend(batch[: max(0, MAX_UNRECORDED - len(self._unrecorded))])

    async def _recorded(self, timeout: float) -> None:
        """Wait (at most ``timeout`` seconds) for what ``_record_later`` was given."""
        if self._recorder is not None and not self._recorder.done():
            await asyncio.wait([self._recorder], timeout=timeout)

    def _event(
        self,
        c: Client,
        req: RequestInfo,
        status: int | None,
        outcome: Outcome,
        decision: EgressDecision | None,
        verdict: Literal["allow", "deny"],
        reason: str,
        *,
        rule: str | None = None,
    ) -> Event:
        rule = rule if rule is not None else (decision.rule if decision is not None else None)
        return request_event(
            req,
            run=self.run_id,
            cell=c.cell,
            status=status,
            outcome=outcome,
            verdict=verdict,
            reason=reason,
            rule=rule,
            scrub=self._secrets.scrub,
        )


def _store_failed(exc: BaseException) -> str:
    return (
        f"stockade: the record cannot be written ({exc}); nothing is forwarded until it can, "
        "so fix the daemon's store (disk space, permissions) and retry"
    )


__all__ = ["MAX_HEADERS", "Answers", "Client", "GatewayHooks"]
