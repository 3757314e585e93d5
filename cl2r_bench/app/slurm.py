"""The sweep's SLURM launcher (``runner.py sweep --launcher slurm``), through submitit.

The jobs of a sweep that are not complete go to the cluster as one job array; each array task runs the same run
command as the local launcher (:meth:`cl2r_bench.app.sweep.Job.command`, asked when the task starts), so every job is an
ordinary resumable run folder: a task that SLURM starts again (a preemption, or its time limit: submitit requeues
it, :meth:`ArrayTask.checkpoint`) resumes after the run's last finished task. submitit's files and the tasks' logs
are in ``<output>/sweep/slurm/``.

The jobs are followed with ``squeue``, not submitit's ``result()``: without SLURM accounting a cancelled job never
counts as done for submitit. A job that has left the queue (or ended) is done when its run folder is complete,
else failed. The ids of submitted jobs are kept in ``<output>/sweep/slurm/submitted.json``, so that the same sweep
command later follows the jobs still queued or running instead of submitting them again, and submits only what is
missing.

Every problem that stops a submission (submitit missing, no ``sbatch`` or ``srun``, a controller that does not
answer, an unknown partition, sbatch refusing the options) is one :class:`cl2r_bench.errors.UsageError` before anything
is submitted, and so is a job that could never start: ``sbatch --test-only`` with the jobs' resources must accept
it, and ``--time`` must fit the partition's time limit (SLURM would queue such jobs and leave them pending for
ever, with the reason ``PartitionConfig`` or ``PartitionTimeLimit``); the line says what each job asks and what the
partition offers. While jobs wait, the progress line shows SLURM's pending reasons.
"""
from __future__ import annotations

import argparse
import contextlib
import getpass
import io
import json
import math
import os
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from cl2r_bench.app.sweep import Job, progress
from cl2r_bench.errors import UsageError
from cl2r_bench.files import atomic_write_text
from cl2r_bench.limits import number
from cl2r_bench.threads import thread_environment

JOB_NAME = "cl2r-sweep"
RUNNING = {"RUNNING", "COMPLETING", "CONFIGURING", "SIGNALING", "STAGE_OUT"}
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
ANSWER_SECONDS = 30
QUEUE_PATIENCE_SECONDS = 600
MEMORY_GB_MAX = 2**20
"""The most memory a job may ask for, in GB (``--mem-per-job``): a pebibyte, more than any node holds."""


def add_slurm_options(parser: argparse.ArgumentParser) -> None:
    """The sweep's options for ``--launcher slurm``; every job of the array gets the same resources."""
    group = parser.add_argument_group("SLURM (--launcher slurm; needs pip install submitit)")
    group.add_argument("--partition", help="SLURM partition (default: the cluster's default partition)")
    group.add_argument("--time", type=number(int, at_least=1), default=180, metavar="MINUTES",
                       help="time limit of each job (default %(default)s); a job that reaches it is requeued (up to "
                       "--requeues times) and resumes after its last finished task")
    group.add_argument("--requeues", type=number(int, at_least=0), default=3, metavar="N",
                       help="how many times a job that reaches its time limit is requeued (default %(default)s, "
                       "submitit's); a run longer than (N + 1) x --time needs more")
    group.add_argument("--gpus-per-job", type=number(int, at_least=0), default=1, metavar="N",
                       help="GPUs of each job (default %(default)s; 0 on a cluster without GPUs)")
    group.add_argument("--cpus-per-job", type=number(int, at_least=1), default=4, metavar="N",
                       help="CPU cores of each job (default %(default)s)")
    group.add_argument("--mem-per-job", type=number(float, above=0, at_most=MEMORY_GB_MAX), default=16, metavar="GB",
                       help="memory of each job in GB (default %(default)s)")
    group.add_argument("--array-parallelism", type=number(int, at_least=1), default=32, metavar="N",
                       help="jobs of the array running at a time (default %(default)s)")
    group.add_argument("--slurm-extra", action="append", default=[], metavar="KEY=VALUE",
                       help="another sbatch option, e.g. --slurm-extra account=myproject --slurm-extra qos=high "
                       "(repeatable)")
    group.add_argument("--no-wait", action="store_true",
                       help="submit and return; the same sweep command later follows the jobs still queued and "
                       "submits again what is missing")


