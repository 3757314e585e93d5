"""The answer of an adapter study (docs/METHODS.md §7b): which adapter to deploy, and how much of the gallery to
re-embed. Read from the leave-one-out records of one study (one data set, one pair of models), so ``runner.py
adapt`` and ``runner.py report`` give the same answer.

For each adapter, over its seeds:

* **cross case**: what the system delivers without backfilling: old+new/old for an adapter that combines both
  models' queries (SLERP; the old encoder keeps running), B/old for an adapter with a backward map, new/F for a
  forward-only one, new/old without adapter (the first of :data:`CROSS_CASES` that exists);
* **compatible**: the cross case's top-1 against old/old, paired over queries and seeds: each seed's gain is its
  cross case's top-1 minus old/old's on the same queries; the interval of the mean gain is the t-interval over the
  seeds with the variance of the queries added (every seed is scored on the same queries, so their noise is common
  to the seeds: :func:`cl2r_bench.reporting.compare.paired_interval`), or with one seed (or one fit shared by every
  seed) the percentile interval of the paired bootstrap over queries (2,000 resamples). ``yes`` when the 95 %
  interval lies above 0, ``no`` when below, ``within noise`` otherwise. The per-query hits are in the record
  (``retrieval.query_top1``, packed bits);
* **gains**: top-1 and mAP of the cross case minus old/old, in points (seed means);
* **negative flips**: the share of queries old/old answers at top-1 that the cross case loses, in percent (seed
  mean; ``retrieval.case_flips``, or from the per-query hits in records before it): a gain can hide answers users
  saw and lose;
* **backfilling**: of the orders measured, the one with the largest mean top-1 AUC; its AUC, and the share of the
  gallery to re-embed in that order until top-1 reaches 95 % of new/new's (the new model on a fully re-embedded
  gallery: one target for every adapter, whatever its own curve ends at), the first β of the grid that does, on the
  seeds' mean curve; none where the curve never does;
* **fit**: mean fit time; ``converged``: whether every seed's fit converged (None where nothing was trained:
  closed-form adapters and no adapter).

Whether to upgrade at all (:class:`ModelsVerdict`): new/new against old/old, paired over queries like the cross
case; when new/new is not above old/old beyond noise the answer opens with "do not upgrade". A recommended cross
case above new/new is flagged: a map fitted on the scored classes can beat re-embedding on them.

The recommendation: the compatible adapter with the largest top-1 gain (the others whose gain lies inside its
interval are named as equivalent); without one, that no adapter is compatible and the cheapest backfilling. Only
adapters measured on the study's largest number of seeds are ranked: a one-seed variant beside three-seed adapters
is one draw against a mean, so it is named apart, with its seeds, rather than recommended. A seed-free adapter
(a closed form on every fitting item, fitted and scored once for all seeds; its seeds column says "one fit") is
ranked with the others: more seeds would not change it.

The deployments each adapter offers, with their costs, are :mod:`cl2r_bench.reporting.deployments`; the answer as text
and JSON
(``runner.py adapt``) is :mod:`cl2r_bench.reporting.adapter_answer`.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from benchmarks.noise import bootstrap_accuracies
from benchmarks.record import BASELINE, cross_case, unpack_hits

from .compare import paired_interval

BACKFILL_TARGET = 0.95
CONFIDENCE = 0.95
RESAMPLES = 2000


@dataclass(frozen=True)
class AdapterSummary:
    """One row of the study's answer (module docstring); gains in points, shares as fractions."""

    adapter: str
    seeds: int
    seed_free: bool
    cross_case: str | None
    compatible: str
    top1_gain: float | None
    top1_interval: tuple[float, float] | None
    negative_flips: float | None
    mAP_gain: float | None
    backfill_order: str | None
    backfill_auc: float | None
    reembed_share: float | None
    fit_seconds: float
    converged: bool | None

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "top1_interval": list(self.top1_interval) if self.top1_interval else None}


