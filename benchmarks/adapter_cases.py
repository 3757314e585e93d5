"""Measuring an adapter between an old and a new model: the retrieval cases and partial backfilling (METHODS.md §7).

Every case is a top-1 retrieval accuracy ("query features / gallery features") on the evaluation set, with the
gallery reduced to class templates or kept per image (``evaluation.mode``):

* ``old/old``, ``new/new``: each model alone; ``new/old``: new queries on the old gallery, untransformed;
* ``B(new)/old``: backward-adapted new queries on the old gallery (no backfilling);
* ``B(new)/B(new)``: both sides backward-adapted new features ("adapted vs adapted", the λ-orth paper's B/B);
* ``new/F(old)``: the new model's queries (in the adapter's new frame) on the forward-adapted old gallery;
* ``full backfill``: the new frame on both sides (``new/new``, or B/B for λ-orthogonal).

Partial backfilling: the gallery is ordered, the first β of it is re-embedded with the new model and the rest is
forward-adapted (left as is without a forward map); accuracy against β = 0, 1/s, ..., 1 and the area under that
curve (trapezoid rule over β in [0, 1]). β = 0 is the ``new/F(old)`` case and β = 1 the ``full backfill`` case.
Orders: ``random``; ``uncertainty`` (FastFill's σ², largest first; only for adapters that predict it);
``class_mean_distance`` / ``class_mean_cosine`` (λ-orth: the L2 / cosine distance of each stale gallery item, F(old)
where the adapter has a forward map, to its class mean of the stale gallery, largest first; METHODS.md §7b).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from cl2r_bench.adapters.protocol import FeatureAdapter
from cl2r_bench.models import class_means
from cl2r_bench.settings import BACKFILL_ORDERS

from .metrics import area_under_curve
from .retrieval import gallery_accuracy


@dataclass
class TwoModelFeatures:
    """L2-normalised evaluation features of both models (queries and per-image gallery) with their labels."""

    query_old: torch.Tensor
    query_new: torch.Tensor
    gallery_old: torch.Tensor
    gallery_new: torch.Tensor
    query_labels: torch.Tensor
    gallery_labels: torch.Tensor


def adapted_cases(f: TwoModelFeatures, adapter: FeatureAdapter | None, mode: str) -> dict[str, float | None]:
    """The cases of the module docstring; those the adapter cannot produce are None."""
    def acc(queries: torch.Tensor, gallery: torch.Tensor) -> float | None:
        if queries.shape[1] != gallery.shape[1]:
            return None
        return gallery_accuracy(queries, f.query_labels, gallery, f.gallery_labels, mode)

    cases = {"old/old": acc(f.query_old, f.gallery_old), "new/new": acc(f.query_new, f.gallery_new),
             "new/old": acc(f.query_new, f.gallery_old), "B(new)/old": None, "B(new)/B(new)": None,
             "new/F(old)": None, "full backfill": acc(f.query_new, f.gallery_new)}
    if adapter is None:
        return cases
    if "backward" in adapter.directions:
        adapted_queries = adapter.backward(f.query_new)
        cases["B(new)/old"] = acc(adapted_queries, adapter.old_frame(f.gallery_old))
        cases["B(new)/B(new)"] = acc(adapted_queries, adapter.backward(f.gallery_new))
    queries = adapter.new_frame(f.query_new)
    if "forward" in adapter.directions:
        cases["new/F(old)"] = acc(queries, adapter.forward(f.gallery_old))
    cases["full backfill"] = acc(queries, adapter.new_frame(f.gallery_new))
    return cases


def backfill_order(kind: str, *, stale: torch.Tensor, old: torch.Tensor, labels: torch.Tensor,
                   adapter: FeatureAdapter | None, generator: torch.Generator) -> torch.Tensor | None:
    """Gallery indices, first to be backfilled first (module docstring); ``stale`` is the gallery as searched
    before backfilling and ``old`` the old model's features of the same items. None when ``kind`` needs what the
    adapter lacks."""
    if kind == "random":
        return torch.randperm(len(stale), generator=generator).to(stale.device)
    if kind == "uncertainty":
        score = None if adapter is None else adapter.uncertainty(old)
        return None if score is None else torch.argsort(score, descending=True)
    if kind in ("class_mean_distance", "class_mean_cosine"):
        classes, index = labels.unique(return_inverse=True)
        means, _ = class_means(stale, index, len(classes))
        if kind == "class_mean_distance":
            distance = (stale - means[index]).norm(dim=1)
        else:
            distance = 1 - F.cosine_similarity(stale.float(), means[index], dim=1)
        return torch.argsort(distance, descending=True)
    raise ValueError(f"unknown backfilling order {kind!r}; choose from {list(BACKFILL_ORDERS)}")


def backfilling_curve(queries: torch.Tensor, query_labels: torch.Tensor, stale: torch.Tensor, fresh: torch.Tensor,
                      gallery_labels: torch.Tensor, order: torch.Tensor, betas: list[float], mode: str) -> list[float]:
    """Accuracy at each β when the first ``round(β n)`` items of ``order`` use ``fresh`` features, the rest
    ``stale`` ones."""
    curve = []
    for beta in betas:
        mixed = stale.clone()
        chosen = order[:round(beta * len(order))]
        mixed[chosen] = fresh[chosen]
        curve.append(gallery_accuracy(queries, query_labels, mixed, gallery_labels, mode))
    return curve


def partial_backfilling(f: TwoModelFeatures, adapter: FeatureAdapter | None, *, orders: list[str], steps: int,
                        mode: str, generator: torch.Generator) -> dict[str, Any]:
    """``{"betas", "curves": {order: [...]}, "area": {order: AUC}}`` (orders the adapter cannot rank are None)."""
    betas = [i / steps for i in range(steps + 1)]
    queries = f.query_new if adapter is None else adapter.new_frame(f.query_new)
    fresh = f.gallery_new if adapter is None else adapter.new_frame(f.gallery_new)
    stale = adapter.forward(f.gallery_old) if adapter is not None and "forward" in adapter.directions \
        else f.gallery_old
    curves: dict[str, list[float] | None] = {}
    for kind in orders:
        order = backfill_order(kind, stale=stale, old=f.gallery_old, labels=f.gallery_labels, adapter=adapter,
                               generator=generator)
        usable = order is not None and stale.shape[1] == fresh.shape[1]
        curves[kind] = backfilling_curve(queries, f.query_labels, stale, fresh, f.gallery_labels, order, betas,
                                         mode) if usable else None
    return {"betas": betas, "curves": curves,
            "area": {k: None if c is None else area_under_curve(betas, c) for k, c in curves.items()}}
