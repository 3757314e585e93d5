"""The CPU kernels of :func:`benchmarks.ranking.counting.items_above`: how many gallery items come before each positive,
at every step of every backfilling curve, in one pass over each block row (docs/METHODS.md §7b; the counting is the
ranking module's docstring, "How the ranks are found without sorting rows"). :func:`count_items` adds a block of
gallery items to per-row counts, so a gallery streamed in chunks is counted chunk by chunk, :func:`finish` turns
the counts into the items above each positive once, and :func:`rank_scores` reads each query's first rank, AP and
AP@R from them. A block ranked against the whole gallery at once (in memory) takes each row through all four
stages in one pass, :func:`rank_rows`; each stage is a function of one row that both ways share.

**How an item finds its place among a row's thresholds** (its positives' similarities, ascending): by a bucket
table, not a binary search. :func:`bucket_table` cuts the span of the row's finite thresholds into
:func:`buckets_for` equal buckets and notes where each bucket's thresholds start; an item's bucket is one
subtraction and one product away, and it is compared only with the thresholds of its own bucket (none or one, as
a rule). The place is exact, not interpolated: the same :func:`bucket_of` sorts thresholds and items, and it never
decreases as the value grows, so every threshold of a lower bucket lies below the item and every one of a higher
bucket above it. The first two comparisons are additions of their outcomes, without a branch to mispredict (the
thresholds end with a +inf sentinel, so the next threshold can always be read); an item in a bucket crowded beyond
them (ties, or thresholds bunched together) is placed by a binary search within the bucket.

Why a compiled loop: on CPU the vectorised torch version writes and reads back every gallery item's place among the
thresholds, a histogram cell and a tie check, each a tensor as large as the block; here each item is placed and
counted in one pass over its row, whose table and thresholds stay in the first-level cache. It gives the torch
version's counts exactly (``tests/benchmarks/test_ranking.py``); ``python -m tools.bench_ranking`` measures it. numba
is the library made for such loops; the vectorised version stays for GPUs.
"""
from __future__ import annotations

import numba
import numpy as np


def buckets_for(thresholds: int) -> int:
    """Buckets of a row's table: the power of two at least twice the thresholds, so most buckets hold none."""
    return 1 << max(int(2 * max(thresholds, 1) - 1).bit_length(), 1)


@numba.njit(inline="always")
def bucket_of(value: float, low: float, high: float, scale: float, top: float) -> int:  # pragma: no cover
    """The bucket of ``value``, in float32 throughout: clipped to the span ``low`` ... ``high`` (so infinities land at
    the table's ends), ``(value - low) * scale``, at most the last bucket ``top``. Never decreasing in ``value``;
    no branch, so the compiler runs it over many items at once."""
    return np.uint32(min((min(max(value, low), high) - low) * scale, top))


@numba.njit(parallel=True, cache=True, nogil=True)
def bucket_table(thresholds: np.ndarray, buckets: int) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover
    """``(starts, span)``: ``starts[row, b]`` the first threshold of bucket ``b`` of ``row`` (``starts[row,
    buckets]`` = m), and ``span[row]`` its ``(low, high, scale)`` in float32, from ``thresholds`` ``(rows, m)``
    ascending float32 (module docstring; :func:`bucket_row` for each row)."""
    rows = len(thresholds)
    starts = np.empty((rows, buckets + 1), dtype=np.int32)
    span = np.zeros((rows, 3), dtype=np.float32)
    for r in numba.prange(rows):
        bucket_row(thresholds[r], starts[r], span[r])
    return starts, span


@numba.njit(cache=True, nogil=True)
def bucket_row(thr: np.ndarray, starts: np.ndarray, span: np.ndarray) -> None:  # pragma: no cover - compiled
    """One row of :func:`bucket_table`: ``starts`` ``(buckets + 1,)`` and ``span`` ``(3,)`` of the ascending
    thresholds ``thr``."""
    m, buckets = len(thr), len(starts) - 1
    top = np.float32(buckets - 1)
    low, high = np.inf, -np.inf
    for i in range(m):
        if np.isfinite(thr[i]):
            low, high = min(low, thr[i]), max(high, thr[i])
    if not high >= low:
        low, high = 0.0, 0.0
    span[0], span[1] = low, high
    span[2] = min(buckets / (np.float64(high) - np.float64(low)), 1e30) if high > low else 0.0
    b = 0
    for i in range(m):
        value = bucket_of(thr[i], span[0], span[1], span[2], top)
        while b <= value:
            starts[b] = i
            b += 1
    while b <= buckets:
        starts[b] = m
        b += 1


