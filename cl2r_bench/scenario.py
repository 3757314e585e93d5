"""The scenario template and registry.

A scenario decides what the one run loop (:class:`cl2r_bench.app.run_loop.Run`) does at each task of its stream:
which tasks start from a pretrained model instead of the previous one, whether the strategy fine-tunes, when an
adapter is fitted and on what, and what the record adds. The loop owns everything else (run folder, resume, training,
evaluation into the compatibility matrix, the record), so every scenario gets them alike. A new scenario is one
file in ``scenarios/``, registered as the folder's modules are imported (or a ``--plugin`` file)::

    from dataclasses import dataclass
    from cl2r_bench.plugin_settings import setting
    from cl2r_bench.scenario import Scenario, register_scenario

    @dataclass(frozen=True)
    class MyScenarioConfig:           # its own settings and defaults: scenario_params.my_scenario.every
        every: int = setting(2, at_least=1)   # what it takes, beside the default (cl2r_bench/plugin_settings.py)

    @register_scenario("my_scenario")
    class MyScenario(Scenario):
        '''One line for `runner.py list`; then the protocol, citing docs/METHODS.md.'''
        Config = MyScenarioConfig
        trains = True                 # False: models are used as pretrained (no strategy)
        scores_starting_models = True # record each starting model's own accuracy before fine-tuning

        def trains_task(self, task):  # a hook; self.config holds the settings
            return task % self.config.every == 0

Every hook has a default (CL2R's behaviour); override the ones the scenario changes. A scenario's own settings are
its ``Config`` (``scenario_params.<name>``, checked like a strategy's, the values used written to the run's
config); a profile ``cl2r_bench/configs/scenarios/<name>.yaml`` may also change the suite's settings for it (the
built-in scenarios' replacements, stream and evaluation).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from cl2r_bench.data.datasets import DataError, DataSplits, ImageSet, class_count, load_dataset, native_image_size
from cl2r_bench.data.streams import Stream, build_stream
from cl2r_bench.encoders import build_encoder, check_spec, is_spec
from cl2r_bench.errors import ConfigError
from cl2r_bench.feature_cache import ONE_PIECE, Sharding, feature_splits
from cl2r_bench.models import RetrievalModel, load_replacement
from cl2r_bench.plugin_settings import NoParams, config_from_params
from cl2r_bench.registry import Registry
from cl2r_bench.setting_rules import int_list
from cl2r_bench.settings import EVALUATION_PROTOCOLS, RunSettings, task_seed
from cl2r_bench.strategy import default_replacement_teacher

__all__ = ["SCENARIOS", "Finished", "Scenario", "ScenarioError", "check_class_budget", "check_replacements",
           "datasets_read", "get_scenario", "items_read", "list_scenarios", "read_data", "register_scenario",
           "stream_from_settings"]


class ScenarioError(DataError):
    """An unknown scenario, or a scenario that cannot run with the given settings."""


@dataclass
class Finished:
    """What :meth:`Scenario.finish` may measure after the last task: the last two deployed models, the last
    fitted adapter (or None), and the run's embedder (``embed(model, images)``: its batch size and
    precision, each rank embedding its share under torchrun), also as ``embed_and_classify(model, images)``, which
    adds each image's top classifier output from the same pass."""

    stream: Stream
    outgoing: RetrievalModel | None
    model: RetrievalModel
    adapter: Any
    embed: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]
    embed_and_classify: Callable[[torch.nn.Module, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class Scenario:
    """Base class of every scenario (see the module docstring for the template). Defaults: fine-tuning along the
    stream, replacements at ``replacement.tasks`` (docs/METHODS.md §4)."""

    name: ClassVar[str] = ""
    Config: ClassVar[type] = NoParams
    trains: ClassVar[bool] = True
    scores_starting_models: ClassVar[bool] = True

    def __init__(self, settings: RunSettings, device: torch.device | None = None) -> None:
        self.settings = settings
        self.device = device or torch.device("cpu")
        self.config = config_from_params(self.Config, settings.scenario_params.get(self.name, {}),
                                          f"scenario_params.{self.name}", ScenarioError)
        self.check_settings()
        check_encoders(self)
        self._read: dict[str, DataSplits] = {}

    def parameters_used(self) -> dict[str, Any]:
        """Every setting of the scenario's ``Config``, defaults included (written to the run's config)."""
        return asdict(self.config)

    def check_settings(self) -> None:
        """Refuse, with a one-line :class:`~cl2r_bench.errors.ConfigError`, settings this scenario cannot run (each
        section has checked its own values): by default the replacements (tasks in the stream, one checkpoint or
        pretraining class count per replacement task) and the classes the stream, its held-out evaluation and the
        pretrained replacement models need from the data set."""
        settings = self.settings
        if settings.model_update.encoders:
            raise ConfigError("model_update.old / model_update.new name the models of --scenario model_update; for "
                              "IAM-CL2R's replacements use replacement.checkpoints")
        check_replacements(settings)
        check_class_budget(settings)

    def label(self) -> str:
        """The run's name in folders and leaderboards: ``adapter.label`` when set, else the strategy (``avalanche:X``
        written ``avalanche-X``; ``<strategy>.<teacher>`` when its ``replacement_teacher`` is set to the other arm
        than its default, ``<strategy>.authors`` when it trains with its authors' recipe, ``training.recipe``, then
        ``.<variant>`` when ``variant`` names the run), joined by ``+<adapter>`` when one is used."""
        adapter, strategy = self.settings.adapter, self.settings.strategy
        if adapter.label:
            return adapter.label
        teacher = self.settings.strategy_params.get(strategy, {}).get("replacement_teacher")
        arm = f".{teacher}" if teacher is not None and teacher != default_replacement_teacher(strategy) else ""
        recipe = ".authors" if self.settings.training.recipe == "authors" else ""
        variant = f".{self.settings.variant}" if self.settings.variant else ""
        return strategy.replace(":", "-") + arm + recipe + variant + (f"+{adapter.name}" if adapter.used else "")

    def stream(self) -> Stream:
        """The tasks and the evaluation sets (docs/METHODS.md §3-§4)."""
        return stream_from_settings(self.settings, self.settings.replacement.tasks, self.read_data)

    def read_data(self, name: str, encoder: str | None = None) -> DataSplits:
        """Data set ``name`` as the run's models read it, read once per run: its images (``data`` settings), or on
        the pretrained-backbone track (``model.encoders``, docs/METHODS.md §4b) each split's features under every
        encoder of the run side by side, from the feature cache or embedded into it on the run's device, each data
        set at its native size (every encoder resizes to its own input); ``encoder``: that one encoder's features
        alone (what a model on it is pretrained on)."""
        if name not in self._read:
            self._read[name] = read_data(self.settings, name, self.device)
        data = self._read[name]
        return data if encoder is None else data.features_of(encoder)

    def model_generation(self, task: int) -> int:
        """How many models up to ``task``'s started afresh instead of fine-tuning their predecessor (a replacement,
        or a model trained from scratch: :meth:`starts_from_scratch`) after the first: 0 for the first model and
        those fine-tuned from it. On the pretrained-backbone track it picks the task's encoder
        (:meth:`model_encoder`)."""
        replacements = set(self.settings.replacement.tasks)
        return sum(1 for t in range(1, task + 1) if t in replacements or self.starts_from_scratch(t))

    def encoder_entry(self, task: int) -> dict[str, str]:
        """``{"encoder": spec}`` of task ``task``'s frozen encoder for its starting model's record entry (nothing when
        the models read images)."""
        encoder = self.model_encoder(task)
        return {} if encoder is None else {"encoder": encoder}

    def model_encoder(self, task: int) -> str | None:
        """The frozen encoder whose features ``task``'s model reads (``model.encoders`` by
        :meth:`model_generation`; a single spec serves every model), or None when the models read images."""
        encoders = self.settings.model.encoders
        if not encoders:
            return None
        return encoders[0] if len(encoders) == 1 else encoders[self.model_generation(task)]

    def head(self, strategy_head: str) -> str:
        """The head family of every model of the run: the strategy's."""
        return strategy_head

    def independent_models(self, stream: Stream, starting: list[dict[str, Any]], device: torch.device,
                           log: Callable[[str], None]) -> dict[int, str]:
        """``{task: path}``: for tasks whose new model has an independently trained counterpart (the BCT line's
        "independent" new model, trained on the task's classes without any compatibility loss), the file (or
        encoder spec) of that model, found or trained here; given to strategies that ``needs_independent`` (BT²).
        ``starting`` is :meth:`starting_models`' list. By default the model a task after the first starts from:
        a replacement, trained without regard to the model it replaces (IAM-CL2R)."""
        return {r["task"]: r["path"] for r in starting if r["task"] > 0}

    def starting_models(self, stream: Stream, head: str, device: torch.device,
                        log: Callable[[str], None]) -> list[dict[str, Any]]:
        """One ``{"task", "path", "source", ...}`` per task that starts from a pretrained model; none by default."""
        return []

    def trains_task(self, task: int) -> bool:
        """Whether the strategy trains at ``task`` (by default at every task of a scenario that :attr:`trains`)."""
        return self.trains

    def starts_from_scratch(self, task: int) -> bool:
        """Whether ``task`` trains a freshly initialised model against the previous task's model as its teacher,
        instead of fine-tuning that model (the BCT line's new model, ``scenarios/upgrade.py``); never by default."""
        return False

    def load_starting_model(self, model: RetrievalModel, path: str) -> None:
        """Load a starting model's file into a freshly built model: its feature extractor (the classifier of a
        replacement model is dropped, docs/METHODS.md §4)."""
        load_replacement(model, path)

    def adapts_at(self, task: int, starts_fresh: bool) -> bool:
        """Whether an adapter is fitted between the model deployed before ``task`` and its model
        (``adapter.at``: at tasks that start from a pretrained model, or at every update)."""
        return self.settings.adapter.used and task > 0 and (starts_fresh or self.settings.adapter.at == "every_task")

    def adapter_data(self, stream: Stream, task: int, memory: ImageSet | None) -> ImageSet:
        """The images an adapter is fitted on: the task's training images and the replay memory."""
        new = stream.tasks[task].train
        if memory is None:
            return new
        return ImageSet(torch.cat([new.images, memory.images]), torch.cat([new.labels, memory.labels]))

    def adapter_seed(self, task: int) -> int:
        return task_seed(self.settings.seed, task)

    def finish(self, finished: Finished) -> dict[str, Any]:
        """Fields the record adds after the last task; none by default."""
        return {}

    def measures_features(self) -> bool:
        """Whether the run measures two frozen encoders by the papers' leave-one-out protocol on their cached
        features (docs/METHODS.md §7b) instead of running tasks; the run loop then asks :meth:`feature_study`."""
        return False

    def feature_study(self, device: torch.device, log: Callable[[str], None]) -> Any:
        """The train and test features of both encoders (:class:`cl2r_bench.adapter_study.Study`)."""
        raise NotImplementedError(f"scenario {self.name!r} does not measure features")


def check_replacements(s: RunSettings) -> None:
    """Replacement tasks are distinct tasks of the stream, each with its checkpoint (a file or an encoder spec) or
    a pretraining class count and seed."""
    rep, num_tasks = s.replacement, s.stream.num_tasks
    tasks = rep.tasks
    if not int_list(tasks) or len(set(tasks)) != len(tasks) or any(not 0 <= t < num_tasks for t in tasks):
        raise ConfigError(f"replacement.tasks = {tasks!r} must list distinct task numbers in 0..{num_tasks - 1} "
                          "(e.g. [0, 2, 4] for 7 tasks)")
    if rep.checkpoints:
        odd = [p for p in rep.checkpoints if not isinstance(p, str) or not p.strip()]
        if odd:
            raise ConfigError(f"replacement.checkpoints holds {odd[0]!r}; give one file path or encoder spec per "
                              "replacement task")
        if len(rep.checkpoints) != len(tasks):
            raise ConfigError(f"replacement.checkpoints has {len(rep.checkpoints)} entries for {len(tasks)} "
                              f"replacement task(s) {tasks}; give one file path or encoder spec per task")
        for reference in rep.checkpoints:
            if is_spec(reference):
                check_spec(reference)
            elif not Path(reference).is_file():
                raise ConfigError(f"replacement.checkpoints: {reference} "
                                  f"{'is a folder' if Path(reference).is_dir() else 'does not exist'}; give one "
                                  "state-dict file (or encoder spec) per replacement task")
        return
    counts, seed = rep.pretrain.class_counts, rep.pretrain.seed
    if tasks and (not int_list(counts) or len(counts) < len(tasks) or min(counts) < 1):
        raise ConfigError(f"replacement.pretrain.class_counts = {counts!r}: give one positive class count per "
                          f"replacement task ({len(tasks)})")
    if isinstance(seed, list) and (not int_list(seed) or len(seed) < len(tasks)):
        raise ConfigError(f"replacement.pretrain.seed = {seed!r}: give one int, or a list of {len(tasks)} ints "
                          "(one per pretrained model)")


def check_class_budget(s: RunSettings, *, pretrains_replacements: bool = True) -> None:
    """The stream, the held-out evaluation classes and (``pretrains_replacements``) the classes of the replacement
    models the suite pretrains must fit the data set; the message gives a ``--set`` that fits."""
    st, evaluation = s.stream, s.evaluation
    available = class_count(s.dataset, s.data.synthetic_classes)
    stream = st.initial_classes + st.increment * (st.num_tasks - 1)
    heldout = evaluation.heldout_classes if evaluation.dataset == "heldout" else 0
    if stream + heldout > available:
        fits = (available - heldout - st.initial_classes) // st.increment + 1
        fix = (f"--set stream.num_tasks={fits}" if fits >= 2 and pretrains_replacements else
               f"--set stream.initial_classes={max(1, (available - heldout) // 2)} --set stream.increment="
               f"{max(1, (available - heldout) // 2)}")
        raise ConfigError(f"the stream needs {stream} classes ({st.initial_classes} + {st.increment} x "
                          f"{st.num_tasks - 1}){f' + {heldout} held out' if heldout else ''}; {s.dataset} "
                          f"has {available}; e.g. {fix}")
    rep = s.replacement
    if pretrains_replacements and rep.tasks and not rep.checkpoints:
        source = rep.pretrain.dataset
        pool = (available - stream - heldout if source == s.dataset
                else class_count(source, s.data.synthetic_classes))
        wanted = max(rep.pretrain.class_counts[:len(rep.tasks)])
        if wanted > pool:
            raise ConfigError(f"replacement.pretrain.class_counts asks up to {wanted} classes of {source}; only "
                              f"{pool} are free for pretraining (outside the stream and its evaluation classes); "
                              "lower the counts or pretrain on another replacement.pretrain.dataset")


def check_encoders(scenario: Scenario) -> None:
    """On the pretrained-backbone track (``model.encoders``): one encoder per model generation of the scenario's
    stream (:meth:`Scenario.model_generation`) or one for all, each spec buildable as far as can be known without
    building it, and replacement models pretrained by the suite on their encoders' features."""
    settings = scenario.settings
    encoders = settings.model.encoders
    if not encoders:
        return
    generations = scenario.model_generation(settings.stream.num_tasks - 1) + 1
    if len(encoders) not in (1, generations):
        raise ConfigError(f"model.encoders names {len(encoders)} encoders; this {scenario.name} stream has "
                          f"{generations} model generation(s) (the first model, then each replacement or model "
                          "trained afresh): give one encoder per generation, or one for every model")
    for spec in encoders:
        check_spec(spec)
    if settings.replacement.checkpoints:
        raise ConfigError("model.backbone=frozen_encoder: the replacement models are embedding networks the suite "
                          "pretrains on their encoders' features (replacement.pretrain); set "
                          "replacement.checkpoints=[]")


def items_read(settings: RunSettings, name: str) -> dict[str, int | None]:
    """The most items per class a run reads from each split of data set ``name``, in data set order (None: all):
    the stream's training images, the replacement models' pretraining images and the held-out or open-set queries
    come from the train split (a query sample drawn from the seed, ``seed_scope: split``, from all of a class's
    items); every test item may be read (galleries, validation). What the pretrained-backbone track embeds of each
    split (:func:`read_data`)."""
    train = []
    queries = None if settings.query_seed is not None else settings.evaluation.queries_per_class
    if name == settings.dataset:
        train.append(settings.stream.images_per_class)
        if settings.evaluation.dataset == "heldout":
            train.append(queries)
    if name == settings.evaluation.dataset:
        train.append(queries)
    if name == settings.replacement.pretrain.dataset and settings.replacement.tasks:
        train.append(settings.replacement.pretrain.images_per_class)
    return {"train": None if not train or None in train else max(train), "test": None}


def datasets_read(settings: RunSettings) -> list[str]:
    """The data sets a run reads: its stream's, its open-set evaluation's and its replacement models' source."""
    names = [settings.dataset]
    if settings.evaluation.dataset not in EVALUATION_PROTOCOLS:
        names.append(settings.evaluation.dataset)
    if settings.replacement.tasks:
        names.append(settings.replacement.pretrain.dataset)
    return list(dict.fromkeys(names))


def read_data(settings: RunSettings, name: str, device: torch.device, sharding: Sharding = ONE_PIECE) -> DataSplits:
    """Data set ``name`` as a run reads it (:meth:`Scenario.read_data`); ``sharding``: this process's part in
    embedding the features of the pretrained-backbone track (``runner.py embed``)."""
    data = settings.data
    if not settings.model.on_encoders:
        return load_dataset(name, settings.data_root, download=settings.download, image_size=data.image_size,
                            verify=data.verify, **data.synthetic)
    images = load_dataset(name, settings.data_root, download=settings.download,
                          image_size=native_image_size(name) or data.image_size, verify=data.verify, **data.synthetic)
    update, training = settings.model_update, settings.training
    encoders = [build_encoder(spec) for spec in dict.fromkeys(settings.model.encoders)]
    return feature_splits(images, encoders, items_read(settings, name), cache_dir=update.feature_cache,
                          batch_size=update.encoder_batch_size, device=device, amp=training.autocast,
                          progress=training.progress, sharding=sharding)


def stream_from_settings(settings: RunSettings, replacement_tasks: list[int],
                         read: Callable[[str], DataSplits]) -> Stream:
    """The stream of the run's data set and evaluation protocol (``stream``, ``evaluation`` and ``data``), each
    data set read by ``read`` (:meth:`Scenario.read_data`)."""
    stream, evaluation, data = settings.stream, settings.evaluation, settings.data
    class_order, order_seed = settings.class_order
    return build_stream(
        dataset=settings.dataset, data_root=settings.data_root, download=settings.download, verify=data.verify,
        image_size=data.image_size, initial_classes=stream.initial_classes, increment=stream.increment,
        num_tasks=stream.num_tasks, images_per_class=stream.images_per_class, class_order=class_order,
        order_seed=order_seed, replacement_tasks=replacement_tasks, eval_dataset=evaluation.dataset,
        heldout_classes=evaluation.heldout_classes, queries_per_class=evaluation.queries_per_class,
        synthetic=data.synthetic, load=lambda name, *args, **kwargs: read(name), query_seed=settings.query_seed)


SCENARIOS = Registry("scenario", ScenarioError)
register_scenario = SCENARIOS.register
get_scenario = SCENARIOS.get
list_scenarios = SCENARIOS.names
