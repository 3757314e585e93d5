"""The CPU kernels of :func:`benchmarks.ranking.items_above`: how many gallery items come before each positive, at
every step of every backfilling curve, in one pass over each block row (docs/METHODS.md §7b; the counting is the
ranking module's docstring, "How the ranks are found without sorting rows"). :func:`count_items` adds a block of
gallery items to per-row counts, so a gallery streamed in chunks is counted chunk by chunk, and :func:`finish`
turns the counts into the items above each positive once.

Why a compiled loop: on CPU the vectorised torch version writes and reads back every gallery item's place among the
thresholds, a histogram cell and a tie check, each a tensor as large as the block; here each item is placed by a
branch-free binary search over the row's thresholds (a few hundred values, in the first-level cache), run for 64
items side by side so their searches overlap, and counted at once. It gives the torch version's counts exactly
(``tests/test_ranking.py``) about five times faster on 2 cores (``python -m tools.bench_ranking``). numba is the
library made for such loops; the vectorised version stays for GPUs.
"""
from __future__ import annotations

import numba
import numpy as np

LANES = 64
"""Items whose binary searches run side by side: enough to hide the latency of one search's dependent loads."""


@numba.njit(parallel=True, cache=True, nogil=True)
def count_items(count: np.ndarray, fresh: np.ndarray, stale: np.ndarray, thresholds: np.ndarray, owner: np.ndarray,
                entry: np.ndarray, offset: int, versions: int) -> None:  # pragma: no cover - compiled
    """Add the items of one block of similarities to ``count`` ``(rows, versions, curves, steps + 1, m + 2)``:
    ``count[row, version, curve, entry, place + 1]`` counts the items of each version placed after ``place``
    thresholds (the number below their similarity). ``fresh``, ``stale``: ``(rows, n)`` float32 similarities of
    gallery items ``offset`` ... ``offset + n - 1`` (``stale`` is read only when ``versions`` is 2);
    ``thresholds``: ``(rows, m)`` ascending float32; ``owner``: ``(rows, m)`` the gallery index of each threshold's
    positive; ``entry``: ``(curves, n)`` the step at which each of these items turns fresh (``steps``: never). An
    item equal to a threshold moves one count from that threshold's cell to the next when its gallery index is
    lower than the threshold's positive's (the stable sort's tie-break). Counts add up over blocks of items."""
    rows, n = fresh.shape
    curves = entry.shape[0]
    m = thresholds.shape[1]
    for r in numba.prange(rows):
        thr = thresholds[r]
        own = owner[r]
        place = np.zeros(LANES, dtype=np.int64)
        for version in range(versions):
            block = fresh[r] if version == 0 else stale[r]
            cells = count[r, version]
            for start in range(0, n, LANES):
                width = min(LANES, n - start)
                values = block[start:start + width]
                place[:] = 0
                span = m
                while span > 1:
                    half = span >> 1
                    for j in range(width):
                        place[j] += half if thr[place[j] + half - 1] < values[j] else 0
                    span -= half
                if m > 0:
                    for j in range(width):
                        place[j] += 1 if thr[place[j]] < values[j] else 0
                for j in range(width):
                    item = start + j
                    at = place[j]
                    for c in range(curves):
                        cells[c, entry[c, item], at + 1] += 1
                    while at < m and thr[at] == values[j]:
                        if offset + item < own[at]:
                            for c in range(curves):
                                cells[c, entry[c, item], at + 2] += 1
                                cells[c, entry[c, item], at + 1] -= 1
                        at += 1


@numba.njit(parallel=True, cache=True, nogil=True)
def finish(count: np.ndarray, steps: int) -> np.ndarray:  # pragma: no cover - compiled
    """``(curves, rows, steps, m)``: the items above each threshold at each step, from :func:`count_items`'s
    ``count``: a suffix sum over places turns counts into items above; fresh items count at the steps t >= entry,
    stale ones at t < entry."""
    rows, versions, curves = count.shape[0], count.shape[1], count.shape[2]
    m = count.shape[4] - 2
    above = np.zeros((curves, rows, steps, m), dtype=np.int64)
    for r in numba.prange(rows):
        cells = count[r].copy()
        for version in range(versions):
            for c in range(curves):
                for e in range(steps + 1):
                    for k in range(m, -1, -1):
                        cells[version, c, e, k] += cells[version, c, e, k + 1]
        for c in range(curves):
            for i in range(m):
                stale_above = 0
                if versions > 1:
                    for e in range(steps + 1):
                        stale_above += cells[1, c, e, i + 2]
                fresh_above = 0
                for t in range(steps):
                    fresh_above += cells[0, c, t, i + 2]
                    if versions > 1:
                        stale_above -= cells[1, c, t, i + 2]
                    above[c, r, t, i] = fresh_above + stale_above
    return above
