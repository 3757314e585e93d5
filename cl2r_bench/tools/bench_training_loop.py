"""Benchmark: the suite's training loop (Avalanche template + strategy + trainer) against a plain PyTorch loop.

Both loops train the same model architecture from the same initial weights on the same device-resident data with
the same batches (``DeviceBatches``), optimizer and schedule; the suite's loop adds Avalanche's callbacks, the
strategy indirection and the progress bar. Runs are interleaved and repeated; the figure is the ratio of the
median times (target <= 1.10).

    python -m cl2r_bench.tools.bench_training_loop [--backbone small_cnn] [--images 2048] [--epochs 2] [--repeats 3]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import torch.nn.functional as F


from cl2r_bench.models import build_model
from scenarios.datasets import make_synthetic
from strategies import get_strategy
from cl2r_bench.settings import TrainSettings
from cl2r_bench.training.engine import DeviceBatches, make_optimizer, scheduled_lr, train_task


def plain_loop(model, data, settings) -> float:
    """The reference: a hand-written PyTorch loop doing the same work (the model normalises its uint8 batches)."""
    batches = DeviceBatches(data, None, new_batch=settings.batch_size, memory_batch=0,
                            epoch_length=settings.epoch_length)
    optimizer = make_optimizer(model, settings)
    step = 0
    model.train()
    started = time.perf_counter()
    for _ in range(settings.epochs):
        for images, labels, _ in batches:
            optimizer.zero_grad()
            logits, _ = model(images)
            loss = F.cross_entropy(logits, model.class_targets(labels))
            loss.backward()
            for group in optimizer.param_groups:
                group["lr"] = scheduled_lr(step, len(batches), settings)
            optimizer.step()
            step += 1
    if data.images.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


def suite_loop(model, data, settings) -> float:
    return train_task(model, get_strategy("er").from_params({}), data, None, settings)["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backbone", default="small_cnn")
    parser.add_argument("--images", type=int, default=2048)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    source = make_synthetic(num_classes=20, train_per_class=args.images // 20 + 1)
    data = source.train.select(torch.arange(args.images))
    data.images, data.labels = data.images.to(device), data.labels.to(device)
    settings = TrainSettings.with_defaults(epochs=args.epochs, batch_size=args.batch_size, lr=0.01, amp=False, progress=True)
    torch.manual_seed(0)
    initial = build_model(backbone=args.backbone, head="learnable", num_classes=20, mean=source.mean,
                          std=source.std).to(device)
    loops = {"plain": plain_loop, "suite": suite_loop}
    suite_loop(copy.deepcopy(initial), data, settings)  # warm-up (imports, allocator)
    times: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(args.repeats):
        for name, loop in loops.items():
            torch.manual_seed(1)
            times[name].append(loop(copy.deepcopy(initial), data, settings))
    images = args.epochs * args.images
    print(f"device {device}, backbone {args.backbone}, {args.images} images x {args.epochs} epochs, "
          f"batch {args.batch_size}, {args.repeats} interleaved repeats, torch threads {torch.get_num_threads()}")
    for name in loops:
        median = statistics.median(times[name])
        print(f"{name:>5}: median {median:.2f}s  ({images / median:.0f} images/s)  runs {[round(t, 2) for t in times[name]]}")
    ratio = statistics.median(times["suite"]) / statistics.median(times["plain"])
    print(f"ratio suite / plain = {ratio:.3f} (target <= 1.10)")


if __name__ == "__main__":
    main()
