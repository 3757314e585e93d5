"""The commands of the suite (their options and usage: :mod:`cl2r_bench.app.arguments`).

Usage errors print one line and exit with code 2; an interrupted run keeps every finished task (``--resume``); a
diverged run (NaN or infinite loss, weights or features) prints one line, exits with code 3 and keeps the tasks
finished before it, never marked complete; a strategy whose own code fails mid-run (it raises, or its loss is not a
scalar tensor with a gradient) does the same with code 4, its traceback in the run folder's ``error.log``.
"""
from __future__ import annotations

import argparse
import importlib
import io
import os
import sys
from collections.abc import Callable

from cl2r_bench.app.arguments import COMMANDS, build_parser
from cl2r_bench.app.stops import exit_code, stop_handlers, stop_name
from cl2r_bench.errors import UsageError
from cl2r_bench.threads import own_threads

COMMAND_MODULES = {"run": "run_command", "pretrain": "pretrain_command", "embed": "embed_command",
                   "sweep": "sweep_command", "metrics": "metrics_command", "leaderboard": "leaderboard_command",
                   "compare": "compare_command", "plot": "plot_command", "report": "report_command",
                   "pages": "pages", "list": "list_command", "adapt": "adapt_command"}
"""Each command's module in :mod:`cl2r_bench.app`, which defines ``command_<name>(args)``. A command's module is
imported when it runs, and its parts inside it: they import timm and Avalanche (seconds), so --help, a usage error
and the commands that read results answer without them (the parser's SLURM options import torch, 1.5 s)."""
COMMANDS_THAT_COMPUTE = ("run", "pretrain", "embed", "adapt")
"""The commands that train, embed or rank in their own process (:func:`take_job_threads`)."""
EXIT_DIVERGED = 3
EXIT_STRATEGY_FAILED = 4


def command_handler(command: str) -> Callable[[argparse.Namespace], int]:
    """``command_<command>`` of its module (:data:`COMMAND_MODULES`); ``args.runner`` is this entry point, for a
    command that runs others (``pages``)."""
    return getattr(importlib.import_module(f"cl2r_bench.app.{COMMAND_MODULES[command]}"), f"command_{command}")


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
    handler, not with this module (:data:`COMMAND_MODULES`)."""
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
        args.runner = main
        return command_handler(args.command)(args)
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
