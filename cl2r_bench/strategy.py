"""The strategy template and registry.

A strategy is one file in ``strategies/``, registered as the folder's modules are imported
(:func:`cl2r_bench.plugins.import_folder`), or, outside the package, a file passed with ``--plugin FILE``::

    from dataclasses import dataclass
    import torch
    import torch.nn.functional as F
    from cl2r_bench.plugin_settings import setting
    from cl2r_bench.strategy import Step, Strategy, TaskContext, register_strategy

    @dataclass(frozen=True)
    class MyConfig:                  # every hyper-parameter with its default; strategy_params.my_strategy sets them
        weight: float = 1.0          # a number without bounds: at least 0 (a count: 0 to 2^31 - 1)
        temperature: float = setting(0.1, above=0)            # what it takes, beside the default
        rows: str = setting("mean", choices=("mean", "last"))  # a string names its choices

    @register_strategy("my_strategy")
    class MyStrategy(Strategy):
        '''What it does, the equation it implements (cite docs/METHODS.md §6), what it keeps at a replacement.'''
        head = "learnable"           # "learnable" | "cosine" | "dsimplex": also picks its replacement models
        uses_memory = True           # batches mix 64 replay + 64 new samples from task 1 on
        needs_teacher = False        # True: step.teacher_* hold the frozen old model's outputs
        needs_independent = False    # True: step.independent_features hold an independent new model's (BT²)
        Config = MyConfig
        loss_summary = "`w·CE`"      # its row in the table of strategies (runner.py list --markdown strategies)
        reference = "Author et al., Venue Year"

        def before_task(self, context: TaskContext) -> None:    # optional: per-task set-up
            self.num_old_classes = context.num_old_classes

        def loss(self, step: Step) -> torch.Tensor:
            return self.terms(classification=self.config.weight * F.cross_entropy(step.logits, step.targets))

**Loss terms.** A loss returned through :meth:`Strategy.terms` (``self.terms(classification=ce, distillation=w *
fd)``) is the sum of its named terms, each as it enters the sum (weight included); the training loop logs each
term's mean per epoch into the run's record (``timings.tasks[t].loss_terms``), so a term that never acts shows as 0.
``classification`` names the plain classification loss; every other name is a compatibility term, and a strategy
with a teacher must make one act in every scenario, or say why in :attr:`Strategy.inert_terms`
(``tests/strategies/test_terms_act.py``).

The training template (``cl2r_bench/training/template.py``) owns the loop, the optimiser, the replay memory and the
frozen teacher; a strategy turns one mini-batch's outputs into a loss and may prepare per-task state (class means,
a frozen classifier) in :meth:`Strategy.before_task`. Its defaults are written once, in its ``Config`` dataclass
(``python runner.py list --params`` prints them; a run's ``config.yaml`` records the values used). Any Avalanche
strategy runs without a file here: ``--strategy avalanche:<Class>`` (``cl2r_bench/training/avalanche.py``).

**The teacher** (the frozen old model) is the model the task *started from*: the previous task's model, or at task 0 and
at every replacement task the freshly loaded replacement model (the authors' code, METHODS.md §6). A strategy whose
``Config`` has a field ``replacement_teacher = "outgoing"`` gets instead, at a replacement, the model deployed before it
(whose classifier knows the old classes): the default of every built-in strategy with a teacher but d-Simplex-HOC, whose
papers train the new model against the deployed one (docs/METHODS.md §6). A task that starts from a random model (CL2R
task 0) has no teacher.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from cl2r_bench.data.datasets import ImageSet
from cl2r_bench.errors import PartError
from cl2r_bench.heads import HEADS
from cl2r_bench.models import DEFAULT_AMP, forward_in_batches
from cl2r_bench.plugin_settings import NoParams, config_from_params
from cl2r_bench.registry import Registry

__all__ = ["CLASSIFICATION_TERM", "REPLACEMENT_TEACHERS", "STRATEGIES", "Step", "Strategy", "StrategyError",
           "StrategyFailure", "TaskContext", "default_replacement_teacher", "failures_reported", "get_strategy",
           "list_strategies", "loss_contract_problem", "register_strategy", "strategy_loss"]

REPLACEMENT_TEACHERS = ("incoming", "outgoing")
CLASSIFICATION_TERM = "classification"
"""The name of a loss's plain classification term (:meth:`Strategy.terms`); every other term is a compatibility term."""



class StrategyError(PartError):
    """Unknown strategy or invalid strategy parameters."""


class StrategyFailure(Exception):
    """A strategy's own code failed mid-run (its ``before_task`` or ``loss`` raised) or broke the loss contract
    (a scalar floating-point tensor with a gradient); the message names the strategy and where, the cause is chained
    so the run can keep its traceback in the run folder's log."""


