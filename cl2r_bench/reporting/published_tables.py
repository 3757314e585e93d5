"""The papers' own figures (:mod:`cl2r_bench.reporting.published`) as tables beside a leaderboard's measured rows
(``leaderboard --published``, ``runner.py report``): each titled apart and shown only beside the scenarios whose
protocol they describe, never averaged in."""
from __future__ import annotations

from typing import Any

from benchmarks.metrics import all_metrics, as_matrix
from benchmarks.record import RunRecord

from .leaderboard import flip_rates
from .published import (
    BT2_README,
    BT2_SOURCE,
    IAMCL2R_31_TASKS,
    IAMCL2R_RELEASED,
    IAMCL2R_SOURCE,
    LAMBDA_ORTH_SOURCE,
    LAMBDA_ORTH_TABLE_1A,
    LAMBDA_ORTH_TABLE_1B,
    LAMBDA_ORTH_TABLE_2,
    ML_FCT_README,
    ML_FCT_SOURCE,
)
from .tables import Column, Kind, Table

PUBLISHED_MAIN_COLUMNS = (Column("scenario", "scenario", Kind.TEXT), Column("setting", "setting", Kind.TEXT),
                          Column("strategy", "strategy", Kind.TEXT), Column("AC", "AC", digits=3),
                          Column("AA (%)", "AA"), Column("ACA (%)", "ACA"), Column("NFR self (%)", "NFR_self"),
                          Column("NFR cross (%)", "NFR_cross"), Column("source", "source", Kind.TEXT))
PUBLISHED_CASE_COLUMNS = (Column("setting", "setting", Kind.TEXT), Column("adapter", "adapter", Kind.TEXT),
                          Column("case", "case", Kind.TEXT), Column("top-1 (%)", "top1"), Column("top-5 (%)", "top5"),
                          Column("mAP (%)", "mAP"), Column("source", "source", Kind.TEXT))
PUBLISHED_TWO_MODEL_COLUMNS = (Column("setting", "setting", Kind.TEXT), Column("strategy", "strategy", Kind.TEXT),
                               *PUBLISHED_CASE_COLUMNS[2:])
PUBLISHED_TITLE = "published (the papers' own runs, models and data: not measured by the suite, never averaged in)"


def published_main_rows(scenarios: set[str]) -> list[list[Any]]:
    """The IAM-CL2R authors' released figures (:mod:`cl2r_bench.reporting.published`) when ``scenarios`` holds
    ``iamcl2r``:
    AC / AA / ACA of the 7-task matrices, computed by the suite's metrics, and the 31-task AC and AA they report;
    the negative flip rates in percent where a set of figures gives them (its optional ``negative_flips``)."""
    if "iamcl2r" not in scenarios:
        return []
    rows = []
    for strategy, matrix in IAMCL2R_RELEASED["matrices"].items():
        m = all_metrics(as_matrix(matrix))
        rows.append(["iamcl2r", IAMCL2R_RELEASED["setting"], strategy, m["AC"], m["AA"], m["ACA"],
                     *_published_flips(IAMCL2R_RELEASED, strategy), IAMCL2R_SOURCE])
    for strategy, m in IAMCL2R_31_TASKS["metrics"].items():
        rows.append(["iamcl2r", IAMCL2R_31_TASKS["setting"], strategy, m["AC"], m["AA"], None,
                     *_published_flips(IAMCL2R_31_TASKS, strategy), IAMCL2R_SOURCE])
    return rows


def _published_flips(figures: dict[str, Any], strategy: str) -> list[float | None]:
    """NFR self and NFR cross in percent of ``strategy`` in a set of published figures, None where it gives none."""
    return list(flip_rates(figures.get("negative_flips", {}).get(strategy)).values())


def published_case_rows(scenarios: set[str]) -> list[list[Any]]:
    """The adapter papers' retrieval cases (:mod:`cl2r_bench.reporting.published`: λ-orth's Tables 1a, 1b and 2,
    ml-fct's
    README) when ``scenarios`` holds ``model_update``, the papers' protocol on image encoders; not beside ``adapt``,
    a study of the user's own embeddings, whose numbers they do not describe. The backfilling AUC is the case
    ``backfill AUC``, the zero-shot change ``ZS``."""
    if "model_update" not in scenarios:
        return []
    rows = []
    for table in (LAMBDA_ORTH_TABLE_1A, LAMBDA_ORTH_TABLE_1B):
        for adapter, cases in table["rows"].items():
            for case, (top1, average_precision) in cases.items():
                rows.append([table["setting"], adapter, "backfill AUC" if case == "auc" else case, top1, None,
                             average_precision, LAMBDA_ORTH_SOURCE])
    for adapter, cases in LAMBDA_ORTH_TABLE_2["rows"].items():
        for case, top1 in cases.items():
            shown = f"{top1:+.3f} (change)" if case == "ZS" else top1  # the zero-shot change, in points
            rows.append([LAMBDA_ORTH_TABLE_2["setting"], adapter, case, shown, None, None, LAMBDA_ORTH_SOURCE])
    for setting, adapters in ML_FCT_README.items():
        for adapter, cases in adapters.items():
            for case, (top1, top5, average_precision) in cases.items():
                rows.append([setting, adapter, case, top1, top5, average_precision, ML_FCT_SOURCE])
    return rows


def published_two_model_rows(scenarios: set[str]) -> list[list[Any]]:
    """The two-model figures published for the setting of ``upgrade`` when ``scenarios`` holds it: the BT² authors'
    (:data:`cl2r_bench.reporting.published.BT2_README`) and ml-fct's independent models on CIFAR-100 (its ``none``
    rows, the
    suite's ``er`` there)."""
    if "upgrade" not in scenarios:
        return []
    setting = next(name for name in ML_FCT_README if name.startswith("CIFAR-100"))
    independent = [[setting, "er", case, *values, ML_FCT_SOURCE]
                   for case, values in ML_FCT_README[setting]["none"].items()]
    return [[BT2_README["setting"], strategy, case, *values, BT2_SOURCE]
            for strategy, cases in BT2_README["rows"].items() for case, values in cases.items()] + independent


def published_tables(records: list[RunRecord]) -> list[Table]:
    """The published figures of the scenarios ``records`` hold, each table apart from the measured ones."""
    scenarios = {r["scenario"] for r in records}
    tables = [Table(PUBLISHED_MAIN_COLUMNS, published_main_rows(scenarios), PUBLISHED_TITLE),
              Table(PUBLISHED_CASE_COLUMNS, published_case_rows(scenarios), PUBLISHED_TITLE),
              Table(PUBLISHED_TWO_MODEL_COLUMNS, published_two_model_rows(scenarios), PUBLISHED_TITLE)]
    return [t for t in tables if t.rows]
