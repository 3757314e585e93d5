"""The strategy contract's former import path: the template and registry live in the kernel,
:mod:`cl2r_bench.strategy`; plug-ins written as ``from strategies.base import ...`` still load for one release, with
a FutureWarning naming the new path."""
import warnings

from cl2r_bench.strategy import *  # noqa: F401,F403

warnings.warn("strategies.base is now cl2r_bench.strategy; import Strategy, Step and register_strategy from there "
              "(the old name goes in the next release)", FutureWarning, stacklevel=2)
