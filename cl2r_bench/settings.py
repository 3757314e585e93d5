"""The typed settings of a run: one frozen dataclass per section of ``configs/default.yaml``.

``configs/default.yaml`` is the one place where a setting's default is written; these classes have no defaults
(``tests/test_structure.py`` checks that each field matches one YAML key, both ways). They are built by
:func:`RunSettings.from_config` from a config that :func:`cl2r_bench.config.resolve` has merged and validated,
inside the assembly step (:mod:`cl2r_bench.assembly`), so the code downstream reads attributes, never string keys.
"""
from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass
from typing import Any, TypeVar

import yaml

from cl2r_bench.config import CONFIG_DIR, ConfigError

ADAPTER_AT = ("replacements", "every_task")
ADAPTER_DIRECTIONS = ("auto", "backward", "forward")
UPDATE_PROTOCOLS = ("auto", "leave_one_out", "stream")
PRETRAIN_SCHEDULES = ("cosine", "plateau")
AMP_DTYPES = ("float16", "bfloat16")
EPOCH_LENGTHS = ("reference", "full_pass")
SCHEDULE_STEPS = ("epoch", "iteration")

Section = TypeVar("Section")


def task_seed(seed: int, task: int) -> int:
    """The seed of task ``task`` of a run seeded ``seed``: each task seeds its own random streams (training, the
    replay memory's draw, the adapter's fit), so a resumed run ends as an uninterrupted one."""
    return seed * 1000 + task


@functools.cache
def _default_config() -> dict[str, Any]:
    return yaml.safe_load((CONFIG_DIR / "default.yaml").read_text())


def with_defaults(cls: type[Section], section: str, **changes: Any) -> Section:
    """``cls`` built from the ``section`` of ``configs/default.yaml`` (a dotted path) with ``changes``: for tests,
    tools and benchmark scripts that need settings outside a resolved run config."""
    values = _default_config()
    for key in section.split("."):
        values = values[key]
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{**{k: v for k, v in values.items() if k in names}, **changes})


SPEED_OPTIONS = ("channels_last", "compile")  # training settings that change speed, not what is trained


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
    amp: bool
    amp_dtype: str
    epoch_length: str
    schedule_step: str
    progress: bool
    channels_last: bool
    compile: bool

    def __post_init__(self) -> None:
        for key, allowed in (("amp_dtype", AMP_DTYPES), ("epoch_length", EPOCH_LENGTHS),
                             ("schedule_step", SCHEDULE_STEPS)):
            if getattr(self, key) not in allowed:
                raise ConfigError(f"training.{key} must be one of {list(allowed)}, not {getattr(self, key)!r}")

    @classmethod
    def with_defaults(cls, **changes: Any) -> "TrainSettings":
        """The default training settings with ``changes`` (:func:`with_defaults`)."""
        return with_defaults(cls, "training", **changes)

    @property
    def autocast(self) -> str | bool:
        """What ``amp`` arguments take: the autocast dtype's name, or False when mixed precision is off."""
        return self.amp_dtype if self.amp else False


@dataclass(frozen=True)
class PlateauSettings:
    """When to lower the learning rate and when to stop (``replacement.pretrain``, schedule ``plateau``)."""

    patience: int
    decay: float
    drops: int
    min_delta: float

    @classmethod
    def with_defaults(cls, **changes: Any) -> "PlateauSettings":
        return with_defaults(cls, "replacement.pretrain", **changes)


