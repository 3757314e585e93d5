"""Benchmark: training time per iteration of every registered strategy, as a ratio to ER in the same run.

Each strategy trains one fine-tuning task (task 1 of a stream: 64 new + 64 replay samples per batch when it uses
the memory, 128 new samples otherwise) from the same starting model, with its frozen teacher and its
``before_task`` set-up (class means, frozen classifier) included in the timed part, on the same device-resident
data. Strategies are run interleaved, ``--repeats`` times; the figure per strategy is the median seconds per
iteration and its ratio to ER's median.

    python -m tools.bench_strategies [--backbone small_cnn] [--images 1920] [--epochs 2] [--repeats 3]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from cl2r_bench.data.datasets import ImageSet
from cl2r_bench.data.synthetic import make_synthetic
from cl2r_bench.models import build_model
from cl2r_bench.settings import TrainSettings
from cl2r_bench.training.engine import ReplayMemory, update_memory
from cl2r_bench.training.loop import train_task
from strategies import TaskContext, get_strategy, list_strategies

OLD_CLASSES, NEW_CLASSES = 10, 15


def one_task(name: str, start: dict, new: ImageSet, memory: ImageSet, settings: TrainSettings,
             model_options: dict) -> float:
    """Seconds per iteration of one fine-tuning task of strategy ``name`` (set-up included)."""
    cls = get_strategy(name)
    model = build_model(head=cls.head, num_classes=OLD_CLASSES, **model_options).to(new.images.device)
    model.load_state_dict(start[cls.head])
    strategy = cls.from_params({})
    replay = memory if cls.uses_memory else None
    started = time.perf_counter()
    teacher = copy.deepcopy(model).eval() if cls.needs_teacher else None
    model.head.grow(OLD_CLASSES + NEW_CLASSES)
    strategy.before_task(TaskContext(index=1, num_old_classes=OLD_CLASSES, num_new_classes=NEW_CLASSES,
                                     teacher_classes=OLD_CLASSES if teacher is not None else 0, teacher=teacher,
                                     new_data=new, memory=replay, amp=settings.autocast))
    result = train_task(model, strategy, new, ReplayMemory(20, 0, items=replay), settings, teacher=teacher)
    return (time.perf_counter() - started) / result["iterations"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backbone", default="small_cnn")
    parser.add_argument("--images", type=int, default=1920, help="new-class training images (15 classes)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--strategies", nargs="+", default=None, help="default: every registered strategy")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    names = args.strategies or list_strategies()
    if "er" not in names:
        names = ["er", *names]
    per_class = args.images // NEW_CLASSES
    source = make_synthetic(num_classes=OLD_CLASSES + NEW_CLASSES, train_per_class=per_class)
    labels = source.train.labels
    old = source.train.select(torch.nonzero(labels < OLD_CLASSES).flatten())
    new = source.train.select(torch.nonzero(labels >= OLD_CLASSES).flatten())
    memory = update_memory(None, old, 20, torch.Generator().manual_seed(0))
    new.images, new.labels = new.images.to(device), new.labels.to(device)
    memory.images, memory.labels = memory.images.to(device), memory.labels.to(device)
    settings = TrainSettings.with_defaults(epochs=args.epochs, lr=0.01, progress=False)
    model_options = {"backbone": args.backbone, "mean": source.mean, "std": source.std}
    torch.manual_seed(0)
    start = {head: build_model(head=head, num_classes=OLD_CLASSES, **model_options).state_dict()
             for head in ("learnable", "cosine", "dsimplex")}
    one_task("er", start, new, memory, settings, model_options)  # warm-up
    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.repeats):
        for name in names:
            torch.manual_seed(1)
            times[name].append(one_task(name, start, new, memory, settings, model_options))
    print(f"device {device}, backbone {args.backbone}, {len(new)} new + {len(memory)} replay images, "
          f"{args.epochs} epochs, batch 128, {args.repeats} interleaved repeats, torch threads "
          f"{torch.get_num_threads()}")
    baseline = statistics.median(times["er"])
    print(f"{'strategy':>14}  {'ms / iteration':>14}  {'ratio to er':>11}  runs (ms)")
    for name in names:
        median = statistics.median(times[name])
        print(f"{name:>14}  {1000 * median:14.1f}  {median / baseline:11.2f}  "
              f"{[round(1000 * t, 1) for t in times[name]]}")


if __name__ == "__main__":
    main()
