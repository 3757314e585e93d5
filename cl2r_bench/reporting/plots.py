"""Figures of results. matplotlib is imported here only, inside the functions, with the file-only Agg backend.

Per run, next to its ``metrics.json``: the compatibility matrix heatmap (``compatibility_matrix.png``), the AA_t
curve (``aa_per_task.png``) and, for a ``model_update`` run, the backfilling curves (``backfilling.png``).
Per results folder (:func:`plot_results`, ``runner.py plot``): for each scenario and data set, AC_t and AA_t of
every experiment (mean over seeds ± one std) and a summary of AC, AA and ACA.

Tasks are numbered from 0 in every figure, as in logs, JSON and ``replacement.tasks``.

Heatmap cells are coloured by ``M[t][k]`` in percent (colour bar) and, when the matrix is small enough to read
them (:data:`ANNOTATED_TASKS`), show their value; with a ``noise`` object (``benchmarks/noise.py``) also the
half-width of the entry's interval (:data:`INTERVAL_TASKS`) and the pair's decision: red solid box = incompatible
beyond noise, orange dashed box = within noise, red text (red × where values are not shown) = a violation of the
plain (noise-blind) criterion. Without noise, a violation is a red box."""
from __future__ import annotations

import io
import math
import re
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from benchmarks.metrics import area_under_curve, is_number
from benchmarks.record import RunRecord, adapter_study, checked_records
from cl2r_bench.files import atomic_write

from .adapter_recommendation import AdapterSummary
from .experiments import experiment_groups

ANNOTATED_TASKS = 16
INTERVAL_TASKS = 12
SUMMARY_METRICS = (("AC", "AC", 1.0, 3), ("AA", "AA (%)", 100.0, 2), ("ACA", "ACA (%)", 100.0, 2))


class Series(NamedTuple):
    """The runs of one experiment (seeds of the same settings, task count and replacement tasks)."""
    label: str
    runs: list[RunRecord]
    replacement_tasks: tuple[int, ...]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> None:
    """Write a figure as PNG atomically, like every result file."""
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=120))


def _run_title(record: RunRecord) -> str:
    name = record.get("method", record["strategy"])
    return f"{name} · {record['scenario']} · {record['dataset']} · seed {record['seed']}"


def _task_axis(ax, size: int) -> None:
    """Integer task ticks from 0, every task while they fit."""
    from matplotlib.ticker import MaxNLocator

    if size <= 16:
        ax.set_xticks(range(size))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(-0.5, size - 0.5)


def save_plots(record: RunRecord, directory: str | Path) -> list[Path]:
    """Write a run's figures next to its ``metrics.json``: ``compatibility_matrix.png`` and ``aa_per_task.png``,
    or for an adapter study (a ``model_update`` run) ``backfilling.png``."""
    if adapter_study(record):
        return [save_backfilling_plot(record, directory)]
    plt = _pyplot()
    directory = Path(directory)
    heatmap, curve = directory / "compatibility_matrix.png", directory / "aa_per_task.png"
    fig = _heatmap(plt, record)
    _save(fig, heatmap)
    plt.close(fig)
    fig = _aa_curve(plt, record)
    _save(fig, curve)
    plt.close(fig)
    return [heatmap, curve]


