"""The one assembly step: a resolved config in, the typed settings and every built part of a run out.

This is the only code that reads the config mapping (:func:`cl2r_bench.config.resolve` merged it); everything
downstream (:mod:`cl2r_bench.app.run_loop`, the scenarios, the trainers, the evaluator) receives :class:`Assembly`'s
attributes. Building is checking: each settings section checks its own values, the scenario the rules between
sections (:meth:`cl2r_bench.scenario.Scenario.check_settings`), the strategy and the adapter their parameters (their
``Config`` dataclasses), so every bad setting is a one-line error here, before any data is read. The flow is one
way: config -> assembly -> scenario -> training -> measuring -> record (docs/layout.md).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.backfill_orders import check_backfill_orders
from cl2r_bench.adapters import Adapter, AdapterError, get_adapter, list_adapters, make_adapter, unpaired_adapters
from cl2r_bench.distributed import SINGLE, Processes, place
from cl2r_bench.encoders import encoder_model
from cl2r_bench.errors import ConfigError, PartError, safe_name, writable_folder
from cl2r_bench.models import RetrievalModel, build_model, head_over, replacement_family
from cl2r_bench.plugin_settings import config_from_params
from cl2r_bench.plugins import load_plugin
from cl2r_bench.scenario import Scenario, ScenarioError
from cl2r_bench.settings import RunSettings
from cl2r_bench.tracking import Tracker, make_tracker
from cl2r_bench.training.trainers import Trainer, make_trainer, strategy_parameters
from scenarios import get_scenario


@dataclass
class Assembly:
    """Everything one run needs, built once.

    Attributes:
        config: the resolved config, saved with the results (``config.yaml``, the record) and nothing else.
        settings: the typed settings.
        scenario: what the run loop does at each task (``scenarios/``).
        trainer: trains a task's model with the strategy (None when the scenario trains nothing).
        label: the run's name in folders and leaderboards.
        directory: ``<output>/<scenario>/<dataset>/<label>/seed<k>``.
        device: where training and evaluation run (under torchrun, the GPU of the process's local rank).
        processes: this process's rank among the run's processes (:mod:`cl2r_bench.distributed`; one process
            outside torchrun).
        direction: the adapted matrix a run with an adapter fills (``backward`` / ``forward``), else None.
    """

    config: dict[str, Any]
    settings: RunSettings
    scenario: Scenario
    trainer: Trainer | None
    label: str
    directory: Path
    device: torch.device
    direction: str | None
    processes: Processes = SINGLE

    def new_adapter(self) -> Adapter | None:
        """A fresh, unfitted adapter of ``adapter.name`` (None without adapter)."""
        adapter = self.settings.adapter
        return make_adapter(adapter.name, self.settings.adapter_params) if adapter.used else None

    @property
    def head(self) -> str:
        """The head family of every model of the run (the strategy's, or the scenario's own)."""
        return self.scenario.head(self.trainer.head if self.trainer is not None else "learnable")

    def new_model(self, num_classes: int, mean: tuple[float, ...], std: tuple[float, ...],
                  encoder: str | None = None, older_width: int | None = None,
                  columns: tuple[int, int] | None = None) -> RetrievalModel:
        """A randomly initialised model of the run's backbone and head, normalising with ``mean`` / ``std``; with
        ``encoder`` (a spec), that head on the pretrained encoder's trunk and preprocessing instead; with
        ``columns``, the embedding network of the pretrained-backbone track reading those columns of the items
        (its frozen encoder's features). ``older_width`` is the feature width of the model it is built over (None:
        none), which a BT² head widens (:func:`cl2r_bench.models.head_over`)."""
        head, options = head_over(self.head, older_width)
        if head == self.head and self.trainer is not None:
            options = {**self.trainer.head_options, **options}
        return self._model(head, num_classes, mean, std, encoder, columns, options)

    def independent_model(self, num_classes: int, mean: tuple[float, ...], std: tuple[float, ...],
                          encoder: str | None = None, columns: tuple[int, int] | None = None) -> RetrievalModel:
        """A model of the family an independent new model is trained in (:func:`replacement_family` of the run's
        head): what ``Scenario.independent_models``' files load into, or the encoder spec's pretrained trunk
        (``encoder`` and ``columns`` as :meth:`new_model` takes them)."""
        return self._model(replacement_family(self.head), num_classes, mean, std, encoder, columns, {})

    def _model(self, head: str, num_classes: int, mean: tuple[float, ...], std: tuple[float, ...],
               encoder: str | None, columns: tuple[int, int] | None, options: dict[str, Any]) -> RetrievalModel:
        if encoder:
            return encoder_model(encoder, head=head, num_classes=num_classes, head_options=options,
                                 simplex_vertices_count=self.settings.model.simplex_classes)
        inputs = {} if columns is None else {"feature_columns": columns, "feature_dim": columns[1] - columns[0]}
        return build_model(head=head, num_classes=num_classes, mean=mean, std=std, head_options=options,
                           **self.settings.model.build_kwargs, **inputs)

    def tracker(self) -> Tracker:
        """The run's experiment log (``tracking.tensorboard``; off by default; rank 0's only under torchrun)."""
        return make_tracker(self.settings.tracking.tensorboard and self.processes.is_main,
                            self.directory / "tensorboard")


def assemble(config: dict[str, Any]) -> Assembly:
    """Build, and thereby check, a run's parts from a resolved config (:func:`cl2r_bench.config.resolve`). The
    assembly's ``config`` names every parameter of the run's strategy and adapter, defaults included (they are
    written once, in each part's ``Config`` dataclass), so that a result's saved config says exactly what ran."""
    load_plugins(config["plugins"])
    settings = RunSettings.from_config(config)
    processes, device = place(settings.distributed, resolve_device(settings.device))
    scenario = get_scenario(settings.scenario)(settings, device)
    trainer = make_trainer(settings, device, processes) if scenario.trains else None
    used = dict(config, strategy_params=dict(config["strategy_params"]), adapter_params=dict(config["adapter_params"]),
                scenario_params=dict(config["scenario_params"]))
    scenario_parameters = scenario.parameters_used()
    if scenario_parameters:
        used["scenario_params"][settings.scenario] = scenario_parameters
    used["strategy_params"][settings.strategy] = (trainer.parameters if trainer is not None else
                                                  strategy_parameters(settings.strategy, settings.strategy_params))
    if trainer is not None and settings.training.recipe == "authors":
        used["training"] = dataclasses.asdict(trainer.settings)
    adapter = make_adapter(settings.adapter.name, settings.adapter_params) if settings.adapter.used else None
    if adapter is not None:
        check_pairing(adapter.name, settings.model_update.pairing)
        used["adapter_params"][adapter.name] = adapter.parameters_used()
    check_part_names(settings)
    check_backfill_orders(settings.model_update.backfill_orders)
    label = scenario.label()
    direction = adapted_direction(adapter, settings.adapter.direction) if adapter and scenario.trains else None
    return Assembly(config=used, settings=settings, scenario=scenario, trainer=trainer, label=label,
                    directory=run_directory(settings, label), device=device, direction=direction,
                    processes=processes)


def load_plugins(paths: list[str]) -> None:
    """Import the user's plug-in files (``plugins``, :func:`cl2r_bench.plugins.load_plugin`), whose parts then join
    their registries."""
    for path in paths:
        load_plugin(path)


def check_part_names(settings: RunSettings) -> None:
    """Every name under ``strategy_params`` / ``adapter_params`` / ``scenario_params`` is a registered part whose
    parameters are valid, used or not, so that a typo is an error as an unknown key is everywhere else; the run's
    own strategy, adapter and scenario are built, and so checked, by :func:`assemble`."""
    sections = (
        ("strategy_params", settings.strategy, lambda name: strategy_parameters(name, settings.strategy_params)),
        ("adapter_params", settings.adapter.name, lambda name: make_adapter(name, settings.adapter_params)),
        ("scenario_params", settings.scenario, lambda name: config_from_params(
            get_scenario(name).Config, settings.scenario_params[name], f"scenario_params.{name}", ConfigError)))
    for section, own, check in sections:
        for name in sorted(set(getattr(settings, section)) - {own}):
            try:
                check(name)
            except (PartError, ScenarioError) as exc:
                raise ConfigError(str(exc) if str(exc).startswith(section) else f"{section}.{name}: {exc}") from None


def fills_stream_matrices(adapter: type[Adapter]) -> bool:
    """Whether ``adapter`` can fill an adapted matrix along a stream: it has a backward or a forward map (a dual
    query needs the old encoder at query time, which a stream's matrices do not model)."""
    return bool({"backward", "forward"} & set(adapter.directions))


def adapters_for(scenario: str, pairing: str) -> list[str]:
    """The registered adapters ``--adapter all`` runs with ``scenario``: every one, except on a stream that trains,
    where those that cannot fill its matrices (:func:`fills_stream_matrices`) are left out, and without pairs
    (``pairing: unpaired``), where only those fitted without pairs are run."""
    trains = get_scenario(scenario).trains
    usable = unpaired_adapters() if pairing == "unpaired" else list_adapters()
    return [name for name in usable if not trains or fills_stream_matrices(get_adapter(name))]


def check_pairing(name: str, pairing: str) -> None:
    """One line when adapter ``name`` needs pairs and ``model_update.pairing`` is ``unpaired``."""
    if pairing == "unpaired" and not get_adapter(name).fits_unpaired:
        raise ConfigError(f"adapter {name!r} needs the same items embedded by both models, and "
                          f"model_update.pairing=unpaired gives it none: use an adapter fitted without pairs "
                          f"({', '.join(unpaired_adapters())}) or pairing=paired")


def adapted_direction(adapter: Adapter, direction: str) -> str:
    """The adapted matrix a stream run fills (``adapter.direction``). ``auto`` is backward when the adapter has a
    backward map; the forward direction needs an adapter whose forward map lands in the new model's own space (not
    λ-orthogonal's; docs/METHODS.md §7)."""
    if not fills_stream_matrices(type(adapter)):
        raise AdapterError(f"adapter {adapter.name!r} combines the old and the new model's queries (a dual query), "
                           "and a stream run fills backward or forward matrices only; measure it with runner.py "
                           "adapt or model_update on encoder specs")
    if direction == "auto":
        direction = "backward" if "backward" in adapter.directions else "forward"
    if direction not in adapter.directions or (direction == "forward" and not adapter.forward_into_new_space):
        raise AdapterError(f"adapter {adapter.name!r} cannot fill a {direction} matrix along a stream; use "
                           f"adapter.direction={adapter.directions[0]}")
    return direction


def run_directory(settings: RunSettings, label: str) -> Path:
    """``<output>/<scenario>/<dataset>/<label>/seed<k>``; every name is checked (:func:`cl2r_bench.errors.safe_name`)
    before it becomes a path component, so no setting can point outside ``output``."""
    names = [safe_name(settings.scenario, "scenario"), safe_name(settings.dataset, "dataset"),
             safe_name(label, "adapter.label" if settings.adapter.label else "strategy")]
    for folder, setting in ((settings.replacement.pretrain.cache_dir, "replacement.pretrain.cache_dir"),
                            (settings.model_update.feature_cache, "model_update.feature_cache")):
        writable_folder(folder, setting)
    return writable_folder(settings.output, "output").joinpath(*names, f"seed{int(settings.seed)}")


def resolve_device(name: str) -> torch.device:
    """``auto`` is the GPU when there is one; a CUDA device without a GPU is a one-line error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} requested but no CUDA GPU is available; use --device cpu or auto")
    try:
        return torch.device(name)
    except RuntimeError:
        raise ConfigError(f"unknown device {name!r}; use auto, cpu, cuda or cuda:N") from None
