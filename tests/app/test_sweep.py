"""``runner.py sweep``: a grid of runs as separate processes; complete runs are skipped, failed ones named, every
bad point refused before anything starts."""
import json
import os
import sys

import pytest
from helpers.launching import wait_for_first_task
from helpers.load import busy_core
from helpers.records import valid_record

from cl2r_bench.app import cli


def sweep(tiny, out, *args):
    return cli.main(["sweep", "--config", str(tiny), "--output", str(out), *args])


@pytest.mark.slow
def test_a_sweep_runs_each_point_once_and_a_second_sweep_runs_nothing(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    assert sweep(tiny, out, "--strategy", "er", "cores", "--seeds", "1", "2", "--jobs", "2") == 0
    printed = capsys.readouterr().out
    assert "sweep: 4 runs, 0 already complete, 4 to run, 2 at a time" in printed
    assert "sweep: 4 done, 0 running, 0 failed, 0 waiting" in printed
    for strategy in ("er", "cores"):
        for seed in (1, 2):
            record = json.loads((out / f"iamcl2r/synthetic/{strategy}/seed{seed}/metrics.json").read_text())
            assert record["complete"] and record["seed"] == seed and record["strategy"] == strategy
    assert len(list((out / "sweep" / "logs").glob("*.log"))) == 4
    assert sweep(tiny, out, "--strategy", "er", "cores", "--seeds", "1", "2") == 0
    assert "sweep: 4 runs, 4 already complete, 0 to run" in capsys.readouterr().out


@pytest.mark.slow
def test_a_failed_job_is_named_with_its_log_and_runs_again_once_fixed(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    assert sweep(tiny, out, "--strategy", "er", "--seeds", "3", "--set", "training.lr=1e9") == 1
    printed = capsys.readouterr().out
    log = out / "sweep" / "logs" / "iamcl2r-synthetic-er-seed3.log"
    assert f"failed: iamcl2r-synthetic-er-seed3 (exit code 3); see {log}" in printed
    assert "diverged" in log.read_text()
    assert sweep(tiny, out, "--strategy", "er", "--seeds", "3") == 0
    assert json.loads((out / "iamcl2r/synthetic/er/seed3/metrics.json").read_text())["complete"]


@pytest.mark.parametrize("args, message", [
    (["--strategy", "er", "nope"], "unknown strategy 'nope'"),
    (["--strategy", "er", "--jobs", "0"], "argument --jobs: must be a whole number from 1"),
    (["--strategy", "er", "--seeds", str(2**70)], "argument --seeds: must be a whole number from 0 to 4294967295"),
    (["--strategy", "er", "--seed", "1"], "--seeds K1 K2"),
])
def test_bad_sweep_input_is_one_line_before_any_run(args, message, tiny, tmp_path, capsys):
    out = tmp_path / "out"
    assert sweep(tiny, out, *args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and not out.exists()


def test_a_set_list_is_a_grid_dimension_unless_its_setting_holds_a_list():
    from cl2r_bench.app.sweep import list_settings, set_grid

    lists = list_settings()
    assert {"replacement.tasks", "stream.class_order", "replacement.pretrain.seed"} <= lists
    assert "training.lr" not in lists
    points = set_grid(["training.lr=[0.1,1e-3]", "replacement.tasks=[0,3]", "evaluation.mode=[templates,images]",
                       "training.epochs=2"], lists)
    assert [folder for _, folder in points] == [
        "training.lr=0.1,evaluation.mode=templates", "training.lr=0.1,evaluation.mode=images",
        "training.lr=1e-3,evaluation.mode=templates", "training.lr=1e-3,evaluation.mode=images"]
    assert points[3][0] == ['training.lr="1e-3"', "replacement.tasks=[0,3]", 'evaluation.mode="images"',
                            "training.epochs=2"]
    assert set_grid(["replacement.tasks=[0,3]"], lists) == [(["replacement.tasks=[0,3]"], "")]
    assert set_grid([], lists) == [([], "")]
    assert set_grid(["strategy_params.avalanche:EWC.ewc_lambda=[0.4]"], lists)[0][1] == \
        "strategy_params.avalanche-EWC.ewc_lambda=0.4"


def grid(tmp_path, *args):
    from cl2r_bench.app.arguments import build_parser
    from cl2r_bench.app.sweep import grid_runs

    return grid_runs(build_parser().parse_args(["sweep", "--dataset", "synthetic", "--preset", "quick", "--device",
                                                "cpu", "--output", str(tmp_path / "out"), *args]))


def test_the_points_of_a_set_grid_get_their_own_folders_and_list_settings_stay_values(tmp_path):
    runs, output = grid(tmp_path, "--strategy", "er", "--seeds", "1", "--set", "training.lr=[0.1,0.01]",
                        "--set", "replacement.tasks=[0,3]")
    assert output == tmp_path / "out"
    assert [run.directory for run in runs] == [output / f"training.lr={lr}/iamcl2r/synthetic/er/seed1"
                                               for lr in ("0.1", "0.01")]
    assert [run.settings.training.lr for run in runs] == [0.1, 0.01]
    assert all(run.settings.replacement.tasks == [0, 3] for run in runs)


@pytest.mark.parametrize("args, message", [
    (["--strategy", "er", "cores", "--adapter", "fct", "--set", "adapter.label=mine"],
     "two runs asked for would share the run folder"),
    (["--strategy", "er", "--set", "training.lr=[0.1,0.2]", "--set", "training.lr=0.05"],
     "--set training.lr is given 2 times and one of them is a grid"),
    (["--strategy", "er", "--set", "training.lr=[0.01,1e-2]"], "the value 0.01 is given twice"),
    (["--strategy", "er", "--seeds", "1", "2",
      "--set", f"training.lr=[{','.join(str(i / 1e4) for i in range(1, 101))}]",
      "--set", f"training.epochs=[{','.join(map(str, range(1, 101)))}]"],
     "the sweep asks for 20000 runs (before 'all' expands), more than --max-runs 1000"),
    (["--strategy", "er", "--set", "output=[a,b]"], "a sweep has one results folder (--output)"),
    (["--strategy", "er", "--set", "training.lr=[]"], "a grid dimension needs at least one value"),
    (["--strategy", "er", "--set", f"data_root=[{'d' * 100}]"], "cannot name a results folder"),
    (["--strategy", "er", "--set", "training.lr=[0.1,nope]"], "training.lr = 'nope'"),
])
def test_sweep_points_that_cannot_run_are_one_line_before_anything_is_written(args, message, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["sweep", "--dataset", "synthetic", "--preset", "quick", "--output", str(out), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and not out.exists(), err


def test_identical_points_are_one_job(tmp_path):
    from cl2r_bench.app.sweep import plan

    runs, output = grid(tmp_path, "--strategy", "er", "er", "--seeds", "1", "1")
    jobs = plan(runs, output / "sweep")
    assert len(runs) == 4 and [job.name for job in jobs] == ["iamcl2r-synthetic-er-seed1"]


@pytest.mark.slow
def test_a_set_grid_runs_each_point_in_its_own_folder(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    assert sweep(tiny, out, "--strategy", "er", "--seeds", "1", "--set", "training.lr=[0.01,0.02]", "--jobs", "2") == 0
    assert "sweep: 2 done, 0 running, 0 failed, 0 waiting" in capsys.readouterr().out
    for lr in (0.01, 0.02):
        record = json.loads((out / f"training.lr={lr}/iamcl2r/synthetic/er/seed1/metrics.json").read_text())
        assert record["complete"] and record["config"]["training"]["lr"] == lr
    assert sorted(p.name for p in (out / "sweep" / "logs").glob("*.log")) == [
        f"training.lr={lr}-iamcl2r-synthetic-er-seed1.log" for lr in ("0.01", "0.02")]


@pytest.mark.slow
@pytest.mark.parametrize("signal_name, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_an_interrupted_sweep_stops_its_runs_and_the_same_command_resumes_them(tiny, tmp_path, signal_name, code):
    """kill -INT / kill -TERM of a sweep started with SIGINT ignored (as a script's background job inherits it)
    sends SIGTERM to its runs, waits for them, says so in one line and exits 130 / 143; no run keeps training as an
    orphan, and the same command finishes the run. The machine is loaded by a busy process on the other core while
    the stop is handled, as a guarantee that holds only on an idle machine is not one."""
    import signal
    import subprocess
    from pathlib import Path

    import yaml

    config = yaml.safe_load(tiny.read_text())
    config["training"]["epochs"] = 4
    slow = tmp_path / "slow.yaml"
    slow.write_text(yaml.safe_dump(config))
    out = tmp_path / "out"
    command = [sys.executable, "runner.py", "sweep", "--config", str(slow), "--output", str(out), "--strategy", "er",
               "--seeds", "5"]
    root = Path(__file__).resolve().parents[2]
    sweep_process = subprocess.Popen(command, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    wait_for_first_task(out / "iamcl2r/synthetic/er/seed5/metrics.json", sweep_process)
    children = subprocess.run(["pgrep", "-P", str(sweep_process.pid)], capture_output=True, text=True).stdout.split()
    with busy_core():
        sweep_process.send_signal(getattr(signal, signal_name))
        _, err = sweep_process.communicate(timeout=120)
    assert sweep_process.returncode == code, err
    assert "sweep stopped (" in err and "1 running run(s) stopped" in err and "Traceback" not in err
    for child in map(int, children):
        with pytest.raises(ProcessLookupError):
            os.kill(child, 0)
    finished = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr
    assert json.loads((out / "iamcl2r/synthetic/er/seed5/metrics.json").read_text())["complete"]


def test_a_sweep_whose_output_holds_a_file_named_sweep_is_one_line(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "sweep").write_text("my notes")
    assert sweep(tiny, out, "--strategy", "er", "--seeds", "1") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is a file, not a folder" in err and "Traceback" not in err
    assert (out / "sweep").read_text() == "my notes"


def test_a_sweep_reruns_a_point_whose_record_the_leaderboard_would_reject(tmp_path):
    """A hand-written {"complete": true} is not a finished run for the sweep either (one record check)."""
    from cl2r_bench.app.sweep import Job

    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "metrics.json").write_text('{"complete": true}')
    job = Job(folder, "run", tmp_path / "job.yaml", tmp_path / "job.log")
    assert job.status() == "new"

    (folder / "metrics.json").write_text(json.dumps(valid_record()))
    assert job.status() == "complete"


class ThreadsJob:
    """A job whose run only writes the ``OMP_NUM_THREADS`` it was given to its log."""

    def __init__(self, folder, name):
        self.name, self.log_file = name, folder / f"{name}.log"

    def status(self):
        return "complete" if self.log_file.exists() else "new"

    def command(self):
        return [sys.executable, "-c", "import os; print(os.environ.get('OMP_NUM_THREADS', 'unset'))"]


@pytest.mark.parametrize("users, expected", [(None, "2"), ("5", "5")])
def test_parallel_local_runs_share_the_cores_unless_the_user_set_the_threads(users, expected, tmp_path,
                                                                              monkeypatch):
    """Four cores and two runs at a time: each run is given two threads (torch would take all four in each); an
    ``OMP_NUM_THREADS`` the user set is kept."""
    from cl2r_bench import threads
    from cl2r_bench.app import sweep as sweeps

    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    if users is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", users)
    jobs = [ThreadsJob(tmp_path, f"job{i}") for i in range(3)]
    assert sweeps.run_local(jobs, parallel=2, log=lambda line: None, poll=0.05) == 0
    assert [job.log_file.read_text().strip() for job in jobs] == [expected] * 3


@pytest.mark.parametrize("environ, expected", [
    ({"SLURM_CPUS_PER_TASK": "3"}, 3), ({"SLURM_CPUS_PER_TASK": "3", "OMP_NUM_THREADS": "5"}, None), ({}, None),
    ({"SLURM_CPUS_PER_TASK": ""}, None), ({"SLURM_CPUS_PER_TASK": "0"}, None),
    ({"SLURM_CPUS_PER_TASK": "4(x2)"}, None)])
def test_a_command_in_the_users_own_slurm_job_takes_the_jobs_cpus_as_its_threads(environ, expected):
    from cl2r_bench.threads import own_threads

    assert own_threads(environ) == expected


def test_a_local_sweep_in_a_slurm_job_shares_the_jobs_cpus_not_the_nodes(monkeypatch):
    from cl2r_bench import threads

    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "4")
    assert threads.cores_per_run(2) == 2


def test_a_run_inside_a_slurm_job_of_one_cpu_computes_with_one_thread(tiny, tmp_path, monkeypatch):
    """``srun --cpus-per-task 1 python runner.py run ...`` on a node that does not bind jobs to their CPUs: the run
    computes with one thread, not torch's default, and its record says so; it sets no OMP_NUM_THREADS that an
    in-process caller would keep."""
    import torch

    default = torch.get_num_threads()
    if default < 2:
        pytest.skip("torch's default is one thread here: nothing to tell apart")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
    try:
        assert cli.main(["run", "--config", str(tiny), "--output", str(tmp_path / "out"), "--no-progress"]) == 0
    finally:
        torch.set_num_threads(default)
    assert "OMP_NUM_THREADS" not in os.environ
    record = json.loads(next((tmp_path / "out").rglob("metrics.json")).read_text())
    assert record["device"]["cpu_threads"] == 1
