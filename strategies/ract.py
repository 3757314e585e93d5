"""RACT (Zhang et al., ICLR 2022): contrastive compatibility with new-to-old and new-to-new negatives (METHODS.md §6b).

"Hot-refresh model upgrades with regression-alleviating compatible training": the compatibility term's negatives
include the new model's own features, so that the new model does not retrieve, among old-gallery or
already-refreshed items, a wrong class closer than the right one (the negative flips of a hot refresh).

    L = CE(W phi_t(x), y) + weight * L_ract
    L_ract = mean_i -log( e^{s_ii/tau} / (e^{s_ii/tau} + sum_{k in N_i} e^{s_ik/tau} + sum_{k in N_i} e^{n_ik/tau}) )
    s_ik = phi_t(x_i) . phi_old(x_k),  n_ik = phi_t(x_i) . phi_t(x_k)         (unit features)
    N_i = the samples of the batch of another class than y_i

``hard_negatives: k`` keeps the k largest of each negative set, as the authors' code does (``topk_neg``, 10); 0
keeps them all, as the paper's equation. tau = ``temperature`` = 0.01 (their default). The gradient flows through
every new feature, the negatives' too, as the equation says; the reference code gathers the batch with
``all_gather``, which carries no gradient, so there the other samples' new features are constants:
``detach_new_negatives: true`` reproduces that (the parity check shows both, METHODS.md §6b). Batch samples of another
class are negatives; same-class samples are left out of both sets, as in their code. The old model is the teacher of
``cl2r_bench/strategy.py``: the previous task's model, or at a replacement, by default, the model deployed before it
(``replacement_teacher: outgoing``: RACT trains the new model against the deployed one; ``incoming`` anchors the
replacement to itself, as the IAM-CL2R code's shared loop does). At CL2R task 0 (no old model) the loss is CE.
Batches mix replay and new samples, so old classes take part in a class-incremental stream.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cl2r_bench.plugin_settings import setting
from cl2r_bench.strategy import REPLACEMENT_TEACHERS, Step, Strategy, register_strategy


@dataclass(frozen=True)
class RACTConfig:
    weight: float = 1.0
    temperature: float = setting(0.01, above=0)
    hard_negatives: int = 10         # 0: all
    detach_new_negatives: bool = False
    replacement_teacher: str = setting("outgoing", choices=REPLACEMENT_TEACHERS)


def regression_alleviating_loss(features: torch.Tensor, old_features: torch.Tensor, labels: torch.Tensor,
                                temperature: float, hard_negatives: int,
                                detach_new_negatives: bool = False) -> torch.Tensor:
    """``L_ract`` for the new model's ``features`` (normalised here) and the old model's unit ``old_features``;
    ``detach_new_negatives`` treats the other samples' new features as constants, as the reference code does."""
    new = F.normalize(features, dim=1)
    same_class = labels[:, None] == labels[None, :]
    positive = (new * old_features).sum(dim=1, keepdim=True)
    new_negatives = new.detach() if detach_new_negatives else new
    negatives = [(new @ other.t()).masked_fill(same_class, float("-inf")) for other in (old_features, new_negatives)]
    if hard_negatives:
        negatives = [n.topk(min(hard_negatives, n.shape[1]), dim=1).values for n in negatives]
    logits = torch.cat([positive, *negatives], dim=1) / temperature
    return F.cross_entropy(logits, torch.zeros(len(labels), dtype=torch.long, device=labels.device))


@register_strategy("ract")
class RACT(Strategy):
    loss_summary = '`CE + contrastive(new→old positive; new→old and new→new negatives, τ 0.01)`'
    reference = 'Zhang et al., ICLR 2022'
    authors_recipe = {"optimizer": "sgd", "lr": 0.1, "lr_min": 0.001, "momentum": 0.9, "weight_decay": 0.0001,
                      "epochs": 30, "schedule": "cosine", "schedule_step": "iteration", "warmup_epochs": 1}
    authors_recipe_source = ("TencentARC/OpenCompatible: docs/train_test.md's command, utils/util.py L79-89, L100-105 "
                             "(SGD 0.1, weight decay 1e-4, a 1-epoch warm-up, then cosine per iteration to lr x 1e-2, "
                             "30 epochs)")
    head = "learnable"
    uses_memory = True
    needs_teacher = True
    Config = RACTConfig

    def loss(self, step: Step) -> torch.Tensor:
        ce = F.cross_entropy(step.logits, step.targets)
        if step.teacher_features is None:
            return self.terms(classification=ce)
        return self.terms(classification=ce, contrastive=self.config.weight * regression_alleviating_loss(
            step.features, step.teacher_features, step.labels, self.config.temperature, self.config.hard_negatives,
            self.config.detach_new_negatives))
