"""The typed settings of a run: one frozen dataclass per section of ``configs/default.yaml``, each checking its own
values.

``configs/default.yaml`` is the one place where a setting's default is written; these classes have no defaults
(``tests/test_structure.py`` checks that each field matches one YAML key, both ways). This module is also where each
setting's allowed values are declared (:data:`GALLERY_MODES`, ...; the model's are the model module's own, the data
sets' are their profiles in ``configs/datasets/``; the sections of training, ``training`` and ``replacement.pretrain``,
and their values are :mod:`cl2r_bench.training_settings`'): the parts that interpret a setting import its vocabulary
from here, and each section checks its ranges, choices and the rules between its own fields when it is built
(``__post_init__``), with a one-line :class:`~cl2r_bench.errors.ConfigError` naming the setting. Rules that tie sections
to a scenario are the scenario's (:meth:`cl2r_bench.scenario.Scenario.check_settings`), a strategy's or adapter's
parameters are its own ``Config``'s. :func:`RunSettings.from_config` builds them from a config that
:func:`cl2r_bench.config.resolve` has merged, inside the assembly step (:mod:`cl2r_bench.app.assembly`), so the code
downstream reads attributes, never string keys.
"""
from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass
from typing import Any

from cl2r_bench.config import choices
from cl2r_bench.errors import ConfigError, safe_name
from cl2r_bench.limits import RESAMPLES_MAX, seed_problem
from cl2r_bench.models import BACKBONES
from cl2r_bench.setting_rules import above_zero, at_least, check_choices, check_rules, int_list
from cl2r_bench.training_settings import PretrainSettings, TrainSettings

VERIFY_MODES = ("warn", "strict", "off")
CLASS_ORDERS = ("natural", "seeded")
SEED_SCOPES = ("training", "split")
"""What a run's seed draws (``seed_scope``): the training alone, or also the class order and the query sample."""
VARIANT_NAME = re.compile(r"[A-Za-z0-9_-]{0,40}")
"""A ``variant``'s name: no dot, so ``<strategy>.<variant>`` splits back at its last dot (``compare --variants``)."""
EVALUATION_PROTOCOLS = ("heldout", "stream")
"""``evaluation.dataset``'s values besides a data set of its own (any with a profile: ``cifar10`` for the papers)."""
GALLERY_MODES = ("templates", "images")
TIE_RULES = ("strict", "inclusive")
UPDATE_HEADS = ("learnable", "dsimplex")
ADAPTER_AT = ("replacements", "every_task")
AUTO = "auto"
"""The value of a setting the suite decides from what it reads (``model_update.stream_rows``)."""
ADAPTER_DIRECTIONS = ("auto", "backward", "forward")
UPDATE_PROTOCOLS = ("auto", "leave_one_out", "stream")
UNMATCHED_CONVENTIONS = ("miss", "exclude")
"""How CMC counts a query without another item of its class (benchmarks/ranking/; docs/METHODS.md §7b)."""
PAIRINGS = ("paired", "unpaired")
"""What an adapter study fits on: the same items under both models, or the old features of some items and the new
features of others (``model_update.pairing``; docs/METHODS.md §7)."""
DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")

def task_seed(seed: int, task: int) -> int:
    """The seed of task ``task`` of a run seeded ``seed``: each task seeds its own random streams (training, the
    replay memory's draw, the adapter's fit), so a resumed run ends as an uninterrupted one."""
    return seed * 1000 + task


@dataclass(frozen=True)
class DataSettings:
    """``data``: image size, CIFAR checksum policy and the generated data set's size."""

    image_size: int
    verify: str
    synthetic_classes: int
    synthetic_train_per_class: int
    synthetic_test_per_class: int
    synthetic_noise: float
    synthetic_similarity: float

    def __post_init__(self) -> None:
        check_rules("data", self, at_least(1, "image_size", "synthetic_classes", "synthetic_train_per_class",
                                           "synthetic_test_per_class") + at_least(0, "synthetic_noise")
                    + [("synthetic_similarity", lambda v: 0 <= v < 1, "in [0, 1)")])
        check_choices("data", self, {"verify": VERIFY_MODES})

    @property
    def synthetic(self) -> dict[str, int]:
        """The ``synthetic_*`` settings as keyword arguments of :func:`cl2r_bench.data.datasets.load_dataset`."""
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

    def __post_init__(self) -> None:
        check_rules("stream", self, at_least(1, "initial_classes", "increment", "num_tasks", "images_per_class")
                    + at_least(0, "order_seed"))
        order = self.class_order
        if isinstance(order, str) and order not in CLASS_ORDERS or isinstance(order, list) and (
                not int_list(order) or len(set(order)) != len(order) or min(order, default=0) < 0):
            raise ConfigError(f"stream.class_order = {order!r}; use {' or '.join(CLASS_ORDERS)} or a list of distinct "
                              "class ids (ints >= 0)")


@dataclass(frozen=True)
class ReplacementSettings:
    """``replacement``: the tasks that start from an improved pretrained model, and where those come from."""

    tasks: list[int]
    checkpoints: list[str]
    pretrain: PretrainSettings


