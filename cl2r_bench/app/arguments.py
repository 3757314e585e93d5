"""Command line of the suite.

    python runner.py --scenario iamcl2r --strategy dsimplex_hoc [--dataset cifar100] [--preset NAME] ...
    python runner.py pretrain --dataset tinyimagenet --strategy er        # make (and cache) replacement models
    python runner.py sweep --strategy er dsimplex_hoc --seeds 0 1 2 --jobs 2  # a grid, one process per run
    python runner.py metrics FILE [--json] [--tie-rule strict|inclusive] [--scale auto|fraction|percent]
    python runner.py --scenario model_update --dataset tinyimagenet --adapter all   # old vs new model + adapters
    python runner.py adapt --train TRAIN --test TEST --adapter all      # adapters on the user's own embeddings
    python runner.py list                                                # what can be run, one line each
    python runner.py leaderboard [--results DIR] [--format github|csv|latex] [--table NAME] [--timing] [--matrices]
    python runner.py compare RESULTS_DIR A B         # does A beat B beyond noise? (--against-best FIGURE: all vs best)
    python runner.py plot RESULTS_DIR [--out DIR]      # redraw each run's figures, compare experiments
    python runner.py report RESULTS_DIR [--out FILE.html]   # one self-contained HTML page of the results
    python runner.py pages [ROOT ...] [--check]        # write (check) the pages' tables from their records

Usage errors print one line and exit with code 2; an interrupted run keeps every finished task (``--resume``); a
diverged run (NaN or infinite loss, weights or features) prints one line, exits with code 3 and keeps the tasks
finished before it, never marked complete; a strategy whose own code fails mid-run (it raises, or its loss is not a
scalar tensor with a gradient) does the same with code 4, its traceback in the run folder's ``error.log``.
"""
from __future__ import annotations

import argparse

from cl2r_bench.app.run_options import add_run_options
from cl2r_bench.limits import JOBS_MAX, count_argument, number, seed_argument
from cl2r_bench.plugins import PLUGIN_KINDS

COMMANDS = ("run", "pretrain", "embed", "sweep", "metrics", "leaderboard", "compare", "plot", "report", "pages",
            "list", "adapt")


