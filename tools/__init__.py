"""The developers' scripts, outside the installed package: benchmarks (``bench_*``), the studies behind
``results/`` and the parity harness (``parity/``). Run them from the repository root: ``python -m tools.<name>``."""
