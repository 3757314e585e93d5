"""The typed settings of training: ``training`` (each task's fine-tuning) and ``replacement.pretrain`` (how the suite
pretrains replacement models), with their optimisers', schedules' and recipes' allowed values.

They follow :mod:`cl2r_bench.settings`' rules (no defaults of their own, each section checking its values when built)
and are apart from it because the training package reads them alone: the loop, the engine, the trainers and
pretraining import these sections, not a run's settings.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from cl2r_bench.config import choices, with_defaults
from cl2r_bench.errors import ConfigError
from cl2r_bench.setting_rules import above_zero, at_least, check_choices, check_rules, check_schedule, int_list

PRETRAIN_SCHEDULES = ("cosine", "plateau")
AMP_DTYPES = ("float16", "bfloat16")
EPOCH_LENGTHS = ("reference", "full_pass")
SCHEDULE_STEPS = ("epoch", "iteration")
OPTIMIZERS = ("sgd", "adam", "adamw")
SCHEDULES = ("cosine", "multistep", "poly")
RECIPES = ("shared", "authors")
"""``training.recipe``: the section's own settings for every strategy, or each strategy's authors' recipe over them
(:attr:`cl2r_bench.strategy.Strategy.authors_recipe`)."""
RECIPE_KEYS = ("optimizer", "lr", "lr_min", "momentum", "nesterov", "weight_decay", "epochs", "schedule", "milestones",
               "gamma", "power", "warmup_epochs", "schedule_step", "clip_grad_norm")
"""The training settings an authors' recipe may set."""
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
"""``training.compile``'s modes besides true (``default``) and false: ``torch.compile``'s own."""


@dataclass(frozen=True)
class TrainSettings:
    """``training``: the fine-tuning of each task (docs/METHODS.md §4; ``cl2r_bench/training/engine.py``)."""

    epochs: int
    batch_size: int
    new_batch_size: int
    memory_batch_size: int
    memory_per_class: int
    lr: float
    lr_min: float
    momentum: float
    weight_decay: float
    optimizer: str
    nesterov: bool
    schedule: str
    milestones: list[int]
    gamma: float
    power: float
    warmup_epochs: int
    clip_grad_norm: float | None
    recipe: str
    amp: bool
    amp_dtype: str
    epoch_length: str
    schedule_step: str
    progress: bool
    channels_last: bool
    fused_optimizer: bool
    compile: bool | str

    def __post_init__(self) -> None:
        check_rules("training", self, at_least(1, "epochs", "batch_size", "new_batch_size", "memory_batch_size",
                                               "memory_per_class")
                    + at_least(0, "lr_min", "weight_decay", "warmup_epochs") + above_zero("lr", "power")
                    + [("momentum", lambda v: 0 <= v < 1, "in [0, 1)"),
                       ("clip_grad_norm", lambda v: type(v) in (int, float) and v > 0,
                        "a number above 0 (e.g. 5), or null for no clipping")])
        check_schedule("training", self)
        if not (isinstance(self.compile, bool) or self.compile in COMPILE_MODES):
            raise ConfigError(f"training.compile must be false, true or one of {list(COMPILE_MODES)}, not "
                              f"{self.compile!r}")
        for key, allowed in (("amp_dtype", AMP_DTYPES), ("epoch_length", EPOCH_LENGTHS),
                             ("schedule_step", SCHEDULE_STEPS), ("optimizer", OPTIMIZERS), ("schedule", SCHEDULES),
                             ("recipe", RECIPES)):
            if getattr(self, key) not in allowed:
                raise ConfigError(f"training.{key} must be one of {list(allowed)}, not {getattr(self, key)!r}")
        if not (int_list(self.milestones) and all(m >= 1 for m in self.milestones)
                and self.milestones == sorted(set(self.milestones))):
            raise ConfigError(f"training.milestones must be increasing epochs of at least 1 (e.g. [20, 40]), not "
                              f"{self.milestones!r}")
        if not 0 < self.gamma <= 1:
            raise ConfigError(f"training.gamma must be in (0, 1] (the factor at each milestone), not {self.gamma!r}")
        if self.warmup_epochs >= self.epochs:
            raise ConfigError(f"training.warmup_epochs = {self.warmup_epochs} leaves no epoch of the schedule out of "
                              f"{self.epochs}; use fewer")

    @classmethod
    def with_defaults(cls, **changes: Any) -> TrainSettings:
        """The default training settings with ``changes`` (:func:`with_defaults`)."""
        return with_defaults(cls, "training", **changes)

    @property
    def compile_mode(self) -> str | None:
        """The ``torch.compile`` mode of ``compile``: None when off, ``default`` for true."""
        if self.compile is False:
            return None
        return "default" if self.compile is True else self.compile

    @property
    def autocast(self) -> str | bool:
        """What ``amp`` arguments take: the autocast dtype's name, or False when mixed precision is off."""
        return self.amp_dtype if self.amp else False


PRETRAIN_FIXED = {"optimizer": "sgd", "nesterov": False, "schedule": "cosine", "milestones": [], "gamma": 0.1,
                  "power": 2.0, "warmup_epochs": 0, "clip_grad_norm": None, "recipe": "shared"}
"""The training settings pretraining never takes from the run (:meth:`PretrainSettings.train_settings`)."""


@dataclass(frozen=True)
class PlateauSettings:
    """When to lower the learning rate and when to stop (``replacement.pretrain``, schedule ``plateau``)."""

    patience: int
    decay: float
    drops: int
    min_delta: float

    @classmethod
    def with_defaults(cls, **changes: Any) -> PlateauSettings:
        return with_defaults(cls, "replacement.pretrain", **changes)


@dataclass(frozen=True)
class PretrainSettings:
    """``replacement.pretrain``: how the suite pretrains replacement models (and model_update's two models)."""

    dataset: str
    class_counts: list[int]
    images_per_class: int | None
    epochs: int
    batch_size: int
    lr: float
    lr_min: float
    schedule: str
    patience: int
    decay: float
    drops: int
    min_delta: float
    seed: int | list[int]
    cache_dir: str

    def __post_init__(self) -> None:
        section = "replacement.pretrain"
        check_rules(section, self, at_least(1, "epochs", "batch_size", "patience", "images_per_class")
                    + at_least(0, "drops", "lr_min", "min_delta") + above_zero("lr")
                    + [("decay", lambda v: 0 < v <= 1, "in (0, 1]")])
        check_schedule(section, self)
        check_choices(section, self, {"schedule": PRETRAIN_SCHEDULES, "dataset": tuple(choices("datasets"))})

    def seeds(self, count: int) -> list[int]:
        """The initialisation seed of each of ``count`` pretrained models: one int shared by all, or one per
        model (the list's length is checked by the scenario: :meth:`cl2r_bench.scenario.Scenario.check_settings`)."""
        return [self.seed] * count if isinstance(self.seed, int) else list(self.seed[:count])

    def train_settings(self, training: TrainSettings) -> TrainSettings:
        """The run's training settings with this section's epochs, batch size and learning rates, and always SGD
        (momentum, weight decay of ``training``) under this section's schedule (:data:`PRETRAIN_FIXED`), whatever
        optimiser the run's strategy trains with."""
        return dataclasses.replace(training, epochs=self.epochs, batch_size=self.batch_size, lr=self.lr,
                                   lr_min=self.lr_min, **PRETRAIN_FIXED)

    @property
    def plateau(self) -> PlateauSettings | None:
        """The plateau rule, or None for the cosine schedule."""
        if self.schedule == "cosine":
            return None
        return PlateauSettings(patience=self.patience, decay=self.decay, drops=self.drops, min_delta=self.min_delta)
