"""MixBCT (Liang et al., 2023): one ArcFace loss over a batch of mixed old and new features (METHODS.md §6b).

"MixBCT: Towards Self-Adapting Backward-Compatible Training" (arXiv 2308.06948; code ``yuleung/MixBCT``,
``BCT_Methods/MixBCT/train.py``, ``tools/denoising/denoise_credible.py``). The new model has no second loss: some
rows of its batch of features are replaced by the old model's features of the same images, and the new classifier
is trained with ArcFace on the mixed batch, so it must classify old features too and the new features are drawn
to class regions the old features occupy::

    L = CE(s * arc_m(cos(m_i, W_c)), y_i)          mean over the batch, s = 64, m = 0.5 (their ``ArcFace()``)
    m_i = phi_old(x_i)   for floor(alpha * B) rows drawn at random among the credible rows of the batch
    m_i = phi_t(x_i)     for every other row                                   (``mixing: replace``, alpha = 0.3)
    arc_m: t -> t cos m - sqrt(1 - t²) sin m   where t > cos(pi - m),   t - m sin(pi - m) otherwise   (t = cos θ_y)

``W`` is the new model's own classifier (the ``cosine`` head: cosines of the normalised feature and the normalised rows,
as their ``PartialFC`` at sample rate 1, which clamps them to [-1, 1]), its rows started as theirs, every entry
N(0, 0.01²) (``classifier_init: partial_fc``, their ``partial_fc.py`` L89; ``linear``: torch's ``nn.Linear``,
whose rows are about 2.5 times longer and turn that much slower under SGD, which changes what the method learns:
METHODS.md §6b); ``floor(alpha * B)`` is their
``int(cfg.batch_size * cfg.mix_ratio)``, ``B`` the batch size. The run's per-term log splits the mean into the unmixed
rows' share (``classification``) and the mixed rows' (``mixed``: 0 when no row could be mixed). A replaced row carries
no gradient to the backbone, only to ``W`` (their in-place replacement). **Denoising** (their ``denoise_credible.py``,
``--T 0.9``): an old feature is *credible* when it is among the ``ceil(T * n_y)`` of its class's ``n_y`` features
nearest to the class mean, after normalising each feature and then each dimension over the whole set (``denoise_space:
rows_columns``, sklearn's ``normalize`` then ``normalize(axis=0)``, Euclidean distances). The suite makes the class
statistics once per task from the teacher's features of the task's data and the replay memory (every class with data:
their old features cover the whole new training set) and keeps, per class, the distance of the ``ceil(T n_y)``-th
nearest (``r_y``); a batch row is credible when its old feature lies within ``r_y`` of its class mean, which on the
task's own images is exactly their per-image mask (ties aside). ``credible_ratio: 1`` keeps every feature (no
denoising); ``denoise_space: rows`` measures the distances on the unit features alone.

Readings where the sources leave room (METHODS.md §6b):

* ``mixing: replace`` (default, the code): ``alpha`` is the fraction of the batch whose features are *replaced*.
  Their README calls it "the ratio alpha of old and new features in the mixup process"; ``mixing: interpolate``
  reads "mixup" as interpolation: every credible row's feature becomes ``(1 - alpha) phi^_t + alpha phi^_old``
  (unit features), with its gradient to the backbone. The paper's own text was not at hand to decide.
* Fewer credible rows than ``alpha B``: their ``random.sample`` raises; the suite replaces every credible row.
* The batch is the suite's (new images and the replay memory); their old features come from a table extracted
  once (``tools/get_feature/get_feature.py``, through the training loader, so under one random horizontal flip of
  each image, independent of the flip the new model sees), the suite's from the teacher on the batch being
  trained, as every teacher here. The draw uses the strategy's own generator, seeded per task from
  ``torch.initial_seed()``, so it is the same on every rank and leaves the global random stream alone.
* Their cross-entropy clamps the target probability at 1e-30 (a sample's loss at most 69.08); the suite's
  log-softmax does not. The gradients are the same.

The old model's features must be as wide as the new model's (the new classifier reads both). The old model is the
teacher of ``cl2r_bench/strategy.py``: at a replacement, by default, the model deployed before it
(``replacement_teacher: outgoing``: MixBCT trains the new model against the deployed one; ``incoming`` anchors the
replacement to itself, as the IAM-CL2R code's shared loop does). Without a teacher (CL2R task 0) the loss is the ArcFace
term on the new features.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from cl2r_bench.heads import ROW_INITS
from cl2r_bench.plugin_settings import setting
from cl2r_bench.strategy import REPLACEMENT_TEACHERS, Step, Strategy, TaskContext, register_strategy

MIXINGS = ("replace", "interpolate")
DENOISE_SPACES = ("rows_columns", "rows")
RADIUS_SLACK = 1e-9
"""Relative slack of the credible radius: the feature that sets it is kept however its distance is rounded."""


@dataclass(frozen=True)
class MixBCTConfig:
    mix_ratio: float = setting(0.3, at_least=0, at_most=1)
    credible_ratio: float = setting(0.9, above=0, at_most=1)
    scale: float = setting(64.0, above=0)
    margin: float = setting(0.5, at_least=0, below=math.pi)
    mixing: str = setting("replace", choices=MIXINGS)
    denoise_space: str = setting("rows_columns", choices=DENOISE_SPACES)
    replacement_teacher: str = setting("outgoing", choices=REPLACEMENT_TEACHERS)
    classifier_init: str = setting("partial_fc", choices=tuple(ROW_INITS))


@dataclass
class CredibleRegions:
    """Per label ``0..num_classes-1``, in the denoising space (float64).

    Attributes:
        column_scale: what each dimension of a unit feature is divided by (its norm over the set; ones for
            ``denoise_space: rows``).
        centres: the class mean of the scaled features (zeros where absent).
        radius: the distance of the ``ceil(T n_y)``-th nearest scaled feature to its class mean; NaN where absent.
    """

    column_scale: torch.Tensor
    centres: torch.Tensor
    radius: torch.Tensor


def credible_regions(unit_features: torch.Tensor, labels: torch.Tensor, num_classes: int, ratio: float,
                     space: str = "rows_columns") -> CredibleRegions:
    """The classes' credible regions from the old model's unit features of a set (their ``denoise_credible.py``)."""
    rows = unit_features.double()
    scale = rows.norm(dim=0) if space == "rows_columns" else torch.ones(rows.shape[1], dtype=rows.dtype,
                                                                         device=rows.device)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))      # sklearn leaves an all-zero column as it is
    scaled = rows / scale
    centres = torch.zeros(num_classes, rows.shape[1], dtype=rows.dtype, device=rows.device)
    radius = torch.full((num_classes,), math.nan, dtype=rows.dtype, device=rows.device)
    for label in labels.unique().tolist():
        members = scaled[labels == label]
        centres[label] = members.mean(dim=0)
        distances = (members - centres[label]).norm(dim=1).sort().values
        radius[label] = distances[math.ceil(ratio * len(members)) - 1]
    return CredibleRegions(scale, centres, radius)


def credible(regions: CredibleRegions, unit_features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Which unit old features lie within their class's credible radius (False for a class without a region)."""
    scaled = unit_features.double() / regions.column_scale
    distances = (scaled - regions.centres[labels]).norm(dim=1)
    radius = regions.radius[labels]
    return radius.isfinite() & (distances <= radius * (1 + RADIUS_SLACK))


