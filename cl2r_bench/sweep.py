"""Sweeps: many runs of a grid, each an ordinary resumable run in its own process (issue 18).

Every grid point is resolved and validated before anything starts (a bad setting anywhere is one line and exit
2). A point whose run folder holds a complete ``metrics.json`` is skipped, one with a run state is resumed, the
others start fresh, so a second sweep over the same folder runs only what is missing or was interrupted. Each job
runs ``python -m cl2r_bench run --config <job file>`` where the job file is the point's resolved config
(``<output>/sweep/jobs/``), its output goes to ``<output>/sweep/logs/``, and a progress line says how many are
done, running, failed and waiting. The ``local`` launcher runs ``jobs`` of them at a time, one GPU each when there
are several (``CUDA_VISIBLE_DEVICES``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from benchmarks.records import atomic_write_text
from cl2r_bench.assembly import Assembly

LAUNCHERS = ("local",)


@dataclass
class Job:
    """One grid point: its run folder, name and the files the sweep keeps for it (its resolved config as a job file,
    its output)."""

    directory: Path
    name: str
    job_file: Path
    log_file: Path

    def status(self) -> str:
        """``complete``, ``partial`` (a run state to resume) or ``new``."""
        try:
            if json.loads((self.directory / "metrics.json").read_text()).get("complete") is True:
                return "complete"
        except (OSError, ValueError, AttributeError):
            pass
        return "partial" if (self.directory / "state.pt").exists() else "new"

    def command(self) -> list[str]:
        resume = ["--resume"] if self.status() == "partial" else []
        return [sys.executable, "-m", "cl2r_bench", "run", "--config", str(self.job_file), "--no-progress", *resume]


def plan(runs: list[Assembly]) -> list[Job]:
    """The jobs of a grid of assembled runs, one per distinct run folder, with their job files written."""
    jobs: dict[Path, Job] = {}
    for run in runs:
        if run.directory in jobs:
            continue
        name = "-".join(run.directory.parts[-4:])
        sweep = Path(run.settings.output) / "sweep"
        job = Job(run.directory, name, sweep / "jobs" / f"{name}.yaml", sweep / "logs" / f"{name}.log")
        atomic_write_text(job.job_file, yaml.safe_dump(run.config, sort_keys=False))
        jobs[run.directory] = job
    return list(jobs.values())


def gpu_slots(jobs: int) -> list[str | None]:
    """The ``CUDA_VISIBLE_DEVICES`` of each of ``jobs`` slots: one GPU each, round robin, when there are several."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return [str(slot % count) if count > 1 else None for slot in range(jobs)]


def run_local(jobs: list[Job], *, parallel: int, log: Callable[[str], None] = print, poll: float = 0.5) -> int:
    """Run the jobs that are not complete, ``parallel`` at a time; returns 0 when every job is complete, else 1
    (the failed jobs and their logs are named)."""
    waiting = [job for job in jobs if job.status() != "complete"]
    done = len(jobs) - len(waiting)
    log(f"sweep: {len(jobs)} runs, {done} already complete, {len(waiting)} to run, {parallel} at a time")
    slots = gpu_slots(parallel)
    running: dict[int, tuple[Job, subprocess.Popen, Any]] = {}
    failed: list[tuple[Job, int]] = []
    last = None
    while waiting or running:
        for slot in range(parallel):
            if slot not in running and waiting:
                job = waiting.pop(0)
                job.log_file.parent.mkdir(parents=True, exist_ok=True)
                handle = open(job.log_file, "a")
                env = dict(os.environ, **({"CUDA_VISIBLE_DEVICES": slots[slot]} if slots[slot] is not None else {}))
                running[slot] = (job, subprocess.Popen(job.command(), stdout=handle, stderr=subprocess.STDOUT,
                                                       env=env), handle)
        for slot, (job, process, handle) in list(running.items()):
            code = process.poll()
            if code is None:
                continue
            handle.close()
            del running[slot]
            if code == 0 and job.status() == "complete":
                done += 1
            else:
                failed.append((job, code))
        line = f"sweep: {done} done, {len(running)} running, {len(failed)} failed, {len(waiting)} waiting"
        if line != last:
            log(line)
            last = line
        time.sleep(poll if running else 0)
    for job, code in failed:
        log(f"failed: {job.name} (exit code {code}); see {job.log_file}; the same sweep command resumes it")
    return 1 if failed else 0
