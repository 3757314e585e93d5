"""How much of a compatibility matrix is query-sampling noise (METHODS.md §8).

Each entry ``M[t][k]`` is a proportion over the same ``n`` queries, so it carries a sampling error of about
``sqrt(p (1 - p) / n)``; AC compares entries strictly, so a pair whose two entries differ by less than that is a
coin flip. This module reports, at ``confidence`` (default 95%):

* **entry intervals**: the Wilson score interval of each entry (binomial over its ``n`` queries);
* **pair decisions**: for each pair t > k, an interval of the difference ``M[t][k] - M[k][k]``. The pair is
  *compatible beyond noise* when the interval lies above 0, *incompatible beyond noise* when it lies below 0, and
  *within noise* otherwise;
* **AC interval**: the percentile interval of AC over resampled query sets;
* **AC outside noise**: the share of pairs compatible beyond noise (pairs within noise count as violations, so
  it is a lower bound), and ``AC_upper`` = the share of pairs not incompatible beyond noise (an upper bound).
  The same two numbers restricted to the pairs separated by a model replacement (``across``).

Two methods, recorded in the result:

* ``paired_bootstrap`` (used by the runner, which keeps every query's hit or miss per entry): the queries are
  resampled with replacement, the *same* resample for every entry, so the correlation between entries that share
  queries is kept; ``resamples`` draws, seeded.
* ``binomial`` (only a matrix and ``n`` known, e.g. ``runner.py metrics FILE --queries N``): entries are drawn
  independently from Binomial(n, M[t][k]) / n. Independence ignores the positive correlation of paired entries,
  so its difference intervals are wider (conservative).

Only the choice of queries is resampled: the gallery (templates) and the training run are held fixed, so these
intervals do not replace several seeds.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from .metrics import average_compatibility, replacement_pairs

CONFIDENCE = 0.95
RESAMPLES = 1000


def _z(confidence: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(0.5 + confidence / 2)


def t_quantile(probability: float, df: float) -> float:
    """The ``probability`` quantile of Student's t distribution with ``df`` degrees of freedom (``df`` may be
    fractional, as Welch's; infinity is the normal's): the factor of a t-interval over seeds. Bisection on the
    distribution function, which is the regularized incomplete beta function (:func:`_incomplete_beta`); within
    1e-8 of scipy's ``t.ppf`` (``tests/reporting/test_compare.py``)."""
    if not 0 < probability < 1 or df <= 0:
        raise ValueError(f"t_quantile needs 0 < probability < 1 and df > 0, not {probability}, {df}")
    if math.isinf(df):
        from statistics import NormalDist

        return NormalDist().inv_cdf(probability)
    if probability < 0.5:
        return -t_quantile(1 - probability, df)

    def upper_tail(t: float) -> float:
        return 0.5 * _incomplete_beta(df / 2, 0.5, df / (df + t * t))

    low, high = 0.0, 1.0
    while upper_tail(high) > 1 - probability:
        high *= 2
    for _ in range(200):
        middle = (low + high) / 2
        low, high = (middle, high) if upper_tail(middle) > 1 - probability else (low, middle)
    return (low + high) / 2


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function ``I_x(a, b)`` by its continued fraction (modified Lentz), on the
    side where it converges fast."""
    if x <= 0 or x >= 1:
        return float(x >= 1)
    if x > (a + 1) / (a + b + 2):
        return 1 - _incomplete_beta(b, a, 1 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    value = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            value *= c * d
        if abs(c * d - 1) < 1e-15:
            break
    return front * value


def t_interval(values: list[float], confidence: float = CONFIDENCE,
               bounds: tuple[float, float] = (-math.inf, math.inf)) -> tuple[float, float] | None:
    """The t-interval of the mean of ``values`` (one per seed) at ``confidence``: mean ± t · sd / sqrt(n), clipped
    to ``bounds`` (the figure's range: a bounded share's t-interval can pass its bound); None for fewer than two
    values, or when they are all equal (no spread to scale)."""
    if len(values) < 2 or len(set(values)) == 1:
        return None
    mean, sd = float(np.mean(values)), float(np.std(values, ddof=1))
    half = t_quantile(0.5 + confidence / 2, len(values) - 1) * sd / math.sqrt(len(values))
    return max(mean - half, bounds[0]), min(mean + half, bounds[1])


def wilson_interval(accuracy: float, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``accuracy`` observed over ``n`` trials."""
    z = _z(confidence)
    centre = (accuracy + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(accuracy * (1 - accuracy) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def lower_pairs(size: int) -> list[tuple[int, int]]:
    """The pairs (t, k), t > k, in row order."""
    return [(t, k) for t in range(size) for k in range(t)]


def entry_index(size: int) -> dict[tuple[int, int], int]:
    """Position of each lower-triangular entry (t, k), k <= t, in row order."""
    return {(t, k): i for i, (t, k) in enumerate((t, k) for t in range(size) for k in range(t + 1))}


KEPT_COUNTS = 1 << 27
"""Resample counts (queries x resamples, one byte each) kept for reuse: every record scored on the same number of
queries draws the same resamples, so a page comparing dozens of runs on 50,000 queries draws them once."""


def bootstrap_accuracies(hits: np.ndarray, resamples: int = RESAMPLES, seed: int = 0,
                         chunk: int = 100) -> np.ndarray:
    """``E x resamples`` accuracies of the ``E`` entries whose per-query hits are the rows of ``hits`` (E x n),
    each column from one resample of the n queries with replacement, shared by every entry."""
    entries, n = hits.shape
    values = hits.astype(np.float32)
    counts = _kept_counts(n, resamples, seed, chunk) if n * resamples <= KEPT_COUNTS else \
        _count_chunks(n, resamples, seed, chunk)
    out = np.empty((entries, resamples), dtype=np.float64)
    start = 0
    for drawn in counts:
        out[:, start:start + len(drawn)] = values @ drawn.astype(np.float32).T / n
        start += len(drawn)
    return out


def _count_chunks(n: int, resamples: int, seed: int, chunk: int) -> Iterator[np.ndarray]:
    """How often each of ``n`` queries is drawn in each resample, ``chunk`` resamples at a time."""
    rng = np.random.default_rng(seed)
    for start in range(0, resamples, chunk):
        m = min(chunk, resamples - start)
        draws = rng.integers(0, n, size=(m, n)) + (np.arange(m) * n)[:, None]
        yield np.bincount(draws.ravel(), minlength=m * n).reshape(m, n)


@functools.lru_cache(maxsize=2)
def _kept_counts(n: int, resamples: int, seed: int, chunk: int) -> tuple[np.ndarray, ...]:
    """:func:`_count_chunks`, kept in one byte per count where a chunk's counts fit (a query drawn 256 times in one
    resample is, for any n, all but impossible; then in the counts' own type)."""
    return tuple(c.astype(np.uint8) if c.max() <= 255 else c for c in _count_chunks(n, resamples, seed, chunk))


def binomial_accuracies(entries: np.ndarray, n: int, resamples: int = RESAMPLES, seed: int = 0) -> np.ndarray:
    """``E x resamples`` accuracies drawn independently from Binomial(n, p) / n for each entry p."""
    rng = np.random.default_rng(seed)
    return rng.binomial(n, np.clip(entries, 0, 1)[:, None], size=(len(entries), resamples)) / n


def _matrices(samples: np.ndarray, size: int) -> np.ndarray:
    """Resampled matrices ``resamples x size x size`` (NaN above the diagonal) from entry samples."""
    out = np.full((samples.shape[1], size, size), np.nan)
    rows, cols = np.tril_indices(size)
    out[:, rows, cols] = samples.T
    return out


def _share(flags: list[bool]) -> float | None:
    return float(np.mean(flags)) if flags else None


def noise_metrics(matrix: np.ndarray, queries: int, *, hits: np.ndarray | None = None,
                  replacement_tasks: list[int] | None = None, tie_rule: str = "strict",
                  confidence: float = CONFIDENCE, resamples: int = RESAMPLES, seed: int = 0) -> dict[str, Any]:
    """The ``noise`` object of ``metrics.json`` (module docstring).

    ``hits``: the per-query hits of every lower-triangular entry in row order (E x n, bool), from
    :meth:`benchmarks.retrieval.CompatibilityEvaluator.hit_matrix`; without it the ``binomial`` method is used.
    """
    size = len(matrix)
    index = entry_index(size)
    rows, cols = np.tril_indices(size)
    if hits is not None:
        samples, method = bootstrap_accuracies(hits, resamples, seed), "paired_bootstrap"
    else:
        samples, method = binomial_accuracies(matrix[rows, cols], queries, resamples, seed), "binomial"
    tail = 100 * (1 - confidence) / 2
    boot_ac = [average_compatibility(m, tie_rule) for m in _matrices(samples, size)]
    across = set(map(tuple, np.argwhere(replacement_pairs(size, replacement_tasks or []))))
    decisions = []
    for t, k in lower_pairs(size):
        diff = samples[index[(t, k)]] - samples[index[(k, k)]]
        low, high = np.percentile(diff, [tail, 100 - tail])
        verdict = "compatible" if low > 0 else "incompatible" if high < 0 else "within_noise"
        decisions.append({"pair": [t, k], "difference": float(matrix[t, k] - matrix[k, k]),
                          "interval": [float(low), float(high)], "decision": verdict, "across": (t, k) in across})

    def summary(chosen: list[dict[str, Any]]) -> dict[str, Any]:
        return {"AC_outside_noise": _share([d["decision"] == "compatible" for d in chosen]),
                "AC_upper": _share([d["decision"] != "incompatible" for d in chosen]),
                "pairs": len(chosen), "within_noise": sum(d["decision"] == "within_noise" for d in chosen)}

    return {
        "method": method, "confidence": confidence, "queries": queries, "resamples": resamples, "seed": seed,
        "entry_intervals": [[list(wilson_interval(float(matrix[t, k]), queries, confidence)) if k <= t else None
                             for k in range(size)] for t in range(size)],
        "AC_interval": [float(np.percentile(boot_ac, tail)), float(np.percentile(boot_ac, 100 - tail))],
        **summary(decisions),
        "across": summary([d for d in decisions if d["across"]]),
        "pair_decisions": decisions,
    }
