"""Any Avalanche strategy, measured for compatibility: the bridge between ``avalanche.training`` and the suite.

A strategy named ``avalanche:<Class>`` (``avalanche:Naive``, ``avalanche:LwF``, ``avalanche:EWC``,
``avalanche:Replay``, ...; :func:`strategy_names` lists them) is the Avalanche class of that name, built on the
suite's model and trained by Avalanche itself on the stream's experiences, which carry the images
(``cl2r_bench/data/streams.py``). Its constructor arguments come from ``strategy_params`` (e.g.
``{"avalanche:EWC": {"ewc_lambda": 0.4}}``), checked against the class's signature by :func:`check_params`; the
suite supplies :data:`RESERVED_PARAMS` itself.

* The model: Avalanche strategies expect ``model(x) -> logits``; :class:`LogitsOnly` wraps a
  :class:`~cl2r_bench.models.RetrievalModel` (``(logits, features)``) so, and :func:`unwrap` gives the retrieval
  model back for the compatibility evaluation. The model normalises its own uint8 input, so the experiences'
  datasets are used as they are.
* Heads: the caller grows ``model.head`` (``RetrievalModel.head.grow(n)``) before each experience, or adds
  :class:`HeadGrowthPlugin` to the strategy, which does it for every experience; Avalanche's ``make_optimizer`` at
  the experience boundary re-binds the grown classifier (same parameter name) in the optimizer. A d-Simplex head
  works too: :class:`LogitsOnly` orders its logits so that column y is class y's vertex K-1-y (METHODS.md §5).
* Model replacement (IAM-CL2R, METHODS.md §4): the run loop swaps models between ``train()`` calls with
  :func:`rebind` (the new model and a fresh optimizer). An Avalanche user adds :class:`ReplacementPlugin` to the
  strategy instead: at each replacement experience it builds the new model and swaps it in inside ``train()``, at
  ``before_train_dataset_adaptation``, the first per-experience callback, before Avalanche binds the optimizer
  for the experience (swapping ``strategy.model`` in ``before_training_exp`` trains nothing: the optimizer still
  holds the old parameters).
* Learning rate: :func:`train_on_experience` (the run loop's entry) anneals it per experience with
  :func:`cosine_lr_plugin`, from ``lr`` to ``lr_min`` over the experience's epochs, set at the start of each epoch
  (``CosineAnnealingLR(T_max=epochs)`` stepped per epoch: the suite's own schedule, METHODS.md §4).
  :func:`build_avalanche_strategy` adds no schedule (the optimizer's constant lr) so a user's plugins decide.
  The optimizer is built once and kept across experiences (Avalanche's behaviour: momentum carries over), and
  rebuilt only at a replacement.
* Training runs in float32 (Avalanche strategies have no autocast) with Avalanche's own data loading: the
  ``train`` transform group (random crop, flip) applied per sample by a ``DataLoader``.

The run loop drives one strategy across the stream::

    strategy = None
    for task in stream.tasks:
        model = ...                      # previous model with head grown, or a replacement model
        strategy, timing = train_on_experience(strategy, name, params, model, task.experience, settings,
                                               device=device)

Importing this module does not import Avalanche (seconds); the functions do, on first use, and so does the first
access to :class:`HeadGrowthPlugin` or :class:`ReplacementPlugin` (module ``__getattr__``).
"""
from __future__ import annotations

import functools
import inspect
import math
import time
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cl2r_bench.data.avalanche_import import avalanche_warnings_filtered, import_deferred, importing_avalanche
from cl2r_bench.errors import ConfigError
from cl2r_bench.heads import DSimplexHead
from cl2r_bench.models import NonFiniteError, RetrievalModel, first_nonfinite_tensor, load_replacement

from .engine import make_optimizer

AVALANCHE_PREFIX = "avalanche:"
RESERVED_PARAMS = ("model", "optimizer", "criterion", "train_mb_size", "train_epochs", "eval_mb_size", "device",
                   "evaluator", "plugins")
