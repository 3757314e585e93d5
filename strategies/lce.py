"""LCE (Meng et al., ICCV 2021): classifier aligned to the old class centres + a boundary (METHODS.md §6b).

"Learning compatible embeddings": the new classifier is aligned to the old model's class centres and the new
features are kept inside each old class's boundary. Two readings (``form``), both without the paper's optional
transformation of the old features:

* ``authors`` (the default: the paper's authors' code, ``IrvingMeng/LCE``, ``main.py``'s ``train`` and
  ``save_lcefeat``)::

      L = ArcFace_{s, m}(cos(W_y, phi_t(x)), y) + 100 * mean_{c, k} (W^_{c,k} - c^_{c,k})^2
          + 1 * mean_i max(kappa_{y_i} - phi^_t(x_i) . c^_{y_i}, 0)

  The classifier is theirs: a normalised classifier (``models/Classifier.py`` ``NormalizedClassifier``: logits the
  cosines of the unit feature and the unit rows; the suite's ``cosine`` head) under ArcFace with the scale and margin
  of their configuration (``configs/res50_arcface.yaml``: ``CLA_S`` 16, ``CLA_M`` 0.1; ``losses/arcface_loss.py``,
  the target's ``cos(theta + m)`` where ``theta + m < pi``, else ``cos theta - m sin(pi - m)``). It is what turns
  "rows aligned to the old centres" into "features pulled to them": the logits are the cosines the alignment moves.
  Their recipe trains it with Adam (``training.recipe: authors``, :attr:`authors_recipe`), under which each row moves
  at the learning rate whatever the size of its gradient; under the shared budget's SGD the alignment's gradient is
  that of ``100 / (C D)`` times each row's squared distance (C rows of D entries), a small pull (METHODS.md §6b).

  over every class with a centre (the squared error averaged over the rows and their entries, as ``F.mse_loss``),
  ``c^`` the normalised mean of the class's old unit features, ``kappa_y`` the smallest cosine of one of them to
  ``c^_y``, the boundary over the batch samples whose class has a centre; centres of every class with data
  (``centre_classes: seen``: their old model embeds the whole new training set). Their code takes the dot product
  of the *un-normalised* feature with ``c^`` clamped to [-1, 1]; the suite normalises the feature, so the term is the
  cosine the paper describes (with features of norm above 1 the clamp makes their term 0 for almost every sample: a
  defect not reproduced, METHODS.md §6b).
* ``advbct`` (``Ashespt/AdvBCT``'s reimplementation, ``COMP_LOSS.TYPE: lce``, ``K = 0``, ``LOSS.TYPE: softmax``: a
  plain linear classifier, the ``learnable`` head)::

      L = CE + 1 * mean_i (1 - c^_{y_i} . W^_{y_i}) + 1 * mean_i max(arccos(c^_{y_i} . phi^_t(x_i)) - theta_{y_i}, 0)

  ``theta_y`` the largest angle of the class's old features to ``c^_y`` after the 1.5 IQR rule
  (``cl2r_bench/class_regions.py``), both means over the batch samples whose class has a centre and an angle, centres
  of the old classes (``centre_classes: old``).

``alignment_weight``, ``boundary_weight``, ``centre_classes``, ``scale`` and ``margin`` default to the form's, and
the form picks the head (a strategy instance's ``head``). The old model is the teacher of
``cl2r_bench/strategy.py``; its centres are computed once per task from the task's data and the replay memory, so at
a replacement they are, by default, those of the model deployed before it (``replacement_teacher: outgoing``: LCE
aligns the new model to the deployed one's centres; ``incoming``: the replacement's own, as the IAM-CL2R code's shared
loop does). At CL2R task 0 (no old model) the loss is CE.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cl2r_bench.class_regions import CENTRE_CLASSES, ClassRegions, task_regions
from cl2r_bench.plugin_settings import setting
from cl2r_bench.strategy import REPLACEMENT_TEACHERS, Step, Strategy, TaskContext, register_strategy

from .mixbct import arcface_logits

ARCCOS_LIMIT = 1 - 1e-7
"""Cosines are clamped to ``[-ARCCOS_LIMIT, ARCCOS_LIMIT]`` before the arc-cosine, whose slope is infinite at +-1."""


FORMS = {"authors": {"alignment_weight": 100.0, "boundary_weight": 1.0, "centre_classes": "seen", "scale": 16.0,
                     "margin": 0.1},
         "advbct": {"alignment_weight": 1.0, "boundary_weight": 1.0, "centre_classes": "old", "scale": None,
                    "margin": None}}
"""Each reading's own weights, centre classes and ArcFace scale and margin (None: plain cross-entropy on a linear
classifier) (module docstring), what ``None`` takes."""
FORM_HEADS = {"authors": "cosine", "advbct": "learnable"}


@dataclass(frozen=True)
class LCEConfig:
    form: str = setting("authors", choices=tuple(FORMS))
    alignment_weight: float | None = None
    boundary_weight: float | None = None
    centre_classes: str | None = setting(None, choices=CENTRE_CLASSES)
    scale: float | None = setting(None, above=0)
    margin: float | None = setting(None, at_least=0, below=math.pi)
    replacement_teacher: str = setting("outgoing", choices=REPLACEMENT_TEACHERS)

    def __post_init__(self) -> None:
        for key, value in FORMS[self.form].items():
            if getattr(self, key) is None:
                object.__setattr__(self, key, value)
        if FORMS[self.form]["scale"] is None and (self.scale, self.margin) != (None, None):
            raise ValueError(f"scale and margin are the ArcFace of form authors; form {self.form!r} trains a linear "
                             "classifier with plain cross-entropy")


def cosine_boundary_loss(features: torch.Tensor, labels: torch.Tensor, regions: ClassRegions) -> torch.Tensor:
    """The authors' boundary: ``max(kappa_y - cos(phi, c^_y), 0)`` over the samples whose class has a centre (0 when
    none has)."""
    keep = regions.present[labels]
    if not bool(keep.any()):
        return features.new_zeros(())
    cosine = (F.normalize(features[keep], dim=1) * regions.unit_centres[labels[keep]]).sum(dim=1)
    return F.relu(regions.cosine_floor[labels[keep]] - cosine).mean()


def squared_alignment_loss(classifier: torch.Tensor, regions: ClassRegions) -> torch.Tensor:
    """The authors' alignment: the squared difference of every centred class's unit classifier row and unit centre,
    averaged over rows and entries (0 without a centre)."""
    classes = torch.nonzero(regions.present[:len(classifier)]).flatten()
    if not len(classes):
        return classifier.new_zeros(())
    return F.mse_loss(F.normalize(classifier[classes], dim=1), regions.unit_centres[classes])


def boundary_loss(features: torch.Tensor, labels: torch.Tensor, regions: ClassRegions) -> torch.Tensor:
    """AdvBCT's boundary: ``max(arccos(c^_y . phi^) - theta_y, 0)`` over the samples whose class has a centre and an
    angle (0 when none has)."""
    keep = regions.angle_radius[labels].isfinite()
    if not bool(keep.any()):
        return features.new_zeros(())
    cosine = (F.normalize(features[keep], dim=1) * regions.unit_centres[labels[keep]]).sum(dim=1)
    angle = torch.acos(cosine.clamp(-ARCCOS_LIMIT, ARCCOS_LIMIT))
    return F.relu(angle - regions.angle_radius[labels[keep]]).mean()


def alignment_loss(classifier: torch.Tensor, labels: torch.Tensor, regions: ClassRegions) -> torch.Tensor:
    """AdvBCT's alignment: ``1 - c^_y . W^_y`` over the same samples as :func:`boundary_loss`."""
    keep = regions.angle_radius[labels].isfinite()
    if not bool(keep.any()):
        return classifier.new_zeros(())
    rows = F.normalize(classifier[labels[keep]], dim=1)
    return (1 - (rows * regions.unit_centres[labels[keep]]).sum(dim=1)).mean()


