"""How many threads a run computes with (docs/scale-out.md, "Sweeps on SLURM").

torch's default is every core of the machine, so runs that share the cores (a local sweep's, or SLURM jobs on a
node that does not bind jobs to their CPUs) each used them all and waited on each other: two runs on 2 cores trained
10 times slower with 2 threads each than with 1. Each run is therefore given its share through ``OMP_NUM_THREADS``,
which torch and numba read when they start, and a value the user set is always kept.
"""
from __future__ import annotations

import os
from collections.abc import Mapping


def thread_environment(threads: int) -> dict[str, str]:
    """``OMP_NUM_THREADS`` for a run given ``threads`` cores, unless the user set it: what a sweep's launchers
    (local, SLURM) start each run with."""
    return {} if "OMP_NUM_THREADS" in os.environ else {"OMP_NUM_THREADS": str(threads)}


def cores_per_run(parallel: int) -> int:
    """Each of ``parallel`` local runs' share of the cores this process may use (all cores where the system keeps
    no affinity, as on macOS), at least one."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, usable // parallel)


def slurm_job_threads(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """``OMP_NUM_THREADS`` for a run inside a SLURM job that the user started with ``--cpus-per-task`` (their own
    ``srun`` or batch script; a sweep sets its runs' threads itself), unless they set it: the job's CPUs, from
    ``SLURM_CPUS_PER_TASK``."""
    cpus = environ.get("SLURM_CPUS_PER_TASK", "")
    if "OMP_NUM_THREADS" in environ or not cpus.isdigit() or int(cpus) < 1:
        return {}
    return {"OMP_NUM_THREADS": str(int(cpus))}
