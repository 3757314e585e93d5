"""Every deployment an adapter study's answer compares (docs/METHODS.md §7b), with what it costs: keep the old model,
new queries through B against the untouched index, stored vectors rewritten through F (new queries as they are, or
through B: B/F), both encoders per query, a share of the images re-embedded, every image re-embedded; and the one to
run, by a cost rule (:func:`chosen_deployment`)."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from tabulate import tabulate

from benchmarks.record import BASELINE, DUAL_CASE

from .adapter_recommendation import (
    BACKFILL_TARGET,
    AdapterSummary,
    ModelsVerdict,
    flips_cell,
    mean_flips,
    reaches_target,
    recommended,
)


@dataclass(frozen=True)
class Deployment:
    """One way a team can serve after an upgrade, with what it costs: the encoders run per query, the stored vectors
    rewritten without reading an image, the images embedded again, and the adapter's fit time."""

    deployment: str
    case: str
    top1: float
    query_encoders: str
    vectors_rewritten: int
    images_reembedded: int
    fit_seconds: float
    negative_flips: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


DEPLOYMENTS = (
    ("keep the old model", "old/old", "old", False, 0.0),
    ("new queries through B against the untouched index", "B/old", "new + B", False, 0.0),
    ("rewrite the stored vectors through F, no image read", "new/F", "new", True, 0.0),
    ("embed each query with both models against the untouched index (the old encoder keeps running)", DUAL_CASE,
     "old + new", False, 0.0),
    ("re-embed every image with the new model", "new/new", "new", False, 1.0),
)
"""``(deployment, case, query encoders, vectors rewritten?, share of images re-embedded)``, cheapest first: [choice]
rewriting the stored vectors once without reading an image ranks below running a second encoder on every query for
as long as the old index serves, and that below re-embedding images (docs/METHODS.md §7b)."""
_CASES = [case for _, case, *_ in DEPLOYMENTS]
COST_ORDER = (*_CASES[:3], "B/F", *_CASES[3:-1], "backfilled", _CASES[-1])
"""Every deployment's case, cheapest first: :data:`DEPLOYMENTS` with the backfilling curve's own galleries
(:func:`_backfilled`): at a share of 0 with both maps, B/F (the vectors rewritten through F, B per query) beside
new/F; a share of the images re-embedded before all of them."""


def deployments(row: AdapterSummary, records: list[dict[str, Any]]) -> list[Deployment]:
    """The deployments ``row``'s adapter offers (those whose case its records hold), with the gallery of its
    backfilling curve that reaches 95 % of new/new (:func:`_backfilled`: a share of the images re-embedded, or B/F
    with none), in :data:`COST_ORDER`; seed means of top-1."""
    items = int((records[0].get("models") or {}).get("test_items") or records[0]["retrieval"]["queries"])
    own = [r for r in records if r["method"] == row.adapter]
    cases = [r["retrieval"]["cases"] for r in own]

    def top1(case: str) -> float:
        return float(np.mean([c[case]["top1"] for c in cases]))

    found = []
    for name, case, encoders, rewrites, share in DEPLOYMENTS:
        if not all(c.get(case) for c in cases):
            continue
        fit = row.fit_seconds if case in ("B/old", "new/F", DUAL_CASE) else 0.0
        found.append(Deployment(name, case, top1(case), encoders, items if rewrites else 0, round(share * items), fit,
                                None if case == BASELINE else mean_flips(own, case)))
    backfilled = _backfilled(row, own, cases, items)
    if backfilled is not None:
        found.append(backfilled)
    return sorted(found, key=lambda d: COST_ORDER.index(d.case))