"""Constructor arguments the suite supplies itself; ``strategy_params`` may not set them."""
UNSUPPORTED = {
    "AETraining": "trains an autoencoder, not a classifier",
    "VAETraining": "trains a variational autoencoder, not a classifier",
    "GenerativeReplay": "needs a generative model",
    "ExpertGateStrategy": "needs its own ExpertGate model",
    "PNNStrategy": "needs a progressive neural network model",
    "PackNet": "needs a PackNet model",
    "SCR": "needs an avalanche.models.SCRModel",
    "LFL": "needs an avalanche.models.BaseModel",
    "CoPE": "needs a model that outputs embeddings, not logits",
    "ER_AML": "needs a separate feature-extractor module",
    "FeatureReplay": "needs the classifier as a direct attribute of the model",
    "JointTraining": "trains offline on the whole stream at once, not experience by experience",
    "FromScratchTraining": "re-initialises the model at every experience",
    "GDumb": "rebuilds the model from its first copy, whose head has not grown",
    "DER": "keeps past logits, so it fails when the head grows",
    "BiC": "fails on Avalanche 0.6 benchmarks ('dataset' of DatasetExperience has no setter)",
}
"""Avalanche 0.6 supervised strategies that cannot train a :class:`LogitsOnly` retrieval model with a growing head,
with the reason (each was tried on a 3-experience stream)."""


class AvalancheStrategyError(ConfigError):
    """An unknown ``avalanche:<Class>`` name or a constructor argument it does not take; one line saying which."""


def is_avalanche_strategy(name: str) -> bool:
    """Whether ``name`` names an Avalanche strategy (``avalanche:<Class>``); no import of Avalanche."""
    return isinstance(name, str) and name.startswith(AVALANCHE_PREFIX)


def _import_avalanche_training() -> Any:
    """``avalanche.training`` (imported by :func:`importing_avalanche`)."""
    with importing_avalanche():
        import avalanche.training
        import avalanche.training.templates
    return avalanche.training


@functools.cache
def _strategy_classes() -> dict[str, type]:
    training = _import_avalanche_training()
    template = training.templates.SupervisedTemplate
    classes = {}
    for attr in dir(training):
        cls = getattr(training, attr)
        if inspect.isclass(cls) and issubclass(cls, template) and attr not in UNSUPPORTED:
            params = inspect.signature(cls.__init__).parameters
            if "model" in params and "optimizer" in params:
                classes[attr] = cls
    return classes


def strategy_names() -> list[str]:
    """Every supported ``avalanche:<Class>``: the supervised strategies of ``avalanche.training`` that take a
    ``model`` and an ``optimizer``, except :data:`UNSUPPORTED`."""
    return [AVALANCHE_PREFIX + name for name in sorted(_strategy_classes())]


def avalanche_strategy_class(name: str) -> type:
    """The Avalanche class named by ``avalanche:<Class>``; an unknown name raises :class:`AvalancheStrategyError`
    listing the valid ones."""
    short = name[len(AVALANCHE_PREFIX):] if is_avalanche_strategy(name) else name
    classes = _strategy_classes()
    if short in classes:
        return classes[short]
    why = f" ({UNSUPPORTED[short]})" if short in UNSUPPORTED else ""
    raise AvalancheStrategyError(f"unknown Avalanche strategy {name!r}{why}; choose from {strategy_names()}")


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str)) or (
        isinstance(value, (list, tuple)) and all(_plain(v) for v in value))


