"""mini-vec2vec (Dar 2025, "mini-vec2vec: Scaling Universal Geometry Alignment with Linear Transformations",
arXiv 2510.02348; reference code ``guy-dar/mini-vec2vec``, ``linear_vec2vec.ipynb``): a linear map fitted **without
paired items**, from the two spaces' shapes alone (METHODS.md §7).

The case of a provider who changed models and cannot embed the old items again: the old model's features of some
items and the new model's of others. Under ``model_update.pairing: unpaired`` a study hands this adapter the old
features of one half of its fitting items and the new features of the other half (no item in both, no labels;
:func:`cl2r_bench.adapters.base.unpaired_halves`); under ``paired`` it gets both sides of the same items and still
uses no correspondence. Backward only: ``X`` is the new side, ``Y`` the old.

1. **Centre and normalise** each side by its own mean, ``X̂ = N(X - μ_X)``, ``Ŷ = N(Y - μ_Y)``; the narrower is
   zero-padded to ``d = max(d_new, d_old)`` [choice: the reference aligns spaces of one width].
2. **Matched anchors**, ``anchor_runs`` times: draw ``subsample`` items of each side (independently), k-means them
   into ``anchor_clusters`` centres each, and match the two sets of centres by the quadratic assignment that
   maximises ``⟨K_X, P K_Y Pᵀ⟩`` between their centred Gram matrices ``K = H C Cᵀ H`` (``H = I - 11ᵀ/k``): scipy's
   2-opt from a random start (:mod:`.quadratic_assignment`: its result, faster), the best of ``qap_runs``. The
   matched centres of all runs are stacked.
3. **Pseudo-pairs**: each item's cosine profile against its side's stacked centres; for each ``x`` the ``neighbours``
   items ``y`` whose profiles are most cosine-similar to its own, averaged: ``ỹ(x)``.
4. **Procrustes**: ``W = U Vᵀ`` of ``X̂ᵀ Ỹ`` (the orthogonal ``W`` minimising ``‖X̂ W - Ỹ‖_F``).
5. **Refinement by neighbours**, ``refine_iterations`` times: ``refine_sample`` items ``x`` drawn at random, each
   matched to the mean of its ``neighbours`` nearest ``ŷ`` under ``cos(x W, ŷ)``; ``W ← (W + W')/2`` with ``W'``
   the Procrustes map of the sample onto those means.
6. **Refinement by clusters**, ``cluster_iterations`` times: k-means of ``X̂`` into ``refine_clusters`` centres
   ``C_X``, k-means of ``Ŷ`` started from ``C_X W``; ``W ← (W + W')/2`` with ``W'`` the Procrustes map of ``C_X``
   onto ``C_Y``. [choice] ``refine_clusters`` is capped at a quarter of the smaller side's items (the reference
   clusters ~10⁵ items into 500).

``backward(new) = N(new - μ_X), padded, times W``; ``old_frame(old) = N(old - μ_Y)``, padded: the old gallery as
those queries compare with it. The defaults are the notebook's (30 anchor runs of 20 clusters on 10,000-item
subsamples, 30 QAP starts, 50 neighbours, 100 refinements of 1,000 items, one cluster refinement of 500 centres).
k-means is scikit-learn's and the assignment scipy's 2-opt, as in the reference, each seeded from the fit's generator.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from cl2r_bench.plugin_settings import setting

from .base import Adapter, FeaturePair, in_memory, register_adapter
from .quadratic_assignment import two_opt_maximum
from .translation import pad_columns, procrustes_weight

SIMILARITY_CHUNK = 2048


@dataclass(frozen=True)
class MiniVec2VecConfig:
    anchor_runs: int = setting(30, at_least=1)       # k-means + assignment rounds whose matched centres are stacked
    anchor_clusters: int = setting(20, at_least=1)   # centres per side and round
    subsample: int = setting(10000, at_least=1)      # items per side drawn for each round (all when fewer)
    qap_runs: int = setting(30, at_least=1)          # random starts of the 2-opt assignment; the best is kept
    neighbours: int = setting(50, at_least=1)        # k of the pseudo-pairs and of the neighbour refinement
    refine_iterations: int = 100     # neighbour refinements
    refine_sample: int = setting(1000, at_least=1)   # items drawn for each neighbour refinement
    cluster_iterations: int = 1      # cluster refinements
    refine_clusters: int = setting(500, at_least=1)  # centres of a cluster refinement (at most a quarter of a side)


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The cosine similarity of every row of ``a`` with every row of ``b``."""
    return F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T


