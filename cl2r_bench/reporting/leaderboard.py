r"""Leaderboards from result files: one row per experiment
(:func:`cl2r_bench.reporting.experiments.experiment_groups`: a
scenario, data set and strategy or adapter with every setting that changes the protocol; experiments that measured
the same, seed for seed, are one row naming each: :func:`cl2r_bench.reporting.experiments.result_groups`), mean ± std
over seeds;
the std is the sample standard deviation (ddof = 1). Rows come from every complete and well-formed ``metrics.json``
under a results folder (:func:`cl2r_bench.reporting.experiments.collect`), read as
:class:`benchmarks.record.RunRecord` (the
record's fields and units).

The tables (:data:`TABLES`, built by :func:`build`): ``main`` (AC, AA, ACA, the mean negative flip rates NFR self and
NFR cross in percent, seeds), ``intervals`` (each of those figures' 95% t-interval over seeds, and upgrade's new/old
top-1's), ``noise`` (the noise-aware AC), ``replacements`` (the replacement models' own accuracies),
``retrieval`` and ``backfilling`` (every adapter study, leave-one-out or a ``model_update`` run along a stream: each
case's top-1 and mAP, each order's AUC, the zero-shot change and the adapters' declared diagnostics such as
λ-orthogonal's f(W)), ``two_model`` (the BCT line's protocol), ``timing`` (ms per training iteration), ``across``
(AC and ACA across replacements), ``margins`` (why pairs fail: each pair's margin split into the query model's own
gain and its cross gap, within segments and across replacements), ``terms`` (each loss term's weight and where it
never acted: :mod:`cl2r_bench.reporting.loss_terms`) and ``matrices`` (the mean compatibility
matrices; in csv, long rows ``scenario, dataset, strategy, t, k, mean, std, seeds``, tasks 0-based, percent).
:func:`cl2r_bench.reporting.tables.render` writes them in github, latex or csv.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from benchmarks.metrics import across_replacements, as_matrix, margin_parts
from benchmarks.noise import CONFIDENCE, t_interval
from benchmarks.record import (
    PAPER_CASES,
    ReplacementModel,
    RunRecord,
    adapter_diagnostics,
    adapter_study,
    leave_one_out,
    update_fit,
)

from .experiments import experiment_groups, models_label, result_groups, short_model_name
from .loss_terms import TERM_COLUMNS, term_rows
from .tables import Column, Kind, Table, render, without_empty_columns

TABLES = ("main", "intervals", "noise", "replacements", "retrieval", "backfilling", "two_model", "timing", "across",
          "margins", "terms", "matrices")
SUMMARY = TABLES[:7]
COLUMNS = ("AC", "AA", "ACA")


IDENTITY = (Column("scenario", "scenario", Kind.TEXT), Column("dataset", "dataset", Kind.TEXT),
            Column("strategy", "strategy", Kind.TEXT))
SEEDS = Column("seeds", "seeds", Kind.INTEGER)
FLIP_COLUMNS = ("NFR_self", "NFR_cross")
MAIN_COLUMNS = (*IDENTITY, Column("AC", "AC", Kind.SPREAD, 3), Column("AA (%)", "AA", Kind.SPREAD),
                Column("ACA (%)", "ACA", Kind.SPREAD), Column("NFR self (%)", "NFR_self", Kind.SPREAD),
                Column("NFR cross (%)", "NFR_cross", Kind.SPREAD),
                Column("starting models: family, own top-1 (%)", "starting_models", Kind.TEXT), SEEDS)
INTERVAL_FIGURES = (("AC", "AC", 3), ("AA (%)", "AA", 2), ("ACA (%)", "ACA", 2), ("NFR self (%)", "NFR_self", 2),
                    ("NFR cross (%)", "NFR_cross", 2), ("new/old top-1 (%)", "new_old_top1", 2))
INTERVAL_COLUMNS = (*IDENTITY, *(Column(f"{title} 95% CI", name, Kind.INTERVAL, digits)
                                 for title, name, digits in INTERVAL_FIGURES), SEEDS)
"""The t-interval over seeds of each figure of the main table and, in ``upgrade``, of the new/old top-1."""
NOISE_COLUMNS = (*IDENTITY, Column("AC", "AC", digits=3),
                 Column("AC 95% interval", "AC_interval", Kind.INTERVAL, 3),
                 Column("AC outside noise", "AC_outside_noise", digits=3), Column("AC upper", "AC_upper", digits=3),
                 Column("pairs within noise", "pairs_within_noise", Kind.INTEGER, 1),
                 Column("across: AC outside noise", "across_AC_outside_noise", digits=3),
                 Column("across: AC upper", "across_AC_upper", digits=3),
                 Column("across: within noise", "across_pairs_within_noise", Kind.INTEGER, 1),
                 Column("queries", "queries", Kind.INTEGER), SEEDS)
REPLACEMENT_COLUMNS = (*IDENTITY, Column("replacement task", "replacement_task", Kind.INTEGER),
                       Column("classes", "classes", Kind.INTEGER), Column("own accuracy (%)", "own_accuracy"),
                       Column("95% interval", "own_accuracy_interval", Kind.INTERVAL), SEEDS)
LOO_IDENTITY = (Column("scenario", "scenario", Kind.TEXT), Column("dataset", "dataset", Kind.TEXT),
                Column("models", "models", Kind.TEXT), Column("adapter", "adapter", Kind.TEXT))
RETRIEVAL_COLUMNS = (*LOO_IDENTITY, *(Column(f"{case} {score}", f"{case}_{score}", Kind.SPREAD)
                                      for case in PAPER_CASES for score in ("top-1", "mAP")),
                     Column("queries without a match", "unmatched_queries", Kind.SPREAD, 0), SEEDS)
AUC_SCORES = (("top-1", "top1_auc"), ("mAP", "mAP_auc"))
"""Each backfilling order's two columns: their titles and the record's keys."""
TIMING_COLUMNS = (*IDENTITY, Column("train ms / iteration", "train_ms_per_iteration", digits=1),
                  Column("ratio to baseline", "ratio_to_baseline"), SEEDS)
ACROSS_COLUMNS = (*IDENTITY, Column("AC across replacements", "AC_across", Kind.SPREAD, 3),
                  Column("ACA across (%)", "ACA_across", Kind.SPREAD), Column("pairs", "pairs", Kind.INTEGER), SEEDS)
PAIR_GROUP_TITLES = {"within": "within segments", "across": "across replacements"}
MARGIN_TITLES = {"margin": "margin", "own_gain": "own gain", "cross_gap": "cross gap"}
"""The titles of :func:`benchmarks.metrics.margin_parts`' pair groups and parts."""
MARGIN_COLUMNS = (*IDENTITY, Column("pair group", "pair_group", Kind.TEXT),
                  *(column for part, title in MARGIN_TITLES.items()
                    for column in (Column(f"{title} (points)", part),
                                   Column(f"{title} 95% CI", f"{part}_interval", Kind.INTERVAL))),
                  Column("pairs", "pairs", Kind.INTEGER), SEEDS)
