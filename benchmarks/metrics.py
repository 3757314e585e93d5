"""Compatibility metrics: pure functions of the compatibility matrix (METHODS.md §2).

``M[t][k]`` is the retrieval accuracy of queries embedded by model t against a gallery embedded by model k
(k <= t; row = query model). Entries above the diagonal are undefined (NaN here, ``null`` in JSON). Accuracies
are fractions in [0, 1]; AA, ACA, BC and FC are reported in percent, as the papers do.

* AC: share of pairs t > k with ``M[t][k] > M[k][k]`` (strict; ``tie_rule="inclusive"`` counts ties as
  compatible, as the older CL2R code did). T = 1 gives 1.
* AC_t / AA_t: the same on the top-left (t+1)x(t+1) block.
* AA: mean of all lower-triangular entries, diagonal included (the code's "AM").
* ACA (this suite's definition, no published one exists): mean of the strictly lower entries (t > k).
* BC: mean over k < T-1 of ``M[T-1][k] - M[k][k]``; FC: mean over t >= 1 of ``M[t][t-1] - M[t][t]``.
* Across replacements (this suite's diagnostic for IAM-CL2R): AC and ACA restricted to the pairs (t, k) with a
  replacement task r, k < r <= t, i.e. a query model that descends from a different replacement than the
  gallery model. These are the pairs the papers' claim is about.
* Margin parts (this suite's diagnostic): each pair's margin ``M[t][k] - M[k][k]`` is the query model's own gain
  ``M[t][t] - M[k][k]`` less its cross gap ``M[t][t] - M[t][k]``, averaged within segments (no replacement task r,
  k < r <= t) and across replacements, in percent points.

A genuine 0.0 accuracy is a value like any other, never "missing".
"""
from __future__ import annotations

import json
import math
import reprlib
from pathlib import Path
from typing import Any

import numpy as np

from cl2r_bench.limits import TextFileError, read_text
from cl2r_bench.settings import TIE_RULES

SCALES = {"auto": (100, "fractions in [0, 1] or percent in [0, 100]"), "fraction": (1, "fractions in [0, 1]"),
          "percent": (100, "percent in [0, 100]")}


class MatrixError(ValueError):
    """A compatibility matrix is malformed."""


def is_number(value: Any) -> bool:
    """An int (not a bool) or a finite float; huge JSON integers included, which ``math.isfinite`` cannot take."""
    return isinstance(value, int) and not isinstance(value, bool) or isinstance(value, float) and math.isfinite(value)


def as_matrix(rows: Any, *, scale: str = "auto") -> np.ndarray:
    """A square float matrix of fractions with NaN above the diagonal from a list of rows (ragged or with nulls).

    ``scale`` says how entries are written: ``fraction`` (in [0, 1]), ``percent`` (in [0, 100], divided by 100)
    or ``auto``: fractions when every entry is at most 1, percent when every nonzero entry is above 1. A matrix
    that mixes the two is refused rather than guessed, since dividing it by 100 (or not) would silently
    misreport some entries. Raises :class:`MatrixError` when an entry on or below the diagonal is missing, not a
    number or out of range.
    """
    if scale not in SCALES:
        raise MatrixError(f"unknown scale {scale!r}; choose from {list(SCALES)}")
    if not isinstance(rows, (list, tuple)) or not rows or not all(isinstance(r, (list, tuple)) for r in rows):
        raise MatrixError("the matrix must be a non-empty list of rows (lists of numbers)")
    size = len(rows)
    limit, unit = SCALES[scale]
    matrix = np.full((size, size), np.nan)
    for t, row in enumerate(rows):
        if len(row) < t + 1 or len(row) > size:
            raise MatrixError(f"row {t} has {len(row)} entries; a {size}-task matrix needs {t + 1} to {size}")
        for k in range(t + 1):
            value = row[k]
            if not is_number(value):
                raise MatrixError(f"entry [{t}][{k}] is {reprlib.repr(value)}; entries on and below the diagonal "
                                  "must be numbers")
            if not 0 <= value <= limit:
                raise MatrixError(f"entry [{t}][{k}] is {reprlib.repr(value)}; accuracies must be {unit}")
            matrix[t, k] = float(value)
    if scale == "auto":
        scale = _scale_of(matrix)
    return matrix / 100.0 if scale == "percent" else matrix


