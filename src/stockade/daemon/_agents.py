"""Groups of agents: helpers a run starts (``agent.spawn``) and messages between
the runs of one family (``agent.send``, ``agent.recv``).

A **family** is a run, the helpers it spawned, theirs, and so on: a tree whose
root was started by ``run.start``. A run may message its parent, its own
helpers and its siblings (its parent's other helpers), never a stranger: the
broker is the only way between cells, and every message is an
``agent.message`` event, recorded before it is delivered.

``agent.spawn`` is decided twice: by the run's ``tools`` rules, as every intent
is, and then by a proof that the helper's policy grants nothing the run's does
not (``policy._subset.check_subset``). A failed proof is a denial whose reason
lists each grant that is too wide: recorded, and counted by the tripwire like
any other. A helper runs as a run of its own (its own cell, token, tripwire
and transcript) whose ``parent`` is the spawning run; it is unattended when
its parent is, and gets only the variables its parent was passed. Stopping or
halting a run stops every run below it (``Runs.stop``, ``Runs.halt``), and a
helper never outlives the run that spawned it.

The daemon's loop runs all of this; nothing here touches a socket.
"""

from __future__ import annotations

import asyncio
import dataclasses
import glob
import os
import time
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from stockade.broker._intents import RecvArgs, SendArgs, SpawnArgs, failure
from stockade.broker._refusal import Refusal
from stockade.broker._rules import Decision
from stockade.errors import PolicyError, StoreError
from stockade.policy import Policy
from stockade.policy._subset import check_subset
from stockade.record import Event

if TYPE_CHECKING:
    from stockade.daemon._bus import Recorder
    from stockade.daemon._run import Run

AGENT_INTENTS = frozenset({"agent.spawn", "agent.send", "agent.recv"})
"""The intents this module decides (after the rules) and executes."""
MAX_HELPERS = 16
"""Helpers one run may have running at once."""
MAX_DEPTH = 4
"""Levels of helpers below a root run: a helper of a helper of a helper of a helper spawns no more."""
MAILBOX_MESSAGES = 1000
"""Messages waiting for one run, at most; a send past it is refused (``full``)."""
MAILBOX_BYTES = 16 * 1024 * 1024
"""Bytes of messages waiting for one run, at most."""
RECORDED_CHARS = 2000
"""Characters of a message kept in its ``agent.message`` event."""


@dataclasses.dataclass(frozen=True, slots=True)
class Message:
    """One message waiting in a mailbox."""

    sender: str
    sender_name: str
    text: str
    time: float
    size: int


