"""cl2r-bench: compatible representation learning benchmarks (CL2R, IAM-CL2R, model update).

The suite's own parts live here; the users' parts are the top-level packages ``scenarios``, ``strategies`` and
``benchmarks``. The layout is described in the README (Layout).
"""
from importlib import metadata

try:
    __version__: str | None = metadata.version("cl2r-bench")
except metadata.PackageNotFoundError:
    __version__ = None