@numba.njit(parallel=True, cache=True, nogil=True)
def count_items(count: np.ndarray, fresh: np.ndarray, stale: np.ndarray, thresholds: np.ndarray, owner: np.ndarray,
                starts: np.ndarray, span: np.ndarray, entry: np.ndarray, index: np.ndarray,
                versions: int) -> None:  # pragma: no cover - compiled
    """Add the items of one block of similarities to ``count`` ``(rows, versions, curves, steps + 1, m + 2)``
    (int32): ``count[row, version, curve, entry, place + 1]`` counts the items of each version placed after
    ``place`` thresholds (the number below their similarity). ``fresh``, ``stale``: ``(rows, n)`` float32
    similarities of the gallery items ``index`` (``stale`` is read only when ``versions`` is 2); ``thresholds``:
    ``(rows, m + 1)`` ascending float32, the last column +inf (a sentinel), with the :func:`bucket_table`
    ``starts`` and ``span`` of their first m; ``owner``: ``(rows, m)`` the gallery index of each threshold's
    positive; ``entry``: ``(E, curves, n)`` the step at which each of these items turns fresh (``steps``: never);
    ``index``: ``(E, n)`` the items' gallery indices, E being 1 (every row compares the same items, a chunk of the
    gallery) or ``rows`` (each row its own, :func:`screen`'s candidates). An item equal to a threshold moves one
    count from that threshold's cell to the next when its gallery index is lower than the threshold's positive's
    (the stable sort's tie-break). Counts add up over blocks of items. Items below every threshold (place 0) are
    not counted: they come after every positive, and :func:`finish` reads only the cells from place 1 up.

    Each row's items below its least threshold (most of a gallery: the other classes) are dropped in a first loop,
    without a branch; the others are bucketed in a second, placed in a third (noting the few equal to a threshold)
    and counted in a fourth, so each loop stays short; indices are unsigned, which spares numba's checks for negative
    ones."""
    rows = len(fresh)
    for r in numba.prange(rows):
        entries, items = (entry[r], index[r]) if len(index) > 1 else (entry[0], index[0])
        count_row(count[r], fresh[r], stale[r], thresholds[r], owner[r], starts[r], span[r], entries, items, versions)


@numba.njit(cache=True, nogil=True)
def count_row(cells: np.ndarray, fresh: np.ndarray, stale: np.ndarray, thr: np.ndarray, own: np.ndarray,
              first: np.ndarray, span: np.ndarray, entries: np.ndarray, items: np.ndarray,
              versions: int) -> None:  # pragma: no cover - compiled
    """One row of :func:`count_items`: its ``cells`` ``(versions, curves, steps + 1, m + 2)``, similarities
    ``fresh`` and ``stale`` ``(n,)``, thresholds ``thr`` ``(m + 1,)``, their positives ``own``, its bucket table
    (``first``, ``span``), and the items' ``entries`` ``(curves, n)`` and gallery indices ``items`` ``(n,)``."""
    n = len(fresh)
    curves = entries.shape[0]
    m = len(thr) - 1
    buckets = len(first) - 1
    top = np.float32(buckets - 1)
    one = np.uint64(1)
    low, high, scale = span[0], span[1], span[2]
    lowest = thr[0]
    kept = np.empty(n, dtype=np.uint32)
    bucket = np.empty(n, dtype=np.uint32)
    place = np.empty(n, dtype=np.uint32)
    tied = np.empty(n, dtype=np.uint32)
    for version in range(versions):
        block = fresh if version == 0 else stale
        version_cells = cells[version]
        count = 0
        for item in range(n):
            kept[count] = item
            count += block[item] >= lowest
        for k in range(count):
            bucket[k] = bucket_of(block[kept[k]], low, high, scale, top)
        ties = 0
        for k in range(count):
            item = kept[k]
            value = block[item]
            b = np.uint64(bucket[k])
            at = np.uint64(first[b])
            at += np.uint64(thr[at] < value)
            at += np.uint64(thr[at] < value)
            if thr[at] < value:
                end = np.uint64(first[b + one])
                while at < end:
                    middle = (at + end) >> one
                    if thr[middle] < value:
                        at = middle + one
                    else:
                        end = middle
            place[k] = at
            tied[ties] = k
            ties += thr[at] == value
        for c in range(curves):
            turns, cell = entries[c], version_cells[c]
            for k in range(count):
                cell[turns[kept[k]], place[k] + 1] += 1
        for j in range(ties):
            k = tied[j]
            item = kept[k]
            at, value = place[k], block[item]
            while at < m and thr[at] == value:
                if items[item] < own[at]:
                    for c in range(curves):
                        version_cells[c, entries[c, item], at + 2] += 1
                        version_cells[c, entries[c, item], at + 1] -= 1
                at += 1


