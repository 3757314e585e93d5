"""AdvBCT (Pan et al., CVPR 2023): elastic boundaries around old class centres + an adversarial discriminator (§6b).

"Boundary-aware backward-compatible representation via adversarial learning" (METHODS.md §6b): new features are
kept inside an elastic boundary around each old class centre, and a discriminator, trained through gradient
reversal, pushes the new features' distribution onto the old one's.

    L = CE(W phi_t(x), y) + boundary_weight * L_eb + w_e * L_adv
    L_eb  = sum_i max(d_i - R_{y_i}, 0) / #{i : d_i > R_{y_i}},   d_i = || phi_t(x_i) / |phi_t(x_i)| - c_{y_i} ||
    R_y   = r_y + |r_y - T| sigmoid(b_y)  if r_y < T,   r_y - |r_y - T| sigmoid(b_y)  otherwise
    L_adv = NLL(D(GRL_alpha(phi_t(x))), new) + NLL(D(phi_old(x)), old)
    alpha = 2 / (1 + exp(-10 p)) - 1,   w_e = (E - e + 1) / E

``c_y`` is the mean of the old model's unit features of class y (not re-normalised) and ``r_y`` the largest
distance of those features to it after the 1.5 IQR rule (``cl2r_bench/class_regions.py``; classes with fewer than two
inliers are left out); ``b_y`` is a learnable per-class parameter (initialised uniformly in [-1, 1]).

**The boundary: paper against code.** The paper's boundary shrinks: its overview figure (Fig. 3) gives the elastic
radius as ``r_max - r_e``, the old class's largest radius less a learnable ``r_e``. The code moves every radius toward
``THRESHOLD`` T = 1.0 instead, enlarging the radii below it; on unit features whose class radii lie below 1 (a class
centre of norm ``|c|`` puts distance 1 at ``cos = |c| / 2``) that asks a new feature only for a cosine of ``|c| / 2`` to
its class centre, and ``b_y``, pushed by the loss to widen the boundary, drives ``R_y`` to 1. The suite follows the
paper, as elsewhere (docs/strategies.md): ``threshold`` T = 0 by default, with which the code's own formula is ``R_y =
r_y (1 - sigmoid(b_y))``, the paper's shrinking ``r_max - r_e`` with ``r_e = r_y sigmoid(b_y)`` in ``[0, r_y]``;
``threshold: 1.0`` is the code's.

``D`` is a discriminator (linear 100, batch norm, ReLU, linear 2, log-softmax) on raw (un-normalised) features;
GRL_alpha passes features forward and multiplies the gradient by -alpha; p is the fraction of the task's iterations
done, e its 0-based epoch and E its epochs. These follow the authors' code (``Ashespt/AdvBCT``: ``COMP_LOSS.TYPE:
bct_limit``, ``ELASTIC_BOUNDARY: True``, ``TRAIN.TYPE: adv_compatible``, ``THRESHOLD: 1.0``, above); the mean of
``L_eb`` over the violating samples only is theirs too. The discriminator and the boundary parameters are built for each
task with a teacher and trained by the task's optimiser (:meth:`Strategy.trainable_modules`). The old model is the
teacher of ``cl2r_bench/strategy.py``: at a replacement, by default, the model deployed before it
(``replacement_teacher: outgoing``: AdvBCT trains the new model against the deployed one; ``incoming`` anchors the
replacement to itself, as the IAM-CL2R code's shared loop does). At CL2R task 0 (no old model) the loss is CE.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from cl2r_bench.class_regions import CENTRE_CLASSES, ClassRegions, task_regions
from cl2r_bench.plugin_settings import WIDTH_MAX, setting
from cl2r_bench.strategy import REPLACEMENT_TEACHERS, Step, Strategy, TaskContext, register_strategy

ADVBCT_TRAINER_RECIPE = {"optimizer": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 0.0005, "epochs": 30,
                         "schedule": "multistep", "milestones": [5, 10, 20], "gamma": 0.1, "warmup_epochs": 0}
"""The recipe of ``Ashespt/AdvBCT``'s trainer (train.py L72-74, L133-134: SGD 0.1, ``MultiStepLR`` [5, 10, 20] x 0.1;
30 epochs in each of its configs), which trains its AdvBCT and its reimplementations of BCT and UniBCT."""

NEW, OLD = 0, 1
"""The discriminator's labels of new and old features."""


@dataclass(frozen=True)
class AdvBCTConfig:
    boundary_weight: float = 1.0
    threshold: float = 0.0
    discriminator_width: int = setting(100, at_least=1, at_most=WIDTH_MAX)
    centre_classes: str = setting("old", choices=CENTRE_CLASSES)
    replacement_teacher: str = setting("outgoing", choices=REPLACEMENT_TEACHERS)


class GradientReversal(torch.autograd.Function):
    """Identity forward; the gradient times ``-alpha`` backward (Ganin & Lempitsky 2015)."""

    @staticmethod
    def forward(ctx, features: torch.Tensor, alpha: float) -> torch.Tensor:
        ctx.alpha = alpha
        return features.view_as(features)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad.neg() * ctx.alpha, None


