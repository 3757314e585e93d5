"""Training strategies: one file each, registered by name (see ``strategies/base.py`` for the template)."""
import dataclasses
from typing import Any

from .base import (Step, Strategy, StrategyError, TaskContext, get_strategy, list_strategies, load_plugin,
                   register_strategy)
from . import bct, bct_er, cores, cvs, dsimplex_fd, dsimplex_hoc, er, fd, lwf  # noqa: F401  (each registers one)


def strategy_parameters(name: str, strategy_params: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every parameter of strategy ``name`` given ``strategy_params`` (the config's), defaults included: those of
    the strategy's ``Config`` dataclass, or of the Avalanche class's constructor for ``avalanche:<Class>``. Unknown
    names and invalid parameters raise a one-line :class:`StrategyError`."""
    from .avalanche import check_params, is_avalanche_strategy

    params = strategy_params.get(name, {})
    if is_avalanche_strategy(name):
        return check_params(name, params)
    return dataclasses.asdict(get_strategy(name).from_params(params).config)

__all__ = ["Step", "Strategy", "StrategyError", "TaskContext", "get_strategy", "list_strategies", "load_plugin",
           "register_strategy", "strategy_parameters"]