@numba.njit(inline="always")
def push(heap: np.ndarray, value: float) -> None:  # pragma: no cover - compiled
    """Put ``value`` in place of the least of the min-heap ``heap`` (which it exceeds) and restore the heap."""
    size = len(heap)
    at = 0
    while True:
        child = 2 * at + 1
        if child >= size:
            break
        if child + 1 < size and heap[child + 1] < heap[child]:
            child += 1
        if heap[child] >= value:
            break
        heap[at] = heap[child]
        at = child
    heap[at] = value


@numba.njit(inline="always")
def keep_above(items: np.ndarray, best: np.ndarray, count: int, cut: float) -> int:  # pragma: no cover
    """Keep, in order, the first ``count`` candidates whose ``best`` is at least ``cut``; returns how many."""
    kept = 0
    for k in range(count):
        if best[k] >= cut:
            items[kept], best[kept] = items[k], best[k]
            kept += 1
    return kept


@numba.njit(parallel=True, cache=True, nogil=True)
def screen(approx: np.ndarray, offset: int, own: np.ndarray, item_labels: np.ndarray, query_labels: np.ndarray,
           heap: np.ndarray, items: np.ndarray, best: np.ndarray, counts: np.ndarray, error: float,
           relative: float) -> bool:  # pragma: no cover - compiled
    """Screen the gallery items ``offset`` ... ``offset + n - 1`` for each row's candidates (the screened ranking
    of :mod:`benchmarks.ranking`): ``approx`` ``(versions, rows, n)``, their approximate similarities a as
    bfloat16 bits (uint16), each within ``error + relative * |a|`` of the exact one. ``heap[row]``: a min-heap of
    the largest lower bounds seen so far (each item's least over its versions; -inf until filled), whose root is
    the row's cut. An item becomes a candidate (its index appended to ``items[row]``, its largest upper bound to
    ``best[row]``, after the row's first ``counts[row]``) when that upper bound reaches the cut, unless it is the
    row's ``own`` item (never ranked) or one of its positives (``item_labels`` equal to the row's
    ``query_labels``: counted with their exact similarities anyway). A full row first drops the candidates below
    the cut; returns True when a row's candidates still fill ``items`` (the caller screens again with room for
    more). A first, branch-free loop keeps the few items whose approximation can reach the cut the row had when the
    chunk began (the cut only rises), and only those are weighed one by one."""
    versions, rows, n = approx.shape
    capacity = items.shape[1]
    full = np.zeros(rows, dtype=np.bool_)
    for r in numba.prange(rows):
        bits = np.empty((versions, n), dtype=np.uint32)
        for v in range(versions):
            for j in range(n):
                bits[v, j] = np.uint32(approx[v, r, j]) << np.uint32(16)
        values = bits.view(np.float32)
        top, label, count = heap[r], query_labels[r], counts[r]
        start_cut = top[0] - error
        lowest = start_cut / (1 + relative) if start_cut >= 0 else start_cut / (1 - relative)
        passing = np.empty(n, dtype=np.uint32)
        passed = 0
        for j in range(n):
            high = values[0, j]
            for v in range(1, versions):
                high = max(high, values[v, j])
            passing[passed] = j
            passed += high >= lowest
        for k in range(passed):
            j = passing[k]
            low = values[0, j]
            high = low
            for v in range(1, versions):
                low, high = min(low, values[v, j]), max(high, values[v, j])
            item = offset + j
            if item == own[r]:
                continue
            low = low - error - relative * abs(low)
            high = high + error + relative * abs(high)
            if low > top[0]:
                push(top, low)
            if high < top[0] or item_labels[j] == label:
                continue
            if count == capacity:
                count = keep_above(items[r], best[r], count, top[0])
                if count == capacity:
                    full[r] = True
                    break
            items[r, count], best[r, count] = item, high
            count += 1
        counts[r] = count
    return full.any()


@numba.njit(fastmath=True, cache=True, nogil=True)
def dot(query: np.ndarray, row: np.ndarray) -> np.float32:  # pragma: no cover - compiled
    """``query · row`` in float32, in one summation order wherever it is taken (:func:`pair_dots`,
    :func:`candidate_dots`), so that duplicate items tie."""
    total = np.float32(0.0)
    for d in range(len(query)):
        total += query[d] * row[d]
    return total


