"""A ranking whose gallery is read in chunks, never whole (:class:`~benchmarks.gallery_rows.GalleryRows`;
docs/scale-out.md, "Galleries of millions"), optionally screened (:mod:`benchmarks.ranking.screen`)."""
from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F

from ..gallery_rows import GalleryRows
from . import counting
from . import screen as screening
from .counting import (
    ItemCounter,
    LabelIndex,
    PositivePairs,
    fill_positives,
    items_above,
    positive_scores,
)
from .in_memory import progress_bar
from .scores import RetrievalScores, as_scores

STREAMED_ELEMENTS = 1 << 26
"""The most query x gallery similarities of one chunk of a streamed ranking, by default (float32: 256 MB per
gallery version): every block of queries reads the whole gallery once, so its blocks are large. A gallery with
fewer than 8 times as many elements takes an eighth of its own (:func:`streamed_elements`)."""


STREAMED_MIN_ELEMENTS = 1 << 20
"""The fewest similarities of one chunk of a streamed ranking, however small the gallery."""


STREAMED_ITEMS = 4096
"""The fewest gallery items a chunk of a streamed ranking compares with a block of queries (within the gallery's
size): a narrower matrix product runs well below the CPU's rate."""


STREAMED_COUNTS = 1 << 28
"""The most per-query counts (int32: 1 GiB) a streamed ranking keeps for one block of queries: every block reads
and compares the whole gallery once, so its blocks are as large as this allows (:func:`streamed`)."""


