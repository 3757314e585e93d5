"""Drift-Adapter (Vejendla, "Drift-Adapter: A Practical Approach to Near Zero-Downtime Embedding Model Upgrades in
Vector Databases", EMNLP 2025, arXiv 2509.23471; METHODS.md §7): a backward map that takes the new model's
features (queries) into the old model's space, so the old gallery and its index stay as they are.

What the paper says (its abstract; the body was not readable here, so every number below that the abstract does
not give is this suite's choice):

* "By mapping new queries into the legacy embedding space, Drift-Adapter enables the continued use of the
  existing ANN index": backward only.
* "three adapter parameterizations: Orthogonal Procrustes, Low-Rank Affine, and a compact Residual MLP, trained
  on a small sample of paired old/new embeddings".
* Reported: it "recovers 95–99% of the retrieval recall (Recall@10, MRR) of a full re-embedding, adding less than
  10 µs query latency", with recompute costs cut "by over 100×"; the abstract names "the impact of design choices
  like diagonal scaling" among its analyses.

With ``x`` a new-model feature (row, ``d_new``) and ``y`` the old feature of the same item (``d_old``):

* ``procrustes``: ``B(x) = x R`` with ``R = U Vᵀ`` from the thin SVD ``X_newᵀ X_old = U Σ Vᵀ`` on the anchors, the
  (semi-)orthogonal ``R`` minimising ``‖X_new R - X_old‖_F``. Closed form, no training. No centring and no
  rescaling [choice]: an orthogonal ``R`` keeps unit-norm queries unit-norm, as the old index stores them (the
  suite's ``procrustes`` adapter is the standardised, centred variant).
* ``low_rank_affine``: ``B(x) = x (R + U V) + b`` with ``U`` ``d_new × r``, ``V`` ``r × d_old``: an affine map
  whose learned update ``U V`` of the Procrustes ``R`` has rank at most ``r`` [choice: the update is taken
  around ``R``, which stays fixed].
* ``residual_mlp``: ``B(x) = x R + W₂ ReLU(W₁ x + b₁) + b₂``, one hidden layer of ``hidden`` units [choice: ReLU,
  one layer, skip connection through ``R``].
* ``diagonal_scaling`` (off by default [choice]): the output is multiplied coordinate-wise by ``s`` (``d_old``),
  ``B_s(x) = B(x) ⊙ s``. Under ``procrustes`` ``s`` is fitted in closed form after ``R``,
  ``s_j = Σ_i z_ij y_ij / Σ_i z_ij²`` with ``z = x R``; under the learned parameterizations it starts there and
  is trained with the rest.

Choices where the abstract is silent, each marked [choice]:

* Default ``residual_mlp`` [choice]: the abstract does not rank the three; a third-party summary of the paper
  (arxivlens) reports the residual MLP as the best of them, which could not be checked against the paper's tables.
* The two learned parameterizations start exactly at the closed-form map (``V = 0``, ``W₂ = 0``, ``b = b₂ = 0``,
  ``s`` at its closed form), so training can only refine the Procrustes fit; whether the paper does so is not
  known [choice].
* Loss ``mean_i ‖B(x_i) - y_i‖²`` (the suite's other regression adapters' loss) [choice]; Adam, lr 1e-3, batch
  256, trained to convergence under a step budget (:mod:`cl2r_bench.adapters.learned`) [choice].
* ``rank`` 64 and ``hidden`` 256 [choice]; the update's rank is at most ``min(rank, d_new, d_old)``.
* The closed-form start is fitted on ``anchors`` fitting items drawn at random (all when fewer), held-out share
  included [choice]; with ``procrustes`` and every item an anchor the fit does not depend on the seed.
* Different widths: ``R`` is ``d_new × d_old`` and semi-orthogonal (orthonormal columns when ``d_new ≥ d_old``,
  orthonormal rows otherwise); ``U V`` and the MLP map ``d_new`` to ``d_old`` directly, so nothing is truncated or
  padded [choice].
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from cl2r_bench.plugin_settings import WIDTH_MAX, setting

from .base import FeaturePair, register_adapter
from .learned import LearnedAdapter, StepBudget
from .translation import pick_anchors, procrustes_weight

PARAMETERIZATIONS = ("procrustes", "low_rank_affine", "residual_mlp")


@dataclass(frozen=True)
class DriftAdapterConfig(StepBudget):
    parameterization: str = setting("residual_mlp", choices=PARAMETERIZATIONS)
    rank: int = setting(64, at_least=1, at_most=WIDTH_MAX)     # r of the low-rank affine update U V
    hidden: int = setting(256, at_least=1, at_most=WIDTH_MAX)  # hidden units of the residual MLP
    diagonal_scaling: bool = False   # multiply the output by a fitted per-coordinate scale s
    anchors: int = setting(2048, at_least=1)   # items the closed-form (start) map is fitted on (all when fewer)


class LowRankUpdate(nn.Module):
    """``x ↦ x U V + b``; ``V = 0`` and ``b = 0`` at the start, so the update starts at zero."""

    def __init__(self, in_dim: int, out_dim: int, rank: int) -> None:
        super().__init__()
        self.down = nn.Parameter(torch.randn(in_dim, rank) / in_dim ** 0.5)
        self.up = nn.Parameter(torch.zeros(rank, out_dim))
        self.bias = nn.Parameter(torch.zeros(out_dim))

    @property
    def update(self) -> torch.Tensor:
        """The ``d_in × d_out`` matrix ``U V`` (rank at most r)."""
        return self.down @ self.up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.down @ self.up + self.bias


def residual_mlp(in_dim: int, hidden: int, out_dim: int) -> nn.Sequential:
    """``W₂ ReLU(W₁ x + b₁) + b₂`` with ``W₂ = 0``, ``b₂ = 0``: zero at the start."""
    net = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, out_dim))
    nn.init.zeros_(net[2].weight)
    nn.init.zeros_(net[2].bias)
    return net


def correction(config: DriftAdapterConfig, new_dim: int, old_dim: int) -> nn.Module | None:
    """The learned part added to ``x R``: the low-rank update, the residual MLP, or None (Procrustes)."""
    if config.parameterization == "low_rank_affine":
        return LowRankUpdate(new_dim, old_dim, config.rank)
    if config.parameterization == "residual_mlp":
        return residual_mlp(new_dim, config.hidden, old_dim)
    return None


def diagonal_scale(mapped: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The per-coordinate least-squares ``s`` minimising ``‖mapped ⊙ s - target‖_F``."""
    return (mapped * target).sum(dim=0) / mapped.pow(2).sum(dim=0).clamp(min=1e-12)


