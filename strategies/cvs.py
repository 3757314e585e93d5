"""CVS (Wan et al. 2022, as in the released code; METHODS.md §6): cosine classifier + backward consistency.

    L = L_c + 10 * L_m + 1 * L_d
    L_c = CE(cos(w_y, phi_t(x)) / 0.05, y)                         (cosine classifier, ``head = "cosine"``)
    L_m = mean_i max(0, d(a_i, p_i) - d(a_i, n_i) + 0.1)           (triplet, Euclidean on unit features)
          a_i = phi_t(x_i), p_i = phi_old(x_i), n_i = the phi_old(x_k) nearest to a_i with y_k != y_i in the batch
    L_d = mean over old-class samples of || c_y - phi_t(x) ||^2
          c_y = mean of the old model's normalised features of class y (from the task's samples of the old classes)

Features are L2-normalised throughout (this suite's reading of "normalised features"); anchors without any other-class
sample in the batch are left out of ``L_m``. The prototypes ``c_y`` are made once per task from every sample of an old
class the task sees: in a class-incremental stream the replay memory (the CL2R code's), in the upgrade protocol the old
classes' images of the new training set (its memory stays empty; the two-model experiments make the old classes'
prototypes from those images). The frozen old model is the teacher of ``cl2r_bench/strategy.py``: the previous task's
model, or at a replacement, by default, the model deployed before it (``replacement_teacher: outgoing``: CVS keeps the
new model consistent with the deployed one; ``incoming`` anchors the replacement to itself, as the IAM-CL2R code's
shared loop does). At CL2R task 0 (no old model) the loss is ``L_c``. The cosine head loads the learnable family's
replacement models (backbone only).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cl2r_bench.models import class_means
from cl2r_bench.plugin_settings import setting
from cl2r_bench.strategy import REPLACEMENT_TEACHERS, Step, Strategy, TaskContext, register_strategy


@dataclass(frozen=True)
class CVSConfig:
    temperature: float = setting(0.05, above=0)
    triplet_weight: float = 10.0
    margin: float = 0.1
    prototype_weight: float = 1.0
    replacement_teacher: str = setting("outgoing", choices=REPLACEMENT_TEACHERS)


def nearest_negative_triplet_loss(anchors: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor,
                                  margin: float) -> torch.Tensor:
    """``L_m`` for unit ``anchors`` (new model) and unit ``teacher`` features of the same batch."""
    squared = (2 - 2 * anchors @ teacher.t()).clamp(min=1e-12)
    distances = squared.sqrt()
    other = labels[:, None] != labels[None, :]
    valid = other.any(dim=1)
    if not bool(valid.any()):
        return anchors.new_zeros(())
    positive = distances.diagonal()
    negative = distances.masked_fill(~other, float("inf")).min(dim=1).values
    return F.relu(positive - negative + margin)[valid].mean()


def prototype_loss(features: torch.Tensor, labels: torch.Tensor, prototypes: torch.Tensor,
                   has_prototype: torch.Tensor) -> torch.Tensor:
    """``L_d``: mean squared distance of the samples whose class has a prototype to that prototype."""
    in_range = labels < len(prototypes)
    keep = in_range.clone()
    keep[in_range] = has_prototype[labels[in_range]]
    if not bool(keep.any()):
        return features.new_zeros(())
    return (prototypes[labels[keep]] - features[keep]).pow(2).sum(dim=1).mean()


@register_strategy("cvs")
class CVS(Strategy):
    loss_summary = '`L_c + 10·L_m (triplet, margin 0.1) + 1·L_d (old class means)`'
    reference = 'Wan et al., CVPR 2022'
    authors_recipe_source = "none: no training recipe of CVS's authors is at hand"
    head = "cosine"
    uses_memory = True
    needs_teacher = True
    Config = CVSConfig

    def __init__(self, config: CVSConfig) -> None:
        super().__init__(config)
        self.prototypes: torch.Tensor | None = None
        self.has_prototype: torch.Tensor | None = None

    def before_task(self, context: TaskContext) -> None:
        self.prototypes = self.has_prototype = None
        if not context.has_teacher or context.num_old_classes == 0:
            return
        seen = context.seen_data
        old = seen.select(torch.nonzero(seen.labels < context.num_old_classes).flatten())
        if len(old):
            _, features, labels = context.teacher_outputs(old)
            self.prototypes, self.has_prototype = class_means(F.normalize(features, dim=1), labels,
                                                              context.num_old_classes)

    def loss(self, step: Step) -> torch.Tensor:
        classification = F.cross_entropy(step.logits / self.config.temperature, step.targets)
        if step.teacher_features is None:
            return self.terms(classification=classification)
        new = F.normalize(step.features.float(), dim=1)
        terms = {"classification": classification,
                 "triplet": self.config.triplet_weight * nearest_negative_triplet_loss(
                     new, step.teacher_features, step.labels, self.config.margin)}
        if self.prototypes is not None:
            terms["prototype"] = self.config.prototype_weight * prototype_loss(new, step.labels, self.prototypes,
                                                                               self.has_prototype)
        return self.terms(**terms)
