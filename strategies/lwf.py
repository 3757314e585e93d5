"""LwF: learnable growing head, cross-entropy + distillation of the old classifier's outputs (METHODS.md §6).

    L = CE(logits, y) + kd_weight * KD(logits[:, :k], teacher_logits[:, :k], T)
    KD(z, z_old, T) = -mean_i sum_c softmax(z_old_i / T)_c * log softmax(z_i / T)_c        (T = 2)

over the ``k`` classes the old classifier was trained on. KD is the soft-target cross-entropy of Li & Hoiem
(no ``T^2`` factor; its gradient equals that of KL(old || new)). No replay memory, as in the original.

At a replacement the teacher is, by default, the model deployed before it (``replacement_teacher: outgoing``: LwF
distils the previous model into the new one), and its classifier is distilled into the replacement. With
``incoming`` the teacher is the replacement itself, whose classifier is dropped on loading: it knows no stream class,
so ``k = 0`` and that task is trained with plain CE.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cl2r_bench.plugin_settings import setting
from cl2r_bench.strategy import REPLACEMENT_TEACHERS, Step, Strategy, TaskContext, register_strategy


@dataclass(frozen=True)
class LwFConfig:
    kd_weight: float = 1.0
    temperature: float = setting(2.0, above=0)
    replacement_teacher: str = setting("outgoing", choices=REPLACEMENT_TEACHERS)


def distillation_loss(logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Soft-target cross-entropy between the teacher's and the student's tempered softmax (see the module)."""
    soft_targets = F.softmax(teacher_logits.float() / temperature, dim=1)
    return -(soft_targets * F.log_softmax(logits.float() / temperature, dim=1)).sum(dim=1).mean()


@register_strategy("lwf")
class LwF(Strategy):
    loss_summary = '`CE + KD(new logits on old classes, old logits, T = 2)`'
    reference = 'Li and Hoiem, ECCV 2016 / TPAMI 2017'
    authors_recipe_source = ("none: no recipe of the CL2R papers' LwF baseline is public, and Li and Hoiem's is for "
                             "classification")
    head = "learnable"
    uses_memory = False
    needs_teacher = True
    Config = LwFConfig

    def __init__(self, config: LwFConfig) -> None:
        super().__init__(config)
        self.old_classes = 0

    def before_task(self, context: TaskContext) -> None:
        self.old_classes = context.teacher_classes if context.has_teacher else 0

    def loss(self, step: Step) -> torch.Tensor:
        ce = F.cross_entropy(step.logits, step.targets)
        if step.teacher_logits is None or self.old_classes == 0:
            return self.terms(classification=ce)
        k = self.old_classes
        return self.terms(classification=ce, distillation=self.config.kd_weight * distillation_loss(
            step.logits[:, :k], step.teacher_logits[:, :k], self.config.temperature))
