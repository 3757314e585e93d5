"""Retrieval evaluation and the compatibility matrix (METHODS.md §1, §3).

:class:`CompatibilityEvaluator` follows the cost rule of the field: when model t is deployed it embeds the
gallery once (kept for every later row) and the queries once (used for row t only), then fills
``M[t][k]`` for k <= t against the kept galleries. A T-task run makes T gallery and T query extractions.

Gallery modes:

* ``templates`` (the papers'): one template per gallery class, the mean of the class's L2-normalised features,
  normalised again; score = top-1 accuracy of the cosine-nearest template.
* ``images``: every gallery image is kept; score = top-1 of the cosine-nearest gallery image (computed in chunks).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from models import forward_in_batches
from scenarios.datasets import ImageSet

GALLERY_MODES = ("templates", "images")


def embed(model: torch.nn.Module, images: ImageSet, *, mean: Sequence[float], std: Sequence[float],
          batch_size: int = 512, amp: bool = True) -> torch.Tensor:
    """L2-normalised features (float32, on the model's device) of every image, no augmentation."""
    return torch.cat([F.normalize(features, dim=1) for _, features in
                      forward_in_batches(model, images.images, mean=mean, std=std, batch_size=batch_size, amp=amp)])


def class_templates(features: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(templates, template_labels)``: per class, the normalised mean of its (normalised) features."""
    classes = labels.unique(sorted=True)
    onehot = (labels[:, None] == classes[None, :].to(labels.device)).float()
    sums = onehot.t() @ features
    return F.normalize(sums, dim=1), classes


def nearest_neighbour_accuracy(queries: torch.Tensor, query_labels: torch.Tensor, gallery: torch.Tensor,
                               gallery_labels: torch.Tensor, chunk: int = 4096) -> float:
    """Top-1 accuracy of the cosine-nearest gallery item (features are normalised)."""
    gallery_labels = gallery_labels.to(gallery.device)
    correct = 0
    for start in range(0, len(queries), chunk):
        nearest = (queries[start:start + chunk] @ gallery.t()).argmax(dim=1)
        correct += int((gallery_labels[nearest] == query_labels[start:start + chunk].to(gallery.device)).sum())
    return correct / max(len(queries), 1)


class CompatibilityEvaluator:
    """Fills the compatibility matrix as models are deployed (see the module docstring).

    Usage::

        evaluator = CompatibilityEvaluator(query, gallery, mean=..., std=...)
        for t, model in enumerate(models):
            row = evaluator.deploy(model)          # M[t][0..t]
        evaluator.matrix                           # rows, None above the diagonal
    """

    def __init__(self, query: ImageSet, gallery: ImageSet, *, mean: Sequence[float], std: Sequence[float],
                 mode: str = "templates", batch_size: int = 512, amp: bool = True) -> None:
        if mode not in GALLERY_MODES:
            raise ValueError(f"unknown gallery mode {mode!r}; choose from {list(GALLERY_MODES)}")
        self.query, self.gallery = query, gallery
        self.mean, self.std, self.mode, self.batch_size, self.amp = mean, std, mode, batch_size, amp
        self.galleries: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.rows: list[list[float]] = []
        self.extractions = {"gallery": 0, "query": 0}

    def _embed(self, model: torch.nn.Module, images: ImageSet, kind: str) -> torch.Tensor:
        self.extractions[kind] += 1
        return embed(model, images, mean=self.mean, std=self.std, batch_size=self.batch_size, amp=self.amp)

    def deploy(self, model: torch.nn.Module) -> list[float]:
        """Deploy the next model: embed its gallery (kept) and its queries, append and return its row."""
        gallery = self._embed(model, self.gallery, "gallery")
        labels = self.gallery.labels.to(gallery.device)
        self.galleries.append(class_templates(gallery, labels) if self.mode == "templates" else (gallery, labels))
        queries = self._embed(model, self.query, "query")
        query_labels = self.query.labels.to(queries.device)
        row = [nearest_neighbour_accuracy(queries, query_labels, g.to(queries.device), g_labels)
               for g, g_labels in self.galleries]
        self.rows.append(row)
        return row

    @property
    def matrix(self) -> list[list[float | None]]:
        size = len(self.rows)
        return [row + [None] * (size - len(row)) for row in self.rows]

    def state_dict(self) -> dict:
        """Kept galleries and rows, as plain tensors and lists (``torch.load(weights_only=True)`` safe)."""
        return {"galleries": [(g.cpu(), l.cpu()) for g, l in self.galleries], "rows": self.rows,
                "extractions": dict(self.extractions)}

    def load_state_dict(self, state: dict) -> None:
        self.galleries = [(g, l) for g, l in state["galleries"]]
        self.rows = [list(r) for r in state["rows"]]
        self.extractions = dict(state["extractions"])