def check_cluster(args: argparse.Namespace) -> None:
    """Refuse, with one line, a SLURM sweep that cannot be submitted: bad option values, submitit missing, no
    ``sbatch`` or ``srun`` (submitit runs each task with it), a controller that does not answer, an unknown
    partition. Called before any file is written."""
    sbatch_parameters(args)
    try:
        import submitit  # noqa: F401
    except ImportError:
        raise UsageError('--launcher slurm needs submitit: pip install submitit (or pip install -e ".[slurm]")') \
            from None
    missing = [command for command in ("sbatch", "srun") if shutil.which(command) is None]
    if missing:
        raise UsageError(f"--launcher slurm: no {' or '.join(missing)} on PATH, so SLURM is not reachable from this "
                         "machine; run the sweep where jobs are submitted (a login node), or use --launcher local")
    limits = partition_time_limits()
    if args.partition is not None and args.partition not in limits:
        raise UsageError(f"SLURM partition {args.partition!r} does not exist; partitions here: "
                         f"{', '.join(limits) or 'none'}")
    check_startable(args, limits)


def partition_time_limits() -> dict[str, float | None]:
    """Each partition's time limit in minutes (``math.inf`` without one, None when sinfo does not say); the
    default partition is listed first."""
    rows = [line.split() for line in _ask("sinfo", "-h", "-o", "%P %l").splitlines() if line.strip()]
    rows.sort(key=lambda fields: not fields[0].endswith("*"))
    limits: dict[str, float | None] = {}
    for name, *limit in rows:
        limits.setdefault(name.rstrip("*"), slurm_minutes(limit[0]) if limit else None)
    return limits


def slurm_minutes(text: str) -> float | None:
    """SLURM's time format (``infinite``, ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM[:SS]``) in minutes;
    None for anything else."""
    if text in ("infinite", "UNLIMITED"):
        return math.inf
    days, dash, clock = text.rpartition("-") if "-" in text else ("0", "", text)
    try:
        parts = [int(part) for part in clock.split(":")]
        day_count = int(days)
    except ValueError:
        return None
    if len(parts) > 3:
        return None
    if dash:  # D-HH[:MM[:SS]]
        hours, minutes, seconds = (parts + [0, 0])[:3]
    else:  # MM, MM:SS or HH:MM:SS
        hours, minutes, seconds = ([0] * (3 - len(parts)) + parts) if len(parts) > 1 else (0, parts[0], 0)
    return day_count * 1440 + hours * 60 + minutes + seconds / 60


def check_startable(args: argparse.Namespace, limits: dict[str, float | None]) -> None:
    """Refuse jobs that SLURM would queue but never start: ``--time`` above the partition's limit, or resources no
    node of the partition has (``sbatch --test-only`` with the jobs' own options refuses them)."""
    partition = args.partition if args.partition is not None else next(iter(limits), None)
    limit = limits.get(partition)
    if limit is not None and args.time > limit:
        raise UsageError(f"each job asks --time {args.time} minutes but partition {partition!r} allows at most "
                         f"{limit:g}; lower --time (a job at its limit is requeued and resumes) or pick another "
                         "--partition")
    test = _call("sbatch", "--test-only", *sbatch_flags(sbatch_parameters(args)), "--wrap", "true")
    if test.returncode != 0:
        said = " ".join(line.strip() for line in test.stderr.splitlines() if line.strip()) or \
            f"exit code {test.returncode}"
        raise UsageError(f"SLURM would never start the sweep's jobs: each asks {asked(args)}"
                         f"{f' on partition {partition}' if partition else ''}, and sbatch --test-only says "
                         f"{said!r}; the partition offers {offer(partition)}; ask less with --cpus-per-job, "
                         "--mem-per-job, --gpus-per-job or --slurm-extra, or pick another --partition")


def sbatch_flags(parameters: dict[str, Any]) -> list[str]:
    """The sbatch options that submitit writes for :func:`sbatch_parameters`."""
    extra = parameters.get("additional_parameters", {})
    plain = {key: value for key, value in parameters.items() if key not in ("additional_parameters",
                                                                          "array_parallelism", "signal_delay_s")}
    flags = [f"--{key.replace('_', '-')}={value}" for key, value in {**plain, **extra}.items()]
    return flags + ([f"--signal=USR2@{parameters['signal_delay_s']}"] if "signal_delay_s" in parameters else [])