def _heatmap(plt, record: RunRecord):
    """The heatmap figure (module docstring): values and intervals only where they fit, marks everywhere; red
    text is a lighter red on the dark end of the colour map, where plain red is hard to read."""
    matrix = np.array([[np.nan if v is None else 100 * v for v in row] for row in record["compatibility_matrix"]])
    size = len(matrix)
    m = record["metrics"]
    violations = {tuple(v) for v in m["violations"]}
    noise = record.get("noise")
    decisions = {tuple(d["pair"]): d["decision"] for d in noise["pair_decisions"]} if noise else {}
    annotate, intervals = size <= ANNOTATED_TASKS, bool(noise) and size <= INTERVAL_TASKS
    cell = min(0.8, max(0.32, 8 / size))
    fig, ax = plt.subplots(figsize=(max(6.0, 2.6 + cell * size), max(4.0, 1.7 + cell * size)))
    image = ax.imshow(np.ma.masked_invalid(matrix), cmap="viridis")
    fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02, label="M[t][k] (%)")
    bright = np.nanmin(matrix) + 0.6 * (np.nanmax(matrix) - np.nanmin(matrix))
    fontsize = (8 if size <= 8 else 7 if size <= 12 else 6) - (1 if intervals else 0)
    edge = 2.0 if size <= 12 else 1.0
    crosses = []
    for t in range(size):
        for k in range(t + 1):
            bad = (t, k) in violations
            red = "red" if matrix[t, k] > bright else "#ff7f7f"
            if annotate:
                text = f"{matrix[t, k]:.1f}"
                if intervals:
                    low, high = noise["entry_intervals"][t][k]
                    text += f"\n±{50 * (high - low):.1f}"
                ax.text(k, t, text, ha="center", va="center", fontsize=fontsize,
                        color=red if bad else "black" if matrix[t, k] > bright else "white",
                        fontweight="bold" if bad else "normal")
            elif bad and noise:
                crosses.append((k, t, red))
            decision = decisions.get((t, k), "incompatible" if bad and not noise else None)
            if decision in ("incompatible", "within_noise"):
                ax.add_patch(plt.Rectangle((k - 0.5, t - 0.5), 1, 1, fill=False, linewidth=edge,
                                           edgecolor="red" if decision == "incompatible" else "orange",
                                           linestyle="-" if decision == "incompatible" else "--"))
    if crosses:
        columns, rows, colours = zip(*crosses, strict=True)
        ax.scatter(columns, rows, marker="x", c=colours, s=(30 * cell) ** 2, linewidths=1)
    replaced = set(record.get("replacement_tasks", []))
    ticks = [f"{i}{'*' if i in replaced else ''}" for i in range(size)]
    tick_size = 9 if size <= 12 else 7
    ax.set_xticks(range(size), ticks, fontsize=tick_size, rotation=90 if size > 40 else 0)
    ax.set_yticks(range(size), ticks, fontsize=tick_size)
    ax.set_xlabel(f"gallery model k, tasks 0-{size - 1} (* = replacement)")
    ax.set_ylabel("query model t")
    violation = "red text" if annotate else "red ×"
    summary = f"AC {m['AC']:.3f}  AA {m['AA']:.2f}  (red box: violation, M[t][k] ≤ M[k][k])"
    if noise:
        low, high = noise["AC_interval"]
        outside = "n/a" if noise["AC_outside_noise"] is None else f"{noise['AC_outside_noise']:.3f}"
        shown = f"± = half {noise['confidence']:.0%} interval; " if intervals else ""
        summary = (f"AC {m['AC']:.3f} [{low:.3f}, {high:.3f}], outside noise {outside}  AA {m['AA']:.2f}\n"
                   f"{shown}{violation}: M[t][k] ≤ M[k][k]\nbox: red incompatible beyond noise, orange within "
                   f"noise ({noise['within_noise']} of {noise['pairs']})")
    fig.suptitle(f"{_run_title(record)}\n{summary}", fontsize=7)
    fig.tight_layout()
    return fig


def _aa_curve(plt, record: RunRecord):
    aa = record["metrics"]["AA_per_task"]
    fig, ax = plt.subplots(figsize=(max(5.0, 2 + 0.2 * len(aa)), 3.2))
    ax.plot(range(len(aa)), aa, marker="o", markersize=5 if len(aa) <= 16 else 3)
    for r in record.get("replacement_tasks", []):
        ax.axvline(r, color="grey", linestyle="--", linewidth=1)
    _task_axis(ax, len(aa))
    ax.set_xlabel(f"task t, 0-{len(aa) - 1} (dashed: model replacement)")
    ax.set_ylabel("AA_t (%)")
    ax.set_title(_run_title(record), fontsize=8)
    fig.tight_layout()
    return fig


def save_backfilling_plot(record: RunRecord, directory: str | Path) -> Path:
    """Write ``backfilling.png``: accuracy against the backfilled fraction β for each order of a model_update run."""
    plt = _pyplot()
    fig = backfilling_figure(plt, f"{record['method']} · {record['dataset']} · seed {record['seed']}",
                             [record])
    path = Path(directory) / "backfilling.png"
    _save(fig, path)
    plt.close(fig)
    return path