@numba.njit(parallel=True, cache=True, nogil=True)
def pair_dots(queries: np.ndarray, rows: np.ndarray, query_of: np.ndarray,
              row_of: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    """``queries[query_of[k]] · rows[row_of[k]]`` for every k, float32 (:func:`dot`): a streamed ranking's positives'
    similarities, a few per gallery item, without the chunk's whole matrix product
    (:func:`benchmarks.ranking.positive_similarity`)."""
    out = np.empty(len(query_of), dtype=np.float32)
    for k in numba.prange(len(query_of)):
        out[k] = dot(queries[query_of[k]], rows[row_of[k]])
    return out


@numba.njit(parallel=True, cache=True, nogil=True)
def candidate_dots(queries: np.ndarray, rows: np.ndarray, offset: int, candidates: np.ndarray, cursor: np.ndarray,
                   out: np.ndarray) -> None:  # pragma: no cover - compiled
    """``out[r, k] = queries[r] · rows[candidates[r, k] - offset]`` (:func:`dot`) for each row's candidates among the
    gallery items ``offset`` ... ``offset + len(rows) - 1``: a row's candidates ascend (-1 after the last), so
    ``cursor[r]``, its first candidate not yet taken, moves along them chunk by chunk."""
    end = offset + len(rows)
    for r in numba.prange(len(queries)):
        k = cursor[r]
        while k < candidates.shape[1] and 0 <= candidates[r, k] < end:
            out[r, k] = dot(queries[r], rows[candidates[r, k] - offset])
            k += 1
        cursor[r] = k


@numba.njit(parallel=True, cache=True, nogil=True)
def keep_candidates(items: np.ndarray, best: np.ndarray, counts: np.ndarray,
                    heap: np.ndarray) -> None:  # pragma: no cover - compiled
    """Keep, in order, each row's candidates whose ``best`` reaches its final cut (the root of ``heap[row]``)."""
    for r in numba.prange(len(items)):
        counts[r] = keep_above(items[r], best[r], counts[r], heap[r, 0])


@numba.njit(parallel=True, cache=True, nogil=True)
def finish(count: np.ndarray, steps: int) -> np.ndarray:  # pragma: no cover - compiled
    """``(curves, rows, steps, m)``: the items above each threshold at each step, from :func:`count_items`'s
    ``count``: a suffix sum over places turns counts into items above; fresh items count at the steps t >= entry,
    stale ones at t < entry."""
    rows, curves, m = count.shape[0], count.shape[2], count.shape[4] - 2
    above = np.zeros((curves, rows, steps, m), dtype=np.int64)
    for r in numba.prange(rows):
        finish_row(count[r].copy(), steps, above[:, r])
    return above


@numba.njit(cache=True, nogil=True)
def finish_row(cells: np.ndarray, steps: int, above: np.ndarray) -> None:  # pragma: no cover - compiled
    """One row of :func:`finish`: its ``cells`` ``(versions, curves, steps + 1, m + 2)`` (summed in place) into its
    ``above`` ``(curves, steps, m)``."""
    versions, curves, m = cells.shape[0], cells.shape[1], cells.shape[3] - 2
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
                above[c, t, i] = fresh_above + stale_above


@numba.njit(parallel=True, cache=True, nogil=True)
def rank_scores(above: np.ndarray, placed: np.ndarray, index: np.ndarray, valid: np.ndarray, entry: np.ndarray,
                versions: int) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - compiled
    """``(first, ap)``: each row's first rank ``(curves, steps, rows)`` (0 without a positive) and its AP and AP@R
    ``(2, curves, steps, rows)`` (NaN without a positive; docs/METHODS.md §7b), from :func:`finish`'s ``above``
    ``(curves, rows, steps, m)``, the items before each of the row's thresholds in ascending order; ``placed``
    ``(rows, m)``: the ``version * P + slot`` of each threshold, the slot's positive being gallery item ``index[row,
    slot]`` where ``valid`` ``(rows, P)``; item j is fresh at the steps t >= ``entry[curve, j]`` (:func:`score_row`
    for each row)."""
    curves, rows, steps = above.shape[0], above.shape[1], above.shape[2]
    first = np.zeros((curves, steps, rows), dtype=np.int64)
    ap = np.full((2, curves, steps, rows), np.nan)
    for r in numba.prange(rows):
        score_row(above[:, r], placed[r], index[r], valid[r], entry, versions, first[:, :, r], ap[:, :, :, r])
    return first, ap


@numba.njit(cache=True, nogil=True)
def score_row(above: np.ndarray, placed: np.ndarray, index: np.ndarray, valid: np.ndarray, entry: np.ndarray,
              versions: int, first: np.ndarray, ap: np.ndarray) -> None:  # pragma: no cover - compiled
    """One row of :func:`rank_scores`: from its ``above`` ``(curves, steps, m)``, ``placed`` ``(m,)``, ``index`` and
    ``valid`` ``(P,)``, its ``first`` ``(curves, steps)`` and ``ap`` ``(2, curves, steps)``, left as they are
    (0, NaN) without a positive.

    At each step a positive's rank is one more than the items above the threshold of the version it has then. Taken
    from the largest threshold down, those ranks ascend, since every item above a positive is above any positive of
    a lower similarity, and so is that positive itself; only positives of equal similarity, which the tie-break by
    gallery index orders, may come out of order, and an insertion keeps the list sorted. AP = (1/P) Σ_j j / r_j over
    the sorted ranks r_j, AP@R the same sum over r_j <= P."""
    curves, steps, m = above.shape
    width = len(index)
    count = 0
    for s in range(width):
        count += valid[s]
    if count == 0:
        return
    thresholds = versions * count
    taken = np.empty(thresholds, dtype=np.int64)
    fresh_version = np.empty(thresholds, dtype=np.bool_)
    turns = np.empty((curves, thresholds), dtype=np.int64)
    k = 0
    for i in range(m - 1, -1, -1):
        slot = placed[i] % width
        if valid[slot]:
            taken[k], fresh_version[k] = i, placed[i] < width
            for c in range(curves):
                turns[c, k] = entry[c, index[slot]]
            k += 1
            if k == thresholds:
                break
    ranks = np.empty(count, dtype=np.int64)
    for c in range(curves):
        for t in range(steps):
            k = 0
            for j in range(thresholds):
                if versions > 1 and fresh_version[j] != (turns[c, j] <= t):
                    continue
                rank = above[c, t, taken[j]] + 1
                at = k
                while at > 0 and ranks[at - 1] > rank:
                    ranks[at] = ranks[at - 1]
                    at -= 1
                ranks[at] = rank
                k += 1
            total, within = 0.0, 0.0
            for j in range(count):
                precision = (j + 1) / ranks[j]
                total += precision
                if ranks[j] <= count:
                    within += precision
            first[c, t] = ranks[0]
            ap[0, c, t] = total / count
            ap[1, c, t] = within / count


@numba.njit(parallel=True, cache=True, nogil=True)
def rank_rows(fresh: np.ndarray, stale: np.ndarray, thresholds: np.ndarray, owner: np.ndarray, placed: np.ndarray,
              index: np.ndarray, valid: np.ndarray, entry: np.ndarray, steps: int, buckets: int,
              versions: int) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - compiled
    """:func:`rank_scores` of a block of queries ranked against the whole gallery, whose similarities are ``fresh``
    and ``stale`` ``(rows, n)``, each row taken through :func:`bucket_row`, :func:`count_row`, :func:`finish_row`
    and :func:`score_row` in one pass, its counts in a buffer of its own (``thresholds``, ``owner``: as
    :func:`count_items` takes them; ``entry`` ``(curves, n)``; ``buckets``: :func:`buckets_for` the thresholds): one
    start of the threads per block instead of one per stage, and no block-sized array of counts between the stages
    (a threads' start costs milliseconds on cores shared with other work)."""
    rows, n = fresh.shape
    curves, m = entry.shape[0], thresholds.shape[1] - 1
    first = np.zeros((curves, steps, rows), dtype=np.int64)
    ap = np.full((2, curves, steps, rows), np.nan)
    items = np.arange(n)
    for r in numba.prange(rows):
        starts = np.empty(buckets + 1, dtype=np.int32)
        span = np.zeros(3, dtype=np.float32)
        bucket_row(thresholds[r, :m], starts, span)
        cells = np.zeros((versions, curves, steps + 1, m + 2), dtype=np.int32)
        count_row(cells, fresh[r], stale[r], thresholds[r], owner[r], starts, span, entry, items, versions)
        above = np.empty((curves, steps, m), dtype=np.int64)
        finish_row(cells, steps, above)
        score_row(above, placed[r], index[r], valid[r], entry, versions, first[:, :, r], ap[:, :, :, r])
    return first, ap
