"""BCT (Shen et al. 2020): backward-compatible training through the frozen old classifier (METHODS.md §6).

    L = CE(W_new phi_new(x), y) + lambda * CE(W_old phi_new(x), y)          (lambda = influence_weight = 1)

``W_old`` is frozen for the task: the old model's classifier rows for the classes it was trained on, extended
with the old model's class-mean features (un-normalised, the classifier's input) for the other classes that have
data in this task (the new classes; with BCT-ER also replayed classes). The influence term covers the samples
whose class has a row of ``W_old``. ``new_class_rows: match_norm`` (this suite's choice; the paper is silent on
scale) rescales the class means to the mean norm of the trained rows, so old and new logits are comparable;
``raw`` keeps the means as they are; ``none`` adds no rows, so the term covers the old classes' samples alone, as
the BCT that ``Ashespt/AdvBCT`` trains (``trainer/trainer.py`` L449-465, the authors' recipe's source; at an
``incoming`` replacement, whose classifier is dropped, the term then acts on nothing). No replay memory (BCT-ER:
:mod:`strategies.bct_er`).

At a replacement the old model is, by default, the model deployed before it (``replacement_teacher: outgoing``, the
BCT paper's model-update setting: the new model is trained against the deployed one), whose classifier is extended
with its class means, so the replacement is trained to be compatible with it. ``incoming`` takes the replacement
itself, whose classifier is dropped on loading (``W_old`` then only its class means), as the IAM-CL2R code's shared
loop does. At CL2R task 0 (random start,
no old model) the loss is plain CE.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cl2r_bench.models import class_means
from cl2r_bench.plugin_settings import setting
from cl2r_bench.strategy import REPLACEMENT_TEACHERS, Step, Strategy, TaskContext, register_strategy

from .advbct import ADVBCT_TRAINER_RECIPE

NEW_CLASS_ROWS = ("match_norm", "raw", "none")


@dataclass(frozen=True)
class BCTConfig:
    influence_weight: float = 1.0
    new_class_rows: str = setting("match_norm", choices=NEW_CLASS_ROWS)
    replacement_teacher: str = setting("outgoing", choices=REPLACEMENT_TEACHERS)


def old_classifier(trained_rows: torch.Tensor, features: torch.Tensor, labels: torch.Tensor, num_classes: int,
                   new_class_rows: str = "match_norm") -> tuple[torch.Tensor, torch.Tensor]:
    """``(W_old, row_of_label)``: ``trained_rows`` for labels ``0..len-1``, then (unless ``new_class_rows`` is
    ``none``) the class means of ``features`` for the other labels that have samples; ``row_of_label[y]`` is y's row
    in ``W_old`` or -1."""
    known = len(trained_rows)
    means, present = class_means(features, labels, num_classes)
    present[:known] = False
    if new_class_rows == "none":
        present[:] = False
    extra = means[present]
    if new_class_rows == "match_norm" and known > 0 and len(extra):
        extra = F.normalize(extra, dim=1) * trained_rows.norm(dim=1).mean()
    rows = torch.cat([trained_rows.float().to(extra.device), extra])
    row_of_label = torch.full((num_classes,), -1, dtype=torch.long, device=extra.device)
    row_of_label[:known] = torch.arange(known, device=extra.device)
    row_of_label[present] = torch.arange(known, known + len(extra), device=extra.device)
    return rows.detach(), row_of_label


def influence_loss(features: torch.Tensor, labels: torch.Tensor, old_rows: torch.Tensor,
                   row_of_label: torch.Tensor) -> torch.Tensor:
    """``CE(W_old phi_new(x), y)`` over the samples whose class has a row of ``W_old`` (0 when none has)."""
    rows = row_of_label[labels]
    keep = rows >= 0
    if not bool(keep.any()):
        return features.new_zeros(())
    return F.cross_entropy(features[keep].float() @ old_rows.t(), rows[keep])


@register_strategy("bct")
class BCT(Strategy):
    loss_summary = "`CE + 1·CE(W_old φ_t(x), y)`, W_old frozen: old rows + old model's class means for new classes"
    reference = 'Shen et al., CVPR 2020'
    authors_recipe = ADVBCT_TRAINER_RECIPE
    authors_recipe_source = ("Ashespt/AdvBCT's BCT (BCT's own code is not released): train.py L72-74, L134, "
                             "configs/new_BCT.yml L34-35 (SGD 0.1, MultiStepLR [5, 10, 20] x 0.1, 30 epochs)")
    head = "learnable"
    uses_memory = False
    needs_teacher = True
    Config = BCTConfig

    def __init__(self, config: BCTConfig) -> None:
        super().__init__(config)
        self.old_rows: torch.Tensor | None = None
        self.row_of_label: torch.Tensor | None = None

    def before_task(self, context: TaskContext) -> None:
        self.old_rows = self.row_of_label = None
        if not context.has_teacher:
            return
        data = context.seen_data
        _, features, labels = context.teacher_outputs(data)
        trained = context.teacher.head.classifier.weight[:context.teacher_classes].detach()
        self.old_rows, self.row_of_label = old_classifier(trained, features, labels, context.num_seen_classes,
                                                          self.config.new_class_rows)

    def loss(self, step: Step) -> torch.Tensor:
        ce = F.cross_entropy(step.logits, step.targets)
        if self.old_rows is None:
            return self.terms(classification=ce)
        return self.terms(classification=ce, influence=self.config.influence_weight * influence_loss(
            step.features, step.labels, self.old_rows, self.row_of_label))
