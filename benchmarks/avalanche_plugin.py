"""The compatibility evaluation as an Avalanche plugin: measure any Avalanche strategy for compatibility.

:class:`CompatibilityPlugin` wraps :class:`benchmarks.retrieval.CompatibilityEvaluator` (METHODS.md §1, §3): after
each training experience it deploys the strategy's current model (its ``retrieval_model`` when it has one, as a
``cl2r_bench.training.avalanche.LogitsOnly`` wrapper does, else the model itself, which must return
``(logits, features)``) and appends its row ``M[t][0..t]`` to the
compatibility matrix, embedding the gallery once per model (kept for later rows) and the queries once. AC, AA and
the suite's other metrics (METHODS.md §2) come from :meth:`CompatibilityPlugin.metrics`. When the strategy's
evaluator has loggers, ``Compatibility/AC`` and ``Compatibility/AA`` of the top-left block (AC_t, AA_t) are
published to them after each experience.

Usage, with a stream built by the suite (``cl2r_bench/data/streams.py``)::

    plugin = CompatibilityPlugin.from_stream(stream)
    strategy = Naive(model=LogitsOnly(model), optimizer=..., plugins=[plugin], ...)
    for experience in stream.benchmark.train_stream:
        model.head.grow(len(experience.classes_seen_so_far))
        strategy.train(experience)
    plugin.matrix, plugin.metrics()

This module imports Avalanche (seconds): the suite's fast paths (``runner.py --help``, leaderboards) never import
it.
"""
from __future__ import annotations

from typing import Any

import torch

from benchmarks.metrics import all_metrics, as_matrix
from benchmarks.retrieval import CompatibilityEvaluator
from cl2r_bench.data.avalanche_import import importing_avalanche
from cl2r_bench.data.datasets import ImageSet
from cl2r_bench.models import DEFAULT_AMP

with importing_avalanche():
    from avalanche.core import SupervisedPlugin
    from avalanche.evaluation.metric_results import MetricValue


class CompatibilityPlugin(SupervisedPlugin):
    """Fills the compatibility matrix of a strategy's models, one row per training experience.

    ``query`` / ``gallery`` are the evaluation sets (uint8 images, labels; never trained on); ``mode``,
    ``batch_size`` and ``amp`` are :class:`CompatibilityEvaluator`'s (gallery templates or images, embedding
    batch size, autocast on CUDA); ``tie_rule`` decides whether an equal score counts as compatible (METHODS.md
    §2). An existing ``evaluator`` may be passed instead of the evaluation sets (e.g. one resumed from a state).
    """

    def __init__(self, query: ImageSet | None = None, gallery: ImageSet | None = None, *, mode: str = "templates",
                 batch_size: int = 512, amp: bool | str = DEFAULT_AMP, tie_rule: str = "strict",
                 evaluator: CompatibilityEvaluator | None = None) -> None:
        super().__init__()
        if evaluator is None:
            if query is None or gallery is None:
                raise ValueError("CompatibilityPlugin needs query and gallery image sets, or an evaluator")
            evaluator = CompatibilityEvaluator(query, gallery, mode=mode, batch_size=batch_size, amp=amp)
        self.evaluator, self.tie_rule = evaluator, tie_rule

    @classmethod
    def from_stream(cls, stream: Any, **kwargs: Any) -> CompatibilityPlugin:
        """The plugin on a suite stream's evaluation sets (``stream.query``, ``stream.gallery``)."""
        return cls(stream.query, stream.gallery, **kwargs)

    def after_training_exp(self, strategy: Any, **kwargs: Any) -> None:
        self.deploy(getattr(strategy.model, "retrieval_model", strategy.model))
        self._publish(strategy)

    def deploy(self, model: torch.nn.Module) -> list[float]:
        """Deploy ``model`` (``model(x) -> (logits, features)``) as the next row and return it; what the plugin does
        after each experience, callable directly for a model that changes outside training."""
        return self.evaluator.deploy(model)

    @property
    def matrix(self) -> list[list[float | None]]:
        """The compatibility matrix so far: fractions, None above the diagonal."""
        return self.evaluator.matrix

    def metrics(self) -> dict[str, Any]:
        """AC, AA, ACA, per-task AC_t / AA_t, BC, FC and the violations of the matrix so far
        (:func:`benchmarks.metrics.all_metrics`; accuracies in percent)."""
        if not self.evaluator.rows:
            raise ValueError("no model has been deployed yet: train on an experience first")
        return all_metrics(as_matrix(self.matrix, scale="fraction"), self.tie_rule)

    def _publish(self, strategy: Any) -> None:
        """Hand AC_t and AA_t to the strategy's Avalanche loggers, if it has any."""
        evaluator = getattr(strategy, "evaluator", None)
        if evaluator is None or not getattr(evaluator, "loggers", None):
            return
        t = len(self.evaluator.rows) - 1
        values = self.metrics()
        for name in ("AC", "AA"):
            evaluator.publish_metric_value(MetricValue(self, f"Compatibility/{name}", values[name], x_plot=t))


__all__ = ["CompatibilityPlugin"]