TWO_MODEL_CASES = (("old/old", ("top1",)), ("new/old", ("top1", "top5", "mAP")), ("new/new", ("top1", "top5", "mAP")))
SCORE_TITLES = {"top1": "top-1", "top5": "top-5", "mAP": "mAP"}
TWO_MODEL_COLUMNS = (*IDENTITY, *(Column(f"{case} {SCORE_TITLES[score]}", f"{case}_{score}", Kind.SPREAD)
                                  for case, scores in TWO_MODEL_CASES for score in scores),
                     Column("NFR self (%)", "NFR_self", Kind.SPREAD), Column("NFR cross (%)", "NFR_cross", Kind.SPREAD),
                     Column("classifier NFR (%)", "NFR_classifier", Kind.SPREAD), SEEDS)
MATRIX_ROW_COLUMNS = (*IDENTITY, Column("query task", "t", Kind.INTEGER),
                      Column("gallery task", "k", Kind.INTEGER),
                      Column("mean (%)", "mean", digits=1), Column("std", "std", digits=1), SEEDS)

RunMatrices = list[tuple[RunRecord, np.ndarray]]


def _spread(values: list[float]) -> tuple[float, float | None] | None:
    """``(mean, sample std)`` of ``values``, or None when there is none. One value, or values that are all the same
    (a case no seed changes, such as old/old), has no spread: its std is None, shown as no "±" and an empty csv
    cell, never as a std of 0."""
    if not values:
        return None
    return float(np.mean(values)), float(np.std(values, ddof=1)) if len(set(values)) > 1 else None