def check_params(name: str, params: dict[str, Any] | None) -> dict[str, Any]:
    """``params`` checked against the constructor of ``name``'s class, with the constructor's plain defaults
    (numbers, strings, booleans, None, lists of those) added, so a saved config says what ran.

    A key the constructor does not take, a key of :data:`RESERVED_PARAMS`, or a missing argument without default
    raises :class:`AvalancheStrategyError` listing the valid keys."""
    cls = avalanche_strategy_class(name)
    params = dict(params or {})
    signature = inspect.signature(cls.__init__).parameters
    named = {k: p for k, p in signature.items() if k != "self" and p.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
    settable = {k: p for k, p in named.items() if k not in RESERVED_PARAMS}
    reserved = sorted(set(params) & set(RESERVED_PARAMS))
    if reserved:
        raise AvalancheStrategyError(f"strategy_params of {name}: {reserved} are set by the suite (model, training "
                                     f"settings); valid keys: {sorted(settable)}")
    unknown = sorted(set(params) - set(settable))
    if unknown:
        raise AvalancheStrategyError(f"strategy_params of {name}: unknown key(s) {unknown}; valid keys: "
                                     f"{sorted(settable)}")
    missing = sorted(k for k, p in settable.items() if p.default is inspect.Parameter.empty and k not in params)
    if missing:
        raise AvalancheStrategyError(f"strategy_params of {name}: {missing} have no default and must be set; "
                                     f"valid keys: {sorted(settable)}")
    for key, value in params.items():
        problem = _value_problem(value, settable[key])
        if problem:
            raise AvalancheStrategyError(f"strategy_params of {name}: {key} = {value!r} {problem}")
    defaults = {k: p.default for k, p in settable.items() if p.default is not inspect.Parameter.empty
                and _plain(p.default)}
    return {**defaults, **params}


PLAIN_TYPES = (bool, int, float, str)


def _value_problem(value: Any, parameter: inspect.Parameter) -> str | None:
    """Why ``value`` cannot be the constructor argument ``parameter``, judged by its annotation (``float``, ``int``,
    ``bool``, ``str``, optionally ``Optional``) or, without one, its plain default's type; None when it can, or when
    the annotation says nothing checkable. A negative number is refused where the default is a number at least 0 or
    the annotation is ``int`` without a default (sizes, counts and weights)."""
    annotation = parameter.annotation
    allowed = [a for a in typing.get_args(annotation) if a is not type(None)] if typing.get_origin(
        annotation) is typing.Union else [annotation]
    if value is None and (type(None) in typing.get_args(annotation) or parameter.default is None):
        return None
    kinds = [a for a in allowed if a in PLAIN_TYPES] or ([type(parameter.default)] if isinstance(
        parameter.default, PLAIN_TYPES) else [])
    if not kinds:
        return None
    fits = any(isinstance(value, bool) if kind is bool else isinstance(value, str) if kind is str else
               isinstance(value, (int, float)) and not isinstance(value, bool) and (kind is float or
                                                                                   isinstance(value, int))
               for kind in kinds)
    if not fits:
        return f"has type {type(value).__name__}; the constructor takes {' or '.join(k.__name__ for k in kinds)}"
    counts = isinstance(parameter.default, (int, float)) and not isinstance(parameter.default, bool) and \
        parameter.default >= 0 or parameter.default is inspect.Parameter.empty and int in kinds
    if counts and isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
        return "is negative; it is a size, count or weight (at least 0)"
    return None


class LogitsOnly(nn.Module):
    """``forward(x) -> logits`` of a :class:`RetrievalModel` (whose forward gives ``(logits, features)``), the
    output Avalanche strategies expect; column y scores class y (a d-Simplex head's columns are reversed, since
    class y is vertex K-1-y, METHODS.md §5). ``retrieval_model`` is the wrapped model, whose parameters are this
    module's."""

    def __init__(self, retrieval_model: RetrievalModel) -> None:
        super().__init__()
        self.retrieval_model = retrieval_model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.retrieval_model(x)[0]
        return logits.flip(1) if isinstance(self.retrieval_model.head, DSimplexHead) else logits


def unwrap(model: nn.Module) -> nn.Module:
    """The retrieval model inside a :class:`LogitsOnly` (or anything with a ``retrieval_model``), else ``model``."""
    return getattr(model, "retrieval_model", model)


PUBLIC_PLUGINS = ("HeadGrowthPlugin", "ReplacementPlugin")
"""The Avalanche plugins importable from this module; each is built on first access (Avalanche's import costs
seconds), so ``from cl2r_bench.training.avalanche import ReplacementPlugin`` imports Avalanche and nothing else does."""


@functools.cache
def _plugin_classes() -> dict[str, type]:
    """The Avalanche plugins of this module, built on first use (importing Avalanche costs seconds)."""
    _import_avalanche_training()
    from avalanche.core import SupervisedPlugin

    class CosineLR(SupervisedPlugin):
        """Cosine learning rate per experience, set on every parameter group of the strategy's current optimizer
        at the start of each epoch (so a rebuilt optimizer needs no new scheduler)."""

        def __init__(self, lr: float, lr_min: float, epochs: int) -> None:
            super().__init__()
            self.lr, self.lr_min, self.epochs = lr, lr_min, epochs
            self.epoch = 0

        def before_training_exp(self, strategy: Any, **kwargs: Any) -> None:
            self.epoch = 0

        def before_training_epoch(self, strategy: Any, **kwargs: Any) -> None:
            lr = self.lr_min + 0.5 * (self.lr - self.lr_min) * (
                1 + math.cos(math.pi * min(self.epoch, self.epochs) / max(self.epochs, 1)))
            for group in strategy.optimizer.param_groups:
                group["lr"] = lr
            self.epoch += 1

    class TrainingCounter(SupervisedPlugin):
        """Iterations, images and the last loss of one ``train()`` call (the loss read every 25 iterations and at
        the end of each epoch; a non-finite loss raises :class:`NonFiniteError`)."""

        def __init__(self, progress: Any = None) -> None:
            super().__init__()
            self.progress = progress
            self.iterations, self.images, self.last_loss = 0, 0, float("nan")

        def before_training_exp(self, strategy: Any, **kwargs: Any) -> None:
            if self.progress is not None:
                self.progress.reset(total=strategy.train_epochs * len(strategy.dataloader))

        def after_training_iteration(self, strategy: Any, **kwargs: Any) -> None:
            self.iterations += 1
            self.images += len(strategy.mb_y)
            if self.iterations % 25 == 0:
                self._read_loss(strategy)
            if self.progress is not None:
                self.progress.update(1)

        def after_training_epoch(self, strategy: Any, **kwargs: Any) -> None:
            self._read_loss(strategy)

        def _read_loss(self, strategy: Any) -> None:
            self.last_loss = float(strategy.loss.detach())
            if not math.isfinite(self.last_loss):
                raise NonFiniteError(f"the loss is {self.last_loss} at iteration {self.iterations}")

    class HeadGrowthPlugin(SupervisedPlugin):
        """Grows the head of the strategy's retrieval model to ``len(experience.classes_seen_so_far)`` before each
        training experience, so that nobody calls ``model.head.grow`` by hand (old rows kept, new rows freshly
        initialised; a d-Simplex head already has its K vertices and only checks the count, METHODS.md §5).

        It acts in ``before_train_dataset_adaptation``: later in the same ``train()`` call,
        ``check_model_and_optimizer`` re-binds the optimizer by parameter name, so the grown classifier is the one
        trained (growing in ``before_training_exp`` would leave the optimizer on the old, smaller weight). The
        strategy's model is a :class:`LogitsOnly` or a :class:`~cl2r_bench.models.RetrievalModel`."""

        def before_train_dataset_adaptation(self, strategy: Any, **kwargs: Any) -> None:
            _grow_to_seen_classes(unwrap(strategy.model), strategy.experience)

    class ReplacementPlugin(HeadGrowthPlugin):
        """IAM-CL2R's model replacement inside Avalanche's ``train()``: at each experience listed in
        ``replacements`` the strategy's model becomes ``LogitsOnly(replacements[index]())``, an improved pretrained
        model, before anything is trained on that experience (METHODS.md §4).

        ``replacements`` maps an experience index (``experience.current_experience``) to a callable returning a
        fresh :class:`~cl2r_bench.models.RetrievalModel` with the replacement weights already loaded; it is called
        once, when that experience starts, so no replacement model is held in memory before it is needed.
        :meth:`from_files` builds the callables from checkpoint paths and a model factory (the suite's own
        replacement files, ``Scenario.starting_models``). At every experience the head of the strategy's model is
        grown to the classes seen so far (as :class:`HeadGrowthPlugin` does, so the two are not used together;
        ``grow_head=False`` grows only the head of an incoming model).

        Where: ``before_train_dataset_adaptation``, the first per-experience callback, before Avalanche builds the
        dataloader and binds the optimizer (``check_model_and_optimizer``); swapping ``strategy.model`` in
        ``before_training_exp`` instead trains nothing, silently. The swap moves the new model to
        ``strategy.device`` in train mode and re-points the strategy's own optimizer at its parameters by name
        (``make_optimizer(reset_optimizer_state=True, remove_params=True)``): the optimizer object, its
        hyper-parameters and parameter groups are kept, its momentum is reset and the outgoing model's parameters
        leave it, so the outgoing model object is never updated again. Everything else the strategy holds (replay
        buffer, old model, importances, clock, evaluator, plugins) is left as it is. Plugins that read
        ``strategy.model`` after the experience (``benchmarks.avalanche_plugin.CompatibilityPlugin`` deploys it in
        ``after_training_exp``) see the new model.

        ``replaced`` lists the experiences at which a swap happened, in order."""

        def __init__(self, replacements: Mapping[int, Callable[[], RetrievalModel]], *, grow_head: bool = True) -> None:
            super().__init__()
            bad = [k for k in replacements if isinstance(k, bool) or not isinstance(k, int) or k < 0]
            if bad:
                raise ValueError(f"ReplacementPlugin: experience indices must be non-negative ints, got {bad}")
            uncallable = sorted(k for k, v in replacements.items() if not callable(v))
            if uncallable:
                raise TypeError(f"ReplacementPlugin: the replacements of experiences {uncallable} are not callables "
                                "returning a model")
            self.replacements = dict(replacements)
            self.grow_head = grow_head
            self.replaced: list[int] = []

        @classmethod
        def from_files(cls, paths: Mapping[int, str | Path], build: Callable[[], RetrievalModel],
                       load: Callable[[RetrievalModel, str], None] = load_replacement,
                       **kwargs: Any) -> ReplacementPlugin:
            """The plugin replacing the model at experience ``t`` by ``build()`` with ``paths[t]`` loaded by
            ``load(model, path)``: by default :func:`~cl2r_bench.models.load_replacement`, which loads the feature
            extractor and drops a learnable classifier (METHODS.md §4); the suite's runs use
            ``Scenario.load_starting_model``. A missing or mismatching file raises
            :class:`~cl2r_bench.models.CheckpointError` when its experience starts."""
            return cls({t: functools.partial(_built_and_loaded, build, load, str(path)) for t, path in paths.items()},
                       **kwargs)

        def before_train_dataset_adaptation(self, strategy: Any, **kwargs: Any) -> None:
            index = strategy.experience.current_experience
            if index in self.replacements:
                self._swap(strategy, unwrap(self.replacements[index]()))
                self.replaced.append(index)
            elif self.grow_head:
                super().before_train_dataset_adaptation(strategy, **kwargs)

        @staticmethod
        def _swap(strategy: Any, model: nn.Module) -> None:
            """Make ``model`` the strategy's and re-point its optimizer at it by parameter name. Before the
            strategy's first experience the optimizer's parameters have no names yet, so they are named first (what
            ``check_model_and_optimizer`` would do), which keeps a user's parameter groups."""
            if strategy.optimized_param_id is None:
                strategy.make_optimizer(reset_optimizer_state=True)
            _grow_to_seen_classes(model, strategy.experience)
            strategy.model = LogitsOnly(model.to(strategy.device).train())
            strategy.make_optimizer(reset_optimizer_state=True, remove_params=True)

    classes = {"CosineLR": CosineLR, "TrainingCounter": TrainingCounter, "HeadGrowthPlugin": HeadGrowthPlugin,
               "ReplacementPlugin": ReplacementPlugin}
    for name in PUBLIC_PLUGINS:
        classes[name].__module__, classes[name].__qualname__ = __name__, name
    return classes


def __getattr__(name: str) -> Any:
    """The plugins of :data:`PUBLIC_PLUGINS`, built on first access."""
    if name in PUBLIC_PLUGINS:
        return _plugin_classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _grow_to_seen_classes(model: nn.Module, experience: Any) -> None:
    """Grow ``model``'s head to the classes seen up to ``experience``; a model without a growing head is a
    TypeError naming what the plugins expect."""
    grow = getattr(getattr(model, "head", None), "grow", None)
    if grow is None:
        raise TypeError(f"{type(model).__name__} has no head.grow: the plugins expect a RetrievalModel, or a "
                        "LogitsOnly wrapping one, as strategy.model")
    grow(len(experience.classes_seen_so_far))


def _built_and_loaded(build: Callable[[], RetrievalModel], load: Callable[[RetrievalModel, str], None],
                      path: str) -> RetrievalModel:
    model = build()
    load(model, path)
    return model


def cosine_lr_plugin(lr: float, lr_min: float, epochs: int) -> Any:
    """An Avalanche plugin setting the learning rate of epoch e of each experience to
    ``lr_min + (lr - lr_min) (1 + cos(pi e / epochs)) / 2`` (METHODS.md §4's schedule, stepped per epoch)."""
    return _plugin_classes()["CosineLR"](lr, lr_min, epochs)


def build_avalanche_strategy(name: str, params: dict[str, Any] | None, model: RetrievalModel, *,
                             optimizer: torch.optim.Optimizer, epochs: int, batch_size: int,
                             device: torch.device | str, plugins: Sequence[Any] = ()) -> Any:
    """The ``SupervisedTemplate`` named ``name`` on ``LogitsOnly(model)`` with ``params`` (:func:`check_params`),
    cross-entropy, ``epochs`` epochs of mini-batches of ``batch_size`` per experience, an evaluator without
    loggers and ``plugins`` (no learning-rate schedule unless a plugin sets one: :func:`cosine_lr_plugin`).
    ``optimizer`` must hold ``model``'s parameters. A constructor failure raises :class:`AvalancheStrategyError`.
    The libraries the suite deferred at Avalanche's import are imported here, before any training is timed."""
    cls = avalanche_strategy_class(name)
    kwargs = check_params(name, params)
    _import_avalanche_training()
    import_deferred()
    from avalanche.training.plugins import EvaluationPlugin

    wrapped = model if isinstance(model, LogitsOnly) else LogitsOnly(model)
    with avalanche_warnings_filtered():
        evaluator = EvaluationPlugin(loggers=[])
        try:
            return cls(model=wrapped, optimizer=optimizer, criterion=nn.CrossEntropyLoss(), train_mb_size=batch_size,
                       train_epochs=epochs, eval_mb_size=batch_size, device=device, evaluator=evaluator,
                       plugins=list(plugins), **kwargs)
        except (TypeError, ValueError, AssertionError) as exc:
            raise AvalancheStrategyError(f"{name}({kwargs}) cannot be built: {type(exc).__name__}: {exc}") from None


def rebind(strategy: Any, model: RetrievalModel, optimizer: torch.optim.Optimizer) -> None:
    """Give ``strategy`` a new model (e.g. a replacement model, METHODS.md §4) and a fresh ``optimizer`` over it,
    between two ``train()`` calls. Avalanche's optimizer bookkeeping (``optimized_param_id``) is reset so the next
    ``train()`` maps the new parameters by name; the strategy's own state (replay buffer, old model, importances)
    is kept."""
    strategy.model = model if isinstance(model, LogitsOnly) else LogitsOnly(model)
    strategy.optimizer = optimizer
    strategy.optimized_param_id = None


def train_on_experience(strategy: Any, name: str, params: dict[str, Any] | None, model: RetrievalModel,
                        experience: Any, settings: Any, *, device: torch.device | str,
                        description: str = "") -> tuple[Any, dict[str, float]]:
    """Train ``model`` in place on one experience with the Avalanche strategy ``name``; returns
    ``(strategy, {"seconds", "iterations", "images", "final_loss"})`` for the next call.

    ``strategy`` is None at the first experience (it is built with :func:`build_avalanche_strategy`: SGD at
    ``settings.lr`` / ``momentum`` / ``weight_decay`` as the suite's optimizer, ``settings.epochs`` and
    ``settings.batch_size``, :func:`cosine_lr_plugin` to ``settings.lr_min``); when ``model`` is not the
    strategy's model (a replacement) it is :func:`rebind`-ed with a fresh optimizer. The caller grows the head
    first. A non-finite loss or non-finite weights raise :class:`~cl2r_bench.models.NonFiniteError`."""
    from tqdm import tqdm


    if strategy is None:
        strategy = build_avalanche_strategy(
            name, params, model, optimizer=make_optimizer(model, settings), epochs=settings.epochs,
            batch_size=settings.batch_size, device=device,
            plugins=[cosine_lr_plugin(settings.lr, settings.lr_min, settings.epochs)])
    elif unwrap(strategy.model) is not model:
        rebind(strategy, model, make_optimizer(model, settings))
    progress = tqdm(desc=description, leave=False, mininterval=1.0, disable=not getattr(settings, "progress", False))
    counter = _plugin_classes()["TrainingCounter"](progress)
    strategy.plugins.insert(0, counter)
    started = time.perf_counter()
    try:
        with avalanche_warnings_filtered():
            strategy.train(experience, eval_streams=[])
    finally:
        strategy.plugins.remove(counter)
        progress.close()
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    broken = first_nonfinite_tensor(model)
    if broken is not None:
        raise NonFiniteError(f"{broken} holds NaN or infinite values after {counter.iterations} iterations")
    return strategy, {"seconds": time.perf_counter() - started, "iterations": counter.iterations,
                      "images": counter.images, "final_loss": counter.last_loss}


# HeadGrowthPlugin, ReplacementPlugin and the other plugins are built on first access (__getattr__ below).
__all__ = ["AVALANCHE_PREFIX", "PUBLIC_PLUGINS", "RESERVED_PARAMS", "UNSUPPORTED", "AvalancheStrategyError",
           "HeadGrowthPlugin", "LogitsOnly", "ReplacementPlugin", "avalanche_strategy_class",
           "build_avalanche_strategy", "check_params", "cosine_lr_plugin", "is_avalanche_strategy", "rebind",
           "strategy_names", "train_on_experience", "unwrap"]
