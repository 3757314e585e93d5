"""``runner.py report RESULTS``: one HTML file of a results folder."""
from __future__ import annotations

import argparse
from pathlib import Path

from cl2r_bench.app.results_folder import existing_folder, refuse_nothing_read
from cl2r_bench.errors import UsageError


def command_report(args: argparse.Namespace) -> int:
    """Write the HTML report of a results folder (:mod:`cl2r_bench.reporting.report`); bad files are named on stderr."""
    from cl2r_bench.reporting.report import overwrite_problem, write_report

    results = existing_folder(args.results_dir)
    out = Path(args.out) if args.out else results / "report.html"
    problem = overwrite_problem(out)
    if problem:
        raise UsageError(problem)
    try:
        written, runs, skipped = write_report(results, out)
    except OSError as exc:
        raise UsageError(f"cannot write {exc.filename or out}: {exc.strerror or exc}; pass a writable --out") from None
    refuse_nothing_read(skipped, bool(runs), results, "report")
    print(f"{written} ({runs} runs)")
    return 0
