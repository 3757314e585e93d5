"""The scenarios: what the run loop does at each task (one file each, registered by name as it is imported: every
module of this folder is, by :func:`cl2r_bench.plugins.import_folder`; the template is in
``cl2r_bench/scenario.py``). The data they run on are :mod:`cl2r_bench.data`'s."""
from cl2r_bench.plugins import import_folder
from cl2r_bench.scenario import Scenario, get_scenario, list_scenarios, register_scenario

import_folder(__name__, __path__, skip=("base",))   # the former import path, kept one release

__all__ = ["Scenario", "get_scenario", "list_scenarios", "register_scenario"]
