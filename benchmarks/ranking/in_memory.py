"""The in-memory ranking: the queries in blocks against a gallery held as one tensor, and the progress bar every
ranking shows (:mod:`benchmarks.ranking`)."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from . import counting
from .counting import LabelIndex, block_scores
from .scores import RetrievalScores, as_scores

CHUNK_ELEMENTS = 1 << 24
"""The most query x gallery similarities of one block of an in-memory ranking off the CPU, by default (float32:
64 MB; the vectorised counting's temporaries are several times as large)."""
CPU_CHUNK_ELEMENTS = 1 << 25
"""The same on CPU (float32: 128 MB per gallery version): numpy's product packs the whole gallery again for every
block, so blocks of twice the rows took 14 % less time per ranking at 50,000 x 512 (docs/adapters.md, "Cost of a
study"); each row's counts are the compiled pass's own, not the block's."""


def ranked(queries: torch.Tensor, query_labels: torch.Tensor, fresh: torch.Tensor, stale: torch.Tensor | None,
           gallery_labels: torch.Tensor, fresh_from: torch.Tensor, steps: int, own_index: torch.Tensor | None,
           unmatched_queries: str, chunk_elements: int | None,
           progress: str | None = None) -> list[list[RetrievalScores]]:
    """``[curve][step]`` scores, the queries taken in blocks, query i's own gallery item ``own_index[i]`` left out
    (module docstring); ``progress`` labels a bar over the pairs compared (:func:`progress_bar`). On CPU torch keeps
    the books on one thread (:func:`benchmarks.ranking.counting.bookkeeping_on_one_thread`)."""
    with counting.bookkeeping_on_one_thread(fresh.device):
        return ranked_blocks(queries, query_labels, fresh, stale, gallery_labels, fresh_from, steps, own_index,
                             unmatched_queries, chunk_elements, progress)


def ranked_blocks(queries: torch.Tensor, query_labels: torch.Tensor, fresh: torch.Tensor, stale: torch.Tensor | None,
                  gallery_labels: torch.Tensor, fresh_from: torch.Tensor, steps: int, own_index: torch.Tensor | None,
                  unmatched_queries: str, chunk_elements: int | None,
                  progress: str | None) -> list[list[RetrievalScores]]:
    """:func:`ranked`'s work: each block's similarities (into one buffer per version, reused from block to block on
    CPU: :func:`benchmarks.ranking.counting.similarities`), its own items left out, its positives found and its
    scores counted (:func:`benchmarks.ranking.counting.block_scores`)."""
    device = fresh.device
    q = F.normalize(queries.float(), dim=1)
    versions = [F.normalize(v.float(), dim=1) for v in (fresh, stale) if v is not None]
    query_labels, gallery_labels = query_labels.to(device), gallery_labels.to(device)
    fresh_from = fresh_from.to(device)
    n, curves = len(fresh), len(fresh_from)
    by_label = LabelIndex(gallery_labels)
    thresholds = len(versions) * by_label.largest + 1
    chunk_elements = chunk_elements or (CPU_CHUNK_ELEMENTS if device.type == "cpu" else CHUNK_ELEMENTS)
    rows = max(1, min(chunk_elements // max(n, 1), chunk_elements // (curves * (steps + 1) * thresholds)))
    first = torch.zeros(curves, steps, len(q), dtype=torch.long)
    ap = torch.full((2, curves, steps, len(q)), float("nan"), dtype=torch.float64)
    bar = progress_bar(progress, len(q) * n)
    buffers = [np.empty((min(rows, len(q)), n), dtype=np.float32) if device.type == "cpu" else None
               for _ in versions]
    for start in range(0, len(q), rows):
        stop = min(start + rows, len(q))
        scores = [counting.similarities(q[start:stop], v, out) for v, out in zip(versions, buffers, strict=True)]
        own = None if own_index is None else own_index[start:stop]
        if own is not None:
            for block in scores:
                block[torch.arange(stop - start, device=device), own] = float("-inf")
        index, valid = by_label.positives(query_labels[start:stop], own)
        similarity = [block.gather(1, index) for block in scores]
        first[:, :, start:stop], ap[:, :, :, start:stop] = block_scores(scores, similarity, index, valid, n,
                                                                        fresh_from, steps)
        bar.update((stop - start) * n)
    bar.close()
    return as_scores(first, ap, unmatched_queries)


def progress_bar(label: str | None, pairs: int) -> tqdm:
    """A bar over the ``pairs`` (query, gallery item) a ranking compares, labelled ``label``, shown on a terminal
    only (tqdm's ``disable=None``: a log file or a parsed stream gets no bar), and not at all without a label: what a
    study of a gallery of millions shows while it ranks for minutes (``runner.py adapt``)."""
    return tqdm(total=pairs, desc=label, unit="pair", unit_scale=True, leave=False,
                disable=True if label is None else None)
