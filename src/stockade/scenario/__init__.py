"""Scenarios: groups of agents started in order, fanned out, restarted, stopped as one (docs/SCENARIOS.md)."""

from stockade.scenario._model import (
    RUN_VARIABLES,
    Agent,
    LaunchWhen,
    Scenario,
    load_scenario,
    loads_scenario,
    run_variables,
)

__all__ = [
    "RUN_VARIABLES",
    "Agent",
    "LaunchWhen",
    "Scenario",
    "load_scenario",
    "loads_scenario",
    "run_variables",
]
