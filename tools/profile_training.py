"""Where the training loop's time goes: the suite's loop (:func:`cl2r_bench.training.loop.train_task`, the bench of
``tools/bench_training_loop.py``) run once under the torch profiler, split by the regions the loop labels.

The labels are ``cl2r.batch`` (indexing the device-resident images of a batch, :class:`DeviceBatches`), nested in
it ``cl2r.augmentation`` (the random crop and flip), then ``cl2r.forward`` (the model and the frozen teacher),
``cl2r.loss`` (the strategy's loss), ``cl2r.backward`` and ``cl2r.optimizer`` (the learning rate, the gradient
scaler and the SGD step). For each region it prints the host time spent inside it and, on CUDA, the device time
of the kernels it launched; ``other`` is the profiled wall time outside every region (Avalanche's callbacks, the
index draws, the progress bar, the loss read every 25 iterations). The device's busy share (kernel time over
wall time) says whether the loop waits on the GPU (near 1) or on Python and kernel launches (well below 1).
The profiler slows the host; the unprofiled wall time and images per second of the same run come first.

    python -m tools.profile_training --backbone resnet18 --strategy dsimplex_hoc --images 16384 --epochs 1 \\
        --amp float16 [--channels-last] [--compile [MODE]] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from tools.bench_training_loop import Bench, Variant, add_loop_arguments, build_bench, loop_variant, suite_loop

REGIONS = ("cl2r.batch", "cl2r.augmentation", "cl2r.forward", "cl2r.loss", "cl2r.backward", "cl2r.optimizer")
"""The loop's labelled regions; ``cl2r.augmentation`` is nested in ``cl2r.batch``, the others are disjoint."""
TOP_LEVEL = tuple(name for name in REGIONS if name != "cl2r.augmentation")


def profile_once(bench: Bench, variant: Variant) -> dict:
    """One warm-up run, one unprofiled run and one profiled run of the suite's loop under ``variant``; the seconds
    of each region (host and device) and the device's busy share."""
    bench.run(suite_loop, variant)
    plain = bench.run(suite_loop, variant)
    device = bench.data.images.device
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profiler:
        profiled = bench.run(suite_loop, variant)
    regions, kernels = region_seconds(profiler.key_averages())
    inside = sum(regions[name]["host_s"] for name in TOP_LEVEL)
    return {"variant": variant.name, "device": str(device), "iterations": plain.iterations, "images": plain.images,
            "wall_s": plain.seconds, "images_per_second": plain.images / plain.seconds,
            "profiled_wall_s": profiled.seconds, "regions": regions,
            "other_host_s": max(profiled.seconds - inside, 0.0), "device_kernel_s": kernels,
            "device_busy_share": kernels / profiled.seconds if device.type == "cuda" else None}


def region_seconds(averages: list) -> tuple[dict[str, dict[str, float]], float]:
    """Each region's host seconds and the device seconds of the kernels launched inside it, and the seconds of
    every kernel of the run, counted as the profiler's own table counts them. A region appears twice in
    ``averages`` on CUDA: as the host range (whose device time is its kernels') and as a user annotation spanning
    it on the GPU timeline (idle gaps included), which is skipped, as it is in the kernel total. Backward kernels
    run on autograd's thread, outside the ``cl2r.backward`` host range: the kernel total less the regions' device
    seconds is mostly theirs."""
    regions: dict[str, dict[str, float]] = {name: {"host_s": 0.0, "device_s": 0.0} for name in REGIONS}
    for event in averages:
        if event.key in REGIONS and event.device_type == torch.autograd.DeviceType.CPU:
            regions[event.key]["host_s"] += event.cpu_time_total / 1e6
            regions[event.key]["device_s"] += event.device_time_total / 1e6
    kernels = sum(event.self_device_time_total for event in averages
                  if event.device_type == torch.autograd.DeviceType.CUDA and not event.is_user_annotation) / 1e6
    return regions, kernels


def report(result: dict) -> str:
    """A Markdown table of :func:`profile_once`'s result, each region's share of the profiled wall time."""
    wall = result["profiled_wall_s"]
    lines = [f"{result['variant']} on {result['device']}: {result['iterations']} iterations, unprofiled "
             f"{result['wall_s']:.2f} s ({result['images_per_second']:.0f} images/s); profiled {wall:.2f} s",
             "", "| region | host s | host share | device s |", "|---|---:|---:|---:|"]
    for name in REGIONS:
        timing = result["regions"][name]
        lines.append(f"| {name} | {timing['host_s']:.3f} | {timing['host_s'] / wall:.1%} | "
                     f"{timing['device_s']:.3f} |")
    lines.append(f"| other (outside every region) | {result['other_host_s']:.3f} | "
                 f"{result['other_host_s'] / wall:.1%} | |")
    if result["device_busy_share"] is not None:
        attributed = sum(result["regions"][name]["device_s"] for name in TOP_LEVEL)
        lines.append(f"\ndevice kernels {result['device_kernel_s']:.2f} s: busy {result['device_busy_share']:.1%} "
                     f"of the profiled wall time; {result['device_kernel_s'] - attributed:.2f} s of them outside "
                     "the regions' host ranges (the backward's, on autograd's thread)")
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_loop_arguments(parser, backbone="resnet18", strategy="dsimplex_hoc", images=16384, epochs=1, amp="float16")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    result = profile_once(build_bench(args), loop_variant(args))
    print(report(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
