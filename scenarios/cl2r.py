"""CL2R: sequential fine-tuning along a class-incremental stream from a randomly initialised model (docs/METHODS.md §4).

Every task fine-tunes the previous task's model with the strategy; the compatibility matrix compares each
model's queries with every earlier model's gallery. Replacement tasks are IAM-CL2R's (``scenarios/iamcl2r.py``).
"""
from __future__ import annotations

from cl2r_bench.errors import ConfigError
from cl2r_bench.scenario import Scenario, register_scenario


@register_scenario("cl2r")
class CL2R(Scenario):
    """Sequential fine-tuning from a random model, no replacements."""

    def check_settings(self) -> None:
        if self.settings.replacement.tasks:
            raise ConfigError(f"replacement.tasks = {self.settings.replacement.tasks}: CL2R has no replacements; use "
                              "--scenario iamcl2r")
        super().check_settings()