def backfilling_curves(record: RunRecord) -> tuple[list[float], dict[str, list[float]]]:
    """``(betas, {order: top-1 in percent})`` of an adapter study's partial backfilling (``retrieval.backfilling``);
    orders without a curve left out, and no curve at all for a record that has none."""
    fill = (record.get("retrieval") or {}).get("backfilling") or {}
    curves = {order: curve["top1"] for order, curve in (fill.get("curves") or {}).items() if curve}
    return fill.get("betas", []), curves


NO_ADAPTER = "none"
"""The study's row without an adapter: its curve starts at the stale gallery's new/old, far below the adapters'
curves, so it is left out of the scale they are drawn on (:func:`backfilling_scale`)."""


def backfilling_scale(curves: list[list[float]], baseline: float | None = None) -> tuple[float, float]:
    """One top-1 range (%) for a group of backfilling curves, with a margin, so that curves drawn apart compare
    and the adapters' curves stay distinguishable (the caller leaves :data:`NO_ADAPTER`'s out; a curve below the
    range is clipped and says where it starts)."""
    values = [v for curve in curves for v in curve] + ([] if baseline is None else [baseline])
    low, high = min(values), max(values)
    margin = max(0.08 * (high - low), 0.5)
    return low - margin, high + margin


def _clipped_label(label: str, curve: list[float], scale: tuple[float, float] | None) -> str:
    if scale is not None and min(curve) < scale[0]:
        return f"{label}, from {curve[0]:.1f} (below the scale)"
    return label


def backfilling_figure(plt, title: str, runs: list[RunRecord], scale: tuple[float, float] | None = None):
    """Top-1 accuracy against the backfilled fraction β for each order, the mean over ``runs`` (one experiment's
    seeds) with its area under the curve; ``scale``: the group's top-1 range (:func:`backfilling_scale`), so that
    the figures of one study share their axis."""
    fig, ax = plt.subplots(figsize=(5, 3.5))
    curves = [backfilling_curves(r) for r in runs]
    betas = curves[0][0]
    for order in curves[0][1]:
        values = np.array([c[order] for _, c in curves if order in c], dtype=float)
        mean = values.mean(axis=0)
        label = f"{order} (area {area_under_curve(betas, list(mean)):.1f})"
        ax.plot(betas, mean, marker="o", markersize=3, label=_clipped_label(label, list(mean), scale))
    if scale is not None:
        ax.set_ylim(*scale)
    ax.set_xlabel("backfilled fraction β")
    ax.set_ylabel("top-1 accuracy (%)")
    ax.set_title(title, fontsize=9)
    if curves[0][1]:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no backfilling curve: this adapter's queries\nsearch the old gallery as it is",
                ha="center", va="center", transform=ax.transAxes, fontsize=8)
    fig.tight_layout()
    return fig


def cross_case_figure(plt, title: str, rows: list[AdapterSummary], baseline: float):
    """Each adapter's cross case (what the system serves without backfilling) against old/old (dashed), with the
    95 % interval of the paired gain, on an axis that holds the reference line, every bar and every interval."""
    shown = [r for r in rows if r.top1_gain is not None]
    fig, bars = plt.subplots(figsize=(5.5, 0.9 + 0.32 * max(len(shown), 4)))
    ends = [baseline]
    for y, row in enumerate(shown):
        low, high = row.top1_interval or (row.top1_gain, row.top1_gain)
        bars.barh(y, row.top1_gain, left=baseline, color=adapter_colour(plt, rows, row.adapter),
                  xerr=[[row.top1_gain - low], [high - row.top1_gain]], capsize=3)
        ends += [baseline + low, baseline + high, baseline + row.top1_gain]
    margin = max(0.06 * (max(ends) - min(ends)), 0.5)
    bars.set_xlim(min(ends) - margin, max(ends) + margin)
    bars.axvline(baseline, color="black", linestyle="--", linewidth=1)
    bars.set_yticks(range(len(shown)), [f"{r.adapter} ({r.cross_case})" for r in shown], fontsize=8)
    bars.invert_yaxis()
    bars.set_xlabel(f"top-1 (%) without backfilling; dashed: old/old {baseline:.1f}")
    bars.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def adapter_colour(plt, rows: list[AdapterSummary], adapter: str) -> Any:
    """One colour per adapter of a study, the same in all of its figures (20 colours beyond 10 adapters)."""
    index = [r.adapter for r in rows].index(adapter)
    return plt.cm.tab10(index % 10) if len(rows) <= 10 else plt.cm.tab20(index % 20)