@contextmanager
def failures_reported(strategy: Strategy, where: str) -> Iterator[None]:
    """Run a strategy's own code (``before_task``, ``loss``): anything it raises becomes a
    :class:`StrategyFailure` saying which strategy failed ``where`` (e.g. ``task 1, iteration 5 of 40``)."""
    try:
        yield
    except StrategyFailure:
        raise
    except Exception as exc:  # noqa: BLE001 - a strategy's failure, whatever it is, is reported in one line
        raise StrategyFailure(f"strategy {strategy.name!r} failed at {where}: {type(exc).__name__}: {exc}") from exc


def strategy_loss(strategy: Strategy, step: Step, where: str) -> torch.Tensor:
    """``strategy.loss(step)``, checked: a failure, or a value that cannot be back-propagated, is a
    :class:`StrategyFailure` (:func:`failures_reported`)."""
    with failures_reported(strategy, where):
        loss = strategy.loss(step)
    problem = loss_contract_problem(loss)
    if problem:
        raise StrategyFailure(f"strategy {strategy.name!r} failed at {where}: its loss {problem}")
    return loss


def loss_contract_problem(loss: Any) -> str | None:
    """What makes ``loss`` unusable as a training loss (None when it is a scalar floating-point tensor with a
    gradient)."""
    if not isinstance(loss, torch.Tensor):
        return f"is a {type(loss).__name__}, not a scalar tensor"
    if loss.ndim != 0:
        return f"has shape {tuple(loss.shape)}, not a scalar: reduce it (e.g. .mean())"
    if not loss.is_floating_point():
        return f"has dtype {loss.dtype}, not a floating-point type"
    if not loss.requires_grad:
        return "has no gradient (detached, or built under torch.no_grad): compute it from step.logits / step.features"
    return None


@dataclass
class Step:
    """One training mini-batch and the model's outputs on it.

    Attributes:
        labels: stream labels (class i of the class order has label i).
        targets: logit indices of ``labels`` (the vertex K-1-y for a d-Simplex head).
        logits: classifier outputs.
        features: un-normalised retrieval features of the model being trained.
        from_memory: True for replay samples.
        teacher_features: L2-normalised features of the frozen teacher (see the module docstring), or None
            when the strategy does not ask for them or the task has no teacher.
        teacher_logits: the teacher's classifier outputs (only the first ``TaskContext.teacher_classes`` columns
            are trained on stream classes), or None like ``teacher_features``.
        teacher_raw_features: the teacher's features before normalisation (AdvBCT's discriminator reads them, as
            the authors' code does), or None like ``teacher_features``.
        independent_features: L2-normalised features of the task's independent new model
            (:attr:`TaskContext.independent`) when the strategy asks for them (``needs_independent``), else None.
        new_features: a BT² head's normalised backbone features (:class:`cl2r_bench.heads.BasisTransformationHead`),
            None for every other head.
        iteration: how many of the task's iterations were done before this one (0-based).
        iterations_per_epoch: the task's iterations per epoch; with ``epochs`` they give a schedule's progress
            (AdvBCT's gradient-reversal weight).
        epochs: the task's epochs.
    """

    labels: torch.Tensor
    targets: torch.Tensor
    logits: torch.Tensor
    features: torch.Tensor
    from_memory: torch.Tensor
    teacher_features: torch.Tensor | None = None
    teacher_logits: torch.Tensor | None = None
    teacher_raw_features: torch.Tensor | None = None
    independent_features: torch.Tensor | None = None
    new_features: torch.Tensor | None = None
    iteration: int = 0
    iterations_per_epoch: int = 1
    epochs: int = 1

    @property
    def epoch(self) -> int:
        """The 0-based epoch of this iteration."""
        return self.iteration // max(self.iterations_per_epoch, 1)

    @property
    def progress(self) -> float:
        """The fraction of the task's iterations done before this one, in [0, 1)."""
        return self.iteration / max(self.iterations_per_epoch * self.epochs, 1)