def _scale_of(matrix: np.ndarray) -> str:
    """``fraction`` or ``percent`` for a matrix whose entries are all written in one of them (:func:`as_matrix`)."""
    entries = [(t, k, matrix[t, k]) for t in range(len(matrix)) for k in range(t + 1)]
    if all(v <= 1 for _, _, v in entries):
        return "fraction"
    fraction = next(((t, k, v) for t, k, v in entries if 0 < v <= 1), None)
    if fraction is None:
        return "percent"
    percent = next((t, k, v) for t, k, v in entries if v > 1)
    raise MatrixError(f"entry [{fraction[0]}][{fraction[1]}] = {fraction[2]:g} looks like a fraction but entry "
                      f"[{percent[0]}][{percent[1]}] = {percent[2]:g} looks like a percent; pass --scale percent "
                      "(or --scale fraction) or write all entries in one scale")


def load_matrix(path: str | Path, *, scale: str = "auto") -> np.ndarray:
    """Read a matrix from JSON: a list of rows, or an object with a ``compatibility_matrix`` key (``scale`` as in
    :func:`as_matrix`)."""
    if not Path(path).exists():
        raise MatrixError(f"{path} does not exist")
    try:
        data = json.loads(read_text(path, "matrix file"))
    except TextFileError as exc:
        raise MatrixError(f"{path} is {exc.problem}; a matrix file is UTF-8 JSON") from None
    except RecursionError:
        raise MatrixError(f"{path}: JSON nesting too deep; a matrix is a list of rows of numbers") from None
    except ValueError as exc:
        raise MatrixError(f"{path} is not readable JSON ({exc})") from None
    if isinstance(data, dict):
        if "compatibility_matrix" not in data:
            raise MatrixError(f"{path}: a JSON object must have a 'compatibility_matrix' key")
        data = data["compatibility_matrix"]
    return as_matrix(data, scale=scale)


def _check_tie_rule(tie_rule: str) -> None:
    if tie_rule not in TIE_RULES:
        raise ValueError(f"unknown tie rule {tie_rule!r}; choose from {list(TIE_RULES)}")


def compatible_pairs(matrix: np.ndarray, tie_rule: str = "strict") -> np.ndarray:
    """Boolean matrix: ``True`` at (t, k), t > k, where model t is compatible with model k."""
    _check_tie_rule(tie_rule)
    size = len(matrix)
    diagonal = np.diag(matrix)[None, :]
    with np.errstate(invalid="ignore"):
        better = matrix > diagonal if tie_rule == "strict" else matrix >= diagonal
    return better & np.tri(size, k=-1, dtype=bool)


def average_compatibility(matrix: np.ndarray, tie_rule: str = "strict") -> float:
    """AC: share of the T(T-1)/2 pairs meeting the empirical compatibility criterion (1.0 when T = 1)."""
    size = len(matrix)
    if size < 2:
        return 1.0
    return float(compatible_pairs(matrix, tie_rule).sum() / (size * (size - 1) / 2))


def replacement_pairs(size: int, replacement_tasks: list[int]) -> np.ndarray:
    """Boolean matrix: ``True`` at (t, k) when a replacement task r has k < r <= t."""
    pairs = np.zeros((size, size), dtype=bool)
    for r in replacement_tasks:
        if 0 < r < size:
            pairs[r:, :r] = True
    return pairs


def across_replacements(matrix: np.ndarray, replacement_tasks: list[int], tie_rule: str = "strict") -> dict[str, Any]:
    """``{"AC_across", "ACA_across", "pairs_across"}`` over the pairs separated by a replacement (module doc);
    the two values are None when no pair is."""
    pairs = replacement_pairs(len(matrix), replacement_tasks)
    count = int(pairs.sum())
    if count == 0:
        return {"AC_across": None, "ACA_across": None, "pairs_across": 0}
    return {"AC_across": float(compatible_pairs(matrix, tie_rule)[pairs].sum() / count),
            "ACA_across": float(100.0 * matrix[pairs].mean()), "pairs_across": count}