def flip_rates(flips: dict[str, Any] | None) -> dict[str, float | None]:
    """``NFR_self`` and ``NFR_cross`` in percent from a ``negative_flips`` object's means
    (:class:`benchmarks.record.NegativeFlips`), None where it lacks them (a record without it, one task)."""
    return {column: None if not flips or flips.get(f"mean_{kind}") is None else 100 * flips[f"mean_{kind}"]
            for column, kind in zip(FLIP_COLUMNS, ("self", "cross"), strict=True)}


def leaderboard_rows(records: list[RunRecord]) -> list[list[Any]]:
    """Rows ``[scenario, dataset, strategy, AC, AA, ACA, NFR self, NFR cross, starting models, seeds]``
    (:data:`MAIN_COLUMNS`; the metrics as ``(mean, std)`` over the seeds that have them, the negative flip rates in
    percent, :func:`starting_models`) sorted by scenario, dataset, AC then AA."""
    rows = []
    for (scenario, dataset, strategy), runs in result_groups(records).items():
        values = {c: [r["metrics"][c] for r in runs if r["metrics"].get(c) is not None] for c in COLUMNS}
        rates = [flip_rates(r.get("negative_flips")) for r in runs]
        flips = {c: [rate[c] for rate in rates if rate[c] is not None] for c in FLIP_COLUMNS}
        rows.append([scenario, dataset, strategy, *(_spread(values[c]) for c in COLUMNS),
                     *(_spread(flips[c]) for c in FLIP_COLUMNS), starting_models(runs), len(runs)])
    return sorted(rows, key=lambda r: (r[0], r[1], -r[3][0], -r[4][0]))


def starting_models(runs: list[RunRecord]) -> str | None:
    """The models an experiment's tasks start from, in one cell: their head family and each one's own retrieval top-1
    (mean over seeds, percent), by task, with the frozen encoder each reads on the pretrained-backbone track
    (``learnable: Lite0 38.1 / Lite1 44.0 / Lite2 51.3``): two rows whose strategies were given other replacement
    models say so here. None without starting models (CL2R)."""
    scored: dict[int, list[ReplacementModel]] = defaultdict(list)
    for run in runs:
        for model in run.get("replacement_models", []):
            scored[model["task"]].append(model)
    if not scored:
        return None
    families = sorted({m["family"] for models in scored.values() for m in models if "family" in m})
    cells = []
    for _, models in sorted(scored.items()):
        encoder = models[0].get("encoder")
        accuracy = [m["own_accuracy"] for m in models if "own_accuracy" in m]
        cells.append(" ".join(filter(None, [short_model_name(encoder) if encoder else None,
                                            f"{100 * float(np.mean(accuracy)):.1f}" if accuracy else "-"])))
    return (f"{'/'.join(families)}: " if families else "") + " / ".join(cells)


def interval_rows(records: list[RunRecord], confidence: float = CONFIDENCE) -> list[list[Any]]:
    """Rows of :data:`INTERVAL_COLUMNS`: for each experiment of :func:`leaderboard_rows`, each figure's t-interval
    over its seeds (:func:`benchmarks.noise.t_interval`: mean ± t · sd / sqrt(n), n - 1 degrees of freedom; None
    with one seed or no spread; clipped to the figure's range, AC 0-1, the rest 0-100 %; an experiment with no
    interval at all has no row), in the main table's order. Beside the noise table's query resampling, it is the
    interval a reader cites; ``runner.py compare`` tests two experiments against each other."""
    rows = []
    for (scenario, dataset, strategy), runs in result_groups(records).items():
        figures = {c: [r["metrics"][c] for r in runs if r["metrics"].get(c) is not None] for c in COLUMNS}
        rates = [flip_rates(r.get("negative_flips")) for r in runs]
        figures.update({c: [rate[c] for rate in rates if rate[c] is not None] for c in FLIP_COLUMNS})
        figures["new_old_top1"] = [r["two_model"]["cases"]["new/old"]["top1"] for r in runs
                                   if (r.get("two_model") or {}).get("cases", {}).get("new/old")]
        intervals = [t_interval(figures[name], confidence, (0.0, 1.0 if name == "AC" else 100.0))
                     for _, name, _ in INTERVAL_FIGURES]
        if any(intervals):
            rows.append([scenario, dataset, strategy, *intervals, len(runs)])
    order = {tuple(row[:3]): i for i, row in enumerate(leaderboard_rows(records))}
    return sorted(rows, key=lambda row: order.get(tuple(row[:3]), len(order)))