@register_strategy("lce")
class LCE(Strategy):
    loss_summary = ("`ArcFace(s 16, m 0.1) on a normalised classifier + 100 mean(Ŵ − ĉ)² + max(κ_y − cos(φ_t, ĉ_y), 0)`"
                    ": old class centres and cosine floors (the authors' code; `form: advbct` the reimplementation's "
                    "linear classifier and angles)")
    reference = 'Meng et al., ICCV 2021'
    authors_recipe = {"optimizer": "adam", "lr": 0.00035, "weight_decay": 0.0005, "epochs": 60,
                      "schedule": "multistep", "milestones": [20, 40], "gamma": 0.1, "warmup_epochs": 0}
    authors_recipe_source = ("IrvingMeng/LCE: configs/default.py L68-80, main.py L72-75, L85-86 (Adam 3.5e-4, weight "
                             "decay 5e-4, MultiStepLR [20, 40] x 0.1, 60 epochs)")
    head = FORM_HEADS["authors"]
    uses_memory = True
    needs_teacher = True
    Config = LCEConfig

    def __init__(self, config: LCEConfig) -> None:
        super().__init__(config)
        self.head = FORM_HEADS[config.form]
        self.regions: ClassRegions | None = None
        self.model = None

    def before_task(self, context: TaskContext) -> None:
        self.regions = task_regions(context, self.config.centre_classes)
        if self.regions is not None and context.model is None:
            raise ValueError("LCE aligns the trained model's classifier: TaskContext.model must be given")
        self.model = context.model

    def classification(self, step: Step) -> torch.Tensor:
        """ArcFace on the normalised classifier's cosines (form authors), or cross-entropy on the linear logits."""
        if self.config.scale is None:
            return F.cross_entropy(step.logits, step.targets)
        return F.cross_entropy(arcface_logits(step.logits, step.targets, self.config.scale, self.config.margin),
                               step.targets)

    def loss(self, step: Step) -> torch.Tensor:
        ce = self.classification(step)
        if self.regions is None:
            return self.terms(classification=ce)
        classifier = self.model.head.classifier.weight
        if self.config.form == "authors":
            align = squared_alignment_loss(classifier, self.regions)
            boundary = cosine_boundary_loss(step.features, step.labels, self.regions)
        else:
            align = alignment_loss(classifier, step.labels, self.regions)
            boundary = boundary_loss(step.features, step.labels, self.regions)
        return self.terms(classification=ce, alignment=self.config.alignment_weight * align,
                          boundary=self.config.boundary_weight * boundary)
