"""Out-of-the-box compatibility of suite-pretrained models: query with one model, search another's gallery.

    python -m tools.cross_model --config CONFIG.yaml MODEL.pt [MODEL.pt ...] [--data-root DIR] [--queries N]

CONFIG is any run's ``config.yaml`` (its evaluation set is used: query and gallery as in METHODS.md §3, gallery
as class templates when ``evaluation.mode`` is templates). Each MODEL is a cache file of ``runner.py pretrain``
(its ``.json`` beside it gives the head, backbone and classes). Every model embeds the query and gallery once;
the table has a row per query model and a column per gallery model, with top-1 accuracy and its Wilson interval
(benchmarks/noise.py). The diagonal is each model's own accuracy; off the diagonal, chance is 1 / classes.
The fidelity study uses it to show that a shared initialisation alone makes independently trained models
compatible (results/fidelity/README.md).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from tabulate import tabulate

from benchmarks.noise import wilson_interval
from benchmarks.retrieval import gallery_accuracy
from cl2r_bench.app.assembly import assemble
from cl2r_bench.app.run_loop import to_device
from cl2r_bench.config import read_yaml, resolve
from cl2r_bench.data.datasets import ImageSet
from cl2r_bench.models import DEFAULT_AMP, embed
from cl2r_bench.training.pretrain import load_cached_model


def model_name(spec: dict) -> str:
    return f"{spec['head']} {len(spec['classes'])} cls, seed {spec['seed']}"


def cross_accuracies(models: list[torch.nn.Module], query: ImageSet, gallery: ImageSet, *, mode: str,
                     amp: bool | str = DEFAULT_AMP) -> list[list[float]]:
    """``A[i][j]``: top-1 accuracy of model i's queries against model j's gallery (``mode`` as
    ``evaluation.mode``); each model embeds the query and the gallery once, on its own device, with its own
    normalisation."""
    embedded = [(embed(model, query.images, amp=amp), embed(model, gallery.images, amp=amp)) for model in models]
    return [[gallery_accuracy(q, query.labels, g, gallery.labels, mode) for _, g in embedded] for q, _ in embedded]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="+", type=Path, help="cached pretrained models (.pt with .json beside)")
    parser.add_argument("--config", required=True, help="a run's config.yaml: the evaluation set to use")
    parser.add_argument("--data-root", help="override data_root of the config")
    parser.add_argument("--queries", type=int, help="use only the first N queries (default: all)")
    args = parser.parse_args(argv)
    layer = read_yaml(args.config)
    if args.data_root:
        layer["data_root"] = args.data_root
    parts = assemble(resolve([(args.config, layer)]))
    settings, stream, device = parts.settings, parts.scenario.stream(), parts.device
    query = stream.query
    if args.queries:
        query = ImageSet(query.images[:args.queries], query.labels[:args.queries])
    loaded = [load_cached_model(p, mean=stream.mean, std=stream.std) for p in args.models]
    table = cross_accuracies([m.to(device) for m, _ in loaded], to_device(query, device),
                             to_device(stream.gallery, device), mode=settings.evaluation.mode,
                             amp=settings.training.autocast)
    confidence = settings.evaluation.confidence
    names = [model_name(spec) for _, spec in loaded]
    rows = []
    for name, accuracies in zip(names, table, strict=True):
        cells = []
        for a in accuracies:
            low, high = wilson_interval(a, len(query), confidence)
            cells.append(f"{100 * a:.1f} [{100 * low:.1f}, {100 * high:.1f}]")
        rows.append([name] + cells)
    print(f"Top-1 accuracy (%) with {100 * confidence:.0f}% Wilson intervals, {len(query)} queries; row = query "
          "model, column = gallery model.\n")
    print(tabulate(rows, headers=["query \\ gallery"] + names, tablefmt="github", disable_numparse=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
