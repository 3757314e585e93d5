"""A plug-in strategy for the SLURM time-limit tests and the lock test (``helpers/runs.py waiting_config``): BCT
whose every task first waits ``seconds``, so a task lasts as long on a loaded machine as on an idle one, without a
calibration run, and costs no CPU meanwhile."""
import time
from dataclasses import dataclass

from cl2r_bench.strategy import TaskContext, register_strategy
from strategies.bct import BCT, BCTConfig


@dataclass(frozen=True)
class WaitingConfig(BCTConfig):
    seconds: float = 0.0


@register_strategy("waiting_bct")
class WaitingBCT(BCT):
    Config = WaitingConfig

    def before_task(self, context: TaskContext) -> None:
        time.sleep(self.config.seconds)
        super().before_task(context)