@dataclass(frozen=True)
class ModelSettings:
    """``model``: backbone and head sizes (docs/METHODS.md §5); with ``backbone: frozen_encoder`` the frozen encoders
    whose cached features an embedding network maps (the pretrained-backbone track, §4b). Each spec is checked, and
    their count against the scenario's models, by the scenario (:meth:`cl2r_bench.scenario.Scenario.check_settings`),
    which may read the encoder families."""

    backbone: str
    simplex_classes: int
    small_width: int
    small_out_dim: int
    encoders: list[str]
    embedding_width: int
    embedding_dim: int

    def __post_init__(self) -> None:
        check_rules("model", self, at_least(1, "small_width", "small_out_dim", "embedding_width", "embedding_dim")
                    + at_least(2, "simplex_classes"))
        check_choices("model", self, {"backbone": BACKBONES})
        if not all(isinstance(spec, str) and spec for spec in self.encoders):
            raise ConfigError(f"model.encoders = {self.encoders!r}: give encoder specs, e.g. "
                              "[efficientnet_lite:lite0, efficientnet_lite:lite1, efficientnet_lite:lite2]")
        if self.on_encoders != bool(self.encoders):
            raise ConfigError("model.backbone=frozen_encoder needs model.encoders (one encoder spec per model "
                              "generation, or one for all), and other backbones take none: "
                              + ("set model.encoders" if self.on_encoders else
                                 f"set model.encoders=[] or model.backbone=frozen_encoder (now {self.backbone})"))

    @property
    def on_encoders(self) -> bool:
        """Whether the models are embedding networks on frozen encoders' features (``backbone: frozen_encoder``)."""
        return self.backbone == "frozen_encoder"

    @property
    def build_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :func:`cl2r_bench.models.build_model` (the sizes of the embedding network only for
        models on frozen encoders, so the cache keys of the image backbones' replacement models stay as they were);
        a model on a frozen encoder adds its ``feature_dim`` and ``feature_columns``."""
        sizes = {"embedding_width": self.embedding_width, "embedding_dim": self.embedding_dim} if self.on_encoders \
            else {}
        return {"backbone": self.backbone, "simplex_vertices_count": self.simplex_classes,
                "small_width": self.small_width, "small_out_dim": self.small_out_dim, **sizes}


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

    def __post_init__(self) -> None:
        check_rules("evaluation", self, at_least(1, "batch_size", "heldout_classes", "queries_per_class")
                    + [("confidence", lambda v: 0 < v < 1, "between 0 and 1 (e.g. 0.95)"),
                       ("resamples", lambda v: 1 <= v <= RESAMPLES_MAX, f"from 1 to {RESAMPLES_MAX}")])
        check_choices("evaluation", self, {"dataset": (*EVALUATION_PROTOCOLS, *choices("datasets")),
                                           "mode": GALLERY_MODES,
                                           "tie_rule": TIE_RULES})


@dataclass(frozen=True)
class AdapterSettings:
    """``adapter``: the post-hoc adapter between model updates (docs/METHODS.md §7)."""

    name: str
    label: str
    at: str
    direction: str

    def __post_init__(self) -> None:
        check_choices("adapter", self, {"at": ADAPTER_AT, "direction": ADAPTER_DIRECTIONS})
        if self.label:
            safe_name(self.label, "adapter.label")

    @property
    def used(self) -> bool:
        return self.name != "none"


@dataclass(frozen=True)
class StudySettings:
    """The adapter study's own settings in ``model_update`` (docs/METHODS.md §7-§8), read alike by ``runner.py
    adapt`` and by the ``model_update`` scenario, and checked here once: partial backfilling, how CMC counts a query
    without a match, per-class CMC, a sampled query set, a gallery streamed from ``.npy`` files and its screen, the
    open set and fitting without pairs. Which backfilling orders exist is the measuring part's to check
    (:func:`benchmarks.backfill_orders.check_backfill_orders`, called before anything is fitted)."""

    backfill_orders: list[str]
    backfill_steps: int
    unmatched_queries: str
    per_class_cmc: bool
    queries: int | None
    stream_rows: int | str | None
    screen: bool
    unseen_classes: float
    pairing: str

    def __post_init__(self) -> None:
        check_rules("model_update", self, at_least(1, "backfill_steps", "queries"))
        if self.stream_rows != AUTO:
            check_rules("model_update", self, at_least(1, "stream_rows"))
        check_choices("model_update", self, {"unmatched_queries": UNMATCHED_CONVENTIONS, "pairing": PAIRINGS})
        if not 0 <= self.unseen_classes < 1:
            raise ConfigError(f"model_update.unseen_classes = {self.unseen_classes!r} must be a share in [0, 1) "
                              "(e.g. 0.5: half the classes are held out of fitting and scored)")
        if self.unseen_classes and self.stream_rows not in (None, AUTO):
            raise ConfigError("model_update.unseen_classes selects items in memory; leave model_update.stream_rows "
                              "null with it, or split the classes into the two files yourself")
        if self.screen and self.stream_rows in (None, AUTO):
            raise ConfigError("model_update.screen screens a streamed gallery: add --set model_update.stream_rows="
                              "65536 (with a folder of .npy files), or leave screen false")


@dataclass(frozen=True)
class ModelUpdateSettings(StudySettings):
    """``model_update``: the study's settings (:class:`StudySettings`), then the two-model scenario's own: its head,
    the two encoders or the trained pair, the protocol and the splits (docs/METHODS.md §7-§8)."""

    head: str
    old: str
    new: str
    protocol: str
    fit_per_class: int | None
    test_per_class: int | None
    encoder_batch_size: int
    feature_cache: str

    def __post_init__(self) -> None:
        if self.stream_rows not in (None, AUTO):
            raise ConfigError("model_update.stream_rows streams the .npy embeddings runner.py adapt reads; a run "
                              "embeds its splits itself: leave it null here")
        if self.screen:
            raise ConfigError("model_update.screen screens the streamed galleries of runner.py adapt "
                              "(model_update.stream_rows); a run ranks in memory: leave it false here")
        super().__post_init__()
        check_rules("model_update", self, at_least(1, "fit_per_class", "test_per_class", "encoder_batch_size"))
        if self.unseen_classes and not self.leave_one_out:
            raise ConfigError("model_update.unseen_classes holds classes out of the fitting split of runner.py adapt "
                              "and of two encoders' leave-one-out study (model_update.old / new); a run that trains "
                              "its two models picks its classes with the stream settings: leave it 0 here")
        check_choices("model_update", self, {"head": UPDATE_HEADS, "protocol": UPDATE_PROTOCOLS})
        if self.pairing == "unpaired" and not self.leave_one_out:
            raise ConfigError("model_update.pairing=unpaired fits adapters on different items in runner.py adapt and "
                              "in two encoders' leave-one-out study (model_update.old / new); a stream fits on its own "
                              "pairs: leave it paired here")
        if self.encoders and not (self.old and self.new):
            raise ConfigError("give both model_update.old and model_update.new (encoder specs), or neither")
        if self.encoders and self.protocol == "stream":
            raise ConfigError("model_update.protocol=stream measures models the suite trains; encoder specs are "
                              "measured by leave_one_out (or auto)")
        if self.protocol == "leave_one_out" and not self.encoders:
            raise ConfigError("model_update.protocol=leave_one_out needs the two encoders: --set "
                              "model_update.old=SPEC --set model_update.new=SPEC")

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

    def __post_init__(self) -> None:
        check_rules("distributed", self, above_zero("connect_timeout", "timeout"))


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
    seed_scope: str
    variant: str
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
    scenario_params: dict[str, dict[str, Any]]

    def __post_init__(self) -> None:
        problem = seed_problem(self.seed)
        if problem:
            raise ConfigError(problem)
        if not DEVICE.fullmatch(str(self.device)):
            raise ConfigError(f"device = {self.device!r}; use auto, cpu, cuda or cuda:N")
        check_choices("", self, {"seed_scope": SEED_SCOPES})
        if not VARIANT_NAME.fullmatch(str(self.variant)):
            raise ConfigError(f"variant = {self.variant!r}: name it with letters, digits, _ and - (e.g. cayley), at "
                              "most 40 characters, or leave it empty")
        if self.seed_scope == "split" and isinstance(self.stream.class_order, list):
            raise ConfigError("seed_scope=split draws the class order from the seed, and stream.class_order lists "
                              "it: set stream.class_order=natural or seed_scope=training")

    @property
    def class_order(self) -> tuple[str | list[int], int]:
        """``(stream.class_order, its seed)``: with ``seed_scope: split`` a permutation drawn from the run's seed,
        else the stream's settings (``order_seed`` for ``seeded``)."""
        if self.seed_scope == "split":
            return "seeded", self.seed
        return self.stream.class_order, self.stream.order_seed

    @property
    def query_seed(self) -> int | None:
        """The seed of the query sample (``evaluation.queries_per_class`` drawn at random per class) with
        ``seed_scope: split``; None: the first ones of each class."""
        return self.seed if self.seed_scope == "split" and self.evaluation.queries_per_class is not None else None

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> RunSettings:
        """Build from a resolved config (:func:`cl2r_bench.config.resolve`); each section checks itself."""
        return _build(cls, config)


def _build(cls: type, mapping: dict[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        is_section = dataclasses.is_dataclass(hint) and not isinstance(hint, types.GenericAlias)
        values[f.name] = _build(hint, mapping[f.name]) if is_section else mapping[f.name]
    return cls(**values)


def section_fields(cls: type = RunSettings, prefix: str = "") -> dict[str, tuple[type, Any]]:
    """Every setting the dataclasses declare, by dotted name (``training.epochs``, ...), with the dataclass that
    declares it and its annotation: for the checks that they and ``configs/default.yaml`` hold the same keys, that
    no dataclass repeats a default, and that ``config.EXTRA_TYPES`` names the union-typed ones."""
    hints = typing.get_type_hints(cls)
    fields: dict[str, tuple[type, Any]] = {}
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            fields.update(section_fields(hints[f.name], f"{prefix}{f.name}."))
        else:
            fields[f"{prefix}{f.name}"] = (cls, hints[f.name])
    return fields
