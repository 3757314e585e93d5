"""ER: experience replay with a learnable growing head (METHODS.md §6).

Loss: cross-entropy on each mini-batch of 64 replay + 64 new samples (task 0: 128 new samples). No old model.
At an IAM-CL2R replacement the incoming model's classifier is dropped and a fresh head over the seen classes
is learned; the replay memory is kept.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from cl2r_bench.strategy import Step, Strategy, register_strategy


@register_strategy("er")
class ExperienceReplay(Strategy):
    loss_summary = 'CE'
    reference = "experience replay, the CL2R papers' baseline (Biondi et al., TOMM 2023)"
    authors_recipe = {"optimizer": "sgd", "lr": 0.001, "lr_min": 0.00001, "momentum": 0.9, "weight_decay": 0.0005,
                      "epochs": 70, "schedule": "cosine", "schedule_step": "epoch", "warmup_epochs": 0}
    authors_recipe_source = ("miccunifi/iamcl2r: src/iamcl2r/params.py L30-40, main.py L147-163 (SGD 1e-3, cosine to "
                             "1e-5 stepped per epoch, 70 epochs a task)")
    head = "learnable"
    uses_memory = True
    needs_teacher = False

    def loss(self, step: Step) -> torch.Tensor:
        return self.terms(classification=F.cross_entropy(step.logits, step.targets))
