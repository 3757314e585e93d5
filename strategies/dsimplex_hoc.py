"""d-Simplex-HOC: fixed d-Simplex classifier + higher-order compatibility loss (METHODS.md §6).

``L = ce_weight * CE + hoc_weight * L_hoc`` (0.1 / 0.9), with ``S_ij = mu <o_i, n_j>`` (mu = 10) between the
frozen teacher's normalised features ``o`` (rows) and the trained model's normalised features ``n`` (columns):

    l_i = -S_ii + log( sum_{j: y_j != y_i} exp(S_ij) + |{j: y_j = y_i}| )          (mask = "zero", default)

The authors' code masks same-class pairs by multiplying them by 0, so each adds exp(0) = 1 (positive included);
``mask = "true"`` removes same-class pairs other than the positive instead:
``l_i = -S_ii + log( exp(S_ii) + sum_{j: y_j != y_i} exp(S_ij) )``. ``L_hoc`` is the mean of ``l_i`` over the batch.

The teacher is the model the task *started from*: the previous task's model, or at task 0 and at every
replacement task the freshly loaded replacement model itself (METHODS.md §6, the authors' code);
``replacement_teacher: outgoing`` uses the model deployed before the replacement instead (this suite's option).
When a task starts from a random model (CL2R task 0) there is no teacher and the loss is plain cross-entropy
(this suite's choice).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cl2r_bench.plugin_settings import setting
from cl2r_bench.strategy import REPLACEMENT_TEACHERS, Step, Strategy, register_strategy

MASKS = ("zero", "true")


@dataclass(frozen=True)
class HOCConfig:
    ce_weight: float = 0.1
    hoc_weight: float = 0.9
    mu: float = 10.0
    mask: str = setting("zero", choices=MASKS)
    replacement_teacher: str = setting("incoming", choices=REPLACEMENT_TEACHERS)


def hoc_loss(old: torch.Tensor, new: torch.Tensor, labels: torch.Tensor, mu: float = 10.0,
             mask: str = "zero") -> torch.Tensor:
    """``L_hoc`` of METHODS.md §6 for normalised ``old`` (teacher) and ``new`` features, both ``B x D``."""
    scores = mu * old.float() @ new.float().t()
    same = labels[:, None] == labels[None, :]
    positive = scores.diagonal()
    if mask == "zero":
        others = torch.logsumexp(scores.masked_fill(same, float("-inf")), dim=1, keepdim=True)
        counts = same.sum(dim=1, keepdim=True).float().log()
        return (torch.logaddexp(others, counts).squeeze(1) - positive).mean()
    keep = ~same | torch.eye(len(labels), dtype=torch.bool, device=labels.device)
    return (torch.logsumexp(scores.masked_fill(~keep, float("-inf")), dim=1) - positive).mean()


@register_strategy("dsimplex_hoc")
class DSimplexHOC(Strategy):
    loss_summary = '`0.1·CE + 0.9·L_hoc`, μ = 10'
    reference = 'Biondi et al., CVPR 2024 (IAM-CL2R)'
    authors_recipe = {"optimizer": "sgd", "lr": 0.001, "lr_min": 0.00001, "momentum": 0.9, "weight_decay": 0.0005,
                      "epochs": 70, "schedule": "cosine", "schedule_step": "epoch", "warmup_epochs": 0}
    authors_recipe_source = ("miccunifi/iamcl2r: src/iamcl2r/params.py L30-40, main.py L147-163 (SGD 1e-3, cosine to "
                             "1e-5 stepped per epoch, 70 epochs a task)")
    head = "dsimplex"
    uses_memory = True
    needs_teacher = True
    Config = HOCConfig

    def loss(self, step: Step) -> torch.Tensor:
        ce = F.cross_entropy(step.logits, step.targets)
        if step.teacher_features is None:
            return self.terms(classification=ce)
        hoc = hoc_loss(step.teacher_features, F.normalize(step.features.float(), dim=1), step.labels,
                       self.config.mu, self.config.mask)
        return self.terms(classification=self.config.ce_weight * ce, hoc=self.config.hoc_weight * hoc)
