"""``runner.py sweep``: a grid of runs, one process per run, here or as a SLURM array (:mod:`cl2r_bench.app.sweep`,
:mod:`cl2r_bench.app.slurm`)."""
from __future__ import annotations

import argparse

from cl2r_bench.errors import UsageError, writable_folder


def command_sweep(args: argparse.Namespace) -> int:
    """Resolve every point of the grid (all bad input fails here, and with ``--launcher slurm`` a cluster that
    cannot take the jobs), then run what is not complete (:mod:`cl2r_bench.app.sweep`, :mod:`cl2r_bench.app.slurm`)."""
    from cl2r_bench.app.sweep import grid_runs, plan, run_local

    if args.seed is not None:
        raise UsageError("a sweep takes its seeds with --seeds K1 K2 ...")
    if args.launcher == "slurm":
        from cl2r_bench.app.slurm import check_cluster

        check_cluster(args)
    runs, output = grid_runs(args)
    writable_folder(output / "sweep", "the sweep's folder (inside --output)")
    jobs = plan(runs, output / "sweep")
    if args.launcher == "slurm":
        from cl2r_bench.app.slurm import run_slurm

        return run_slurm(jobs, args, output / "sweep" / "slurm")
    return run_local(jobs, parallel=args.jobs)
