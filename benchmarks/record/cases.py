"""The retrieval cases of an adapter study as records name them, and per-query hits packed for a record."""
import base64
from typing import Any

import numpy as np

from .marks import DUAL_CASE

CROSS_CASES = (DUAL_CASE, "B/old", "new/F", "new/old")
"""The cross entry of the 2x2 matrix, what a system serves without backfilling, in order of preference: the dual
query for an adapter that combines both models' queries (SLERP), B/old for an adapter with a backward map, new/F for
a forward-only one, new/old without adapter (docs/METHODS.md §7b)."""


BASELINE = "old/old"
"""The case an adapter must beat to be compatible: the old model alone."""


def cross_case(cases: dict[str, Any]) -> str | None:
    """The first case of :data:`CROSS_CASES` the record's ``cases`` hold, or None."""
    return next((case for case in CROSS_CASES if cases.get(case) is not None), None)


def pack_hits(hits: np.ndarray) -> str:
    """Per-query booleans as base64 of packed bits (``retrieval.query_top1``; 10,000 queries: 1.7 kB of JSON)."""
    return base64.b64encode(np.packbits(np.asarray(hits, dtype=bool)).tobytes()).decode("ascii")


def unpack_hits(text: str, queries: int) -> np.ndarray:
    """The inverse of :func:`pack_hits` for ``queries`` queries."""
    return np.unpackbits(np.frombuffer(base64.b64decode(text), dtype=np.uint8), count=queries).astype(bool)
