"""``stockade demo``: an agent whose model was prompt-injected tries to get out of its cell.

``run_agent_demo`` runs ``agent.py`` (an OpenAI tool loop, standard library
only) in a cell under an in-process daemon, inside a network namespace of the
demo's own (``_world``), with ``stockade mock-llm``'s ``injected`` model (or a
real endpoint); it pairs each of the agent's tool calls with the verdicts the
record holds for it and builds a ``DemoReport``. ``stockade.cli._demo``
renders it. docs/DEMO.md explains every attempt.
"""

from stockade.demo._agent_runner import DemoOptions, run_agent_demo
from stockade.demo._attempts import EXPECTED, Planned, catalogue
from stockade.demo._report import Call, DemoReport

__all__ = ["EXPECTED", "Call", "DemoOptions", "DemoReport", "Planned", "catalogue", "run_agent_demo"]
