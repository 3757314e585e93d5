"""User commands shipped with the package: ``python -m cl2r_bench.tools.convert_efficientnet_lite``."""
