"""Sweeps: many runs of a grid, each an ordinary resumable run in its own process.

Every grid point is resolved and validated before anything starts (a bad setting anywhere is one line and exit
2). A point whose run folder holds a complete ``metrics.json`` is skipped, one with a run state is resumed, the
others start fresh, so a second sweep over the same folder runs only what is missing or was interrupted. Each job
runs ``python -m cl2r_bench run --config <job file>`` where the job file is the point's resolved config
(``<output>/sweep/jobs/``), and a progress line says how many are done, running, failed and waiting. The ``local``
launcher runs ``jobs`` of them at a time, one GPU each when there are several (``CUDA_VISIBLE_DEVICES``), their
output in ``<output>/sweep/logs/``; the ``slurm`` launcher submits them as one SLURM job array
(:mod:`cl2r_bench.app.slurm`).

``--set KEY=[v1,v2,...]`` is a grid dimension when the setting does not hold a list itself (:func:`set_grid`); the
points of such a grid differ in a setting that does not name the run folder, so each gets its own results folder
``<output>/KEY=v1/``, and two points that would still share a run folder are refused (:func:`plan`).

This module imports no training or scenario code (the runs are assembled through
:func:`cl2r_bench.app.run_options.requested_runs`, which imports them when called), so that a SLURM array task
unpickling a :class:`Job` starts without them.
"""
from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from benchmarks.record import holds_complete_record
from cl2r_bench.app.run_options import GRID_OPTIONS, requested_output, requested_runs
from cl2r_bench.app.stops import STOP_SIGNALS, exit_code, stop_handlers, stop_name
from cl2r_bench.config import CONFIG_DIR, EXTRA_TYPES, FLOAT_TEXT, differing, flatten, parse_assignment, read_yaml
from cl2r_bench.errors import ConfigError, safe_name
from cl2r_bench.files import atomic_write_text
from cl2r_bench.threads import cores_per_run, thread_environment

if TYPE_CHECKING:
    from cl2r_bench.app.assembly import Assembly

LAUNCHERS = ("local", "slurm")
UNSAFE = re.compile(r"[^A-Za-z0-9_.+=,-]")


@dataclass
class Job:
    """One grid point: its run folder, name and the files the sweep keeps for it (its resolved config as a job file,
    its output)."""

    directory: Path
    name: str
    job_file: Path
    log_file: Path

    def status(self) -> str:
        """``complete`` (a record the leaderboard accepts: the same check, :func:`benchmarks.record.read_record`),
        ``partial`` (a run state to resume) or ``new``."""
        if holds_complete_record(self.directory):
            return "complete"
        return "partial" if (self.directory / "state.pt").exists() else "new"

    def command(self) -> list[str]:
        """The run command of the job, with ``--resume`` when its folder holds an interrupted run (asked when the
        job starts, so that a job started again after a failure or a preemption resumes)."""
        resume = ["--resume"] if self.status() == "partial" else []
        return [sys.executable, "-m", "cl2r_bench", "run", "--config", str(self.job_file), "--no-progress", *resume]


def list_settings() -> set[str]:
    """The settings that hold a list themselves: those whose default in ``configs/default.yaml`` is a list (the
    profiles cannot change a setting's type) and those that also accept one (``stream.class_order``). For them a
    sweep's ``--set KEY=[...]`` is one value, not a grid dimension."""
    defaults = flatten(read_yaml(CONFIG_DIR / "default.yaml"))
    return ({key for key, value in defaults.items() if isinstance(value, list)}
            | {key for key, types in EXTRA_TYPES.items() if list in types})


def set_grid(assignments: list[str], lists: set[str]) -> list[tuple[list[str], str]]:
    """The points of a sweep's ``--set`` options: each ``KEY=[v1,v2,...]`` whose setting is not in
    ``lists`` (:func:`list_settings`) is a grid dimension, the others are the same at every point. Returns, per
    point of the product, its ``--set`` assignments and the name of its results folder under ``--output``
    (``KEY=v1,KEY2=w1``, characters a folder name cannot hold written ``-``; ``""`` without a grid)."""
    choices = [_choices(text, lists) for text in assignments]
    keys = [text.split("=", 1)[0].strip() for text in assignments]
    for key, options in zip(keys, choices, strict=True):
        if options[0][1] and keys.count(key) > 1:
            raise ConfigError(f"--set {key} is given {keys.count(key)} times and one of them is a grid; the last "
                              "would silently replace the grid at every point: give it once")
    points = []
    for chosen in itertools.product(*choices):
        folder = ",".join(name for _, name in chosen if name)
        if folder:
            safe_name(folder, "the folder of the --set grid point")
        points.append(([assignment for assignment, _ in chosen], folder))
    return points


