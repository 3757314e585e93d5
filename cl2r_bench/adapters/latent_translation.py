"""Latent-space translation (Maiorca et al., NeurIPS 2023; reference code ``Flegyas/latentis``): standard scaling of
both spaces, zero-padding to a common width, one closed-form map, and the target's scaling undone (METHODS.md §7).

Fitted on ``anchors`` parallel items like the other closed forms (:mod:`cl2r_bench.adapters.translation`), one map
per direction (new -> old = backward, old -> new = forward). With source anchors ``X`` (width ``d_x``) and target
anchors ``Y`` (width ``d_y``):

* standard scaling per dimension: ``X̃ = (X - μ_X) / σ_X`` with ``σ_X`` the unbiased standard deviation of each
  column, a column whose σ is below ``10 ε`` (float machine epsilon) or zero divided by 1 instead; likewise ``Ỹ``
  (``scaling: none`` skips it: μ = 0, σ = 1);
* zero-padding: the narrower of ``X̃``, ``Ỹ`` gets zero columns up to ``d = max(d_x, d_y)``;
* the map ``R`` (``d x d``), one of: ``svd`` (orthogonal Procrustes, ``R = U Vᵀ`` of ``X̃ᵀỸ = U S Vᵀ``), ``lstsq``
  (``R = X̃⁺ Ỹ``, the minimum-norm least-squares fit) or ``lstsq_ortho``, the paper's l-ortho (``R = U Vᵀ`` of the
  least-squares fit ``X̃⁺Ỹ = U S Vᵀ``: its nearest orthogonal matrix);
* a source item ``x`` maps to ``((x - μ_X) / σ_X, 0) R``, truncated to its first ``d_y`` columns, times ``σ_Y``,
  plus ``μ_Y``.

All of it is one affine map ``y = (x - μ_X) W + μ_Y`` with ``W = diag(1/σ_X) R[:d_x, :d_y] diag(σ_Y)``, stored as
such (:class:`~cl2r_bench.adapters.translation.LinearMap`). [choice] The least-squares fit is ``pinv(X̃) Ỹ`` rather
than latentis's ``torch.linalg.lstsq``: the same minimum-norm solution on the CPU, and on a GPU too, where
``lstsq`` assumes full rank and the zero-padded columns are not.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from cl2r_bench.plugin_settings import setting

from .base import register_adapter
from .translation import AnchorConfig, LinearMap, TwoWayMap, pad_columns, procrustes_weight

NEAR_CONSTANT = 10
"""A column whose standard deviation is below this many float machine epsilons is not rescaled (latentis's rule)."""


def nearest_orthogonal(matrix: torch.Tensor) -> torch.Tensor:
    """``U Vᵀ`` of ``matrix = U S Vᵀ``: the orthogonal matrix closest to ``matrix`` in Frobenius norm."""
    u, _, vh = torch.linalg.svd(matrix, full_matrices=False)
    return u @ vh


MAPS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "svd": procrustes_weight,
    "lstsq": lambda x, y: torch.linalg.pinv(x) @ y,
    "lstsq_ortho": lambda x, y: nearest_orthogonal(torch.linalg.pinv(x) @ y),
}
SCALINGS = ("standard", "none")


@dataclass(frozen=True)
class LatentTranslationConfig(AnchorConfig):
    map: str = setting("lstsq_ortho", choices=MAPS)      # the paper's l-ortho, or svd or lstsq
    scaling: str = setting("standard", choices=SCALINGS)  # per-dimension centring and unit variance, or none


def standard_scaling(features: torch.Tensor, enabled: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(shift, scale)`` of each column (module docstring); ``(0, 1)`` when not ``enabled``."""
    if not enabled:
        return features.new_zeros(features.shape[1]), features.new_ones(features.shape[1])
    scale = features.std(dim=0)
    near_constant = (scale < NEAR_CONSTANT * torch.finfo(scale.dtype).eps) | (scale == 0)
    return features.mean(dim=0), torch.where(near_constant, torch.ones_like(scale), scale)


@register_adapter("latent_translation")
class LatentTranslation(TwoWayMap):
    """Standard scaling, zero-padding and a closed-form map (module docstring)."""
    fitted_by = 'standard scaling, zero-padding, the l-ortho map'
    reference = 'Maiorca et al., NeurIPS 2023'

    Config = LatentTranslationConfig

    def fit_map(self, target_map: LinearMap, source: torch.Tensor, target: torch.Tensor,
                generator: torch.Generator) -> None:
        enabled = self.config.scaling == "standard"
        (shift_s, scale_s), (shift_t, scale_t) = standard_scaling(source, enabled), standard_scaling(target, enabled)
        width = max(source.shape[1], target.shape[1])
        matrix = MAPS[self.config.map](pad_columns((source - shift_s) / scale_s, width),
                                       pad_columns((target - shift_t) / scale_t, width))
        weight = matrix[:source.shape[1], :target.shape[1]] / scale_s[:, None] * scale_t[None, :]
        target_map.set(weight=weight, center=shift_s, bias=shift_t)
