"""The opening line of a stream study's report section: which strategy keeps the most compatible pairs, which has
the best accuracy, and which keep no pair compatible beyond noise (docs/METHODS.md §2 for AC / AA / ACA, §5 for the
noise-aware AC); for the two-model protocol (``upgrade``, §6c), whether any new model beats the old one on its
gallery. It reads the leaderboard's rows and groups, so the line and the tables below it cannot disagree."""
from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks.record import RunRecord

from .experiments import result_groups
from .leaderboard import leaderboard_rows, noise_rows

TWO_MODEL_CASES = ("old/old", "new/old", "new/new")


def _mean(cell: Any) -> float | None:
    return None if cell is None else float(cell[0])


def stream_verdict(records: list[RunRecord]) -> str:
    """One paragraph on a section's stream experiments (means over seeds): the most compatible experiment (by the
    share of pairs compatible beyond noise where the runs measured it, else by AC; then AA), the most accurate one
    when it differs, both among the experiments with the most seeds (a mean of fewer is noisier, so it is named
    apart, not ranked), and the experiments with no pair compatible beyond noise; empty without stream records."""
    rows = leaderboard_rows(records)
    if not rows:
        return ""
    beyond = {row[2]: row[5] for row in noise_rows(records)}
    summary = {row[2]: {"AC": _mean(row[3]), "AA": _mean(row[4]), "ACA": _mean(row[5]), "seeds": row[-1],
                        "beyond": beyond.get(row[2])} for row in rows}

    def described(name: str) -> str:
        item = summary[name]
        parts = [f"AC {item['AC']:.3f}"]
        if item["beyond"] is not None:
            parts.append(f"{item['beyond']:.3f} beyond noise")
        parts += [f"AA {item['AA']:.1f} %" if item["AA"] is not None else "",
                  f"ACA {item['ACA']:.1f} %" if item["ACA"] is not None else "",
                  f"{item['seeds']} seed{'s' * (item['seeds'] > 1)}"]
        return f"{name} ({', '.join(p for p in parts if p)})"

    def compatibility(name: str) -> tuple[float, float]:
        item = summary[name]
        return (item["beyond"] if item["beyond"] is not None else item["AC"] or 0.0), item["AA"] or 0.0

    most_seeds = max(item["seeds"] for item in summary.values())
    ranked = [name for name, item in summary.items() if item["seeds"] == most_seeds]
    most_compatible = max(ranked, key=compatibility)
    most_accurate = max(ranked, key=lambda name: summary[name]["AA"] or 0.0)
    lines = [f"most compatible: {described(most_compatible)}."]
    if most_accurate != most_compatible:
        lines.append(f"Most accurate: {described(most_accurate)}.")
    fewer = sorted(set(summary) - set(ranked))
    if fewer:
        counts = ", ".join(f"{name} ({summary[name]['seeds']})" for name in fewer)
        lines.append(f"Ranked among the experiments with {most_seeds} seeds; not ranked, with fewer: {counts}.")
    never = [name for name, item in summary.items() if item["beyond"] == 0.0]
    if never:
        lines.append(f"No pair compatible beyond noise: {', '.join(sorted(never))}.")
    return " ".join(lines)


def two_model_verdict(records: list[RunRecord]) -> str:
    """One paragraph on a section's two-model (``upgrade``) experiments, means over seeds: how many meet the BCT
    criterion (new/old top-1 above old/old), and which comes closest; the per-task matrix of a two-task run says
    little, so the stream's AC is not the answer here. Experiments the protocol makes one result are counted once,
    under the leaderboard's name for them (:func:`result_groups`). Empty without ``two_model`` records."""
    groups = {label: [r["two_model"]["cases"] for r in runs if r.get("two_model")]
              for (_, _, label), runs in result_groups(records).items()}
    means = {label: {case: float(np.mean([c[case]["top1"] for c in cases])) for case in TWO_MODEL_CASES}
             for label, cases in groups.items() if cases}
    if not means:
        return ""
    def gap(label: str) -> float:
        return means[label]["new/old"] - means[label]["old/old"]

    best = max(means, key=gap)
    seeds = {label: len(cases) for label, cases in groups.items()}
    above = sorted(label for label in means if gap(label) > 0)
    head = (f"{len(above)} of {len(means)} experiments meet the BCT criterion (new/old top-1 above old/old): "
            f"{', '.join(above)}." if above else
            "no experiment meets the BCT criterion (new/old top-1 above old/old), on the means over seeds.")
    closest = (f"Closest: {best}, new/old {means[best]['new/old']:.2f} against old/old {means[best]['old/old']:.2f} "
               f"({gap(best):+.2f} points; new/new {means[best]['new/new']:.2f}; "
               f"{seeds[best]} seed{'s' * (seeds[best] > 1)}).")
    per_task = sum(1 for row in leaderboard_rows(records) if row[2] in means and (_mean(row[3]) or 0.0) == 1.0)
    matrix = (f"The per-task matrix asks another question (new/old on the old classes only, their test images "
              f"against their training images, §6c): there {per_task} of {len(means)} have new/old above old/old in "
              "every seed.")
    return f"{head} {closest} The two-model table below has every experiment. {matrix}"
