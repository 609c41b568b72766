"""A refusal by the broker's own checks: a result, never an exception.

The rules may allow an intent that the broker then refuses (a path outside the
grants, hidden, behind a link, a session that is not the run's…). That is a
denial like a rule's: the daemon records it and counts it toward the
tripwire. It travels as a ``Refusal`` value from the check that made it
(``_fs.FileAccess``, ``_intents.IntentExecutor``) to the daemon, which tells
it by its type, not by matching the wire form; the agent gets the wire form
(``value()``), ``{"error": {"code": "refused", "message": …}}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

RefusalReason = Literal[
    "grants",
    "read_only",
    "hidden",
    "protected",
    "link",
    "mount",
    "kind",
    "permissions",
    "hard_links",
    "changed",
    "path",
    "session",
    "network",
    "family",
    "stopped",
]
"""Which check refused: ``grants`` (no ``filesystem`` entry covers the path),
``read_only`` (a write in a read grant), ``hidden`` / ``protected`` (the path,
or where it leads, is never reached / never written), ``link`` (a symbolic
link on the way), ``mount`` (it crosses a mount point), ``kind`` (not a
regular file), ``permissions`` (the cell's uid could not), ``hard_links`` (a
write to a file of several names), ``changed`` (replaced while being opened),
``path`` (not absolute or not normalised), ``session`` (not an open session of
this run), ``network`` (the gateway refused a fetch part way, a redirect to a
place ``network.allow`` does not name), ``family`` (``agent.*`` beyond the
family's bounds: a helper's policy wider than its parent's, a message to a run
outside the family), ``stopped`` (the run stopped while its helper started)."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """The broker refused an intent the rules allowed; ``message`` says what and the fix."""

    reason: RefusalReason
    message: str

    def value(self) -> dict[str, object]:
        """The intent's value as the agent gets it."""
        return {"error": {"code": "refused", "message": self.message}}

    def within(self, what: str) -> Refusal:
        """The same refusal, its message prefixed (``cwd: …``)."""
        return Refusal(self.reason, f"{what}: {self.message}")


__all__ = ["Refusal", "RefusalReason"]
