"""``runner.py plot RESULTS``: every complete run's figures redrawn from its record, and the comparison figures."""
from __future__ import annotations

import argparse
from pathlib import Path

from cl2r_bench.app.results_folder import existing_folder, refuse_nothing_read
from cl2r_bench.errors import UsageError


def command_plot(args: argparse.Namespace) -> int:
    """Redraw each complete run's figures and draw comparisons (``cl2r_bench.reporting.plots.plot_results``) from the
    records alone, so figures follow plotting fixes and compare experiments without retraining."""
    from cl2r_bench.reporting.plots import plot_results

    results = existing_folder(args.results_dir)
    out = Path(args.out) if args.out else results / "plots"
    try:
        run_figures, comparisons, skipped = plot_results(results, out)
    except OSError as exc:
        raise UsageError(f"cannot write {exc.filename or out}: {exc.strerror or exc}; pass a writable --out "
                         "and check the run folders' permissions") from None
    refuse_nothing_read(skipped, bool(comparisons), results, "plot")
    print(f"redrew {len(run_figures)} run figure(s) next to their metrics.json")
    for path in comparisons:
        print(path)
    return 0