def noise_rows(records: list[RunRecord]) -> list[list[Any]]:
    """Rows of the noise-aware AC (``benchmarks/noise.py``; :data:`NOISE_COLUMNS`) for the runs that carry a
    ``noise`` object: AC, its interval over query resamples, the shares of pairs compatible beyond noise (lower
    bound) and not incompatible beyond noise (upper bound), the number of pairs within noise, the same across
    replacements; means over seeds (interval bounds averaged bound by bound)."""
    rows = []
    for (scenario, dataset, strategy), runs in result_groups(records).items():
        noisy = [r for r in runs if r.get("noise")]
        if not noisy:
            continue
        def mean(get, noisy=noisy) -> float | None:
            values = [v for v in map(get, noisy) if v is not None]
            return float(np.mean(values)) if values else None

        rows.append([scenario, dataset, strategy, mean(lambda r: r["metrics"]["AC"]),
                     tuple(mean(lambda r, i=i: r["noise"]["AC_interval"][i]) for i in (0, 1)),
                     mean(lambda r: r["noise"]["AC_outside_noise"]), mean(lambda r: r["noise"]["AC_upper"]),
                     mean(lambda r: r["noise"]["within_noise"]),
                     mean(lambda r: r["noise"]["across"]["AC_outside_noise"]),
                     mean(lambda r: r["noise"]["across"]["AC_upper"]),
                     mean(lambda r: r["noise"]["across"]["within_noise"]), noisy[0]["noise"]["queries"], len(noisy)])
    return rows


def replacement_rows(records: list[RunRecord]) -> list[list[Any]]:
    """Each replacement model's own retrieval accuracy on the evaluation set (percent, mean over seeds, with the
    mean Wilson interval; :data:`REPLACEMENT_COLUMNS`), for the runs that measured it. Experiments whose rows agree
    in every figure (they started from the same replacement models, as a strategy's teacher arms do) share one set
    of rows, their names joined by commas."""
    shared: dict[tuple, list[str]] = defaultdict(list)
    for (scenario, dataset, strategy), rows in _replacement_rows_by_experiment(records).items():
        shared[(scenario, dataset, tuple(tuple(row) for row in rows))].append(strategy)
    return [[scenario, dataset, ", ".join(strategies), *row]
            for (scenario, dataset, rows), strategies in shared.items() for row in rows]


def _replacement_rows_by_experiment(records: list[RunRecord]) -> dict[tuple[str, str, str], list[list[Any]]]:
    """:func:`replacement_rows`' rows of each experiment, without its scenario, data set and name."""
    out = {}
    for (scenario, dataset, strategy), runs in result_groups(records).items():
        scored: dict[tuple[int, Any], list[ReplacementModel]] = defaultdict(list)
        for r in runs:
            for rep in r.get("replacement_models", []):
                if "own_accuracy" in rep:
                    scored[(rep["task"], rep.get("classes"))].append(rep)
        for (task, classes), reps in sorted(scored.items(), key=lambda item: (item[0][0], item[0][1] is None,
                                                                             item[0][1] or 0)):
            interval = tuple(100 * float(np.mean([rep["own_accuracy_interval"][i] for rep in reps])) for i in (0, 1))
            out.setdefault((scenario, dataset, strategy), []).append(
                [task, classes, 100 * float(np.mean([rep["own_accuracy"] for rep in reps])), interval, len(reps)])
    return out


def seconds_per_iteration(record: RunRecord) -> float | None:
    """Median over the run's tasks of training seconds per iteration (robust to one task slowed by another
    process), or None when it recorded no iteration."""
    tasks = [t for t in record.get("timings", {}).get("tasks", []) if t["iterations"]]
    return float(np.median([t["seconds"] / t["iterations"] for t in tasks])) if tasks else None


