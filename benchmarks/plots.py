"""Figures saved next to ``metrics.json``: the compatibility matrix heatmap and the AA_t curve (replacement tasks
marked). matplotlib is imported here only, with the file-only Agg backend.

Heatmap cells show ``M[t][k]`` in percent; with a ``noise`` object (``benchmarks/noise.py``) also the half-width
of the entry's interval, and the pair's decision: red solid box = incompatible beyond noise, orange dashed box =
within noise, red text = a violation of the plain (noise-blind) criterion."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .records import atomic_write


def _save(fig, path: Path) -> None:
    """Write a figure as PNG atomically, like every result file."""
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=120))


def save_plots(record: dict[str, Any], directory: str | Path) -> list[Path]:
    """Write ``compatibility_matrix.png`` and ``aa_per_task.png`` for a ``metrics.json`` record."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory = Path(directory)
    matrix = np.array([[np.nan if v is None else 100 * v for v in row] for row in record["compatibility_matrix"]])
    size = len(matrix)
    violations = {tuple(v) for v in record["metrics"]["violations"]}
    title = f"{record.get('method', record['strategy'])} · {record['scenario']} · {record['dataset']} · seed {record['seed']}"

    noise = record.get("noise")
    decisions = {tuple(d["pair"]): d["decision"] for d in noise["pair_decisions"]} if noise else {}
    fig, ax = plt.subplots(figsize=(1.0 + 0.8 * size, 0.8 + 0.65 * size))
    ax.imshow(np.ma.masked_invalid(matrix), cmap="viridis")
    bright = np.nanmin(matrix) + 0.6 * (np.nanmax(matrix) - np.nanmin(matrix))
    for t in range(size):
        for k in range(t + 1):
            bad = (t, k) in violations
            text = f"{matrix[t, k]:.1f}"
            if noise:
                low, high = noise["entry_intervals"][t][k]
                text += f"\n±{50 * (high - low):.1f}"
            ax.text(k, t, text, ha="center", va="center", fontsize=7 if noise else 8,
                    color="red" if bad else "black" if matrix[t, k] > bright else "white",
                    fontweight="bold" if bad else "normal")
            decision = decisions.get((t, k), "incompatible" if bad and not noise else None)
            if decision in ("incompatible", "within_noise"):
                ax.add_patch(plt.Rectangle((k - 0.5, t - 0.5), 1, 1, fill=False, linewidth=2,
                                           edgecolor="red" if decision == "incompatible" else "orange",
                                           linestyle="-" if decision == "incompatible" else "--"))
    ticks = [f"{i + 1}{'*' if i in record['replacement_tasks'] else ''}" for i in range(size)]
    ax.set_xticks(range(size), ticks)
    ax.set_yticks(range(size), ticks)
    ax.set_xlabel("gallery model k (* = replacement)")
    ax.set_ylabel("query model t")
    m = record["metrics"]
    summary = f"AC {m['AC']:.3f}  AA {m['AA']:.2f}  (red: M[t][k] ≤ M[k][k])"
    if noise:
        low, high = noise["AC_interval"]
        outside = "n/a" if noise["AC_outside_noise"] is None else f"{noise['AC_outside_noise']:.3f}"
        summary = (f"AC {m['AC']:.3f} [{low:.3f}, {high:.3f}], outside noise {outside}  AA {m['AA']:.2f}\n"
                   f"± = half {noise['confidence']:.0%} interval; box: red incompatible beyond noise, "
                   f"orange within noise ({noise['within_noise']} of {noise['pairs']})")
    ax.set_title(f"{title}\n{summary}", fontsize=7)
    fig.tight_layout()
    heatmap = directory / "compatibility_matrix.png"
    _save(fig, heatmap)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 3.2))
    tasks = np.arange(1, size + 1)
    ax.plot(tasks, m["AA_per_task"], marker="o")
    for r in record["replacement_tasks"]:
        ax.axvline(r + 1, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("task (dashed: model replacement)")
    ax.set_ylabel("AA_t (%)")
    ax.set_title(title, fontsize=8)
    fig.tight_layout()
    curve = directory / "aa_per_task.png"
    _save(fig, curve)
    plt.close(fig)
    return [heatmap, curve]


def save_backfilling_plot(record: dict[str, Any], directory: str | Path) -> Path:
    """Write ``backfilling.png``: accuracy against the backfilled fraction β for each order of a model_update run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fill = record["backfilling"]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for order, curve in fill["curves"].items():
        if curve is not None:
            ax.plot(fill["betas"], [100 * v for v in curve], marker="o", markersize=3,
                    label=f"{order} (area {100 * fill['area'][order]:.1f})")
    ax.set_xlabel("backfilled fraction β")
    ax.set_ylabel("top-1 accuracy (%)")
    ax.set_title(f"{record['method']} · {record['dataset']} · seed {record['seed']}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(directory) / "backfilling.png"
    _save(fig, path)
    plt.close(fig)
    return path
