"""Sessions started ahead of their samples: a task's spares.

A sample's session costs its start (a cell launched, and with a daemon a run
and a gateway too) before the agent's first call, and Inspect gives the
sandbox ``task_init`` before any sample: the ``stockade`` sandbox keeps a few
**spares** per task and sandbox config, each a fresh session of the task's
policy started in a thread of its own, and ``sample_init`` takes one instead
of starting its own.

What a spare is, and is not:

- fresh: started for one sample, never handed to a second (a sample's end
  ends its session; nothing of one sample's cell is seen by another);
- of the sample's policy: a spare whose policy is not the one the sample
  resolves now (a policy file edited meanwhile) is not used;
- young: a spare older than ``SPARE_MAX_AGE`` is ended, not used: its cell's
  view was planned when it started (a decoy covers only what the host had
  then), and a sample should not see the host as it was minutes before;
- alive: a daemon's spare whose session is no longer open there (the daemon
  restarted meanwhile) is ended, and the sample starts its own;
- recorded: its session's events (the cell's start, ``session.open``) are in
  the sample's record, dated when they happened, and the sample's
  ``harness.sample.start`` says it was started ahead and when. A spare that
  no sample took is ended at ``task_cleanup`` (or when too old) with a
  ``harness.sample.unused`` event, and its record lands like a sample's.

How many: one at first; each ``take`` that found none, ready or starting,
asks for one more, up to ``most`` (the sandbox's ``default_concurrency``), so
a sequential eval holds one idle cell and a concurrent one as many as it
showed it needs.
A spare is started by ``task_init``, when a sample takes one (so the next
is up by that sample's end: Inspect starts the next sample as soon as one
ends, and a sample's own time is mostly its model's), and when a sample ends
(a no-op when as many are up as wanted).
A spare that fails to start stops the filling: the sample then starts its own
session and says why in its own error.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stockade.harness._hosted import SampleHost
from stockade.harness._workbench import Workbench
from stockade.policy import Policy

SPARE_MAX_AGE = 60.0
"""Seconds a spare may wait for its sample; an older one is ended unused."""


@dataclass(slots=True)
class Spare:
    """One started session, its host (its record) and its working directory."""

    host: SampleHost
    workbench: Workbench
    cwd: str
    policy: Policy
    started: float
    """``time.monotonic()`` when its start began."""
    started_at: float
    """``time.time()`` of the same moment, for the record."""

    def alive(self) -> bool:
        """Whether its session still serves (asked of the daemon that hosts it;
        one in this process ends only when closed)."""
        check = getattr(self.host, "alive", None)
        return True if check is None else bool(check(self.workbench))

    def end_unused(self, why: str) -> None:
        """End the session that no sample took; its record lands as a sample's would."""
        self.host.record.harness_event(
            "harness.sample.unused",
            f"a session started ahead for task {self.host.record.task} was ended unused: {why}",
            why=why,
        )
        with contextlib.suppress(Exception):
            self.host.close(self.workbench)
        with contextlib.suppress(Exception):
            self.host.finish()


