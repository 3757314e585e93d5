"""``runner.py leaderboard --results DIR``: one row per experiment of a results folder, in the tables asked for."""
from __future__ import annotations

import argparse
import sys

from cl2r_bench.app.results_folder import existing_folder, refuse_nothing_read
from cl2r_bench.errors import UsageError


def command_leaderboard(args: argparse.Namespace) -> int:
    """Print the tables asked for in ``--format``; a csv output is one table (``--table``, else the one ``--timing``
    or ``--matrices`` asks for, else main), the others there are named on stderr, so that a csv never mixes
    tables."""
    from cl2r_bench.reporting.experiments import collect
    from cl2r_bench.reporting.leaderboard import SUMMARY, TABLES, build
    from cl2r_bench.reporting.published_tables import published_tables
    from cl2r_bench.reporting.tables import render

    if args.table is not None and args.table not in TABLES:
        raise UsageError(f"unknown table {args.table!r}; choose one of {', '.join(TABLES)}")
    extra = [name for name, asked in (("timing", args.timing), ("across", args.matrices),
                                      ("matrices", args.matrices)) if asked]
    if args.format == "csv" and args.published:
        raise UsageError("--published adds tables apart from the measured ones, and a csv holds one table: use "
                         "--format github or latex with --published")
    if args.format == "csv" and args.table is None and args.timing and args.matrices:
        raise UsageError("--format csv prints one table but --timing and --matrices ask for several; choose one "
                         "with --table timing, --table across or --table matrices")
    existing_folder(args.results, "; pass --results DIR")
    records, skipped = collect(args.results)
    refuse_nothing_read(skipped, bool(records), args.results)
    built = build(records, args.format, baseline=args.baseline)
    papers = published_tables(records) if args.published else []
    if papers:
        built["published"] = papers
    if args.table is None and args.format != "csv":
        names = [name for name in (*SUMMARY, *extra, "published") if name in built]
        for name in extra:
            if name not in built:
                print(f"note: no table {name}: no run under {args.results} has data for it", file=sys.stderr)
    else:
        names = [args.table or next((name for name in extra if name != "across"), "main")]
        names += ["published"] if args.published and "published" in built else []
        if names[0] not in built:
            raise UsageError(f"no run under {args.results} has data for table {names[0]}; tables with rows here: "
                             f"{', '.join(built)}")
        others = [name for name in built if name not in names]
        if args.table is None and others:
            print(f"note: --format csv prints one table ({names[0]}); also here: {', '.join(others)}; print one "
                  "with --table NAME", file=sys.stderr)
    print(render([table for name in names for table in built[name]], args.format))
    return 0
