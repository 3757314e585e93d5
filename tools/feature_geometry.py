"""Why does a pair lose its gallery? The geometry of a finished run's features on its query set.

    python -m tools.feature_geometry RUN_DIR [--data-root DIR] [--query-stride N]

RUN_DIR is one run's folder (``config.yaml`` and ``checkpoints/task<t>.pt``). Every task's model embeds the
query set (every N-th query) and the gallery once. Two tables:

* per model: its own accuracy; the **mean resultant length** ``||mean_i f_i||`` of its normalised query
  features (0: spread over the sphere, 1: every image on one direction, so the classes live in a thin
  residual); the mean cosine between its features and the previous model's on the same images;
* per pair (t, k), t > k: the accuracy of model t's queries on model k's gallery, the share of queries that go
  to the single most chosen gallery class, and the accuracy once the **common shift** is removed (the mean of
  model t's query features minus the mean of model k's is subtracted from model t's queries before searching).
  A pair that falls to one class and recovers without the shift has lost its gallery to a common translation
  of the features, not to a scrambled space. The correction uses both models' query means: a diagnosis, not a
  protocol (a deployed system has no old-model features of new queries).

The fidelity study uses it on d-Simplex-FD's collapsing pair (results/fidelity/README.md).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from tabulate import tabulate

from benchmarks.retrieval import class_templates
from cl2r_bench.app.assembly import assemble
from cl2r_bench.app.run_loop import to_device
from cl2r_bench.app.starting_models import load_task_model
from cl2r_bench.config import read_yaml, resolve
from cl2r_bench.data.datasets import DataError, ImageSet
from cl2r_bench.models import embed


def mean_resultant_length(features: torch.Tensor) -> float:
    """``||mean of the L2-normalised rows||``: 0 for features spread evenly, 1 when all point one way."""
    return float(F.normalize(features.float(), dim=1).mean(0).norm())


def paired_cosine(features: torch.Tensor, other: torch.Tensor) -> float:
    """Mean cosine between row i of ``features`` and row i of ``other`` (the same image, two models)."""
    return float(F.cosine_similarity(features.float(), other.float(), dim=1).mean())


def searchable_gallery(gallery: torch.Tensor, labels: torch.Tensor, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(features, labels)`` searched for a gallery: normalised, and reduced to class templates in
    ``templates`` mode (as ``benchmarks.retrieval.gallery_hits``)."""
    gallery = F.normalize(gallery.float(), dim=1)
    return class_templates(gallery, labels) if mode == "templates" else (gallery, labels)


def predicted_labels(queries: torch.Tensor, gallery: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The label of each query's cosine-nearest item of a :func:`searchable_gallery`."""
    features, labels = gallery
    return labels[(F.normalize(queries.float(), dim=1) @ features.t()).argmax(1)]


def pair_diagnosis(queries: torch.Tensor, old_queries: torch.Tensor, query_labels: torch.Tensor,
                   old_gallery: tuple[torch.Tensor, torch.Tensor]) -> dict[str, float]:
    """For new-model ``queries`` against the old model's :func:`searchable_gallery`: ``accuracy``,
    ``top_class_share`` (the fraction of queries answered by the most chosen class) and
    ``accuracy_shift_removed`` (queries moved by the difference of the two models' mean query features, see the
    module docstring)."""
    queries = F.normalize(queries.float(), dim=1)
    predicted = predicted_labels(queries, old_gallery)
    shift = queries.mean(0) - F.normalize(old_queries.float(), dim=1).mean(0)
    recentred = predicted_labels(queries - shift, old_gallery)
    return {"accuracy": float((predicted == query_labels).float().mean()),
            "top_class_share": float(torch.bincount(predicted).max()) / len(predicted),
            "accuracy_shift_removed": float((recentred == query_labels).float().mean())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path, help="a run folder with config.yaml and checkpoints/")
    parser.add_argument("--data-root", help="override data_root of the run's config")
    parser.add_argument("--query-stride", type=int, default=1, help="use every N-th query (default: all)")
    args = parser.parse_args(argv)
    config_path = args.run / "config.yaml"
    if not config_path.is_file():
        print(f"error: {config_path} does not exist; pass a run folder (it holds config.yaml)", file=sys.stderr)
        return 2
    layer = read_yaml(config_path)
    if args.data_root:
        layer["data_root"] = args.data_root
    parts = assemble(resolve([(str(config_path), layer)]))
    try:
        stream = parts.scenario.stream()
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    device, amp = parts.device, parts.settings.training.autocast
    query = to_device(ImageSet(stream.query.images[::args.query_stride], stream.query.labels[::args.query_stride]),
                      device)
    gallery, mode = to_device(stream.gallery, device), parts.settings.evaluation.mode
    replacements = torch.load(args.run / "state.pt", map_location="cpu", weights_only=True)["replacements"] \
        if (args.run / "state.pt").is_file() else []
    embedded = []
    for t in range(len(stream.tasks)):
        if not (args.run / "checkpoints" / f"task{t}.pt").is_file():
            break
        model = load_task_model(parts, stream, t, args.run, replacements=replacements).to(device)
        features = [embed(model, images.images, amp=amp) for images in (query, gallery)]
        embedded.append((features[0], searchable_gallery(features[1], gallery.labels, mode)))
    labels = query.labels
    model_rows = [[t, f"{100 * float((predicted_labels(q, g) == labels).float().mean()):.1f}",
               f"{mean_resultant_length(q):.3f}", f"{paired_cosine(q, embedded[t - 1][0]):.3f}" if t else "-"]
              for t, (q, g) in enumerate(embedded)]
    print(f"{len(labels)} queries, {len(embedded)} models of {args.run}\n")
    print(tabulate(model_rows, headers=["model", "own accuracy %", "mean resultant length", "cosine to model t-1"],
                   tablefmt="github", disable_numparse=True))
    pairs = []
    for t, (queries, _) in enumerate(embedded):
        for k in range(t):
            d = pair_diagnosis(queries, embedded[k][0], labels, embedded[k][1])
            pairs.append([f"({t},{k})", f"{100 * d['accuracy']:.1f}", f"{100 * d['top_class_share']:.1f}",
                          f"{100 * d['accuracy_shift_removed']:.1f}"])
    print()
    print(tabulate(pairs, headers=["pair (query, gallery)", "accuracy %", "top class share %",
                                   "accuracy, shift removed %"], tablefmt="github", disable_numparse=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
