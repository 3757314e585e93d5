"""The run loop and its folder (cl2r_bench/app/run_loop.py): diverged tasks, labels that cannot leave the output folder,
overwrite and resume, the folder's lock, damaged run folders, missing replacement checkpoints."""
import dataclasses
import json
import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers.launching import wait_until
from helpers.load import busy_core
from helpers.runs import waiting_config

from cl2r_bench.app import cli as runner
from cl2r_bench.files import exclusive


def run_cli(*args):
    return runner.main([str(a) for a in args])


def strict_load(path):
    """JSON as a strict parser reads it: a NaN or Infinity token is an error."""
    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")
    return json.loads(path.read_text(), parse_constant=refuse)


def test_a_diverged_task_stops_the_run_keeps_earlier_tasks_and_is_never_complete(tiny, tmp_path, capsys,
                                                                                    monkeypatch):
    from cl2r_bench.training import trainers
    original = trainers.train_task

    def lr_explodes_at_task_1(model, strategy, new, memory, settings, **kw):
        if kw["description"].startswith("task 1/"):
            settings = dataclasses.replace(settings, lr=1e9)
        return original(model, strategy, new, memory, settings, **kw)

    monkeypatch.setattr(trainers, "train_task", lr_explodes_at_task_1)
    out = tmp_path / "out"
    assert run_cli("--config", tiny, "--scenario", "cl2r", "--set", "replacement.tasks=[]", "--strategy", "er",
                   "--output", out) == runner.EXIT_DIVERGED
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "task 1 diverged" in err and "iteration" in err and "Traceback" not in err
    record = strict_load(out / "cl2r/synthetic/er/seed42/metrics.json")
    assert record["tasks_completed"] == 1 and not record["complete"]
    assert not (out / "cl2r/synthetic/er/seed42/checkpoints/task1.pt").exists()
    assert run_cli("leaderboard", "--results", out) == 2  # an incomplete run is never a leaderboard row


