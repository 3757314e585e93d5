"""Leaderboards from result files: one row per experiment, mean ± std over seeds.

An experiment is a scenario, data set and strategy (or adapter) with every setting that changes the protocol
(:func:`experiment_settings`: the resolved config minus seed, paths and display settings); runs that differ only
by seed are aggregated, others are separate rows whose labels carry the settings that tell them apart.

Rows come from every complete and well-formed ``metrics.json`` under a results folder; incomplete runs and
malformed records are listed apart with their reason (:func:`record_problem`) so a partial or damaged result is
never mistaken for a finished one. The std is the sample standard deviation (ddof = 1).
"""
from __future__ import annotations

import csv
import io
import json
import math
import reprlib
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from configuration import flatten

from .adapters import BACKFILL_ORDERS
from .metrics import MatrixError, across_replacements, as_matrix, is_number

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
NAME = "a non-empty string"
FRACTION = "a fraction in [0, 1]"
OPTIONAL_FRACTION = "null or a fraction in [0, 1]"
INTERVAL = "[low, high], fractions in [0, 1]"

Check = Callable[[Any], bool]
RunMatrices = list[tuple[dict[str, Any], np.ndarray]]


def collect(results_dir: str | Path) -> tuple[list[dict[str, Any]], list[tuple[Path, str]]]:
    """``(complete records, [(path, reason), ...])`` over every ``metrics.json`` under ``results_dir``.

    Unreadable files, incomplete runs and records :func:`record_problem` rejects are left out with a one-line
    reason, so that a partial or malformed result is neither averaged into a row nor crashes a table.
    """
    complete, skipped = [], []
    for path in sorted(Path(results_dir).rglob("metrics.json")):
        record, problem = _read(path)
        problem = problem or record_problem(record)
        if problem:
            skipped.append((path, problem))
        else:
            complete.append(record)
    return complete, skipped


def _read(path: Path) -> tuple[Any, str | None]:
    try:
        return json.loads(path.read_text(encoding="utf-8")), None
    except OSError as exc:
        return None, f"unreadable ({exc.strerror or exc})"
    except UnicodeDecodeError as exc:
        return None, (f"not UTF-8 text (byte {exc.object[exc.start]:#04x} at position {exc.start}); a metrics.json "
                      "is UTF-8 JSON")
    except RecursionError:
        return None, "JSON nesting too deep; a metrics.json is an object a few levels deep"
    except ValueError as exc:
        return None, f"not valid JSON ({exc})"


def _text(value: Any) -> bool:
    return isinstance(value, str) and value.strip() != ""


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(value: Any) -> bool:
    return _integer(value) and value >= 0


def _object(value: Any) -> bool:
    return isinstance(value, dict)


def _within(low: float, high: float) -> Check:
    return lambda value: is_number(value) and low <= value <= high


def _optional(check: Check) -> Check:
    return lambda value: value is None or check(value)