def asked(args: argparse.Namespace) -> str:
    """What each job of the sweep asks, in words."""
    gpus = f"{args.gpus_per_job} GPU{'s' * (args.gpus_per_job != 1)}" if args.gpus_per_job else "no GPU"
    return f"{args.cpus_per_job} CPUs, {args.mem_per_job:g} GB, {gpus}, {args.time} minutes"


def offer(partition: str | None) -> str:
    """What the nodes of ``partition`` have (sinfo: CPUs, memory, generic resources), in words."""
    try:
        lines = _ask("sinfo", "-h", "-N", *(["-p", partition] if partition else []), "-o", "%N %c %m %G")
    except UsageError:
        return "unknown (sinfo does not answer)"
    nodes = []
    for line in sorted(set(lines.splitlines())):
        fields = line.split()
        if len(fields) == 4:
            name, cpus, memory, gres = fields
            memory_text = f"{int(memory) / 1024:.0f} GB" if memory.isdigit() else f"{memory} MB"
            nodes.append(f"{name}: {cpus} CPUs, {memory_text}, {'no GPU' if gres == '(null)' else gres}")
    return "; ".join(nodes) if nodes else "unknown (sinfo lists no node)"


LONGEST_WARNING_SECONDS = 90


def warning_seconds(minutes: int) -> int:
    """How long before a job's time limit SLURM sends it USR2, submitit's cue to requeue the task (whose run then
    resumes after its last finished task): submitit's 90 s, but a quarter of the limit when that is shorter, so a
    job of a minute or two still trains before it is warned (with 90 s it would be warned as it starts)."""
    return int(min(LONGEST_WARNING_SECONDS, max(10, minutes * 60 // 4)))


def sbatch_parameters(args: argparse.Namespace) -> dict[str, Any]:
    """submitit's ``SlurmExecutor`` parameters of the sweep's options (each number checked as it is parsed,
    :func:`add_slurm_options`); a ``--slurm-extra`` that is not KEY=VALUE is a :class:`UsageError`."""
    extra = {}
    for text in args.slurm_extra:
        key, equals, value = text.partition("=")
        if not equals or not key.strip().lstrip("-"):
            raise UsageError(f"--slurm-extra {text!r}: use KEY=VALUE with an sbatch option, e.g. account=myproject")
        extra[key.strip().lstrip("-")] = value
    parameters = {"time": args.time, "cpus_per_task": args.cpus_per_job, "mem": f"{round(args.mem_per_job * 1024)}M",
                  "array_parallelism": args.array_parallelism, "job_name": JOB_NAME, "additional_parameters": extra,
                  "signal_delay_s": warning_seconds(args.time)}
    if args.partition is not None:
        parameters["partition"] = args.partition
    if args.gpus_per_job:
        parameters["gpus_per_node"] = args.gpus_per_job
    return parameters


def _call(*command: str) -> subprocess.CompletedProcess:
    """A SLURM client command's result; one that cannot start or does not end is a :class:`UsageError`."""
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=ANSWER_SECONDS)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"the SLURM controller does not answer ({command[0]}: {exc}); try again later") from None


def _ask(*command: str) -> str:
    """The output of a SLURM client command; a controller that does not answer is a :class:`UsageError`."""
    done = _call(*command)
    if done.returncode != 0:
        reason = (done.stderr.strip() or f"exit code {done.returncode}").splitlines()[0]
        raise UsageError(f"the SLURM controller does not answer ({command[0]}: {reason}); try again later")
    return done.stdout


@dataclass
class ArrayTask:
    """What one array task runs: its job's run command, with its output in the task's log.

    SLURM sends its time-limit warning (USR2) to every process of the job; the run ignores it, and submitit's
    handler in this process calls :meth:`checkpoint`, which stops the run cleanly before submitit requeues the
    task. Without that, submitit's exit would kill the run at once, and a task finished as the warning came could
    be lost with the state that was being saved."""

    job: Job
    stop_seconds: float
    """How long :meth:`checkpoint` waits for the run to stop: half the warning, so the requeue comes before the
    time limit."""
    threads: int
    """The job's CPUs (``--cpus-per-job``): the run's threads (:func:`cl2r_bench.threads.thread_environment`), so jobs
    that share a node do not each use all its cores."""
    _run: subprocess.Popen | None = field(default=None, init=False, repr=False, compare=False)
    _ended: threading.Event = field(default_factory=threading.Event, init=False, repr=False, compare=False)

    def __call__(self) -> None:
        """Run the job's command to its end. A thread waits for the run; this one only polls, so submitit's handler,
        which interrupts it, never meets a lock that the interrupted code holds. A task whose run is complete
        returns at once: the warning can come as the run finishes, and the requeued task must not run it again."""
        if self.job.status() == "complete":
            print(f"{self.job.name}: {self.job.directory} is complete; nothing to run", flush=True)
            return
        self._run = subprocess.Popen(self.job.command(), env=dict(os.environ, **thread_environment(self.threads)),
                                     preexec_fn=_ignore_time_limit_warning)
        threading.Thread(target=self._wait_for_run, daemon=True).start()
        while not self._ended.is_set():
            time.sleep(0.5)
        if self._run.returncode != 0:
            raise RuntimeError(f"{self.job.name}: the run exited with code {self._run.returncode}")

    def _wait_for_run(self) -> None:
        self._run.wait()
        self._ended.set()

    def checkpoint(self) -> Any:
        """Called by submitit at the time-limit warning: stop the run with SIGTERM (it keeps its finished tasks,
        the one being saved included; docs/reliability.md), wait for it, and start the task again (its run
        resumes)."""
        import submitit

        if self._run is not None:
            self._run.send_signal(signal.SIGTERM)
            self._ended.wait(self.stop_seconds)
        return submitit.helpers.DelayedSubmission(ArrayTask(self.job, self.stop_seconds, self.threads))

    def __getstate__(self) -> dict[str, Any]:
        """submitit pickles the task; the running process and its event stay behind."""
        return {"job": self.job, "stop_seconds": self.stop_seconds, "threads": self.threads}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)


