"""Random: every item equally likely at each step, a seeded permutation (docs/METHODS.md §7b)."""
from __future__ import annotations

import torch

from cl2r_bench.adapters.protocol import FeatureAdapter

from .base import BackfillGallery, BackfillOrder, register_backfill_order


@register_backfill_order("random")
class RandomOrder(BackfillOrder):
    """A seeded random permutation of the gallery."""

    def rank(self, gallery: BackfillGallery, adapter: FeatureAdapter | None,
             generator: torch.Generator) -> torch.Tensor:
        return torch.randperm(len(gallery.stale), generator=generator).to(gallery.stale.device)
