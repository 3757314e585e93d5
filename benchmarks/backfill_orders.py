"""The orders in which a partial backfilling re-embeds the gallery (docs/METHODS.md §7b,
``model_update.backfill_orders``): random, the adapter's uncertainty (largest first), or the distance of each stored
vector from its class mean (the farthest first, by L2 distance or by cosine)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from cl2r_bench.adapters.protocol import FeatureAdapter
from cl2r_bench.settings import BACKFILL_ORDERS

from .gallery_rows import Features, class_means_of, first_rows, per_item


def backfill_order(kind: str, *, stale: Features, old: Features, labels: torch.Tensor,
                   adapter: FeatureAdapter | None, generator: torch.Generator) -> torch.Tensor | None:
    """Gallery indices, first to be backfilled first (module docstring); ``stale`` is the gallery as searched
    before backfilling and ``old`` the old model's features of the same items. None when ``kind`` needs what the
    adapter lacks. A streamed gallery is read chunk by chunk."""
    if kind == "random":
        return torch.randperm(len(stale), generator=generator).to(stale.device)
    if kind == "uncertainty":
        if adapter is None or adapter.uncertainty(first_rows(old)) is None:
            return None
        return torch.argsort(per_item(old, lambda _, chunk: adapter.uncertainty(chunk)), descending=True)
    if kind in ("class_mean_distance", "class_mean_cosine"):
        classes, index = labels.unique(return_inverse=True)
        means, _ = class_means_of(stale, index, len(classes))
        distance = per_item(stale, lambda start, chunk: (
            (chunk - means[index[start:start + len(chunk)]]).norm(dim=1) if kind == "class_mean_distance" else
            1 - F.cosine_similarity(chunk.float(), means[index[start:start + len(chunk)]], dim=1)))
        return torch.argsort(distance, descending=True)
    raise ValueError(f"unknown backfilling order {kind!r}; choose from {list(BACKFILL_ORDERS)}")