def paired_gain_interval(cross: np.ndarray, baseline: np.ndarray, confidence: float = CONFIDENCE,
                         resamples: int = RESAMPLES, seed: int = 0,
                         one_fit: bool = False) -> tuple[float, tuple[float, float]]:
    """Mean gain of ``cross`` over ``baseline`` in top-1 points and its interval over seeds and queries (module
    docstring): ``cross`` is ``(seeds, n)`` hits, ``baseline`` ``(n,)`` on the same queries; ``one_fit``: the seeds
    share one fit (a seed-free adapter), so they are one draw."""
    gains = np.asarray(cross, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)[None, :]
    if one_fit:
        gains = gains[:1]
    drawn = bootstrap_accuracies(gains, resamples=resamples, seed=seed) * 100
    low, high, _ = paired_interval(gains.mean(axis=1) * 100, drawn, True, confidence)
    return float(gains.mean() * 100), (low, high)


def reaches_target(top1: float, full: float) -> bool:
    """Whether ``top1`` reaches :data:`BACKFILL_TARGET` of new/new's ``full`` (to float rounding): the one test of the
    share to re-embed and of the deployment to run, so the two never disagree at the boundary."""
    return top1 >= BACKFILL_TARGET * full - 1e-9


def reembed_share(betas: list[float], top1: list[float], full: float | None = None) -> float | None:
    """The first β of the grid whose top-1 reaches the target share of ``full`` (:func:`reaches_target`): new/new's
    top-1, the one target every adapter is held to (default: the curve's own top-1 at β = 1); None where the curve
    never reaches it."""
    full = top1[-1] if full is None else full
    return next((beta for beta, value in zip(betas, top1, strict=True) if reaches_target(value, full)), None)


def _best_backfilling(records: list[dict[str, Any]]) -> tuple[str | None, float | None, float | None]:
    """``(order, mean top-1 AUC, share to re-embed)`` of the order with the largest mean top-1 AUC (no share where
    a record lacks the order's curve)."""
    backfills = [r["retrieval"]["backfilling"] for r in records]
    best = None
    for order in backfills[0].get("auc", {}):
        if any(b["auc"].get(order) is None for b in backfills):
            continue
        auc = float(np.mean([b["auc"][order]["top1_auc"] for b in backfills]))
        if best is None or auc > best[1]:
            curves = [(b.get("curves") or {}).get(order) for b in backfills]
            full = float(np.mean([r["retrieval"]["cases"]["new/new"]["top1"] for r in records]))
            share = None if None in curves else reembed_share(backfills[0]["betas"],
                                                              np.mean([c["top1"] for c in curves], axis=0).tolist(),
                                                              full)
            best = (order, auc, share)
    return best or (None, None, None)


def case_flips(record: dict[str, Any], case: str) -> float | None:
    """The negative flip rate of ``case`` against old/old in percent: from ``retrieval.case_flips``, else (records
    before it) from the per-query hits of old/old and the case where the record keeps both, else None."""
    retrieval = record["retrieval"]
    rate = (retrieval.get("case_flips") or {}).get(case)
    hits = retrieval.get("query_top1") or {}
    if rate is None and BASELINE in hits and case in hits:
        n = retrieval["queries"]
        rate = float(np.mean(unpack_hits(hits[BASELINE], n) & ~unpack_hits(hits[case], n)))
    return None if rate is None else 100.0 * rate


def mean_flips(records: list[dict[str, Any]], case: str) -> float | None:
    """:func:`case_flips` averaged over ``records`` (seeds), None unless every record has it."""
    rates = [case_flips(r, case) for r in records]
    return None if None in rates or not rates else float(np.mean(rates))


def _fit(record: dict[str, Any]) -> dict[str, Any]:
    adapter = record.get("adapter") or {}
    return adapter.get("fit") or (adapter.get("fits") or [{}])[-1]


