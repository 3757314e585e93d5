"""Retrieval evaluation and the compatibility matrix (METHODS.md §1, §3).

:class:`CompatibilityEvaluator` follows the cost rule of the field: when model t is deployed it embeds the
gallery once (kept for every later row) and the queries once (used for row t only), then fills
``M[t][k]`` for k <= t against the kept galleries. A T-task run makes T gallery and T query extractions.

Gallery modes:

* ``templates`` (the papers'): one template per gallery class, the mean of the class's L2-normalised features,
  normalised again; score = top-1 accuracy of the cosine-nearest template.
* ``images``: every gallery image is kept; score = top-1 of the cosine-nearest gallery image (computed in chunks).

With an adapter between consecutive models (METHODS.md §7; ``cl2r_bench/adapters``), ``deploy(model, adapter)``
also fills an *adapted* matrix, the one the retrieval system delivers when it never re-embeds images:

* ``backward``: the query features of model t go down the chain ``B_{k+1}(... B_t(q))`` into the frame of
  gallery k (a step without adapter is the identity); the kept galleries are untouched.
* ``forward``: when model t arrives, every kept gallery is transformed by ``F_t`` (features only, no image is
  embedded again) and queried by model t's own features; per-image gallery features are kept for this.

The diagonal is the plain self-test in both. Adapters are saved in :meth:`state_dict` (``Adapter.export``).

Every entry also keeps its per-query hits (one bool per query, on the CPU: 50 kB per entry for 50,000 queries), so
that ``benchmarks/noise.py`` can resample queries consistently across entries and ``benchmarks/flips.py`` can count
the queries a new model loses.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from cl2r_bench.adapters.protocol import FeatureAdapter
from cl2r_bench.data.datasets import ImageSet
from cl2r_bench.models import DEFAULT_AMP, class_means, embed
from cl2r_bench.settings import GALLERY_MODES

ADAPTED_DIRECTIONS = ("backward", "forward")


def class_templates(features: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(templates, template_labels)``: per class present in ``labels`` (ascending), the L2-normalised mean of its
    (normalised) features (METHODS.md §3), from :func:`cl2r_bench.models.class_means`."""
    means, present = class_means(features, labels, int(labels.max()) + 1)
    classes = present.nonzero().flatten()
    return F.normalize(means[classes], dim=1), classes


