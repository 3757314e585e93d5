"""Training strategies: one file each, registered by name (see ``strategies/base.py`` for the template)."""
from . import advbct, bct, bct_er, bt2, cores, cvs, dsimplex_fd, dsimplex_hoc, er, fd, lce, lwf, ract, unibct  # noqa: F401  (each registers one)
from .base import (
                   Step,
                   Strategy,
                   StrategyError,
                   TaskContext,
                   get_strategy,
                   list_strategies,
                   register_strategy,
)

__all__ = ["Step", "Strategy", "StrategyError", "TaskContext", "get_strategy", "list_strategies",
           "register_strategy"]
