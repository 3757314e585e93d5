"""Whether experiment A beats experiment B beyond noise (``runner.py compare RESULTS A B``; docs/evaluation.md,
"Comparing two experiments").

Each figure of a run is computed from its per-query top-1 hits, which its record keeps (``query_hits``: every entry
of the compatibility matrix; ``two_model.query_top1`` for the BCT line's protocol): AC, AA, ACA and the negative
flip rates of the matrix, and in ``upgrade`` the new/old and new/new top-1 and the two-model negative flip rates. Two
sources of noise are measured:

* **the queries**: within a seed, A's and B's runs are scored on the same queries (the records' ``query_sha256``
  and ``gallery_sha256``), so the queries are resampled with replacement, the same resample for both (the paired
  bootstrap of :mod:`benchmarks.noise`), and every figure's difference recomputed;
* **the seeds**: a seed is a draw of the training (and, with ``seed_scope: split``, of the class order and the query
  sample); A's and B's runs of one seed are paired when they share the split (the same class order and queries).

The difference of a figure is the mean over the paired seeds of A's minus B's. Its interval (``confidence``):

* several paired seeds: the t-interval over seeds of the per-seed differences; when every seed was scored on the
  same queries (``seed_scope: training``), the query noise is common to the seeds and does not show in their
  spread, so the variance of the mean difference over shared query resamples is added to the seeds' before the
  t factor (S - 1 degrees of freedom); when each seed has its own queries, their spread holds the query noise, and
  the variance used is never below what the queries alone give (:func:`_query_floor`: a figure equal on every
  seed, as AC on few pairs often is, has no spread but is not free of noise);
* one paired seed: the percentile interval of the paired query bootstrap (the training noise is not measured: the
  verdict says so);
* no seed shared: Welch's interval of the two means over their own seeds, each mean's shared-query variance added
  when its seeds share queries, and its seeds' variance never below their queries' when they do not.

A beats B on a figure when the interval lies on A's side of 0 (above for AC, AA, ACA and top-1; below for negative
flip rates); B beats A when it lies on B's side; otherwise the two are within noise.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from benchmarks.noise import CONFIDENCE, RESAMPLES, bootstrap_accuracies, t_quantile
from benchmarks.record import RunRecord, unpack_hits

from .tables import Column, Kind, Table

HIGHER_IS_BETTER = {"AC": True, "AA": True, "ACA": True, "NFR self": False, "NFR cross": False,
                    "new/old top-1": True, "new/new top-1": True, "two-model NFR self": False,
                    "two-model NFR cross": False}
"""The figures compared, in this order, and which way is better."""
UNITS = {"AC": "", "AA": " points", "ACA": " points", "new/old top-1": " points", "new/new top-1": " points"}
"""Units of the differences: AC is a fraction of pairs, every other figure percent (its difference in points)."""


class CompareError(ValueError):
    """Two experiments that cannot be compared; the message says why and what to run."""


@dataclass(frozen=True)
class QueryFigures:
    """Figures of one run that are functions of the means of per-query indicator rows: ``rows`` (F x n, bool), and
    ``figures`` mapping the rows' means (F x R, one column per resample of the queries) to each figure's R values."""

    rows: np.ndarray
    figures: Callable[[np.ndarray], dict[str, np.ndarray]]

    def values(self) -> dict[str, float]:
        """Each figure on the run's own queries."""
        return {name: float(v[0]) for name, v in self.figures(self.rows.mean(axis=1, keepdims=True)).items()}

    def resampled(self, resamples: int, seed: int) -> dict[str, np.ndarray]:
        """Each figure on ``resamples`` resamples of the queries, drawn from ``seed`` (the same draws for every run
        of as many queries)."""
        return self.figures(bootstrap_accuracies(self.rows, resamples, seed))


