"""The scores of one ranking (:class:`RetrievalScores`): CMC top-k and mAP / mAP@R from each query's positives'
ranks, under the unmatched-query convention (:mod:`benchmarks.ranking`; docs/METHODS.md §7b)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..noise import bootstrap_accuracies

CMC_DEPTH = 100
"""The deepest k of the CMC curve a record keeps."""


@dataclass(frozen=True)
class RetrievalScores:
    """The scores of one ranking, from each query's ``first_rank`` (1-based rank of its first positive; 0 for a
    query without one), ``ap`` and ``ap_at_r`` (float64 average precision over the whole ranking and over its first
    R ranks, NaN without a positive); ``unmatched_queries`` is the CMC convention (module docstring). Every score
    is in percent. ``exact_depth``: a screened ranking's (:func:`streamed`), which ranks exactly only its first
    ``exact_depth`` places: a first rank beyond them is a lower bound, CMC is given only to that depth, and the
    full mAP not at all (None); None for a whole ranking."""

    first_rank: np.ndarray = field(repr=False, compare=False)
    ap: np.ndarray = field(repr=False, compare=False)
    ap_at_r: np.ndarray = field(repr=False, compare=False)
    unmatched_queries: str = "miss"
    exact_depth: int | None = None

    @property
    def queries(self) -> int:
        return len(self.first_rank)

    @property
    def queries_without_positive(self) -> int:
        return int((self.first_rank == 0).sum())

    @property
    def query_top1(self) -> np.ndarray:
        """Each query's top-1 hit (bool), for paired comparisons over queries
        (:mod:`cl2r_bench.reporting.adapter_recommendation`)."""
        return self.first_rank == 1

    @property
    def counted_first_ranks(self) -> np.ndarray:
        """The first ranks CMC counts under :attr:`unmatched_queries`: every query's (0, a miss, for one without a
        positive), or only the matched queries' under ``exclude``."""
        return self.first_rank if self.unmatched_queries == "miss" else self.first_rank[self.first_rank >= 1]

    def cmc(self, k: int) -> float:
        """CMC top-``k`` in percent, under :attr:`unmatched_queries`."""
        self.check_depth(k)
        return cmc_at(self.counted_first_ranks, k)

    def cmc_curve(self, depth: int = CMC_DEPTH) -> list[float]:
        """CMC top-1 ... top-``depth`` in percent."""
        self.check_depth(depth)
        counted = self.counted_first_ranks
        matched = counted[counted >= 1]
        hits = np.cumsum(np.bincount(np.minimum(matched, depth + 1), minlength=depth + 2)[1:depth + 1])
        return (100.0 * hits / max(len(counted), 1)).tolist()

    @property
    def top1(self) -> float:
        return self.cmc(1)

    @property
    def top5(self) -> float:
        return self.cmc(5)

    @property
    def mAP(self) -> float | None:
        return None if self.exact_depth is not None else mean_precision(self.ap)

    @property
    def mAP_at_R(self) -> float:
        return mean_precision(self.ap_at_r)

    @property
    def precision_name(self) -> str:
        """The mean precision this ranking gives whole: ``mAP``, or ``mAP@R`` for a screened one."""
        return "mAP" if self.exact_depth is None else "mAP@R"

    @property
    def precision(self) -> float:
        """:attr:`mAP`, or :attr:`mAP_at_R` for a screened ranking (:attr:`precision_name`)."""
        return self.mAP if self.exact_depth is None else self.mAP_at_R

    def as_dict(self) -> dict[str, float | None]:
        return {"top1": self.top1, "top5": self.top5, "mAP": self.mAP, "mAP@R": self.mAP_at_R}

    def check_depth(self, k: int) -> None:
        """A :class:`ValueError` for a CMC deeper than a screened ranking ranks exactly."""
        if self.exact_depth is not None and k > self.exact_depth:
            raise ValueError(f"this screened ranking is exact to rank {self.exact_depth}, not {k}: rank without "
                             "screen for a deeper CMC")

    def interval(self, confidence: float, resamples: int, seed: int = 0) -> dict[str, list[float]]:
        """``{"top1": [low, high], "mAP": [low, high]}`` in percent (``mAP@R`` for a screened ranking's, which has no
        mAP): the percentile bootstrap interval over these queries, for a sample of queries standing in for all of
        them (the sampling noise; the resampling of :func:`benchmarks.noise.bootstrap_accuracies`)."""
        tail = (1 - confidence) / 2 * 100
        bounds = {}
        precision = self.ap if self.exact_depth is None else self.ap_at_r
        for name, values in (("top1", self.counted_first_ranks == 1),
                             (self.precision_name, precision[~np.isnan(precision)])):
            means = bootstrap_accuracies(values[None, :], resamples, seed)[0] * 100 if len(values) else np.zeros(1)
            bounds[name] = np.percentile(means, [tail, 100 - tail]).tolist()
        return bounds

    def of_queries(self, mask: np.ndarray) -> RetrievalScores:
        """These scores restricted to the queries of ``mask``, under the same convention."""
        return RetrievalScores(self.first_rank[mask], self.ap[mask], self.ap_at_r[mask], self.unmatched_queries,
                               self.exact_depth)

    @property
    def counted_queries(self) -> int:
        """How many queries CMC counts: all under ``miss``, the matched ones under ``exclude``."""
        return len(self.counted_first_ranks)

    def per_class_cmc(self, labels: np.ndarray, k: int = 1) -> dict[int, float | None]:
        """CMC top-``k`` of each query label's queries, in percent, under the same convention; None for a label none
        of whose queries CMC counts (every one unmatched, under ``exclude``): no figure, rather than 0.0."""
        scores = {int(c): self.of_queries(labels == c) for c in np.unique(labels)}
        return {c: part.cmc(k) if part.counted_queries else None for c, part in scores.items()}


def cmc_at(first_rank: np.ndarray, k: int) -> float:
    """CMC top-``k`` in percent of queries whose first positive has ``first_rank`` (1-based; 0, a miss, for a
    query without one)."""
    return 100.0 * int(((first_rank >= 1) & (first_rank <= k)).sum()) / max(len(first_rank), 1)


def mean_precision(ap: np.ndarray) -> float:
    """The mean in percent of the queries' average precisions, those without a positive (NaN) left out."""
    matched = ap[~np.isnan(ap)]
    return 100.0 * float(matched.sum()) / max(len(matched), 1)


def as_scores(first: torch.Tensor, ap: torch.Tensor, unmatched_queries: str,
              exact_depth: int | None = None) -> list[list[RetrievalScores]]:
    """``[curve][step]`` scores from the first ranks ``(curves, steps, queries)`` and AP / AP@R ``(2, ...)``."""
    first_np, ap_np = first.numpy(), ap.numpy()
    return [[RetrievalScores(first_np[c, t], ap_np[0, c, t], ap_np[1, c, t], unmatched_queries, exact_depth)
             for t in range(first_np.shape[1])] for c in range(first_np.shape[0])]