class Mailbox:
    """One run's messages, in order, and the ``agent.recv`` calls waiting for them."""

    def __init__(self) -> None:
        self.messages: deque[Message] = deque()
        self.bytes = 0
        self.closed = False
        self._waiters: list[asyncio.Future[None]] = []

    def full(self, size: int) -> str | None:
        """Why a message of ``size`` bytes does not fit; ``None`` when it does."""
        if len(self.messages) >= MAILBOX_MESSAGES:
            return f"{MAILBOX_MESSAGES} messages"
        if self.bytes + size > MAILBOX_BYTES:
            return f"{MAILBOX_BYTES // (1024 * 1024)} MiB of messages"
        return None

    def put(self, message: Message) -> None:
        self.messages.append(message)
        self.bytes += message.size
        self._wake()

    def close(self) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        # Every waiter looks again: one woken for a message but cancelled (its
        # connection dropped) must not leave the message to nobody.
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def get(self, timeout: float) -> Message | None:
        """The next message, waiting up to ``timeout`` seconds; ``None`` if none came
        (or the run ended)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if self.messages:
                message = self.messages.popleft()
                self.bytes -= message.size
                return message
            left = deadline - loop.time()
            if left <= 0 or self.closed:
                return None
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append(waiter)
            try:
                await asyncio.wait({waiter}, timeout=left)
            finally:
                self._waiters.remove(waiter)
                waiter.cancel()


class StartRun(Protocol):
    """Starts a run (``Runs.start``): here, a helper of ``parent`` under ``policy``."""

    async def __call__(
        self, params: Mapping[str, Any], *, parent: Run | None = ..., policy: Policy | None = ...
    ) -> Run: ...


class StopRun(Protocol):
    """Stops a run and every run below it (``Runs.stop``)."""

    async def __call__(self, run: Run, *, grace: float, by: str) -> None: ...


class Agents:
    """The agent intents of every run of one daemon: mailboxes, families, spawning."""

    def __init__(
        self,
        *,
        runs: Mapping[str, Run],
        recorder: Recorder,
        state_dir: str,
        start: StartRun,
        stop: StopRun,
    ) -> None:
        """
        Args:
            runs: the daemon's runs by id (``Runs.runs``), read, never changed here.
            recorder: where a message's ``agent.message`` event is stored.
            state_dir: the daemon's state directory, hidden from every helper.
            start: starts a helper (``Runs.start``).
            stop: stops a helper whose parent stopped while it started (``Runs.stop``).
        """
        self._runs = runs
        self._recorder = recorder
        self._state_dir = state_dir
        self._start = start
        self._stop = stop
        self._mailboxes: dict[str, Mailbox] = {}

    # ------------------------------------------------------------------ deciding

    def decide(self, run: Run, intent: str, args: Mapping[str, Any], decision: Decision) -> Decision:
        """The verdict on an agent intent, given the rules' ``decision``.

        A spawn the rules allow (or would ask about) must also pass the subset
        proof and the limits on helpers; a send must name a run of the family.

        Raises:
            RequestError: ``bad_params``: the helper's policy is not a valid policy
                (a malformed argument: neither decided nor counted).
        """
        if intent == "agent.spawn":
            policy, workspace = self._helper(run, args)
            if decision.verdict == "deny":
                return decision
            refused = self._spawn_refusal(run, policy, workspace)
        elif intent == "agent.send":
            if decision.verdict == "deny":
                return decision
            _, refused = self._resolve(run, str(args.get("to", "")))
        else:
            return decision
        if refused:
            return Decision("deny", decision.rule, refused)
        return decision

    def _helper(self, run: Run, args: Mapping[str, Any]) -> tuple[Policy, str]:
        """The helper's policy (loaded with only the variables its parent was passed)
        and its workspace.

        Raises:
            RequestError: ``bad_params``.
        """
        from stockade.daemon._requests import RequestError
        from stockade.policy import loads_policy

        parsed = SpawnArgs.model_validate(args)
        try:
            policy = loads_policy(parsed.policy, source="<agent.spawn>", environ=run.environ)
        except PolicyError as exc:
            raise RequestError("bad_params", f"agent.spawn: 'policy' is not a valid policy: {exc}") from exc
        if parsed.argv is None and not policy.command:
            raise RequestError(
                "bad_params",
                "agent.spawn: the helper has nothing to run; give 'argv', or a command in the policy",
            )
        if parsed.name is not None:
            policy = dataclasses.replace(policy, name=parsed.name)
        parent_file = run.policy.source
        if parent_file and parent_file.startswith("/") and parent_file not in policy.filesystem.protect:
            # The parent's cell keeps its policy file read-only; so does the helper's.
            fs = dataclasses.replace(policy.filesystem, protect=(*policy.filesystem.protect, parent_file))
            policy = dataclasses.replace(policy, filesystem=fs)
        return policy, policy.workspace or run.workspace

    def _spawn_refusal(self, run: Run, policy: Policy, workspace: str) -> str:
        """Why ``run`` may not start a helper under ``policy``; empty when it may."""
        if run.state != "running":
            return f"run {run.id} is {run.state}, so it starts no helpers"
        depth = len(self.lineage(run))
        if depth >= MAX_DEPTH:
            return (
                f"run {run.id} is a helper {depth} levels deep, the most there may be ({MAX_DEPTH}); "
                "let its parent spawn the helper instead"
            )
        running = [c for c in self.helpers(run) if not c.done.is_set()]
        if len(running) >= MAX_HELPERS:
            return (
                f"run {run.id} has {len(running)} helpers running, the most it may have ({MAX_HELPERS}); "
                "wait for one to end"
            )
        hidden = self._hidden(run)
        problems = check_subset(
            policy, run.policy, parent_workspace=run.workspace, child_workspace=workspace, hidden=hidden
        )
        # The cell mounts a grant's real path: a link (one the parent planted in its
        # workspace, say) must not lead the helper anywhere its parent cannot go.
        child_real, child_ws = _resolved(policy, workspace)
        parent_real, parent_ws = _resolved(run.policy, run.workspace)
        for problem in check_subset(
            child_real,
            parent_real,
            parent_workspace=parent_ws,
            child_workspace=child_ws,
            hidden=tuple(dict.fromkeys(os.path.realpath(h) for h in hidden)),
        ):
            if problem not in problems:
                problems.append(f"following symbolic links (as the cell does), {problem}")
        if problems:
            return "the helper's policy grants more than this run's: " + " ".join(
                p if p.endswith(".") else p + "." for p in problems
            )
        return self._carve_refusal(run, policy)

    def _carve_refusal(self, run: Run, policy: Policy) -> str:
        """Why the family of ``run`` has no room left for a helper under
        ``policy``; empty when it has. A family's helpers, all of them alive at
        once, hold at most the root run's limits between them (memory,
        processes, CPU): 49 helpers that each got their parent's 2 GiB summed to
        98 GiB on a 24 GiB host. The root's own cell keeps its limits (it is
        not made smaller), so a family holds at most twice the root's."""
        above = self.lineage(run)
        root = above[-1] if above else run
        alive = [r for r in self.descendants(root) if not r.done.is_set()]
        for kind, unit in (("memory", " bytes"), ("pids", " processes"), ("cpu", " CPUs")):
            bound = getattr(root.policy.limits, kind)
            if bound is None:
                continue
            wanted = getattr(policy.limits, kind)
            if wanted is None:
                return (
                    f"the helper's policy sets no limits.{kind}, and the helpers of run {root.id} share "
                    f"its {_num(bound)}{unit}; give the helper a limits.{kind}"
                )
            held = sum(getattr(r.policy.limits, kind) or 0 for r in alive)
            if held + wanted > bound:
                return (
                    f"the {len(alive)} helper(s) of run {root.id} alive hold {_num(held)}{unit} of "
                    f"limits.{kind}, and this one's {_num(wanted)} would pass the {_num(bound)} they share "
                    f"(the root's limits.{kind}); give the helper less or wait for one to end"
                )
        return ""

    def descendants(self, run: Run) -> list[Run]:
        """Every run below ``run``: its helpers, theirs, … (depth first)."""
        found: list[Run] = []
        for helper in self.helpers(run):
            found.append(helper)
            found.extend(self.descendants(helper))
        return found

    def root(self, run: Run) -> Run:
        """The run at the top of ``run``'s family (``run`` itself when it has no parent)."""
        above = self.lineage(run)
        return above[-1] if above else run

    def _hidden(self, run: Run) -> tuple[str, ...]:
        """The places every cell hides except below a grant naming a path inside them."""
        from stockade.cell._plan import _DEFAULT_HIDDEN

        places = [*_DEFAULT_HIDDEN, self._state_dir]
        for home in (os.environ.get("HOME"), run.environ.get("HOME")):
            if home and home != "/":
                places.append(home)
        return tuple(dict.fromkeys(places))

    # ------------------------------------------------------------------ families

    def lineage(self, run: Run) -> list[Run]:
        """The runs above ``run``: its parent, its parent's parent, … (the root last)."""
        above: list[Run] = []
        current = run
        while current.parent and len(above) <= MAX_DEPTH:
            parent = self._runs.get(current.parent)
            if parent is None:
                break
            above.append(parent)
            current = parent
        return above

    def helpers(self, run: Run) -> list[Run]:
        """The runs ``run`` spawned, in order."""
        return [self._runs[c] for c in run.children if c in self._runs]

    def family(self, run: Run) -> list[Run]:
        """The runs ``run`` may message: its parent, its siblings, its helpers."""
        members: list[Run] = []
        parent = self._runs.get(run.parent) if run.parent else None
        if parent is not None:
            members.append(parent)
            members.extend(r for r in self.helpers(parent) if r.id != run.id)
        members.extend(self.helpers(run))
        return members

    def _resolve(self, run: Run, to: str) -> tuple[Run | None, str]:
        """The family member ``to`` names (an id, or a name), or why there is none."""
        members = self.family(run)
        for member in members:
            if member.id == to:
                return member, ""
        named = [m for m in members if m.name == to]
        running = [m for m in named if not m.done.is_set()]
        if len(running) > 1:
            ids = ", ".join(m.id for m in running)
            return None, f"several runs of this family are named {to!r} ({ids}); give an id"
        if running or named:
            return (running or named)[-1], ""
        return None, (
            f"{to[:64]!r} is not a run of this run's family (its parent, its siblings and its "
            "helpers); agents message only their own family"
        )

    # ------------------------------------------------------------------ executing

    async def execute(
        self, run: Run, cell: str, intent: str, args: Mapping[str, Any]
    ) -> dict[str, object] | Refusal:
        """Execute an allowed agent intent; its value (a failure value when it could
        not be done, a ``Refusal`` when the family's bounds refused it).

        Raises:
            RequestError: ``unavailable``: the store cannot record a message.
        """
        if intent == "agent.spawn":
            return await self._spawn(run, args)
        if intent == "agent.send":
            return await self._send(run, cell, SendArgs.model_validate(args))
        return await self._recv(run, RecvArgs.model_validate(args))

    async def _spawn(self, run: Run, args: Mapping[str, Any]) -> dict[str, object] | Refusal:
        from stockade.daemon._requests import RequestError

        policy, workspace = self._helper(run, args)
        refused = self._spawn_refusal(run, policy, workspace)  # again: an approval may have waited
        if refused:
            return Refusal("family", refused)
        parsed = SpawnArgs.model_validate(args)
        params = {
            "policy_text": parsed.policy,
            "argv": parsed.argv,
            "workspace": workspace,
            "env": dict(run.environ),
            "detach": True,
            "unattended": run.unattended,
        }
        try:
            helper = await self._start(params, parent=run, policy=policy)
        except RequestError as exc:
            return failure("failed", f"the helper could not start: {exc}")
        if run.state != "running":  # stopped or halted while the helper started
            await self._stop(helper, grace=0.0, by=f"its parent {run.id} is {run.state}")
            return Refusal("stopped", f"run {run.id} is {run.state}, so its helper was stopped")
        return {"run": helper.id, "name": helper.name}

    async def _send(self, run: Run, cell: str, args: SendArgs) -> dict[str, object] | Refusal:
        from stockade.daemon._requests import RequestError

        target, refused = self._resolve(run, args.to)
        if target is None:
            return Refusal("family", refused)
        if target.done.is_set() or target.state not in ("running",):
            return failure("gone", f"run {target.id} is {target.state}, so it reads no more messages")
        mailbox = self._mailboxes.setdefault(target.id, Mailbox())
        size = len(args.message.encode("utf-8", "surrogatepass"))
        full = mailbox.full(size)
        if full:
            return failure(
                "full",
                f"the mailbox of run {target.id} holds {full}, its limit; send again once it has "
                "read some (agent.recv)",
            )
        now = time.time()
        try:
            await self._recorder.record_soon([message_event(run, target, cell, args.message, size)])
        except StoreError as exc:
            raise RequestError("unavailable", f"the event store cannot record the message: {exc}") from exc
        mailbox.put(Message(run.id, run.name, args.message, now, size))
        return {"to": target.id, "size": size}

    async def _recv(self, run: Run, args: RecvArgs) -> dict[str, object]:
        mailbox = self._mailboxes.setdefault(run.id, Mailbox())
        message = await mailbox.get(args.timeout)
        if message is None:
            return {"timeout": True}
        return {
            "from": message.sender,
            "name": message.sender_name,
            "message": message.text,
            "time": message.time,
        }

    def ended(self, run: Run) -> None:
        """``run`` ended: its waiting ``agent.recv`` calls return, its mailbox goes."""
        mailbox = self._mailboxes.pop(run.id, None)
        if mailbox is not None:
            mailbox.close()


