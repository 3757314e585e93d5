"""An adapter study's answer as a person and a program read it (``runner.py adapt``): the summary table
(:mod:`cl2r_bench.reporting.adapter_recommendation`), the lines on the models, the classes, a sampled query set and
the queries without a match, the deployments with their costs (:mod:`cl2r_bench.reporting.deployments`) and the
recommendation; as text (:func:`summary_text`) or JSON (:func:`summary_json`)."""
from __future__ import annotations

from typing import Any

from tabulate import tabulate

from .adapter_recommendation import (
    SUMMARY_COLUMNS,
    models_line,
    models_verdict,
    recommendation,
    recommended,
    summarise,
    summary_cells,
)
from .deployments import deployments, deployments_text, recommended_deployment


def unmatched(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """``{"count", "queries", "convention"}``: the study's queries without another item of their class in the
    gallery and how CMC counted them; None for records before the count."""
    retrieval = records[0]["retrieval"]
    count = retrieval.get("queries_without_match")
    if count is None:
        return None
    return {"count": count, "queries": retrieval["queries"],
            "convention": retrieval.get("unmatched_queries", "miss")}


def unmatched_line(records: list[dict[str, Any]]) -> str:
    """One line on the queries without a match, when there are any: how many, and how the CMC figures count them."""
    found = unmatched(records)
    if not found or not found["count"]:
        return ""
    how = ("counted as misses in top-1 / top-5 (--set model_update.unmatched_queries=exclude leaves them out, as "
           "the FCT authors' evaluation does)" if found["convention"] == "miss" else
           "left out of top-1 / top-5 (model_update.unmatched_queries=exclude)")
    return (f"{found['count']} of {found['queries']} queries have no other item of their class: {how}; the mAP "
            "leaves them out")


def classes_line(records: list[dict[str, Any]]) -> str:
    """One line on whether the adapters were fitted on the classes they are scored on (``models.test_classes`` and
    ``test_classes_fitted``, written by ``runner.py adapt``; nothing for records without them)."""
    about = records[0].get("models") or {}
    total, fitted = about.get("test_classes"), about.get("test_classes_fitted")
    if total is None or fitted is None:
        return ""
    if fitted == 0:
        return (f"open set: none of the {total} test classes is among the fitting classes, so the figures hold for "
                "classes the adapters never saw")
    share = "all" if fitted == total else f"{fitted} of"
    return (f"closed set: {share} the {total} test classes are among the fitting classes, so the figures hold for "
            "classes the adapters were fitted on; to measure classes they never saw, give --test classes absent "
            "from --train (docs/METHODS.md §7b)")


def sampled_line(records: list[dict[str, Any]]) -> str:
    """One line when the study ranked a sample of its queries: how many, and where the sampling noise is."""
    sample = records[0]["retrieval"].get("sampled_queries")
    if not sample:
        return ""
    return (f"a seeded sample of {sample['count']} of {sample['of']} queries ranked the whole gallery; each case's "
            "95% sampling interval is in the records (retrieval.sampling_interval), and the compatible column's "
            "interval is over these queries")


def summary_text(records: list[dict[str, Any]]) -> str:
    """The study's answer for a terminal: the table of :func:`summarise`, the queries without a match, and the line
    of :func:`recommendation`."""
    rows, verdict = summarise(records), models_verdict(records)
    table = tabulate([summary_cells(r) for r in rows], headers=SUMMARY_COLUMNS, tablefmt="simple",
                     disable_numparse=True)
    notes = [line for line in (models_line(verdict), classes_line(records), sampled_line(records),
                               unmatched_line(records)) if line]
    chosen = recommended(rows)
    plan = deployments(chosen, records) if chosen is not None else []
    listed = [f"deployments with {chosen.adapter}, and what each costs:", deployments_text(plan), ""] if plan else []
    choice = recommended_deployment(rows, records, verdict)
    return "\n".join([table, "", *notes, *listed, *([f"deployment: {choice}"] if choice else []),
                      f"recommendation: {recommendation(rows, verdict)}"])


def summary_json(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The same answer as JSON: ``{"summary": [row, ...], "models": {...} | null, "deployments": {adapter: [...]},
    "deployment": line | null, "classes": line | null, "unmatched_queries": {...} | null, "recommendation": line}``
    (``models``: :class:`ModelsVerdict`; ``deployments``: :func:`deployments`; ``deployment``:
    :func:`chosen_deployment` for the recommended adapter; ``classes``: :func:`classes_line`)."""
    rows, verdict = summarise(records), models_verdict(records)
    return {"summary": [r.as_dict() for r in rows], "models": verdict.as_dict() if verdict else None,
            "deployments": {r.adapter: [d.as_dict() for d in deployments(r, records)] for r in rows},
            "deployment": recommended_deployment(rows, records, verdict) or None,
            "classes": classes_line(records) or None, "unmatched_queries": unmatched(records),
            "recommendation": recommendation(rows, verdict)}
