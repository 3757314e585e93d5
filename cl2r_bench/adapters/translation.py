"""Training-free translation between two feature spaces, fitted in closed form on parallel anchors (METHODS.md §7).

Anchors are ``anchors`` fitting items drawn at random (the same items in both spaces). Every estimator here is a
map ``y = (x - c) W + b``, optionally followed by a rescaling of the centred output to a fixed norm; each
adapter fits one map per direction (new -> old = backward, old -> new = forward).

* ``procrustes``: centre both spaces and divide each by its root-mean-square norm ("standardised anchors");
  ``W = U Vᵀ`` from the SVD ``X̃ᵀỸ = U S Vᵀ`` (orthogonal, or semi-orthogonal when the dimensions differ),
  rescaled to the target's spread.
* ``least_squares``: ``W = X⁺ Y`` (no centring, no bias).
* ``affine``: least squares on centred anchors plus the target mean, i.e. ``[X 1]`` regression.
* ``irp``, inverse relative projection (Maiorca et al. 2024): centre and L2-normalise with the anchors'
  statistics; relative code ``X_rel = X̂ Â_Xᵀ``; inverse ``Ŷ = X_rel (Â_Yᵀ)⁺``. The anchors are pruned by greedy
  farthest-point sampling with ``d(a, b) = 1 - |cos(a, b)|`` until the next distance is below ``delta`` (same
  indices in both spaces); ``subspaces`` (ω) prunings from random starts are averaged. Since each inverse is
  linear in ``X̂``, their mean is one matrix ``M = mean_i Â_X[S_i]ᵀ (Â_Y[S_i]ᵀ)⁺``. The output is rescaled to
  the target anchors' mean centred norm and their mean is added back. Defaults δ = 0.8, ω = 16 are the paper's
  stitching setting: without pruning the inverse is ``Â_Xᵀ Â_Y (Â_YᵀÂ_Y)⁻¹``, which is exact for an isometry but
  distorted by anisotropic real features (on Tiny ImageNet features it fell to chance; pruning to nearly
  orthogonal anchors fixes that).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from cl2r_bench.plugin_settings import setting

from .base import Adapter, FeaturePair, in_memory, register_adapter


class LinearMap(nn.Module):
    """``y = (x - center) @ weight + bias``; with ``irp_style`` the input is L2-normalised after centring and the
    output direction is rescaled to ``target_norm`` before adding ``bias``."""

    def __init__(self, in_dim: int, out_dim: int, irp_style: bool = False) -> None:
        super().__init__()
        self.irp_style = irp_style
        self.register_buffer("center", torch.zeros(in_dim))
        self.register_buffer("weight", torch.zeros(in_dim, out_dim))
        self.register_buffer("bias", torch.zeros(out_dim))
        self.register_buffer("target_norm", torch.ones(()))

    def set(self, *, weight: torch.Tensor, center: torch.Tensor | None = None, bias: torch.Tensor | None = None,
            target_norm: torch.Tensor | None = None) -> None:
        self.weight.copy_(weight)
        for buffer, value in ((self.center, center), (self.bias, bias), (self.target_norm, target_norm)):
            if value is not None:
                buffer.copy_(value)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        centred = x - self.center
        if not self.irp_style:
            return centred @ self.weight + self.bias
        return F.normalize(F.normalize(centred, dim=1) @ self.weight, dim=1) * self.target_norm + self.bias


@dataclass(frozen=True)
class AnchorConfig:
    anchors: int = setting(2048, at_least=1)   # fitting items used as parallel anchors (all when fewer)


@dataclass(frozen=True)
class IRPConfig:
    anchors: int = setting(2048, at_least=1)
    delta: float = setting(0.8, at_least=0, at_most=1)   # pruning threshold δ on 1 - |cos|; 0 keeps every anchor
    subspaces: int = setting(16, at_least=1)  # ω: prunings from random starts, averaged


def anchor_items(items: int, count: int, generator: torch.Generator) -> torch.Tensor | None:
    """``count`` of ``items`` fitting items chosen at random, or None for every item, in order, when ``count`` is
    not smaller than the fitting set (so such a fit does not depend on the seed)."""
    if count >= items:
        return None
    return torch.randperm(items, generator=generator, device=generator.device)[:count]


def pick_anchors(pair: FeaturePair, count: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``(old anchors, new anchors)``: the items of :func:`anchor_items`, the same in both spaces. Features read
    from disk are read at those items only."""
    idx = anchor_items(len(pair.old), count, generator)
    if idx is None:
        return in_memory(pair.old).float(), in_memory(pair.new).float()
    idx = idx.to(pair.old.device)
    return pair.old[idx].float(), pair.new[idx].float()


def spread(x: torch.Tensor) -> torch.Tensor:
    """Root-mean-square norm of the rows of an already centred matrix."""
    return x.pow(2).sum(dim=1).mean().sqrt().clamp(min=1e-12)