def _choices(text: str, lists: set[str]) -> list[tuple[str, str]]:
    """One ``--set`` option's alternatives: ``(assignment, folder name)`` per value of a grid dimension, else the
    option itself with no folder name."""
    key = text.split("=", 1)[0].strip()
    value = functools.reduce(lambda mapping, part: mapping[part], key.split("."), parse_assignment(text))
    if not isinstance(value, list) or key in lists:
        return [(text, "")]
    if key == "output":
        raise ConfigError(f"--set {text}: a sweep has one results folder (--output); the points of a --set grid get "
                          "their own folders under it")
    if not value:
        raise ConfigError(f"--set {text}: a grid dimension needs at least one value")
    numbers = [float(v) if isinstance(v, str) and FLOAT_TEXT.fullmatch(v.strip()) else v for v in value]
    repeated = [v for i, v in enumerate(numbers) if v in numbers[:i]]
    if repeated:
        raise ConfigError(f"--set {text}: the value {repeated[0]!r} is given twice (as the settings read it); give "
                          "each value of a grid dimension once")
    return [(f"{key}={json.dumps(v)}", UNSAFE.sub("-", f"{key}={v if isinstance(v, str) else json.dumps(v)}"))
            for v in value]


def grid_runs(args: argparse.Namespace) -> tuple[list[Assembly], Path]:
    """The assembled runs of every point of a sweep (the grid options times the ``--set`` grid) and the sweep's
    results folder; the points of a ``--set`` grid get their own folders under it (:func:`set_grid`), since the
    setting they differ in does not name their run folders."""
    lists = list_settings()
    planned = math.prod(len(_choices(text, lists)) for text in args.set) * len(args.seeds or [None]) * math.prod(
        len(getattr(args, name) or [None]) for name in GRID_OPTIONS)
    if planned > args.max_runs:
        raise ConfigError(f"the sweep asks for {planned} runs (before 'all' expands), more than --max-runs "
                          f"{args.max_runs}; narrow the grid, or pass --max-runs {planned} if you mean it")
    points = set_grid(args.set, lists)
    output, runs = None, []
    for values in itertools.product(*((getattr(args, name) or [None]) for name in GRID_OPTIONS)):
        for assignments, folder in points:
            grid = dict(zip(GRID_OPTIONS, values, strict=True))
            point = argparse.Namespace(**{**vars(args), **grid, "set": assignments})
            if folder:
                output = output or Path(requested_output(point))
                point.output = str(output / folder)
            runs += requested_runs(point)
    return runs, output or Path(runs[0].settings.output)


def plan(runs: list[Assembly], folder: Path) -> list[Job]:
    """The jobs of a grid of assembled runs, one per distinct run folder, with their job files written under the
    sweep's ``folder`` (``<output>/sweep``). Points with the same resolved config are one job; points whose configs
    differ but whose run folders are the same are a :class:`ConfigError` naming what differs, since only one of
    them could be run and recorded there."""
    jobs = []
    for run in distinct_runs(runs):
        name = "-".join(run.directory.relative_to(folder.parent).parts)
        job = Job(run.directory, name, folder / "jobs" / f"{name}.yaml", folder / "logs" / f"{name}.log")
        atomic_write_text(job.job_file, yaml.safe_dump(run.config, sort_keys=False))
        jobs.append(job)
    return jobs


def distinct_runs(runs: list[Assembly]) -> list[Assembly]:
    """One run per run folder: runs with the same resolved config are one, and runs whose configs differ but whose
    folders are the same are a :class:`ConfigError` naming what differs (only one of them could be recorded there;
    e.g. ``--adapter all --set adapter.label=x``), raised before anything runs."""
    first: dict[Path, Assembly] = {}
    for run in runs:
        if run.directory in first:
            _same_point(first[run.directory], run)
        else:
            first[run.directory] = run
    return list(first.values())


