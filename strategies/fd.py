"""FD: learnable growing head + feature distillation on the old classes' samples (METHODS.md §6, CL2R baseline).

    L = CE + lambda_t * mean_{i: y_i an old class} (1 - cos(phi_t(x_i), phi_old(x_i)))

with ``lambda_t = lambda_base * sqrt(#new classes / #old classes)`` (``lambda_base`` = 5; "old" = the classes
seen before this task). That is the CL2R code's rule, the inverse of LUCIR's ``sqrt(old / new)``: kept as coded
and flagged here. ``adaptive: false`` uses ``lambda_base`` as is.

The samples distilled (``samples``): ``old_classes`` (the default) are the batch's samples of the classes seen before
the task, the samples the old model was trained on. In a class-incremental stream they are exactly the replay half
(a task's new data holds only its new classes), the CL2R code's "memory" samples; in the upgrade protocol, whose new
training set holds the old classes and whose memory stays empty, they are the old classes' images of that set, as
the two-model experiments distil. ``memory`` distils on the replay samples only (the suite's former default, which
left the term inert in ``upgrade``); ``all`` on the whole batch. With no old class (task 0) or none in the batch the
loss is plain CE.

The old model is the frozen teacher of ``cl2r_bench/strategy.py``: the previous task's model, or at a replacement, by
default, the model deployed before it (``replacement_teacher: outgoing``: CL2R distils the new model towards the
previous, deployed one; ``incoming`` distils towards the replacement itself, as the IAM-CL2R code's shared loop does).
The features distilled are the retrieval features (the backbone output for this head).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cl2r_bench.plugin_settings import setting
from cl2r_bench.strategy import REPLACEMENT_TEACHERS, Step, Strategy, TaskContext, register_strategy

SAMPLES = ("old_classes", "memory", "all")


@dataclass(frozen=True)
class FDConfig:
    lambda_base: float = 5.0
    adaptive: bool = True
    samples: str = setting("old_classes", choices=SAMPLES)
    replacement_teacher: str = setting("outgoing", choices=REPLACEMENT_TEACHERS)


def distillation_weight(lambda_base: float, num_new: int, num_old: int, adaptive: bool = True) -> float:
    """``lambda_t`` of METHODS.md §6: ``lambda_base * sqrt(new / old)``; 0 without old classes."""
    if num_old == 0:
        return 0.0
    return lambda_base * math.sqrt(num_new / num_old) if adaptive else lambda_base


def feature_distillation_loss(features: torch.Tensor, teacher_features: torch.Tensor,
                              select: torch.Tensor) -> torch.Tensor:
    """``mean_{i: select_i} (1 - cos(features_i, teacher_features_i))``; 0 when nothing is selected."""
    if not bool(select.any()):
        return features.new_zeros(())
    return (1 - F.cosine_similarity(features[select].float(), teacher_features[select].float(), dim=1)).mean()


@register_strategy("fd")
class FeatureDistillation(Strategy):
    loss_summary = 'the same as `dsimplex_fd`'
    reference = "feature distillation, CL2R's baseline (Biondi et al., TOMM 2023)"
    authors_recipe = {"optimizer": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 0.0005, "epochs": 70,
                      "schedule": "multistep", "milestones": [49, 64], "gamma": 0.1, "warmup_epochs": 0}
    authors_recipe_source = ("NiccoBiondi/CompatibleLifelongRepresentation: src/cl2r/main.py L118-120, L147, "
                             "config.yml L2-9 (SGD 0.1, MultiStepLR [49, 64] x 0.1, 70 epochs a task)")
    head = "learnable"
    uses_memory = True
    needs_teacher = True
    Config = FDConfig

    def __init__(self, config: FDConfig) -> None:
        super().__init__(config)
        self.weight = 0.0
        self.num_old_classes = 0

    def before_task(self, context: TaskContext) -> None:
        self.num_old_classes = context.num_old_classes
        self.weight = distillation_weight(self.config.lambda_base, context.num_new_classes, context.num_old_classes,
                                          self.config.adaptive) if context.has_teacher else 0.0

    def distilled(self, step: Step) -> torch.Tensor:
        """Which samples of the batch are distilled (``samples``, module docstring)."""
        if self.config.samples == "old_classes":
            return step.labels < self.num_old_classes
        return step.from_memory if self.config.samples == "memory" else torch.ones_like(step.from_memory)

    def loss(self, step: Step) -> torch.Tensor:
        ce = F.cross_entropy(step.logits, step.targets)
        if step.teacher_features is None or self.weight == 0.0:
            return self.terms(classification=ce)
        return self.terms(classification=ce, distillation=self.weight * feature_distillation_loss(
            step.features, step.teacher_features, self.distilled(step)))