def summarise_adapter(method: str, records: list[dict[str, Any]]) -> AdapterSummary:
    """The row of one adapter from its records (one per seed; module docstring)."""
    cases = [r["retrieval"]["cases"] for r in records]
    case = cross_case(cases[0])
    gain = interval = map_gain = None
    verdict = "n/a"
    hits = [r["retrieval"].get("query_top1") or {} for r in records]
    if case is not None:
        top1 = [c[case]["top1"] - c[BASELINE]["top1"] for c in cases]
        if all(c[case]["mAP"] is not None for c in cases):
            map_gain = float(np.mean([c[case]["mAP"] - c[BASELINE]["mAP"] for c in cases]))
        gain = float(np.mean(top1))
        if all(case in h and BASELINE in h for h in hits):
            n = records[0]["retrieval"]["queries"]
            cross = np.stack([unpack_hits(h[case], n) for h in hits])
            gain, interval = paired_gain_interval(cross, unpack_hits(hits[0][BASELINE], n), one_fit=one_fit(records))
            verdict = "yes" if interval[0] > 0 else "no" if interval[1] < 0 else "within noise"
    order, auc, share = _best_backfilling(records)
    fits = [_fit(r) for r in records]
    flags = [f["converged"] for f in fits if "converged" in f]
    seconds = [f.get("seconds", r["timings"].get("adapter_fit_seconds", 0.0)) for f, r in zip(fits, records,
                                                                                                 strict=True)]
    return AdapterSummary(
        adapter=method, seeds=len(records), seed_free=one_fit(records),
        cross_case=case, compatible=verdict, top1_gain=gain, top1_interval=interval,
        negative_flips=None if case is None else mean_flips(records, case), mAP_gain=map_gain,
        backfill_order=order, backfill_auc=auc, reembed_share=share, fit_seconds=float(np.mean(seconds)),
        converged=all(flags) if flags else None)


def one_fit(records: list[dict[str, Any]]) -> bool:
    """Whether an adapter's seeds share one fit (a closed form on every fitting item): each later seed's fit log says
    ``same_as_seed``, or, in records before that mark, every seed ranked every query alike (identical per-query hits
    of every case: no draw of the seed changed anything, so the seeds are one draw)."""
    if len(records) < 2:
        return False
    if all("same_as_seed" in _fit(r) for r in records[1:]):
        return True
    hits = [r["retrieval"].get("query_top1") for r in records]
    return all(hits) and all(h == hits[0] for h in hits[1:])


def summarise(records: list[dict[str, Any]]) -> list[AdapterSummary]:
    """One :class:`AdapterSummary` per method of one study's leave-one-out records, in first-seen order."""
    methods: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        methods.setdefault(record["method"], []).append(record)
    return [summarise_adapter(method, group) for method, group in methods.items()]


@dataclass(frozen=True)
class ModelsVerdict:
    """Whether to upgrade at all: the old model on its own index (old/old) against the new model on a fully
    re-embedded one (new/new), the same for every adapter of a study. ``gain`` is new/new minus old/old in top-1
    points with its paired 95 % interval over queries (None in records without new/new's per-query hits);
    ``upgrade`` is ``yes`` when the interval lies above 0, ``no`` when it does not."""

    old_old: float
    new_new: float
    gain: float
    interval: tuple[float, float] | None
    upgrade: str

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "interval": list(self.interval) if self.interval else None}


def models_verdict(records: list[dict[str, Any]]) -> ModelsVerdict | None:
    """The study's :class:`ModelsVerdict`, from its first record (the adapter-free cases are ranked once per
    split); None where a record lacks new/new (different widths without an adapter)."""
    retrieval = records[0]["retrieval"]
    cases = retrieval["cases"]
    if not cases.get("new/new") or not cases.get(BASELINE):
        return None
    old, new = cases[BASELINE]["top1"], cases["new/new"]["top1"]
    hits = retrieval.get("query_top1") or {}
    interval, upgrade = None, ("yes" if new > old else "no")
    if "new/new" in hits and BASELINE in hits:
        n = retrieval["queries"]
        gain, interval = paired_gain_interval(unpack_hits(hits["new/new"], n)[None, :], unpack_hits(hits[BASELINE], n))
        upgrade = "yes" if interval[0] > 0 else "no"
    return ModelsVerdict(old, new, new - old, interval, upgrade)


