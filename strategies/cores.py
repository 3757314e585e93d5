"""CoReS: the fixed d-Simplex classifier trained with plain cross-entropy on replay batches (METHODS.md §6).

No old model: compatibility comes only from the stationary simplex targets (class y on vertex 1023 - y). At a
replacement it starts from the d-Simplex replacement model, keeps the replay memory and the simplex.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import Step, Strategy, register_strategy


@register_strategy("cores")
class CoReS(Strategy):
    head = "dsimplex"
    uses_memory = True
    needs_teacher = False

    def loss(self, step: Step) -> torch.Tensor:
        return F.cross_entropy(step.logits, step.targets)
