"""The commands of the suite (their options and usage: :mod:`cl2r_bench.app.arguments`).

Usage errors print one line and exit with code 2; an interrupted run keeps every finished task (``--resume``); a
diverged run (NaN or infinite loss, weights or features) prints one line, exits with code 3 and keeps the tasks
finished before it, never marked complete; a strategy whose own code fails mid-run (it raises, or its loss is not a
scalar tensor with a gradient) does the same with code 4, its traceback in the run folder's ``error.log``.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

from cl2r_bench.app.arguments import COMMANDS, build_parser
from cl2r_bench.app.results_folder import existing_folder, refuse_nothing_read
from cl2r_bench.app.stops import exit_code, stop_handlers, stop_name
from cl2r_bench.errors import UsageError, writable_folder
from cl2r_bench.threads import own_threads

# Each command imports its parts inside its handler: they import timm and Avalanche (seconds), so --help, a usage
# error and the commands that read results answer without them (the parser's SLURM options import torch, 1.5 s).
COMMANDS_THAT_COMPUTE = ("run", "pretrain", "embed", "adapt")
"""The commands that train, embed or rank in their own process (:func:`take_job_threads`)."""
EXIT_DIVERGED = 3
EXIT_STRATEGY_FAILED = 4


def command_run(args: argparse.Namespace) -> int:
    """Run each asked configuration (one per seed); under torchrun every process runs them together and rank 0
    prints (:mod:`cl2r_bench.distributed`)."""
    from cl2r_bench.app.adapt_command import case_line
    from cl2r_bench.app.run_loop import Run
    from cl2r_bench.app.run_options import requested_runs
    from cl2r_bench.app.sweep import distinct_runs
    from cl2r_bench.distributed import leave, processes_note
    from cl2r_bench.reporting.leaderboard import tables

    try:
        parts = distinct_runs(requested_runs(args))
        runs = [Run(part, resume=args.resume, overwrite=args.overwrite) for part in parts]
        say = print if runs[0].main else (lambda *_, **__: None)
        records = []
        for run in runs:
            settings = run.settings
            say(f"== {settings.scenario} / {settings.dataset} / {run.parts.label} / seed {settings.seed} (preset "
                f"{settings.preset}, device {run.device}{processes_note(run.processes.world_size)}) -> {run.dir}")
            try:
                record = run.execute()
            except KeyboardInterrupt as stop:
                print(f"\nstopped ({stop_name(stop)}): finished tasks are saved in {run.dir}; continue with the same "
                      "command and --resume", file=sys.stderr)
                return exit_code(stop)
            if "retrieval" in record:
                r = record["retrieval"]
                say(case_line(settings.adapter.name, settings.seed, r["cases"], r["backfilling"]["auc"],
                              r["zero_shot"]))
            if "two_model" in record:
                say(two_model_line(record["two_model"]))
            if record.get("protocol") == "leave_one_out":
                records.append(record)
                continue
            m, noise = record["metrics"], record.get("noise")
            say(f"   AC {m['AC']:.3f}  AA {m['AA']:.2f}  ACA {_fmt(m['ACA'])}  BC {_fmt(m['BC'])}  "
                f"FC {_fmt(m['FC'])}  -> {run.dir / 'metrics.json'}")
            if noise:
                low, high = noise["AC_interval"]
                say(f"   AC {noise['confidence']:.0%} interval [{low:.3f}, {high:.3f}], outside noise "
                    f"{_fmt(noise['AC_outside_noise'], 3)} ({noise['within_noise']} of {noise['pairs']} pairs "
                    f"within noise, {noise['queries']} queries)")
            records.append(record)
        say()
        say(tables(records))
        say(study_answers(records))
        say(what_next(runs))
        return 0
    finally:
        leave()


def two_model_line(two_model: dict[str, Any]) -> str:
    """The two-model protocol's cases (top-1 / top-5 / mAP in percent) and negative flip rates in one line."""
    cases = "  ".join(f"{case} {c['top1']:.2f}/{c['top5']:.2f}/{c['mAP']:.2f}"
                      for case, c in two_model["cases"].items() if c)
    flips, classifier = two_model["negative_flips"], two_model.get("classification")
    line = (f"   two-model top-1/top-5/mAP %  {cases}  NFR self {100 * flips['mean_self']:.2f}% "
            f"cross {100 * flips['mean_cross']:.2f}%")
    return line + (f"  classifier NFR {100 * classifier['nfr']:.2f}%" if classifier else "")


def study_answers(records: list[dict[str, Any]]) -> str:
    """The summary and recommendation of each data set's adapter studies
    (:mod:`cl2r_bench.reporting.adapter_summary`), or
    nothing for runs without one."""
    from benchmarks.record import adapter_study
    from cl2r_bench.reporting.adapter_answer import summary_text

    studies: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        if adapter_study(record):
            studies.setdefault(record["dataset"], []).append(record)
    return "".join(f"\n{dataset}:\n{summary_text(group)}\n" for dataset, group in studies.items())