def matrix_figures(record: RunRecord) -> QueryFigures | None:
    """AC, AA, ACA and the mean negative flip rates (``NFR self``, ``NFR cross``) of a stream run's matrix, from its
    ``query_hits`` (None without them): entries and flips are means of per-query rows, AC the share of pairs t > k
    whose entry beats the diagonal's (a tie breaks compatibility under the ``strict`` rule)."""
    packed = record.get("query_hits")
    if not packed:
        return None
    queries = record["evaluation"]["queries"]
    hits = np.stack([unpack_hits(text, queries) for text in packed])
    size = int((math.isqrt(8 * len(hits) + 1) - 1) // 2)
    index = {(t, k): i for i, (t, k) in enumerate((t, k) for t in range(size) for k in range(t + 1))}
    pairs = [(t, k) for t in range(1, size) for k in range(t)]
    flips_self = [hits[index[(t - 1, t - 1)]] & ~hits[index[(t, t)]] for t in range(1, size)]
    flips_cross = [hits[index[(t - 1, t - 1)]] & ~hits[index[(t, t - 1)]] for t in range(1, size)]
    rows = np.concatenate([hits, np.array(flips_self + flips_cross, dtype=bool).reshape(-1, queries)])
    strict = (record.get("metrics") or {}).get("tie_rule", "strict") == "strict"
    entries, steps = len(hits), size - 1

    def figures(means: np.ndarray) -> dict[str, np.ndarray]:
        out = {"AA": 100 * means[:entries].mean(axis=0)}
        if pairs:
            beats = [(means[index[p]] > means[index[(p[1], p[1])]]) if strict else
                     (means[index[p]] >= means[index[(p[1], p[1])]]) for p in pairs]
            out["AC"] = np.mean(beats, axis=0)
            out["ACA"] = 100 * np.mean([means[index[p]] for p in pairs], axis=0)
            out["NFR self"] = 100 * means[entries:entries + steps].mean(axis=0)
            out["NFR cross"] = 100 * means[entries + steps:].mean(axis=0)
        return out

    return QueryFigures(rows, figures)


def two_model_figures(record: RunRecord) -> QueryFigures | None:
    """``upgrade``'s new/old and new/new top-1 and its negative flip rates to new/new (``two-model NFR self``) and
    to new/old (``two-model NFR cross``), from ``two_model.query_top1`` (None without it); top-1 counted as the
    record counts it (queries without a match left out under the ``exclude`` convention)."""
    two_model = record.get("two_model")
    if not two_model or not {"old/old", "new/old", "new/new"} <= set(two_model.get("query_top1", {})):
        return None
    queries = two_model["queries"]
    old, cross, new = (unpack_hits(two_model["query_top1"][case], queries) for case in ("old/old", "new/old",
                                                                                          "new/new"))
    counted = queries - (two_model.get("queries_without_match", 0)
                         if two_model.get("unmatched_queries") == "exclude" else 0)
    rows = np.stack([cross, new, old & ~new, old & ~cross])

    def figures(means: np.ndarray) -> dict[str, np.ndarray]:
        counted_share = queries / counted
        return {"new/old top-1": 100 * means[0] * counted_share, "new/new top-1": 100 * means[1] * counted_share,
                "two-model NFR self": 100 * means[2], "two-model NFR cross": 100 * means[3]}

    return QueryFigures(rows, figures)


def run_figures(record: RunRecord) -> list[QueryFigures]:
    """Every group of query figures a record holds (the matrix's, the two-model protocol's)."""
    return [f for f in (matrix_figures(record), two_model_figures(record)) if f is not None]


def split_of(record: RunRecord) -> tuple:
    """What a run was trained and scored on besides its seed's training draws: the class order and the query and
    gallery digests (records before the digests: the query count and the evaluation settings)."""
    evaluation = record.get("evaluation", {})
    settings = (record.get("config") or {}).get("evaluation", {})
    return (tuple(record.get("stream", {}).get("class_order", [])),
            evaluation.get("query_sha256") or (evaluation.get("queries"), repr(sorted(settings.items()))),
            evaluation.get("gallery_sha256"))


@dataclass(frozen=True)
class Difference:
    """One figure compared: A's and B's means over their seeds, the difference (A - B, over the paired seeds when
    paired), its interval, how it was made and the verdict (``A``, ``B`` or ``noise``)."""

    figure: str
    a: float
    b: float
    difference: float
    interval: tuple[float, float]
    method: str
    verdict: str


def compare(a_runs: list[RunRecord], b_runs: list[RunRecord], *, confidence: float = CONFIDENCE,
            resamples: int = RESAMPLES, seed: int = 0, memo: dict | None = None) -> list[Difference]:
    """Each figure both experiments hold, compared (module docstring). ``memo`` keeps each record's figures and
    their resamples across calls that share records (:func:`against_best` compares the best with every other)."""
    a_by_seed, b_by_seed = ({r["seed"]: r for r in runs} for runs in (a_runs, b_runs))
    paired = sorted(s for s in a_by_seed.keys() & b_by_seed.keys() if split_of(a_by_seed[s]) == split_of(b_by_seed[s]))
    if paired:
        a_runs, b_runs = [a_by_seed[s] for s in paired], [b_by_seed[s] for s in paired]
    memo = {} if memo is None else memo
    a_values, a_samples, a_shared = _figures(a_runs, resamples, seed, memo)
    b_values, b_samples, b_shared = _figures(b_runs, resamples, seed, memo)
    out = []
    for figure, higher in HIGHER_IS_BETTER.items():
        if figure not in a_values or figure not in b_values:
            continue
        a, b = np.array(a_values[figure]), np.array(b_values[figure])
        if paired:
            low, high, method = paired_interval(a - b, a_samples[figure] - b_samples[figure], a_shared, confidence)
        else:
            low, high, method = _welch_interval(a, b, a_samples[figure], b_samples[figure], a_shared, b_shared,
                                                confidence)
        side = low > 0 if higher else high < 0
        other = high < 0 if higher else low > 0
        out.append(Difference(figure, float(a.mean()), float(b.mean()), float(a.mean() - b.mean()), (low, high),
                              method, "A" if side else "B" if other else "noise"))
    return out


def _figures(runs: list[RunRecord], resamples: int, seed: int, memo: dict
             ) -> tuple[dict[str, list[float]], dict[str, np.ndarray], bool]:
    """Per figure: each run's value, the runs' resampled values (runs x resamples, the same draws for runs scored on
    as many queries), and whether every run was scored on the same queries."""
    values: dict[str, list[float]] = {}
    samples: dict[str, list[np.ndarray]] = {}
    for record in runs:
        key = (id(record), resamples, seed)
        if key not in memo:
            groups = run_figures(record)
            memo[key] = ({name: v for g in groups for name, v in g.values().items()},
                         {name: d for g in groups for name, d in g.resampled(resamples, seed).items()})
        for name, value in memo[key][0].items():
            values.setdefault(name, []).append(value)
        for name, drawn in memo[key][1].items():
            samples.setdefault(name, []).append(drawn)
    complete = {name for name, found in values.items() if len(found) == len(runs)}
    shared = len({split_of(r)[1:] for r in runs}) == 1
    return ({name: values[name] for name in complete}, {name: np.stack(samples[name]) for name in complete}, shared)


def paired_interval(differences: np.ndarray, drawn: np.ndarray, shared_queries: bool,
                     confidence: float) -> tuple[float, float, str]:
    """The interval of the mean paired difference (module docstring): ``differences`` one per seed, ``drawn`` their
    resampled values (seeds x resamples)."""
    seeds = len(differences)
    if seeds == 1:
        tail = 100 * (1 - confidence) / 2
        low, high = np.percentile(drawn[0], [tail, 100 - tail])
        return float(low), float(high), "1 seed, paired query bootstrap (training noise not measured)"
    variance = float(np.var(differences, ddof=1)) / seeds
    method = f"{seeds} paired seeds, t-interval"
    if shared_queries:
        variance += float(np.var(drawn.mean(axis=0), ddof=1))
        method += " + shared-query bootstrap"
    elif variance < (floor := _query_floor(drawn)):
        variance = floor
        method += ", query-noise floor"
    half = t_quantile(0.5 + confidence / 2, seeds - 1) * math.sqrt(variance)
    mean = float(differences.mean())
    return mean - half, mean + half, method


def _query_floor(drawn: np.ndarray) -> float:
    """The least variance the mean over seeds scored on their own queries can have: each seed's difference carries
    its queries' noise (the variance of its resampled values, ``drawn`` seeds x resamples), independent across
    seeds, so the mean's variance is at least their mean over the number of seeds. A spread over seeds below it
    (AC, a share of few pairs, is often equal on every seed) understates the noise, and the floor is used instead."""
    return float(np.var(drawn, axis=1, ddof=1).mean()) / len(drawn)


def _welch_interval(a: np.ndarray, b: np.ndarray, a_drawn: np.ndarray, b_drawn: np.ndarray, a_shared: bool,
                    b_shared: bool, confidence: float) -> tuple[float, float, str]:
    """Welch's interval of ``mean(a) - mean(b)`` over unpaired seeds, each mean's shared-query variance added
    (module docstring); degrees of freedom by Welch-Satterthwaite over the seeds' parts (the normal's with one seed
    each)."""
    parts = []
    for values, drawn, shared in ((a, a_drawn, a_shared), (b, b_drawn, b_shared)):
        seeds = 0.0
        if len(values) > 1:
            seeds = max(float(np.var(values, ddof=1)) / len(values), 0.0 if shared else _query_floor(drawn))
        queries = float(np.var(drawn.mean(axis=0), ddof=1)) if shared or len(values) == 1 else 0.0
        parts.append((seeds, queries, len(values)))
    variance = sum(s + q for s, q, _ in parts)
    seed_parts = [(s, n) for s, _, n in parts if s > 0 and n > 1]
    df = (sum(s for s, _ in seed_parts) ** 2 / sum(s * s / (n - 1) for s, n in seed_parts)) if seed_parts \
        else math.inf
    half = t_quantile(0.5 + confidence / 2, df) * math.sqrt(variance)
    mean = float(a.mean() - b.mean())
    return mean - half, mean + half, f"unpaired ({len(a)} and {len(b)} seeds), Welch"


def verdict_line(a: str, b: str, differences: list[Difference], confidence: float = CONFIDENCE) -> str:
    """One line: on which figures A beats B beyond noise, on which B beats A, and which are within noise."""
    def listed(who: str) -> str:
        return ", ".join(f"{d.figure} ({d.difference:+.3g}{UNITS.get(d.figure, ' points')})"
                         for d in differences if d.verdict == who)

    parts = []
    if listed("A"):
        parts.append(f"{a} beats {b} beyond noise on {listed('A')}")
    if listed("B"):
        parts.append(f"{b} beats {a} beyond noise on {listed('B')}")
    within = [d.figure for d in differences if d.verdict == "noise"]
    if within:
        parts.append(f"within noise on {', '.join(within)}")
    methods = sorted({d.method for d in differences})
    return "; ".join(parts) + f" ({int(100 * confidence)}% intervals; {'; '.join(methods)})"


def comparison_table(a: str, b: str, differences: list[Difference]) -> Table:
    """The figures compared, one row each: A's and B's means, the difference, its interval, how it was made and
    who wins beyond noise."""
    columns = (Column("figure", "figure", Kind.TEXT), Column(a, "a", digits=3), Column(b, "b", digits=3),
               Column("A - B", "difference", digits=3), Column("95% interval", "interval", Kind.INTERVAL, 3),
               Column("how", "method", Kind.TEXT), Column("beyond noise", "verdict", Kind.TEXT))
    winner = {"A": f"{a} better", "B": f"{b} better", "noise": "within noise"}
    return Table(columns, [[d.figure, d.a, d.b, d.difference, d.interval, d.method, winner[d.verdict]]
                           for d in differences])


def against_best(groups: dict[tuple[str, str, str], list[RunRecord]], figure: str, *,
                 confidence: float = CONFIDENCE, resamples: int = RESAMPLES) -> Table:
    """Within each scenario and data set, the experiment with the best mean ``figure`` compared with every other one
    (:func:`compare`): one row per other experiment, its mean and the best's, the difference (best - it) with its
    interval, and the verdict on every figure both hold (``+`` the best is better beyond noise, ``-`` it is, ``=``
    within noise). Each experiment is read from its records that hold ``figure`` (records written before a figure
    was recorded are left out; ``seeds`` counts those read)."""
    higher = HIGHER_IS_BETTER[figure]
    rows, memo = [], {}
    for (scenario, dataset), experiments in _by_setting(groups).items():
        holding, means = {}, {}
        for label, runs in experiments.items():
            held = [(record, value) for record in runs for value in _figure_values([record], figure)]
            if held:
                holding[label] = [record for record, _ in held]
                means[label] = float(np.mean([value for _, value in held]))
        if len(means) < 2:
            continue
        best = (max if higher else min)(means, key=means.get)
        for label in sorted(means, key=means.get, reverse=higher):
            if label == best:
                continue
            found = compare(holding[best], holding[label], confidence=confidence, resamples=resamples, memo=memo)
            main = next(d for d in found if d.figure == figure)
            rows.append([scenario, dataset, best, label, main.a, main.b, main.difference, main.interval,
                         len({r["seed"] for r in holding[label]}), verdict_marks(found)])
    columns = (Column("scenario", "scenario", Kind.TEXT), Column("dataset", "dataset", Kind.TEXT),
               Column(f"best on {figure}", "best", Kind.TEXT), Column("experiment", "experiment", Kind.TEXT),
               Column(f"best {figure}", "best_value", digits=3), Column(figure, "value", digits=3),
               Column("best - it", "difference", digits=3),
               Column(f"{int(100 * confidence)}% interval", "interval", Kind.INTERVAL, 3),
               Column("seeds", "seeds", Kind.INTEGER),
               Column("every figure (+ best better, - it better, = within noise)", "verdicts", Kind.TEXT))
    return Table(columns, rows)


def verdict_marks(found: list[Difference]) -> str:
    """Each figure of ``found`` with its verdict: ``+`` the first experiment better beyond noise, ``-`` the second,
    ``=`` within noise."""
    return " ".join(f"{d.figure} {'+' if d.verdict == 'A' else '-' if d.verdict == 'B' else '='}" for d in found)


def against_variants(groups: dict[tuple[str, str, str], list[RunRecord]], figure: str, *,
                     confidence: float = CONFIDENCE, resamples: int = RESAMPLES) -> Table:
    """Within each scenario and data set, every experiment named ``<name>.<variant>`` (a strategy's other teacher arm,
    ``bct.incoming``; its authors' recipe, ``lce.authors``) compared with the experiment ``<name>`` (:func:`compare`
    of the variant against it): one row per pair, both means of ``figure``, the difference (variant - it) with its
    interval, and the verdict on every figure both hold (``+`` the variant is better beyond noise, ``-`` it is worse,
    ``=`` within noise). Each experiment is read from its records that hold ``figure``."""
    rows, memo = [], {}
    for (scenario, dataset), experiments in _by_setting(groups).items():
        holding = {label: [record for record in runs if _figure_values([record], figure)]
                   for label, runs in experiments.items()}
        for variant in sorted(holding):
            base = variant.rsplit(".", 1)[0]
            if base == variant or not holding.get(base) or not holding[variant]:
                continue
            found = compare(holding[variant], holding[base], confidence=confidence, resamples=resamples, memo=memo)
            main = next(d for d in found if d.figure == figure)
            rows.append([scenario, dataset, base, variant, main.b, main.a, main.difference, main.interval,
                         len({r["seed"] for r in holding[variant]}), verdict_marks(found)])
    columns = (Column("scenario", "scenario", Kind.TEXT), Column("dataset", "dataset", Kind.TEXT),
               Column("experiment", "experiment", Kind.TEXT), Column("variant", "variant", Kind.TEXT),
               Column(figure, "value", digits=3), Column(f"variant {figure}", "variant_value", digits=3),
               Column("variant - it", "difference", digits=3),
               Column(f"{int(100 * confidence)}% interval", "interval", Kind.INTERVAL, 3),
               Column("seeds", "seeds", Kind.INTEGER),
               Column("every figure (+ variant better, - it better, = within noise)", "verdicts", Kind.TEXT))
    return Table(columns, rows)


def _by_setting(groups: dict[tuple[str, str, str], list[RunRecord]]
                ) -> dict[tuple[str, str], dict[str, list[RunRecord]]]:
    out: dict[tuple[str, str], dict[str, list[RunRecord]]] = {}
    for (scenario, dataset, label), runs in groups.items():
        out.setdefault((scenario, dataset), {})[label] = runs
    return out


def _figure_values(runs: list[RunRecord], figure: str) -> list[float]:
    """``figure`` of each run that holds it, from its query hits."""
    return [value for record in runs for group in run_figures(record)
            for name, value in group.values().items() if name == figure]
