"""SLURM time limits on the test cluster (``tests/slurm/cluster.sh start``): a job warned before its limit is
requeued by submitit and resumes, and a job that reaches its real 2-minute limit is warned, stopped, requeued and
resumed until its run is complete, with no finished task trained again.

Both jobs spend their time waiting (the plug-in strategy of ``helpers/waiting_strategy.py``), so they run on the
cluster at once: the real-limit sweep starts with this module (:func:`real_limit_sweep`) and the other test runs
meanwhile; the file takes as long as the longer job, not the two one after the other."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.launching import SMALL, cluster_environment, sweep_on_cluster, wait_until
from helpers.runs import tiny_config, waiting_config

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

TASK_SECONDS = 12
"""How long each task of the time-limit tests lasts: the plug-in strategy waits that long before it trains one
epoch, so the figure holds on a loaded machine too."""
TASKS = 9
"""Nine tasks of 12 s: 108 s, so the run outlasts the 90 s to the 2-minute limit's warning; and every attempt
finishes a task, since SLURM may warn up to 60 s early (seen: after 76 s), 30 s after the job starts."""


def equal_tasks(tiny: Path, folder: Path) -> Path:
    """cl2r with BCT waiting :data:`TASK_SECONDS` before each task (``waiting_strategy.py``), :data:`TASKS` tasks of
    two classes, one epoch each, no replacement models."""
    config = yaml.safe_load(waiting_config(tiny, folder, TASK_SECONDS).read_text())
    config["scenario"] = "cl2r"
    config["stream"].update(num_tasks=TASKS, initial_classes=2, increment=2)
    config["replacement"]["tasks"] = []
    path = folder / "equal-tasks.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def environment() -> dict[str, str]:
    return cluster_environment()


@pytest.fixture(scope="module", autouse=True)
def real_limit_sweep(environment, tmp_path_factory):
    """A 2-minute limit on a run of :data:`TASKS` tasks of :data:`TASK_SECONDS` each, with requeues enough for one
    task an attempt, submitted and followed by a sweep in its own process from the module's start; its process and
    results folder. When the module ends early, the sweep is stopped (SIGTERM, as a user would) and its jobs are
    cancelled."""
    folder = tmp_path_factory.mktemp("real-limit")
    out = folder / "out"
    command = [sys.executable, "-m", "cl2r_bench", "sweep", "--config", str(equal_tasks(tiny_config(folder), folder)),
               "--output", str(out), "--launcher", "slurm", *SMALL, "--time", "2", "--seeds", "1", "--requeues", "8"]
    sweep = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment)
    yield sweep, out
    if sweep.poll() is None:
        sweep.terminate()
        try:
            sweep.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            sweep.kill()
            sweep.communicate()
    submitted = out / "sweep" / "slurm" / "submitted.json"
    if submitted.exists():
        subprocess.run(["scancel", *json.loads(submitted.read_text()).values()], env=environment, timeout=30)


def test_a_job_at_its_time_limit_is_requeued_by_submitit_and_resumes(environment, tiny, tmp_path):
    """SLURM warns a job before its time limit with USR2 (submitit's sbatch asks for it); the test sends that
    signal early, as the second of the run's three tasks of :data:`TASK_SECONDS` begins. submitit requeues the
    task, whose run resumes after its last finished task once SLURM lets the requeued job start again (after the
    cluster's ``cred_expire``, 10 s)."""
    out = tmp_path / "out"
    config = waiting_config(tiny, tmp_path, TASK_SECONDS)
    code, printed = sweep_on_cluster(config, out, "--seeds", "1", "--no-wait", strategy="waiting_bct",
                                     environment=environment)
    assert code == 0, printed
    job_id = json.loads((out / "sweep" / "slurm" / "submitted.json").read_text())["iamcl2r-synthetic-waiting_bct-seed1"]
    run = out / "iamcl2r/synthetic/waiting_bct/seed1"
    wait_until((run / "metrics.json").exists, 300, "the job finished no task")
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True, timeout=30, env=environment)
    wait_until(lambda: "Restarts=1" in subprocess.run(["scontrol", "show", "job", job_id], capture_output=True,
                                                      text=True, timeout=30, env=environment).stdout,
               60, "the job was not requeued")
    code, printed = sweep_on_cluster(config, out, "--seeds", "1", strategy="waiting_bct", environment=environment)
    assert code == 0 and "1 already queued, 0 to submit" in printed and "sweep: 1 done, 0 running" in printed, printed
    log = (out / "sweep" / "slurm" / f"{job_id}_0_log.out").read_text()
    assert "Caught signal SIGUSR2" in (out / "sweep" / "slurm" / f"{job_id}_0_log.err").read_text()
    assert f"resuming {run} at task" in log
    assert json.loads((run / "metrics.json").read_text())["complete"]


def test_a_job_that_reaches_its_real_time_limit_is_requeued_and_trains_no_finished_task_again(real_limit_sweep,
                                                                                                environment):
    """SLURM warns the job of :func:`real_limit_sweep` 30 s before its limit (a quarter of it,
    :func:`cl2r_bench.app.slurm.warning_seconds`), the array task stops the run (which keeps its finished tasks),
    submitit requeues the task, and the requeued job resumes after the last finished task and completes; every
    task is trained to its end exactly once."""
    sweep, out = real_limit_sweep
    printed, _ = sweep.communicate(timeout=1200)
    assert sweep.returncode == 0, printed
    job_id = json.loads((out / "sweep" / "slurm" / "submitted.json").read_text())["cl2r-synthetic-waiting_bct-seed1"]
    shown = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=30,
                           env=environment).stdout
    assert "Restarts=0" not in shown and "Restarts=" in shown, shown
    log = (out / "sweep" / "slurm" / f"{job_id}_0_log.out").read_text()
    assert "Caught signal SIGUSR2" in (out / "sweep" / "slurm" / f"{job_id}_0_log.err").read_text()
    assert f"resuming {out / 'cl2r/synthetic/waiting_bct/seed1'} at task" in log
    trained = re.findall(r"^task (\d)[^:]*: trained", log, flags=re.M)
    assert sorted(trained) == [str(t) for t in range(TASKS)], log
    assert json.loads((out / "cl2r/synthetic/waiting_bct/seed1/metrics.json").read_text())["complete"]
