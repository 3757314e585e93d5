"""LCE (Meng et al., ICCV 2021): classifier aligned to the old class centres + an angular boundary (METHODS.md §6b).

"Learning compatible embeddings": the new classifier is aligned to the old model's class centres and the new
features are kept inside each old class's angular boundary.

    L = CE(W phi_t(x), y) + alignment_weight * L_align + boundary_weight * L_boundary
    L_align    = mean_i (1 - c_{y_i} . W_{y_i} / |W_{y_i}|)
    L_boundary = mean_i max(arccos(c_{y_i} . phi_t(x_i) / |phi_t(x_i)|) - theta_{y_i}, 0)

``c_y`` is the old model's normalised class centre and ``theta_y`` the largest angle of the class's old features
to it after the 1.5 IQR rule (``strategies/old_classes.py``); both means run over the batch samples whose class
has a centre and an angle (classes with fewer than two inlier items have none), as the authors' code
(``Ashespt/AdvBCT``, ``COMP_LOSS.TYPE: lce``, ``K = 0``: without the paper's optional transformation of the old
features). ``centre_classes`` picks the classes (``old`` as theirs, or ``seen``). The old model is the teacher of
``cl2r_bench/strategy.py``; its centres are computed once per task from the task's data and the replay memory, so at a
replacement they are the incoming replacement model's (``replacement_teacher: outgoing`` keeps the model deployed
before it). At CL2R task 0 (no old model) the loss is CE.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cl2r_bench.registry import check_choice
from cl2r_bench.strategy import REPLACEMENT_TEACHERS, Step, Strategy, TaskContext, register_strategy

from .old_classes import CENTRE_CLASSES, ClassRegions, task_regions

ARCCOS_LIMIT = 1 - 1e-7
"""Cosines are clamped to ``[-ARCCOS_LIMIT, ARCCOS_LIMIT]`` before the arc-cosine, whose slope is infinite at +-1."""


@dataclass(frozen=True)
class LCEConfig:
    alignment_weight: float = 1.0
    boundary_weight: float = 1.0
    centre_classes: str = "old"
    replacement_teacher: str = "incoming"

    def __post_init__(self) -> None:
        check_choice("centre_classes", self.centre_classes, CENTRE_CLASSES)
        check_choice("replacement_teacher", self.replacement_teacher, REPLACEMENT_TEACHERS)


def boundary_loss(features: torch.Tensor, labels: torch.Tensor, regions: ClassRegions) -> torch.Tensor:
    """``L_boundary`` over the samples whose class has a centre and an angle (0 when none has)."""
    keep = regions.angle_radius[labels].isfinite()
    if not bool(keep.any()):
        return features.new_zeros(())
    cosine = (F.normalize(features[keep], dim=1) * regions.unit_centres[labels[keep]]).sum(dim=1)
    angle = torch.acos(cosine.clamp(-ARCCOS_LIMIT, ARCCOS_LIMIT))
    return F.relu(angle - regions.angle_radius[labels[keep]]).mean()


def alignment_loss(classifier: torch.Tensor, labels: torch.Tensor, regions: ClassRegions) -> torch.Tensor:
    """``L_align`` over the same samples as :func:`boundary_loss`, from the new classifier's rows."""
    keep = regions.angle_radius[labels].isfinite()
    if not bool(keep.any()):
        return classifier.new_zeros(())
    rows = F.normalize(classifier[labels[keep]], dim=1)
    return (1 - (rows * regions.unit_centres[labels[keep]]).sum(dim=1)).mean()


@register_strategy("lce")
class LCE(Strategy):
    head = "learnable"
    uses_memory = True
    needs_teacher = True
    Config = LCEConfig

    def __init__(self, config: LCEConfig) -> None:
        super().__init__(config)
        self.regions: ClassRegions | None = None
        self.model = None

    def before_task(self, context: TaskContext) -> None:
        self.regions = task_regions(context, self.config.centre_classes)
        if self.regions is not None and context.model is None:
            raise ValueError("LCE aligns the trained model's classifier: TaskContext.model must be given")
        self.model = context.model

    def loss(self, step: Step) -> torch.Tensor:
        ce = F.cross_entropy(step.logits, step.targets)
        if self.regions is None:
            return ce
        classifier = self.model.head.classifier.weight
        return (ce + self.config.alignment_weight * alignment_loss(classifier, step.labels, self.regions)
                + self.config.boundary_weight * boundary_loss(step.features, step.labels, self.regions))
