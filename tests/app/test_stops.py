"""Stops that do not depend on how the suite was launched (cl2r_bench/app/stops.py): a run or a sweep started with
SIGINT ignored (as a background job of a script inherits it) still stops cleanly on SIGINT, and on SIGTERM (SLURM's
time limit, docker stop, timeout) with exit 143; finished tasks are kept and the same configuration with
``--resume`` continues (in the test's process). The other core is kept busy while a stop is handled (and while a run
killed outright writes its log): a guarantee that holds only on an idle machine is not one."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers.launching import wait_for_first_task
from helpers.load import busy_core

from cl2r_bench.app.cli import main
from cl2r_bench.app.stops import Stopped, deferred_stops, exit_code, stop_handlers

ROOT = Path(__file__).resolve().parents[2]


def ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def slow_config(tiny: Path, tmp_path: Path) -> Path:
    config = yaml.safe_load(tiny.read_text())
    config["training"]["epochs"] = 4
    path = tmp_path / "slow.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_handlers_raise_a_stop_and_are_restored_after():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Stopped) as stop, stop_handlers():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)
    assert exit_code(stop.value) == 143 and isinstance(stop.value, KeyboardInterrupt)
    assert signal.getsignal(signal.SIGTERM) is before
    assert exit_code(KeyboardInterrupt()) == 130


@pytest.mark.slow
@pytest.mark.parametrize("signal_name, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_run_that_inherited_an_ignored_sigint_stops_cleanly_and_resumes(tiny, tmp_path, signal_name, code):
    out = tmp_path / "out"
    command = [sys.executable, "runner.py", "--config", str(slow_config(tiny, tmp_path)), "--strategy", "er",
               "--output", str(out), "--seed", "5"]
    run = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           preexec_fn=ignore_sigint)
    record = out / "iamcl2r/synthetic/er/seed5/metrics.json"
    wait_for_first_task(record, run)
    with busy_core():
        run.send_signal(getattr(signal, signal_name))
        _, err = run.communicate(timeout=120)
    assert run.returncode == code, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-1].startswith(f"stopped ({'SIGTERM' if code == 143 else 'Ctrl-C / SIGINT'}): finished tasks are "
                                "saved in") and "Traceback" not in err
    assert json.loads(record.read_text())["tasks_completed"] >= 1
    assert main([*command[2:], "--resume", "--no-progress"]) == 0
    assert json.loads(record.read_text())["complete"]


@pytest.mark.slow
def test_a_run_killed_outright_leaves_a_log_that_names_every_task_it_saved(tiny, tmp_path):
    """SIGKILL (SLURM after a time limit's grace, the out-of-memory killer) leaves no time to flush: the log, a
    file, must already hold the line of each task the run saved."""
    out, log = tmp_path / "out", tmp_path / "run.log"
    command = [sys.executable, "runner.py", "--config", str(slow_config(tiny, tmp_path)), "--strategy", "er",
               "--output", str(out), "--seed", "5", "--no-progress"]
    with open(log, "w") as handle:
        buffered = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
        run = subprocess.Popen(command, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT, env=buffered)
        record = out / "iamcl2r/synthetic/er/seed5/metrics.json"
        with busy_core():
            wait_for_first_task(record, run)
            run.kill()
            run.wait()
    assert run.returncode == -signal.SIGKILL and not json.loads(record.read_text())["complete"]
    assert "task 0 (replacement): trained" in log.read_text()


def test_a_stop_inside_deferred_stops_waits_for_the_end_of_the_block():
    reached = []
    with pytest.raises(Stopped) as stop, stop_handlers():
        with deferred_stops():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            reached.append("end of the block")
        reached.append("after the block")
    assert reached == ["end of the block"] and stop.value.signum == signal.SIGTERM


def test_a_second_stop_while_the_first_unwinds_only_says_that_the_process_is_stopping(capfd):
    """A worker under torchrun in a SLURM job gets SLURM's SIGTERM and torchrun's: the second stop must not
    interrupt the first one's saving and its one line."""
    unwound, before = [], signal.getsignal(signal.SIGTERM)
    with stop_handlers():
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
        except Stopped as first:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            unwound.append(first.signum)
    assert unwound == [signal.SIGINT]
    assert "already stopping (kill -9 ends the process at once" in capfd.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before
    with pytest.raises(Stopped), stop_handlers():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)


class StoppedWhileDeleted:
    """An object whose ``__del__`` is where the stop arrives: Python prints that exception as ignored and drops it."""

    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_stop_that_python_dropped_does_not_hold_back_the_next_one():
    before = sys.unraisablehook
    with pytest.raises(Stopped), stop_handlers():
        StoppedWhileDeleted()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
    assert sys.unraisablehook is before


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_single_stop_that_python_dropped_is_delivered_again():
    """One SIGTERM that lands in a ``__del__`` (or a garbage-collector callback: JAX's, which qpsolvers imports for
    Avalanche's GEM, dropped a test run's Ctrl-C, which then trained to its end and exited 0) still stops the
    process."""
    with pytest.raises(Stopped) as stop, stop_handlers():
        StoppedWhileDeleted()
        time.sleep(2)
    assert stop.value.signum == signal.SIGTERM


def test_a_stop_after_the_repeat_window_raises_again_in_case_the_first_was_lost(monkeypatch):
    from cl2r_bench.app import stops

    monkeypatch.setattr(stops, "REPEAT_SECONDS", 0.3)
    with stop_handlers():
        with pytest.raises(Stopped):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
        time.sleep(0.4)
        with pytest.raises(Stopped):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)


def test_a_block_that_fails_keeps_its_own_error_and_drops_the_waiting_stop():
    with pytest.raises(ZeroDivisionError), stop_handlers(), deferred_stops():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        raise ZeroDivisionError


def test_a_stop_while_a_finished_task_is_saved_keeps_that_task(tiny, tmp_path, monkeypatch, capsys):
    """SIGTERM as the first task's checkpoint starts to be written (SLURM stopping a job, say): the run saves the
    task, its state and its record, then stops with 143; the resumed run starts at the next task."""
    from cl2r_bench.app import cli
    from cl2r_bench.app import run_loop as experiment

    original = experiment.save_state

    def stopped_while_saving(state, path):
        if path.name == "task0.pt":
            os.kill(os.getpid(), signal.SIGTERM)
        return original(state, path)

    monkeypatch.setattr(experiment, "save_state", stopped_while_saving)
    args = ["run", "--config", str(tiny), "--scenario", "cl2r", "--set", "replacement.tasks=[]", "--strategy", "er",
            "--output", str(tmp_path / "out"), "--no-progress"]
    assert cli.main(args) == 143
    folder = tmp_path / "out/cl2r/synthetic/er/seed42"
    printed = capsys.readouterr().out
    assert "task 0: trained" in printed and "task 1:" not in printed
    assert json.loads((folder / "metrics.json").read_text())["tasks_completed"] == 1
    monkeypatch.setattr(experiment, "save_state", original)
    assert cli.main([*args, "--resume"]) == 0
    printed = capsys.readouterr().out
    assert f"resuming {folder} at task 1" in printed and "task 0: trained" not in printed


def test_the_stop_message_names_resume_where_the_command_needs_it():
    from cl2r_bench.app.cli import how_to_continue
    assert "--resume" in how_to_continue(["adapt", "--old", "a.pt"])
    assert "--resume" in how_to_continue(["run", "--strategy", "er"])
    assert how_to_continue(["adapt", "--resume"]) == how_to_continue(["embed"]) == "the same command continues"
