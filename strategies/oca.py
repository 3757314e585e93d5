"""OCA (Ricci, Biondi, Pernici, Del Bimbo, 2024): backward-compatible aligned representations via an orthogonal
transformation layer (METHODS.md §6b).

The new model's feature is widened by ``added_dims`` (:class:`cl2r_bench.heads.OrthogonalTransformationHead`):
``f`` = the normalised widened feature is the retrieval feature, its first ``old_width`` dimensions ``b`` the old
model's frame, and the classifier reads ``f`` through an orthogonal transformation layer ``Q f + c``::

    L = classification_weight * CE_s(W (Q f + c), y)
        + influence_weight * CE_s(b_n C_oldᵀ, y) + alignment_weight * (1 - mean_i cos(C_old[y_i], b_n,i))

``b_n`` is ``b`` normalised, ``C_old`` the pseudo-classifier: the mean normalised old-model feature of every class
(not re-normalised), from the task's images, and ``CE_s`` cross-entropy with label smoothing ``label_smoothing``
(the authors' ``LabelSmoothing``, on both cross-entropy terms). The alignment pulls ``b`` toward its class's row of
``C_old``, not toward the image's own old feature (BT²'s term): the authors run the old model only to build
``C_old``.

**Weights: the code that runs, not the configuration.** The authors' ``configs/train/cifar100_OCA.yaml``
(``z3n0e/OCA`` at af89d7d) lists ``lambda_1: 1``, ``lambda_2: 10``, ``lambda_3: 5`` (the trainer's docstring: λ1 a
match to an independent new model, a BT² term OCA does not have; λ2 the influence; λ3 the alignment), but
``train_OCA.py`` never passes them and ``trainers/OCA_trainer.py`` computes ``5 * loss_ce + 10 * loss_bct + 5 *
loss_cosine``. The suite's defaults are that trainer's (``classification_weight`` 5, ``influence_weight`` 10,
``alignment_weight`` 5); ``classification_weight: 1`` is the configuration's reading (cross-entropy unweighted, λ2
and λ3 as the trainer's). Only their ratio matters under the authors' Adam; the suite trains with SGD, where the sum
also scales the step. Label smoothing 0.1 is the configuration's ``label_smoothing``, which ``train_OCA.py`` does
use. The paper's own text was not at hand (its abstract only), so no paper-against-code difference is claimed.

The head widens the model it is built over (:func:`cl2r_bench.models.head_over`), as BT²'s: the upgrade protocol's
new model (over the old one) and at IAM-CL2R a replacement (its backbone under a fresh OCA head over the model
deployed before it; ``replacement_teacher: outgoing`` by default, so that model is the old one). The feature grows
by ``added_dims`` at each such upgrade; a model with nothing under it (task 0) has the plain learnable head, and
fine-tuning keeps a model's head and width (the old model is then the task's starting model, ``old_width`` its whole
width). Retrieval compares a query with a narrower gallery on the gallery's width (the first dimensions, as the
authors' ``cosine_distance_matrix``). Without an old model (CL2R task 0) the loss is its classification term.

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
class OCAConfig:
    classification_weight: float = 5.0
    influence_weight: float = 10.0
    alignment_weight: float = 5.0
    label_smoothing: float = setting(0.1, at_least=0, below=1)
    added_dims: int = setting(32, at_least=1, at_most=WIDTH_MAX)
    orthogonal_map: str = setting(AUTHORS_MAP, choices=ORTHOGONAL_MAPS)
    replacement_teacher: str = setting("outgoing", choices=REPLACEMENT_TEACHERS)


def old_frame(features: torch.Tensor, width: int) -> torch.Tensor:
    """The first ``width`` dimensions of ``features``, normalised: a model's features in an older model's frame."""
    return F.normalize(features[:, :width], dim=1)


@register_strategy("oca")
class OCA(Strategy):
    loss_summary = '`5·CE_s(W(Qf + c)) + 10·CE_s(b C_oldᵀ) + 5·(1 − cos(C_old[y], b))`, Q orthogonal, smoothing 0.1'
    reference = 'Ricci et al., arXiv 2024'
    authors_recipe = {"optimizer": "adam", "lr": 0.001, "lr_min": 0.0, "weight_decay": 2.0 ** -15, "epochs": 100,
                      "schedule": "cosine", "schedule_step": "epoch", "warmup_epochs": 5}
    authors_recipe_source = ("z3n0e/OCA: configs/train/cifar100_OCA.yaml L17-43, train_OCA.py L46-58 (Adam 1e-3, "
                             "weight decay 2^-15, a 5-epoch warm-up, then cosine to 0 per epoch, 100 epochs)")
    head = "oca"
    uses_memory = False
    needs_teacher = True
    Config = OCAConfig

    def __init__(self, config: OCAConfig) -> None:
        super().__init__(config)
        self.pseudo_classifier: torch.Tensor | None = None
        self.old_width = 0

    def head_options(self) -> dict[str, Any]:
        return {"added_dims": self.config.added_dims, "orthogonal_map": self.config.orthogonal_map}

    def before_task(self, context: TaskContext) -> None:
        self.pseudo_classifier = None
        if not context.has_teacher:
            return
        _, features, labels = context.teacher_outputs(context.seen_data)
        self.old_width = features.shape[1]
        self.pseudo_classifier, _ = class_means(old_frame(features, self.old_width), labels,
                                                context.num_seen_classes)

    def loss(self, step: Step) -> torch.Tensor:
        smoothing = self.config.label_smoothing
        classification = self.config.classification_weight * F.cross_entropy(step.logits, step.targets,
                                                                             label_smoothing=smoothing)
        if self.pseudo_classifier is None:
            return self.terms(classification=classification)
        compatible = old_frame(step.features, self.old_width)
        rows = self.pseudo_classifier[step.labels]
        return self.terms(
            classification=classification,
            influence=self.config.influence_weight * F.cross_entropy(compatible @ self.pseudo_classifier.t(),
                                                                     step.labels, label_smoothing=smoothing),
            alignment=self.config.alignment_weight * F.cosine_embedding_loss(rows, compatible,
                                                                             compatible.new_ones(len(compatible))))
