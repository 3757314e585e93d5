"""One table over the runs of a scale study: a row per (run folder, strategy), read from each metrics.json.

    python -m tools.scale_summary results/fidelity-runs > results/fidelity/summary.md

Columns: backbone, epochs per task, the run's seed, whether the replacement models share one initialisation,
their own accuracy (percent, at each replacement task), AC with its 95% interval over query resamples, AC outside
noise / upper, pairs within noise, the same across replacements, AA, ACA and the number of queries
(benchmarks/noise.py defines the noise columns).
"""
from __future__ import annotations

import sys
from pathlib import Path

from tabulate import tabulate

from benchmarks.record import RunRecord
from cl2r_bench.reporting.experiments import collect

HEADERS = ["scale", "strategy", "backbone", "epochs/task", "seed", "replacement init", "replacements' own acc. (%)",
           "AC", "AC 95% interval", "AC outside noise", "AC upper", "within noise", "across: outside noise",
           "across: upper", "across: within noise", "AA (%)", "ACA (%)", "queries"]


def row(scale: str, record: RunRecord) -> list:
    noise, m, cfg = record["noise"], record["metrics"], record["config"]
    own = " / ".join(f"{100 * r['own_accuracy']:.1f}" for r in record["replacement_models"] if "own_accuracy" in r)
    seeds = cfg["replacement"]["pretrain"]["seed"]
    init = "shared" if isinstance(seeds, int) or len(set(seeds)) == 1 else "independent"
    return [scale, record.get("method", record["strategy"]), cfg["model"]["backbone"], cfg["training"]["epochs"],
            cfg["seed"], init, own,
            f"{m['AC']:.3f}", f"[{noise['AC_interval'][0]:.3f}, {noise['AC_interval'][1]:.3f}]",
            f"{noise['AC_outside_noise']:.3f}", f"{noise['AC_upper']:.3f}", f"{noise['within_noise']}/{noise['pairs']}",
            f"{noise['across']['AC_outside_noise']:.3f}", f"{noise['across']['AC_upper']:.3f}",
            f"{noise['across']['within_noise']}/{noise['across']['pairs']}", f"{m['AA']:.2f}", f"{m['ACA']:.2f}",
            noise["queries"]]


def main(root: str) -> None:
    rows = []
    for scale in sorted(p for p in Path(root).iterdir() if p.is_dir()):
        records, _ = collect(scale)
        rows += [row(scale.name, r) for r in records if r.get("noise")]
    rows.sort(key=lambda r: (r[2], r[3], r[1], r[4]))
    print(tabulate(rows, headers=HEADERS, tablefmt="github", disable_numparse=True))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "results/fidelity-runs")
