"""Training strategies: one file each, registered by name (see ``strategies/base.py`` for the template)."""
from .base import Step, Strategy, StrategyError, get_strategy, list_strategies, register_strategy
from . import dsimplex_hoc, er  # noqa: F401  (each module registers its strategy)

__all__ = ["Step", "Strategy", "StrategyError", "get_strategy", "list_strategies", "register_strategy"]