def _interval(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(map(_within(0, 1), value))


def _field(data: dict[str, Any], key: str, check: Check, expected: str, *, within: str = "",
           required: bool = True) -> str | None:
    """Why ``data[key]`` is unusable (``within`` prefixes its name in the message), or None when it is usable
    or absent and not ``required``."""
    if key not in data:
        return f"'{within}{key}' is missing; it must be {expected}" if required else None
    return None if check(data[key]) else f"'{within}{key}' is {reprlib.repr(data[key])}; it must be {expected}"


def _first(problems: Iterable[str | None]) -> str | None:
    return next((p for p in problems if p), None)


def record_problem(record: Any) -> str | None:
    """Why a parsed ``metrics.json`` cannot be a leaderboard row, or None when it can.

    Every field the tables of this module read is checked for type and range (AC a fraction; AA and ACA
    percent; the matrix as :func:`benchmarks.metrics.as_matrix` reads it; the noise, replacement-model, timing
    and model-update fields where present), so that a hand-made or damaged file is named and left out instead
    of crashing a table or being averaged. An incomplete run is reported as such.
    """
    if not isinstance(record, dict):
        return f"holds {reprlib.repr(record)}, not a JSON object; a metrics.json is one object"
    return (_field(record, "complete", lambda v: isinstance(v, bool), "true or false")
            or _incomplete(record)
            or _first(_field(record, key, _text, NAME) for key in ("scenario", "dataset", "strategy"))
            or _field(record, "method", _text, NAME, required=False)
            or _field(record, "seed", _integer, "an integer")
            or _field(record, "num_tasks", _count, "a number of tasks", required=False)
            or _field(record, "tasks_completed", _count, "a number of tasks", required=False)
            or _tasks_problem(record)
            or _field(record, "metrics", _object, "an object with AC, AA and ACA")
            or _metrics_problem(record["metrics"])
            or _matrix_problem(record)
            or _field(record, "replacement_tasks", lambda v: isinstance(v, list) and all(map(_count, v)),
                      "a list of task indices", required=False)
            or _config_problem(record)
            or _noise_problem(record.get("noise"))
            or _replacement_models_problem(record)
            or _timings_problem(record)
            or (_update_problem(record) if record["scenario"] == "model_update" else None))


def _incomplete(record: dict[str, Any]) -> str | None:
    if record["complete"]:
        return None
    done, total = (record.get(k) if _count(record.get(k)) else "?" for k in ("tasks_completed", "num_tasks"))
    return f"incomplete run ({done} of {total} tasks)"


def _tasks_problem(record: dict[str, Any]) -> str | None:
    done, total = record.get("tasks_completed"), record.get("num_tasks")
    if done is None or total is None or done == total:
        return None
    return f"'complete' is true but tasks_completed is {done} of num_tasks {total}; rerun it or fix the record"


def _metrics_problem(metrics: dict[str, Any]) -> str | None:
    percent, points = _within(0, 100), _optional(_within(-100, 100))
    return (_field(metrics, "AC", _within(0, 1), FRACTION, within="metrics.")
            or _field(metrics, "AA", percent, "a percentage in [0, 100]", within="metrics.")
            or _field(metrics, "ACA", _optional(percent), "a percentage in [0, 100] (null for one task)",
                      within="metrics.")
            or _first(_field(metrics, key, points, "null or percent points in [-100, 100]", within="metrics.",
                             required=False) for key in ("BC", "FC")))


def _matrix_problem(record: dict[str, Any]) -> str | None:
    if "compatibility_matrix" not in record:
        return None
    try:
        size = len(as_matrix(record["compatibility_matrix"]))
    except MatrixError as exc:
        return f"compatibility_matrix: {exc}"
    tasks = record.get("num_tasks")
    if tasks is not None and size != tasks:
        return f"compatibility_matrix has {size} rows but num_tasks is {tasks}; a complete run has one row per task"
    return None


def _config_problem(record: dict[str, Any]) -> str | None:
    problem = (_field(record, "config", _optional(_object), "an object (the resolved settings)", required=False)
               or _field(record.get("config") or {}, "adapter", lambda v: not v or isinstance(v, dict),
                         "an object with a 'name'", within="config.", required=False))
    if problem:
        return problem
    try:
        json.dumps(experiment_settings(record), sort_keys=True, default=str)
    except RecursionError:
        return "'config' is nested too deeply; it must be the resolved settings of configs/default.yaml"
    return None


def _noise_problem(noise: Any) -> str | None:
    if not noise:
        return None
    if not isinstance(noise, dict):
        return f"'noise' is {reprlib.repr(noise)}; it must be an object (benchmarks/noise.py)"
    return (_field(noise, "AC_interval", _interval, INTERVAL, within="noise.")
            or _noise_summary_problem(noise, "noise.")
            or _field(noise, "across", _object, "an object (benchmarks/noise.py)", within="noise.")
            or _noise_summary_problem(noise["across"], "noise.across.")
            or _field(noise, "queries", lambda v: _count(v) and v > 0, "a positive number of queries",
                      within="noise."))


def _noise_summary_problem(summary: dict[str, Any], within: str) -> str | None:
    return (_first(_field(summary, key, _optional(_within(0, 1)), OPTIONAL_FRACTION, within=within)
                   for key in ("AC_outside_noise", "AC_upper"))
            or _field(summary, "within_noise", _count, "a number of pairs", within=within))


def _replacement_models_problem(record: dict[str, Any]) -> str | None:
    problem = _field(record, "replacement_models", lambda v: isinstance(v, list) and all(map(_object, v)),
                     "a list of objects", required=False)
    return problem or _first(
        _field(rep, "task", _count, "a task index", within=f"replacement_models[{i}].")
        or _field(rep, "own_accuracy", _within(0, 1), FRACTION, within=f"replacement_models[{i}].")
        or _field(rep, "own_accuracy_interval", _interval, INTERVAL,
                  within=f"replacement_models[{i}].")
        or _field(rep, "classes", _optional(_count), "a number of classes", within=f"replacement_models[{i}].",
                  required=False)
        for i, rep in enumerate(record.get("replacement_models", [])) if "own_accuracy" in rep)


def _timings_problem(record: dict[str, Any]) -> str | None:
    problem = (_field(record, "timings", _object, "an object", required=False)
               or _field(record.get("timings", {}), "tasks", lambda v: isinstance(v, list) and all(map(_object, v)),
                         "a list of objects", within="timings.", required=False))
    return problem or _first(
        _field(task, "iterations", _count, "a number of iterations", within=f"timings.tasks[{i}].")
        or _field(task, "seconds", _within(0, math.inf), "a number of seconds", within=f"timings.tasks[{i}].")
        for i, task in enumerate(record.get("timings", {}).get("tasks", [])))


def _update_problem(record: dict[str, Any]) -> str | None:
    problem = (_field(record, "cases", _object, "an object of retrieval accuracies")
               or _first(_field(record["cases"], case, _optional(_within(0, 1)), OPTIONAL_FRACTION, within="cases.",
                                required=False) for case in UPDATE_CASES)
               or _field(record, "backfilling", lambda v: _object(v) and _object(v.get("area")),
                         "an object with an 'area' object")
               or _first(_field(record["backfilling"]["area"], order, _optional(_within(0, 1)), OPTIONAL_FRACTION,
                                within="backfilling.area.", required=False) for order in BACKFILL_ORDERS))
    if problem or not record.get("adapter"):
        return problem
    return (_field(record, "adapter", lambda v: _object(v) and _object(v.get("fit")),
                   "null or an object with a 'fit' object")
            or _field(record["adapter"]["fit"], "f_W", is_number, "a number", within="adapter.fit.", required=False))


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
                    scored[(rep["task"], rep.get("classes"))].append(rep)
        for (task, classes), reps in sorted(scored.items(), key=lambda item: (item[0][0], item[0][1] is None,
                                                                             item[0][1] or 0)):
            low, high = (100 * np.mean([rep["own_accuracy_interval"][i] for rep in reps]) for i in (0, 1))
            rows.append([scenario, dataset, strategy, task, "-" if classes is None else classes,
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


def _matrix_groups(records: list[dict[str, Any]]) -> dict[tuple[str, str, str], RunMatrices]:
    """The runs of each :func:`_groups` group that carry a compatibility matrix, each with its matrix; a group
    whose matrices differ in size (runs without a config to tell them apart) is split, labels tagged with it."""
    out = {}
    for (scenario, dataset, label), runs in _groups(records).items():
        by_size: dict[int, RunMatrices] = defaultdict(list)
        for r in runs:
            if "compatibility_matrix" in r:
                matrix = as_matrix(r["compatibility_matrix"])
                by_size[len(matrix)].append((r, matrix))
        for size, sized in sorted(by_size.items()):
            out[(scenario, dataset, label + (f" [{size} tasks]" if len(by_size) > 1 else ""))] = sized
    return out


def across_rows(records: list[dict[str, Any]], tie_rule: str = "strict") -> list[list[Any]]:
    """Rows ``[scenario, dataset, strategy, AC across, ACA across, pairs, seeds]``: AC and ACA over the pairs
    separated by a replacement (:func:`benchmarks.metrics.across_replacements`), mean ± std over seeds."""
    rows = []
    for (scenario, dataset, strategy), runs in _matrix_groups(records).items():
        values = [across_replacements(matrix, r.get("replacement_tasks", []), tie_rule) for r, matrix in runs]
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
    for (scenario, dataset, strategy), runs in _matrix_groups(records).items():
        stack = np.stack([matrix for _, matrix in runs]) * 100
        mean, std = stack.mean(axis=0), stack.std(axis=0, ddof=1) if len(runs) > 1 else None
        replaced = set(runs[0][0].get("replacement_tasks", []))
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
        areas = [column(lambda r, o=o: r["backfilling"]["area"].get(o)) for o in BACKFILL_ORDERS]
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
