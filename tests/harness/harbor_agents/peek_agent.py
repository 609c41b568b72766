"""A Harbor agent that tries the hidden tests instead of the task (run by
tests/harness/test_harbor.py in Harbor's own Python, 3.12)."""

from __future__ import annotations

import os

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext


class PeekAgent(BaseAgent):
    @staticmethod
    def name() -> str:
        return "peek"

    def version(self) -> str:
        return "1.0.0"

    async def setup(self, environment: BaseEnvironment) -> None:
        return None

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        # Where Harbor puts the tests at grading, then where they lie on the host.
        seen = await environment.exec("cat /tests/test.sh; ls -la /tests/")
        host_tests = os.environ["PEEK_HOST_TESTS"]
        await environment.exec(f"cat {host_tests}/test.sh")
        # What it could get from them: nothing; it writes what it guessed.
        await environment.exec(f"echo {len(seen.stdout or '')} > /app/greeting.txt")


class ReachAgent(BaseAgent):
    """Does the task, and reaches for a host off the task's allow list."""

    @staticmethod
    def name() -> str:
        return "reach"

    def version(self) -> str:
        return "1.0.0"

    async def setup(self, environment: BaseEnvironment) -> None:
        return None

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        await environment.exec(
            "curl -sS -m 20 -o /dev/null https://off-the-list.example/ 2> /app/curl.err || true"
        )
        await environment.exec(
            "echo 'hello from a cell' > /app/greeting.txt && wc -l < /etc/os-release > /app/count.txt"
        )
