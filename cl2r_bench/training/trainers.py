"""Trainers: how the run loop fine-tunes a task's model, with the suite's strategies or any Avalanche strategy.

:class:`StrategyTrainer` runs a strategy of ``strategies/``: its loss on the suite's Avalanche template
(:mod:`cl2r_bench.training.template`), whose hooks freeze the teacher the run loop hands over and add the task's
exemplars to the run's :class:`~cl2r_bench.training.engine.ReplayMemory`.
:class:`AvalancheTrainer` runs an Avalanche strategy named ``avalanche:<Class>``
(``cl2r_bench/training/avalanche.py``) on the task's Avalanche experience, keeping its own state (its replay buffer,
its old model, its importances) across tasks; the run loop swaps its model at replacement tasks. Both are measured
by the same run loop into the same compatibility matrix, metrics and leaderboard.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import torch

from cl2r_bench.data.streams import Task
from cl2r_bench.distributed import SINGLE, LaunchError, Processes
from cl2r_bench.errors import ConfigError
from cl2r_bench.models import RetrievalModel
from cl2r_bench.settings import RunSettings
from cl2r_bench.strategy import StrategyError, failures_reported
from cl2r_bench.tracking import Tracker
from cl2r_bench.training_settings import RECIPE_KEYS, TrainSettings
from strategies import Strategy, TaskContext, get_strategy

from .avalanche import AvalancheStrategyError, check_params, is_avalanche_strategy, train_on_experience
from .engine import ReplayMemory
from .loop import train_task


class Trainer(Protocol):
    """What the run loop asks of a trainer."""

    head: str
    needs_teacher: bool
    replacement_teacher: str
    uses_memory: bool
    needs_independent: bool
    head_options: dict[str, Any]  # the keyword arguments of the strategy's head (BT²'s and OCA's widths, MixBCT's rows)
    parameters: dict[str, Any]  # every parameter of the strategy, defaults included (saved with the run's config)
    settings: TrainSettings  # what it trains with (the authors' recipe applied, with training.recipe: authors)

    def train(self, model: RetrievalModel, task: Task, memory: ReplayMemory, *, teacher: RetrievalModel | None,
              teacher_classes: int, replacement: bool, tracker: Tracker, description: str,
              independent: RetrievalModel | None = None) -> dict[str, Any]:
        """Fine-tune ``model`` in place on ``task``; returns ``{"seconds", "iterations", "images", "final_loss"}`` (and
        ``loss_terms`` for a strategy of the suite's template).
        A trainer with ``uses_memory`` replays from ``memory`` and adds the task's exemplars to it; one with
        ``needs_independent`` is given the task's independent new model (``TaskContext.independent``)."""


class StrategyTrainer:
    """A strategy of ``strategies/``: its loss on the suite's training loop (docs/METHODS.md §4)."""

    def __init__(self, strategy: Strategy, settings: TrainSettings, processes: Processes = SINGLE) -> None:
        self.strategy, self.settings, self.processes = strategy, settings, processes
        self.parameters = dataclasses.asdict(strategy.config)
        self.head, self.needs_teacher = strategy.head, strategy.needs_teacher
        self.needs_independent, self.head_options = strategy.needs_independent, strategy.head_options()
        self.replacement_teacher, self.uses_memory = strategy.replacement_teacher, strategy.uses_memory

    def train(self, model: RetrievalModel, task: Task, memory: ReplayMemory, *, teacher: RetrievalModel | None,
              teacher_classes: int, replacement: bool, tracker: Tracker, description: str,
              independent: RetrievalModel | None = None) -> dict[str, Any]:
        with failures_reported(self.strategy, f"task {task.index}, before_task"):
            self.strategy.before_task(TaskContext(
                index=task.index, num_old_classes=task.num_seen_classes - len(task.new_classes),
                num_new_classes=len(task.new_classes), replacement=replacement, teacher_classes=teacher_classes,
                teacher=teacher, new_data=task.train, memory=memory.items, amp=self.settings.autocast,
                model=model, independent=independent))
        return train_task(model, self.strategy, task.train, memory, self.settings, teacher=teacher,
                          independent=independent,
                          experience=task.experience, description=description, tracker=tracker,
                          task_index=task.index, processes=self.processes)


class AvalancheTrainer:
    """An Avalanche strategy (``avalanche:<Class>``, constructor arguments in ``strategy_params``): trained on the
    task's experience with SGD at ``training.lr`` / ``momentum`` / ``weight_decay``, ``training.batch_size`` and
    ``training.epochs``; its own mechanisms (replay buffer, distillation, regularisation) do the rest, so the run
    loop gives it no teacher and no memory."""

    head, needs_teacher, replacement_teacher, uses_memory = "learnable", False, "incoming", False
    needs_independent, head_options = False, {}

    def __init__(self, name: str, params: dict[str, Any], settings: TrainSettings, device: torch.device) -> None:
        self.name, self.params, self.settings, self.device = name, params, settings, device
        self.parameters = check_params(name, params)
        self.strategy = None

    def train(self, model: RetrievalModel, task: Task, memory: ReplayMemory, *, teacher: RetrievalModel | None,
              teacher_classes: int, replacement: bool, tracker: Tracker, description: str,
              independent: RetrievalModel | None = None) -> dict[str, Any]:
        self.strategy, timing = train_on_experience(self.strategy, self.name, self.params, model, task.experience,
                                                    self.settings, device=self.device, description=description)
        return timing


def strategy_parameters(name: str, strategy_params: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every parameter of strategy ``name`` given ``strategy_params`` (the config's), defaults included: those of
    the strategy's ``Config`` dataclass, or of the Avalanche class's constructor for ``avalanche:<Class>``. Unknown
    names and invalid parameters raise a one-line :class:`~cl2r_bench.strategy.StrategyError`."""
    params = strategy_params.get(name, {})
    if is_avalanche_strategy(name):
        return check_params(name, params)
    return dataclasses.asdict(get_strategy(name).from_params(params).config)


def make_trainer(settings: RunSettings, device: torch.device,
                 processes: Processes = SINGLE) -> StrategyTrainer | AvalancheTrainer:
    """The trainer of ``settings.strategy`` with its ``strategy_params``; under torchrun (``processes``) the
    suite's strategies train data-parallel, and an Avalanche strategy is refused (it trains in one process)."""
    params = settings.strategy_params.get(settings.strategy, {})
    if is_avalanche_strategy(settings.strategy):
        if processes.distributed:
            raise LaunchError(f"{settings.strategy} trains in one process: run it without torchrun (the suite's "
                              "own strategies train data-parallel)")
        if settings.training.recipe == "authors":
            raise StrategyError(f"training.recipe=authors: {settings.strategy} has no authors' recipe in the suite; "
                                "train it with training.recipe=shared")
        return AvalancheTrainer(settings.strategy, params, settings.training, device)
    strategy = get_strategy(settings.strategy).from_params(params)
    return StrategyTrainer(strategy, strategy_training(settings.training, strategy), processes)


def strategy_training(training: TrainSettings, strategy: Strategy) -> TrainSettings:
    """The settings ``strategy`` trains with: ``training`` itself (``recipe: shared``), or its authors' recipe over
    it (``recipe: authors``, :attr:`~cl2r_bench.strategy.Strategy.authors_recipe`); pretraining keeps ``training``."""
    if training.recipe == "shared":
        return training
    if not strategy.authors_recipe:
        raise StrategyError(f"training.recipe=authors: strategy {strategy.name!r} declares no authors' recipe "
                            "(authors_recipe in its file); train it with training.recipe=shared")
    unknown = sorted(set(strategy.authors_recipe) - set(RECIPE_KEYS))
    if unknown:
        raise StrategyError(f"strategy {strategy.name!r}: its authors_recipe sets {unknown}, which a recipe may not "
                            f"set (allowed: {list(RECIPE_KEYS)})")
    try:
        return dataclasses.replace(training, **strategy.authors_recipe)
    except ConfigError as exc:
        raise StrategyError(f"strategy {strategy.name!r}'s authors_recipe: {exc}") from None


__all__ = ["AvalancheStrategyError", "AvalancheTrainer", "StrategyTrainer", "Trainer", "make_trainer",
           "strategy_parameters", "strategy_training"]
