"""Benchmark: training time per iteration of every registered strategy, as a ratio to ER in the same run.

Each strategy trains one task from the same starting models, with its frozen teacher, its ``before_task`` set-up
(class means, frozen classifier) and its own head included in the timed part, on the same device-resident data
(64 new + 64 replay samples per batch when it uses the memory, 128 new samples otherwise). Strategies run
interleaved, ``--repeats`` times; the figure per strategy is the median seconds per iteration and its ratio to ER's.

* ``--setting images`` (default): task 1 of a stream of small synthetic images (``--backbone``), 10 old and 15 new
  classes, the new model fine-tuning the old one.
* ``--setting track``: the pretrained-backbone track's shapes (docs/METHODS.md §4b) in the upgrade protocol's task 1:
  items are ``--feature-dim``-wide cached encoder features (1280: EfficientNet-Lite0's), every model the track's
  embedding network (1024 hidden, 512 out) under its strategy's head, 100 old and 100 new classes; the new model is
  built afresh over the 512-d old model (so OCA's head is its 544-d orthogonal layer over it and BT²'s its two 512-d
  ones, as in the track's zoo), the old model is the teacher and an untrained learnable model BT²'s independent
  model. Only the shapes matter for the time per iteration: the features are Gaussian classes. The track's learning
  rate (1e-3): BT²'s and OCA's orthogonal layers cost more as their generators grow, which the learning rate sets.
  The frozen models' outputs are tabled once per task on features (:mod:`cl2r_bench.training.frozen_outputs`), in
  the timed part: a run of fewer epochs than the track's 10 overstates what they cost an iteration.

A strategy may be named with settings, ``NAME:KEY=VALUE,...`` (values read as YAML), to time a variant beside
its default: ``--strategies er bt2 bt2:orthogonal_map=cayley``.

    python -m tools.bench_strategies [--setting images|track] [--images N] [--epochs 2] [--repeats 3]
                                     [--strategies er oca bt2 bt2:orthogonal_map=cayley]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time
from dataclasses import dataclass

import torch
import yaml

from cl2r_bench.data.datasets import ImageSet
from cl2r_bench.data.synthetic import make_synthetic
from cl2r_bench.models import RetrievalModel, build_model, head_over
from cl2r_bench.training.engine import ReplayMemory, update_memory
from cl2r_bench.training.loop import train_task
from cl2r_bench.training_settings import TrainSettings
from strategies import TaskContext, get_strategy, list_strategies

MEMORY_PER_CLASS = 20


@dataclass
class Setting:
    """One benchmark setting: the task's data, the old classes' replay memory and how models are built."""

    new: ImageSet
    memory: ImageSet
    old_classes: int
    new_classes: int
    model_options: dict
    fresh_new_model: bool
    """True: the new model is built afresh over the old one (upgrade); False: it fine-tunes a copy of it."""


def image_setting(backbone: str, images: int, device: torch.device) -> Setting:
    """Task 1 of a synthetic image stream: 10 old classes, 15 new ones, ``images`` new-class images."""
    old_classes, new_classes = 10, 15
    source = make_synthetic(num_classes=old_classes + new_classes, train_per_class=images // new_classes)
    labels = source.train.labels
    old = source.train.select(torch.nonzero(labels < old_classes).flatten())
    new = source.train.select(torch.nonzero(labels >= old_classes).flatten())
    return Setting(on_device(new, device), on_device(replay_memory(old), device), old_classes, new_classes,
                   {"backbone": backbone, "mean": source.mean, "std": source.std}, fresh_new_model=False)


def track_setting(feature_dim: int, images: int, device: torch.device) -> Setting:
    """The track's upgrade task 1 in shapes: ``images`` items of 200 Gaussian classes of ``feature_dim`` features."""
    old_classes = new_classes = 100
    generator = torch.Generator().manual_seed(0)
    labels = torch.arange(old_classes + new_classes).repeat_interleave(images // (old_classes + new_classes))
    centres = torch.randn(old_classes + new_classes, feature_dim, generator=generator)
    items = ImageSet(centres[labels] + 2 * torch.randn(len(labels), feature_dim, generator=generator), labels)
    old = items.select(torch.nonzero(labels < old_classes).flatten())
    return Setting(on_device(items, device), on_device(replay_memory(old), device), old_classes, new_classes,
                   {"backbone": "frozen_encoder", "feature_dim": feature_dim}, fresh_new_model=True)


def replay_memory(old: ImageSet) -> ImageSet:
    return update_memory(None, old, MEMORY_PER_CLASS, torch.Generator().manual_seed(0))


def on_device(data: ImageSet, device: torch.device) -> ImageSet:
    return ImageSet(data.images.to(device), data.labels.to(device))


def strategy_variant(label: str) -> tuple[str, dict]:
    """``(strategy name, settings)`` of a ``--strategies`` entry ``NAME`` or ``NAME:KEY=VALUE,...``."""
    name, _, assignments = label.partition(":")
    params = {}
    for assignment in filter(None, assignments.split(",")):
        key, equals, value = assignment.partition("=")
        if not equals:
            raise SystemExit(f"--strategies {label}: write each setting as KEY=VALUE, e.g. bt2:orthogonal_map=cayley")
        params[key] = yaml.safe_load(value)
    return name, params


def task_models(name: str, params: dict, setting: Setting,
                old_states: dict) -> tuple[RetrievalModel, RetrievalModel | None, RetrievalModel | None]:
    """``(model to train, teacher or None, independent model or None)`` of strategy ``name`` with ``params`` on
    ``setting``."""
    cls = get_strategy(name)
    device = setting.new.images.device
    family = "learnable" if cls.head in ("bt2", "oca") else cls.head
    old = build_model(head=family, num_classes=setting.old_classes, **setting.model_options).to(device)
    old.load_state_dict(old_states[family])
    seen = setting.old_classes + setting.new_classes
    if setting.fresh_new_model:
        head, options = head_over(cls.head, old.head.feature_width)
        model = build_model(head=head, num_classes=seen, head_options={**cls.from_params(params).head_options(),
                                                                       **options}, **setting.model_options)
    else:
        model = copy.deepcopy(old)
        model.head.grow(seen)
    independent = (build_model(head="learnable", num_classes=seen, **setting.model_options).to(device).eval()
                   if cls.needs_independent else None)
    return model.to(device), old.eval() if cls.needs_teacher else None, independent


def one_task(label: str, setting: Setting, old_states: dict, settings: TrainSettings) -> float:
    """Seconds per iteration of one task of the strategy ``label`` names (:func:`strategy_variant`; set-up
    included)."""
    name, params = strategy_variant(label)
    cls = get_strategy(name)
    strategy = cls.from_params(params)
    replay = setting.memory if cls.uses_memory else None
    started = time.perf_counter()
    model, teacher, independent = task_models(name, params, setting, old_states)
    strategy.before_task(TaskContext(index=1, num_old_classes=setting.old_classes,
                                     num_new_classes=setting.new_classes,
                                     teacher_classes=setting.old_classes if teacher is not None else 0,
                                     teacher=teacher, new_data=setting.new, memory=replay, amp=settings.autocast,
                                     model=model, independent=independent))
    result = train_task(model, strategy, setting.new, ReplayMemory(MEMORY_PER_CLASS, 0, items=replay), settings,
                        teacher=teacher, independent=independent)
    return (time.perf_counter() - started) / result["iterations"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setting", choices=("images", "track"), default="images")
    parser.add_argument("--backbone", default="small_cnn", help="--setting images: the backbone")
    parser.add_argument("--feature-dim", type=int, default=1280, help="--setting track: the encoder's width")
    parser.add_argument("--images", type=int, default=None,
                        help="training items of the task (default 1920 images; on the track 60,000 features: 200 "
                             "classes x 300, upgrade's task 1)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--strategies", nargs="+", default=None,
                        help="default: every registered strategy; NAME:KEY=VALUE,... times a variant")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    names = args.strategies or list_strategies()
    if "er" not in names:
        names = ["er", *names]
    setting = (track_setting(args.feature_dim, args.images or 60_000, device) if args.setting == "track"
               else image_setting(args.backbone, args.images or 1920, device))
    settings = TrainSettings.with_defaults(epochs=args.epochs, lr=0.001 if args.setting == "track" else 0.01,
                                           progress=False)
    torch.manual_seed(0)
    old_states = {head: build_model(head=head, num_classes=setting.old_classes, **setting.model_options).state_dict()
                  for head in ("learnable", "cosine", "dsimplex")}
    one_task("er", setting, old_states, settings)  # warm-up
    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.repeats):
        for name in names:
            torch.manual_seed(1)
            times[name].append(one_task(name, setting, old_states, settings))
    print(f"device {device}, setting {args.setting}, {len(setting.new)} new + {len(setting.memory)} replay items, "
          f"{args.epochs} epochs, batch 128, {args.repeats} interleaved repeats, torch threads "
          f"{torch.get_num_threads()}")
    baseline = statistics.median(times["er"])
    print(f"{'strategy':>30}  {'ms / iteration':>14}  {'ratio to er':>11}  runs (ms)")
    for name in names:
        median = statistics.median(times[name])
        print(f"{name:>30}  {1000 * median:14.1f}  {median / baseline:11.2f}  "
              f"{[round(1000 * t, 1) for t in times[name]]}")


if __name__ == "__main__":
    main()