def models_line(verdict: ModelsVerdict | None) -> str:
    """One line on the two models themselves (:func:`models_verdict`)."""
    if verdict is None:
        return ""
    interval = (f" (95% interval {verdict.interval[0]:+.1f} to {verdict.interval[1]:+.1f})" if verdict.interval
                else " (no per-query hits in these records: by the mean)")
    return (f"the models: old/old top-1 {verdict.old_old:.1f}, new/new {verdict.new_new:.1f}, new/new - old/old "
            f"{verdict.gain:+.1f}{interval}")


def flips_cell(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:.1f}"


def ranked(rows: list[AdapterSummary]) -> list[AdapterSummary]:
    """``rows`` by top-1 gain, largest first; rows without a cross case last."""
    return sorted(rows, key=lambda r: math.inf if r.top1_gain is None else -r.top1_gain)


def recommendation(rows: list[AdapterSummary], verdict: ModelsVerdict | None = None) -> str:
    """One line: what to deploy and why (module docstring); "do not upgrade" first when ``verdict`` says the new
    model is not better than the old one beyond noise, and a warning when the recommended cross case beats the new
    model's own new/new."""
    line = adapter_recommendation(rows)
    if verdict is not None and verdict.upgrade == "no":
        line = (f"do not upgrade: the new model with every item re-embedded (new/new {verdict.new_new:.1f}) is not "
                f"above the old model on its own (old/old {verdict.old_old:.1f}) beyond noise; keep the old model. "
                f"If upgrading anyway: {line}")
    best = next((r for r in ranked(rows) if r.compatible == "yes"), None)
    if verdict is not None and best is not None and verdict.old_old + best.top1_gain > verdict.new_new:
        line += (f". Note: {best.adapter}'s {best.cross_case} ({verdict.old_old + best.top1_gain:.1f}) is above "
                 f"new/new ({verdict.new_new:.1f}), which re-embeds everything: a learned map fitted on the classes it "
                 "is scored on can beat the new model on those classes; check that the fitting and test classes "
                 "differ before relying on it (docs/METHODS.md §7b)")
    return line


def adapter_recommendation(rows: list[AdapterSummary]) -> str:
    """Which adapter to deploy, or that none is compatible (module docstring)."""
    most_seeds = max((r.seeds for r in rows), default=0)
    compatible = sorted((r for r in rows if r.compatible == "yes"), key=lambda r: -r.top1_gain)
    fewer_seeds = [r for r in compatible if r.seeds < most_seeds and not r.seed_free]
    compatible = [r for r in compatible if r not in fewer_seeds]
    if compatible:
        best = compatible[0]
        low, high = best.top1_interval
        peers = [f"{r.adapter} ({r.top1_gain:+.1f})" for r in compatible[1:] if r.top1_gain >= low]
        line = (f"deploy {best.adapter}: its {best.cross_case} beats old/old by {best.top1_gain:+.1f} top-1 points "
                f"(95% interval {low:+.1f} to {high:+.1f}) with nothing re-embedded")
        if best.reembed_share is not None:
            line += f"; {backfill_phrase(best)}"
        if peers:
            line += f"; within its interval: {', '.join(peers)}"
        if best.converged is False:
            line += "; its fit did not converge (see the warning above), so it may do better with more steps"
        if fewer_seeds:
            line += f"; not ranked, measured on fewer seeds: {seed_phrase(fewer_seeds)}"
        return line
    measured = [r for r in rows if r.top1_gain is not None]
    undecided = [r for r in measured if r.compatible == "n/a" and r.top1_gain > 0]
    if undecided:
        top = max(undecided, key=lambda r: r.top1_gain)
        return (f"undecided: these records have no per-query hits (written before they were recorded), so no "
                f"interval; by the mean, {top.adapter}'s {top.cross_case} leads old/old by {top.top1_gain:+.1f} top-1 "
                f"points; run the study again to decide")
    line = "no adapter is compatible here"
    if fewer_seeds:
        line = f"no adapter measured on {most_seeds} seeds is compatible here (compatible on fewer seeds: " \
               f"{seed_phrase(fewer_seeds)})"
    if measured:
        top = max(measured, key=lambda r: r.top1_gain)
        line += f" (best cross case: {top.adapter}'s {top.cross_case}, {top.top1_gain:+.1f} top-1 points vs old/old)"
    backfilled = [r for r in rows if r.reembed_share is not None]
    if backfilled:
        cheapest = min(backfilled, key=lambda r: (r.reembed_share, -r.backfill_auc))
        line += f"; to move to the new model: with {cheapest.adapter}, {backfill_phrase(cheapest)}"
    return line


