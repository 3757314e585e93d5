"""The orders of partial backfilling: the template and registry (:mod:`.base`), then the built-in orders, each one
file registered by its import line below."""
from . import class_mean, random_order, uncertainty  # noqa: F401  (registers the built-in orders)
from .base import (
    ORDERS,
    BackfillGallery,
    BackfillOrder,
    backfill_order,
    check_backfill_orders,
    list_backfill_orders,
    register_backfill_order,
)

__all__ = ["ORDERS", "BackfillGallery", "BackfillOrder", "backfill_order", "check_backfill_orders",
           "list_backfill_orders", "register_backfill_order"]