def best_order_curves(rows: list[AdapterSummary], runs: list[RunRecord]) -> dict[str, tuple[list[float], list[float]]]:
    """``{adapter: (betas, top-1)}``: each adapter's backfilling curve in its best order, the mean over its seeds,
    where every seed's record holds it."""
    by_method: dict[str, list[RunRecord]] = {}
    for run in runs:
        by_method.setdefault(run["method"], []).append(run)
    out = {}
    for row in rows:
        if row.backfill_order is None:
            continue
        fills = [r["retrieval"]["backfilling"] for r in by_method[row.adapter]]
        drawn = [(f.get("curves") or {}).get(row.backfill_order) for f in fills]
        if None not in drawn:
            out[row.adapter] = (fills[0]["betas"], list(np.mean([c["top1"] for c in drawn], axis=0)))
    return out


def best_curves_figure(plt, title: str, rows: list[AdapterSummary], runs: list[RunRecord], baseline: float):
    """Each adapter's backfilling curve in its best order (:func:`best_order_curves`), from the stale gallery at
    β = 0 to full backfilling at β = 1, against old/old (dashed), on the adapters' scale (:func:`backfilling_scale`:
    the no-adapter curve, far below, is clipped); the legend sits under the axes, over no curve."""
    fig, curves = plt.subplots(figsize=(5.5, 3.6 + 0.14 * len(rows)))
    drawn = best_order_curves(rows, runs)
    adapters = [c for name, (_, c) in drawn.items() if name != NO_ADAPTER]
    scale = backfilling_scale(adapters or [c for _, c in drawn.values()], baseline) if drawn else None
    order = {row.adapter: row.backfill_order for row in rows}
    for name, (betas, curve) in drawn.items():
        curves.plot(betas, curve, marker="o", markersize=2.5, color=adapter_colour(plt, rows, name),
                    label=_clipped_label(f"{name} ({order[name]})", curve, scale))
    if scale is not None:
        curves.set_ylim(*scale)
    curves.axhline(baseline, color="black", linestyle="--", linewidth=1)
    curves.set_xlabel(f"backfilled fraction β; dashed: old/old {baseline:.1f}")
    curves.set_ylabel("top-1 (%)")
    curves.set_title(title, fontsize=9)
    curves.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    fig.tight_layout()
    return fig


def viridis(share: float) -> tuple[int, int, int]:
    """The viridis colour at ``share`` in [0, 1] (the heatmaps' colour map), as 0-255 RGB."""
    import matplotlib

    red, green, blue, _ = matplotlib.colormaps["viridis"](share)
    return round(255 * red), round(255 * green), round(255 * blue)


def png_bytes(draw: Callable[..., Any], *args: Any) -> bytes:
    """The PNG of the figure ``draw(plt, *args)`` returns (for pages that embed their figures)."""
    plt = _pyplot()
    fig = draw(plt, *args)
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out.getvalue()


def _numbers(value: Any, low: float, high: float) -> bool:
    return isinstance(value, list) and all(is_number(v) and low <= v <= high for v in value)


def _index_pair(value: Any, size: int) -> bool:
    return (isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value)
            and 0 <= value[1] < value[0] < size)


def figure_problem(record: RunRecord) -> str | None:
    """Why a record that :func:`benchmarks.record.record_problem` accepts cannot be drawn, or None.

    The figures read fields the leaderboard does not (the per-task curves, violations, noise intervals and
    decisions, backfilling curves); a hand-made or older record lacking them is named instead of crashing."""
    if adapter_study(record):
        fill = record["retrieval"]["backfilling"]
        betas, curves = fill.get("betas"), fill.get("curves")
        if not (_numbers(betas, 0, 1) and isinstance(curves, dict) and all(
                c is None or (isinstance(c, dict) and _numbers(c.get("top1"), 0, 100) and len(c["top1"]) == len(betas)
                              and fill["auc"].get(o)) for o, c in curves.items())):
            return ("'retrieval.backfilling' needs 'betas' (fractions) and 'curves' (per order, top-1 in percent at "
                    "each β, with its area); rerun the model_update experiment")
    if "compatibility_matrix" not in record:
        return "'compatibility_matrix' is missing; the figures are drawn from it"
    size, m = len(record["compatibility_matrix"]), record["metrics"]
    for key, high in (("AC_per_task", 1), ("AA_per_task", 100)):
        if not (_numbers(m.get(key), 0, high) and len(m[key]) == size):
            return (f"'metrics.{key}' must be {size} numbers in [0, {high}], one per task; take it from "
                    "`runner.py metrics FILE --json`")
    if not (isinstance(m.get("violations"), list) and all(_index_pair(v, size) for v in m["violations"])):
        return (f"'metrics.violations' must be a list of [t, k] pairs, 0 <= k < t < {size}; take it from "
                "`runner.py metrics FILE --json`")
    return _noise_figure_problem(record.get("noise"), size)


