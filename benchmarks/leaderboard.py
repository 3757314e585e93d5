"""Leaderboards from result files: one row per experiment, mean ± std over seeds.

An experiment is a scenario, data set and strategy (or adapter) with every setting that changes the protocol
(:func:`experiment_settings`: the resolved config minus seed, paths and display settings); runs that differ only
by seed are aggregated, others are separate rows whose labels carry the settings that tell them apart.

Rows come from every complete ``metrics.json`` under a results folder; incomplete runs are listed apart so a
partial result is never mistaken for a finished one. The std is the sample standard deviation (ddof = 1).
"""
from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from configuration import flatten

from .metrics import across_replacements, as_matrix

FORMATS = ("github", "csv", "latex")
COLUMNS = ("AC", "AA", "ACA")
HEADERS = ["scenario", "dataset", "strategy", "AC", "AA (%)", "ACA (%)", "seeds"]
ACROSS_HEADERS = ["scenario", "dataset", "strategy", "AC across replacements", "ACA across (%)", "pairs", "seeds"]
UPDATE_CASES = ("old/old", "new/new", "new/old", "B(new)/old", "new/F(old)", "B(new)/B(new)")
UPDATE_HEADERS = ["dataset", "adapter", *(f"{c} (%)" for c in UPDATE_CASES), "backfill area: random",
                  "uncertainty", "class-mean dist.", "f(W)", "seeds"]
NOISE_HEADERS = ["scenario", "dataset", "strategy", "AC", "AC 95% interval", "AC outside noise", "AC upper",
                 "pairs within noise", "across: AC outside noise", "across: AC upper", "across: within noise",
                 "queries", "seeds"]
REPLACEMENT_HEADERS = ["scenario", "dataset", "strategy", "replacement task", "classes", "own accuracy (%)",
                       "95% interval", "seeds"]
TIMING_HEADERS = ["scenario", "dataset", "strategy", "train ms / iteration", "ratio to baseline", "seeds"]
NOT_EXPERIMENT = {"seed", "output", "device", "data_root", "download", "plugins", "training.progress",
                  "evaluation.plots", "replacement.pretrain.cache_dir"}


