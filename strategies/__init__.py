"""Training strategies: one file each, registered by name (see ``cl2r_bench/strategy.py`` for the template)."""
from cl2r_bench.strategy import (
                   Step,
                   Strategy,
                   StrategyError,
                   TaskContext,
                   get_strategy,
                   list_strategies,
                   register_strategy,
)

from . import advbct, bct, bct_er, bt2, cores, cvs, dsimplex_fd, dsimplex_hoc, er, fd, lce, lwf, ract, unibct  # noqa: F401  (each registers one)

__all__ = ["Step", "Strategy", "StrategyError", "TaskContext", "get_strategy", "list_strategies",
           "register_strategy"]
