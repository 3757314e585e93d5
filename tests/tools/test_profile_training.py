"""tools/profile_training.py: the training loop's labelled regions, and how their seconds are counted."""
from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest
import torch

from tools.bench_training_loop import Variant, build_bench
from tools.profile_training import REGIONS, TOP_LEVEL, profile_once, region_seconds

CPU, CUDA = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA


def event(key: str, device_type, *, cpu_us: float = 0.0, device_us: float = 0.0, self_device_us: float = 0.0,
          annotation: bool = False) -> SimpleNamespace:
    return SimpleNamespace(key=key, device_type=device_type, cpu_time_total=cpu_us, device_time_total=device_us,
                           self_device_time_total=self_device_us, is_user_annotation=annotation)


def test_a_region_counts_its_host_range_and_the_kernel_total_skips_annotations_and_host_ops():
    averages = [
        event("cl2r.forward", CPU, cpu_us=2_000_000, device_us=1_500_000),
        event("cl2r.forward", CUDA, device_us=1_900_000, self_device_us=1_900_000, annotation=True),
        event("aten::convolution", CPU, cpu_us=500_000, device_us=1_000_000, self_device_us=1_000_000),
        event("void conv_kernel", CUDA, device_us=1_000_000, self_device_us=1_000_000),
        event("void bn_kernel", CUDA, device_us=750_000, self_device_us=750_000),
    ]
    regions, kernels = region_seconds(averages)
    assert regions["cl2r.forward"] == {"host_s": 2.0, "device_s": 1.5}
    assert regions["cl2r.backward"] == {"host_s": 0.0, "device_s": 0.0}
    assert kernels == pytest.approx(1.75)


def test_every_region_of_the_suites_loop_is_labelled_and_timed():
    args = argparse.Namespace(backbone="small_cnn", strategy="dsimplex_hoc", images=256, epochs=1, batch_size=64,
                              device="cpu")
    result = profile_once(build_bench(args), Variant())
    assert result["iterations"] == 4 and result["images"] == 256
    assert set(result["regions"]) == set(REGIONS)
    assert all(result["regions"][name]["host_s"] > 0 for name in REGIONS)
    inside = sum(result["regions"][name]["host_s"] for name in TOP_LEVEL)
    assert inside + result["other_host_s"] == pytest.approx(result["profiled_wall_s"], rel=1e-6)
    assert result["regions"]["cl2r.augmentation"]["host_s"] <= result["regions"]["cl2r.batch"]["host_s"]
    assert result["device_busy_share"] is None
