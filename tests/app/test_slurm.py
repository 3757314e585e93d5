"""``runner.py sweep --launcher slurm``: the one-line refusals before anything is submitted, following
the jobs to the end without submitit's ``result()``, and a real one-node SLURM cluster
(``tests/slurm/cluster.sh start``): a sweep submitted as a job array without waiting, the same command following it
to the end, an interrupted run resumed by its job, and a last sweep that submits nothing."""
import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
from argparse import Namespace
from pathlib import Path

import pytest
from helpers.launching import SMALL, cluster_environment, sweep_on_cluster, wait_until
from helpers.records import valid_record

from cl2r_bench.app import cli, slurm
from cl2r_bench.app.sweep import Job
from cl2r_bench.errors import UsageError


def slurm_sweep(out, *args):
    return cli.main(["sweep", "--dataset", "synthetic", "--preset", "quick", "--strategy", "er", "--output", str(out),
                     "--launcher", "slurm", *args])


def fake_slurm(tmp_path, monkeypatch, **scripts):
    """A PATH holding only the given SLURM commands, each a shell script."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))


def refused(capsys, out, message):
    err = capsys.readouterr().err.strip()
    return len(err.splitlines()) == 1 and message in err and not out.exists()


def test_without_submitit_a_slurm_sweep_says_what_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "submitit", None)
    assert slurm_sweep(tmp_path / "out") == 2
    assert refused(capsys, tmp_path / "out", 'pip install submitit (or pip install -e ".[slurm]")')


@pytest.mark.parametrize("scripts, args, message", [
    ({}, [], "no sbatch or srun on PATH, so SLURM is not reachable from this machine"),
    ({"sbatch": "exit 0"}, [], "no srun on PATH"),
    ({"sbatch": "exit 0", "srun": "exit 0",
      "sinfo": "echo 'sinfo: error: Unable to contact slurm controller (connect failure)' >&2; exit 1"}, [],
     "the SLURM controller does not answer (sinfo: sinfo: error: Unable to contact slurm controller"),
    ({"sbatch": "exit 0", "srun": "exit 0", "sinfo": "printf 'debug*\\ngpu\\n'"}, ["--partition", "big"],
     "SLURM partition 'big' does not exist; partitions here: debug, gpu"),
    ({}, ["--time", "0"], "argument --time: must be a whole number from 1 to 2147483647, not 0"),
    ({}, ["--requeues", "-1"], "argument --requeues: must be a whole number from 0 to 2147483647, not -1"),
    ({}, ["--mem-per-job", "0"], "argument --mem-per-job: must be above 0 and at most 1048576, not 0"),
    ({}, ["--mem-per-job", "inf"], "must be above 0 and at most 1048576, not inf"),
    ({}, ["--mem-per-job", "nan"], "must be above 0 and at most 1048576, not nan"),
    ({}, ["--slurm-extra", "account"], "--slurm-extra 'account': use KEY=VALUE"),
])
def test_a_slurm_sweep_that_cannot_be_submitted_is_one_line_before_anything_is_written(
        scripts, args, message, tmp_path, capsys, monkeypatch):
    pytest.importorskip("submitit")
    fake_slurm(tmp_path, monkeypatch, **scripts)
    assert slurm_sweep(tmp_path / "out", *args) == 2
    assert refused(capsys, tmp_path / "out", message)


def test_options_sbatch_refuses_are_one_line(tmp_path, capsys, monkeypatch):
    pytest.importorskip("submitit")
    fake_slurm(tmp_path, monkeypatch, sinfo="echo 'debug*'", squeue="exit 0", srun="exit 0",
               sbatch='case "$*" in *--test-only*) exit 0;; esac\n'
                      "echo 'sbatch: error: Batch job submission failed: Invalid account' >&2; exit 1")
    assert slurm_sweep(tmp_path / "out", "--slurm-extra", "account=nope") == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: sbatch refused the sweep's jobs: sbatch: error: Batch job submission failed: Invalid account"
    assert not (tmp_path / "out" / "sweep" / "slurm" / "submitted.json").exists()


@pytest.mark.parametrize("text, minutes", [("infinite", float("inf")), ("UNLIMITED", float("inf")), ("30", 30),
                                           ("30:00", 30), ("1:00:00", 60), ("2-00", 2880), ("1-02:03:00", 1563),
                                           ("n/a", None), ("1:2:3:4", None)])
def test_slurm_time_limits_are_read_in_minutes(text, minutes):
    assert slurm.slurm_minutes(text) == minutes


PARTITION = "debug* 1:00:00"  # sinfo -o '%P %l': the default partition and its time limit
NODES = "n1 2 8000 (null)"    # sinfo -N -o '%N %c %m %G': a node with 2 CPUs, 8000 MB and no GPU


def test_jobs_no_node_can_run_are_refused_before_submitting_with_what_was_asked_and_what_is_offered(
        tmp_path, capsys, monkeypatch):
    pytest.importorskip("submitit")
    fake_slurm(tmp_path, monkeypatch, srun="exit 0", squeue="exit 0",
               sinfo=f'case "$*" in *-N*) echo "{NODES}";; *) echo "{PARTITION}";; esac',
               sbatch=f'echo "$*" > {tmp_path / "asked"}; echo "sbatch: error: Invalid generic resource (gres) '
                      'specification" >&2\necho "allocation failure: Requested node configuration is not available"'
                      ' >&2; exit 1')
    assert slurm_sweep(tmp_path / "out", "--time", "60") == 2
    assert refused(capsys, tmp_path / "out",
                   "SLURM would never start the sweep's jobs: each asks 4 CPUs, 16 GB, 1 GPU, 60 minutes on partition "
                   "debug, and sbatch --test-only says 'sbatch: error: Invalid generic resource (gres) specification "
                   "allocation failure: Requested node configuration is not available'; the partition offers n1: 2 "
                   "CPUs, 8 GB, no GPU; ask less with --cpus-per-job")
    assert (tmp_path / "asked").read_text().split() == [
        "--test-only", "--time=60", "--cpus-per-task=4", "--mem=16384M", "--job-name=cl2r-sweep",
        "--gpus-per-node=1", "--signal=USR2@90", "--wrap", "true"]


def test_a_time_limit_above_the_partitions_is_refused_before_submitting(tmp_path, capsys, monkeypatch):
    pytest.importorskip("submitit")
    fake_slurm(tmp_path, monkeypatch, srun="exit 0", squeue="exit 0", sbatch="exit 0",
               sinfo=f'echo "{PARTITION}"; echo "long 2-00:00:00"')
    assert slurm_sweep(tmp_path / "out", *SMALL[:-2], "--time", "90") == 2
    assert refused(capsys, tmp_path / "out", "each job asks --time 90 minutes but partition 'debug' allows at most "
                                             "60; lower --time")
    assert slurm_sweep(tmp_path / "out", *SMALL[:-2], "--time", "3000", "--partition", "long") == 2
    assert refused(capsys, tmp_path / "out", "partition 'long' allows at most 2880")


def test_waiting_jobs_show_slurms_pending_reasons(tmp_path, monkeypatch):
    pytest.importorskip("submitit")
    a, b, c = jobs_in(tmp_path, "a", "b", "c")
    queue = iter([{"4_0": slurm.QueueEntry("PENDING", "Resources"), "4_1": slurm.QueueEntry("PENDING", "Priority"),
                   "4_2": slurm.QueueEntry("PENDING", "Resources")},
                  {"4_0": slurm.QueueEntry("RUNNING"), "4_1": slurm.QueueEntry("PENDING"),
                   "4_2": slurm.QueueEntry("PENDING", "Resources")}, {}])
    monkeypatch.setattr(slurm, "queue_states", lambda: next(queue))
    monkeypatch.setattr(slurm.time, "sleep", lambda seconds: None)
    lines = []
    slurm.follow([a, b, c], {"a": "4_0", "b": "4_1", "c": "4_2"}, tmp_path, lines.append)
    assert lines[:2] == ["sweep: 0 done, 0 running, 0 failed, 3 waiting (SLURM: Priority 1, Resources 2)",
                         "sweep: 0 done, 1 running, 0 failed, 2 waiting (SLURM: Resources 1)"]


def test_squeue_lines_are_read_with_their_reasons(tmp_path, monkeypatch):
    fake_slurm(tmp_path, monkeypatch, squeue="printf '5_0 PENDING PartitionConfig\\n5_1 RUNNING None\\n5_2 PENDING "
                                             "(ReqNodeNotAvail, UnavailableNodes:n1)\\n'")
    assert slurm.queue_states() == {"5_0": slurm.QueueEntry("PENDING", "PartitionConfig"),
                                    "5_1": slurm.QueueEntry("RUNNING", ""),
                                    "5_2": slurm.QueueEntry("PENDING", "(ReqNodeNotAvail, UnavailableNodes:n1)")}


def entries(states):
    """squeue's answer: each job id's state, without a reason."""
    return {job_id: slurm.QueueEntry(state) for job_id, state in states.items()}


def jobs_in(tmp_path, *names):
    return [Job(tmp_path / name, name, tmp_path / f"{name}.yaml", tmp_path / f"{name}.log") for name in names]


def complete(job):
    """A finished run's record in the job's folder (a record the leaderboard accepts, as the sweep checks)."""

    job.directory.mkdir(parents=True)
    (job.directory / "metrics.json").write_text(json.dumps(valid_record()))


def test_jobs_are_followed_in_the_queue_and_the_run_folders_not_through_submitit(tmp_path, monkeypatch):
    pytest.importorskip("submitit")
    ok, cancelled, lost = jobs_in(tmp_path, "ok", "cancelled", "lost")
    queue = iter([entries({"7_0": "PENDING", "7_1": "PENDING", "7_2": "PENDING"}),
                  entries({"7_0": "RUNNING", "7_1": "RUNNING", "7_2": "RUNNING"}),
                  entries({"7_0": "COMPLETED", "7_1": "CANCELLED"})])
    monkeypatch.setattr(slurm, "queue_states", lambda: next(queue))
    monkeypatch.setattr(slurm.time, "sleep", lambda seconds: complete(ok) if not ok.directory.exists() else None)
    lines = []
    code = slurm.follow([ok, cancelled, lost], {"ok": "7_0", "cancelled": "7_1", "lost": "7_2"}, tmp_path,
                        lines.append)
    assert code == 1
    assert lines[:3] == ["sweep: 0 done, 0 running, 0 failed, 3 waiting",
                         "sweep: 0 done, 3 running, 0 failed, 0 waiting",
                         "sweep: 1 done, 0 running, 2 failed, 0 waiting"]
    assert lines[3] == (f"failed: cancelled (SLURM job 7_1, CANCELLED); see {tmp_path}/7_1_0_log.out and "
                        f"{tmp_path}/7_1_0_log.err; the same sweep command submits it again")
    assert lines[4].startswith("failed: lost (SLURM job 7_2, gone from the queue)")


def test_a_controller_that_stops_answering_is_asked_again_then_given_up_on(tmp_path, monkeypatch):
    pytest.importorskip("submitit")
    ok, = jobs_in(tmp_path, "ok")
    clock = [0.0]
    answers = iter([entries({"3_0": "RUNNING"}), None, None, entries({"3_0": "COMPLETED"})])

    def states():
        answer = next(answers, None)
        if answer is None:
            raise UsageError("the SLURM controller does not answer (squeue: Socket timed out); try again later")
        return answer

    def sleep(seconds):
        clock[0] += seconds
        if clock[0] > 2 and not ok.directory.exists():
            complete(ok)

    monkeypatch.setattr(slurm, "queue_states", states)
    monkeypatch.setattr(slurm.time, "sleep", sleep)
    monkeypatch.setattr(slurm.time, "monotonic", lambda: clock[0])
    lines = []
    assert slurm.follow([ok], {"ok": "3_0"}, tmp_path, lines.append) == 0
    assert lines == ["sweep: 0 done, 1 running, 0 failed, 0 waiting",
                     "sweep: asking SLURM again for up to 10 minutes: the SLURM controller does not answer (squeue: "
                     "Socket timed out); try again later",
                     "sweep: 1 done, 0 running, 0 failed, 0 waiting"]
    answers = iter([entries({"3_0": "RUNNING"})])
    with pytest.raises(UsageError, match="Socket timed out.*the same sweep command follows them again"):
        slurm.follow([ok], {"ok": "3_0"}, tmp_path, lines.append)
    assert clock[0] > slurm.QUEUE_PATIENCE_SECONDS


def test_jobs_still_queued_are_followed_not_submitted_again(tmp_path, monkeypatch):
    done, queued, failed, new = jobs_in(tmp_path, "done", "queued", "failed", "new")
    complete(done)
    folder = tmp_path / "slurm"
    folder.mkdir()
    (folder / "submitted.json").write_text(json.dumps({"done": "5_0", "queued": "5_1", "failed": "5_2"}))
    monkeypatch.setattr(slurm, "queue_states", lambda: entries({"5_0": "COMPLETED", "5_1": "PENDING",
                                                                "5_2": "FAILED"}))
    submitted = []
    monkeypatch.setattr(slurm, "submit", lambda jobs, args, folder: submitted.extend(jobs) or {
        job.name: f"9_{i}" for i, job in enumerate(jobs)})
    lines = []
    assert slurm.run_slurm([done, queued, failed, new], Namespace(no_wait=True), folder, log=lines.append) == 0
    assert lines[0] == "sweep: 4 runs, 1 already complete, 1 already queued, 2 to submit to SLURM"
    assert submitted == [failed, new]
    assert json.loads((folder / "submitted.json").read_text()) == {"done": "5_0", "queued": "5_1", "failed": "9_0",
                                                                   "new": "9_1"}


def test_a_stop_while_following_leaves_the_jobs_running_and_reaches_the_command(tmp_path, monkeypatch):
    """``embed --launcher slurm`` embeds the shards of failed tasks itself: a Ctrl-C or SIGTERM while it follows
    the array must end the command (its exit code), not count as failed tasks."""
    import signal

    from cl2r_bench.app.stops import Stopped

    new, = jobs_in(tmp_path, "new")
    folder = tmp_path / "slurm"
    folder.mkdir()
    monkeypatch.setattr(slurm, "queue_states", dict)
    monkeypatch.setattr(slurm, "submit", lambda jobs, args, folder: {"new": "9_0"})

    def stopped(*_):
        raise Stopped(signal.SIGTERM)

    monkeypatch.setattr(slurm, "follow", stopped)
    lines = []
    with pytest.raises(Stopped):
        slurm.run_slurm([new], Namespace(no_wait=False), folder, log=lines.append)
    assert lines[-1] == "interrupted: the jobs keep running on the cluster; the same command follows them again"


@pytest.fixture
def cluster(monkeypatch):
    """The one-node cluster of tests/slurm/cluster.sh, or a skip saying how to start it."""
    monkeypatch.setenv("SLURM_CONF", cluster_environment()["SLURM_CONF"])


@pytest.mark.slurm
def test_a_sweep_on_a_slurm_cluster_runs_what_is_missing_and_resumes_an_interrupted_run(
        cluster, tiny, tmp_path, monkeypatch):
    from helpers.runs import interrupt_run_at

    out = tmp_path / "out"
    undo = interrupt_run_at(monkeypatch, 1)
    assert cli.main(["run", "--config", str(tiny), "--output", str(out), "--strategy", "er", "--seed", "3"]) == 130
    undo()
    code, printed = sweep_on_cluster(tiny, out, "--seeds", "1", "3", "--no-wait")
    assert code == 0 and "2 to submit to SLURM" in printed and "not waiting (--no-wait)" in printed, printed
    code, printed = sweep_on_cluster(tiny, out, "--seeds", "1", "3")
    assert code == 0 and "0 to submit" in printed and "sweep: 2 done, 0 running, 0 failed, 0 waiting" in printed, \
        printed
    for seed in (1, 3):
        assert json.loads((out / f"iamcl2r/synthetic/er/seed{seed}/metrics.json").read_text())["complete"]
    logs = "".join(path.read_text() for path in (out / "sweep" / "slurm").glob("*_log.out"))
    assert f"resuming {out / 'iamcl2r/synthetic/er/seed3'} at task 1" in logs
    code, printed = sweep_on_cluster(tiny, out, "--seeds", "1", "3")
    assert code == 0 and "2 already complete, 0 already queued, 0 to submit" in printed and "submitted" not in printed


class FakeJob:
    """A job whose run writes ``started``, writes ``alive`` once it sees ``usr2-sent`` (so it lived on after the
    signal), runs until stopped, and on SIGTERM takes a second to write ``stopped`` (a task being saved) before
    exiting with 143; or, with ``stops=False``, ignores SIGTERM. With ``complete=True`` its folder holds a complete
    run."""

    name = "fake"

    def __init__(self, folder: Path, stops: bool = True, complete: bool = False):
        self.folder, self.stops, self.complete = folder, stops, complete
        self.directory = folder

    def status(self) -> str:
        return "complete" if self.complete else "new"

    def command(self) -> list[str]:
        return [sys.executable, "-c", textwrap.dedent(f"""
            import os, pathlib, signal, sys, time
            folder = pathlib.Path({str(self.folder)!r})
            def stop(signum, frame):
                time.sleep(1)
                (folder / "stopped").write_text("saved")
                sys.exit(143)
            signal.signal(signal.SIGTERM, stop if {self.stops} else signal.SIG_IGN)
            (folder / "started").write_text(os.environ.get("OMP_NUM_THREADS", "unset"))
            for _ in range(2400):
                if (folder / "usr2-sent").exists() and not (folder / "alive").exists():
                    (folder / "alive").write_text("after USR2")
                time.sleep(0.05)
            """)]


def test_at_the_time_limit_warning_the_array_task_stops_its_run_cleanly_before_it_is_requeued(tmp_path,
                                                                                                 monkeypatch):
    """SLURM sends the warning (USR2) to every process of the job: the run ignores it and lives on; submitit then
    calls :meth:`ArrayTask.checkpoint`, which returns only once the run has stopped on its SIGTERM and saved what it
    was saving, and hands submitit a fresh task of the same job to requeue. The run uses as many threads as the job
    has CPUs."""
    pytest.importorskip("submitit")
    from cl2r_bench.app.slurm import ArrayTask

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    task = ArrayTask(FakeJob(tmp_path), stop_seconds=30, threads=3)
    failure = []
    runner = threading.Thread(target=lambda: failure.append(pytest.raises(RuntimeError, task)))
    runner.start()
    wait_until((tmp_path / "started").exists, 60, "the run never started")
    assert (tmp_path / "started").read_text() == "3"
    os.kill(task._run.pid, signal.SIGUSR2)
    (tmp_path / "usr2-sent").touch()
    wait_until((tmp_path / "alive").exists, 60, "the run did not live on after USR2")
    assert not task._ended.is_set()
    requeued = task.checkpoint()
    assert (tmp_path / "stopped").read_text() == "saved" and task._run.returncode == 143
    runner.join(10)
    assert "exited with code 143" in str(failure[0].value)
    assert requeued.function.job is task.job and requeued.function._run is None and requeued.function.threads == 3
    assert pickle.loads(pickle.dumps(task)).job.folder == tmp_path


def test_a_run_that_does_not_stop_holds_the_requeue_back_only_for_its_stop_seconds(tmp_path):
    """The requeue must come before the time limit, so :meth:`ArrayTask.checkpoint` waits no longer than
    ``stop_seconds`` for a run that ignores SIGTERM (SLURM's requeue then ends it)."""
    pytest.importorskip("submitit")
    from cl2r_bench.app.slurm import ArrayTask

    task = ArrayTask(FakeJob(tmp_path, stops=False), stop_seconds=1, threads=1)
    runner = threading.Thread(target=lambda: pytest.raises(RuntimeError, task))
    runner.start()
    wait_until((tmp_path / "started").exists, 60, "the run never started")
    started = time.monotonic()
    task.checkpoint()
    waited = time.monotonic() - started
    assert 1 <= waited < 10 and not task._ended.is_set()
    task._run.kill()
    runner.join(10)


def test_a_task_requeued_after_its_run_completed_returns_without_running_it_again(tmp_path, capsys):
    """The time-limit warning can come as the run finishes (seen under load): submitit requeues the task, and
    the requeued task must end cleanly instead of starting the complete run again (which refuses its folder)."""
    pytest.importorskip("submitit")
    from cl2r_bench.app.slurm import ArrayTask

    task = ArrayTask(FakeJob(tmp_path, complete=True), stop_seconds=1, threads=1)
    task()
    assert task._run is None and not (tmp_path / "started").exists()
    assert f"fake: {tmp_path} is complete; nothing to run" in capsys.readouterr().out


def test_short_time_limits_are_warned_a_quarter_before_their_end():
    from cl2r_bench.app.slurm import sbatch_parameters, warning_seconds

    assert [warning_seconds(m) for m in (1, 2, 4, 6, 180)] == [15, 30, 60, 90, 90]
    args = Namespace(time=2, gpus_per_job=0, cpus_per_job=1, array_parallelism=1, mem_per_job=1.0, requeues=3,
                              slurm_extra=[], partition=None)
    assert sbatch_parameters(args)["signal_delay_s"] == 30


@pytest.mark.slurm
def test_the_sweeps_default_resources_on_a_small_node_are_refused_before_anything_is_submitted(cluster, tmp_path,
                                                                                                 capsys):
    """The test cluster's one node has no GPU: jobs asking one would pend for ever; sbatch --test-only says so.
    No job of this sweep is in the queue (each job is named by its log's path; other tests' jobs may come and go
    meanwhile on the shared cluster)."""
    assert slurm_sweep(tmp_path / "out") == 2
    err = capsys.readouterr().err.strip()
    assert "SLURM would never start the sweep's jobs: each asks 4 CPUs, 16 GB, 1 GPU, 180 minutes" in err, err
    assert "the partition offers localhost:" in err and "no GPU" in err
    assert not (tmp_path / "out").exists()
    logs = subprocess.run(["squeue", "-h", "-t", "all", "-O", "StdOut:1000"], capture_output=True, text=True,
                          timeout=30)
    assert logs.returncode == 0 and str(tmp_path) not in logs.stdout, logs.stdout + logs.stderr