def drawn_rows(eligible: torch.Tensor, count: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """``min(count, #eligible)`` of the ``eligible`` rows drawn uniformly without replacement, as a mask."""
    positions = torch.nonzero(eligible).flatten()
    drawn = torch.randperm(len(positions), generator=generator)[:count].to(positions.device)
    mask = torch.zeros_like(eligible)
    mask[positions[drawn]] = True
    return mask


def arcface_logits(cosine: torch.Tensor, targets: torch.Tensor, scale: float, margin: float) -> torch.Tensor:
    """Their ``ArcFace`` (``easy_margin`` off) on cosines clamped to [-1, 1]: the target's ``cos(θ + m)`` where
    ``θ + m < pi``, else ``cos θ - m sin(pi - m)``; every logit times ``scale``."""
    cosine = cosine.clamp(-1, 1)
    target = cosine.gather(1, targets[:, None])
    sine = (1 - target * target).clamp_min(1e-12).sqrt()      # the floor only matters at |t| = 1 (infinite slope)
    shifted = target * math.cos(margin) - sine * math.sin(margin)
    target = torch.where(target > math.cos(math.pi - margin), shifted, target - math.sin(math.pi - margin) * margin)
    return scale * cosine.scatter(1, targets[:, None], target)


def mixed_cosines(cosine: torch.Tensor, features: torch.Tensor, old: torch.Tensor, classifier: torch.Tensor,
                  rows: torch.Tensor, mixing: str, ratio: float) -> torch.Tensor:
    """The batch's cosines to the classifier's rows with the ``rows`` (a mask) mixed: their old unit features'
    cosines (``replace``), or those of ``(1 - ratio) phi^_t + ratio phi^_old`` (``interpolate``)."""
    if not bool(rows.any()):
        return cosine
    mixed = old[rows].to(classifier.dtype)
    if mixing == "interpolate":
        mixed = (1 - ratio) * F.normalize(features[rows], dim=1) + ratio * mixed
    cosine = cosine.clone()
    cosine[rows] = F.linear(F.normalize(mixed, dim=1), F.normalize(classifier, dim=1)).to(cosine.dtype)
    return cosine


@register_strategy("mixbct")
class MixBCT(Strategy):
    loss_summary = ("`ArcFace(s 64, m 0.5)` of the new classifier on the batch with 30 % of its rows replaced by "
                    "credible old features (the 90 % nearest their class mean)")
    reference = "Liang et al., arXiv 2023"
    authors_recipe = {"optimizer": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 0.0005, "epochs": 35,
                      "schedule": "poly", "power": 2.0, "warmup_epochs": 0, "clip_grad_norm": 5.0}
    authors_recipe_source = ("yuleung/MixBCT: BCT_Methods/MixBCT/train.py L73, L80-82, L95-104, L158, L163, "
                             "lr_scheduler.py L10 (SGD 0.1, poly of power 2 per iteration, 35 epochs; the backbone's "
                             "gradient norm clipped at 5)")
    head = "cosine"
    uses_memory = True
    needs_teacher = True
    Config = MixBCTConfig

    def __init__(self, config: MixBCTConfig) -> None:
        super().__init__(config)
        self.regions: CredibleRegions | None = None
        self.model = None
        self.generator: torch.Generator | None = None
        self.mixed: torch.Tensor | None = None
        """The rows of the last batch that were mixed (a mask), for inspection."""

    def head_options(self) -> dict[str, Any]:
        return {"row_init": self.config.classifier_init}

    def before_task(self, context: TaskContext) -> None:
        self.regions, self.model, self.mixed = None, context.model, None
        self.generator = torch.Generator().manual_seed((torch.initial_seed() + context.index) % 2 ** 64)
        if not context.has_teacher:
            return
        if context.model is None:
            raise ValueError("MixBCT classifies old features with the trained model's classifier: TaskContext.model "
                             "must be given")
        _, features, labels = context.teacher_outputs(context.seen_data)
        width = context.model.head.classifier.in_features
        if features.shape[1] != width:
            raise ValueError(f"MixBCT feeds the old model's {features.shape[1]}-d features to the new model's "
                             f"classifier, which reads {width}-d features: the widths must be equal")
        self.regions = credible_regions(F.normalize(features.float(), dim=1), labels, context.num_seen_classes,
                                        self.config.credible_ratio, self.config.denoise_space)

    def loss(self, step: Step) -> torch.Tensor:
        cosine = step.logits
        if self.regions is not None and step.teacher_features is not None:
            config = self.config
            eligible = credible(self.regions, step.teacher_features, step.labels)
            rows = eligible if config.mixing == "interpolate" else drawn_rows(
                eligible, int(len(step.labels) * config.mix_ratio), self.generator)
            self.mixed = rows
            cosine = mixed_cosines(cosine, step.features, step.teacher_features, self.model.head.classifier.weight,
                                   rows, config.mixing, config.mix_ratio)
        else:
            rows = torch.zeros_like(step.labels, dtype=torch.bool)
        losses = F.cross_entropy(arcface_logits(cosine, step.targets, self.config.scale, self.config.margin),
                                 step.targets, reduction="none")
        return self.terms(classification=losses[~rows].sum() / len(losses), mixed=losses[rows].sum() / len(losses))
