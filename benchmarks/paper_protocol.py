"""The adapter papers' own protocol on two encoders' features (docs/METHODS.md §7b): leave-one-out retrieval cases,
partial-backfilling AUC and zero-shot retention.

The test split is both query and gallery, each query's own item left out (:func:`benchmarks.ranking.retrieval_scores`
with ``exclude_self``: query i and gallery item i are the same image, whichever model embedded each side). Scores
are CMC top-1, top-5 and mAP in percent. Every feature is L2-normalised before an adapter sees it, as a retrieval
system stores it and as the adapters are fitted (``cl2r_bench/adapters``).

Cases, ``query/gallery`` (λ-orth Table 1b), each computed only where both sides live in one frame, else null:

* ``old/old``, ``new/new``; ``new/old`` (untransformed; null when the widths differ);
* ``B/old``, ``B/B``: backward-adapted new features against the old gallery (in the adapter's old frame: the
  common width for λ-orth) and against themselves;
* ``F/F``: the forward-adapted old gallery against itself;
* ``new/F``: the new model's own queries on F(old), where F maps into the new model's space (FCT, FastFill,
  the translation baselines);
* ``F/old``, ``B/F``: where F maps into the old frame, as λ-orth's F does (into B's frame).

Backfilling: queries are the new model's features in the adapter's new frame (B(new) for λ-orth); the gallery
starts as the stale F(old) (the old features without a forward map) and the first β of it, in the order's
sequence, is replaced by the fresh new-frame features; top-1 and mAP against β = 0, 1/s, ..., 1 and their area
(trapezoid rule; :func:`benchmarks.adapter_cases.backfill_order` gives the orders).

Zero-shot retention (λ-orth's "ZS"): how much the backward map distorts the new model's own space. Its classifier
(rows w_c, biases) scores the raw features h, then the same classifier moved with the features by B's linear part
L(x) = B(x) - B(0): logits ``L(h) · L(w_c) + bias_c``. An orthogonal L keeps every logit, so strict orthogonality
keeps the accuracy exactly (the paper's 0.000) and an affine B loses most (its -3.5 on CUB); the new classifier on
B(h) alone would score features in the old model's frame. Both top-1 accuracies in percent and their difference;
only for an affine backward map that keeps the new model's width (the suite's reading; METHODS.md §7b).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cl2r_bench.adapters.protocol import FeatureAdapter

from .adapter_cases import backfill_order
from .metrics import area_under_curve
from .ranking import RetrievalScores, retrieval_scores
from .record import PAPER_CASES


@dataclass
class PairedFeatures:
    """The same ``n`` items embedded by the old and the new encoder, L2-normalised, with their labels."""

    old: torch.Tensor
    new: torch.Tensor
    labels: torch.Tensor

    @classmethod
    def normalised(cls, old: torch.Tensor, new: torch.Tensor, labels: torch.Tensor) -> PairedFeatures:
        return cls(F.normalize(old.float(), dim=1), F.normalize(new.float(), dim=1), labels)

    def __len__(self) -> int:
        return len(self.labels)

    def to(self, device: torch.device | str) -> PairedFeatures:
        return PairedFeatures(self.old.to(device), self.new.to(device), self.labels.to(device))


def scores(queries: torch.Tensor, gallery: torch.Tensor, labels: torch.Tensor) -> dict[str, float] | None:
    """Leave-one-out top-1 / top-5 / mAP (percent) of ``queries`` on ``gallery`` (the same items), or None when
    their widths differ."""
    if queries.shape[1] != gallery.shape[1]:
        return None
    return retrieval_scores(queries, labels, gallery, labels, exclude_self=True).as_dict()


def case_sides(test: PairedFeatures, adapter: FeatureAdapter | None
               ) -> dict[str, tuple[torch.Tensor, torch.Tensor] | None]:
    """``(queries, gallery)`` of each case of :data:`PAPER_CASES` (module docstring), None where the adapter
    cannot produce it."""
    old, new = test.old, test.new
    sides: dict[str, tuple[torch.Tensor, torch.Tensor] | None] = dict.fromkeys(PAPER_CASES)
    sides.update({"old/old": (old, old), "new/old": (new, old), "new/new": (new, new)})
    if adapter is None:
        return sides
    backward = adapter.backward(new) if "backward" in adapter.directions else None
    forward = adapter.forward(old) if "forward" in adapter.directions else None
    old_in_frame = adapter.old_frame(old)
    if backward is not None:
        sides.update({"B/old": (backward, old_in_frame), "B/B": (backward, backward)})
    if forward is not None:
        sides["F/F"] = (forward, forward)
        if adapter.forward_into_new_space:
            sides["new/F"] = (new, forward)
        else:
            sides["F/old"] = (forward, old_in_frame)
            if backward is not None:
                sides["B/F"] = (backward, forward)
    return sides


def case_scores(test: PairedFeatures, adapter: FeatureAdapter | None) -> dict[str, RetrievalScores | None]:
    """The leave-one-out scores of every case on the test split, each query's own included (module docstring);
    None where the adapter cannot produce a case or its two sides differ in width."""
    with torch.no_grad():
        return {case: None if pair is None or pair[0].shape[1] != pair[1].shape[1] else
                retrieval_scores(pair[0], test.labels, pair[1], test.labels, exclude_self=True)
                for case, pair in case_sides(test, adapter).items()}


WATCHED_CASES = ("B/old", "new/F")
"""The cross case whose held-out mAP decides when a learned adapter stops (:func:`held_out_error`)."""


def held_out_error(adapter: FeatureAdapter, old: torch.Tensor, new: torch.Tensor, labels: torch.Tensor) -> float:
    """100 - the leave-one-out mAP of the adapter's cross case (B/old, else new/F) on held-out fitting items: what
    a learned adapter watches to decide that it has converged (:mod:`cl2r_bench.adapters.training`). Retrieval,
    not the training loss: FastFill's uncertainty-weighted loss and λ-orth's contrastive term rise on held-out items
    while the maps they train still improve."""
    with torch.no_grad():
        sides = case_sides(PairedFeatures.normalised(old, new, labels), adapter)
        queries, gallery = next(sides[case] for case in WATCHED_CASES if sides[case] is not None)
        return 100.0 - retrieval_scores(queries, labels, gallery, labels, exclude_self=True).mAP


def paper_cases(test: PairedFeatures, adapter: FeatureAdapter | None) -> dict[str, dict[str, float] | None]:
    """Top-1 / top-5 / mAP (percent) of every case on the test split (module docstring)."""
    return {case: None if result is None else result.as_dict() for case, result in case_scores(test, adapter).items()}


def backfilling(test: PairedFeatures, adapter: FeatureAdapter | None, *, orders: list[str], steps: int,
                generator: torch.Generator) -> dict[str, Any]:
    """``{"betas", "curves": {order: {"top1": [...], "mAP": [...]}}, "auc": {order: {"top1_auc", "mAP_auc"}}}``
    (module docstring); an order the adapter cannot rank, or a stale gallery of another width than the fresh one,
    gives None."""
    betas = [i / steps for i in range(steps + 1)]
    curves: dict[str, dict[str, list[float]] | None] = {}
    with torch.no_grad():
        fresh = test.new if adapter is None else adapter.new_frame(test.new)
        has_forward = adapter is not None and "forward" in adapter.directions
        stale = adapter.forward(test.old) if has_forward else test.old
        for kind in orders:
            order = backfill_order(kind, stale=stale, old=test.old, labels=test.labels, adapter=adapter,
                                   generator=generator)
            curves[kind] = None if order is None or stale.shape[1] != fresh.shape[1] else \
                backfilling_curve(fresh, stale, test.labels, order, betas)
    auc = {kind: None if c is None else {"top1_auc": area_under_curve(betas, c["top1"]),
                                         "mAP_auc": area_under_curve(betas, c["mAP"])}
           for kind, c in curves.items()}
    return {"betas": betas, "curves": curves, "auc": auc}


def backfilling_curve(fresh: torch.Tensor, stale: torch.Tensor, labels: torch.Tensor, order: torch.Tensor,
                      betas: list[float]) -> dict[str, list[float]]:
    """Top-1 and mAP at each β when the first ``round(β n)`` items of ``order`` are backfilled (fresh) and the
    rest stale; queries are always the fresh features."""
    curve: dict[str, list[float]] = {"top1": [], "mAP": []}
    for beta in betas:
        gallery = stale.clone()
        chosen = order[:round(beta * len(order))]
        gallery[chosen] = fresh[chosen]
        result = scores(fresh, gallery, labels)
        curve["top1"].append(result["top1"])
        curve["mAP"].append(result["mAP"])
    return curve


def zero_shot_retention(features: torch.Tensor, classes: torch.Tensor, classifier: nn.Linear,
                        adapter: FeatureAdapter | None) -> dict[str, float] | None:
    """The new encoder's classification accuracy (percent) on raw ``features`` whose true class indices in its
    classifier are ``classes``, before and after the backward adapter's linear part L(x) = B(x) - B(0) moves both
    the features and the classifier's rows, and the change in points (module docstring); None without an affine
    backward map that keeps the classifier's width."""
    if adapter is None or "backward" not in adapter.directions:
        return None
    with torch.no_grad():
        raw = features.float()
        origin = adapter.backward(raw.new_zeros(1, raw.shape[1]))
        if origin.shape[1] != raw.shape[1] or not affine(adapter, raw[:2], origin):
            return None

        def linear(x: torch.Tensor) -> torch.Tensor:
            return adapter.backward(x) - origin

        weight = classifier.weight.float().to(raw.device)
        bias = classifier.bias.float().to(raw.device) if classifier.bias is not None else 0.0
        before = accuracy(raw @ weight.t() + bias, classes)
        after = accuracy(linear(raw) @ linear(weight).t() + bias, classes)
    return {"before": before, "after": after, "change": after - before}


def affine(adapter: FeatureAdapter, samples: torch.Tensor, origin: torch.Tensor) -> bool:
    """Whether the backward map is affine on ``samples`` (B(a + b) - B(0) = L(a) + L(b)): IRP's normalising map is
    not, so its classifier rows cannot be moved with it."""
    a, b = samples[:1], samples[1:2]
    combined = adapter.backward(a + b) - origin
    parts = adapter.backward(a) - origin + adapter.backward(b) - origin
    return bool(torch.allclose(combined, parts, rtol=1e-3, atol=1e-3 * float(parts.abs().max().clamp(min=1))))


def accuracy(logits: torch.Tensor, classes: torch.Tensor) -> float:
    return float((logits.argmax(dim=1) == classes.to(logits.device)).float().mean()) * 100

