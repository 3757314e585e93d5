"""The training protocol of the authors' code (METHODS.md §4): epoch length, replay draws, schedule stepping."""
import math

import pytest
import torch

from cl2r_bench.data.datasets import ImageSet
from cl2r_bench.errors import ConfigError
from cl2r_bench.training.engine import DeviceBatches, scheduled_lr
from cl2r_bench.training_settings import TrainSettings


def image_set(n: int, label_offset: int = 0) -> ImageSet:
    return ImageSet(torch.zeros(n, 3, 4, 4, dtype=torch.uint8), torch.arange(n) + label_offset)


def batches(new: int, memory: int, epoch_length: str = "reference") -> DeviceBatches:
    return DeviceBatches(image_set(new), image_set(memory, 10_000) if memory else None, new_batch=64 if memory else 128,
                         memory_batch=64, epoch_length=epoch_length)


def test_reference_epoch_length_of_the_7_task_split():
    """Task 0: 10 classes x 300 = 3,000 images -> 3000 // 128 = 23 batches (last partial batch dropped).
    Task 1: 15 x 300 = 4,500 new + 10 x 20 = 200 memory -> 4700 // 128 = 36 batches; task 6: 4,500 + 1,700."""
    assert len(batches(3000, 0)) == 23
    assert len(batches(4500, 200)) == 36
    assert len(batches(4500, 1700)) == 48
    assert len(batches(4500, 200, "full_pass")) == 71


def test_reference_epoch_has_its_counted_batches_of_64_new_and_64_replay():
    epoch = list(batches(4500, 200))
    assert len(epoch) == 36
    for _, labels, from_memory in epoch:
        assert int(from_memory.sum()) == 64 and int((~from_memory).sum()) == 64
        assert bool((labels[from_memory] >= 10_000).all()) and bool((labels[~from_memory] < 10_000).all())


def test_reference_halves_are_drawn_without_replacement_inside_a_batch():
    torch.manual_seed(0)
    for _, labels, from_memory in batches(300, 100):
        assert len(labels[from_memory].unique()) == 64
        assert len(labels[~from_memory].unique()) == 64


def test_reference_memory_smaller_than_its_half_is_drawn_with_replacement():
    """The authors' ``np.random.choice(..., replace=len(indices) <= size)``: 40 exemplars fill 64 slots."""
    torch.manual_seed(0)
    _, labels, from_memory = next(iter(batches(500, 40)))
    assert int(from_memory.sum()) == 64
    assert len(labels[from_memory].unique()) <= 40


def test_reference_task_without_memory_is_a_shuffled_pass_dropping_the_last_batch():
    torch.manual_seed(0)
    seen = torch.cat([labels for _, labels, _ in batches(300, 0)])
    assert len(seen) == 256 and len(seen.unique()) == 256


def test_schedule_is_stepped_once_per_epoch():
    """CosineAnnealingLR(T_max=70, eta_min=1e-5) stepped after each epoch: constant within an epoch."""
    settings = TrainSettings.with_defaults(epochs=70, lr=1e-3, lr_min=1e-5)
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1e-3)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=70, eta_min=1e-5)
    for epoch in range(70):
        for iteration in (epoch * 36, epoch * 36 + 35):
            assert scheduled_lr(iteration, 36, settings) == pytest.approx(optimizer.param_groups[0]["lr"], rel=1e-9)
        optimizer.step()
        scheduler.step()


def test_iteration_schedule_reaches_the_minimum_at_the_last_step():
    settings = TrainSettings.with_defaults(epochs=2, lr=0.1, lr_min=0.001, schedule_step="iteration")
    assert scheduled_lr(0, 10, settings) == pytest.approx(0.1)
    assert scheduled_lr(10, 10, settings) == pytest.approx(0.001 + 0.5 * 0.099 * (1 + math.cos(math.pi / 2)))


@pytest.mark.parametrize("key, value", [("epoch_length", "pass"), ("schedule_step", "batch"), ("amp_dtype", "fp8")])
def test_unknown_protocol_values_are_config_errors(key, value):
    with pytest.raises(ConfigError, match=f"training.{key}"):
        TrainSettings.with_defaults(**{key: value})


def test_the_runner_rejects_a_bad_protocol_value_before_any_run(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    runner = Path(__file__).resolve().parents[2] / "runner.py"
    done = subprocess.run([sys.executable, str(runner), "--scenario", "model_update", "--dataset", "synthetic",
                           "--preset", "quick", "--set", "training.epoch_length=pass",
                           "--set", "stream.initial_classes=30",
                           "--set", "stream.increment=30", "--output", str(tmp_path)],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip() == "error: training.epoch_length must be one of ['reference', 'full_pass'], not 'pass'"
    assert not any(tmp_path.iterdir())