def seed_phrase(rows: list[AdapterSummary]) -> str:
    """``rows`` named with their gains and seed counts, for the adapters the recommendation does not rank."""
    return ", ".join(f"{r.adapter} ({r.top1_gain:+.1f}, {r.seeds} seed{'s' * (r.seeds != 1)})" for r in rows)


def backfill_phrase(row: AdapterSummary) -> str:
    """How much of the gallery ``row``'s adapter needs re-embedded to reach the target share of new/new's top-1."""
    target = f"{BACKFILL_TARGET:.0%} of new/new's top-1"
    if row.reembed_share == 0:
        return f"the adapted gallery already gives {target} with nothing re-embedded"
    return f"re-embedding {row.reembed_share:.0%} of the gallery ({row.backfill_order} order) reaches {target}"


SUMMARY_COLUMNS = ("adapter", "compatible", "top-1 gain (95% interval)", "negative flips %", "re-embed for 95%",
                   "cross case", "mAP gain", "backfill AUC (order)", "seeds", "fit s", "converged")
"""The deciding columns first (whether, by how much, what re-embedding it takes), so they show on a narrow screen."""


def summary_cells(row: AdapterSummary) -> list[str]:
    """The row as the table's text cells (:data:`SUMMARY_COLUMNS`)."""
    def signed(value: float | None) -> str:
        return "-" if value is None else f"{value:+.1f}"

    interval = f" ({row.top1_interval[0]:+.1f}, {row.top1_interval[1]:+.1f})" if row.top1_interval else ""
    seeds = f"{row.seeds} (one fit)" if row.seed_free else str(row.seeds)
    return [row.adapter, row.compatible, signed(row.top1_gain) + interval, flips_cell(row.negative_flips),
            "-" if row.reembed_share is None else f"{row.reembed_share:.0%}", row.cross_case or "-",
            signed(row.mAP_gain), "-" if row.backfill_auc is None else f"{row.backfill_auc:.1f} ({row.backfill_order})",
            seeds, f"{row.fit_seconds:.1f}", {True: "yes", False: "NO", None: "-"}[row.converged]]


def recommended(rows: list[AdapterSummary]) -> AdapterSummary | None:
    """The adapter the recommendation deploys (the compatible one with the largest gain, on the most seeds), else
    the one whose gallery reaches 95 % of new/new soonest, else None."""
    most_seeds = max((r.seeds for r in rows), default=0)
    compatible = [r for r in ranked(rows) if r.compatible == "yes" and (r.seeds == most_seeds or r.seed_free)]
    if compatible:
        return compatible[0]
    backfilled = [r for r in rows if r.reembed_share is not None]
    return min(backfilled, key=lambda r: (r.reembed_share, -r.backfill_auc)) if backfilled else None


