"""The run options of the command line (``run``, ``pretrain``, ``sweep``) and the runs they ask for.

Each option is declared once (:data:`RUN_OPTIONS`): its flag, its help and the setting of ``configs/default.yaml``
it overrides, so that the parser and the config layer it makes cannot drift apart. :func:`requested_runs` turns the
options into assembled runs (:func:`cl2r_bench.app.assembly.assemble`), which checks every setting before any data is
read.
"""
from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cl2r_bench.config import choices, nested, parse_assignment, read_yaml, resolve
from cl2r_bench.errors import UsageError
from cl2r_bench.limits import count_argument, seed_argument
from cl2r_bench.plugins import PLUGIN_KINDS

if TYPE_CHECKING:
    from cl2r_bench.app.assembly import Assembly

GRID_OPTIONS = ("scenario", "strategy", "adapter", "dataset")


@dataclass(frozen=True)
class RunOption:
    """One command-line option of a run: ``setting`` is the dotted config key it sets (None: read by
    :func:`requested_runs` itself), ``value`` what the setting gets from the parsed value."""

    flag: str
    setting: str | None
    help: str
    keywords: dict[str, Any] = field(default_factory=dict)
    value: Callable[[Any], Any] = lambda parsed: parsed

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


def _unless_all(parsed: str) -> str | None:
    return None if parsed == "all" else parsed


RUN_OPTIONS = (
    RunOption("--scenario", "scenario", f"{' | '.join(choices('scenarios'))} or a plug-in's (runner.py list; default "
              "from configs/default.yaml: iamcl2r)"),
    RunOption("--strategy", "strategy", "a registered strategy, avalanche:<Class> (any Avalanche strategy, e.g. "
              "avalanche:EWC), or 'all' (the registered ones; with training.recipe=authors, those with an authors' "
              "recipe)", value=_unless_all),
    RunOption("--adapter", "adapter.name", "a post-hoc adapter between model updates (cl2r_bench/adapters/), 'none', "
              "or 'all' (none and every adapter, one run each)", value=_unless_all),
    RunOption("--dataset", "dataset", f"training stream: {' | '.join(choices('datasets'))} or a plug-in's"),
    RunOption("--eval-dataset", "evaluation.dataset", "open-set evaluation on another data set (query = its train "
              "images, gallery = templates of its test images; cifar10 for the papers, any data set of runner.py "
              "list) | heldout (classes after the stream's) | stream (its own classes' test images)"),
    RunOption("--data-root", "data_root", "folder with cifar-100-python/, cifar-10-batches-py/, tiny-imagenet-200/"),
    RunOption("--download", "download", "download missing data sets", {"action": "store_true", "default": None}),
    RunOption("--preset", "preset", f"{' | '.join(choices('presets'))} (runner.py list says what each is)"),
    RunOption("--seed", "seed", "one seed", {"type": seed_argument}),
    RunOption("--seeds", None, "several seeds, run one after the other", {"type": seed_argument, "nargs": "+"}),
    RunOption("--device", "device", "auto | cpu | cuda | cuda:N"),
    RunOption("--epochs", "training.epochs", "epochs per task (replacement pretraining has its own: --set "
              "replacement.pretrain.epochs=N)", {"type": count_argument}),
    RunOption("--output", "output", "results folder (default results/)"),
    RunOption("--config", None, "a YAML file of settings (same keys as configs/default.yaml)"),
    RunOption("--set", None, "any setting, e.g. --set stream.num_tasks=31 --set replacement.tasks=[0,10,20]",
              {"action": "append", "default": [], "metavar": "KEY=VALUE"}),
    RunOption("--plugin", "plugins", f"a Python file that registers {PLUGIN_KINDS} (repeatable; docs/plugins.md)",
              {"action": "append", "metavar": "FILE"}),
    RunOption("--no-progress", "training.progress", "no progress bars", {"action": "store_true", "default": None},
              value=lambda parsed: False),
    RunOption("--tensorboard", "tracking.tensorboard", "log losses, learning rate, each task's matrix row and AC_t / "
              "AA_t to <run folder>/tensorboard/ (needs pip install tensorboard)",
              {"action": "store_true", "default": None}),
)
GRID_SET_HELP = ("any setting; KEY=[v1,v2,...] makes a grid dimension (each point in its own folder OUTPUT/KEY=v1/) "
                 "unless the setting holds a list itself (its default in configs/default.yaml is a list, e.g. "
                 "replacement.tasks, or it takes one, stream.class_order): then it is that list")


def add_run_options(parser: argparse.ArgumentParser, several: bool = False) -> None:
    """The options of one run; ``several``: the grid options take several values (the sweep command)."""
    for option in RUN_OPTIONS:
        keywords = dict(option.keywords)
        if several and option.dest in GRID_OPTIONS:
            keywords["nargs"] = "+"
        text = GRID_SET_HELP if several and option.flag == "--set" else option.help
        parser.add_argument(option.flag, help=text, **keywords)


def command_line_layer(args: argparse.Namespace) -> dict[str, Any]:
    """The config overrides given on the command line: each option's setting, then the ``--set`` assignments."""
    layer: dict[str, Any] = {}
    for option in RUN_OPTIONS:
        parsed = getattr(args, option.dest)
        value = option.value(parsed) if option.setting and parsed is not None else None
        if value is not None:
            layer = _deep_update(layer, nested(option.setting, value))
    for assignment in args.set:
        layer = _deep_update(layer, parse_assignment(assignment))
    return layer


def _deep_update(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _deep_update(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def requested_layers(args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    """The user's config layers of a command: its ``--config`` file, then its options."""
    layers = [(args.config, read_yaml(args.config))] if args.config else []
    return layers + [("command line", command_line_layer(args))]


def requested_output(args: argparse.Namespace) -> str:
    """The results folder the command's settings name (nothing is assembled)."""
    return resolve(requested_layers(args))["output"]


def expanded_strategies(recipe: str) -> list[str]:
    """What ``--strategy all`` runs: every registered strategy, or with ``training.recipe: authors`` those that declare
    an authors' recipe."""
    from strategies import get_strategy, list_strategies

    return [name for name in list_strategies() if recipe != "authors" or get_strategy(name).authors_recipe]


def requested_runs(args: argparse.Namespace) -> list[Assembly]:
    """One assembled run per (strategy, adapter, seed) the command asks for (``all`` expands to the registered
    strategies, after the plugins are loaded, and to ``none`` and every adapter the scenario can run,
    :func:`cl2r_bench.app.assembly.adapters_for`): every bad setting is an error
    here, before any data is read or model trained."""
    # The run's parts import torch and timm (seconds): only when runs are asked for, not for --help.
    from cl2r_bench.app.assembly import adapters_for, assemble, load_plugins

    layers = requested_layers(args)
    if args.seeds and args.seed is not None:
        raise UsageError("give --seed or --seeds, not both")
    load_plugins(resolve(layers)["plugins"])
    resolved = resolve(layers)
    strategies = expanded_strategies(resolved["training"]["recipe"]) if args.strategy == "all" else [None]
    adapters = ([{"name": a} for a in ["none", *adapters_for(resolved["scenario"],
                                                              resolved["model_update"]["pairing"])]]
                if args.adapter == "all" else [None])
    runs = []
    for strategy, adapter, seed in itertools.product(strategies, adapters, args.seeds or [None]):
        extra = {k: v for k, v in (("strategy", strategy), ("adapter", adapter), ("seed", seed)) if v is not None}
        runs.append(assemble(resolve(layers + ([("command line", extra)] if extra else []))))
    return runs
