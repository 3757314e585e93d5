"""FastFill's order: the items whose adapted features the adapter is least sure of first (docs/METHODS.md §7b);
only an adapter that estimates its uncertainty (``FeatureAdapter.uncertainty``) has it."""
from __future__ import annotations

import torch

from cl2r_bench.adapters.protocol import FeatureAdapter

from ..gallery_rows import first_rows, per_item
from .base import BackfillGallery, BackfillOrder, register_backfill_order


@register_backfill_order("uncertainty")
class UncertaintyOrder(BackfillOrder):
    """The adapter's uncertainty of each old feature, largest first; None without one."""

    def rank(self, gallery: BackfillGallery, adapter: FeatureAdapter | None,
             generator: torch.Generator) -> torch.Tensor | None:
        if adapter is None or adapter.uncertainty(first_rows(gallery.old)) is None:
            return None
        return torch.argsort(per_item(gallery.old, lambda _, chunk: adapter.uncertainty(chunk)), descending=True)
