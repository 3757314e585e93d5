"""Leaderboards from result files: one row per (scenario, dataset, strategy), mean ± std over seeds.

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

FORMATS = ("github", "csv", "latex")
COLUMNS = ("AC", "AA", "ACA")
HEADERS = ["scenario", "dataset", "strategy", "AC", "AA (%)", "ACA (%)", "seeds"]
TIMING_HEADERS = ["scenario", "dataset", "strategy", "train ms / iteration", "ratio to baseline", "seeds"]


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


def leaderboard_rows(records: list[dict[str, Any]]) -> list[list[Any]]:
    """Rows ``[scenario, dataset, strategy, AC, AA, ACA, seeds]`` sorted by scenario, dataset, AC then AA."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        groups[(r["scenario"], r["dataset"], r["strategy"])].append(r)
    rows = []
    for (scenario, dataset, strategy), runs in groups.items():
        values = {c: [r["metrics"][c] for r in runs if r["metrics"].get(c) is not None] for c in COLUMNS}
        rows.append([scenario, dataset, strategy, *(_mean_std(values[c], 3 if c == "AC" else 2) for c in COLUMNS),
                     len(runs),
                     float(np.mean(values["AC"]) if values["AC"] else 0), float(np.mean(values["AA"]))])
    rows.sort(key=lambda r: (r[0], r[1], -r[-2], -r[-1]))
    return [r[:-2] for r in rows]


def seconds_per_iteration(record: dict[str, Any]) -> float | None:
    """Training seconds per iteration of one run (all tasks), or None when it recorded no iteration."""
    tasks = record.get("timings", {}).get("tasks", [])
    iterations = sum(t["iterations"] for t in tasks)
    return sum(t["seconds"] for t in tasks) / iterations if iterations else None


def timing_rows(records: list[dict[str, Any]], baseline: str = "er") -> list[list[Any]]:
    """Rows ``[scenario, dataset, strategy, ms/iteration, ratio, seeds]``: the median over seeds of each run's
    training time per iteration, and its ratio to ``baseline``'s in the same scenario and data set ("-" without
    it). Iteration times include the teacher's forward pass and the strategy's loss."""
    groups: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for r in records:
        value = seconds_per_iteration(r)
        if value is not None:
            groups[(r["scenario"], r["dataset"], r["strategy"])].append(value)
    medians = {key: float(np.median(values)) for key, values in groups.items()}
    rows = []
    for (scenario, dataset, strategy), median in sorted(medians.items()):
        base = medians.get((scenario, dataset, baseline))
        rows.append([scenario, dataset, strategy, f"{1000 * median:.1f}", f"{median / base:.2f}" if base else "-",
                     len(groups[(scenario, dataset, strategy)])])
    return rows


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

    return tabulate(rows, headers=headers, tablefmt=fmt)
