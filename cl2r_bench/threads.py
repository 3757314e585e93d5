"""How many threads a run computes with (docs/scale-out.md, "Sweeps on SLURM").

torch's default is every core the process may use, so runs that share the cores (a local sweep's, or SLURM jobs on
a node that does not bind jobs to their CPUs) each used them all and waited on each other: two runs on 2 cores
trained 10 times slower with 2 threads each than with 1. Each run is therefore given its share, and a thread count
the user set (``OMP_NUM_THREADS``) is always kept.
"""
from __future__ import annotations

import os
from collections.abc import Mapping


def set_by_user(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the user chose the thread count (``OMP_NUM_THREADS``): then no launcher or command changes it."""
    return "OMP_NUM_THREADS" in environ


def slurm_cpus(environ: Mapping[str, str] = os.environ) -> int | None:
    """The CPUs of the SLURM job this process runs in (``--cpus-per-task``), or None outside one or where the job
    names none."""
    cpus = environ.get("SLURM_CPUS_PER_TASK", "")
    return int(cpus) if cpus.isdigit() and int(cpus) > 0 else None


def usable_cores() -> int:
    """The cores this process may use: its SLURM job's CPUs, else its affinity's (all cores where the system keeps
    no affinity, as on macOS)."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return slurm_cpus() or affinity


def cores_per_run(parallel: int) -> int:
    """Each of ``parallel`` local runs' share of :func:`usable_cores`, at least one."""
    return max(1, usable_cores() // parallel)


def thread_environment(threads: int) -> dict[str, str]:
    """``OMP_NUM_THREADS`` for a run the suite starts given ``threads`` cores (a sweep's, local or on SLURM), unless
    the user set it; torch reads it when it starts (and numba's kernels follow torch's count:
    :func:`benchmarks.ranking.numba_threads_as_torch`)."""
    return {} if set_by_user() else {"OMP_NUM_THREADS": str(threads)}


def own_threads(environ: Mapping[str, str] = os.environ) -> int | None:
    """The threads a command that computes in this process takes when the user started it in a SLURM job of their
    own (``srun --cpus-per-task N``, a batch script): the job's CPUs, unless the user set ``OMP_NUM_THREADS``; None
    keeps torch's default, which follows the process's affinity (SLURM's ``task/affinity``, ``task/cgroup``)."""
    return None if set_by_user(environ) else slurm_cpus(environ)
