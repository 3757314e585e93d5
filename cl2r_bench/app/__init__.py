"""The application: the suite's commands (:mod:`~cl2r_bench.app.cli`, with their options in
:mod:`~cl2r_bench.app.arguments`), their launchers (sweeps, SLURM, the embedding and adapter-study commands), the one
run loop and the assembly of a run from its config. Everything here sits above the kernel of ``cl2r_bench`` (the
contracts, settings, data, models, training, adapters and encoders) and above the users' ``scenarios``,
``strategies`` and ``benchmarks``; nothing below imports it (docs/layout.md)."""
