"""cl2r-bench: compatible representation learning benchmarks (CL2R, IAM-CL2R, model update).

The suite's own parts live here; the users' parts are the top-level packages ``scenarios``, ``strategies`` and
``benchmarks``. The layout is described in the README (Layout).
"""
__version__ = "0.2.0"
