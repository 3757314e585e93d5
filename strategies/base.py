"""The strategy contract's former import path: the template and registry live in the kernel,
:mod:`cl2r_bench.strategy`; plug-ins written as ``from strategies.base import ...`` still load."""
from cl2r_bench.strategy import *  # noqa: F401,F403
