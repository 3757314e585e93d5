"""Learned forward transformations of the old gallery: FCT and FastFill (METHODS.md §7).

* ``fct`` (Ramanujan et al. 2022): a network ``h(φ_old(x), side information) -> new space`` trained with
  ``mean ‖h - φ_new(x)‖²``. Side information is any extra per-item vector stored with the old gallery
  (``FeaturePair.side``); it is used when given and ``use_side_info`` is true. ``network`` picks ``h``:

  - ``side_projection`` (default): the authors' transformation, ``MLP_BN_SIDE_PROJECTION`` of ``apple/ml-fct``
    (``models/transformations.py``), on feature vectors. The old feature goes through ``old → 2·old → 2·new``,
    the side information through ``side → 2·side → 2·new``, each layer linear without bias, batch norm, ReLU;
    the two are concatenated (``4·new``) and mixed by ``layers`` such layers of width ``hidden`` (theirs: 2 of
    2048) and a last linear layer with bias into the new space. Their 1×1 convolutions on ``(N, C, 1, 1)``
    features are these linear layers, and their ``BatchNorm2d`` over ``N × 1 × 1`` this ``BatchNorm1d`` (same
    initialisation law, ε, momentum). Without side information the side branch reads the old feature again, as
    ml-fct does when no side-information model is given (``side_info_model = old_model``). Batch norm needs two
    items per training batch; held-out checks and the fitted map use its running statistics.
  - ``mlp``: a plain MLP on ``[φ_old(x), side]`` (``layers`` hidden layers of ``hidden`` units, ReLU), the
    suite's transformation before the parity check with ml-fct [choice].

* ``fastfill`` (Jaeckle et al. 2023): the same transformation with one more output, ``s = log σ²``, and per item
  ``ℓ = ‖h - φ_new(x)‖² + ce_weight · CE(cos(h, w_c) / τ_c, y)``, the cross-entropy through the new model's
  classifier rows ``w_c`` (cosine logits with temperature τ_c, so every head family is treated alike: this
  suite's choice). Loss ``mean(ℓ / σ² + log σ²)`` [METHODS.md choice]; σ² orders partial backfilling, most
  uncertain first. Its authors' code is not public: it keeps the ``mlp`` network of 1024 units by default
  [choice]; ``network: side_projection`` gives it ml-fct's.

Both are forward-only: the new model keeps its own space and the old gallery is transformed into it. Both train
to convergence under a step budget (:mod:`cl2r_bench.adapters.learned`), batch 256, Adam lr 1e-3 (ml-fct's recipe:
Adam lr 5e-4, weight decay 2^-15, batch 1024, 80 epochs of a cosine schedule; METHODS.md §7).
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

NETWORKS = ("side_projection", "mlp")


@dataclass(frozen=True)
class FCTConfig(StepBudget):
    network: str = setting("side_projection", choices=NETWORKS)   # ml-fct's transformation, or a plain MLP
    hidden: int = setting(2048, at_least=1, at_most=WIDTH_MAX)     # width of each hidden layer (of the mixer)
    layers: int = setting(2, at_least=1, at_most=64)               # hidden layers (of the mixer)
    use_side_info: bool = True       # feed FeaturePair.side to the network when present

    def __post_init__(self) -> None:
        if self.network == "side_projection" and self.batch_size < 2:
            raise ValueError(f"batch_size = {self.batch_size}: network side_projection normalises each batch (batch "
                             "norm) and needs at least 2 items; raise batch_size or set network: mlp")


@dataclass(frozen=True)
class FastFillConfig(FCTConfig):
    network: str = setting("mlp", choices=NETWORKS)   # FastFill's code is not public: the suite's MLP [choice]
    hidden: int = setting(1024, at_least=1, at_most=WIDTH_MAX)
    ce_weight: float = 1.0           # weight of the discriminative cross-entropy through the new classifier
    classifier_temperature: float = setting(0.1, above=0)   # τ_c of the cosine logits


def mlp(in_dim: int, hidden: int, layers: int, out_dim: int) -> nn.Sequential:
    sizes = [in_dim] + [hidden] * layers
    blocks: list[nn.Module] = []
    for a, b in pairwise(sizes):
        blocks += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*blocks, nn.Linear(sizes[-1], out_dim))


def normalised_layers(sizes: list[int]) -> list[nn.Module]:
    """``Linear (no bias), BatchNorm1d, ReLU`` between each two consecutive ``sizes``: ml-fct's ``ConvBlock``."""
    blocks: list[nn.Module] = []
    for a, b in pairwise(sizes):
        blocks += [nn.Linear(a, b, bias=False), nn.BatchNorm1d(b), nn.ReLU()]
    return blocks


class SideProjection(nn.Module):
    """ml-fct's ``MLP_BN_SIDE_PROJECTION`` on feature vectors (module docstring): an old branch, a side branch,
    their concatenation mixed into ``out_dim`` outputs (``new_dim``, plus FastFill's log-variance)."""

    def __init__(self, old_dim: int, side_dim: int, new_dim: int, hidden: int, layers: int, out_dim: int) -> None:
        super().__init__()
        self.old_branch = nn.Sequential(*normalised_layers([old_dim, 2 * old_dim, 2 * new_dim]))
        self.side_branch = nn.Sequential(*normalised_layers([side_dim, 2 * side_dim, 2 * new_dim]))
        sizes = [4 * new_dim] + [hidden] * layers
        self.mixer = nn.Sequential(*normalised_layers(sizes), nn.Linear(sizes[-1], out_dim))

    def forward(self, old: torch.Tensor, side: torch.Tensor) -> torch.Tensor:
        return self.mixer(torch.cat([self.old_branch(old), self.side_branch(side)], dim=1))


@register_adapter("fct")
class FCT(LearnedAdapter):
    """Forward transformation trained with MSE (module docstring)."""
    fitted_by = "ml-fct's side-information projection network (or an MLP): old + side information → new, MSE"
    reference = 'Ramanujan et al., CVPR 2022'

    Config = FCTConfig
    directions = ("forward",)
    picks_rows = True
    extra_outputs = 0

    def build(self, old_dim: int, new_dim: int, side_dim: int = 0) -> None:
        self.new_dim = new_dim
        self.side_dim = side_dim if self.config.use_side_info else 0
        out_dim = new_dim + self.extra_outputs
        if self.config.network == "side_projection":
            self.net = SideProjection(old_dim, self.side_dim or old_dim, new_dim, self.config.hidden,
                                      self.config.layers, out_dim)
        else:
            self.net = mlp(old_dim + self.side_dim, self.config.hidden, self.config.layers, out_dim)

    def min_batch(self) -> int:
        return 2 if self.config.network == "side_projection" else 1

    def _side(self, side: torch.Tensor | None) -> torch.Tensor | None:
        if not self.side_dim:
            return None
        if side is None:
            raise AdapterError(f"adapter {self.name!r} was fitted with side information; pass it for the gallery too")
        return side.float()

    def _outputs(self, old: torch.Tensor, side: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        old, side = old.float(), self._side(side)
        if self.config.network == "side_projection":
            out = self.net(old, old if side is None else side)
        else:
            out = self.net(old if side is None else torch.cat([old, side], dim=1))
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
