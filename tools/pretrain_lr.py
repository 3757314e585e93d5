"""Which learning rate pretrains the track's replacement models (docs/METHODS.md §4b): the validation accuracy of
embedding networks pretrained by the track's recipe (``--preset pretrained``'s ``replacement.pretrain``: plateau
schedule, 300 images per class) at each learning rate, on seeded draws of Tiny ImageNet classes, both head families.

    python -m tools.pretrain_lr --data-root DATA [--lrs 0.1 0.01] [--class-counts 25 50 100] [--draws 5]
                                [--epochs N] [--encoder efficientnet_lite:lite0]

Prints one Markdown row per class count, head and learning rate: the best validation accuracy (on the classes' own
test images, as the plateau rule reads them) of the classes a run of the preset pretrains on by default (the first
ones after the stream's 100 in the natural class order, ``seed_scope: training``; initialisation seed 0), then of
each seeded draw of classes (as ``seed_scope: split`` draws them; initialisation seed = the draw), and the lowest.
``--epochs 1`` is the quick look (the first epoch alone); without it each model trains until its plateau, as a
replacement does. Reads the encoder's features from ``model_update.feature_cache`` (embedded there first when
absent: hours on 2 CPU cores).
"""
from __future__ import annotations

import argparse
import dataclasses
import random
import tempfile
from pathlib import Path

import torch

from cl2r_bench.config import resolve
from cl2r_bench.data.datasets import load_dataset
from cl2r_bench.encoders import build_encoder
from cl2r_bench.feature_cache import feature_splits
from cl2r_bench.settings import RunSettings
from cl2r_bench.training.pretrain import pretrain_model

HEADS = ("dsimplex", "learnable")


def best_accuracy(features, classes: list[int], head: str, lr: float, epochs: int | None, seed: int,
                  settings: RunSettings) -> float:
    """The best validation accuracy of one model pretrained on ``classes`` by the track's recipe at ``lr``."""
    pre = settings.replacement.pretrain
    train = dataclasses.replace(pre.train_settings(settings.training), lr=lr, progress=False,
                                epochs=epochs or pre.epochs)
    with tempfile.TemporaryDirectory() as scratch:
        _, log = pretrain_model(features, classes, head=head, model_kwargs=settings.model.build_kwargs,
                                settings=train, images_per_class=pre.images_per_class, device=torch.device("cpu"),
                                seed=seed, plateau=pre.plateau, partial=Path(scratch) / "partial.pt",
                                log=lambda _: None)
    return float(log["best_accuracy"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", default="data")
    parser.add_argument("--lrs", type=float, nargs="+", default=[0.1, 0.01])
    parser.add_argument("--class-counts", type=int, nargs="+", default=[25, 50, 100])
    parser.add_argument("--draws", type=int, default=5, help="seeded class draws (and initialisations) per cell")
    parser.add_argument("--epochs", type=int, default=None, help="cap on epochs (default: the preset's plateau cap)")
    parser.add_argument("--encoder", default="efficientnet_lite:lite0")
    args = parser.parse_args()
    settings = RunSettings.from_config(resolve([("tools.pretrain_lr", {"scenario": "iamcl2r", "preset": "pretrained",
                                                                       "data_root": args.data_root})]))
    data = load_dataset("tinyimagenet", args.data_root, image_size=64)
    features = feature_splits(data, [build_encoder(args.encoder)],
                              {"train": settings.replacement.pretrain.images_per_class, "test": None},
                              cache_dir=settings.model_update.feature_cache,
                              batch_size=settings.model_update.encoder_batch_size, progress=False)
    epochs = f"{args.epochs} epochs" if args.epochs else "until the plateau"
    print(f"| classes | head | lr | natural order | seeded draws ({epochs}) | lowest |\n|---|---|---|---|---|---|",
          flush=True)
    stream = settings.stream.initial_classes + settings.stream.increment * (settings.stream.num_tasks - 1)
    for count in args.class_counts:
        pools = [list(range(stream, stream + count))] + [
            random.Random(draw).sample(range(data.num_classes), count) for draw in range(args.draws)]
        for head in HEADS:
            for lr in args.lrs:
                found = [best_accuracy(features, classes, head, lr, args.epochs, max(draw - 1, 0), settings)
                         for draw, classes in enumerate(pools)]
                print(f"| {count} | {head} | {lr:g} | {found[0]:.3f} | {' '.join(f'{a:.3f}' for a in found[1:])} "
                      f"| {min(found):.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