class SparePool:
    """The spares of one task and sandbox config (see the module's docstring)."""

    def __init__(self, start: Callable[[str], Spare], *, most: int, task: str) -> None:
        """``start(task)`` starts one spare for samples of ``task`` (the last
        ``fill`` named; ``task`` until one does)."""
        self._start = start
        self._task = task
        self._most = max(0, most)
        self._cond = threading.Condition()
        self._ready: list[Spare] = []
        self._starting = 0
        self._wanted = min(1, self._most)
        self._closed = False
        self._threads: set[threading.Thread] = set()
        self.failure: BaseException | None = None
        """Why the last spare could not start (filling stopped then)."""

    def fill(self, *, task: str | None = None) -> None:
        """Start spares until as many are ready or starting as are wanted (for
        samples of ``task``, the one whose sample just ended, from now on)."""
        with self._cond:
            if task is not None:
                self._task = task
            while not self._closed and self.failure is None and self._count() < self._wanted:
                self._starting += 1
                thread = threading.Thread(
                    target=self._one, args=(self._task,), name="stockade-spare", daemon=True
                )
                self._threads.add(thread)
                thread.start()

    def take(self, policy: Policy, *, task: str | None = None) -> Spare | None:
        """A ready spare of ``policy`` (waiting for one being started), or
        None: the caller starts its own session. Either way the next spare
        starts now, so that it is up by this sample's end, when Inspect starts
        the next sample at once: it runs while this sample's agent waits for
        its model (a cell launched beside a sample's calls, with no model
        time between, slowed them 15-30 ms: docs/PERFORMANCE.md)."""
        stale: list[Spare] = []
        got: Spare | None = None
        with self._cond:
            if task is not None:
                self._task = task  # the next spares are for samples of this task
            while True:
                while self._ready:
                    spare = self._ready.pop(0)
                    if time.monotonic() - spare.started > SPARE_MAX_AGE or spare.policy != policy:
                        stale.append(spare)
                    else:
                        got = spare
                        break
                if got is not None or self._starting == 0 or self._closed:
                    break
                self._cond.wait()
            if got is None and not self._closed:
                # None ready and none starting: the eval runs more samples at
                # once than there are spares. (One that only waited for a
                # spare being started does not ask for more: back to back, with
                # no time between samples, more spares only start more cells
                # beside the sample, and it measured slower, docs/PERFORMANCE.md.)
                self._wanted = min(self._most, self._wanted + 1)
        for spare in stale:
            self._end_later(spare, "it waited past its age or its policy changed")
        self.fill()
        return got

    def close(self) -> None:
        """End every spare, and those still starting once they have (``task_cleanup``)."""
        with self._cond:
            self._closed = True
            ready, self._ready = self._ready, []
            threads = list(self._threads)
        for spare in ready:
            spare.end_unused("the task ended")
        for thread in threads:
            thread.join()

    def _count(self) -> int:
        return len(self._ready) + self._starting

    def _one(self, task: str) -> None:
        spare: Spare | None = None
        try:
            spare = self._start(task)
        except BaseException as exc:  # the sample that starts its own will say why
            with self._cond:
                self.failure = exc
        with self._cond:
            self._starting -= 1
            self._threads.discard(threading.current_thread())
            closed = self._closed
            if spare is not None and not closed:
                self._ready.append(spare)
            self._cond.notify_all()
        if spare is not None and closed:
            spare.end_unused("the task ended")

    def _end_later(self, spare: Spare, why: str) -> None:
        def end() -> None:
            try:
                spare.end_unused(why)
            finally:
                with self._cond:
                    self._threads.discard(threading.current_thread())

        thread = threading.Thread(target=end, name="stockade-spare-end", daemon=True)
        with self._cond:
            self._threads.add(thread)
        thread.start()

    def wait_ready(self, timeout: float) -> bool:
        """Whether a spare is ready, waiting up to ``timeout`` seconds while one starts."""
        with self._cond:
            return self._cond.wait_for(lambda: bool(self._ready) or self._starting == 0, timeout) and bool(
                self._ready
            )

    def stats(self) -> dict[str, Any]:
        with self._cond:
            return {"ready": len(self._ready), "starting": self._starting, "wanted": self._wanted}


class Later:
    """What a sample's end hands on (``SampleHost.finish``'s ``later``), run in
    threads of its own after its ``sample_cleanup`` has returned; ``wait``
    (``task_cleanup``) returns once every one of them has."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._running = 0

    def __call__(self, fn: Callable[[], None]) -> None:
        def run() -> None:
            try:
                with contextlib.suppress(Exception):  # the record is complete without it
                    fn()
            finally:
                with self._cond:
                    self._running -= 1
                    self._cond.notify_all()

        with self._cond:
            self._running += 1
        threading.Thread(target=run, name="stockade-sample-end", daemon=True).start()

    def wait(self, timeout: float | None = None) -> bool:
        """Whether all have ended (within ``timeout`` seconds, if given)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._running == 0, timeout)


__all__ = ["SPARE_MAX_AGE", "Later", "Spare", "SparePool"]
