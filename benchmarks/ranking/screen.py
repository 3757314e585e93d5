"""The screened ranking of a streamed gallery on CPU (:mod:`benchmarks.ranking`, "Screened"): a bfloat16 pass whose
proven error bound keeps the items that can rank within the first places, then their float32 similarities."""
from __future__ import annotations

from collections.abc import Callable
from functools import cache

import numpy as np
import torch
import torch.nn.functional as F

from cl2r_bench.distributed import Processes

from ..gallery_rows import GalleryRows
from . import cpu as ranking_cpu
from .counting import ItemCounter, LabelIndex, PositivePairs, fill_positives, numba_threads_as_torch
from .scores import CMC_DEPTH

SCREEN_ROOM, SCREEN_SLACK = 4, 8192
"""A screened row's room for candidates, ``SCREEN_ROOM * depth + SCREEN_SLACK``: the screen drops those below its
rising cut when the room is full, and screens the block again with four times the room in the rare case that
even then it is (many items tied near the cut)."""


SCREEN_ENTRIES = 1 << 26
"""The most candidates (8 bytes each: 512 MiB) a screened ranking holds for one block of queries."""


BFLOAT16_ROUNDING, FLOAT32_ROUNDING = 2.0 ** -8, 2.0 ** -24
"""The unit roundoffs of bfloat16 and float32 (half the distance from 1 to the next number)."""


def screen_depth(by_label: LabelIndex, device: torch.device) -> int:
    """The places a screened ranking ranks exactly: enough for CMC to :data:`CMC_DEPTH` and for mAP@R (R is at most
    the largest class); a :class:`ValueError` where the screen cannot run (:func:`screen_problem`)."""
    problem = screen_problem(device)
    if problem:
        raise ValueError(problem)
    return max(CMC_DEPTH, by_label.largest)


def screen_problem(device: torch.device) -> str | None:
    """Why the screen cannot run on ``device`` (one line), None where it can: on CPU, with a bfloat16 product that
    adds in float32 (:func:`screen_error`'s bound needs it)."""
    if device.type != "cpu":
        return f"the screened ranking runs on CPU, not {device.type}: rank without model_update.screen there"
    if not bfloat16_adds_in_float32():
        return ("this machine's bfloat16 matrix product does not add in float32, which the screen's error bound "
                "needs: rank without model_update.screen")
    return None


@cache
def bfloat16_adds_in_float32() -> bool:
    """Whether torch's bfloat16 matrix product on CPU sums in float32: 1 and 1,279 products of 2^-8 sum to 5.996
    (6 in bfloat16) so, to 1 in bfloat16, where each 2^-8 is half a unit of 1 and rounds away."""
    queries = torch.zeros(64, 1280, dtype=torch.bfloat16)
    queries[0] = 2.0 ** -8
    queries[0, 0] = 1
    return float((queries @ torch.ones(1280, 4096, dtype=torch.bfloat16))[0, 0]) == 6.0


def screen_error(width: int) -> tuple[float, float]:
    """``(error, relative)``: the bfloat16 product a of two L2-normalised float32 rows ``width`` wide is within
    ``error + relative * |a|`` of their float32 similarity s (:func:`pair_similarities`). With u and v the unit
    roundoffs of bfloat16 and float32 and γ = width·v / (1 - width·v) (Higham, *Accuracy and Stability of Numerical
    Algorithms*, §3.1): rounding both rows to bfloat16 moves the exact product by at most (2u + u²)·Σ|q_i g_i|, the
    float32 sum of the bfloat16 products adds γ·(1 + u)²·Σ|q_i g_i|, and s itself is within γ·Σ|q_i g_i| of the
    exact product; Σ|q_i g_i| <= ‖q‖·‖g‖, at most 1 + 10^-4 for rows normalised in float32. Rounding the float32
    sum x to the bfloat16 output a moves it by at most 2u·|x| <= 2u/(1 - 2u)·|a| (2u: any rounding direction). The
    2^-20 added covers float32's rounding of the bounds themselves and inputs flushed to zero."""
    u, v = BFLOAT16_ROUNDING, FLOAT32_ROUNDING
    gamma = width * v / (1 - width * v)
    error = (2 * u + u * u + gamma * (1 + u) ** 2 + gamma) * (1 + 1e-4) + 2.0 ** -20
    return error, 2 * u / (1 - 2 * u)