def what_next(runs: list[Any]) -> str:
    """The closing lines of a run command: where the figures are (when drawn, ``evaluation.plots``), the next
    commands, and on the generated data set what its numbers do and do not show."""
    output = runs[0].settings.output
    drawn = [run for run in runs if run.settings.evaluation.plots]
    lines = [""]
    if drawn:
        lines.append(f"figures: {drawn[-1].dir}/*.png" + (f" (and in the other {len(drawn) - 1} run folders)"
                                                          if len(drawn) > 1 else ""))
    lines.append(f"next: python runner.py leaderboard --results {output}  (one row per experiment);  python "
                 f"runner.py plot {output}  (comparison figures)")
    if runs[0].settings.dataset == "synthetic":
        lines.append("note: on the generated data these numbers show that the pipeline runs end to end, not the "
                     "papers' results (README, 'What the demo's numbers show')")
    return "\n".join(lines)


def _fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def command_sweep(args: argparse.Namespace) -> int:
    """Resolve every point of the grid (all bad input fails here, and with ``--launcher slurm`` a cluster that
    cannot take the jobs), then run what is not complete (:mod:`cl2r_bench.app.sweep`, :mod:`cl2r_bench.app.slurm`)."""
    from cl2r_bench.app.sweep import grid_runs, plan, run_local

    if args.seed is not None:
        raise UsageError("a sweep takes its seeds with --seeds K1 K2 ...")
    if args.launcher == "slurm":
        from cl2r_bench.app.slurm import check_cluster

        check_cluster(args)
    runs, output = grid_runs(args)
    writable_folder(output / "sweep", "the sweep's folder (inside --output)")
    jobs = plan(runs, output / "sweep")
    if args.launcher == "slurm":
        from cl2r_bench.app.slurm import run_slurm

        return run_slurm(jobs, args, output / "sweep" / "slurm")
    return run_local(jobs, parallel=args.jobs)


def command_embed(args: argparse.Namespace) -> int:
    """Embed the asked study's or track run's splits into the feature cache as this process's shards
    (:mod:`cl2r_bench.app.embedding`), or, with ``--launcher slurm``, as a job array followed to its end, then join
    what the tasks left."""
    from cl2r_bench.app.embedding import embed_study, mark_done, slurm_workers, this_worker
    from cl2r_bench.app.run_options import requested_runs
    from cl2r_bench.feature_cache import Sharding

    sharding = this_worker(args)
    runs = requested_runs(args)
    if len(runs) != 1 or not (runs[0].scenario.measures_features() or runs[0].settings.model.on_encoders):
        raise UsageError("runner.py embed embeds one model-update study of two encoders (--scenario model_update --set "
                         "model_update.old=SPEC --set model_update.new=SPEC) or the data of one run on frozen "
                         "encoders (--preset pretrained): one seed, one strategy or adapter")
    parts = runs[0]
    if args.launcher == "slurm" and args.worker is None:
        from cl2r_bench.app.slurm import check_cluster, run_slurm

        check_cluster(args)
        folder = Path(parts.settings.model_update.feature_cache) / "slurm"
        writable_folder(folder, "the feature cache's SLURM folder")
        code = run_slurm(slurm_workers(parts, args, folder), args, folder)
        if code != 0:
            print("embed: some array tasks failed; their shards are embedded here instead")
        sharding = Sharding(args.shards)
    embed_study(parts, sharding)
    mark_done(args.done_file)
    return 0


def command_pretrain(args: argparse.Namespace) -> int:
    """Find or pretrain the starting models of each asked run (the scenario's replacement or old/new models)."""
    from cl2r_bench.app.run_options import requested_runs
    from cl2r_bench.models import replacement_family

    done = set()
    for parts in requested_runs(args):
        settings = parts.settings
        if parts.scenario.measures_features():
            print(f"{settings.scenario} on encoder specs trains nothing: each split is embedded once per encoder into "
                  f"{settings.model_update.feature_cache} when it first runs")
            continue
        key = (settings.scenario, replacement_family(parts.head), settings.dataset,
               settings.replacement.pretrain.dataset)
        if key not in done:
            done.add(key)
            made = parts.scenario.starting_models(parts.scenario.stream(), parts.head, parts.device, print)
            if not made:
                print(f"{settings.scenario} starts from no pretrained model: nothing to pretrain (iamcl2r pretrains "
                      "its replacement models, model_update its old and new models)")
    return 0


def command_pages(args: argparse.Namespace) -> int:
    from cl2r_bench.app.pages import command_pages as pages

    return pages(args.roots, args.check, main)


def command_compare(args: argparse.Namespace) -> int:
    from cl2r_bench.app.compare_command import command_compare as compare

    return compare(args)


def command_adapt(args: argparse.Namespace) -> int:
    from cl2r_bench.app.adapt_command import command_adapt as adapt

    return adapt(args)


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
                 ["AC outside noise / upper", f"{_fmt(noise['AC_outside_noise'], 4)} / {_fmt(noise['AC_upper'], 4)}"],
                 ["pairs within noise", f"{noise['within_noise']} of {noise['pairs']}"]]
    rows.append(["violations (t, k)", metrics["violations"]])
    print(tabulate(rows, headers=["metric", "value"]))
    print(f"ACA = {metrics['ACA_definition']}")
    return 0