def _ignore_time_limit_warning() -> None:
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


def run_slurm(jobs: list[Job], args: argparse.Namespace, folder: Path, *,
              log: Callable[[str], None] = print) -> int:
    """Submit the jobs that are neither complete nor already queued as one job array and, unless ``--no-wait``,
    follow them to the end; returns 0 when every job is complete (or, with ``--no-wait``, submitted), else 1 (the
    failed jobs are named with their logs). A stop while following them (Ctrl-C, SIGTERM) leaves them running and
    goes on to the command, which ends with its exit code (``embed`` must not embed their shards here instead)."""
    record = folder / "submitted.json"
    submitted = json.loads(record.read_text()) if record.exists() else {}
    states = queue_states()
    queued = {name: job_id for name, job_id in submitted.items() if job_id in states
              and states[job_id].state not in ENDED}
    missing = [job for job in jobs if job.status() != "complete"]
    new = [job for job in missing if job.name not in queued]
    log(f"sweep: {len(jobs)} runs, {len(jobs) - len(missing)} already complete, "
        f"{sum(job.name in queued for job in missing)} already queued, {len(new)} to submit to SLURM")
    if new:
        ids = submit(new, args, folder)
        first = ids[new[0].name].split("_")[0]
        log(f"sweep: submitted SLURM job{' array' if len(new) > 1 else ''} {first} (scancel {first} cancels it): "
            + ", ".join(f"{ids[job.name]} {job.name}" for job in new))
        _save(record, {**submitted, **ids})
        queued.update(ids)
    if args.no_wait:
        log("sweep: not waiting (--no-wait); the same sweep command later follows the queued jobs and submits again "
            "what is missing")
        return 0
    try:
        return follow(jobs, {job.name: queued[job.name] for job in missing}, folder, log)
    except KeyboardInterrupt:
        log("interrupted: the jobs keep running on the cluster; the same command follows them again")
        raise


