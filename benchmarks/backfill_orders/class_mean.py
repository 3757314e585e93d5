"""The items farthest from their class mean in the searched gallery first (docs/METHODS.md §7b), by L2 distance
(``class_mean_distance``) or by cosine (``class_mean_cosine``): the stored vectors that a class's neighbours
represent worst are re-embedded first."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from cl2r_bench.adapters.protocol import FeatureAdapter

from ..gallery_rows import class_means_of, per_item
from .base import BackfillGallery, BackfillOrder, register_backfill_order


class ClassMeanOrder(BackfillOrder):
    """Farthest from the class mean of the stale gallery first, by :meth:`distance`."""

    @staticmethod
    def distance(rows: torch.Tensor, means: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def rank(self, gallery: BackfillGallery, adapter: FeatureAdapter | None,
             generator: torch.Generator) -> torch.Tensor:
        classes, index = gallery.labels.unique(return_inverse=True)
        means, _ = class_means_of(gallery.stale, index, len(classes))
        distance = per_item(gallery.stale, lambda start, chunk: self.distance(
            chunk, means[index[start:start + len(chunk)]]))
        return torch.argsort(distance, descending=True)


@register_backfill_order("class_mean_distance")
class ClassMeanDistance(ClassMeanOrder):
    """By L2 distance to the class mean."""

    @staticmethod
    def distance(rows: torch.Tensor, means: torch.Tensor) -> torch.Tensor:
        return (rows - means).norm(dim=1)


@register_backfill_order("class_mean_cosine")
class ClassMeanCosine(ClassMeanOrder):
    """By cosine distance to the class mean."""

    @staticmethod
    def distance(rows: torch.Tensor, means: torch.Tensor) -> torch.Tensor:
        return 1 - F.cosine_similarity(rows.float(), means, dim=1)
