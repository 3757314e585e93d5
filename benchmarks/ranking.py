"""Leave-one-out retrieval scores: CMC top-k and mAP over the whole ranking (docs/METHODS.md §7b).

Queries and gallery items are compared by cosine similarity (both sides are L2-normalised here; adapted features
need not be). With ``exclude_self`` the query set and the gallery are the same items in the same order, possibly
embedded by different models (query i and gallery item i are one image), and each query's own item is left out of
its ranking: the adapter papers' protocol, where the test split is both query and gallery.

* CMC top-k: the share of queries with an item of their label among the k most similar gallery items (a query
  without any positive counts as a miss).
* mAP: for a query with P positives at ranks r_1 < ... < r_P (1-based), AP = (1/P) Σ_j j / r_j, the average
  precision over the whole ranking (not mAP@R); averaged over the queries with at least one positive, the others
  skipped and counted. This is scikit-learn's ``average_precision_score`` on the similarities when no two
  similarities tie; ties are broken by gallery index (a stable sort), the suite's choice.

Every score is in percent; precisions are summed in float64, so chunking changes no digit that matters. The
queries are processed in chunks of at most ``chunk_elements`` query x gallery
entries, so a 50,000 x 50,000 evaluation holds one chunk's similarities, ranks and precisions at a time
(``python -m tools.bench_ranking`` measures its time and peak memory).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

TOPK = (1, 5)


@dataclass(frozen=True)
class RetrievalScores:
    """CMC top-1 / top-5 and mAP in percent over ``queries`` queries; ``queries_without_positive`` were left out of
    the mAP. ``query_top1`` (bool) and ``query_ap`` (float64, NaN without a positive) are each query's own, for
    paired comparisons over queries (:mod:`reporting.adapter_summary`)."""

    top1: float
    top5: float
    mAP: float
    queries: int
    queries_without_positive: int
    query_top1: np.ndarray | None = field(default=None, repr=False, compare=False)
    query_ap: np.ndarray | None = field(default=None, repr=False, compare=False)

    def as_dict(self) -> dict[str, float]:
        return {"top1": self.top1, "top5": self.top5, "mAP": self.mAP}


def retrieval_scores(queries: torch.Tensor, query_labels: torch.Tensor, gallery: torch.Tensor,
                     gallery_labels: torch.Tensor, *, exclude_self: bool, topk: Sequence[int] = TOPK,
                     chunk_elements: int = 1 << 24) -> RetrievalScores:
    """The scores of the module docstring; inputs on any one device."""
    if tuple(topk) != TOPK:
        raise ValueError(f"topk must be {TOPK} (the papers' CMC top-1 and top-5), not {tuple(topk)}")
    if queries.ndim != 2 or gallery.ndim != 2 or queries.shape[1] != gallery.shape[1]:
        raise ValueError(f"queries {tuple(queries.shape)} and gallery {tuple(gallery.shape)} must be 2-D with one "
                         "feature width")
    if len(queries) != len(query_labels) or len(gallery) != len(gallery_labels):
        raise ValueError("each query and gallery item needs one label")
    if exclude_self and len(queries) != len(gallery):
        raise ValueError(f"exclude_self needs the query set and the gallery to be the same items, not "
                         f"{len(queries)} queries and {len(gallery)} gallery items")
    q, g = F.normalize(queries.float(), dim=1), F.normalize(gallery.float(), dim=1)
    gallery_labels = gallery_labels.to(g.device)
    step = max(1, chunk_elements // max(len(g), 1))
    hits1 = hits5 = 0
    ap_sum, with_positive = 0.0, 0
    query_top1, query_ap = [], []
    ranks = torch.arange(1, len(g) + 1, device=g.device, dtype=torch.float64)
    for start in range(0, len(q), step):
        stop = min(start + step, len(q))
        relevant = ranked_relevance(q[start:stop], query_labels[start:stop].to(g.device), g, gallery_labels,
                                    start if exclude_self else None)
        hits1 += int(relevant[:, 0].sum())
        hits5 += int(relevant[:, :5].any(dim=1).sum())
        positives = relevant.sum(dim=1)
        precision = relevant.cumsum(dim=1, dtype=torch.int32).double().div_(ranks).mul_(relevant)
        has = positives > 0
        ap = precision.sum(dim=1) / positives
        ap_sum += float(ap[has].sum())
        with_positive += int(has.sum())
        query_top1.append(relevant[:, 0].cpu())
        query_ap.append(ap.cpu())
    n = len(q)
    return RetrievalScores(top1=100.0 * hits1 / max(n, 1), top5=100.0 * hits5 / max(n, 1),
                           mAP=100.0 * ap_sum / max(with_positive, 1), queries=n,
                           queries_without_positive=n - with_positive,
                           query_top1=torch.cat(query_top1).numpy() if query_top1 else np.zeros(0, bool),
                           query_ap=torch.cat(query_ap).numpy() if query_ap else np.zeros(0))


def ranked_relevance(queries: torch.Tensor, labels: torch.Tensor, gallery: torch.Tensor, gallery_labels: torch.Tensor,
                     first_index: int | None) -> torch.Tensor:
    """``(chunk, gallery)`` bool: whether the gallery item at each rank has the query's label, ranks by descending
    cosine with ties in gallery order; with ``first_index`` (the chunk's first query's index in the gallery) each
    query's own item is ranked last and never relevant."""
    similarity = queries @ gallery.t()
    if first_index is not None:
        own = torch.arange(len(queries), device=gallery.device) + first_index
        similarity[torch.arange(len(queries), device=gallery.device), own] = float("-inf")
    order = torch.sort(similarity, dim=1, descending=True, stable=True).indices
    del similarity
    relevant = gallery_labels[order] == labels[:, None]
    if first_index is not None:
        relevant &= order != own[:, None]
    return relevant