def _backfilled(row: AdapterSummary, own: list[dict[str, Any]], cases: list[dict[str, Any]],
                items: int) -> Deployment | None:
    """The gallery of ``row``'s backfilling curve at the share that reaches the target
    (:attr:`AdapterSummary.reembed_share`), read from the curve itself, the one estimate the recommendation reads
    too: a share of the images re-embedded, the others through F where the adapter has a forward map. At a share of
    0 the curve's stale end is a case of the study: B/F where the records hold it (both maps, F not into the new
    space: every stored vector rewritten, no image read, queries through B), a deployment of its own; any other
    case is listed already. None at a share of 1 (new/new) or without a share."""
    share = row.reembed_share
    if share is None or share == 1:
        return None
    if share == 0 and not all(c.get("B/F") for c in cases):
        return None
    curves = [r["retrieval"]["backfilling"] for r in own]
    at = curves[0]["betas"].index(share)
    value = float(np.mean([c["curves"][row.backfill_order]["top1"][at] for c in curves]))
    encoders = "new + B" if all(c.get("B/old") for c in cases) else "new"
    if share == 0:
        return Deployment("rewrite every stored vector through F, no image read, new queries through B", "B/F", value,
                          encoders, items, 0, row.fit_seconds, mean_flips(own, "B/F"))
    images = round(share * items)
    forward = all(c.get("F/F") for c in cases)
    return Deployment(f"re-embed {share:.0%} of the images ({row.backfill_order} order), the others "
                      f"{'through F' if forward else 'as stored'}", "backfilled", value, encoders,
                      items - images if forward else 0, images, row.fit_seconds)


def chosen_deployment(plan: list[Deployment], verdict: ModelsVerdict | None) -> str:
    """The deployment to run, by a cost rule, in one line (empty without a plan): keep the old model when the new
    model is not above it beyond noise (``verdict``); otherwise the cheapest of ``plan`` (listed cheapest first:
    nothing rewritten, stored vectors rewritten, a share of the images re-embedded, every image re-embedded) whose
    top-1 reaches :data:`BACKFILL_TARGET` of new/new's and lies above old/old's; re-embedding everything when none
    does. Cost ranks before accuracy: a cheaper deployment past the target wins over a better, dearer one."""
    cases = {d.case: d for d in plan}
    if not plan or "old/old" not in cases:
        return ""
    old = cases["old/old"]
    if verdict is not None and verdict.upgrade == "no":
        return f"{old.deployment} (old/old, top-1 {old.top1:.1f}): the new model is not better beyond noise"
    full = cases.get("new/new")
    if full is None:
        return ""
    target = BACKFILL_TARGET * full.top1
    chosen = next(d for d in plan if d.case == "new/new" or (d.case != "old/old" and reaches_target(d.top1, full.top1)
                                                                and d.top1 > old.top1))
    costs = (f"{chosen.query_encoders} per query, {chosen.vectors_rewritten} vectors rewritten, "
             f"{chosen.images_reembedded} images re-embedded")
    reach = f"{BACKFILL_TARGET:.0%} of new/new ({target:.1f}) above old/old ({old.top1:.1f})"
    why = f"no cheaper deployment reaches {reach}" if chosen.case == "new/new" else f"the cheapest that reaches {reach}"
    flips = "" if chosen.negative_flips is None else f", negative flips {chosen.negative_flips:.1f}%"
    return f"{chosen.deployment} ({chosen.case}, top-1 {chosen.top1:.1f}{flips}): {why}; it costs {costs}"


def recommended_deployment(rows: list[AdapterSummary], records: list[dict[str, Any]],
                           verdict: ModelsVerdict | None) -> str:
    """:func:`chosen_deployment` among the deployments of the recommended adapter (:func:`recommended`), or an
    empty line when no adapter is recommended."""
    chosen = recommended(rows)
    return chosen_deployment(deployments(chosen, records), verdict) if chosen is not None else ""


def deployments_text(rows: list[Deployment]) -> str:
    return tabulate([[d.deployment, d.case, f"{d.top1:.1f}", flips_cell(d.negative_flips), d.query_encoders,
                      d.vectors_rewritten, d.images_reembedded, f"{d.fit_seconds:.1f}"] for d in rows],
                    headers=("deployment", "case", "top-1", "negative flips %", "encoders per query",
                             "vectors rewritten", "images re-embedded", "fit s"), tablefmt="simple",
                    disable_numparse=True)