def collect(results_dir: str | Path) -> tuple[list[dict[str, Any]], list[Path]]:
    """``(complete records, paths of incomplete or unreadable ones)`` under ``results_dir``."""
    complete, skipped = [], []
    for path in sorted(Path(results_dir).rglob("metrics.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            skipped.append(path)
            continue
        if isinstance(record, dict) and record.get("complete") and record.get("metrics"):
            complete.append(record)
        else:
            skipped.append(path)
    return complete, skipped


def _mean_std(values: list[float], digits: int) -> str:
    if not values:
        return "-"
    std = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    return f"{np.mean(values):.{digits}f} ± {std:.{digits}f}"


def experiment_settings(record: dict[str, Any]) -> dict[str, Any]:
    """What makes a run's experiment: its resolved config, flattened, without the seed, where results and data
    are kept and how they are shown, and without the parameters of strategies and adapters it does not use."""
    config = record.get("config") or {}
    adapter = (config.get("adapter") or {}).get("name")
    used = {f"strategy_params.{config.get('strategy')}.", f"adapter_params.{adapter}."}
    return {k: v for k, v in flatten(config).items() if k not in NOT_EXPERIMENT
            and (not k.startswith(("strategy_params.", "adapter_params.")) or k.startswith(tuple(used)))}


def _tag(settings: dict[str, Any], differing: list[str]) -> str:
    shown = [f"{k}={value if isinstance(value, str) else json.dumps(value)}"
             for k, value in ((k, settings.get(k)) for k in differing[:3])]
    return " [" + "; ".join(shown) + ("; ..." if len(differing) > 3 else "") + "]"


def _groups(records: list[dict[str, Any]]) -> dict[tuple[str, str, str], list[dict[str, Any]]]:
    """Runs grouped by experiment (:func:`experiment_settings`): runs that differ only by seed are one group;
    when one name covers several experiments, each label gets a tag of the settings that tell them apart."""
    experiments: dict[tuple[str, str, str], dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        identity = json.dumps(experiment_settings(r), sort_keys=True, default=str)
        experiments[(r["scenario"], r["dataset"], r.get("method", r["strategy"]))][identity].append(r)
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for (scenario, dataset, name), by_identity in experiments.items():
        settings = [json.loads(identity) for identity in by_identity]
        keys = sorted(set().union(*settings))
        differing = [k for k in keys if len({json.dumps(s.get(k), sort_keys=True) for s in settings}) > 1]
        for identity, runs in by_identity.items():
            label = name + (_tag(json.loads(identity), differing) if len(by_identity) > 1 else "")
            groups[(scenario, dataset, label)] = runs
    return dict(sorted(groups.items()))


def leaderboard_rows(records: list[dict[str, Any]]) -> list[list[Any]]:
    """Rows ``[scenario, dataset, strategy, AC, AA, ACA, seeds]`` sorted by scenario, dataset, AC then AA."""
    rows = []
    for (scenario, dataset, strategy), runs in _groups(records).items():
        values = {c: [r["metrics"][c] for r in runs if r["metrics"].get(c) is not None] for c in COLUMNS}
        rows.append([scenario, dataset, strategy, *(_mean_std(values[c], 3 if c == "AC" else 2) for c in COLUMNS),
                     len(runs),
                     float(np.mean(values["AC"]) if values["AC"] else 0), float(np.mean(values["AA"]))])
    rows.sort(key=lambda r: (r[0], r[1], -r[-2], -r[-1]))
    return [r[:-2] for r in rows]


def noise_rows(records: list[dict[str, Any]]) -> list[list[Any]]:
    """Rows of the noise-aware AC (``benchmarks/noise.py``) for the runs that carry a ``noise`` object: AC, its
    interval over query resamples, the shares of pairs compatible beyond noise (lower bound) and not incompatible
    beyond noise (upper bound), the number of pairs within noise, the same across replacements; means over seeds
    (interval bounds averaged bound by bound)."""
    rows = []
    for (scenario, dataset, strategy), runs in _groups(records).items():
        noisy = [r for r in runs if r.get("noise")]
        if not noisy:
            continue
        def mean(get, digits: int) -> str:
            values = [v for v in map(get, noisy) if v is not None]
            return f"{np.mean(values):.{digits}f}" if values else "-"

        low, high = (mean(lambda r, i=i: r["noise"]["AC_interval"][i], 3) for i in (0, 1))
        rows.append([scenario, dataset, strategy, mean(lambda r: r["metrics"]["AC"], 3), f"[{low}, {high}]",
                     mean(lambda r: r["noise"]["AC_outside_noise"], 3), mean(lambda r: r["noise"]["AC_upper"], 3),
                     mean(lambda r: r["noise"]["within_noise"], 1),
                     mean(lambda r: r["noise"]["across"]["AC_outside_noise"], 3),
                     mean(lambda r: r["noise"]["across"]["AC_upper"], 3),
                     mean(lambda r: r["noise"]["across"]["within_noise"], 1), noisy[0]["noise"]["queries"], len(noisy)])
    return rows


def replacement_rows(records: list[dict[str, Any]]) -> list[list[Any]]:
    """Each replacement model's own retrieval accuracy on the evaluation set (percent, mean over seeds, with the
    mean Wilson interval), for the runs that measured it."""
    rows = []
    for (scenario, dataset, strategy), runs in _groups(records).items():
        scored: dict[tuple[int, Any], list[dict[str, Any]]] = defaultdict(list)
        for r in runs:
            for rep in r.get("replacement_models", []):
                if "own_accuracy" in rep:
                    scored[(rep["task"], rep.get("classes", "-"))].append(rep)
        for (task, classes), reps in sorted(scored.items()):
            low, high = (100 * np.mean([rep["own_accuracy_interval"][i] for rep in reps]) for i in (0, 1))
            rows.append([scenario, dataset, strategy, task, classes,
                         f"{100 * np.mean([rep['own_accuracy'] for rep in reps]):.2f}", f"[{low:.2f}, {high:.2f}]",
                         len(reps)])
    return rows


def seconds_per_iteration(record: dict[str, Any]) -> float | None:
    """Median over the run's tasks of training seconds per iteration (robust to one task slowed by another
    process), or None when it recorded no iteration."""
    tasks = [t for t in record.get("timings", {}).get("tasks", []) if t["iterations"]]
    return float(np.median([t["seconds"] / t["iterations"] for t in tasks])) if tasks else None


def timing_rows(records: list[dict[str, Any]], baseline: str = "er") -> list[list[Any]]:
    """Rows ``[scenario, dataset, strategy, ms/iteration, ratio, seeds]``: the median over seeds of each run's
    :func:`seconds_per_iteration`, and its ratio to ``baseline``'s in the same scenario and data set ("-" without
    it). Iteration times include the teacher's forward pass and the strategy's loss."""
    groups = {key: [v for v in map(seconds_per_iteration, runs) if v is not None]
              for key, runs in _groups(records).items()}
    medians = {key: float(np.median(values)) for key, values in groups.items() if values}
    rows = []
    for (scenario, dataset, strategy), median in medians.items():
        tag = strategy[strategy.index(" ["):] if " [" in strategy else ""
        base = medians.get((scenario, dataset, baseline + tag), medians.get((scenario, dataset, baseline)))
        rows.append([scenario, dataset, strategy, f"{1000 * median:.1f}", f"{median / base:.2f}" if base else "-",
                     len(groups[(scenario, dataset, strategy)])])
    return rows


def across_rows(records: list[dict[str, Any]], tie_rule: str = "strict") -> list[list[Any]]:
    """Rows ``[scenario, dataset, strategy, AC across, ACA across, pairs, seeds]``: AC and ACA over the pairs
    separated by a replacement (:func:`benchmarks.metrics.across_replacements`), mean ± std over seeds."""
    rows = []
    for (scenario, dataset, strategy), runs in _groups(records).items():
        values = [across_replacements(as_matrix(r["compatibility_matrix"]), r.get("replacement_tasks", []),
                                      tie_rule) for r in runs]
        if not values[0]["pairs_across"]:
            continue
        rows.append([scenario, dataset, strategy, _mean_std([v["AC_across"] for v in values], 3),
                     _mean_std([v["ACA_across"] for v in values], 2), values[0]["pairs_across"], len(runs)])
    return rows


def mean_matrices(records: list[dict[str, Any]]) -> str:
    """Markdown: per (scenario, dataset, strategy), the compatibility matrix averaged over seeds, in percent
    (``mean ± std`` when there are several seeds; replacement tasks marked with ``*``)."""
    from tabulate import tabulate

    blocks = []
    for (scenario, dataset, strategy), runs in _groups(records).items():
        stack = np.stack([as_matrix(r["compatibility_matrix"]) for r in runs]) * 100
        mean, std = stack.mean(axis=0), stack.std(axis=0, ddof=1) if len(runs) > 1 else None
        replaced = set(runs[0].get("replacement_tasks", []))
        labels = [f"{t}{'*' if t in replaced else ''}" for t in range(len(mean))]
        table = [[labels[t]] + [(f"{mean[t, k]:.1f}" + (f" ± {std[t, k]:.1f}" if std is not None else ""))
                                if k <= t else "" for k in range(len(mean))] for t in range(len(mean))]
        title = f"#### {scenario} / {dataset} / {strategy} ({len(runs)} seed{'s' if len(runs) > 1 else ''})"
        blocks.append(title + "\n\n" + tabulate(table, headers=["query \\ gallery", *labels], tablefmt="github",
                                                   disable_numparse=True))
    return "\n\n".join(blocks)


def update_rows(records: list[dict[str, Any]]) -> list[list[Any]]:
    """Rows of the ``model_update`` runs: each retrieval case and backfilling area (percent) and λ-orth's final
    f(W), mean ± std over seeds; "-" where an adapter does not produce the case."""
    rows = []
    for (scenario, dataset, method), runs in _groups(records).items():
        if scenario != "model_update":
            continue
        def column(get) -> str:
            values = [v for v in map(get, runs) if v is not None]
            return _mean_std([100 * v for v in values], 2) if values else "-"

        cases = [column(lambda r, c=c: r["cases"].get(c)) for c in UPDATE_CASES]
        areas = [column(lambda r, o=o: r["backfilling"]["area"].get(o))
                 for o in ("random", "uncertainty", "class_mean_distance")]
        gaps = [r["adapter"]["fit"]["f_W"] for r in runs if r.get("adapter") and "f_W" in r["adapter"]["fit"]]
        rows.append([dataset, method, *cases, *areas, _mean_std(gaps, 2) if gaps else "-", len(runs)])
    return rows


def tables(records: list[dict[str, Any]], fmt: str = "github") -> str:
    """The leaderboard, then the noise-aware AC, the replacement models' own accuracies and the model_update
    cases, each where some record carries them, separated by blank lines."""
    parts = [(leaderboard_rows(records), HEADERS), (noise_rows(records), NOISE_HEADERS),
             (replacement_rows(records), REPLACEMENT_HEADERS), (update_rows(records), UPDATE_HEADERS)]
    return "\n\n".join(render(rows, fmt, headers) for rows, headers in parts if rows)


def render(rows: list[list[Any]], fmt: str = "github", headers: list[str] = HEADERS) -> str:
    """The table in ``github`` markdown, ``csv`` or ``latex``; AC is a fraction of pairs, AA and ACA percent."""
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(headers)
        writer.writerows(rows)
        return out.getvalue().rstrip("\n")
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose from {list(FORMATS)}")
    from tabulate import tabulate

    return tabulate(rows, headers=headers, tablefmt=fmt, disable_numparse=True)
