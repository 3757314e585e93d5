"""Learned forward transformations of the old gallery: FCT and FastFill (METHODS.md §7).

* ``fct`` (Ramanujan et al. 2022): an MLP ``h(φ_old(x)[, side info]) -> new space`` trained with
  ``mean ‖h - φ_new(x)‖²``. Side information is any extra per-item vector stored with the old gallery
  (``FeaturePair.side``); it is used when given and ``use_side_info`` is true.
* ``fastfill`` (Jaeckle et al. 2023): the same MLP with one more output, ``s = log σ²``, and per item
  ``ℓ = ‖h - φ_new(x)‖² + ce_weight · CE(cos(h, w_c) / τ_c, y)``, the cross-entropy through the new model's
  classifier rows ``w_c`` (cosine logits with temperature τ_c, so every head family is treated alike: this
  suite's choice). Loss ``mean(ℓ / σ² + log σ²)`` [METHODS.md choice]; σ² orders partial backfilling, most
  uncertain first.

Both are forward-only: the new model keeps its own space and the old gallery is transformed into it. Both train
to convergence under a step budget (:mod:`cl2r_bench.adapters.learned`), batch 256, Adam lr 1e-3.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cl2r_bench.plugin_settings import WIDTH_MAX, setting

from .base import AdapterError, FeaturePair, register_adapter
from .learned import LearnedAdapter, StepBudget


@dataclass(frozen=True)
class FCTConfig(StepBudget):
    hidden: int = setting(1024, at_least=1, at_most=WIDTH_MAX)   # width of each hidden layer
    layers: int = setting(2, at_least=1, at_most=64)             # hidden layers (ReLU)
    use_side_info: bool = True       # feed FeaturePair.side to the MLP when present


@dataclass(frozen=True)
class FastFillConfig(FCTConfig):
    ce_weight: float = 1.0           # weight of the discriminative cross-entropy through the new classifier
    classifier_temperature: float = setting(0.1, above=0)   # τ_c of the cosine logits


def mlp(in_dim: int, hidden: int, layers: int, out_dim: int) -> nn.Sequential:
    sizes = [in_dim] + [hidden] * layers
    blocks: list[nn.Module] = []
    for a, b in pairwise(sizes):
        blocks += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*blocks, nn.Linear(sizes[-1], out_dim))


@register_adapter("fct")
class FCT(LearnedAdapter):
    """Forward transformation trained with MSE (module docstring)."""
    fitted_by = 'MLP old (+ side information) → new, MSE'
    reference = 'Ramanujan et al., CVPR 2022'

    Config = FCTConfig
    directions = ("forward",)
    picks_rows = True
    extra_outputs = 0

    def build(self, old_dim: int, new_dim: int, side_dim: int = 0) -> None:
        self.new_dim = new_dim
        self.side_dim = side_dim if self.config.use_side_info else 0
        self.net = mlp(old_dim + self.side_dim, self.config.hidden, self.config.layers, new_dim + self.extra_outputs)

    def _inputs(self, old: torch.Tensor, side: torch.Tensor | None) -> torch.Tensor:
        if not self.side_dim:
            return old.float()
        if side is None:
            raise AdapterError(f"adapter {self.name!r} was fitted with side information; pass it for the gallery too")
        return torch.cat([old.float(), side.float()], dim=1)

    def _outputs(self, old: torch.Tensor, side: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        out = self.net(self._inputs(old, side))
        return out[:, :self.new_dim], (out[:, self.new_dim] if self.extra_outputs else None)

    def item_losses(self, pair: FeaturePair, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(ℓ, log σ²)`` of the items ``idx`` (the log-variance is None for FCT)."""
        side = pair.side[idx] if pair.side is not None else None
        mapped, log_var = self._outputs(pair.old[idx], side)
        squared = (mapped - pair.new[idx].float()).pow(2).sum(dim=1)
        return squared + self.discriminative_loss(mapped, pair.labels[idx]), log_var

    def discriminative_loss(self, mapped: torch.Tensor, labels: torch.Tensor) -> torch.Tensor | float:
        return 0.0

    def batch_loss(self, data: FeaturePair, idx: torch.Tensor) -> torch.Tensor:
        return self.objective(*self.item_losses(data, idx))

    def objective(self, item_loss: torch.Tensor, log_var: torch.Tensor | None) -> torch.Tensor:
        return item_loss.mean()

    def forward(self, old: torch.Tensor, side: torch.Tensor | None = None) -> torch.Tensor:
        return self._outputs(old, side)[0]


@register_adapter("fastfill")
class FastFill(FCT):
    """FCT + discriminative cross-entropy + predicted uncertainty (module docstring)."""
    fitted_by = 'FCT + CE through the new classifier + predicted uncertainty'
    reference = 'Jaeckle et al., ICLR 2023'

    Config = FastFillConfig
    extra_outputs = 1

    def fit(self, pair: FeaturePair, generator: torch.Generator) -> dict[str, Any]:
        if pair.new_classifier is None:
            raise AdapterError("fastfill needs the new model's classifier rows (FeaturePair.new_classifier)")
        self.classifier = F.normalize(pair.new_classifier.float(), dim=1)
        return super().fit(pair, generator)

    def discriminative_loss(self, mapped: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = F.normalize(mapped, dim=1) @ self.classifier.t() / self.config.classifier_temperature
        return self.config.ce_weight * F.cross_entropy(logits, labels, reduction="none")

    def objective(self, item_loss: torch.Tensor, log_var: torch.Tensor | None) -> torch.Tensor:
        return (item_loss * torch.exp(-log_var) + log_var).mean()

    def uncertainty(self, old: torch.Tensor, side: torch.Tensor | None = None) -> torch.Tensor:
        """σ² of each item: larger = transformed less reliably = backfill first."""
        return torch.exp(self._outputs(old, side)[1])