def procrustes_weight(source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The (semi-)orthogonal ``R`` minimising ``‖source R - target‖_F`` (rows are paired samples)."""
    u, _, vh = torch.linalg.svd(source.t() @ target, full_matrices=False)
    return u @ vh


def pad_columns(features: torch.Tensor, width: int) -> torch.Tensor:
    """``features`` with zero columns appended up to ``width`` (the common width of two spaces that differ)."""
    return F.pad(features, (0, width - features.shape[1]))


def farthest_point_subset(points: torch.Tensor, delta: float, generator: torch.Generator) -> torch.Tensor:
    """Indices chosen greedily, each the farthest from those already chosen under ``1 - |cos|``, from a random
    start, until the farthest remaining point is closer than ``delta`` (METHODS.md §7, IRP anchor pruning)."""
    unit = F.normalize(points, dim=1)
    closeness = (unit @ unit.t()).abs()
    start = int(torch.randint(len(unit), (1,), generator=generator, device=generator.device))
    chosen = [start]
    distance = 1 - closeness[start]
    while len(chosen) < len(unit):
        candidate = int(distance.argmax())
        if float(distance[candidate]) < max(delta, 1e-12):
            break
        chosen.append(candidate)
        distance = torch.minimum(distance, 1 - closeness[candidate])
    return torch.tensor(chosen, device=points.device)


class TwoWayMap(Adapter):
    """Shared shape of the closed-form adapters: one :class:`LinearMap` per direction."""

    irp_style = False
    picks_rows = True

    def build(self, old_dim: int, new_dim: int, side_dim: int = 0) -> None:
        self.to_old = LinearMap(new_dim, old_dim, self.irp_style)
        self.to_new = LinearMap(old_dim, new_dim, self.irp_style)

    def fit(self, pair: FeaturePair, generator: torch.Generator) -> dict[str, float]:
        old, new = pick_anchors(pair, self.config.anchors, generator)
        self.fit_map(self.to_old, new, old, generator)
        self.fit_map(self.to_new, old, new, generator)
        return {"anchors": float(len(old))}

    def seed_free(self, items: int) -> bool:
        """Every item is an anchor and the closed form draws nothing (IRP's pruning starts at a random anchor)."""
        return not self.irp_style and self.config.anchors >= items

    def fit_map(self, target_map: LinearMap, source: torch.Tensor, target: torch.Tensor,
                generator: torch.Generator) -> None:
        raise NotImplementedError

    def backward(self, new: torch.Tensor) -> torch.Tensor:
        return self.to_old(new)

    def forward(self, old: torch.Tensor, side: torch.Tensor | None = None) -> torch.Tensor:
        return self.to_new(old)


@register_adapter("procrustes")
class Procrustes(TwoWayMap):
    """Orthogonal Procrustes on standardised anchors (module docstring)."""
    fitted_by = 'closed form (orthogonal) on random anchors'
    reference = "Schönemann 1966; the adapter papers' baseline"

    Config = AnchorConfig

    def fit_map(self, target_map, source, target, generator) -> None:
        mu_s, mu_t = source.mean(dim=0), target.mean(dim=0)
        s_scale, t_scale = spread(source - mu_s), spread(target - mu_t)
        rotation = procrustes_weight((source - mu_s) / s_scale, (target - mu_t) / t_scale)
        target_map.set(weight=rotation * (t_scale / s_scale), center=mu_s, bias=mu_t)


@register_adapter("least_squares")
class LeastSquares(TwoWayMap):
    """``W = X⁺ Y``: linear, no bias (module docstring)."""
    fitted_by = 'closed form (linear) on random anchors'
    reference = "the adapter papers' baseline"

    Config = AnchorConfig

    def fit_map(self, target_map, source, target, generator) -> None:
        target_map.set(weight=torch.linalg.pinv(source) @ target)


@register_adapter("affine")
class Affine(TwoWayMap):
    """Least squares with a bias: ``W = (X - μ_X)⁺ (Y - μ_Y)``, ``b = μ_Y`` (module docstring)."""
    fitted_by = 'closed form (linear + bias) on random anchors'
    reference = "the adapter papers' baseline"

    Config = AnchorConfig

    def fit_map(self, target_map, source, target, generator) -> None:
        mu_s, mu_t = source.mean(dim=0), target.mean(dim=0)
        target_map.set(weight=torch.linalg.pinv(source - mu_s) @ (target - mu_t), center=mu_s, bias=mu_t)


@register_adapter("irp")
class InverseRelativeProjection(TwoWayMap):
    """Inverse relative projection with anchor pruning and ω averaged subspaces (module docstring)."""
    fitted_by = 'inverse relative projection on pruned anchors'
    reference = 'Maiorca et al., arXiv 2406.15057, 2024'

    Config = IRPConfig
    irp_style = True

    def fit(self, pair: FeaturePair, generator: torch.Generator) -> dict[str, float]:
        log = super().fit(pair, generator)
        return {**log, "anchors_after_pruning": self.kept_anchors}

    def fit_map(self, target_map, source, target, generator) -> None:
        mu_s, mu_t = source.mean(dim=0), target.mean(dim=0)
        unit_s, unit_t = F.normalize(source - mu_s, dim=1), F.normalize(target - mu_t, dim=1)
        weights, kept = [], []
        for _ in range(self.config.subspaces):
            subset = farthest_point_subset(unit_s, self.config.delta, generator)
            weights.append(unit_s[subset].t() @ torch.linalg.pinv(unit_t[subset].t()))
            kept.append(len(subset))
        self.kept_anchors = float(sum(kept) / len(kept))
        target_map.set(weight=torch.stack(weights).mean(dim=0), center=mu_s, bias=mu_t,
                       target_norm=(target - mu_t).norm(dim=1).mean())