def common_width(queries: torch.Tensor, gallery: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both sides cut to the narrower one's width. A model that widens its predecessor's feature (BT²,
    docs/METHODS.md §6b) keeps the predecessor's frame in its first dimensions, so a newer model's queries meet an
    older gallery there, as the BT² authors' ``cosine_distance_matrix`` compares them; every other strategy keeps
    one width and is unaffected."""
    width = min(queries.shape[1], gallery.shape[1])
    return queries[:, :width], gallery[:, :width]


def nearest_neighbour_hits(queries: torch.Tensor, query_labels: torch.Tensor, gallery: torch.Tensor,
                           gallery_labels: torch.Tensor, chunk: int = 4096) -> torch.Tensor:
    """Per query (bool, on the CPU): is the cosine-nearest gallery item of its class? Features are normalised;
    features of different widths are compared on their first dimensions (:func:`common_width`; a query's nearest
    item does not depend on its norm). The mean is the top-1 accuracy; the hits themselves feed the noise analysis
    (``benchmarks/noise.py``)."""
    queries, gallery = common_width(queries, gallery)
    gallery_labels = gallery_labels.to(gallery.device)
    hits = []
    for start in range(0, len(queries), chunk):
        nearest = (queries[start:start + chunk] @ gallery.t()).argmax(dim=1)
        hits.append((gallery_labels[nearest] == query_labels[start:start + chunk].to(gallery.device)).cpu())
    return torch.cat(hits) if hits else torch.zeros(0, dtype=torch.bool)


def accuracy(hits: torch.Tensor) -> float:
    return float(hits.float().mean()) if len(hits) else 0.0


def gallery_hits(queries: torch.Tensor, query_labels: torch.Tensor, gallery: torch.Tensor,
                 gallery_labels: torch.Tensor, mode: str) -> torch.Tensor:
    """Per-query hits of ``queries`` against per-image ``gallery`` features, reduced to class templates in
    ``templates`` mode; every feature is L2-normalised first (adapted features need not be)."""
    queries, gallery = F.normalize(queries.float(), dim=1), F.normalize(gallery.float(), dim=1)
    gallery_labels = gallery_labels.to(gallery.device)
    if mode == "templates":
        gallery, gallery_labels = class_templates(gallery, gallery_labels)
    return nearest_neighbour_hits(queries, query_labels.to(queries.device), gallery, gallery_labels)


def gallery_accuracy(queries: torch.Tensor, query_labels: torch.Tensor, gallery: torch.Tensor,
                     gallery_labels: torch.Tensor, mode: str) -> float:
    """Top-1 accuracy of :func:`gallery_hits`."""
    return accuracy(gallery_hits(queries, query_labels, gallery, gallery_labels, mode))


class CompatibilityEvaluator:
    """Fills the compatibility matrix as models are deployed (see the module docstring).

    Usage::

        evaluator = CompatibilityEvaluator(query, gallery, amp=settings.autocast)
        for t, model in enumerate(models):
            row = evaluator.deploy(model)          # M[t][0..t]
        evaluator.matrix                           # rows, None above the diagonal

    ``embedder`` embeds a set of images (:func:`cl2r_bench.models.embed`'s signature); a data-parallel run passes
    one that splits the images across its processes (:meth:`cl2r_bench.distributed.Processes.embed`).
    """

    def __init__(self, query: ImageSet, gallery: ImageSet, *, mode: str = "templates", batch_size: int = 512,
                 amp: bool | str = DEFAULT_AMP, adapted: str | None = None,
                 adapter_factory: Callable[[], FeatureAdapter] | None = None,
                 embedder: Callable[..., torch.Tensor] = embed) -> None:
        if mode not in GALLERY_MODES:
            raise ValueError(f"unknown gallery mode {mode!r}; choose from {list(GALLERY_MODES)}")
        if adapted not in (None,) + ADAPTED_DIRECTIONS:
            raise ValueError(f"unknown adapted direction {adapted!r}; choose from {list(ADAPTED_DIRECTIONS)}")
        self.query, self.gallery = query, gallery
        self.mode, self.batch_size, self.amp = mode, batch_size, amp
        self.adapted, self.adapter_factory, self.embedder = adapted, adapter_factory, embedder
        self.galleries: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.rows: list[list[float]] = []
        self.adapted_rows: list[list[float]] = []
        self.hits: list[list[torch.Tensor]] = []
        self.adapted_hits: list[list[torch.Tensor]] = []
        self.adapters: list[FeatureAdapter | None] = []
        self.forward_galleries: list[torch.Tensor] = []
        self.extractions = {"gallery": 0, "query": 0}

    def _embed(self, model: torch.nn.Module, images: ImageSet, kind: str | None) -> torch.Tensor:
        """Features of ``images``; counted as a ``kind`` extraction unless ``kind`` is None."""
        if kind is not None:
            self.extractions[kind] += 1
        return self.embedder(model, images.images, batch_size=self.batch_size, amp=self.amp)

    def _searchable(self, gallery: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(items, labels)`` searched for a gallery's features: class templates or every image."""
        labels = self.gallery.labels.to(gallery.device)
        return class_templates(gallery, labels) if self.mode == "templates" else (gallery, labels)

    def deploy(self, model: torch.nn.Module, adapter: FeatureAdapter | None = None) -> list[float]:
        """Deploy the next model: embed its gallery (kept) and its queries, append and return its plain row.

        ``adapter`` (fitted between the previous model and this one, or None for the identity) extends the
        adapted matrix when the evaluator was built with ``adapted``.
        """
        gallery = self._embed(model, self.gallery, "gallery")
        self.galleries.append(self._searchable(gallery))
        queries = self._embed(model, self.query, "query")
        query_labels = self.query.labels.to(queries.device)
        hits = [nearest_neighbour_hits(queries, query_labels, g.to(queries.device), g_labels)
                for g, g_labels in self.galleries]
        self.hits.append(hits)
        self.rows.append([accuracy(h) for h in hits])
        if self.adapted is not None:
            self.adapters.append(adapter)
            adapted = self._adapted_hits(queries, query_labels, gallery, hits[-1], adapter)
            self.adapted_hits.append(adapted)
            self.adapted_rows.append([accuracy(h) for h in adapted])
        return self.rows[-1]

    def self_test(self, model: torch.nn.Module) -> float:
        """Top-1 accuracy of ``model`` against its own gallery, without deploying it (nothing is kept and the
        extraction counts are unchanged): how good a candidate model is on its own, e.g. a replacement."""
        gallery, labels = self._searchable(self._embed(model, self.gallery, None))
        queries = self._embed(model, self.query, None)
        return accuracy(nearest_neighbour_hits(queries, self.query.labels.to(queries.device), gallery, labels))

    def _adapted_hits(self, queries: torch.Tensor, query_labels: torch.Tensor, gallery: torch.Tensor,
                      own: torch.Tensor, adapter: FeatureAdapter | None) -> list[torch.Tensor]:
        t = len(self.rows) - 1
        if self.adapted == "forward":
            self.forward_galleries = [g if adapter is None else F.normalize(adapter.forward(g), dim=1)
                                      for g in self.forward_galleries] + [gallery]
            labels = self.gallery.labels
            return [gallery_hits(queries, query_labels, g, labels, self.mode)
                    for g in self.forward_galleries[:-1]] + [own]
        row = [own]
        moved = queries
        for k in range(t - 1, -1, -1):
            step = self.adapters[k + 1]
            moved = moved if step is None else F.normalize(step.backward(moved), dim=1)
            g, g_labels = self.galleries[k]
            row.insert(0, nearest_neighbour_hits(moved, query_labels, g.to(moved.device), g_labels))
        return row

    def hit_rows(self, adapted: bool = False) -> list[list[np.ndarray]] | None:
        """Per-query hits of each entry, row t holding ``[t][0..t]`` (bool arrays), the input of
        :func:`benchmarks.flips.negative_flips`; kept in :meth:`state_dict`, so a resumed run has every row. None
        when a resumed state predates hit keeping."""
        rows = self.adapted_hits if adapted else self.hits
        if len(rows) != len(self.rows) or not rows:
            return None
        return [[h.numpy() for h in row] for row in rows]

    def hit_matrix(self, adapted: bool = False) -> np.ndarray | None:
        """Per-query hits of every lower-triangular entry in row order (``E x n`` bool), the input of
        :func:`benchmarks.noise.noise_metrics`; None as :meth:`hit_rows`."""
        rows = self.hit_rows(adapted)
        return None if rows is None else np.stack([h for row in rows for h in row])

    @property
    def matrix(self) -> list[list[float | None]]:
        return _square(self.rows)

    @property
    def adapted_matrix(self) -> list[list[float | None]]:
        return _square(self.adapted_rows)

    def state_dict(self) -> dict:
        """Kept galleries, rows, per-query hits and adapters: plain tensors and lists (``weights_only`` safe)."""
        return {"galleries": [(g.cpu(), labels.cpu()) for g, labels in self.galleries], "rows": self.rows,
                "hits": self.hits, "adapted_hits": self.adapted_hits,
                "extractions": dict(self.extractions), "adapted_rows": self.adapted_rows,
                "adapters": [None if a is None else a.export() for a in self.adapters],
                "forward_galleries": [g.cpu() for g in self.forward_galleries]}

    def load_state_dict(self, state: dict) -> None:
        device = self.query.images.device
        self.galleries = [(g.to(device), labels.to(device)) for g, labels in state["galleries"]]
        self.rows = [list(r) for r in state["rows"]]
        self.extractions = dict(state["extractions"])
        self.adapted_rows = [list(r) for r in state.get("adapted_rows", [])]
        self.hits = [list(r) for r in state.get("hits", [])]
        self.adapted_hits = [list(r) for r in state.get("adapted_hits", [])]
        self.adapters = [None if a is None else self.adapter_factory().restore(a, device)
                         for a in state.get("adapters", [])]
        self.forward_galleries = [g.to(device) for g in state.get("forward_galleries", [])]


def _square(rows: list[list[float]]) -> list[list[float | None]]:
    return [row + [None] * (len(rows) - len(row)) for row in rows]