def command_leaderboard(args: argparse.Namespace) -> int:
    """Print the tables asked for in ``--format``; a csv output is one table (``--table``, else the one ``--timing``
    or ``--matrices`` asks for, else main), the others there are named on stderr, so that a csv never mixes
    tables."""
    from cl2r_bench.reporting.experiments import collect
    from cl2r_bench.reporting.leaderboard import SUMMARY, TABLES, build
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
    built = build(records, args.format, baseline=args.baseline, published=args.published)
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


def command_list(args: argparse.Namespace) -> int:
    from cl2r_bench.app.list_command import command_list as listing

    return listing(args)


def show_notices_as_one_line() -> None:
    """Print data notices (:class:`cl2r_bench.data.datasets.DataNotice`) and plug-in modules that failed to import
    (:class:`cl2r_bench.plugins.PluginNotice`) as ``notice: ...`` lines, once each."""
    import warnings

    from cl2r_bench.data.datasets import DataNotice
    from cl2r_bench.plugins import PluginNotice

    default = warnings.formatwarning
    if getattr(default, "prints_notices", False):
        return

    def formatted(message, category, *args, **kwargs) -> str:
        if issubclass(category, (DataNotice, PluginNotice)):
            return f"notice: {message}\n"
        return default(message, category, *args, **kwargs)

    formatted.prints_notices = True
    warnings.formatwarning = formatted
    warnings.simplefilter("once", DataNotice)
    warnings.simplefilter("once", PluginNotice)


def take_job_threads(args: argparse.Namespace) -> None:
    """A command that computes here, in a SLURM job the user started, takes the job's CPUs as its threads
    (:func:`cl2r_bench.threads.own_threads`); numba's kernels follow torch's count
    (:func:`benchmarks.ranking.numba_threads_as_torch`). torch is imported here, as each command's parts are in its
    handler, not with this module (the comment above :data:`COMMANDS`)."""
    threads = own_threads()
    if args.command in COMMANDS_THAT_COMPUTE and threads is not None:
        import torch

        torch.set_num_threads(threads)


def main(argv: list[str] | None = None) -> int:
    """Run one command of ``runner.py``; SIGINT and SIGTERM stop it cleanly whatever the process inherited
    (:mod:`cl2r_bench.app.stops`). Its output is line-buffered, also into a file or a pipe: a log holds each line as it
    is printed, so one read while the command runs, or left by a process killed later (SLURM's SIGKILL after a
    time limit, the out-of-memory killer), names every task that was trained."""
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)
    with stop_handlers():
        try:
            return _main(argv)
        except BrokenPipeError:  # the reader stopped (`runner.py list | head`): no traceback, no flush error at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS + ("-h", "--help"):
        argv = ["run"] + argv
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:  # --help, or bad input already printed in one line: its code, returned
        return exit_.code if isinstance(exit_.code, int) else 2
    if args.command is None:
        build_parser().print_help()
        return 0
    take_job_threads(args)
    from benchmarks.metrics import MatrixError
    from cl2r_bench.app.run_folder import RunError
    from cl2r_bench.app.run_loop import DivergedError, StrategyFailedError
    from cl2r_bench.data.datasets import DataError
    from cl2r_bench.distributed import LaunchError, torchrun_ranks
    from cl2r_bench.errors import ConfigError, PartError
    from cl2r_bench.files import FolderBusyError
    from cl2r_bench.models import CheckpointError
    from cl2r_bench.tracking import TrackingError

    show_notices_as_one_line()
    user_errors = (UsageError, ConfigError, DataError, CheckpointError, PartError, MatrixError, FolderBusyError,
                   TrackingError, LaunchError)
    try:
        if args.command not in ("run", "embed", "adapt") and torchrun_ranks() is not None:
            raise UsageError(f"torchrun runs one run data-parallel, one embedding in shards or one adapter study "
                             f"over a streamed gallery: use the run, embed or adapt command under it, and "
                             f"`runner.py {args.command}` in one process")
        handler = {"run": command_run, "pretrain": command_pretrain, "sweep": command_sweep,
                   "metrics": command_metrics, "leaderboard": command_leaderboard, "plot": command_plot,
                   "report": command_report,
                   "list": command_list, "adapt": command_adapt, "embed": command_embed,
                   "compare": command_compare, "pages": command_pages}[args.command]
        return handler(args)
    except DivergedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_DIVERGED
    except StrategyFailedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_STRATEGY_FAILED
    except user_errors + (RunError,) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:
        print(f"\nstopped ({stop_name(stop)}): what was finished is saved; {how_to_continue(argv)}", file=sys.stderr)
        return exit_code(stop)


def how_to_continue(argv: list[str]) -> str:
    """What continues an interrupted command (``argv`` with its command first): ``run`` and ``adapt`` keep
    finished work only with ``--resume``."""
    if argv[0] in ("run", "adapt") and "--resume" not in argv:
        return "add --resume to the same command to continue (without it, finished work is refused or measured again)"
    return "the same command continues"


if __name__ == "__main__":
    sys.exit(main())