@dataclass
class TaskContext:
    """What :meth:`Strategy.before_task` may use to prepare a task.

    Attributes:
        index: the task index t.
        num_old_classes: classes seen before this task (labels ``0..num_old_classes-1``).
        num_new_classes: classes this task adds (the following labels).
        replacement: True when the task starts from a replacement model.
        teacher_classes: how many stream classes the teacher's classifier was trained on (labels
            ``0..teacher_classes-1``): 0 for a freshly loaded replacement, whose classifier is dropped.
        teacher: the frozen teacher model (``RetrievalModel``), or None (see also ``has_teacher``).
        new_data: this task's training images (``ImageSet``: ``.images`` uint8, ``.labels``).
        memory: the replay memory (``ImageSet``) or None.
        amp: the training autocast setting (dtype name or False) with which ``teacher_outputs`` runs the teacher;
            the teacher normalises its images itself (``cl2r_bench.models``).
        model: the model being trained (``RetrievalModel``), for a loss on its own weights (LCE aligns the
            classifier rows); read its head at loss time, since the head grows between tasks.
        independent: a frozen model trained on the task's classes without any compatibility constraint (the BCT
            line's "independent" new model, BT²'s target; ``Scenario.independent_models``), or None. Given only
            to a strategy that ``needs_independent``.
    """

    index: int
    num_old_classes: int
    num_new_classes: int
    replacement: bool = False
    teacher_classes: int = 0
    teacher: Any = None
    new_data: Any = None
    memory: Any = None
    amp: bool | str = DEFAULT_AMP
    model: Any = None
    independent: Any = None

    @property
    def num_seen_classes(self) -> int:
        return self.num_old_classes + self.num_new_classes

    @property
    def has_teacher(self) -> bool:
        return self.teacher is not None

    @property
    def seen_data(self) -> ImageSet:
        """The task's new data with the replay memory: every image the task can see (for class means of the
        teacher's features: BCT's rows, the BCT line's class summaries and prototypes)."""
        if self.memory is None:
            return self.new_data
        return ImageSet(torch.cat([self.new_data.images, self.memory.images]),
                        torch.cat([self.new_data.labels, self.memory.labels]))

    def teacher_outputs(self, data: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(logits, features, labels)`` of the teacher on every image of the ``ImageSet`` ``data``: no
        augmentation, no gradient, ``features`` un-normalised (e.g. for class means)."""
        outputs = list(forward_in_batches(self.teacher, data.images, amp=self.amp))
        logits, features = (torch.cat(parts) for parts in zip(*outputs, strict=True))
        return logits, features, data.labels.to(features.device)


class Strategy:
    """Base class of every strategy (see the module docstring for the template)."""

    name: ClassVar[str] = ""
    head: ClassVar[str] = "learnable"
    uses_memory: ClassVar[bool] = True
    needs_teacher: ClassVar[bool] = False
    needs_independent: ClassVar[bool] = False
    Config: ClassVar[type] = NoParams
    loss_summary: ClassVar[str] = ""
    """The loss in one line, for the table of strategies (``runner.py list --markdown strategies``)."""
    reference: ClassVar[str] = ""
    """The paper the strategy comes from, for the same table."""
    authors_recipe: ClassVar[dict[str, Any]] = {}
    """The training settings its authors train the new model with (optimiser, lr, epochs, schedule: keys of the
    ``training`` section), taken over the run's with ``training.recipe: authors``; empty: none declared."""
    authors_recipe_source: ClassVar[str] = ""
    """Where :attr:`authors_recipe` comes from (repository, file, lines), for the table of strategies and the docs."""
    inert_terms: ClassVar[dict[str, str]] = {}
    """Scenarios (by name) in which no compatibility term of this strategy acts at the tasks with a teacher, each with
    the reason (the test that walks every strategy in every scenario reads it)."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.last_terms: dict[str, torch.Tensor] = {}

    def terms(self, **weighted: torch.Tensor) -> torch.Tensor:
        """The loss as the sum of its named terms, each as it enters the sum; kept in :attr:`last_terms` for the
        training loop's per-term log (module docstring)."""
        self.last_terms = weighted
        return sum(weighted.values())

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> Strategy:
        """Build from ``strategy_params.<name>``; unknown keys or wrong types raise :class:`StrategyError`."""
        return cls(config_from_params(cls.Config, params, f"strategy_params.{cls.name}", StrategyError))

    @property
    def replacement_teacher(self) -> str:
        """``incoming`` (default) or ``outgoing``: the teacher at a replacement task (module docstring)."""
        return getattr(self.config, "replacement_teacher", "incoming")

    def head_options(self) -> dict[str, Any]:
        """Keyword arguments of the strategy's head (:func:`cl2r_bench.heads.build_head`): BT²'s and OCA's widths and
        maps, MixBCT's first classifier rows. None by default."""
        return {}

    def before_task(self, context: TaskContext) -> None:
        """Called before training each task (e.g. to set a task-dependent weight or build a frozen classifier)."""

    def loss(self, step: Step) -> torch.Tensor:
        """The loss of one mini-batch."""
        raise NotImplementedError

    def trainable_modules(self) -> list[torch.nn.Module]:
        """Modules of the strategy's own (built in :meth:`before_task`, on the model's device) that the task's
        optimiser trains with the model: AdvBCT's discriminator and elastic boundary. None by default."""
        return []


def _check_head(name: str, cls: type[Strategy]) -> None:
    if cls.head not in HEADS:
        raise StrategyError(f"strategy {name!r}: head must be one of {list(HEADS)}, not {cls.head!r}")


def default_replacement_teacher(name: str) -> str | None:
    """The ``replacement_teacher`` strategy ``name`` takes by default (its ``Config``'s), or None for a name that is
    not registered (an Avalanche strategy) or a strategy without one."""
    if name not in STRATEGIES.classes:
        return None
    fields = {item.name: item for item in dataclasses.fields(STRATEGIES.classes[name].Config)}
    return fields["replacement_teacher"].default if "replacement_teacher" in fields else None


STRATEGIES = Registry("strategy", StrategyError, _check_head)
register_strategy = STRATEGIES.register
get_strategy = STRATEGIES.get
list_strategies = STRATEGIES.names
