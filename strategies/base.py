"""The strategy template and registry.

A strategy is one file in ``strategies/`` plus one import line in ``strategies/__init__.py``::

    from dataclasses import dataclass
    import torch.nn.functional as F
    from strategies.base import Step, Strategy, register_strategy

    @dataclass(frozen=True)
    class MyConfig:
        weight: float = 1.0          # every hyper-parameter, with its default (shown in configs/default.yaml)

    @register_strategy("my_strategy")
    class MyStrategy(Strategy):
        '''What it does, the equation it implements (cite METHODS.md), what it keeps at a replacement.'''
        head = "learnable"           # or "dsimplex": the head family, also of its replacement models
        uses_memory = True           # batches mix 64 replay + 64 new samples from task 1 on
        needs_teacher = False        # True: step.teacher_features holds the frozen start model's features
        Config = MyConfig

        def loss(self, step: Step) -> torch.Tensor:
            return self.config.weight * F.cross_entropy(step.logits, step.targets)

The trainer owns the loop, the optimiser, the memory and the teacher; a strategy only turns one mini-batch's
outputs into a loss (and may override :meth:`Strategy.before_task`). Hyper-parameters come from
``strategy_params.<name>`` in the config, checked against ``Config``.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch

_STRATEGIES: dict[str, type["Strategy"]] = {}


class StrategyError(ValueError):
    """Unknown strategy or invalid strategy parameters."""


@dataclass
class Step:
    """One training mini-batch and the model's outputs on it.

    Attributes:
        labels: stream labels (class i of the class order has label i).
        targets: logit indices of ``labels`` (the vertex K-1-y for a d-Simplex head).
        logits: classifier outputs.
        features: un-normalised retrieval features of the model being trained.
        from_memory: True for replay samples.
        teacher_features: L2-normalised features of the frozen teacher (the model this task started from),
            or None when the strategy does not ask for them or the task starts from a random model.
    """

    labels: torch.Tensor
    targets: torch.Tensor
    logits: torch.Tensor
    features: torch.Tensor
    from_memory: torch.Tensor
    teacher_features: torch.Tensor | None = None


@dataclass(frozen=True)
class NoParams:
    """A strategy without hyper-parameters."""


class Strategy:
    """Base class of every strategy (see the module docstring for the template)."""

    name: ClassVar[str] = ""
    head: ClassVar[str] = "learnable"
    uses_memory: ClassVar[bool] = True
    needs_teacher: ClassVar[bool] = False
    Config: ClassVar[type] = NoParams

    def __init__(self, config: Any) -> None:
        self.config = config

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "Strategy":
        """Build from ``strategy_params.<name>``; unknown keys or wrong types raise :class:`StrategyError`."""
        valid = {f.name: f for f in fields(cls.Config)}
        unknown = sorted(set(params) - set(valid))
        if unknown:
            raise StrategyError(f"unknown parameter(s) {unknown} for strategy {cls.name!r}; valid: {sorted(valid)}")
        defaults = cls.Config()
        for key, value in params.items():
            default = getattr(defaults, key)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) if isinstance(default, float) \
                else isinstance(value, type(default))
            if not ok:
                raise StrategyError(f"strategy_params.{cls.name}.{key} = {value!r}: expected "
                                    f"{type(default).__name__} like the default {default!r}")
        try:
            return cls(cls.Config(**params))
        except ValueError as exc:
            raise StrategyError(str(exc)) from None

    def before_task(self, task_index: int, num_seen_classes: int, num_new_classes: int) -> None:
        """Called before training each task (e.g. to set a task-dependent weight)."""

    def loss(self, step: Step) -> torch.Tensor:
        """The loss of one mini-batch."""
        raise NotImplementedError


def register_strategy(name: str):
    """Class decorator: register a :class:`Strategy` subclass under ``name`` (a duplicate is an error)."""

    def decorate(cls: type[Strategy]) -> type[Strategy]:
        if name in _STRATEGIES:
            raise StrategyError(f"strategy {name!r} is registered twice ({_STRATEGIES[name].__module__} and "
                                f"{cls.__module__})")
        if cls.head not in ("learnable", "dsimplex"):
            raise StrategyError(f"strategy {name!r}: head must be 'learnable' or 'dsimplex', not {cls.head!r}")
        cls.name = name
        _STRATEGIES[name] = cls
        return cls

    return decorate


def get_strategy(name: str) -> type[Strategy]:
    """The strategy class registered as ``name``; a miss lists the valid names."""
    if name not in _STRATEGIES:
        raise StrategyError(f"unknown strategy {name!r}; choose from {sorted(_STRATEGIES)}")
    return _STRATEGIES[name]


def list_strategies() -> list[str]:
    return sorted(_STRATEGIES)
