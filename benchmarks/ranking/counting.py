"""The ranks of each query's positives without sorting rows (:mod:`benchmarks.ranking`, "How the ranks are found"):
the similarities, the gallery grouped by label, the positives' own products, and the items counted above each
positive, by the compiled CPU kernel (:mod:`benchmarks.ranking.cpu`) or in tensor operations elsewhere."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

import numba
import numpy as np
import torch
import torch.nn.functional as F

from . import cpu as ranking_cpu


def similarities(queries: torch.Tensor, gallery: torch.Tensor, out: np.ndarray | None = None) -> torch.Tensor:
    """``queries @ gallery.T``; on CPU numpy's float32 product (module docstring), written into ``out`` when given
    (float32, ``(rows, n)`` or more rows: its first rows are used), elsewhere torch's. A buffer reused from block to
    block spares the product a fresh allocation of every block, whose pages the system would map and zero first (a
    quarter of the product's time at 335 x 50,000 x 512 on 2 cores); the figures are the same to the bit."""
    if queries.device.type != "cpu" or queries.dtype != torch.float32 or gallery.dtype != torch.float32:
        return queries @ gallery.t()
    target = None if out is None else out[:len(queries)]
    return torch.from_numpy(np.matmul(queries.detach().numpy(), gallery.detach().numpy().T, out=target))


class LabelIndex:
    """The gallery's items grouped by label, so a block of queries finds its positives without comparing every
    label: :meth:`positives` gathers each query's label's items."""

    def __init__(self, gallery_labels: torch.Tensor) -> None:
        self.order = torch.argsort(gallery_labels, stable=True)
        self.labels, self.counts = torch.unique_consecutive(gallery_labels[self.order], return_counts=True)
        self.starts = self.counts.cumsum(0) - self.counts
        self.largest = int(self.counts.max()) if len(self.counts) else 0

    def positives(self, query_labels: torch.Tensor, own: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(index, valid)``, both ``(rows, P)``: the gallery items of each query's label, ``valid`` False for
        padding and for the query's ``own`` item when given."""
        if not len(self.labels):
            empty = torch.zeros(len(query_labels), 0, dtype=torch.long, device=query_labels.device)
            return empty, empty.bool()
        at = torch.searchsorted(self.labels, query_labels).clamp(max=len(self.labels) - 1)
        counts = torch.where(self.labels[at] == query_labels, self.counts[at], 0)
        width = int(counts.max()) if len(counts) else 0
        slot = torch.arange(width, device=query_labels.device)
        valid = slot < counts[:, None]
        index = self.order[(self.starts[at][:, None] + slot).clamp(max=len(self.order) - 1)]
        if own is not None:
            valid &= index != own[:, None]
        return index, valid


@dataclass(frozen=True)
class PositivePairs:
    """A block's positives as ``(row, slot, item)`` triples, ``index[row, slot] == item`` where ``valid``, in gallery
    order, so each chunk of a streamed gallery finds its own positives by two binary searches (:meth:`within`)."""

    row: torch.Tensor
    slot: torch.Tensor
    item: torch.Tensor

    @classmethod
    def of(cls, index: torch.Tensor, valid: torch.Tensor) -> PositivePairs:
        row, slot = valid.nonzero(as_tuple=True)
        item, by_item = index[row, slot].sort()
        return cls(row[by_item], slot[by_item], item)

    def within(self, start: int, stop: int) -> slice:
        """The pairs whose gallery item is in ``start`` ... ``stop - 1``."""
        first, last = torch.searchsorted(self.item, torch.tensor([start, stop], device=self.item.device)).tolist()
        return slice(first, last)


PAIRS_AT_ONCE = 1 << 16
"""Pairs whose dot products one tensor operation takes, off the CPU (:func:`pair_similarities`)."""


def pair_similarities(queries: torch.Tensor, rows: torch.Tensor, query_of: torch.Tensor, row_of: torch.Tensor, *,
                      compiled: bool | None = None) -> torch.Tensor:
    """``queries[query_of[k]] · rows[row_of[k]]`` for every k: ``compiled`` (by default on CPU), the compiled loop of
    :func:`benchmarks.ranking.cpu.pair_dots`; else in slices of :data:`PAIRS_AT_ONCE` pairs (the tests run those
    on CPU)."""
    if queries.device.type == "cpu" if compiled is None else compiled:
        numba_threads_as_torch()
        return torch.from_numpy(ranking_cpu.pair_dots(queries.contiguous().numpy(), rows.contiguous().numpy(),
                                                      query_of.numpy(), row_of.numpy()))
    return torch.cat([(queries[query_of[k:k + PAIRS_AT_ONCE]] * rows[row_of[k:k + PAIRS_AT_ONCE]]).sum(dim=1)
                      for k in range(0, len(query_of), PAIRS_AT_ONCE)] or [queries.new_zeros(0)])


def fill_positives(similarity: torch.Tensor, block: torch.Tensor, rows: torch.Tensor, start: int,
                   pairs: PositivePairs) -> None:
    """Write into ``similarity`` (``(rows, P)``, :class:`PositivePairs` slots) the ``block``'s similarities to the
    positives inside the normalised gallery chunk ``rows`` that starts at item ``start``: only those pairs' dot
    products (:func:`pair_similarities`), not the chunk's whole product."""
    inside = pairs.within(start, start + len(rows))
    similarity[pairs.row[inside], pairs.slot[inside]] = pair_similarities(block, rows, pairs.row[inside],
                                                                          pairs.item[inside] - start)


def positive_scores(similarity: list[torch.Tensor], index: torch.Tensor, valid: torch.Tensor, n: int,
                    fresh_from: torch.Tensor, steps: int,
                    count_above: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], finished: slice = slice(None)
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each query's first rank ``(curves, steps, rows)`` (0 without a positive) and its AP and AP@R stacked ``(2,
    curves, steps, rows)`` (NaN without a positive), for the rows ``finished``, at every step of every curve: the
    ranks of :func:`positive_ranks` summarised by :func:`summarise_ranks`. On CPU (:func:`compiled_counting`) one
    compiled pass, :func:`benchmarks.ranking.cpu.rank_scores`, reads each positive's rank from the items above it
    and sums the precisions, without the ranks' tensor (``(curves, steps, rows, P)``, sorted along P) that the
    tensor operations build; its AP sums its terms in rank order, so an AP may differ from theirs in the last bit
    (``tests/benchmarks/test_ranking.py``)."""
    if not compiled_counting(index.device) or index.shape[1] == 0:
        return summarise_ranks(*positive_ranks(similarity, index, valid, n, fresh_from, steps, count_above,
                                               finished))
    thresholds, placed, owner = sorted_thresholds(similarity, index, valid)
    above = count_above(thresholds, owner)
    first, ap = ranking_cpu.rank_scores(above.numpy(), placed[finished].numpy(), index[finished].numpy(),
                                        valid[finished].numpy(), fresh_from.numpy(), len(similarity))
    return torch.from_numpy(first), torch.from_numpy(ap)


def block_scores(scores: list[torch.Tensor], similarity: list[torch.Tensor], index: torch.Tensor, valid: torch.Tensor,
                 n: int, fresh_from: torch.Tensor, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`positive_scores` of a block of queries whose similarities to the whole gallery are ``scores`` (per
    version, ``(rows, n)``: a block of a ranking in memory). On CPU each row is counted and scored in one compiled
    pass, :func:`benchmarks.ranking.cpu.rank_rows` (the same counts as :func:`items_above`, the same scores as
    :func:`positive_scores`); elsewhere :func:`positive_scores` counts with :func:`items_above`."""
    if not compiled_counting(index.device) or index.shape[1] == 0:
        return positive_scores(similarity, index, valid, n, fresh_from, steps,
                               partial(items_above, scores, fresh_from=fresh_from, steps=steps))
    thresholds, placed, owner = sorted_thresholds(similarity, index, valid)
    padded = F.pad(thresholds.float(), (0, 1), value=float("inf"))
    first, ap = ranking_cpu.rank_rows(scores[0].numpy(), scores[-1].numpy(), padded.numpy(), owner.numpy(),
                                      placed.numpy(), index.numpy(), valid.numpy(),
                                      fresh_from.clamp(max=steps).int().numpy(), steps,
                                      ranking_cpu.buckets_for(thresholds.shape[1]), len(scores))
    return torch.from_numpy(first), torch.from_numpy(ap)


def sorted_thresholds(similarity: list[torch.Tensor], index: torch.Tensor, valid: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(thresholds, placed, owner)``, each ``(rows, V * P)``: every row's positives' similarities of its ``V``
    versions (``similarity``; +inf for padding) in ascending order, where each came from (``version * P + slot``)
    and its positive's gallery index. Equal thresholds may come in any order (the counts break their ties by the
    positives' gallery indices): on CPU numpy's sort orders them, 3 to 4 times as fast as torch's on rows of a few
    hundred (its vectorised quicksort), elsewhere torch's."""
    width = index.shape[1]
    own = torch.cat([torch.where(valid, version, float("inf")) for version in similarity], dim=1)
    if own.device.type == "cpu":
        placed = torch.from_numpy(np.argsort(own.numpy(), axis=1))
        thresholds = own.gather(1, placed)
    else:
        thresholds, placed = own.sort(dim=1)
    return thresholds, placed, index.gather(1, placed % width)


def positive_ranks(similarity: list[torch.Tensor], index: torch.Tensor, valid: torch.Tensor, n: int,
                   fresh_from: torch.Tensor, steps: int,
                   count_above: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], finished: slice = slice(None)
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The ascending 1-based ranks of the positives of the rows ``finished`` (gallery items ``index`` where ``valid``,
    of ``n``), ``(curves, steps, rows, P)`` (padding past each row's count), and their counts ``(rows,)``.
    ``similarity`` holds each row's similarity to its positives in the fresh version and, for a backfilling curve,
    the stale one; item j is fresh at the steps t >= ``fresh_from[c, j]`` (module docstring).
    ``count_above(thresholds, owner)`` counts the gallery items before each positive of the rows ``finished``
    (:func:`items_above`), from the thresholds of every row (a process that shares the gallery counts its share for
    every row, and finishes its own rows: :func:`streamed`)."""
    device = index.device
    curves = len(fresh_from)
    width = index.shape[1]
    if width == 0:
        counts = valid[finished].sum(dim=1)
        return torch.zeros(curves, steps, len(counts), 0, dtype=torch.long, device=device), counts
    rows = len(index)
    thresholds, placed, owner = sorted_thresholds(similarity, index, valid)
    position = torch.empty_like(placed).scatter_(1, placed, torch.arange(placed.shape[1], device=device)
                                                 .expand(rows, -1).contiguous())
    above = count_above(thresholds, owner)
    index, valid, position = index[finished], valid[finished], position[finished]
    rows, counts = len(index), valid.sum(dim=1)
    is_fresh = fresh_from[:, index][:, :, None, :] <= torch.arange(steps, device=device)[None, None, :, None]
    ranks = above.gather(3, position[:, :width][None, :, None, :].expand(curves, rows, steps, width))
    if len(similarity) > 1:
        stale_ranks = above.gather(3, position[:, width:][None, :, None, :].expand(curves, rows, steps, width))
        ranks = torch.where(is_fresh, ranks, stale_ranks)
    ranks = torch.where(valid[None, :, None, :], ranks + 1, n + 1).sort(dim=-1).values
    return ranks.permute(0, 2, 1, 3).contiguous(), counts


def summarise_ranks(ranks: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each query's first rank (0 without a positive), and its AP and AP@R stacked (NaN without a positive), from its
    positives' ``ranks`` (``(curves, steps, rows, P)``, ascending, padding past ``counts``)."""
    valid = torch.arange(ranks.shape[-1], device=ranks.device) < counts[:, None]
    first = torch.where(counts > 0, ranks[..., 0] if ranks.shape[-1] else torch.zeros_like(counts), 0)
    order = torch.arange(1, ranks.shape[-1] + 1, device=ranks.device, dtype=torch.float64)
    precision = torch.where(valid, order / ranks.double(), 0.0)
    within_r = torch.where(ranks <= counts[:, None], precision, 0.0)
    ap = torch.stack([precision.sum(dim=-1), within_r.sum(dim=-1)]) / counts.double()
    ap = torch.where(counts > 0, ap, float("nan"))
    return first.cpu(), ap.cpu()


def items_above(scores: list[torch.Tensor], thresholds: torch.Tensor, owner: torch.Tensor, fresh_from: torch.Tensor,
                steps: int) -> torch.Tensor:
    """``(curves, rows, steps, m)``: how many gallery items come before the positive whose similarity is
    ``thresholds[row, i]`` (ascending; ``owner[row, i]`` is that positive's gallery index), at each step of each
    curve: the items with a larger similarity, and those with an equal one (few: duplicates and float coincidences)
    and a lower gallery index, the stable sort's tie-break (module docstring). On CPU the compiled kernel of
    :mod:`benchmarks.ranking.cpu` counts them, elsewhere :func:`items_above_vectorised`; both give the same counts."""
    if not compiled_counting(thresholds.device):
        return items_above_vectorised(scores, thresholds, owner, fresh_from, steps)
    counter = ItemCounter(thresholds, owner, len(scores), fresh_from, steps)
    counter.add(scores, np.arange(scores[0].shape[1])[None])
    return counter.items_above()


def compiled_counting(device: torch.device) -> bool:
    """Whether items are counted by the compiled CPU kernel (on CPU) rather than by :func:`items_above_vectorised`
    (elsewhere); the tests run the vectorised path on CPU by replacing this."""
    return device.type == "cpu"


def numba_threads_as_torch() -> None:
    """The compiled kernels (:mod:`benchmarks.ranking.cpu`) on as many threads as torch uses (``OMP_NUM_THREADS``,
    which torchrun sets to 1 per process). Starting numba's OpenMP layer sets the process's OpenMP thread count to
    numba's own (every core), so torch's is set back to what it was."""
    threads = torch.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    torch.set_num_threads(threads)


@contextlib.contextmanager
def bookkeeping_on_one_thread(device: torch.device) -> Iterator[None]:
    """On CPU, the compiled kernels on as many threads as torch uses (:func:`numba_threads_as_torch`; numpy's
    product has its own), and torch's own operations on one thread until the block is left, then on as many as
    before. In a ranking in memory torch only keeps the books of each block of queries (its positives, their
    similarities and thresholds: tensors of a few hundred thousand entries), where a second thread costs more in
    synchronisation than it saves: on 2 cores shared with other work, a block's positives took 10 times as long on
    2 threads as on 1 (docs/adapters.md, "Cost of a study")."""
    if device.type != "cpu":
        yield
        return
    numba_threads_as_torch()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class ItemCounter:
    """The CPU kernel's counts for one block of queries (:mod:`benchmarks.ranking.cpu`): the thresholds' bucket
    table made once, blocks of gallery items added (:meth:`add`), and the items above each positive read at the end
    (:meth:`items_above`), on the threads numba was given (:func:`numba_threads_as_torch`, by the ranking that counts:
    :func:`bookkeeping_on_one_thread` in memory)."""

    def __init__(self, thresholds: torch.Tensor, owner: torch.Tensor, versions: int, fresh_from: torch.Tensor,
                 steps: int) -> None:
        m = thresholds.shape[1]
        self.thresholds = F.pad(thresholds.float(), (0, 1), value=float("inf")).numpy()
        self.owner = owner.contiguous().numpy()
        self.starts, self.span = ranking_cpu.bucket_table(self.thresholds[:, :m], ranking_cpu.buckets_for(m))
        self.entry, self.steps = fresh_from.clamp(max=steps).int().numpy(), steps
        self.count = np.zeros((len(self.thresholds), versions, len(self.entry), steps + 1, m + 2), dtype=np.int32)

    def add(self, scores: list[torch.Tensor], index: np.ndarray) -> None:
        """Count the gallery items whose similarities (fresh, then stale) are ``scores`` ``(rows, n)``: the items
        ``index`` ``(1, n)`` for every row (a chunk of the gallery), or ``(rows, n)`` each row its own."""
        ranking_cpu.count_items(self.count, scores[0].contiguous().numpy(), scores[-1].contiguous().numpy(),
                                self.thresholds, self.owner, self.starts, self.span,
                                np.ascontiguousarray(self.entry[:, index].transpose(1, 0, 2)),
                                np.ascontiguousarray(index, dtype=np.int64), len(scores))

    def items_above(self, rows: slice = slice(None)) -> torch.Tensor:
        """The items above each threshold of the block's ``rows`` (:func:`benchmarks.ranking.cpu.finish`)."""
        return torch.from_numpy(ranking_cpu.finish(self.count[rows], self.steps))


def items_above_vectorised(scores: list[torch.Tensor], thresholds: torch.Tensor, owner: torch.Tensor,
                           fresh_from: torch.Tensor, steps: int) -> torch.Tensor:
    """:func:`items_above` in tensor operations, for any device: items are placed among the thresholds by binary
    search, a histogram per curve, summed over the steps at which items turn fresh, counts those with a larger
    similarity, and :func:`add_ties` adds the equal ones."""
    rows, n = scores[0].shape
    device = thresholds.device
    curves, m = len(fresh_from), thresholds.shape[1]
    entry = fresh_from.clamp(max=steps)
    small = rows * (steps + 1) * (m + 1) < 2 ** 31
    kind = torch.int32 if small else torch.long
    row_cells = torch.arange(rows, device=device, dtype=kind)[:, None] * ((steps + 1) * (m + 1))
    step_cells = [None if not entry[c].any() else (entry[c] * (m + 1)).to(kind)[None, :] for c in range(curves)]
    above = torch.zeros(curves, rows, steps, m, dtype=torch.long, device=device)
    ties = torch.zeros(curves, rows, steps + 1, m, dtype=torch.long, device=device)
    for version, block in enumerate(scores):
        bucket = torch.searchsorted(thresholds, block, out_int32=small)
        add_ties(ties, block, bucket, thresholds, owner, entry, version)
        bucket += row_cells
        for c in range(curves):
            cells = bucket if step_cells[c] is None else bucket + step_cells[c]
            histogram = torch.bincount(cells.flatten(), minlength=rows * (steps + 1) * (m + 1))
            beyond = histogram.view(rows, steps + 1, m + 1).flip(-1).cumsum(-1).flip(-1)[..., 1:].cumsum(dim=1)
            above[c] += beyond[:, :steps] if version == 0 else beyond[:, steps:] - beyond[:, :steps]
    return above + ties.cumsum(dim=2)[:, :, :steps]


def add_ties(ties: torch.Tensor, block: torch.Tensor, bucket: torch.Tensor, thresholds: torch.Tensor,
             owner: torch.Tensor, entry: torch.Tensor, version: int) -> None:
    """Count into ``ties`` (per step, as differences along the step axis) each item of ``block`` (version 0: fresh,
    1: stale) whose similarity equals a positive's threshold and whose gallery index is lower than that positive's:
    it comes first in the stable sort while it has this version (:func:`items_above`). An item's equal thresholds
    start at its ``bucket``; the few items that match one are followed along the run of equal thresholds."""
    m = thresholds.shape[1]
    start = bucket.clamp(max=m - 1).long()
    row, item = (thresholds.gather(1, start) == block).nonzero(as_tuple=True)
    position = start[row, item]
    value = block[row, item]
    while len(row):
        first = item < owner[row, position]
        for c in range(len(entry)):
            turns = entry[c, item[first]]
            at = (row[first], turns, position[first])
            ones = torch.ones_like(turns)
            if version == 0:
                ties[c].index_put_(at, ones, accumulate=True)
            else:
                ties[c].index_put_((at[0], torch.zeros_like(turns), at[2]), ones, accumulate=True)
                ties[c].index_put_(at, -ones, accumulate=True)
        position = position + 1
        inside = position < m
        row, item, position, value = row[inside], item[inside], position[inside], value[inside]
        same = thresholds[row, position] == value
        row, item, position, value = row[same], item[same], position[same], value[same]