def timing_rows(records: list[RunRecord], baseline: str) -> list[list[Any]]:
    """Rows ``[scenario, dataset, strategy, ms/iteration, ratio, seeds]`` (:data:`TIMING_COLUMNS`): the median
    over seeds of each run's :func:`seconds_per_iteration`, and its ratio to ``baseline``'s in the same scenario
    and data set (None without it). Iteration times include the teacher's forward pass and the strategy's loss."""
    groups = {key: [v for v in map(seconds_per_iteration, runs) if v is not None]
              for key, runs in experiment_groups(records).items()}
    medians = {key: float(np.median(values)) for key, values in groups.items() if values}
    rows = []
    for (scenario, dataset, strategy), median in medians.items():
        tag = strategy[strategy.index(" ["):] if " [" in strategy else ""
        base = medians.get((scenario, dataset, baseline + tag), medians.get((scenario, dataset, baseline)))
        rows.append([scenario, dataset, strategy, 1000 * median, median / base if base else None,
                     len(groups[(scenario, dataset, strategy)])])
    return rows


def _matrix_groups(records: list[RunRecord]) -> dict[tuple[str, str, str], RunMatrices]:
    """The runs of each :func:`experiment_groups` group that carry a compatibility matrix, each with its matrix; a group
    whose matrices differ in size (runs without a config to tell them apart) is split, labels tagged with it."""
    out = {}
    for (scenario, dataset, label), runs in result_groups(records).items():
        by_size: dict[int, RunMatrices] = defaultdict(list)
        for r in runs:
            if "compatibility_matrix" in r:
                matrix = as_matrix(r["compatibility_matrix"])
                by_size[len(matrix)].append((r, matrix))
        for size, sized in sorted(by_size.items()):
            out[(scenario, dataset, label + (f" [{size} tasks]" if len(by_size) > 1 else ""))] = sized
    return out


def across_rows(records: list[RunRecord], tie_rule: str = "strict") -> list[list[Any]]:
    """Rows ``[scenario, dataset, strategy, AC across, ACA across, pairs, seeds]`` (:data:`ACROSS_COLUMNS`): AC
    and ACA over the pairs separated by a replacement (:func:`benchmarks.metrics.across_replacements`),
    ``(mean, std)`` over seeds."""
    rows = []
    for (scenario, dataset, strategy), runs in _matrix_groups(records).items():
        values = [across_replacements(matrix, r.get("replacement_tasks", []), tie_rule) for r, matrix in runs]
        if not values[0]["pairs_across"]:
            continue
        rows.append([scenario, dataset, strategy, _spread([v["AC_across"] for v in values]),
                     _spread([v["ACA_across"] for v in values]), values[0]["pairs_across"], len(runs)])
    return rows


def margin_rows(records: list[RunRecord], confidence: float = CONFIDENCE) -> list[list[Any]]:
    """Rows of :data:`MARGIN_COLUMNS`, two per experiment with a matrix (within segments, then across replacements,
    each where its runs have pairs): the mean over seeds of each run's mean margin, own gain and cross gap
    (:func:`benchmarks.metrics.margin_parts`, percent points), each beside its t-interval over seeds as in
    :func:`interval_rows` (clipped to -100 to 100), and the pairs per run. Means of means, so margin = own gain -
    cross gap in every row; the intervals, each figure's own, need not add up."""
    rows = []
    for (scenario, dataset, strategy), runs in _matrix_groups(records).items():
        parts = [margin_parts(matrix, r.get("replacement_tasks", [])) for r, matrix in runs]
        for group, title in PAIR_GROUP_TITLES.items():
            measured = [p[group] for p in parts if p[group]["pairs"]]
            if not measured:
                continue
            figures = [[m[part] for m in measured] for part in MARGIN_TITLES]
            cells = [cell for values in figures
                     for cell in (float(np.mean(values)), t_interval(values, confidence, (-100.0, 100.0)))]
            rows.append([scenario, dataset, strategy, title, *cells, measured[0]["pairs"], len(measured)])
    return rows


def mean_matrices(records: list[RunRecord]) -> list[Table]:
    """Per (scenario, dataset, strategy), the compatibility matrix averaged over seeds, in percent, as a grid
    titled with the experiment: query task t by gallery task k <= t, ``(mean, std)`` (std only when there are
    several seeds), replacement tasks marked with ``*``."""
    grids = []
    for (scenario, dataset, strategy), (mean, std, replaced, seeds) in _mean_matrices(records).items():
        labels = [f"{t}{'*' if t in replaced else ''}" for t in range(len(mean))]
        columns = (Column("query \\ gallery", "t", Kind.TEXT),
                   *(Column(label, label, Kind.SPREAD, 1) for label in labels))
        rows = [[labels[t], *((mean[t, k], _entry_std(std, t, k)) if k <= t else "" for k in range(len(mean)))]
                for t in range(len(mean))]
        grids.append(Table(columns, rows, f"{scenario} / {dataset} / {strategy} ({seeds} seed{'s' * (seeds > 1)})"))
    return grids


