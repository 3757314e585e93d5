"""``runner.py compare RESULTS A B``: whether experiment A beats experiment B beyond noise on every figure both hold;
``runner.py compare RESULTS --variants FIGURE``: every experiment's variants (``bct.incoming``, ``lce.authors``) against
it; and ``runner.py compare RESULTS --against-best FIGURE``: the best experiment on FIGURE against every other one,
experiments whose records are equal seed for seed one row as on the leaderboard (``bct = bct_er`` in ``upgrade``;
:func:`cl2r_bench.reporting.experiments.result_groups`) (:mod:`cl2r_bench.reporting.compare`)."""
from __future__ import annotations

import argparse

from cl2r_bench.errors import UsageError
from cl2r_bench.limits import RESAMPLES_MAX, number


def add_compare_options(parser: argparse.ArgumentParser) -> None:
    from cl2r_bench.reporting.compare import HIGHER_IS_BETTER

    parser.add_argument("results", help="folder searched for metrics.json files")
    parser.add_argument("experiments", nargs="*", metavar="EXPERIMENT", help="A and B: experiment names as the "
                        "leaderboard shows them (its strategy column), or SCENARIO/DATASET/NAME where a name is in "
                        "several scenarios or data sets")
    parser.add_argument("--against-best", metavar="FIGURE", choices=list(HIGHER_IS_BETTER),
                        help="compare the best experiment on FIGURE with every other one, in each scenario and data "
                        f"set; experiments with equal records are one row, as on the leaderboard (one of: "
                        f"{', '.join(HIGHER_IS_BETTER)})")
    parser.add_argument("--variants", metavar="FIGURE", choices=list(HIGHER_IS_BETTER),
                        help="compare every experiment named <name>.<variant> (another teacher arm: bct.incoming; the "
                        "authors' recipe: lce.authors) with the experiment <name>, on FIGURE and every figure both "
                        "hold")
    parser.add_argument("--confidence", type=number(float, above=0, below=1), default=0.95,
                        help="the intervals' level (default %(default)s)")
    parser.add_argument("--resamples", type=number(int, at_least=2, at_most=RESAMPLES_MAX), default=1000,
                        help="paired bootstrap draws of the queries (default %(default)s)")
    parser.add_argument("--format", default="github", choices=["github", "csv", "latex"])


def command_compare(args: argparse.Namespace) -> int:
    """Print the comparison table and its verdict line (or the table against the best)."""
    from cl2r_bench.app.results_folder import existing_folder, refuse_nothing_read
    from cl2r_bench.reporting.compare import against_best, against_variants, compare, comparison_table, verdict_line
    from cl2r_bench.reporting.experiments import collect, experiment_groups, result_groups
    from cl2r_bench.reporting.tables import render

    modes = [bool(args.against_best), bool(args.variants), len(args.experiments) == 2]
    if sum(modes) != 1 or len(args.experiments) not in (0, 2):
        raise UsageError("give two experiments, A and B, or --against-best FIGURE, or --variants FIGURE")
    existing_folder(args.results, "; pass the results folder first")
    records, skipped = collect(args.results)
    refuse_nothing_read(skipped, bool(records), args.results)
    if args.against_best or args.variants:
        if args.against_best:
            table = against_best(result_groups(records), args.against_best, confidence=args.confidence,
                                 resamples=args.resamples)
            empty = f"no scenario and data set under {args.results} holds two experiments with {args.against_best}"
        else:
            table = against_variants(experiment_groups(records), args.variants, confidence=args.confidence,
                                     resamples=args.resamples)
            empty = f"no experiment under {args.results} has a variant named <name>.<variant> with {args.variants}"
        if not table.rows:
            raise UsageError(empty)
        print(render([table], args.format))
        return 0
    groups = experiment_groups(records)
    (a_key, a_runs), (b_key, b_runs) = (find_experiment(groups, name) for name in args.experiments)
    if a_key[:2] != b_key[:2]:
        raise UsageError(f"{'/'.join(a_key)} and {'/'.join(b_key)} are experiments of different scenarios or data "
                         "sets; compare two of the same")
    differences = compare(a_runs, b_runs, confidence=args.confidence, resamples=args.resamples)
    if not differences:
        raise UsageError(f"the records of {a_key[2]} and {b_key[2]} keep no per-query hits to compare (records "
                         "before 2026-11-28); run them again")
    print(render([comparison_table(a_key[2], b_key[2], differences)], args.format))
    if args.format != "csv":
        print(f"\n{verdict_line(a_key[2], b_key[2], differences, args.confidence)}")
    return 0


def find_experiment(groups: dict, name: str) -> tuple[tuple[str, str, str], list]:
    """The experiment named ``name`` (its label, or ``scenario/dataset/label``); an unknown or ambiguous name is a
    :class:`UsageError` listing the names there are."""
    found = [(key, runs) for key, runs in groups.items() if name in (key[2], "/".join(key))]
    if len(found) == 1:
        return found[0]
    names = ", ".join(sorted({key[2] for key in groups}))
    if not found:
        raise UsageError(f"no experiment {name!r} in these results; the experiments: {names}")
    raise UsageError(f"{name!r} names experiments of several scenarios or data sets; write one of "
                     f"{', '.join('/'.join(key) for key, _ in found)}")