def _same_point(one: Assembly, other: Assembly) -> None:
    flat, other_flat = flatten(one.config), flatten(other.config)
    differ = differing(flat, other_flat)
    if differ:
        shown = "; ".join(f"{k}={flat.get(k)!r} and {k}={other_flat.get(k)!r}" for k in differ[:3])
        raise ConfigError(f"two runs asked for would share the run folder {one.directory}: {shown}"
                          f"{'; ...' if len(differ) > 3 else ''}; give them their own folders (separate sweeps with "
                          "--output, or a setting that names the folder, such as adapter.label)")


def gpu_slots(jobs: int) -> list[str | None]:
    """The ``CUDA_VISIBLE_DEVICES`` of each of ``jobs`` slots: one GPU each, round robin, when there are several."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return [str(slot % count) if count > 1 else None for slot in range(jobs)]


def progress(done: int, running: int, failed: int, waiting: int) -> str:
    """The progress line of a sweep, the same for every launcher."""
    return f"sweep: {done} done, {running} running, {failed} failed, {waiting} waiting"


def run_local(jobs: list[Job], *, parallel: int, log: Callable[[str], None] = print, poll: float = 0.5) -> int:
    """Run the jobs that are not complete, ``parallel`` at a time; returns 0 when every job is complete, else 1
    (the failed jobs and their logs are named). Ctrl-C, ``kill -INT`` or ``kill -TERM`` of the sweep
    (:mod:`cl2r_bench.app.stops`: handled whatever the sweep inherited) send SIGTERM to its running runs, which handle
    it themselves, keep their finished tasks and stop; the sweep waits for them and exits with 130 (143 for
    SIGTERM) after one line, so no run is left training as an orphan and the same command resumes."""
    running: dict[int, tuple[Job, subprocess.Popen, Any]] = {}
    try:
        with stop_handlers():
            return _run_pool(jobs, running, parallel=parallel, log=log, poll=poll)
    except KeyboardInterrupt as stop:
        return _stop_runs(running, stop)


def _stop_runs(running: dict[int, tuple[Job, subprocess.Popen, Any]], stop: BaseException) -> int:
    """Send SIGTERM to the running runs, wait up to :data:`STOP_GRACE_SECONDS` for them (then kill them), say so in
    one line, and return the sweep's exit code; a second signal meanwhile is ignored."""
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in STOP_SIGNALS}
    try:
        for _job, process, _handle in running.values():
            process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for _job, process, handle in running.values():
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            handle.close()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    print(f"\nsweep stopped ({stop_name(stop)}): {len(running)} running run(s) stopped, their finished tasks "
          "kept; the same sweep command resumes them", file=sys.stderr)
    return exit_code(stop)


STOP_GRACE_SECONDS = 60.0
"""How long a stopped sweep waits for its runs to stop after SIGTERM before killing them. The runs are in
sessions of their own, so a terminal's Ctrl-C reaches them once, through the sweep."""


def _run_pool(jobs: list[Job], running: dict[int, tuple[Job, subprocess.Popen, Any]], *, parallel: int,
              log: Callable[[str], None], poll: float) -> int:
    waiting = [job for job in jobs if job.status() != "complete"]
    done = len(jobs) - len(waiting)
    log(f"sweep: {len(jobs)} runs, {done} already complete, {len(waiting)} to run, {parallel} at a time")
    slots = gpu_slots(parallel)
    threads = thread_environment(cores_per_run(parallel))
    failed: list[tuple[Job, int]] = []
    last = None
    while waiting or running:
        for slot in range(parallel):
            if slot not in running and waiting:
                job = waiting.pop(0)
                job.log_file.parent.mkdir(parents=True, exist_ok=True)
                handle = open(job.log_file, "a")
                env = dict(os.environ, **threads,
                           **({"CUDA_VISIBLE_DEVICES": slots[slot]} if slots[slot] is not None else {}))
                running[slot] = (job, subprocess.Popen(job.command(), stdout=handle, stderr=subprocess.STDOUT,
                                                       env=env, start_new_session=True), handle)
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
        line = progress(done, len(running), len(failed), len(waiting))
        if line != last:
            log(line)
            last = line
        time.sleep(poll if running else 0)
    for job, code in failed:
        log(f"failed: {job.name} (exit code {code}); see {job.log_file}; the same sweep command resumes it")
    return 1 if failed else 0