class OneLineParser(argparse.ArgumentParser):
    """argparse with bad input as one line (what is wrong and where the options are listed), exit code 2, instead
    of the whole usage block; every subcommand's parser is one too."""

    def error(self, message: str) -> None:
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="runner.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    run = sub.add_parser("run", help="train and evaluate (the default command)")
    add_run_options(run)
    run.add_argument("--resume", action="store_true", help="continue an interrupted run after its last task")
    run.add_argument("--overwrite", action="store_true", help="discard an earlier run in the same folder")
    parser.epilog = ("The run options (the default command: `runner.py --scenario ...` is `runner.py run "
                     "--scenario ...`):\n\n" + run.format_help().split("\n\n", 1)[1])
    pre = sub.add_parser("pretrain", help="pretrain (or find cached) replacement models for a configuration")
    add_run_options(pre)
    met = sub.add_parser("metrics", help="AC / AA / ACA / BC / FC of a compatibility matrix in a JSON file")
    met.add_argument("file", help="JSON: a list of rows, or an object with 'compatibility_matrix'")
    met.add_argument("--json", action="store_true", help="print one JSON object keyed by metric name")
    met.add_argument("--tie-rule", default="strict", choices=["strict", "inclusive"])
    met.add_argument("--scale", default="auto", choices=["auto", "fraction", "percent"],
                     help="how entries are written: fraction in [0, 1], percent in [0, 100], or auto (either, "
                     "refusing a matrix that mixes them)")
    met.add_argument("--queries", type=count_argument,
                     help="queries behind each entry: adds the noise analysis (binomial; "
                     "benchmarks/noise.py)")
    met.add_argument("--replacement-tasks", type=number(int, at_least=0), nargs="*", default=[],
                     help="replacement tasks, for the noise analysis of the pairs across replacements")
    board = sub.add_parser("leaderboard", help="one row per experiment, mean ± std over seeds",
                           description="Tables of every complete metrics.json under --results. A csv output is "
                           "always one table: --table NAME chooses it; without --table it is the table --timing "
                           "or --matrices asks for, else main, and stderr names the other tables there are.")
    board.add_argument("--results", default="results", help="folder searched for metrics.json files")
    board.add_argument("--format", default="github", choices=["github", "csv", "latex"],
                       help="github: markdown (default); latex: booktabs tabulars, ready to paste; csv: one table, "
                       "mean and std in columns NAME_mean, NAME_std, 12 significant digits")
    board.add_argument("--table", metavar="NAME",
                       help="print only this table: main, noise, replacements, retrieval (the adapter studies' cases), "
                       "backfilling (their AUCs, zero-shot retention and the adapters' diagnostics such as f(W)), "
                       "timing, across, margins (each pair's margin split into the query model's own gain and its "
                       "cross gap, within segments and across replacements), terms (each loss term's first and last "
                       "epoch over the tasks with an older model, and where it never acted) or matrices (the mean "
                       "matrices; in csv, "
                       "rows scenario, dataset, strategy, t, k, mean, std, seeds)")
    board.add_argument("--timing", action="store_true",
                       help="also print each strategy's training time per iteration and its ratio to --baseline")
    board.add_argument("--baseline", default="er", help="the strategy --timing compares with (default %(default)s)")
    board.add_argument("--matrices", action="store_true",
                       help="also print AC / ACA across replacements and every mean compatibility matrix")
    board.add_argument("--published", action="store_true",
                       help="also print the papers' own figures for the scenarios present (IAM-CL2R's released runs; "
                       "the λ-orth and ml-fct tables), as tables apart from the suite's rows, with their source")
    versus = sub.add_parser("compare", help="whether experiment A beats B beyond noise (seeds and queries) on AC, "
                            "AA, ACA, top-1 and negative flips", description="Paired by seed where the seeds share "
                            "their class order and queries, the queries resampled together inside each seed "
                            "(docs/evaluation.md, 'Comparing two experiments').")
    from cl2r_bench.app.compare_command import add_compare_options

    add_compare_options(versus)
    plot = sub.add_parser("plot", help="redraw every complete run's figures from its metrics.json and draw "
                          "comparison figures (AC_t / AA_t curves, AC / AA / ACA summary) per scenario and data set")
    plot.add_argument("results_dir", help="folder searched for metrics.json files")
    plot.add_argument("--out", help="folder of the comparison figures (default RESULTS_DIR/plots)")
    page = sub.add_parser("report", help="one self-contained HTML page of every complete run: sortable leaderboards, "
                          "heatmaps, curves, the published figures beside them, links to each run's files")
    page.add_argument("results_dir", help="folder searched for metrics.json files")
    page.add_argument("--out", help="the HTML file to write (default RESULTS_DIR/report.html)")
    pages = sub.add_parser("pages", help="write the tables of the result pages from their records: every block "
                           "marked <!-- generated by: COMMAND --> in a .md file, by its command, one of the suite's "
                           "table commands (a page is data: docs/commands.md#pages)")
    pages.add_argument("roots", nargs="*", default=["results"], metavar="ROOT", help="folders of pages or single "
                       "pages (default results); commands run from the current folder")
    pages.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each block that differs "
                       "from what its command prints now")
    sweep = sub.add_parser("sweep", help="a grid of runs (several scenarios, strategies, adapters, data sets and "
                           "seeds), one process per run: complete runs are skipped, interrupted ones resumed")
    add_run_options(sweep, several=True)
    from cl2r_bench.app.slurm import add_slurm_options
    from cl2r_bench.app.sweep import LAUNCHERS

    sweep.add_argument("--launcher", default="local", choices=LAUNCHERS, help="local: a pool of processes on this "
                       "machine, one GPU each when there are several; slurm: one SLURM job array (submitit)")
    sweep.add_argument("--jobs", type=number(int, at_least=1, at_most=JOBS_MAX), default=1,
                       help="runs at a time with --launcher local (default %(default)s)")
    sweep.add_argument("--max-runs", type=count_argument, default=1000,
                       help="refuse a grid of more runs than this before "
                       "planning it (default %(default)s), so a typo in a grid never plans for hours")
    add_slurm_options(sweep)
    embed = sub.add_parser("embed", help="embed a model-update study's splits with its two encoders into the feature "
                           "cache, in shards spread over processes (torchrun ranks, a SLURM job array)")
    add_run_options(embed)
    from cl2r_bench.app.embedding import add_embed_options

    add_embed_options(embed)
    add_slurm_options(embed)
    adapt = sub.add_parser("adapt", help="fit adapters on your own old and new embeddings and measure them by the "
                           "adapter papers' leave-one-out protocol (docs/METHODS.md §7b)",
                           description="TRAIN and TEST are each a .npz holding arrays old (N x d_old), new (N x d_new) "
                           "and labels (N), or a folder holding old.npy, new.npy and labels.npy (or .pt tensors). The "
                           "adapters are fitted on TRAIN; TEST is query and gallery, each query's own item left out.")
    fitting = adapt.add_mutually_exclusive_group(required=True)
    fitting.add_argument("--train", help="the fitting split's embeddings (.npz or folder)")
    fitting.add_argument("--train-old", metavar="OLD", help="without pairs: the old model's embeddings of some items "
                         "(.npy or .pt, N x d_old), with --train-new: the new model's of other items; no labels; only "
                         "adapters fitted without pairs (model_update.pairing=unpaired, docs/adapters.md)")
    adapt.add_argument("--train-new", metavar="NEW", help="with --train-old: the new model's embeddings of other items "
                       "(.npy or .pt, M x d_new)")
    adapt.add_argument("--test", required=True, help="the evaluation split's embeddings (.npz or folder)")
    adapt.add_argument("--adapter", required=True, nargs="+", help="one or more adapters (runner.py list), 'none' "
                       "(no adapter), or 'all' (none and every adapter)")
    adapt.add_argument("--seeds", type=seed_argument, nargs="+",
                       help="fit seeds (default: the seed of configs/default.yaml)")
    adapt.add_argument("--name", help="the study's name in results folders (default: TRAIN's file name)")
    adapt.add_argument("--queries", type=count_argument, metavar="N", help="rank a seeded sample of N queries against "
                       "the whole gallery, with the sampling noise as a 95%% interval (model_update.queries; default: "
                       "every query)")
    adapt.add_argument("--json", action="store_true", help="print one JSON line per adapter and seed, then one with "
                       "the summary and the recommendation")
    adapt.add_argument("--output", help="results folder: records go to OUTPUT/adapt/NAME/ADAPTER/seedK/ (default: "
                       "the output of configs/default.yaml)")
    adapt.add_argument("--export", metavar="DIR", help="write each fitted adapter (last seed) to DIR/ADAPTER/: state "
                       "dict, torch.export programs (.pt2) and a README snippet for a production system")
    adapt.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="adapter parameters "
                       "(adapter_params.NAME.KEY=VALUE) or model_update.KEY=VALUE for backfill_orders, backfill_steps, "
                       "unmatched_queries, per_class_cmc, queries, stream_rows, screen, unseen_classes, pairing")
    adapt.add_argument("--plugin", action="append", default=[], metavar="FILE", help="a Python file that registers "
                       f"{PLUGIN_KINDS}, e.g. your own adapter (repeatable; docs/plugins.md)")
    adapt.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (fitting and scoring)")
    adapt.add_argument("--resume", action="store_true", help="keep each adapter and seed whose record an earlier "
                       "run with the same settings finished in OUTPUT, and measure only the others")
    adapt.add_argument("--no-progress", action="store_true", help="no progress bar while a ranking runs (shown on a "
                       "terminal only)")
    listing = sub.add_parser("list", help="what can be run: the scenarios, strategies, adapters, presets and data "
                             "sets, one line each")
    from cl2r_bench.app.list_command import add_list_options

    add_list_options(listing)
    return parser