def _entry_std(std: np.ndarray | None, t: int, k: int) -> float | None:
    """An entry's std over seeds, None with one seed or when no seed changed it (as :func:`_spread`)."""
    return None if std is None or std[t, k] == 0 else float(std[t, k])


def matrix_rows(records: list[RunRecord]) -> list[list[Any]]:
    """The mean matrices of :func:`mean_matrices` as rows ``[scenario, dataset, strategy, t, k, mean, std,
    seeds]`` (:data:`MATRIX_ROW_COLUMNS`), one per pair k <= t, tasks 0-based, percent (std None for one seed):
    the long form that a csv file and a plotting script take."""
    return [[scenario, dataset, strategy, t, k, float(mean[t, k]), _entry_std(std, t, k), seeds]
            for (scenario, dataset, strategy), (mean, std, _, seeds) in _mean_matrices(records).items()
            for t in range(len(mean)) for k in range(t + 1)]


def _mean_matrices(records: list[RunRecord]) -> dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray | None,
                                                                                     set[int], int]]:
    """Per experiment: the mean matrix in percent, its sample std (None for one seed), the replacement tasks and
    the number of seeds."""
    out = {}
    for key, runs in _matrix_groups(records).items():
        stack = np.stack([matrix for _, matrix in runs]) * 100
        out[key] = (stack.mean(axis=0), stack.std(axis=0, ddof=1) if len(runs) > 1 else None,
                    set(runs[0][0].get("replacement_tasks", [])), len(runs))
    return out


def retrieval_rows(records: list[RunRecord], values: Callable[[RunRecord], list[float | None]]) -> list[list[Any]]:
    """One row per adapter study (leave-one-out or along a stream): its identity, then ``(mean, std)`` over seeds of
    each of ``values``."""
    rows = []
    for (scenario, dataset, method), runs in experiment_groups([r for r in records if adapter_study(r)]).items():
        columns = list(zip(*map(values, runs), strict=True))
        rows.append([scenario, dataset, models_label(runs[0]), method,
                     *(_spread([v for v in column if v is not None]) for column in columns), len(runs)])
    return rows


def case_values(record: RunRecord) -> list[float | None]:
    """Each case's top-1 and mAP (percent) and the queries without another item of their class, counted in CMC as
    the record's ``unmatched_queries`` convention says (:data:`RETRIEVAL_COLUMNS`; None in records before it)."""
    cases = record["retrieval"]["cases"]
    return [None if cases.get(case) is None else cases[case][key] for case in PAPER_CASES
            for key in ("top1", "mAP")] + [record["retrieval"].get("queries_without_match")]


def backfilling_values(record: RunRecord, orders: list[str]) -> list[float | None]:
    """Each of ``orders``' top-1 and mAP AUC (percent), then the zero-shot change (:func:`backfilling_table`)."""
    auc, zero_shot = record["retrieval"]["backfilling"]["auc"], record["retrieval"].get("zero_shot")
    return [None if auc.get(order) is None else auc[order].get(key) for order in orders
            for _, key in AUC_SCORES] + [zero_shot["change"] if zero_shot else None]


def backfilling_table(records: list[RunRecord]) -> Table:
    """The study's identity, each backfilling order's top-1 and mAP AUC, the zero-shot change, then one column per
    diagnostic the records' adapters declare (their fit logs' last values, e.g. λ-orthogonal's f(W);
    :func:`benchmarks.record.adapter_diagnostics`). The orders and the diagnostics are those the records hold, in
    the order first met, so a plug-in's order (:mod:`benchmarks.backfill_orders`) gets its columns too."""
    orders: dict[str, None] = {}
    declared: dict[str, str] = {}
    for record in filter(adapter_study, records):
        orders.update(dict.fromkeys(record["retrieval"]["backfilling"]["auc"]))
        for key, title in adapter_diagnostics(record).items():
            declared.setdefault(key, title)
    columns = (*LOO_IDENTITY, *(Column(f"AUC {order} {title}", f"auc_{order}_{title}", Kind.SPREAD)
                                for order in orders for title, _ in AUC_SCORES),
               Column("ZS change (points)", "zero_shot_change", Kind.SPREAD),
               *(Column(title, key, Kind.SPREAD) for key, title in declared.items()), SEEDS)
    return Table(columns, retrieval_rows(records, lambda record: backfilling_values(record, list(orders)) + [
        update_fit(record).get(key) for key in declared]))