def _noise_figure_problem(noise: Any, size: int) -> str | None:
    if not noise:
        return None
    rows = noise.get("entry_intervals")
    decisions = noise.get("pair_decisions")
    if not (isinstance(rows, list) and len(rows) == size and all(
            isinstance(row, list) and len(row) > t and all(_numbers(row[k], 0, 1) and len(row[k]) == 2
                                                          for k in range(t + 1)) for t, row in enumerate(rows))):
        return (f"'noise.entry_intervals' must be {size} rows of [low, high] fractions; rerun the metrics with "
                "--queries N to rebuild the noise object")
    if not (isinstance(decisions, list) and all(isinstance(d, dict) and _index_pair(d.get("pair"), size)
                                                and isinstance(d.get("decision"), str) for d in decisions)
            and is_number(noise.get("confidence")) and isinstance(noise.get("pairs"), int)):
        return ("'noise' needs 'pair_decisions' ({pair: [t, k], decision}), 'confidence' and 'pairs'; rerun the "
                "metrics with --queries N to rebuild the noise object")
    return None


def experiment_series(groups: dict[tuple[str, str, str], list[RunRecord]]) -> dict[tuple[str, str], list[Series]]:
    """The experiments of each (scenario, data set). A leaderboard group whose runs differ in task count or
    replacement tasks (records without a config to tell them apart) is split, so they are never averaged."""
    out: dict[tuple[str, str], list[Series]] = defaultdict(list)
    for (scenario, dataset, label), runs in groups.items():
        shapes: dict[tuple[int, tuple[int, ...]], list[RunRecord]] = defaultdict(list)
        for r in runs:
            shapes[(len(r["metrics"]["AC_per_task"]), tuple(sorted(set(r.get("replacement_tasks", [])))))].append(r)
        for (size, replaced), same in sorted(shapes.items()):
            tag = f" [{size} tasks, replacements {list(replaced)}]" if len(shapes) > 1 else ""
            out[(scenario, dataset)].append(Series(label + tag, same, replaced))
    return dict(out)


def _colours(plt, count: int) -> list[Any]:
    cmap = plt.get_cmap("tab10" if count <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(count)]


def _seeds(series: Series) -> str:
    return f"{len(series.runs)} seed{'s' if len(series.runs) > 1 else ''}"


def curves_figure(plt, scenario: str, dataset: str, series: list[Series]):
    """AC_t and AA_t of every experiment: mean over seeds, a band of one std (ddof = 1) when several."""
    columns = min(3, len(series))
    legend_height = 0.22 * math.ceil(len(series) / columns) + 0.08
    longest = max(len(s.runs[0]["metrics"]["AC_per_task"]) for s in series)
    height = 3.8 + legend_height
    fig, axes = plt.subplots(1, 2, figsize=(max(11.0, 6 + 0.3 * longest), height))
    shared = len({s.replacement_tasks for s in series}) == 1
    for colour, s in zip(_colours(plt, len(series)), series, strict=True):
        for ax, key, top in zip(axes, ("AC_per_task", "AA_per_task"), (1, 100), strict=True):
            values = np.array([r["metrics"][key] for r in s.runs], dtype=float)
            tasks, mean = np.arange(values.shape[1]), values.mean(axis=0)
            ax.plot(tasks, mean, color=colour, marker="o" if len(tasks) <= 16 else None, markersize=3,
                    linewidth=1.5, label=f"{s.label} · {_seeds(s)}")
            if len(s.runs) > 1:
                std = values.std(axis=0, ddof=1)
                ax.fill_between(tasks, np.clip(mean - std, 0, top), np.clip(mean + std, 0, top), color=colour,
                                alpha=0.18, linewidth=0)
            for r in s.replacement_tasks if not shared else ():
                ax.axvline(r, color=colour, linestyle="--", linewidth=1, alpha=0.7)
    for ax, name in zip(axes, ("AC_t", "AA_t (%)"), strict=True):
        for r in series[0].replacement_tasks if shared else ():
            ax.axvline(r, color="grey", linestyle="--", linewidth=1)
        _task_axis(ax, longest)
        ax.set_xlabel(f"task t, 0-{longest - 1} (dashed: model replacement)")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[0].set_ylim(-0.03, 1.03)
    fig.suptitle(f"{scenario} · {dataset}: AC_t and AA_t, mean ± one std over seeds", fontsize=10)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=columns, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, legend_height / height, 1, 1))
    return fig


