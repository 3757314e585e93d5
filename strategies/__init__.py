"""Training strategies: one file each, registered by name as it is imported (every module of this folder is, by
:func:`cl2r_bench.plugins.import_folder`; the template is ``cl2r_bench/strategy.py``)."""
from cl2r_bench.plugins import import_folder
from cl2r_bench.strategy import (
                   Step,
                   Strategy,
                   StrategyError,
                   TaskContext,
                   get_strategy,
                   list_strategies,
                   register_strategy,
)

import_folder(__name__, __path__, skip=("base", "old_classes"))   # former import paths, kept one release

__all__ = ["Step", "Strategy", "StrategyError", "TaskContext", "get_strategy", "list_strategies",
           "register_strategy"]
