"""Every deployment of an adapter study on one figure: top-1 against what it costs to deploy (docs/METHODS.md §7b),
the deployments of :mod:`cl2r_bench.reporting.deployments` on one axis of cost, cheapest first, one colour per adapter.

The cost axis follows the answer's own cost rule (:data:`cl2r_bench.reporting.deployments.COST_ORDER`): keep the old
model; new queries through B against the untouched index; stored vectors rewritten through F without reading an
image, with new queries as they are or through B; both encoders per query against the untouched index; a share of
the images re-embedded (the share that reaches 95 % of new/new, in the adapter's legend entry); every image
re-embedded. old/old and new/new are the two ends, the same for every adapter, drawn as lines; each adapter's legend
entry carries its fit time. The figure answers where each adapter sits on accuracy against what its deployment
costs, which the summary table gives as numbers."""
from __future__ import annotations

from typing import Any

from benchmarks.record import DUAL_CASE

from .adapter_recommendation import BACKFILL_TARGET, AdapterSummary
from .deployments import COST_ORDER, deployments
from .plots import adapter_colour

STEP_LABELS = {"old/old": "keep the\nold model", "B/old": "new + B\nper query",
               "new/F": "stored vectors\nrewritten (F)", "B/F": "rewritten (F),\nnew + B per query",
               DUAL_CASE: "old + new\nper query",
               "backfilled": "a share of images\nre-embedded", "new/new": "every image\nre-embedded"}
ENDS = ("old/old", "new/new")


def deployment_points(rows: list[AdapterSummary],
                      runs: list[dict[str, Any]]) -> dict[str, list[tuple[int, float, str]]]:
    """``{adapter: [(cost step, top-1, note)]}``: each adapter's deployments between the two ends, at their step of
    :data:`COST_ORDER`; the note is the share of images a backfilled deployment re-embeds. An adapter with none is
    left out."""
    points = {}
    for row in rows:
        found = [(COST_ORDER.index(d.case), d.top1, f"{row.reembed_share:.0%}" if d.case == "backfilled" else "")
                 for d in deployments(row, runs) if d.case not in ENDS]
        if found:
            points[row.adapter] = found
    return points


def deployment_cost_figure(plt, title: str, rows: list[AdapterSummary], runs: list[dict[str, Any]]):
    """Top-1 of every deployment against its step of the cost axis (module docstring), the adapters side by side
    at each step; dashed: old/old, dotted: 95 % of new/new (the answer's target), solid: new/new."""
    points = deployment_points(rows, runs)
    cases = runs[0]["retrieval"]["cases"]
    old, new = cases["old/old"]["top1"], cases["new/new"]["top1"]
    fig, ax = plt.subplots(figsize=(7.0, 3.9 + 0.14 * len(points)))
    width = 0.6 / max(len(points), 1)
    fits = {row.adapter: row.fit_seconds for row in rows}
    for rank, (adapter, found) in enumerate(points.items()):
        shift = (rank - (len(points) - 1) / 2) * width
        shares = [f", re-embeds {note}" for _, _, note in found if note]
        ax.plot([step + shift for step, _, _ in found], [top1 for _, top1, _ in found], marker="o", linestyle="none",
                color=adapter_colour(plt, rows, adapter),
                label=f"{adapter} (fit {fits[adapter]:.0f} s{''.join(shares)})")
    ax.plot([0], [old], marker="s", color="black")
    ax.plot([len(COST_ORDER) - 1], [new], marker="s", color="black")
    ax.axhline(old, color="black", linestyle="--", linewidth=1)
    ax.axhline(BACKFILL_TARGET * new, color="grey", linestyle=":", linewidth=1)
    ax.axhline(new, color="grey", linestyle="-", linewidth=0.8)
    ax.set_xticks(range(len(COST_ORDER)), [STEP_LABELS[case] for case in COST_ORDER], fontsize=7)
    ax.set_xlim(-0.5, len(COST_ORDER) - 0.5)
    ax.set_xlabel("what the deployment costs, cheapest first")
    ax.set_ylabel(f"top-1 (%); dashed: old/old {old:.1f}, dotted: {BACKFILL_TARGET:.0%} of new/new {new:.1f}",
                  fontsize=7)
    ax.set_title(title, fontsize=9)
    if points:
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=2, frameon=False)
    fig.tight_layout()
    return fig
