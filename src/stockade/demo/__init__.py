"""``stockade demo``: a scripted rogue program tries to get out of its cell.

``run_demo`` runs ``rogue.py`` (a standalone script for the system's python3)
in a cell of the default policy and pairs each of its attempts with the
kernel's record of the refusal; ``stockade.cli._demo`` renders the result.
docs/DEMO.md explains every attempt.
"""

from stockade.demo._runner import Canary, DemoReport, DemoSetup, run_demo
from stockade.demo._verdict import EXPECTED, Attempt, classify

__all__ = ["EXPECTED", "Attempt", "Canary", "DemoReport", "DemoSetup", "classify", "run_demo"]
