"""The scenarios: what the run loop does at each task (one file each, registered by name; the template is in
``cl2r_bench/scenario.py``). The data they run on are :mod:`cl2r_bench.data`'s."""
from cl2r_bench.scenario import Scenario, get_scenario, list_scenarios, register_scenario

from . import cl2r, iamcl2r, model_update, upgrade  # noqa: F401  (each registers one)

__all__ = ["Scenario", "get_scenario", "list_scenarios", "register_scenario"]
