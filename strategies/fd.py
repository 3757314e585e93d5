"""FD: learnable growing head + feature distillation on the replay samples (METHODS.md §6, CL2R baseline).

    L = CE + lambda_t * mean_{i in memory half} (1 - cos(phi_t(x_i), phi_old(x_i)))

with ``lambda_t = lambda_base * sqrt(#new classes / #old classes)`` (``lambda_base`` = 5; "old" = the classes
seen before this task). That is the CL2R code's rule, the inverse of LUCIR's ``sqrt(old / new)``: kept as coded
and flagged here. ``adaptive: false`` uses ``lambda_base`` as is; ``samples: all`` distils on the whole batch
instead of the memory half. With no old class (task 0) or no replay sample in the batch the loss is plain CE.

The old model is the frozen teacher of ``cl2r_bench/strategy.py``: the previous task's model, or at a replacement
the incoming replacement itself (``replacement_teacher: outgoing``: the model deployed before it). The features
distilled are the retrieval features (the backbone output for this head).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cl2r_bench.plugin_settings import setting
from cl2r_bench.strategy import REPLACEMENT_TEACHERS, Step, Strategy, TaskContext, register_strategy

SAMPLES = ("memory", "all")


@dataclass(frozen=True)
class FDConfig:
    lambda_base: float = 5.0
    adaptive: bool = True
    samples: str = setting("memory", choices=SAMPLES)
    replacement_teacher: str = setting("incoming", choices=REPLACEMENT_TEACHERS)


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
    head = "learnable"
    uses_memory = True
    needs_teacher = True
    Config = FDConfig

    def __init__(self, config: FDConfig) -> None:
        super().__init__(config)
        self.weight = 0.0

    def before_task(self, context: TaskContext) -> None:
        self.weight = distillation_weight(self.config.lambda_base, context.num_new_classes, context.num_old_classes,
                                          self.config.adaptive) if context.has_teacher else 0.0

    def loss(self, step: Step) -> torch.Tensor:
        ce = F.cross_entropy(step.logits, step.targets)
        if step.teacher_features is None or self.weight == 0.0:
            return ce
        select = step.from_memory if self.config.samples == "memory" else torch.ones_like(step.from_memory)
        return ce + self.weight * feature_distillation_loss(step.features, step.teacher_features, select)