def two_model_rows(records: list[RunRecord]) -> list[list[Any]]:
    """One row per ``upgrade`` experiment (:data:`TWO_MODEL_COLUMNS`): the two-model protocol's cases, its retrieval
    negative flip rates and its classifiers' in percent, ``(mean, std)`` over seeds, sorted by scenario, dataset, then
    new/old top-1."""
    rows = []
    for (scenario, dataset, strategy), runs in result_groups([r for r in records if "two_model" in r]).items():
        cases = [r["two_model"]["cases"] for r in runs]
        scores = [_spread([c[case][score] for c in cases if c.get(case)]) for case, names in TWO_MODEL_CASES
                  for score in names]
        rates = [flip_rates(r["two_model"].get("negative_flips")) for r in runs]
        flips = [_spread([rate[c] for rate in rates if rate[c] is not None]) for c in FLIP_COLUMNS]
        classifier = _spread([100 * r["two_model"]["classification"]["nfr"] for r in runs
                              if "classification" in r["two_model"]])
        rows.append([scenario, dataset, strategy, *scores, *flips, classifier, len(runs)])
    return sorted(rows, key=lambda r: (r[0], r[1], -(r[4] or (0.0,))[0]))


def build(records: list[RunRecord], fmt: str = "github", names: Iterable[str] = TABLES,
          baseline: str = "er") -> dict[str, list[Table]]:
    """The tables of :data:`TABLES` among ``names`` that have rows for ``records``, in that order: one table
    each, except ``matrices``, one grid per experiment in github and latex but one long table (:func:`matrix_rows`)
    in csv. ``baseline`` is the strategy the timing table compares with. The papers' figures are apart, in
    :func:`cl2r_bench.reporting.published_tables.published_tables`."""
    every = records
    records = [r for r in every if not leave_one_out(r)]
    builders: dict[str, Callable[[], list[Table]]] = {
        "retrieval": lambda: [Table(RETRIEVAL_COLUMNS, retrieval_rows(every, case_values))],
        "backfilling": lambda: [backfilling_table(every)],
        "two_model": lambda: [Table(TWO_MODEL_COLUMNS, two_model_rows(records))],
        "main": lambda: [Table(MAIN_COLUMNS, leaderboard_rows(records))],
        "intervals": lambda: [without_empty_columns(Table(INTERVAL_COLUMNS, interval_rows(records)))],
        "noise": lambda: [Table(NOISE_COLUMNS, noise_rows(records))],
        "replacements": lambda: [Table(REPLACEMENT_COLUMNS, replacement_rows(records))],
        "timing": lambda: [Table(TIMING_COLUMNS, timing_rows(records, baseline))],
        "across": lambda: [Table(ACROSS_COLUMNS, across_rows(records))],
        "margins": lambda: [Table(MARGIN_COLUMNS, margin_rows(records))],
        "terms": lambda: [Table(TERM_COLUMNS, term_rows(records))],
        "matrices": lambda: ([Table(MATRIX_ROW_COLUMNS, matrix_rows(records))] if fmt == "csv"
                             else mean_matrices(records)),
    }
    wanted = set(names)
    unknown = wanted - set(TABLES)
    if unknown:
        raise ValueError(f"unknown tables {sorted(unknown)}; choose from {list(TABLES)}")
    built = {name: [t for t in builders[name]() if t.rows] for name in TABLES if name in wanted}
    return {name: tables for name, tables in built.items() if tables}


def tables(records: list[RunRecord], fmt: str = "github") -> str:
    """The summary (:data:`SUMMARY`): the leaderboard, then the noise-aware AC, the replacement models' own
    accuracies and the adapter studies' cases and backfilling, each where some record carries them, separated by
    blank lines; in csv, which holds one table, the leaderboard alone."""
    built = build(records, fmt, SUMMARY[:1] if fmt == "csv" else SUMMARY)
    return render([table for group in built.values() for table in group], fmt)