def margin_parts(matrix: np.ndarray, replacement_tasks: list[int]) -> dict[str, dict[str, Any]]:
    """Why pairs fail, per group of pairs t > k: ``within`` a segment (no replacement task r with k < r <= t) and
    ``across`` replacements (:func:`replacement_pairs`). Each group's ``{"margin", "own_gain", "cross_gap",
    "pairs"}``: the mean over its pairs of the margin ``M[t][k] - M[k][k]`` (above 0: compatible under the strict
    rule), of the query model's own gain ``M[t][t] - M[k][k]`` and of its cross gap ``M[t][t] - M[t][k]``, in
    percent points; margin = own gain - cross gap (docs/METHODS.md §2). The three are None in a group without
    pairs."""
    size = len(matrix)
    across = replacement_pairs(size, replacement_tasks)
    groups = {"within": np.tri(size, k=-1, dtype=bool) & ~across, "across": across}
    diagonal = np.diag(matrix)
    parts = {"margin": matrix - diagonal[None, :], "own_gain": diagonal[:, None] - diagonal[None, :],
             "cross_gap": diagonal[:, None] - matrix}
    out = {}
    for group, pairs in groups.items():
        count = int(pairs.sum())
        out[group] = {**{part: float(100.0 * values[pairs].mean()) if count else None
                         for part, values in parts.items()}, "pairs": count}
    return out


def average_accuracy(matrix: np.ndarray) -> float:
    """AA in percent: mean of the lower triangle, diagonal included."""
    return float(100.0 * matrix[np.tril_indices(len(matrix))].mean())


def average_cross_model_accuracy(matrix: np.ndarray) -> float | None:
    """ACA in percent: mean of the strictly lower entries; ``None`` for a single model."""
    if len(matrix) < 2:
        return None
    return float(100.0 * matrix[np.tril_indices(len(matrix), k=-1)].mean())


def backward_compatibility(matrix: np.ndarray) -> float | None:
    """BC in percent points: mean over k < T-1 of ``M[T-1][k] - M[k][k]``."""
    last = len(matrix) - 1
    if last < 1:
        return None
    return float(100.0 * np.mean([matrix[last, k] - matrix[k, k] for k in range(last)]))


def forward_compatibility(matrix: np.ndarray) -> float | None:
    """FC in percent points: mean over t >= 1 of ``M[t][t-1] - M[t][t]``."""
    if len(matrix) < 2:
        return None
    return float(100.0 * np.mean([matrix[t, t - 1] - matrix[t, t] for t in range(1, len(matrix))]))


def per_task(metric, matrix: np.ndarray, **kwargs: Any) -> list[float]:
    """``metric`` on each top-left block: ``[metric(M[:1,:1]), ..., metric(M)]`` (AC_t, AA_t)."""
    return [metric(matrix[: t + 1, : t + 1], **kwargs) for t in range(len(matrix))]


def all_metrics(matrix: np.ndarray, tie_rule: str = "strict") -> dict[str, Any]:
    """Every metric of the suite, keyed by name (the ``metrics`` object of ``metrics.json``)."""
    return {
        "AC": average_compatibility(matrix, tie_rule),
        "AA": average_accuracy(matrix),
        "ACA": average_cross_model_accuracy(matrix),
        "AC_per_task": per_task(average_compatibility, matrix, tie_rule=tie_rule),
        "AA_per_task": per_task(average_accuracy, matrix),
        "BC": backward_compatibility(matrix),
        "FC": forward_compatibility(matrix),
        "violations": [[int(t), int(k)] for t, k in zip(*np.nonzero(
            np.tri(len(matrix), k=-1, dtype=bool) & ~compatible_pairs(matrix, tie_rule)), strict=True)],
        "tie_rule": tie_rule,
        "ACA_definition": "mean of the strictly lower-triangular entries (t > k), percent",
    }


def area_under_curve(betas: list[float], accuracies: list[float]) -> float:
    """Trapezoid-rule area under accuracy against β (β spans [0, 1], so this is a mean accuracy)."""
    return float(np.trapezoid(accuracies, betas))