def test_a_diverged_first_task_writes_no_result(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    assert run_cli("--config", tiny, "--scenario", "cl2r", "--set", "replacement.tasks=[]", "--strategy", "er",
                   "--output", out, "--set", "training.lr=1e9") == runner.EXIT_DIVERGED
    assert "task 0 diverged" in capsys.readouterr().err
    assert not (out / "cl2r/synthetic/er/seed42/metrics.json").exists()


@pytest.mark.parametrize("label", ["../../../../../victim", "a/b", "..", ".hidden", "x" * 101])
def test_a_label_never_leads_outside_the_output_folder(label, tiny, tmp_path, capsys):
    victim = tmp_path / "victim"
    (victim / "seed42").mkdir(parents=True)
    (victim / "seed42" / "precious.txt").write_text("keep me")
    out = tmp_path / "a" / "b" / "out"
    code = run_cli("--config", tiny, "--scenario", "cl2r", "--set", "replacement.tasks=[]", "--strategy", "er",
                   "--output", out, "--overwrite",
                   "--set", f"adapter.label={label}",
                   "--set", "adapter.name=procrustes")
    err = capsys.readouterr().err.strip()
    assert code == 2 and "adapter.label" in err and len(err.splitlines()) == 1
    assert (victim / "seed42" / "precious.txt").read_text() == "keep me"


def test_overwrite_deletes_only_a_folder_the_suite_made(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    foreign = out / "cl2r/synthetic/er/seed42"
    foreign.mkdir(parents=True)
    (foreign / "notes.txt").write_text("mine")
    assert run_cli("--config", tiny, "--scenario", "cl2r", "--set", "replacement.tasks=[]", "--strategy", "er",
                   "--output", out, "--overwrite") == 2
    assert "did not write" in capsys.readouterr().err and (foreign / "notes.txt").exists()


def test_resume_and_overwrite_together_is_a_usage_error(tiny, tmp_path, capsys):
    assert run_cli("--config", tiny, "--output", tmp_path, "--resume", "--overwrite") == 2
    assert "--resume" in capsys.readouterr().err


def test_a_second_run_on_a_folder_in_use_is_refused_and_a_stale_lock_is_taken_over(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    run_dir = out / "cl2r/synthetic/er/seed42"
    args = ("--config", tiny, "--scenario", "cl2r", "--set", "replacement.tasks=[]", "--strategy", "er",
            "--output", out)
    with exclusive(run_dir.with_name("seed42.lock"), "test"):
        assert run_cli(*args) == 2
    err = capsys.readouterr().err
    assert f"pid {os.getpid()} on host {socket.gethostname()}" in err and "seed42.lock" in err
    holder = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    run_dir.with_name("seed42.lock").write_text(f"{holder.stdout.strip()}\n{socket.gethostname()}\n")
    assert run_cli(*args) == 0 and not run_dir.with_name("seed42.lock").exists()


def _replace_by_fifo(path: Path) -> None:
    """A FIFO in place of ``path``: a reader that opened it would wait for a writer for ever."""
    path.unlink()
    os.mkfifo(path)


@pytest.fixture
def finished_run(tiny, tmp_path):
    """A finished 3-task CL2R run: ``(command-line arguments, run folder)``."""
    args = ("--config", tiny, "--scenario", "cl2r", "--set", "replacement.tasks=[]", "--strategy", "er",
            "--output", tmp_path / "out")
    assert run_cli(*args) == 0
    return args, tmp_path / "out/cl2r/synthetic/er/seed42"


@pytest.mark.parametrize("damage, fragment", [
    (lambda d: (d / "state.pt").write_bytes(b""), "state.pt is damaged"),
    (lambda d: (d / "state.pt").write_bytes(pickle.dumps({"next_task": 1})), "state.pt is damaged"),
    (lambda d: torch.save({"weights": torch.zeros(2)}, d / "state.pt"), "state.pt is damaged"),
    (lambda d: (d / "config.yaml").unlink(), "config.yaml is missing, empty or damaged"),
    (lambda d: (d / "config.yaml").write_text(""), "config.yaml is missing, empty or damaged"),
    (lambda d: _replace_by_fifo(d / "config.yaml"), "config.yaml is missing, empty or damaged"),
    (lambda d: (d / "config.yaml").write_text("a: " + "[" * 100_000 + "]" * 100_000), "config.yaml is missing"),
    (lambda d: (d / "config.yaml").write_text("a: &a [1, 1]\nb: [*a, *a]\n"), "config.yaml is missing"),
    (lambda d: _truncate(d / "checkpoints/task1.pt"), "task1.pt is damaged"),
])
def test_a_damaged_run_folder_is_one_line_naming_the_file_and_the_fix(damage, fragment, finished_run, capsys):
    args, run_dir = finished_run
    state = torch.load(run_dir / "state.pt", weights_only=True)
    state["next_task"] = 2  # resume after task 1, which reads checkpoints/task1.pt
    torch.save(state, run_dir / "state.pt")
    damage(run_dir)
    capsys.readouterr()
    assert run_cli(*args, "--resume") == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and "--overwrite" in err and len(err.splitlines()) == 1


def test_a_run_resumes_when_an_adapt_only_default_changed_since_it_was_written(tiny, tmp_path, monkeypatch, capsys):
    from helpers.runs import interrupt_run_at

    args = ("--config", tiny, "--strategy", "er", "--output", tmp_path / "out")
    undo = interrupt_run_at(monkeypatch, 1)
    assert run_cli(*args) == 130
    undo()
    config_path = tmp_path / "out/iamcl2r/synthetic/er/seed42/config.yaml"
    config = yaml.safe_load(config_path.read_text())
    config["model_update"]["stream_rows"] = None
    config_path.write_text(yaml.safe_dump(config))
    capsys.readouterr()
    assert run_cli(*args, "--resume") == 0
    assert "resuming" in capsys.readouterr().out


def test_resume_compares_the_parameters_of_its_own_scenario_only(tmp_path):
    """A saved run's ``scenario_params`` of another scenario are not the run's settings; its own scenario's are."""
    from cl2r_bench.app.run_folder import RunError, RunFolder
    from cl2r_bench.config import resolve

    saved = resolve([("test", {"scenario": "cl2r", "dataset": "synthetic",
                               "scenario_params": {"cl2r": {"every": 2}, "upgrade": {"width": 1}}})])
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump(saved))
    folder = RunFolder(tmp_path / "run", resume=True, overwrite=False)
    folder.check_resumable(dict(saved, scenario_params={"cl2r": {"every": 2}, "upgrade": {"width": 9}}))
    with pytest.raises(RunError, match=r"scenario_params\.cl2r\.every"):
        folder.check_resumable(dict(saved, scenario_params={"cl2r": {"every": 3}}))


def test_a_run_resumes_under_other_speed_options(tmp_path):
    """``training.fused_optimizer``, ``compile`` and ``channels_last`` change how fast a run trains, not what it
    trains (``cl2r_bench.config.SPEED_OPTIONS``): a run saved with one value of each resumes under another."""
    from cl2r_bench.app.run_folder import RunError, RunFolder
    from cl2r_bench.config import resolve

    saved = resolve([("test", {"dataset": "synthetic"})])
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump(saved))
    folder = RunFolder(tmp_path / "run", resume=True, overwrite=False)
    folder.check_resumable(resolve([("test", {"dataset": "synthetic", "training": {
        "fused_optimizer": not saved["training"]["fused_optimizer"], "compile": "reduce-overhead",
        "channels_last": True}})]))
    with pytest.raises(RunError, match=r"training\.lr"):
        folder.check_resumable(resolve([("test", {"dataset": "synthetic", "training": {"lr": 0.5}})]))


def _truncate(path):
    path.write_bytes(path.read_bytes()[:100])


def test_resume_works_from_another_working_directory(tiny, tmp_path, monkeypatch):
    from helpers.runs import interrupt_run_at

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    config = yaml.safe_load(tiny.read_text())
    config["replacement"]["pretrain"]["cache_dir"] = "relative-cache"
    (work / "tiny.yaml").write_text(yaml.safe_dump(config))
    args = ("--config", work / "tiny.yaml", "--strategy", "er", "--output", "out")
    undo = interrupt_run_at(monkeypatch, 1)
    assert run_cli(*args) == 130
    undo()
    partial = json.loads((work / "out/iamcl2r/synthetic/er/seed42/metrics.json").read_text())
    assert all(r["path"].startswith("relative-cache/") for r in partial["replacement_models"])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert run_cli("--config", work / "tiny.yaml", "--strategy", "er", "--output", work / "out", "--resume") == 0
    record = json.loads((work / "out/iamcl2r/synthetic/er/seed42/metrics.json").read_text())
    assert record["complete"] and all(r["path"].startswith(str(work)) for r in record["replacement_models"])


def test_missing_replacement_checkpoints_are_named_before_any_data_is_read(tiny, tmp_path, capsys):
    from cl2r_bench.app.cli import main

    code = main(["--config", str(tiny), "--set", f"replacement.checkpoints=[{tmp_path / 'a.pt'},{tmp_path}]",
                 "--data-root", str(tmp_path / "no_data"), "--output", str(tmp_path / "o")])
    assert code == 2 and f"{tmp_path / 'a.pt'} does not exist" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_a_second_run_on_a_held_folder_never_trains_beside_the_first_under_load(tiny, tmp_path):
    """The reproduction of a lock that hung, three times, with a busy process on the other core while the second run
    lives: while the first run holds its folder's lock, the same command with --resume is either refused (the lock)
    or, when it gets the lock after the first finished, resumes after its last task; it never trains task 0 beside
    the first. The folder's results are checked again under the lock, so the state seen before reading the data
    cannot mislead it. The runs are :data:`TINY`'s 3 tasks, each after a 3 s wait (``waiting_strategy.py``): the
    first holds the lock while the second builds its stream and reaches the lock (refused each time on 2 cores), and
    spends no CPU meanwhile."""
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "out"
    command = [sys.executable, "runner.py", "--config", str(waiting_config(tiny, tmp_path, 3.0)), "--scenario",
               "cl2r", "--set", "replacement.tasks=[]", "--no-progress", "--output", str(out)]
    lock = out / "cl2r/synthetic/waiting_bct/seed42.lock"
    for attempt in range(3):
        first = subprocess.Popen([*command, "--overwrite"] if attempt else command, cwd=root,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wait_until(lambda run=first: lock.exists() or run.poll() is not None, 120, "the first run took no lock",
                   every=0.02)
        with busy_core():
            second = subprocess.run([*command, "--resume"], cwd=root, capture_output=True, text=True, timeout=300)
        first_out, _ = first.communicate(timeout=300)
        assert first.returncode == 0, first_out
        refused = second.returncode == 2 and "is in use by pid" in second.stderr
        resumed = second.returncode == 0 and "resuming" in second.stdout and "task 0:" not in second.stdout
        assert refused or resumed, (second.returncode, second.stdout[-500:], second.stderr[-500:])
        assert json.loads((out / "cl2r/synthetic/waiting_bct/seed42/metrics.json").read_text())["complete"]
