"""The backfilling-order template and registry (docs/METHODS.md §7b, ``model_update.backfill_orders``).

A partial backfilling re-embeds the gallery's items one share at a time; an order says which items go first. A new
order is one file in ``benchmarks/backfill_orders/``, registered as the folder's modules are imported (or a
``--plugin`` file)::

    from benchmarks.backfill_orders import BackfillOrder, register_backfill_order

    @register_backfill_order("newest_first")
    class NewestFirst(BackfillOrder):
        '''One line for the docs; then the rule, citing its source.'''

        def rank(self, gallery, adapter, generator):
            return torch.arange(len(gallery.stale) - 1, -1, -1, device=gallery.stale.device)

``rank`` returns every gallery index once, the first to be re-embedded first, or None when the order needs what
the adapter lacks (FastFill's uncertainty). Each order's curve and area land in the record under its name, and the
leaderboard's backfilling table gets its columns from the records.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from cl2r_bench.adapters.protocol import FeatureAdapter
from cl2r_bench.errors import ConfigError
from cl2r_bench.registry import Registry

from ..gallery_rows import Features


@dataclass(frozen=True)
class BackfillGallery:
    """What an order may read: ``stale``, the gallery as searched before backfilling (old features, or the
    adapter's rewrite of them), ``old``, the old model's features of the same items, and their ``labels``. A
    streamed gallery is read chunk by chunk (:func:`benchmarks.gallery_rows.per_item`)."""

    stale: Features
    old: Features
    labels: torch.Tensor


class BackfillOrder:
    """One order of partial backfilling (module docstring)."""

    name: str

    def rank(self, gallery: BackfillGallery, adapter: FeatureAdapter | None,
             generator: torch.Generator) -> torch.Tensor | None:
        raise NotImplementedError


ORDERS = Registry("backfilling order", ConfigError)
register_backfill_order = ORDERS.register


def list_backfill_orders() -> list[str]:
    """The registered orders' names, sorted."""
    return ORDERS.names()


def check_backfill_orders(orders: list[str]) -> None:
    """``model_update.backfill_orders`` (also ``runner.py adapt``'s): a non-empty list of registered orders,
    checked before anything is fitted or trained."""
    if not orders or any(order not in ORDERS.classes for order in orders):
        raise ConfigError(f"model_update.backfill_orders = {orders!r}; give a list from {list_backfill_orders()}")


def backfill_order(kind: str, *, stale: Features, old: Features, labels: torch.Tensor,
                   adapter: FeatureAdapter | None, generator: torch.Generator) -> torch.Tensor | None:
    """Gallery indices of the order ``kind``, the first to be backfilled first; None when it needs what the
    adapter lacks (:meth:`BackfillOrder.rank`)."""
    return ORDERS.get(kind)().rank(BackfillGallery(stale, old, labels), adapter, generator)
