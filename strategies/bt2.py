"""BT² (Zhou et al., ICCV 2023): backward-compatible training with a basis transformation (METHODS.md §6b).

The new model's feature is widened by ``added_dims`` through orthogonal maps
(:class:`cl2r_bench.heads.BasisTransformationHead`): its first ``old_width`` dimensions ``b`` are trained into the
old model's frame, and the backbone's own normalised feature ``f`` (the classifier's input) is matched to an
independently trained new model's ``phi_p``::

    L = CE(W f, y) + influence_weight * CE(b_n C_oldᵀ, y)
        + old_weight * (1 - mean_i b_n,i . phi_old,i) + independent_weight * (1 - mean_i f_i . phi_p,i)

``b`` is the first ``old_width`` dimensions of the new feature (``old_width`` = the old model's width), ``b_n`` it
normalised, ``phi_old`` the old model's normalised feature and ``C_old`` BCT's pseudo-classifier: the mean
normalised old feature of every class, from the task's images. Weights and widths are the authors'
(``YifeiZhou02/BT-2``, ``configs/cifar100_transfer.yaml``: λ1 = 1, λ2 = 10, λ3 = 5, ``to_add_dim`` 32, ``C`` 2).
``added_dims`` must stay below the backbone's width: with as many or more, the old frame is the old branch alone
and the new basis ``P`` meets no loss (so in the authors' code too).
Their trainer reads ``phi_old`` and ``phi_p`` from tables built once under one random augmentation of each image;
the suite runs both frozen models on the batch the new model sees (the same augmentation), as every other
teacher-based strategy here; on features drawn as they are (the pretrained-backbone track) it reads them from tables
built once per task (:mod:`cl2r_bench.training.frozen_outputs`).

The head widens the model it is built over (:func:`cl2r_bench.models.head_over`): the upgrade protocol's new
model (over the old one), and at IAM-CL2R a replacement (its backbone under a fresh BT² head over the model
deployed before it; ``replacement_teacher: outgoing`` by default, so that model is the old one, and the incoming
replacement, trained without regard to it, is the independent model). The feature grows by ``added_dims`` at each
such upgrade; a model with nothing under it (task 0) has the plain learnable head, and fine-tuning keeps a model's
head and width (the old model is then the task's starting model, ``old_width`` its whole width). The independent
model is the scenario's (``Scenario.independent_models``); without one (CL2R, fine-tuning tasks) the last term is
dropped. Retrieval compares a query with a narrower gallery on the gallery's width (the first dimensions, as the
authors' ``cosine_distance_matrix``). At CL2R task 0 (no old model) the loss is CE.

``orthogonal_map: cayley`` trains the orthogonal layers through torch's Cayley map instead of the authors' matrix
exponential (:mod:`cl2r_bench.orthogonal`): a different map of the same parameters, faster on a CPU where the
generators grow, an option whose results are compared with the exponential's (docs/METHODS.md §6b), not the
authors' method.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from cl2r_bench.models import class_means
from cl2r_bench.orthogonal import AUTHORS_MAP, ORTHOGONAL_MAPS
from cl2r_bench.plugin_settings import WIDTH_MAX, setting
from cl2r_bench.strategy import REPLACEMENT_TEACHERS, Step, Strategy, TaskContext, register_strategy


@dataclass(frozen=True)
class BT2Config:
    influence_weight: float = 10.0
    old_weight: float = 5.0
    independent_weight: float = 1.0
    added_dims: int = setting(32, at_least=1, at_most=WIDTH_MAX)
    scale: float = setting(2.0, above=0)
    orthogonal_map: str = setting(AUTHORS_MAP, choices=ORTHOGONAL_MAPS)
    replacement_teacher: str = setting("outgoing", choices=REPLACEMENT_TEACHERS)


def old_frame(features: torch.Tensor, width: int) -> torch.Tensor:
    """The first ``width`` dimensions of ``features``, normalised: a model's features in an older model's frame."""
    return F.normalize(features[:, :width], dim=1)


def cosine_gap(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``1 - mean_i a_i . b_i`` for rows already normalised."""
    return 1 - (a * b).sum(dim=1).mean()


@register_strategy("bt2")
class BT2(Strategy):
    loss_summary = '`CE(W f) + 10·CE(b C_oldᵀ) + 5·(1 − cos(b, φ_old)) + 1·(1 − cos(f, φ_independent))`'
    reference = 'Zhou et al., ICCV 2023'
    authors_recipe = {"optimizer": "adam", "lr": 0.001, "lr_min": 0.0, "weight_decay": 2.0 ** -15, "epochs": 100,
                      "schedule": "cosine", "schedule_step": "epoch", "warmup_epochs": 5}
    authors_recipe_source = ("YifeiZhou02/BT-2: configs/cifar100_transfer.yaml L11-36, utils/schedulers.py L72-104 "
                             "(Adam 1e-3, weight decay 2^-15, a 5-epoch warm-up, then cosine to 0 per epoch, "
                             "100 epochs)")
    head = "bt2"
    uses_memory = False
    needs_teacher = True
    needs_independent = True
    Config = BT2Config

    def __init__(self, config: BT2Config) -> None:
        super().__init__(config)
        self.pseudo_classifier: torch.Tensor | None = None
        self.old_width = 0

    def head_options(self) -> dict[str, Any]:
        return {"added_dims": self.config.added_dims, "scale": self.config.scale,
                "orthogonal_map": self.config.orthogonal_map}

    def before_task(self, context: TaskContext) -> None:
        self.pseudo_classifier = None
        if not context.has_teacher:
            return
        _, features, labels = context.teacher_outputs(context.seen_data)
        self.old_width = features.shape[1]
        self.pseudo_classifier, _ = class_means(old_frame(features, self.old_width), labels,
                                                context.num_seen_classes)

    def loss(self, step: Step) -> torch.Tensor:
        ce = F.cross_entropy(step.logits, step.targets)
        if self.pseudo_classifier is None:
            return self.terms(classification=ce)
        compatible = old_frame(step.features, self.old_width)
        old = old_frame(step.teacher_raw_features, self.old_width)
        terms = {"classification": ce,
                 "influence": self.config.influence_weight * F.cross_entropy(compatible @ self.pseudo_classifier.t(),
                                                                            step.labels),
                 "old": self.config.old_weight * cosine_gap(compatible, old)}
        if step.independent_features is not None and step.new_features is not None:
            terms["independent"] = self.config.independent_weight * cosine_gap(step.new_features,
                                                                               step.independent_features)
        return self.terms(**terms)