def _summary(plt, scenario: str, dataset: str, series: list[Series]):
    """AC, AA and ACA of every experiment as horizontal bars, mean ± one std (ddof = 1) over seeds."""
    fig, axes = plt.subplots(1, 3, sharey=True, figsize=(13, 1.4 + 0.4 * len(series)))
    rows = np.arange(len(series))
    colours = _colours(plt, len(series))
    for ax, (key, name, top, digits) in zip(axes, SUMMARY_METRICS, strict=True):
        for row, colour, s in zip(rows, colours, series, strict=True):
            values = [r["metrics"][key] for r in s.runs if r["metrics"].get(key) is not None]
            if not values:
                ax.text(0, row, " n/a", va="center", fontsize=7)
                continue
            mean, std = float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
            ax.barh(row, mean, xerr=std, color=colour, capsize=3, height=0.7)
            ax.text(mean + std + 0.02 * top, row, f"{mean:.{digits}f} ± {std:.{digits}f}", va="center", fontsize=7)
        ax.set_xlim(0, 1.3 * top)
        ax.set_xticks(np.linspace(0, top, 5))
        ax.set_title(name, fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(rows, [f"{s.label} · {_seeds(s)}" for s in series], fontsize=8)
    axes[0].invert_yaxis()
    fig.suptitle(f"{scenario} · {dataset}: mean ± one std over seeds", fontsize=10)
    fig.tight_layout()
    return fig


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)


def save_comparison_plots(groups: dict[tuple[str, str, str], list[RunRecord]],
                          directory: str | Path) -> list[Path]:
    """For each (scenario, data set) of ``groups`` (:func:`cl2r_bench.reporting.experiments.experiment_groups`, one
    entry per
    experiment, so runs of different settings are separate series and never averaged), write
    ``<scenario>_<dataset>curves_figure.png`` (AC_t and AA_t) and ``<scenario>_<dataset>_summary.png`` (AC, AA, ACA)."""
    plt = _pyplot()
    written = []
    for (scenario, dataset), series in experiment_series(groups).items():
        for kind, draw in (("curves", curves_figure), ("summary", _summary)):
            fig = draw(plt, scenario, dataset, series)
            path = Path(directory) / f"{_slug(scenario)}_{_slug(dataset)}_{kind}.png"
            _save(fig, path)
            plt.close(fig)
            written.append(path)
    return written


def plot_results(results_dir: str | Path, out_dir: str | Path) -> tuple[list[Path], list[Path], list[tuple[Path, str]]]:
    """Redraw each complete run's figures next to its ``metrics.json`` and write the comparison figures of
    :func:`save_comparison_plots` to ``out_dir``; returns ``(run figures, comparison figures, skipped)``.

    Records are read and checked as the leaderboard does (:func:`benchmarks.record.checked_records`), plus
    :func:`figure_problem`; a skipped file comes with its one-line reason. No training, no model is loaded."""
    records, run_figures, skipped = [], [], []
    for path, record, problem in checked_records(results_dir):
        problem = problem or figure_problem(record)
        if problem:
            skipped.append((path, problem))
            continue
        records.append(record)
        run_figures += save_plots(record, path.parent)
    comparisons = save_comparison_plots(experiment_groups(records), out_dir) if records else []
    return run_figures, comparisons, skipped
