"""``runner.py metrics FILE``: AC, AA, ACA, BC and FC of any compatibility matrix (docs/METHODS.md §3), with the
noise analysis when the query count is given."""
from __future__ import annotations

import argparse
import json

from cl2r_bench.errors import UsageError
from cl2r_bench.reporting.tables import figure_or_na


def command_metrics(args: argparse.Namespace) -> int:
    from benchmarks.metrics import all_metrics, load_matrix

    matrix = load_matrix(args.file, scale=args.scale)
    outside = [t for t in args.replacement_tasks if not 0 <= t < len(matrix)]
    if outside:
        raise UsageError(f"--replacement-tasks {' '.join(map(str, outside))}: the matrix has {len(matrix)} tasks, "
                         f"numbered 0 to {len(matrix) - 1}")
    if args.replacement_tasks and args.queries is None:
        raise UsageError("--replacement-tasks is read by the noise analysis: add --queries N")
    metrics = all_metrics(matrix, args.tie_rule)
    if args.queries is not None:
        from benchmarks.noise import noise_metrics

        metrics["noise"] = noise_metrics(matrix, args.queries, replacement_tasks=args.replacement_tasks,
                                         tie_rule=args.tie_rule)
    if args.json:
        from cl2r_bench.files import strict_json

        print(json.dumps(strict_json(metrics), allow_nan=False))
        return 0
    from tabulate import tabulate

    rows = [[k, v if not isinstance(v, float) else round(v, 4)] for k, v in metrics.items()
            if k not in ("violations", "ACA_definition", "noise")]
    noise = metrics.get("noise")
    if noise:
        interval = [round(v, 4) for v in noise["AC_interval"]]
        rows += [[f"AC {noise['confidence']:.0%} interval ({noise['method']})", interval],
                 ["AC outside noise / upper",
                  f"{figure_or_na(noise['AC_outside_noise'], 4)} / {figure_or_na(noise['AC_upper'], 4)}"],
                 ["pairs within noise", f"{noise['within_noise']} of {noise['pairs']}"]]
    rows.append(["violations (t, k)", metrics["violations"]])
    print(tabulate(rows, headers=["metric", "value"]))
    print(f"ACA = {metrics['ACA_definition']}")
    return 0