def discriminator(in_dim: int, width: int) -> nn.Sequential:
    """``D``: which model a feature comes from, as log-probabilities of (new, old)."""
    return nn.Sequential(nn.Linear(in_dim, width), nn.BatchNorm1d(width), nn.ReLU(inplace=True),
                         nn.Linear(width, 2), nn.LogSoftmax(dim=1))


def reversal_weight(progress: float) -> float:
    """``alpha = 2 / (1 + exp(-10 p)) - 1``: 0 at the start of the task, close to 1 at its end."""
    return 2.0 / (1.0 + math.exp(-10.0 * progress)) - 1.0


def adversarial_weight(epoch: int, epochs: int) -> float:
    """``w_e = (E - e + 1) / E`` for the 0-based epoch e of E, as the authors' code weights ``L_adv``."""
    return (epochs - epoch + 1) / epochs


class ElasticBoundary(nn.Module):
    """``R_y`` from the old radii ``r_y``, the threshold T and the learnable ``b_y`` of each class."""

    def __init__(self, radii: torch.Tensor, threshold: float) -> None:
        super().__init__()
        self.register_buffer("radii", radii)
        self.threshold = threshold
        self.logit = nn.Parameter(torch.empty_like(radii).uniform_(-1, 1))

    def forward(self, labels: torch.Tensor) -> torch.Tensor:
        r = self.radii[labels]
        stretch = (r - self.threshold).abs() * torch.sigmoid(self.logit[labels])
        return torch.where(r < self.threshold, r + stretch, r - stretch)


def elastic_boundary_loss(features: torch.Tensor, labels: torch.Tensor, regions: ClassRegions,
                          boundary: ElasticBoundary) -> torch.Tensor:
    """``L_eb``: the mean excess distance over the samples outside their class's boundary (0 when none is)."""
    keep = regions.distance_radius[labels].isfinite()
    if not bool(keep.any()):
        return features.new_zeros(())
    labels = labels[keep]
    distance = (F.normalize(features[keep], dim=1) - regions.centres[labels]).norm(dim=1)
    excess = F.relu(distance - boundary(labels))
    outside = excess > 0
    if not bool(outside.any()):
        return excess.sum()
    return excess[outside].sum() / outside.sum()


def adversarial_loss(features: torch.Tensor, old_raw_features: torch.Tensor, judge: nn.Module,
                     alpha: float) -> torch.Tensor:
    """``L_adv``: the discriminator's NLL on reversed new features (label new) and on old features (label old)."""
    new = judge(GradientReversal.apply(features, alpha))
    old = judge(old_raw_features)
    labels = torch.full((len(features),), NEW, dtype=torch.long, device=features.device)
    return F.nll_loss(new, labels) + F.nll_loss(old, torch.full_like(labels, OLD))


@register_strategy("advbct")
class AdvBCT(Strategy):
    loss_summary = ('`CE + elastic boundary around old centres (shrinking, the paper; `threshold: 1` the code) + '
                    'adversarial discriminator (gradient reversal)`')
    reference = 'Pan et al., CVPR 2023'
    authors_recipe = ADVBCT_TRAINER_RECIPE
    authors_recipe_source = ("Ashespt/AdvBCT: train.py L72-74, L133-134, configs/new_AdvBct.yml L34-40 (SGD 0.1, "
                             "MultiStepLR [5, 10, 20] x 0.1, 30 epochs)")
    head = "learnable"
    uses_memory = True
    needs_teacher = True
    Config = AdvBCTConfig

    def __init__(self, config: AdvBCTConfig) -> None:
        super().__init__(config)
        self.regions: ClassRegions | None = None
        self.boundary: ElasticBoundary | None = None
        self.judge: nn.Module | None = None

    def before_task(self, context: TaskContext) -> None:
        self.regions = task_regions(context, self.config.centre_classes)
        self.boundary = self.judge = None
        if self.regions is None:
            return
        device = self.regions.centres.device
        self.boundary = ElasticBoundary(self.regions.distance_radius.clone(), self.config.threshold).to(device)
        self.judge = discriminator(self.regions.centres.shape[1], self.config.discriminator_width).to(device)

    def trainable_modules(self) -> list[nn.Module]:
        return [] if self.judge is None else [self.judge, self.boundary]

    def loss(self, step: Step) -> torch.Tensor:
        ce = F.cross_entropy(step.logits, step.targets)
        if self.regions is None or step.teacher_raw_features is None:
            return self.terms(classification=ce)
        boundary = elastic_boundary_loss(step.features, step.labels, self.regions, self.boundary)
        adversarial = adversarial_loss(step.features, step.teacher_raw_features, self.judge,
                                       reversal_weight(step.progress))
        return self.terms(classification=ce, boundary=self.config.boundary_weight * boundary,
                          adversarial=adversarial_weight(step.epoch, step.epochs) * adversarial)
