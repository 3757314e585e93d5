"""Local Procrustes, the mixture form of Drift-Adapter (Politzki, "Local Drift-Adapters: Mixture-of-Expert Embedding
Translation for Heterogeneous Vector Databases", not peer-reviewed; reference code ``jonathan-politzki/mixed-adapter``
at ``3ab4d7f``, ``scripts/run_experiment.py``'s ``run_local_experiment`` with ``src/clustering/`` and
``src/adapters/procrustes.py``; METHODS.md §7): one orthogonal (Procrustes) or affine map per cluster of the query
side, blended by a soft assignment to the cluster centres.

Reported (MS MARCO, 100,000 passages, identity retrieval old query -> new corpus, K = 8): MiniLM-L6 -> E5-large
(384 -> 1024) R@1 0.984 for local Procrustes against 0.979 for one global Procrustes; the reference's local
*affine* maps, learned low-rank (rank 32) maps, fall to 0.384 there: they collapse when the width changes.

Each direction is one mixture, fitted on the ``anchors`` fitting items (all when fewer, in order) with ``X`` the
side the map reads at query time and ``Y`` the side it writes: the forward map (old -> new, the reference's
direction: stored old features upgraded into the new space) reads old features, the backward map (new -> old, new
queries into the old space; the reference run with the roles swapped) reads new ones. So the clusters are always
those of the space the map is applied to [reference, for its direction], and a query is routed by what it has.

1. **Clusters** of ``X``, ``K = clusters`` (8) of them:

   * ``kmeans`` (default): k-means of the rows of ``X`` as given; the routing centres ``c_k`` are the k-means
     centres;
   * ``drift_aware``: k-means of ``φ_i = [x̂_i, α d_i / max_j ‖d_j‖]`` with ``x̂`` the row L2-normalised and ``d_i
     = ỹ_i - x̃_i Q`` the residual of the global Procrustes map ``Q`` of the zero-padded rows ``x̃, ỹ`` (width
     ``max(d_X, d_Y)``), ``α = drift_weight`` (1.0); the routing centres are the means of the rows of ``X`` in each
     cluster.

   k-means is Lloyd's algorithm as scikit-learn runs it (the reference calls ``sklearn.cluster.KMeans``): the data
   centred by its mean, greedy k-means++ seeding (``2 + ⌊ln K⌋`` candidates a step, the one that lowers the
   potential most) drawn from the fit's generator [choice: the reference fixes ``random_state=42``], at most
   ``max_iter`` (300) iterations, stopped when the labels repeat or the centres' total squared shift is at most
   ``tol`` (1e-4) times the mean per-coordinate variance of the data (scikit-learn's rule); an empty cluster takes
   the point farthest from its centre. Each iteration is a step of :class:`~cl2r_bench.adapters.learned.FitProgress`
   (both directions' together). An item's cluster is its nearest final centre. Fewer anchors than ``K``: ``K`` is
   the number of anchors [choice].

2. **One map per cluster** ``k`` on its ``n_k`` items ``X_k``, ``Y_k`` (no centring, no rescaling [reference]):

   * ``procrustes`` (default): ``W_k = U Vᵀ`` from the thin SVD ``M_k = U S Vᵀ`` of ``M_k = X_kᵀ Y_k``
     (``d_X x d_Y``), ``b_k = 0``: the (semi-)orthogonal minimiser of ``‖X_k W - Y_k‖_F``. [choice] The reference
     zero-pads both sides to the wider width, takes the square Procrustes map and truncates its output to ``d_Y``
     columns; that is the same ``W_k`` whenever ``M_k`` has full rank ``min(d_X, d_Y)`` (otherwise both are one
     of many minimisers), and the thin SVD is cheaper;
   * ``affine``: ``[W_k; b_k] = A_k⁺ B_k`` with ``A_k = [X_k 1]ᵀ[X_k 1]``, ``B_k = [X_k 1]ᵀ Y_k``: least squares
     with a bias, the minimum-norm solution [choice: the reference's local affine is a low-rank map trained by
     Adam, which the suite does not reproduce; ``drift_adapter`` has the learned variant].

   **Small clusters** [choice; the reference fits every non-empty cluster and gives an empty one the identity]: a
   cluster with fewer than ``min_items`` items uses the global map (the same estimator on all anchors);
   ``min_items`` null means ``d_X``, the fewest items whose cross-covariance can have full rank, below which the
   map is not determined off the cluster's span. ``prior_items`` ``λ`` (0) shrinks every cluster towards the
   global fit by adding ``λ`` items' worth of the global second moments: ``M_k + (λ/n) XᵀY`` for Procrustes,
   ``(A_k + (λ/n) A)⁺ (B_k + (λ/n) B)`` with ``A``, ``B`` those of all ``n`` anchors for the affine map. The
   moments are summed in float64 and the maps solved in float64, stored in float32.

3. **Routing** of a query ``x``: ``w_k(x) = softmax_k(cos(x, c_k) / τ)``, ``τ = temperature`` (0.1, the paper's
   and the reference's ``local_kmeans`` config at ``3ab4d7f``; an earlier commit, ``9c9228f``, had 1.0, which
   blends the maps almost evenly: on the parity check's synthetic upgrade R@1 0.18 against 0.91 at 0.1), or with
   ``routing: hard`` all weight on the most cosine-similar centre; the output is ``A(x) = N(Σ_k w_k(x) (x W_k +
   b_k))``, ``N`` the L2 normalisation [reference: a blend of orthogonal maps is not orthogonal, and shrinks at
   cluster boundaries]. ``A`` is not affine, so the zero-shot check of a backward map does not apply to it. A
   cosine-softmax equals a softmax of ``-‖x̂ - ĉ_k‖² / (2τ)`` on unit vectors.

Parity with the reference (``tools/parity/local_procrustes.py``, ``results/parity/local_procrustes.json``): from
the same k-means seeding, the routing centres and the mapped queries equal ``run_local_experiment``'s to 5e-6 (their
float32 SVD against the suite's float64), both directions, equal and different widths, soft and hard routing,
k-means and drift-aware clusters.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cl2r_bench.plugin_settings import setting

from .base import Adapter, FeaturePair, register_adapter
from .translation import pad_columns, pick_anchors, procrustes_weight

MAPS = ("procrustes", "affine")
CLUSTERINGS = ("kmeans", "drift_aware")
ROUTINGS = ("soft", "hard")
MAX_CLUSTERS = 256
"""At most this many clusters: each holds a ``d_X x d_Y`` map per direction."""
MOMENT_ROWS = 16384
"""Rows a time when the second moments are summed in float64."""


@dataclass(frozen=True)
class LocalProcrustesConfig:
    anchors: int = setting(100000, at_least=1)    # fitting items the clusters and maps are fitted on (all when fewer)
    clusters: int = setting(8, at_least=1, at_most=MAX_CLUSTERS)   # K, the reference's
    clustering: str = setting("kmeans", choices=CLUSTERINGS)       # k-means of the query side, or drift-aware
    drift_weight: float = setting(1.0, at_least=0)                 # α of drift_aware clustering
    map: str = setting("procrustes", choices=MAPS)                 # the map of each cluster
    min_items: int | None = setting(None, at_least=1)    # a smaller cluster uses the global map; null: d_X
    prior_items: float = setting(0.0, at_least=0)        # λ: the global fit's weight in each cluster's, in items
    routing: str = setting("soft", choices=ROUTINGS)     # softmax over the centres, or the nearest alone
    temperature: float = setting(0.1, above=0)           # τ of the softmax over cosines
    max_iter: int = setting(300, at_least=1)             # k-means iterations at most (scikit-learn's default)
    tol: float = setting(0.0001, at_least=0)             # k-means stop: squared shift ≤ tol x mean variance


@dataclass
class Clustering:
    """A k-means result: ``centres`` (k, d), each point's nearest final centre, and how the iterations ended."""

    centres: torch.Tensor
    labels: torch.Tensor
    iterations: int
    converged: bool


