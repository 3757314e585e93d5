"""Experiment logging (cl2r_bench.tracking): written TensorBoard scalars are read back and checked exactly.

Values are powers-of-two fractions so that TensorBoard's float32 storage keeps them exact."""
import builtins
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from cl2r_bench.tracking import NullTracker, TensorBoardTracker, TrackingError, make_tracker


def read_scalars(log_dir):
    """``{tag: [(step, value), ...]}`` of every events file in ``log_dir``."""
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def log_two_tasks(tracker):
    """Task 0: 60 iterations (calls at 25, 50 and the last, 60); task 1: 30 iterations (25, 30)."""
    tracker.train_step(0, 25, 2.5, 0.5)
    tracker.train_step(0, 50, 2.0, 0.25)
    tracker.train_step(0, 60, 1.75, 0.125)
    tracker.task_finished(0, [0.5], {"AC": None, "AA": 0.5})
    tracker.train_step(1, 25, 1.5, 0.5)
    tracker.train_step(1, 30, 1.25, 0.0625)
    tracker.task_finished(1, [0.25, 0.75], {"AC": 1.0, "AA": 0.5})


def test_tensorboard_scalars_exact(tmp_path):
    tracker = make_tracker(True, tmp_path / "tensorboard")
    assert isinstance(tracker, TensorBoardTracker)
    log_two_tasks(tracker)
    tracker.close()
    tracker.close()

    assert read_scalars(tmp_path / "tensorboard") == {
        "train/loss": [(25, 2.5), (50, 2.0), (60, 1.75), (85, 1.5), (90, 1.25)],
        "train/lr": [(25, 0.5), (50, 0.25), (60, 0.125), (85, 0.5), (90, 0.0625)],
        "compatibility/M[0][0]": [(0, 0.5)],
        "compatibility/M[1][0]": [(1, 0.25)],
        "compatibility/M[1][1]": [(1, 0.75)],
        "metrics/AC": [(1, 1.0)],
        "metrics/AA": [(0, 0.5), (1, 0.5)],
    }


def test_global_step_monotonic_across_tasks(tmp_path):
    """The step counts the run's iterations: task 1 continues after task 0's last (60), a retrained task goes on."""
    tracker = TensorBoardTracker(tmp_path)
    log_two_tasks(tracker)
    assert tracker.global_step == 90
    tracker.train_step(1, 25, 1.0, 0.5)
    tracker.train_step(2, 0, 1.0, 0.5)
    tracker.close()
    steps = [step for step, _ in read_scalars(tmp_path)["train/loss"]]
    assert steps == [25, 50, 60, 85, 90, 115, 116]


def test_resumed_run_appends_after_last_step(tmp_path):
    first = TensorBoardTracker(tmp_path)
    first.train_step(0, 25, 2.5, 0.5)
    first.train_step(0, 40, 2.0, 0.5)
    first.close()
    second = TensorBoardTracker(tmp_path)
    assert second.global_step == 40
    second.train_step(1, 25, 1.5, 0.5)
    second.task_finished(1, [0.25, 0.5], {"AA": 0.375})
    second.close()

    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2
    scalars = read_scalars(tmp_path)
    assert scalars["train/loss"] == [(25, 2.5), (40, 2.0), (65, 1.5)]
    assert scalars["metrics/AA"] == [(1, 0.375)]


def test_resume_reads_past_truncated_record(tmp_path):
    """A killed run can leave a record cut short; the records before it still count (loss@50 precedes lr@50)."""
    first = TensorBoardTracker(tmp_path)
    first.train_step(0, 25, 2.5, 0.5)
    first.train_step(0, 50, 2.0, 0.5)
    first.close()
    (events,) = tmp_path.glob("events.out.tfevents.*")
    events.write_bytes(events.read_bytes()[:-3])
    second = TensorBoardTracker(tmp_path)
    assert second.global_step == 50
    second.close()


def test_null_tracker_writes_nothing(tmp_path):
    tracker = make_tracker(False, tmp_path / "tensorboard")
    assert isinstance(tracker, NullTracker)
    log_two_tasks(tracker)
    tracker.close()
    assert list(tmp_path.iterdir()) == []


def _hide_by_sys_modules(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)


def _hide_by_import(monkeypatch):
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name.startswith(("tensorboard", "torch.utils.tensorboard")):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)


@pytest.mark.parametrize("hide", [_hide_by_sys_modules, _hide_by_import])
def test_missing_tensorboard_one_line_error(tmp_path, monkeypatch, hide):
    hide(monkeypatch)
    with pytest.raises(TrackingError) as info:
        make_tracker(True, tmp_path / "tensorboard")
    message = str(info.value)
    assert isinstance(info.value, RuntimeError)
    assert "\n" not in message
    assert "pip install tensorboard" in message
    assert not (tmp_path / "tensorboard").exists()


def test_a_run_with_tensorboard_logs_its_losses_matrix_rows_and_metrics(tiny, tmp_path):
    """``--tensorboard`` on a 3-task run: the logged matrix entries and running AC / AA are the record's own."""
    import json

    from cl2r_bench.app import cli

    out = tmp_path / "out"
    assert cli.main(["--config", str(tiny), "--strategy", "er", "--output", str(out), "--tensorboard"]) == 0
    run = out / "iamcl2r" / "synthetic" / "er" / "seed42"
    record = json.loads((run / "metrics.json").read_text())
    scalars = read_scalars(run / "tensorboard")
    matrix = record["compatibility_matrix"]
    for t in range(3):
        for k in range(t + 1):
            assert scalars[f"compatibility/M[{t}][{k}]"] == [(t, pytest.approx(matrix[t][k]))]
    assert scalars["metrics/AC"][-1] == (2, pytest.approx(record["metrics"]["AC"]))
    assert scalars["metrics/AA"][-1] == (2, pytest.approx(record["metrics"]["AA"]))
    losses = scalars["train/loss"]
    assert losses and [step for step, _ in losses] == sorted(step for step, _ in losses)