@dataclass(frozen=True)
class DataSettings:
    """``data``: image size, CIFAR checksum policy and the generated data set's size."""

    image_size: int
    verify: str
    synthetic_classes: int
    synthetic_train_per_class: int
    synthetic_test_per_class: int

    @property
    def synthetic(self) -> dict[str, int]:
        """The ``synthetic_*`` settings as keyword arguments of :func:`scenarios.datasets.load_dataset`."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name.startswith("synthetic_")}


@dataclass(frozen=True)
class StreamSettings:
    """``stream``: the class-incremental split (docs/METHODS.md §4)."""

    initial_classes: int
    increment: int
    num_tasks: int
    images_per_class: int | None
    class_order: str | list[int]
    order_seed: int


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

    def seeds(self, count: int) -> list[int]:
        """The initialisation seed of each of ``count`` pretrained models: one int shared by all, or one per
        model (the list's length is checked by :func:`cl2r_bench.config.validate`)."""
        return [self.seed] * count if isinstance(self.seed, int) else list(self.seed[:count])

    def train_settings(self, training: TrainSettings) -> TrainSettings:
        """The run's training settings with this section's epochs, batch size and learning rates."""
        return dataclasses.replace(training, epochs=self.epochs, batch_size=self.batch_size, lr=self.lr,
                                   lr_min=self.lr_min)

    @property
    def plateau(self) -> PlateauSettings | None:
        """The plateau rule, or None for the cosine schedule."""
        if self.schedule == "cosine":
            return None
        return PlateauSettings(patience=self.patience, decay=self.decay, drops=self.drops, min_delta=self.min_delta)


@dataclass(frozen=True)
class ReplacementSettings:
    """``replacement``: the tasks that start from an improved pretrained model, and where those come from."""

    tasks: list[int]
    checkpoints: list[str]
    pretrain: PretrainSettings


@dataclass(frozen=True)
class ModelSettings:
    """``model``: backbone and head sizes (docs/METHODS.md §5)."""

    backbone: str
    simplex_classes: int
    small_width: int
    small_out_dim: int

    @property
    def build_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :func:`cl2r_bench.models.build_model`."""
        return {"backbone": self.backbone, "simplex_vertices_count": self.simplex_classes,
                "small_width": self.small_width, "small_out_dim": self.small_out_dim}


@dataclass(frozen=True)
class EvaluationSettings:
    """``evaluation``: the open-set retrieval protocol and its noise analysis (docs/METHODS.md §2-§3)."""

    dataset: str
    heldout_classes: int
    queries_per_class: int | None
    mode: str
    batch_size: int
    tie_rule: str
    plots: bool
    confidence: float
    resamples: int


@dataclass(frozen=True)
class AdapterSettings:
    """``adapter``: the post-hoc adapter between model updates (docs/METHODS.md §7)."""

    name: str
    label: str
    at: str
    direction: str

    @property
    def used(self) -> bool:
        return self.name != "none"


@dataclass(frozen=True)
class ModelUpdateSettings:
    """``model_update``: the two-model scenario's head and partial backfilling (docs/METHODS.md §7-§8)."""

    head: str
    old: str
    new: str
    protocol: str
    fit_per_class: int | None
    test_per_class: int | None
    encoder_batch_size: int
    feature_cache: str
    backfill_orders: list[str]
    backfill_steps: int

    @property
    def encoders(self) -> bool:
        """Whether the old and new models are pretrained encoders named by spec (docs/METHODS.md §7b)."""
        return bool(self.old or self.new)

    @property
    def leave_one_out(self) -> bool:
        """Whether the papers' leave-one-out protocol measures the adapter (``protocol``, ``auto`` resolved)."""
        return self.protocol == "leave_one_out" or (self.protocol == "auto" and self.encoders)


@dataclass(frozen=True)
class TrackingSettings:
    """``tracking``: optional experiment logging (:mod:`cl2r_bench.tracking`)."""

    tensorboard: bool


@dataclass(frozen=True)
class DistributedSettings:
    """``distributed``: one run on several processes under torchrun (:mod:`cl2r_bench.distributed`)."""

    sync_batchnorm: bool
    connect_timeout: float
    timeout: float


@dataclass(frozen=True)
class RunSettings:
    """A whole run's settings (the top level of ``configs/default.yaml``)."""

    scenario: str
    strategy: str
    plugins: list[str]
    dataset: str
    preset: str
    data_root: str
    download: bool
    seed: int
    device: str
    output: str
    data: DataSettings
    stream: StreamSettings
    replacement: ReplacementSettings
    model: ModelSettings
    training: TrainSettings
    evaluation: EvaluationSettings
    adapter: AdapterSettings
    model_update: ModelUpdateSettings
    distributed: DistributedSettings
    tracking: TrackingSettings
    strategy_params: dict[str, dict[str, Any]]
    adapter_params: dict[str, dict[str, Any]]

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "RunSettings":
        """Build from a resolved config (:func:`cl2r_bench.config.resolve`)."""
        return _build(cls, config)


def _build(cls: type, mapping: dict[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        is_section = dataclasses.is_dataclass(hint) and not isinstance(hint, types.GenericAlias)
        values[f.name] = _build(hint, mapping[f.name]) if is_section else mapping[f.name]
    return cls(**values)


def section_fields(cls: type = RunSettings, prefix: str = "") -> list[str]:
    """The dotted names of every setting the dataclasses declare (``training.epochs``, ...), for the check that
    they and ``configs/default.yaml`` hold the same keys."""
    hints = typing.get_type_hints(cls)
    names = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            names += section_fields(hints[f.name], f"{prefix}{f.name}.")
        else:
            names.append(f"{prefix}{f.name}")
    return names