def _num(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def _resolved(policy: Policy, workspace: str) -> tuple[Policy, str]:
    """``policy`` with its read, write and deny entries as the cell would mount them
    now: globs expanded on the host, every path through its symbolic links.

    Between this and the helper's cell starting, a run that can write a
    directory on the way could still swap it for a link; the cell resolves
    grants again when it starts.
    """

    def real(entries: tuple[str, ...]) -> tuple[str, ...]:
        out: list[str] = []
        for entry in entries:
            paths = glob.glob(entry) if glob.has_magic(entry) else [entry]
            out.extend(os.path.realpath(p) for p in paths)
        return tuple(dict.fromkeys(out))

    fs = policy.filesystem
    resolved = dataclasses.replace(fs, read=real(fs.read), write=real(fs.write), deny=real(fs.deny))
    return dataclasses.replace(policy, filesystem=resolved), os.path.realpath(workspace) if workspace else ""


def message_event(sender: Run, target: Run, cell: str, text: str, size: int) -> Event:
    """``agent.message``: one message between two runs of a family (the sender's event)."""
    kept = text[:RECORDED_CHARS]
    return Event(
        kind="agent.message",
        cell=cell,
        layer="broker",
        outcome="info",
        run=sender.id,
        summary=f"message from {sender.id} to {target.id} ({size} bytes)",
        detail={
            "from": sender.id,
            "to": target.id,
            "size": size,
            "message": kept,
            "truncated": len(kept) < len(text),
        },
    )


__all__ = ["AGENT_INTENTS", "MAX_DEPTH", "MAX_HELPERS", "Agents", "Mailbox", "Message", "message_event"]
