"""Negative flips between consecutive models (METHODS.md §2): pure functions of per-query top-1 hits.

A negative flip is a query that the old model retrieves correctly at top-1 and the new model does not (Yan et al.,
"Positive-Congruent Training", CVPR 2021). An upgrade can raise accuracy and still flip queries that users saw
answered: the matrix's entries, being means, cannot show them, the per-query hits behind them can. With
``hits[t][k]`` the hits of queries embedded by model t against the gallery embedded by model k (one bool per
query, the same queries in the same order for every entry; ``CompatibilityEvaluator.hit_rows``), for each
consecutive pair of models t - 1, t:

* ``NFR_self(t)``: the share of queries hit by ``[t-1][t-1]`` and missed by ``[t][t]``, each model on its own
  gallery: the upgrade with the gallery re-embedded;
* ``NFR_cross(t)``: the share of queries hit by ``[t-1][t-1]`` and missed by ``[t][t-1]``, new queries against the
  old gallery: the upgrade without backfilling, the "model regression" of Zhang et al. (RACT, ICLR 2022).

Both are fractions of all the queries, in [0, 1], like the matrix entries.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

HitRows = Sequence[Sequence[np.ndarray | None]]
"""Per-query hits of a lower-triangular matrix: row t holds entries [t][0..t]; None for an entry not measured."""


def negative_flip_rate(before: np.ndarray, after: np.ndarray) -> float:
    """The share of queries that ``before`` hits and ``after`` misses (per-query bools of the same queries)."""
    before, after = np.asarray(before, dtype=bool), np.asarray(after, dtype=bool)
    if before.ndim != 1 or before.shape != after.shape or len(before) == 0:
        raise ValueError(f"negative flips compare the hits of the same queries: got shapes {before.shape} and "
                         f"{after.shape}")
    return float(np.mean(before & ~after))


def negative_flips(hits: HitRows) -> dict[str, Any]:
    """The ``negative_flips`` object of ``metrics.json`` (module docstring): ``self`` and ``cross``, the rates of
    each consecutive pair (t - 1, t) in order, one fewer than the models and None where an entry they need was not
    measured, and ``mean_self`` / ``mean_cross``, their means, None unless every pair has a rate (one model: no
    pair)."""
    def rate(before: np.ndarray | None, after: np.ndarray | None) -> float | None:
        return None if before is None or after is None else negative_flip_rate(before, after)

    pairs = range(1, len(hits))
    rates = {"self": [rate(hits[t - 1][t - 1], hits[t][t]) for t in pairs],
             "cross": [rate(hits[t - 1][t - 1], hits[t][t - 1]) for t in pairs]}
    return {**rates, **{f"mean_{kind}": float(np.mean(values)) if values and None not in values else None
                        for kind, values in rates.items()}}


def classification_flips(old_correct: np.ndarray, new_correct: np.ndarray) -> dict[str, float | None]:
    """The classification reading of an upgrade (Yan et al. 2021, Eq. 2 and 11, as ``miccunifi/negative_flip_MPT``
    computes it): each model's top-1 accuracy, the negative flip rate (old correct, new wrong, over every sample)
    and the relative rate ``NFR / ((1 - ER_old) ER_new)`` (None where the denominator is 0), all fractions."""
    old_correct, new_correct = np.asarray(old_correct, dtype=bool), np.asarray(new_correct, dtype=bool)
    rate = negative_flip_rate(old_correct, new_correct)
    expected = float(old_correct.mean() * (1 - new_correct.mean()))
    return {"old_top1": float(old_correct.mean()), "new_top1": float(new_correct.mean()), "nfr": rate,
            "relative_nfr": rate / expected if expected > 0 else None}