def submit(jobs: list[Job], args: argparse.Namespace, folder: Path) -> dict[str, str]:
    """Submit ``jobs`` as one array (one sbatch); returns each job's SLURM id (``<array>_<index>``, or the plain
    job id of a single job)."""
    import submitit

    executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=args.requeues)
    executor.update_parameters(**sbatch_parameters(args))
    try:
        with contextlib.redirect_stderr(io.StringIO()), executor.batch():
            stop_seconds = warning_seconds(args.time) / 2
            handles = [executor.submit(ArrayTask(job, stop_seconds, args.cpus_per_job)) for job in jobs]
    except submitit.core.utils.FailedJobError as exc:
        reason = (str(exc).strip() or "no message").splitlines()[-1]
        raise UsageError(f"sbatch refused the sweep's jobs: {reason}") from None
    return {job.name: handle.job_id for job, handle in zip(jobs, handles, strict=True)}


def _save(path: Path, submitted: dict[str, str]) -> None:
    atomic_write_text(path, json.dumps(submitted, indent=1, sort_keys=True))


class QueueEntry(NamedTuple):
    """A job's state in the queue and SLURM's reason for it (why a pending job waits, e.g. ``Resources``)."""

    state: str
    reason: str = ""


def queue_states() -> dict[str, QueueEntry]:
    """The state of every job of this user that the controller still knows (``squeue``, one line per array task,
    ended jobs included while the controller keeps them), with its reason."""
    lines = _ask("squeue", "--user", getpass.getuser(), "-h", "-r", "-t", "all", "-o", "%i %T %r").splitlines()
    entries = {}
    for line in lines:
        fields = line.split(maxsplit=2)
        if len(fields) >= 2:
            reason = fields[2].strip() if len(fields) == 3 else ""
            entries[fields[0]] = QueueEntry(fields[1], "" if reason == "None" else reason)
    return entries


def follow(jobs: list[Job], queued: dict[str, str], folder: Path, log: Callable[[str], None]) -> int:
    """Print the progress line whenever it changes until every queued job has ended; returns 1 when one failed.
    A controller that does not answer (busy, or restarting) is asked again for up to ``QUEUE_PATIENCE_SECONDS``
    in a row before following stops with a :class:`UsageError`; the jobs keep running either way."""
    ended: dict[str, str] = {}
    start, last, silent_since = time.monotonic(), None, None
    while True:
        try:
            states = queue_states()
        except UsageError as exc:
            if silent_since is None:
                silent_since = time.monotonic()
                log(f"sweep: asking SLURM again for up to {QUEUE_PATIENCE_SECONDS // 60} minutes: {exc}")
            elif time.monotonic() - silent_since > QUEUE_PATIENCE_SECONDS:
                raise UsageError(f"{exc}; the jobs keep running on the cluster and the same sweep command follows "
                                 "them again") from None
            time.sleep(_pause(start))
            continue
        silent_since = None
        running = waiting = 0
        reasons = Counter()
        for name, job_id in queued.items():
            entry = states.get(job_id, QueueEntry("gone from the queue"))
            if name in ended or entry.state in ENDED or job_id not in states:
                ended.setdefault(name, entry.state)
            elif entry.state in RUNNING:
                running += 1
            else:
                waiting += 1
                reasons.update([entry.reason] if entry.reason else [])
        failed = {job.name: ended[job.name] for job in jobs if job.name in ended and job.status() != "complete"}
        line = progress(len(jobs) - len(failed) - running - waiting, running, len(failed), waiting)
        if reasons:
            line += f" (SLURM: {', '.join(f'{reason} {count}' for reason, count in sorted(reasons.items()))})"
        if line != last:
            log(line)
            last = line
        if running + waiting == 0:
            break
        time.sleep(_pause(start))
    for name, state in failed.items():
        log(f"failed: {name} (SLURM job {queued[name]}, {state}); see {_log_paths(folder, queued[name])}; the same "
            "sweep command submits it again")
    return 1 if failed else 0


def _pause(start: float) -> float:
    """Seconds between two looks at the queue: 1 s at first, growing to 30 s for long sweeps."""
    return min(30.0, 1.0 + (time.monotonic() - start) / 10)


def _log_paths(folder: Path, job_id: str) -> str:
    from submitit.core.utils import JobPaths

    paths = JobPaths(folder, job_id=job_id, task_id=0)
    return f"{paths.stdout} and {paths.stderr}"