def streamed(queries: torch.Tensor, query_labels: torch.Tensor, fresh: GalleryRows, stale: GalleryRows | None,
             gallery_labels: torch.Tensor, fresh_from: torch.Tensor, steps: int, own_index: torch.Tensor | None,
             unmatched_queries: str, chunk_elements: int | None, progress: str | None = None,
             screen: bool = False) -> list[list[RetrievalScores]]:
    """:func:`ranked` with the gallery read in chunks, never whole (docs/scale-out.md, "Galleries of millions").
    Each block of queries (as many as :data:`STREAMED_COUNTS` counts allow, and a product with
    :data:`STREAMED_ITEMS` gallery rows within ``chunk_elements``) reads the gallery in chunks of
    ``chunk_elements`` similarities.

    Per block of queries, each positive's similarity is computed first, in a pass over the gallery in order that
    takes only the positives' dot products (:func:`positive_similarity`); then every chunk of the gallery is
    compared with the block and its items are counted above the positives they exceed (:func:`items_above`, whose
    counts add up over chunks). In each chunk the positives' own entries are set to the similarities their
    thresholds were made of, so a positive is placed against itself exactly whatever rounding the matrix product
    had. Processes that share the gallery (:mod:`benchmarks.gallery_rows`) count their share of it for every row of
    the block, add the counts up, and each finishes its share of the block's rows (ranks, first ranks, APs), which
    they then gather. The progress bar (``progress``) is the first process's, over the pairs of its share.

    With ``screen`` (module docstring, "Screened"), the chunks are screened for the items that can rank within the
    first :func:`screen_depth` places (:func:`screened_items_above`), and each block holds at most
    :data:`SCREEN_ENTRIES` candidates."""
    device = fresh.device
    q = F.normalize(queries.float(), dim=1).to(device)
    versions = [v for v in (fresh, stale) if v is not None]
    query_labels, gallery_labels = query_labels.to(device), gallery_labels.to(device)
    fresh_from = fresh_from.to(device)
    n, curves = len(fresh), len(fresh_from)
    by_label = LabelIndex(gallery_labels)
    thresholds = len(versions) * by_label.largest + 1
    chunk_elements = chunk_elements or streamed_elements(fresh)
    depth = screening.screen_depth(by_label, device) if screen else None
    room = screening.SCREEN_ROOM * depth + screening.SCREEN_SLACK if screen else None
    rows = max(1, min(len(q), STREAMED_COUNTS // (len(versions) * curves * (steps + 1) * (thresholds + 1)),
                      chunk_elements // min(n, STREAMED_ITEMS), screening.SCREEN_ENTRIES // room if screen else len(q)))
    items = max(1, chunk_elements // rows)
    first = torch.zeros(curves, steps, len(q), dtype=torch.long)
    ap = torch.full((2, curves, steps, len(q)), float("nan"), dtype=torch.float64)
    processes = fresh.processes
    share = fresh.share()
    bar = progress_bar(progress if processes.is_main else None, len(q) * (share.stop - share.start))
    for start in range(0, len(q), rows):
        stop = min(start + rows, len(q))
        block, own = q[start:stop], None if own_index is None else own_index[start:stop]
        index, valid = by_label.positives(query_labels[start:stop], own)
        finished = processes.share(stop - start)
        pairs = PositivePairs.of(index, valid)
        if screen:
            candidates = screening.screen_candidates(block, versions, own, query_labels[start:stop], gallery_labels,
                                                     depth, room, items, bar.update)
            similarity, scores, compared = screening.screened_similarity(block, versions, index, valid, pairs,
                                                                         candidates)
            count_above = partial(screening.screened_items_above, scores=scores, items=compared,
                                  fresh_from=fresh_from, steps=steps, processes=processes, finished=finished)
        else:
            similarity = [positive_similarity(block, version, pairs, valid) for version in versions]
            count_above = partial(chunked_items_above, block=block, versions=versions, items=items, own=own,
                                  pairs=pairs, similarity=similarity, fresh_from=fresh_from, steps=steps,
                                  finished=finished, advance=bar.update)
        block_first, block_ap = positive_scores(similarity, index, valid, n, fresh_from, steps, count_above, finished)
        if screen:
            block_ap[0] = float("nan")
        sizes = processes.shares(stop - start)
        first[:, :, start:stop] = processes.gather(block_first.permute(2, 0, 1).to(device), sizes).permute(1, 2, 0)
        ap[:, :, :, start:stop] = processes.gather(block_ap.permute(3, 0, 1, 2).to(device), sizes).permute(1, 2, 3, 0)
    bar.close()
    return as_scores(first, ap, unmatched_queries, depth)


def streamed_elements(gallery: GalleryRows) -> int:
    """The similarities of one chunk of a streamed ranking by default: an eighth of the gallery's own elements
    (items x width), within :data:`STREAMED_MIN_ELEMENTS` and :data:`STREAMED_ELEMENTS`, so a gallery streamed
    because it is large next to the process (``model_update.stream_rows: auto``) is ranked in a workspace small next
    to itself: 300,000 x 128 features peaked 1.07 GB with it against 2.2 GB with the fixed 2^26, in the same time."""
    items, width = gallery.shape
    return max(STREAMED_MIN_ELEMENTS, min(STREAMED_ELEMENTS, items * width // 8))


def positive_similarity(block: torch.Tensor, gallery: GalleryRows, pairs: PositivePairs,
                        valid: torch.Tensor) -> torch.Tensor:
    """``(rows, P)``: each query's similarity to the gallery items of its label in :class:`LabelIndex` order (the
    slots of :meth:`LabelIndex.positives`; zero where not ``valid``): one pass over the gallery in order, each
    chunk's positives' dot products taken alone (:func:`pair_similarities`), not the chunk's whole product. Processes
    that share the gallery each take the positives of their share and add them up (the others' entries are zeros, so
    the sum is exact)."""
    similarity = torch.zeros(valid.shape, device=block.device)
    for start, rows_read in gallery.chunks():
        fill_positives(similarity, block, F.normalize(rows_read, dim=1), start, pairs)
    return gallery.processes.total(similarity)


def chunked_items_above(thresholds: torch.Tensor, owner: torch.Tensor, *, block: torch.Tensor,
                        versions: list[GalleryRows], items: int, own: torch.Tensor | None, pairs: PositivePairs,
                        similarity: list[torch.Tensor], fresh_from: torch.Tensor, steps: int,
                        finished: slice, advance: Callable[[int], object]) -> torch.Tensor:
    """:func:`items_above` of the rows ``finished`` over the gallery's chunks of ``items`` rows (:func:`streamed`): on
    CPU the chunks' counts accumulate and are turned into items above once; elsewhere each chunk's items above are
    summed. Counts add up, so processes that share the gallery each count their share for every row and add the
    counts up. ``advance`` is told the pairs each chunk compared."""
    rows = torch.arange(len(block), device=block.device)
    on_cpu = counting.compiled_counting(block.device)
    if on_cpu:
        counting.numba_threads_as_torch()
    counter = ItemCounter(thresholds, owner, len(versions), fresh_from, steps) if on_cpu else None
    above = None if on_cpu else torch.zeros(len(fresh_from), len(block), steps, thresholds.shape[1],
                                            dtype=torch.long, device=block.device)
    for chunk in zip(*(version.chunks(items) for version in versions), strict=True):
        start, stop = chunk[0][0], chunk[0][0] + len(chunk[0][1])
        scores = [counting.similarities(block, F.normalize(rows_read, dim=1)) for _, rows_read in chunk]
        inside = pairs.within(start, stop)
        row, slot, item = pairs.row[inside], pairs.slot[inside], pairs.item[inside] - start
        for score, own_similarity in zip(scores, similarity, strict=True):
            score[row, item] = own_similarity[row, slot]
            if own is not None:
                mine = (own >= start) & (own < stop)
                score[rows[mine], own[mine] - start] = float("-inf")
        if on_cpu:
            counter.add(scores, np.arange(start, stop)[None])
        else:
            above += items_above(scores, thresholds, owner - start, fresh_from[:, start:stop], steps)
        advance(len(block) * (stop - start))
    processes = versions[0].processes
    if on_cpu:
        processes.total(torch.from_numpy(counter.count))
        return counter.items_above(finished)
    return processes.total(above)[:, finished]