def screened_similarity(block: torch.Tensor, versions: list[GalleryRows], index: torch.Tensor, valid: torch.Tensor,
                        pairs: PositivePairs, candidates: torch.Tensor
                        ) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """``(similarity, scores, items)``: per version, the float32 similarities of the block's positives (``(rows,
    P)`` as :func:`positive_similarity` gives them, added up over the processes), and the similarities ``scores``
    of the items a screened ranking counts, ``items`` ``(rows, P + W)``: the positives in this process's share and
    its ``candidates`` (-1 for none, -inf their score). One pass over the share per version takes both."""
    share = versions[0].share()
    counted = valid & (index >= share.start) & (index < share.stop)
    queries, listed = block.numpy(), candidates.numpy()
    similarity, scores = [], []
    for version in versions:
        positives = torch.zeros(valid.shape)
        found = np.full(listed.shape, -np.inf, dtype=np.float32)
        cursor = np.zeros(len(listed), dtype=np.int64)
        for start, rows_read in version.chunks():
            rows = F.normalize(rows_read, dim=1)
            fill_positives(positives, block, rows, start, pairs)
            ranking_cpu.candidate_dots(queries, rows.numpy(), start, listed, cursor, found)
        similarity.append(version.processes.total(positives))
        scores.append(torch.cat([torch.where(counted, similarity[-1], float("-inf")), torch.from_numpy(found)], dim=1))
    return similarity, scores, torch.cat([index, candidates.clamp(min=0)], dim=1)


def screened_items_above(thresholds: torch.Tensor, owner: torch.Tensor, *, scores: list[torch.Tensor],
                         items: torch.Tensor, fresh_from: torch.Tensor, steps: int, processes: Processes,
                         finished: slice) -> torch.Tensor:
    """:func:`chunked_items_above` of a screened ranking (module docstring): only the block's positives and
    candidates are counted, the gallery ``items`` ``(rows, W)`` whose float32 similarities are ``scores`` (per
    version; -inf for none, and for another process's positives: :func:`screened_similarity`). Every other item
    lies below the screen's depth at every step (:func:`screen_candidates`), so the counts are exact for every
    positive within that many places and more than that for any other. Processes that share the gallery add
    their counts up."""
    numba_threads_as_torch()
    counter = ItemCounter(thresholds, owner, len(scores), fresh_from, steps)
    counter.add(scores, items.numpy())
    processes.total(torch.from_numpy(counter.count))
    return counter.items_above(finished)


def screen_candidates(block: torch.Tensor, versions: list[GalleryRows], own: torch.Tensor | None,
                      query_labels: torch.Tensor, gallery_labels: torch.Tensor, depth: int, room: int, items: int,
                      advance: Callable[[int], object]) -> torch.Tensor:
    """``(rows, W)``: the gallery items (-1 for none) of this process's share that may come within the first
    ``depth`` places of a row's ranking at some step, its own item and its positives left out: one pass over the
    share, ``items`` rows at a time, each compared with the block in bfloat16 (:func:`screen_error`) and screened by
    :func:`benchmarks.ranking.cpu.screen`, whose last cut then drops the candidates below it."""
    rows = len(block)
    low = block.bfloat16()
    own_items = np.full(rows, -1) if own is None else own.numpy()
    labels, query = gallery_labels.numpy(), query_labels.numpy()
    error, relative = screen_error(block.shape[1])
    while True:
        heap = np.full((rows, depth), -np.inf, dtype=np.float32)
        listed, best = np.empty((rows, room), dtype=np.int32), np.empty((rows, room), dtype=np.float32)
        counts = np.zeros(rows, dtype=np.int64)
        for chunk in zip(*(version.chunks(items) for version in versions), strict=True):
            start, width = chunk[0][0], len(chunk[0][1])
            approx = torch.empty(len(versions), rows, width, dtype=torch.bfloat16)
            for product, (_, rows_read) in zip(approx, chunk, strict=True):
                torch.mm(low, F.normalize(rows_read, dim=1).bfloat16().t(), out=product)
            full = ranking_cpu.screen(approx.view(torch.int16).numpy().view(np.uint16), start, own_items,
                                      labels[start:start + width], query, heap, listed, best, counts, error, relative)
            if full:
                break
            advance(rows * width)
        else:
            break
        room *= 4
    ranking_cpu.keep_candidates(listed, best, counts, heap)
    width = int(counts.max(initial=0))
    return torch.from_numpy(np.where(np.arange(width) < counts[:, None], listed[:, :width], -1).astype(np.int64))
