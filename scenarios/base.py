"""The scenario contract's former import path: the template and registry live in the kernel,
:mod:`cl2r_bench.scenario`; plug-ins written as ``from scenarios.base import ...`` still load."""
from cl2r_bench.scenario import *  # noqa: F401,F403
