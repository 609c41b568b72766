"""The gateway for ``stockade exec``: the same proxy and LLM endpoint as under
the daemon, served from a loop in a thread of this process for one cell.

Only when the policy asks for the network (``network.allow``, ``secrets`` or
``llm``): the default policy has none, and the gateway's imports (TLS, HTTP,
ASGI) would cost ``stockade exec`` more than the cell itself. Without a daemon
there is no broker, so no tripwire: the gateway's refusals are events of the
cell's result like the kernel's.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from stockade.policy import Policy
from stockade.record import Event

if TYPE_CHECKING:
    from stockade.gateway import Gateway

STOP_TIMEOUT = 10.0


def wants_gateway(policy: Policy) -> bool:
    """Whether the policy gives the cell any way out (so it needs the gateway)."""
    return bool(policy.network.allow or policy.secrets or policy.llm)


class CollectingHooks:
    """Keeps the gateway's events for the cell's result; nothing to halt without a broker."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._lock = threading.Lock()

    async def record(self, events: Sequence[Event]) -> None:
        with self._lock:
            self.events.extend(events)

    async def denied(self) -> None:
        return None

    def halted(self) -> str | None:
        return None


@contextmanager
def exec_gateway(policy: Policy) -> Iterator[tuple[Gateway, CollectingHooks]]:
    """A gateway on a loop of its own for the body; stopped after it.

    Raises:
        PolicyError: a secret of the policy has no value in this environment.
    """
    # Here, not above: ``wants_gateway`` is on every ``stockade exec``'s path,
    # and asyncio alone costs it ~40 ms to import.
    import asyncio
    import secrets

    from stockade.gateway import Gateway, GatewayOptions

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="stockade-exec-gateway", daemon=True)
    thread.start()
    hooks = CollectingHooks()
    try:
        gateway = Gateway(
            policy,
            run_id="",
            token=secrets.token_urlsafe(24),
            hooks=hooks,
            loop=loop,
            environ=os.environ,
            options=GatewayOptions.from_env(os.environ),
        )
        try:
            yield gateway, hooks
        finally:
            asyncio.run_coroutine_threadsafe(gateway.close(), loop).result(STOP_TIMEOUT)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(STOP_TIMEOUT)
        loop.close()


__all__ = ["CollectingHooks", "exec_gateway", "wants_gateway"]
