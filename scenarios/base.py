"""The scenario contract's former import path: the template and registry live in the kernel,
:mod:`cl2r_bench.scenario`; plug-ins written as ``from scenarios.base import ...`` still load for one release, with
a FutureWarning naming the new path."""
import warnings

from cl2r_bench.scenario import *  # noqa: F401,F403

warnings.warn("scenarios.base is now cl2r_bench.scenario; import Scenario and register_scenario from there (the old "
              "name goes in the next release)", FutureWarning, stacklevel=2)
