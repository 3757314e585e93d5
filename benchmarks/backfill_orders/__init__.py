"""The orders of partial backfilling: the template and registry (:mod:`.base`), then the built-in orders, each one
file registered as it is imported (every module of this folder is, by :func:`cl2r_bench.plugins.import_folder`)."""
from cl2r_bench.plugins import import_folder

from .base import (
    ORDERS,
    BackfillGallery,
    BackfillOrder,
    backfill_order,
    check_backfill_orders,
    list_backfill_orders,
    register_backfill_order,
)

import_folder(__name__, __path__)

__all__ = ["ORDERS", "BackfillGallery", "BackfillOrder", "backfill_order", "check_backfill_orders",
           "list_backfill_orders", "register_backfill_order"]