@register_adapter("drift_adapter")
class DriftAdapter(LearnedAdapter):
    """New queries into the old space: Procrustes, low-rank affine or residual MLP (module docstring)."""
    fitted_by = 'Procrustes, low-rank affine or residual MLP'
    reference = 'Vejendla, EMNLP 2025'

    Config = DriftAdapterConfig
    directions = ("backward",)
    picks_rows = True

    @property
    def learned(self) -> bool:
        return self.config.parameterization != "procrustes"

    def build(self, old_dim: int, new_dim: int, side_dim: int = 0) -> None:
        self.register_buffer("rotation", torch.zeros(new_dim, old_dim))
        self.correction = correction(self.config, new_dim, old_dim)
        if self.config.diagonal_scaling and self.learned:
            self.scale = nn.Parameter(torch.ones(old_dim))
        elif self.config.diagonal_scaling:
            self.register_buffer("scale", torch.ones(old_dim))

    def start(self, new: torch.Tensor, old: torch.Tensor) -> float:
        """Set the closed-form map (``R``, and ``s`` under diagonal scaling) from paired rows ``new``, ``old``;
        returns its mean squared error ``mean_i ‖B(x_i) - y_i‖²`` on them. The learned parts are left as built."""
        new, old = new.float(), old.float()
        with torch.no_grad():
            self.rotation.copy_(procrustes_weight(new, old))
            mapped = new @ self.rotation
            if self.config.diagonal_scaling:
                self.scale.copy_(diagonal_scale(mapped, old))
                mapped = mapped * self.scale
            return float((mapped - old).pow(2).sum(dim=1).mean())

    def fit(self, pair: FeaturePair, generator: torch.Generator) -> dict[str, Any]:
        old, new = pick_anchors(pair, self.config.anchors, generator)
        log = {"anchors": float(len(old)), "start_mse": self.start(new, old)}
        if not self.learned:
            return log
        return {**log, **super().fit(pair, generator)}

    def seed_free(self, items: int) -> bool:
        """Procrustes with every item an anchor draws nothing; the learned parameterizations draw batches."""
        return not self.learned and self.config.anchors >= items

    def batch_loss(self, data: FeaturePair, idx: torch.Tensor) -> torch.Tensor:
        return (self.backward(data.new[idx]) - data.old[idx].float()).pow(2).sum(dim=1).mean()

    def fit_log(self, data: FeaturePair) -> dict[str, float]:
        """The mean squared error on the first ``batch_size`` fitting items."""
        sample = torch.arange(min(self.config.batch_size, len(data.old)), device=data.labels.device)
        return {"mse": float(self.batch_loss(data, sample))}

    def backward(self, new: torch.Tensor) -> torch.Tensor:
        x = new.float()
        mapped = x @ self.rotation
        if self.correction is not None:
            mapped = mapped + self.correction(x)
        return mapped * self.scale if self.config.diagonal_scaling else mapped
