"""SLERP (Ricci et al.; reference code ``miccunifi/SLERP_backward_compatibility``, ``slerp_bc/method.py`` and
``main.py``): orthogonal Procrustes from the new space into the old, then a spherical interpolation between the old
model's own query and the aligned new query, searched against the untouched old gallery (METHODS.md §7).

The deployment differs from every other adapter's: **both encoders embed each query** (the case ``old+new/old``),
so the old encoder keeps running at query time; nothing stored is rewritten.

Fitted on ``anchors`` parallel items (:func:`~cl2r_bench.adapters.translation.anchor_items`), L2-normalised, the
old ones zero-padded to ``d = max(d_old, d_new)``:

* ``R = P Qᵀ`` from the SVD ``Vᵀ U = P S Qᵀ`` of the new anchors ``V`` (``n x d_new``) and the padded old anchors
  ``U`` (``n x d``): the (semi-)orthogonal ``argmin ‖V R - U‖_F``; no centring, no rescaling (the suite's
  ``procrustes`` centres and rescales);
* a query ``x`` is ``q_α = (sin((1 - α) θ) u + sin(α θ) v) / sin θ``, L2-normalised, with ``u`` the normalised old
  feature (padded), ``v`` the normalised ``φ_new(x) R`` and ``θ = arccos(u · v)``, the cosine clamped to
  ``[-1 + 10⁻⁷, 1 - 10⁻⁷]``; the gallery is the old features, padded. α = 0 is the old model, α = 1 Procrustes;
* α is ``alpha`` when set, else chosen on the anchors from the grid ``0, 1/s, ..., 1`` (``s = alpha_steps``; the
  reference's 0.0-1.0 by 0.1): the α with the largest top-1, the smallest on ties, as the reference selects on its
  support set. [choice] Top-1 is leave-one-out with class labels (a hit: the nearest other anchor of the old
  gallery shares the query's class), where the reference scores paired image-text recall.

The fit log keeps the chosen ``alpha`` and ``alpha_curve``: ``[α, top-1 in percent]`` on the anchors per grid
point, α = 1 being Procrustes without centring (the reference's "SVD" row).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from cl2r_bench.plugin_settings import setting

from .base import Adapter, FeaturePair, in_memory, register_adapter
from .translation import AnchorConfig, anchor_items, pad_columns, procrustes_weight

COSINE_CLAMP = 1e-7
SELECTION_CHUNK = 1024


@dataclass(frozen=True)
class SlerpConfig(AnchorConfig):
    alpha: float | None = setting(None, at_least=0, at_most=1)   # the interpolation weight; None: chosen on the anchors
    alpha_steps: int = setting(10, at_least=1)   # the grid of α: 0, 1/alpha_steps, ..., 1


def slerp(u: torch.Tensor, v: torch.Tensor, alpha: float | torch.Tensor) -> torch.Tensor:
    """The unit vector at ``alpha`` of the great circle from ``u`` (α = 0) to ``v`` (α = 1), row by row (module
    docstring)."""
    u, v = F.normalize(u, dim=-1), F.normalize(v, dim=-1)
    theta = torch.acos((u * v).sum(-1, keepdim=True).clamp(-1 + COSINE_CLAMP, 1 - COSINE_CLAMP))
    return F.normalize((torch.sin((1 - alpha) * theta) * u + torch.sin(alpha * theta) * v) / torch.sin(theta), dim=-1)


def leave_one_out_top1(queries: torch.Tensor, gallery: torch.Tensor, labels: torch.Tensor) -> float:
    """Percent of queries whose most similar gallery item other than their own (same index) shares their label."""
    hits = 0
    for start in range(0, len(queries), SELECTION_CHUNK):
        chunk = queries[start:start + SELECTION_CHUNK] @ gallery.t()
        rows = torch.arange(len(chunk), device=chunk.device)
        chunk[rows, rows + start] = -torch.inf
        hits += int((labels[chunk.argmax(dim=1)] == labels[start:start + len(chunk)]).sum())
    return 100.0 * hits / len(queries)


@register_adapter("slerp")
class Slerp(Adapter):
    """Procrustes, then a spherical interpolation with the old model's query (module docstring)."""
    fitted_by = ("Procrustes, then a spherical interpolation with the old model's own query: both encoders embed "
                 'each query')
    reference = 'Ricci et al., miccunifi/SLERP_backward_compatibility'

    Config = SlerpConfig
    directions = ("dual",)
    picks_rows = True

    def build(self, old_dim: int, new_dim: int, side_dim: int = 0) -> None:
        self.register_buffer("rotation", torch.zeros(new_dim, max(old_dim, new_dim)))
        self.register_buffer("alpha", torch.zeros(()))

    def fit(self, pair: FeaturePair, generator: torch.Generator) -> dict[str, Any]:
        idx = anchor_items(len(pair.old), self.config.anchors, generator)
        if idx is None:
            old, new, labels = in_memory(pair.old), in_memory(pair.new), pair.labels
        else:
            idx = idx.to(pair.old.device)
            old, new, labels = pair.old[idx], pair.new[idx], pair.labels[idx.to(pair.labels.device)]
        old = self.old_frame(F.normalize(old.float(), dim=1))
        new = F.normalize(new.float(), dim=1)
        self.rotation.copy_(procrustes_weight(new, old))
        log: dict[str, Any] = {"anchors": float(len(old))}
        if self.config.alpha is not None:
            self.alpha.fill_(self.config.alpha)
            return {**log, "alpha": self.config.alpha}
        aligned, labels = new @ self.rotation, labels.to(old.device)
        grid = [step / self.config.alpha_steps for step in range(self.config.alpha_steps + 1)]
        curve = [[alpha, leave_one_out_top1(slerp(old, aligned, alpha), old, labels)] for alpha in grid]
        best = max(curve, key=lambda point: point[1])
        self.alpha.fill_(best[0])
        return {**log, "alpha": best[0], "alpha_curve": curve}

    def seed_free(self, items: int) -> bool:
        return self.config.anchors >= items

    def dual_query(self, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        return slerp(self.old_frame(old), F.normalize(new, dim=-1) @ self.rotation, self.alpha)

    def old_frame(self, old: torch.Tensor) -> torch.Tensor:
        return pad_columns(old, self.rotation.shape[1])