def squared_distances(points: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    """``‖p - c‖²`` of every row of ``points`` to every row of ``centres``."""
    return (points.pow(2).sum(1, keepdim=True) - 2 * points @ centres.t() + centres.pow(2).sum(1)).clamp(min=0)


def kmeans_plus_plus(points: torch.Tensor, clusters: int, generator: torch.Generator) -> torch.Tensor:
    """The indices of ``clusters`` seeding points, scikit-learn's greedy k-means++: a first point drawn uniformly,
    then each next one the best of ``2 + ⌊ln k⌋`` candidates drawn in proportion to their squared distance to the
    points chosen, the one that leaves the smallest potential (sum of those distances)."""
    n, device = len(points), generator.device
    trials = 2 + int(math.log(clusters))
    chosen = [int(torch.randint(n, (1,), generator=generator, device=device))]
    closest = squared_distances(points, points[chosen]).double()[:, 0]
    potential = closest.sum()
    for _ in range(1, clusters):
        draws = torch.rand(trials, generator=generator, device=device, dtype=torch.float64).to(points.device)
        candidates = torch.searchsorted(closest.cumsum(0), draws * potential).clamp(max=n - 1)
        to_candidates = torch.minimum(squared_distances(points[candidates], points).double(), closest)
        best = int(to_candidates.sum(1).argmin())
        chosen.append(int(candidates[best]))
        closest, potential = to_candidates[best], to_candidates[best].sum()
    return torch.tensor(chosen, device=points.device)


def cluster_means(points: torch.Tensor, labels: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    """The mean of each cluster's points; an empty cluster takes the point farthest from its own centre (moved out
    of its cluster), as scikit-learn relocates them."""
    k = len(centres)
    counts = torch.bincount(labels, minlength=k).to(points.dtype)
    sums = torch.zeros_like(centres).index_add_(0, labels, points)
    empty = torch.nonzero(counts == 0).flatten().tolist()
    if empty:
        far = (points - centres[labels]).pow(2).sum(1).topk(len(empty)).indices.tolist()
        for point, cluster in zip(far, empty, strict=True):
            own = int(labels[point])
            sums[own] -= points[point]
            counts[own] -= 1
            sums[cluster], counts[cluster] = points[point], 1
    return sums / counts.clamp(min=1)[:, None]


def kmeans(points: torch.Tensor, clusters: int, generator: torch.Generator, *, max_iter: int, tol: float,
           start: torch.Tensor | None = None, report: Callable[[float], None] | None = None) -> Clustering:
    """Lloyd's k-means as scikit-learn runs it (module docstring), from the points ``start`` (indices) or a
    k-means++ seeding; ``report(inertia)`` after each iteration."""
    shift = points.mean(0)
    x = points - shift
    centres = x[kmeans_plus_plus(x, clusters, generator) if start is None else start].clone()
    tolerance = tol * float(x.var(dim=0, unbiased=False).mean())
    previous, converged, iterations = None, False, 0
    while iterations < max_iter and not converged:
        closest, labels = squared_distances(x, centres).min(dim=1)
        moved = cluster_means(x, labels, centres)
        shifted = float((moved - centres).pow(2).sum())
        centres, iterations = moved, iterations + 1
        if report is not None:
            report(float(closest.sum()))
        converged = previous is not None and torch.equal(labels, previous) or shifted <= tolerance
        previous = labels
    return Clustering(centres + shift, squared_distances(x, centres).argmin(dim=1), iterations, converged)


def drift_features(source: torch.Tensor, target: torch.Tensor, weight: float) -> torch.Tensor:
    """``[x̂, α d / max ‖d‖]`` of drift-aware clustering (module docstring), in the zero-padded common width."""
    width = max(source.shape[1], target.shape[1])
    x, y = pad_columns(source.double(), width), pad_columns(target.double(), width)
    drift = y - x @ procrustes_weight(x, y)
    largest = drift.norm(dim=1).max()
    if largest > 0:
        drift = drift / largest
    norms = x.norm(dim=1, keepdim=True)
    position = x / torch.where(norms == 0, torch.ones_like(norms), norms)
    return torch.cat([position, weight * drift], dim=1).float()


def orthogonal_factor(matrix: torch.Tensor) -> torch.Tensor:
    """``U Vᵀ`` of the thin SVD ``matrix = U S Vᵀ``."""
    u, _, vh = torch.linalg.svd(matrix, full_matrices=False)
    return u @ vh


def with_ones(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x, x.new_ones(len(x), 1)], dim=1)


def second_moments(source: torch.Tensor, target: torch.Tensor, affine: bool) -> tuple[torch.Tensor, ...]:
    """What a map is solved from, in float64 summed over chunks of rows: ``(XᵀY,)`` for Procrustes, ``([X 1]ᵀ[X 1],
    [X 1]ᵀY)`` for the affine map."""
    parts = []
    for start in range(0, len(source), MOMENT_ROWS):
        x, y = source[start:start + MOMENT_ROWS].double(), target[start:start + MOMENT_ROWS].double()
        if affine:
            x = with_ones(x)
            parts.append((x.t() @ x, x.t() @ y))
        else:
            parts.append((x.t() @ y,))
    return tuple(sum(terms[1:], terms[0]) for terms in zip(*parts, strict=True))


def solved(moments: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(W, b)`` from :func:`second_moments`: ``U Vᵀ`` of ``XᵀY`` with ``b = 0``, or ``A⁺ B`` split into ``W`` and
    the bias row (the minimum-norm least-squares fit)."""
    if len(moments) == 1:
        return orthogonal_factor(moments[0]).float(), moments[0].new_zeros(moments[0].shape[1]).float()
    fit = torch.linalg.pinv(moments[0], hermitian=True) @ moments[1]
    return fit[:-1].float(), fit[-1].float()


class LocalMaps(nn.Module):
    """One direction's mixture: ``clusters`` routing centres on the source side, a ``d_X x d_Y`` map and a bias per
    cluster, and which clusters exist (fewer anchors than clusters leave some out)."""

    def __init__(self, source_dim: int, target_dim: int, clusters: int) -> None:
        super().__init__()
        self.register_buffer("centres", torch.zeros(clusters, source_dim))
        self.register_buffer("weight", torch.zeros(clusters, source_dim, target_dim))
        self.register_buffer("bias", torch.zeros(clusters, target_dim))
        self.register_buffer("active", torch.zeros(clusters, dtype=torch.bool))

    def routing(self, x: torch.Tensor, rule: str, temperature: float) -> torch.Tensor:
        """``(n, K)`` weights: the softmax of ``cos(x, c_k) / τ`` over the clusters, or one-hot on the largest
        cosine (``rule`` ``hard``)."""
        cosine = F.normalize(x.float(), dim=1) @ F.normalize(self.centres, dim=1).t()
        cosine = cosine.masked_fill(~self.active, -torch.inf)
        if rule == "hard":
            return F.one_hot(cosine.argmax(dim=1), len(self.centres)).float()
        return torch.softmax(cosine / temperature, dim=1)

    def forward(self, x: torch.Tensor, rule: str, temperature: float) -> torch.Tensor:
        """``N(Σ_k w_k(x) (x W_k + b_k))``, every cluster's map on every row (an inactive one has weight 0): no
        branch on the data, so ``torch.export`` takes it with any number of rows."""
        x = x.float()
        weights = self.routing(x, rule, temperature)
        blended = weights[:, :1] * (x @ self.weight[0] + self.bias[0])
        for k in range(1, self.weight.shape[0]):
            blended = blended + weights[:, k:k + 1] * (x @ self.weight[k] + self.bias[k])
        norms = blended.norm(dim=1, keepdim=True)
        return blended / torch.where(norms == 0, torch.ones_like(norms), norms)


class KMeansSteps:
    """The k-means iterations of both directions as the steps of a fit's :class:`FitProgress` (or of none)."""

    def __init__(self, progress: Any, budget: int) -> None:
        self.progress, self.budget, self.step = progress, budget, 0
        self.direction, self.best, self.best_step = "", math.inf, 0

    def start(self, direction: str) -> Callable[[float], None]:
        self.direction, self.best = direction, math.inf
        return self.report

    def report(self, inertia: float) -> None:
        self.step += 1
        if inertia < self.best:
            self.best, self.best_step = inertia, self.step
        if self.progress is not None:
            self.progress.check(self.step, self.budget, f"{self.direction} k-means inertia", inertia, self.best,
                                self.best_step)

    def done(self, converged: bool) -> None:
        if self.progress is not None:
            self.progress.done({"converged": converged, "steps": self.step, "best_step": self.step})


@register_adapter("local_procrustes")
class LocalProcrustes(Adapter):
    """Per-cluster Procrustes (or affine) maps blended by a softmax over the centres (module docstring)."""
    fitted_by = ("k-means of the query side, one Procrustes (or affine) map per cluster, blended by a softmax over "
                 "cosines to the centres")
    reference = "Politzki, Local Drift-Adapters, jonathan-politzki/mixed-adapter (not peer-reviewed)"

    Config = LocalProcrustesConfig
    directions = ("backward", "forward")
    picks_rows = True

    def build(self, old_dim: int, new_dim: int, side_dim: int = 0) -> None:
        self.to_old = LocalMaps(new_dim, old_dim, self.config.clusters)
        self.to_new = LocalMaps(old_dim, new_dim, self.config.clusters)

    def fit(self, pair: FeaturePair, generator: torch.Generator) -> dict[str, Any]:
        old, new = pick_anchors(pair, self.config.anchors, generator)
        steps = KMeansSteps(self.fit_progress, 2 * self.config.max_iter)
        with torch.no_grad():
            backward = self.fit_direction(self.to_old, new, old, generator, steps.start("backward"))
            forward = self.fit_direction(self.to_new, old, new, generator, steps.start("forward"))
        steps.done(bool(backward["kmeans_converged"] and forward["kmeans_converged"]))
        return {"anchors": float(len(old)), **{f"backward_{key}": value for key, value in backward.items()},
                **{f"forward_{key}": value for key, value in forward.items()}}

    def seed_free(self, items: int) -> bool:
        """One cluster of every item: k-means ends at the mean whatever its seeding, and the maps draw nothing."""
        return self.config.clusters == 1 and self.config.anchors >= items

    def fit_direction(self, maps: LocalMaps, source: torch.Tensor, target: torch.Tensor,
                      generator: torch.Generator, report: Callable[[float], None]) -> dict[str, Any]:
        """Clusters of ``source``, one map per cluster onto ``target``, into ``maps``; returns its fit log."""
        config = self.config
        clusters = min(config.clusters, len(source))
        features = source if config.clustering == "kmeans" else drift_features(source, target, config.drift_weight)
        found = kmeans(features.float(), clusters, generator, max_iter=config.max_iter, tol=config.tol,
                       report=report)
        affine = config.map == "affine"
        overall = second_moments(source, target, affine)
        whole, share = solved(overall), config.prior_items / len(source)
        minimum = config.min_items if config.min_items is not None else source.shape[1]
        sizes, fallbacks = [], 0
        for k in range(clusters):
            members = found.labels == k
            sizes.append(int(members.sum()))
            if config.clustering == "kmeans":
                maps.centres[k] = found.centres[k]
            else:   # the mean of the cluster's query-side rows; an empty cluster keeps its centre's position part
                maps.centres[k] = source[members].mean(0) if sizes[-1] else found.centres[k, :source.shape[1]]
            if sizes[-1] >= minimum:
                own = second_moments(source[members], target[members], affine)
                weight, bias = solved(tuple(m + share * g for m, g in zip(own, overall, strict=True)))
            else:
                (weight, bias), fallbacks = whole, fallbacks + 1
            maps.weight[k], maps.bias[k] = weight, bias
        maps.active.zero_()
        maps.active[:clusters] = True
        return {"clusters": clusters, "kmeans_iterations": found.iterations, "kmeans_converged": found.converged,
                "fallback_clusters": fallbacks, "smallest_cluster": min(sizes)}

    def closed_form(self, source: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(W, b)`` of this adapter's map of ``source`` onto ``target`` (module docstring, step 2)."""
        return solved(second_moments(source, target, self.config.map == "affine"))

    def backward(self, new: torch.Tensor) -> torch.Tensor:
        return self.to_old(new, self.config.routing, self.config.temperature)

    def forward(self, old: torch.Tensor, side: torch.Tensor | None = None) -> torch.Tensor:
        return self.to_new(old, self.config.routing, self.config.temperature)
