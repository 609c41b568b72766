"""stockade as a Harbor environment: ``--env stockade_harbor:StockadeEnvironment``."""

from stockade_harbor._environment import StockadeEnvironment

__all__ = ["StockadeEnvironment"]