def centred_gram(centres: torch.Tensor) -> torch.Tensor:
    """``H C Cᵀ H`` with ``H = I - 11ᵀ/k``: the Gram matrix of the centres, centred."""
    k = len(centres)
    h = torch.eye(k, dtype=centres.dtype) - torch.full((k, k), 1.0 / k, dtype=centres.dtype)
    return h @ centres @ centres.T @ h


def drawn(rows: torch.Tensor, count: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` of ``rows`` drawn at random without replacement (all of them, shuffled, when fewer)."""
    return rows[torch.randperm(len(rows), generator=generator, device=generator.device)[:count].to(rows.device)]


def draw_seed(generator: torch.Generator) -> int:
    return int(torch.randint(2**31 - 1, (1,), generator=generator, device=generator.device))


def kmeans_centres(points: torch.Tensor, clusters: int, seed: int, start: torch.Tensor | None = None) -> torch.Tensor:
    """scikit-learn's k-means centres of ``points`` (from ``start`` when given)."""
    from sklearn.cluster import KMeans

    init = "k-means++" if start is None else start.cpu().double().numpy()
    fitted = KMeans(n_clusters=clusters, init=init, n_init=1, random_state=seed).fit(points.cpu().double().numpy())
    return torch.as_tensor(fitted.cluster_centers_, dtype=points.dtype, device=points.device)


def matched_order(kernel_x: torch.Tensor, kernel_y: torch.Tensor, runs: int, seed: int) -> torch.Tensor:
    """The permutation of the ``y`` centres that best matches the ``x`` centres: scipy's 2-opt quadratic assignment
    maximising ``⟨K_X, P K_Y Pᵀ⟩`` (:func:`.quadratic_assignment.two_opt_maximum`), the best objective of ``runs``
    random starts (2-opt starts from a random permutation; the reference's ``P0`` option belongs to the FAQ method,
    and 2-opt ignores it with a warning)."""
    a, b = kernel_x.cpu().double().numpy(), kernel_y.cpu().double().numpy()
    rng = np.random.default_rng(seed)
    best_order, best = None, None
    for _ in range(runs):
        order, found = two_opt_maximum(a, b, rng)
        if best is None or found > best:
            best_order, best = order, found
    return torch.as_tensor(best_order, device=kernel_x.device)


def pseudo_pairs(x: torch.Tensor, y: torch.Tensor, centres_x: torch.Tensor, centres_y: torch.Tensor,
                 neighbours: int) -> torch.Tensor:
    """For each row of ``x``, the mean of the ``neighbours`` rows of ``y`` whose cosine profiles against
    ``centres_y`` are most cosine-similar to its profile against the matched ``centres_x`` (step 3)."""
    profile_y = cosine(y, centres_y)
    matched = []
    for start in range(0, len(x), SIMILARITY_CHUNK):
        similar = cosine(cosine(x[start:start + SIMILARITY_CHUNK], centres_x), profile_y)
        matched.append(y[similar.topk(min(neighbours, len(y)), dim=1).indices].mean(dim=1))
    return torch.cat(matched)


def refine_by_neighbours(weight: torch.Tensor, sample: torch.Tensor, y: torch.Tensor, neighbours: int) -> torch.Tensor:
    """Step 5 once: each sampled ``x`` matched to the mean of its nearest ``y`` under ``cos(x W, y)``, and ``W``
    averaged with the Procrustes map of the sample onto those means."""
    nearest = cosine(sample @ weight, y).topk(min(neighbours, len(y)), dim=1).indices
    return 0.5 * weight + 0.5 * procrustes_weight(sample, y[nearest].mean(dim=1))


def refine_by_clusters(weight: torch.Tensor, centres_x: torch.Tensor, centres_y: torch.Tensor) -> torch.Tensor:
    """Step 6 once, given the two sides' centres: ``W`` averaged with the Procrustes map of ``C_X`` onto ``C_Y``."""
    return 0.5 * weight + 0.5 * procrustes_weight(centres_x, centres_y)


@register_adapter("mini_vec2vec")
class MiniVec2Vec(Adapter):
    """A linear map from the new space into the old one, fitted without pairs (module docstring)."""
    fitted_by = 'a linear map fitted **without pairs** (`--train-old OLD --train-new NEW`)'
    reference = 'Dar, arXiv 2510.02348, 2025'

    Config = MiniVec2VecConfig
    directions = ("backward",)
    fits_unpaired = True

    def build(self, old_dim: int, new_dim: int, side_dim: int = 0) -> None:
        width = max(old_dim, new_dim)
        self.register_buffer("weight", torch.zeros(width, width))
        self.register_buffer("new_mean", torch.zeros(new_dim))
        self.register_buffer("old_mean", torch.zeros(old_dim))

    def fit(self, pair: FeaturePair, generator: torch.Generator) -> dict[str, Any]:
        old, new = in_memory(pair.old).float(), in_memory(pair.new).float()
        self.new_mean.copy_(new.mean(dim=0))
        self.old_mean.copy_(old.mean(dim=0))
        x, y = self.new_side(new), self.old_frame(old)
        config = self.config
        centres_x, centres_y = self.matched_anchors(x, y, generator)
        weight = procrustes_weight(x, pseudo_pairs(x, y, centres_x, centres_y, config.neighbours))
        for _ in range(config.refine_iterations):
            weight = refine_by_neighbours(weight, drawn(x, config.refine_sample, generator), y, config.neighbours)
        clusters = min(config.refine_clusters, max(1, min(len(x), len(y)) // 4))
        for _ in range(config.cluster_iterations):
            found_x = kmeans_centres(x, clusters, draw_seed(generator))
            weight = refine_by_clusters(weight, found_x, kmeans_centres(y, clusters, draw_seed(generator),
                                                                        start=found_x @ weight))
        self.weight.copy_(weight)
        return {"new_items": float(len(x)), "old_items": float(len(y)), "matched_centres": float(len(centres_x)),
                "refine_clusters": float(clusters if config.cluster_iterations else 0)}

    def matched_anchors(self, x: torch.Tensor, y: torch.Tensor, generator: torch.Generator
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """Step 2: the matched centres of every round, stacked."""
        config, all_x, all_y = self.config, [], []
        for _ in range(config.anchor_runs):
            drawn_x, drawn_y = drawn(x, config.subsample, generator), drawn(y, config.subsample, generator)
            clusters = min(config.anchor_clusters, len(drawn_x), len(drawn_y))
            centres_x = kmeans_centres(drawn_x, clusters, draw_seed(generator))
            centres_y = kmeans_centres(drawn_y, clusters, draw_seed(generator))
            order = matched_order(centred_gram(centres_x), centred_gram(centres_y), config.qap_runs,
                                  draw_seed(generator))
            all_x.append(centres_x)
            all_y.append(centres_y[order])
        return torch.cat(all_x), torch.cat(all_y)

    def new_side(self, new: torch.Tensor) -> torch.Tensor:
        return pad_columns(F.normalize(new.float() - self.new_mean, dim=-1), self.weight.shape[0])

    def backward(self, new: torch.Tensor) -> torch.Tensor:
        return self.new_side(new) @ self.weight

    def old_frame(self, old: torch.Tensor) -> torch.Tensor:
        return pad_columns(F.normalize(old.float() - self.old_mean, dim=-1), self.weight.shape[0])
