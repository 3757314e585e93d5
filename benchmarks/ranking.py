"""Retrieval scores from the ranks of each query's positives: CMC top-k at any k, and mAP over the whole ranking
(docs/METHODS.md §7b).

Queries and gallery items are compared by cosine similarity (both sides are L2-normalised here; adapted features
need not be). With ``exclude_self`` the query set and the gallery are the same items in the same order, possibly
embedded by different models (query i and gallery item i are one image), and each query's own item is left out of
its ranking: the adapter papers' protocol, where the test split is both query and gallery.

* A query's ranking is the gallery by descending cosine, ties broken by gallery index (a stable sort, the suite's
  choice). Every score reads only the 1-based ranks of the query's *positives* (the gallery items of its label).
* CMC top-k: the share of queries whose first positive is within rank k.
* mAP: for a query with P positives at ranks r_1 < ... < r_P, AP = (1/P) Σ_j j / r_j, the average precision over
  the whole ranking; averaged over the queries with at least one positive. This is scikit-learn's
  ``average_precision_score`` on the similarities when no two similarities tie.
* mAP@R, the large-gallery definition (Musgrave et al., "A Metric Learning Reality Check", 2020): the same sum
  over the positives within the first R = P ranks only, AP@R = (1/P) Σ_{j: r_j <= P} j / r_j; it reads only the
  first R items of a ranking, so a top-k search (:mod:`benchmarks.faiss_search`) gives it too.
* **Queries without a match** (no other item of their label) are counted (``queries_without_positive``) and, by
  the convention ``unmatched_queries``, either count as misses in CMC (``miss``, the suite's default) or are left
  out of it (``exclude``, the FCT authors' evaluation); the mAP always leaves them out. METHODS.md §7b says which
  papers' tables use which.

**How the ranks are found without sorting rows.** A positive's rank is one plus the number of gallery items that
come before it: the items with a larger similarity. So each row's positives' similarities are sorted (a few
hundred values), every gallery item is placed among them (on CPU by a bucket table, :mod:`benchmarks.ranking_cpu`;
elsewhere by binary search), and a histogram of those places counts, for every positive at once, the items above
it. An item whose similarity equals a positive's exactly (a duplicate image, or two float32 products that round
alike: about one row in a hundred at 10,000 items) is counted above that positive when its gallery index is lower,
so ties are broken exactly as the whole-row stable sort breaks them.
A block's positives come from the gallery grouped by label (:class:`LabelIndex`), not from comparing labels.

**Backfilling for the price of one ranking** (:func:`backfilling_scores`): along a backfilling curve the queries
stay the same and each gallery item has two versions, stale and fresh, so the similarities of both versions (two
blocks per block of queries) are placed once among the positives' similarities of both versions; the histogram of
each curve step then counts only the version each item has at that step, and one histogram per order, summed
cumulatively over the steps at which items turn fresh, serves every step.

**Screened** (``screen``; ``model_update.screen``; a streamed gallery on CPU): a gallery of millions ranked for
CMC and mAP@R needs each query's first places only, D = max(:data:`CMC_DEPTH`, the largest class) of them, and
finding them need not take every similarity in float32. Each chunk is first compared with the block in bfloat16
(the CPU's bfloat16 units: 3.5 to 7 times float32's rate here, docs/scale-out.md), and each approximation a is within
e + ρ·|a| of the float32 similarity (:func:`screen_error` proves the bound). Per query, a heap keeps the D largest
lower bounds seen so far (of each item's least version, along a backfilling curve); an item whose upper bound
stays below the D-th lower bound is below the D-th place at every step, and the others, the candidates (a few
times D), get their float32 similarities in a second pass (:func:`benchmarks.ranking_cpu.candidate_dots`). The
positives and the candidates are then counted as the full ranking counts every item, and every rank within D is
exactly the full ranking's when each similarity is rounded alike (``tests/test_screen.py``); a rank beyond D is
only known to be beyond it, so the full mAP is not given (None) and CMC stops at D
(:attr:`RetrievalScores.exact_depth`). One caveat of rounding: the candidates' similarities are summed in one order
(:func:`benchmarks.ranking_cpu.dot`), a BLAS product's in another, and two similarities closer than that rounding
(about 1e-7) can be ordered differently; mAP@R moved by 0.0001 points in the fourth decimal against faiss at
100,000 items (docs/scale-out.md).

Every score is in percent; precisions are summed in float64, so chunking changes no digit that matters. The
queries are processed in blocks of at most ``chunk_elements`` query x gallery entries (:data:`CHUNK_ELEMENTS` in
memory, :data:`STREAMED_ELEMENTS` streamed, by default; ``python -m tools.bench_ranking`` and ``python -m
tools.bench_adapt_study`` measure time and peak memory). On CPU the similarities are numpy's float32 matrix
products (its OpenBLAS ran at about 200 GFLOPS on 2 cores where torch's MKL ran at 170: docs/scale-out.md).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache, partial

import numba
import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from cl2r_bench.distributed import Processes
from cl2r_bench.settings import UNMATCHED_CONVENTIONS

from . import ranking_cpu
from .gallery_rows import GalleryRows
from .noise import bootstrap_accuracies

CMC_DEPTH = 100
"""The deepest k of the CMC curve a record keeps."""
CHUNK_ELEMENTS = 1 << 24
"""The most query x gallery similarities of one block of an in-memory ranking, by default (float32: 64 MB)."""
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


@dataclass(frozen=True)
class RetrievalScores:
    """The scores of one ranking, from each query's ``first_rank`` (1-based rank of its first positive; 0 for a
    query without one), ``ap`` and ``ap_at_r`` (float64 average precision over the whole ranking and over its first
    R ranks, NaN without a positive); ``unmatched_queries`` is the CMC convention (module docstring). Every score
    is in percent. ``exact_depth``: a screened ranking's (:func:`streamed`), which ranks exactly only its first
    ``exact_depth`` places: a first rank beyond them is a lower bound, CMC is given only to that depth, and the
    full mAP not at all (None); None for a whole ranking."""

    first_rank: np.ndarray = field(repr=False, compare=False)
    ap: np.ndarray = field(repr=False, compare=False)
    ap_at_r: np.ndarray = field(repr=False, compare=False)
    unmatched_queries: str = "miss"
    exact_depth: int | None = None

    @property
    def queries(self) -> int:
        return len(self.first_rank)

    @property
    def queries_without_positive(self) -> int:
        return int((self.first_rank == 0).sum())

    @property
    def query_top1(self) -> np.ndarray:
        """Each query's top-1 hit (bool), for paired comparisons over queries (:mod:`reporting.adapter_summary`)."""
        return self.first_rank == 1

    @property
    def counted_first_ranks(self) -> np.ndarray:
        """The first ranks CMC counts under :attr:`unmatched_queries`: every query's (0, a miss, for one without a
        positive), or only the matched queries' under ``exclude``."""
        return self.first_rank if self.unmatched_queries == "miss" else self.first_rank[self.first_rank >= 1]

    def cmc(self, k: int) -> float:
        """CMC top-``k`` in percent, under :attr:`unmatched_queries`."""
        self.check_depth(k)
        return cmc_at(self.counted_first_ranks, k)

    def cmc_curve(self, depth: int = CMC_DEPTH) -> list[float]:
        """CMC top-1 ... top-``depth`` in percent."""
        self.check_depth(depth)
        counted = self.counted_first_ranks
        matched = counted[counted >= 1]
        hits = np.cumsum(np.bincount(np.minimum(matched, depth + 1), minlength=depth + 2)[1:depth + 1])
        return (100.0 * hits / max(len(counted), 1)).tolist()

    @property
    def top1(self) -> float:
        return self.cmc(1)

    @property
    def top5(self) -> float:
        return self.cmc(5)

    @property
    def mAP(self) -> float | None:
        return None if self.exact_depth is not None else mean_precision(self.ap)

    @property
    def mAP_at_R(self) -> float:
        return mean_precision(self.ap_at_r)

    @property
    def precision_name(self) -> str:
        """The mean precision this ranking gives whole: ``mAP``, or ``mAP@R`` for a screened one."""
        return "mAP" if self.exact_depth is None else "mAP@R"

    @property
    def precision(self) -> float:
        """:attr:`mAP`, or :attr:`mAP_at_R` for a screened ranking (:attr:`precision_name`)."""
        return self.mAP if self.exact_depth is None else self.mAP_at_R

    def as_dict(self) -> dict[str, float | None]:
        return {"top1": self.top1, "top5": self.top5, "mAP": self.mAP, "mAP@R": self.mAP_at_R}

    def check_depth(self, k: int) -> None:
        """A :class:`ValueError` for a CMC deeper than a screened ranking ranks exactly."""
        if self.exact_depth is not None and k > self.exact_depth:
            raise ValueError(f"this screened ranking is exact to rank {self.exact_depth}, not {k}: rank without "
                             "screen for a deeper CMC")

    def interval(self, confidence: float, resamples: int, seed: int = 0) -> dict[str, list[float]]:
        """``{"top1": [low, high], "mAP": [low, high]}`` in percent (``mAP@R`` for a screened ranking's, which has no
        mAP): the percentile bootstrap interval over these queries, for a sample of queries standing in for all of
        them (the sampling noise; the resampling of :func:`benchmarks.noise.bootstrap_accuracies`)."""
        tail = (1 - confidence) / 2 * 100
        bounds = {}
        precision = self.ap if self.exact_depth is None else self.ap_at_r
        for name, values in (("top1", self.counted_first_ranks == 1),
                             (self.precision_name, precision[~np.isnan(precision)])):
            means = bootstrap_accuracies(values[None, :], resamples, seed)[0] * 100 if len(values) else np.zeros(1)
            bounds[name] = np.percentile(means, [tail, 100 - tail]).tolist()
        return bounds

    def of_queries(self, mask: np.ndarray) -> RetrievalScores:
        """These scores restricted to the queries of ``mask``, under the same convention."""
        return RetrievalScores(self.first_rank[mask], self.ap[mask], self.ap_at_r[mask], self.unmatched_queries,
                               self.exact_depth)

    @property
    def counted_queries(self) -> int:
        """How many queries CMC counts: all under ``miss``, the matched ones under ``exclude``."""
        return len(self.counted_first_ranks)

    def per_class_cmc(self, labels: np.ndarray, k: int = 1) -> dict[int, float | None]:
        """CMC top-``k`` of each query label's queries, in percent, under the same convention; None for a label none
        of whose queries CMC counts (every one unmatched, under ``exclude``): no figure, rather than 0.0."""
        scores = {int(c): self.of_queries(labels == c) for c in np.unique(labels)}
        return {c: part.cmc(k) if part.counted_queries else None for c, part in scores.items()}


def cmc_at(first_rank: np.ndarray, k: int) -> float:
    """CMC top-``k`` in percent of queries whose first positive has ``first_rank`` (1-based; 0, a miss, for a
    query without one)."""
    return 100.0 * int(((first_rank >= 1) & (first_rank <= k)).sum()) / max(len(first_rank), 1)


def mean_precision(ap: np.ndarray) -> float:
    """The mean in percent of the queries' average precisions, those without a positive (NaN) left out."""
    matched = ap[~np.isnan(ap)]
    return 100.0 * float(matched.sum()) / max(len(matched), 1)


def retrieval_scores(queries: torch.Tensor, query_labels: torch.Tensor, gallery: torch.Tensor | GalleryRows,
                     gallery_labels: torch.Tensor, *, exclude_self: bool, unmatched_queries: str = "miss",
                     query_index: torch.Tensor | None = None, chunk_elements: int | None = None,
                     progress: str | None = None, screen: bool = False) -> RetrievalScores:
    """The scores of the module docstring; inputs on any one device. ``query_index``: with ``exclude_self``, the
    queries are a sample of the gallery's items, query i being gallery item ``query_index[i]`` (left out of its
    ranking), rather than all of them in order. A :class:`~benchmarks.gallery_rows.GalleryRows` gallery is streamed
    in chunks (:func:`streamed`; ``screen``: screened, module docstring), a tensor ranked whole. ``progress``: the
    label of a progress bar (:func:`progress_bar`), None for none."""
    own = check_inputs(queries, query_labels, gallery, gallery_labels, exclude_self, unmatched_queries, query_index)
    fresh_from = torch.zeros(1, len(gallery), dtype=torch.long)
    engine = engine_for(gallery, screen)
    return engine(queries, query_labels, gallery, None, gallery_labels, fresh_from, 1, own,
                  unmatched_queries, chunk_elements, progress)[0][0]


def backfilling_scores(queries: torch.Tensor, query_labels: torch.Tensor, fresh: torch.Tensor | GalleryRows,
                       stale: torch.Tensor | GalleryRows, gallery_labels: torch.Tensor, fresh_from: torch.Tensor,
                       steps: int, *, exclude_self: bool,
                       unmatched_queries: str = "miss", query_index: torch.Tensor | None = None,
                       chunk_elements: int | None = None, progress: str | None = None,
                       screen: bool = False) -> list[list[RetrievalScores]]:
    """The scores at every step of several backfilling curves over one gallery: gallery item j is ``fresh[j]`` at
    the steps t >= ``fresh_from[c, j]`` of curve c and ``stale[j]`` before (``fresh_from``: ``(curves, n)`` in
    0..``steps``, ``steps`` meaning never). ``[curve][step]``; each equals :func:`retrieval_scores` of that step's
    gallery (module docstring); ``query_index``, ``progress``, ``screen`` and the kinds of gallery as in
    :func:`retrieval_scores`."""
    own = check_inputs(queries, query_labels, fresh, gallery_labels, exclude_self, unmatched_queries, query_index)
    if stale.shape != fresh.shape or fresh_from.ndim != 2 or fresh_from.shape[1] != len(fresh):
        raise ValueError(f"stale {tuple(stale.shape)} must match fresh {tuple(fresh.shape)}, and fresh_from must be "
                         f"(curves, {len(fresh)}), not {tuple(fresh_from.shape)}")
    engine = engine_for(fresh, screen)
    return engine(queries, query_labels, fresh, stale, gallery_labels, fresh_from.long(), steps, own,
                  unmatched_queries, chunk_elements, progress)


def engine_for(gallery: torch.Tensor | GalleryRows, screen: bool) -> Callable[..., list[list[RetrievalScores]]]:
    """:func:`ranked` for a gallery in a tensor, :func:`streamed` for one read by rows (screened with ``screen``)."""
    if not isinstance(gallery, torch.Tensor):
        return partial(streamed, screen=screen)
    if screen:
        raise ValueError("a screened ranking streams its gallery: pass it as rows (benchmarks.gallery_rows)")
    return ranked


def check_inputs(queries: torch.Tensor, query_labels: torch.Tensor, gallery: torch.Tensor,
                 gallery_labels: torch.Tensor, exclude_self: bool, unmatched_queries: str,
                 query_index: torch.Tensor | None) -> torch.Tensor | None:
    """Each input's shape and choice checked (a :class:`ValueError` in one line); returns the gallery index of each
    query's own item, None when nothing is left out."""
    if unmatched_queries not in UNMATCHED_CONVENTIONS:
        raise ValueError(f"unmatched_queries must be one of {list(UNMATCHED_CONVENTIONS)}, not {unmatched_queries!r}")
    if queries.ndim != 2 or gallery.ndim != 2 or queries.shape[1] != gallery.shape[1]:
        raise ValueError(f"queries {tuple(queries.shape)} and gallery {tuple(gallery.shape)} must be 2-D with one "
                         "feature width")
    if len(queries) != len(query_labels) or len(gallery) != len(gallery_labels):
        raise ValueError("each query and gallery item needs one label")
    if query_index is not None:
        if not exclude_self or query_index.shape != (len(queries),):
            raise ValueError("query_index names each query's own gallery item: one per query, with exclude_self")
        return query_index.to(gallery.device)
    if exclude_self and len(queries) != len(gallery):
        raise ValueError(f"exclude_self needs the query set and the gallery to be the same items, not "
                         f"{len(queries)} queries and {len(gallery)} gallery items")
    return torch.arange(len(queries), device=gallery.device) if exclude_self else None


def ranked(queries: torch.Tensor, query_labels: torch.Tensor, fresh: torch.Tensor, stale: torch.Tensor | None,
           gallery_labels: torch.Tensor, fresh_from: torch.Tensor, steps: int, own_index: torch.Tensor | None,
           unmatched_queries: str, chunk_elements: int | None,
           progress: str | None = None) -> list[list[RetrievalScores]]:
    """``[curve][step]`` scores, the queries taken in blocks, query i's own gallery item ``own_index[i]`` left out
    (module docstring); ``progress`` labels a bar over the pairs compared (:func:`progress_bar`)."""
    device = fresh.device
    q = F.normalize(queries.float(), dim=1)
    versions = [F.normalize(v.float(), dim=1) for v in (fresh, stale) if v is not None]
    query_labels, gallery_labels = query_labels.to(device), gallery_labels.to(device)
    fresh_from = fresh_from.to(device)
    n, curves = len(fresh), len(fresh_from)
    by_label = LabelIndex(gallery_labels)
    thresholds = len(versions) * by_label.largest + 1
    chunk_elements = chunk_elements or CHUNK_ELEMENTS
    rows = max(1, min(chunk_elements // max(n, 1), chunk_elements // (curves * (steps + 1) * thresholds)))
    first = torch.zeros(curves, steps, len(q), dtype=torch.long)
    ap = torch.full((2, curves, steps, len(q)), float("nan"), dtype=torch.float64)
    bar = progress_bar(progress, len(q) * n)
    for start in range(0, len(q), rows):
        stop = min(start + rows, len(q))
        scores = [similarities(q[start:stop], v) for v in versions]
        own = None if own_index is None else own_index[start:stop]
        if own is not None:
            for block in scores:
                block[torch.arange(stop - start, device=device), own] = float("-inf")
        index, valid = by_label.positives(query_labels[start:stop], own)
        similarity = [block.gather(1, index) for block in scores]
        ranks, counts = positive_ranks(similarity, index, valid, n, fresh_from, steps,
                                       partial(items_above, scores, fresh_from=fresh_from, steps=steps))
        first[:, :, start:stop], ap[:, :, :, start:stop] = summarise_ranks(ranks, counts)
        bar.update((stop - start) * n)
    bar.close()
    return as_scores(first, ap, unmatched_queries)


def progress_bar(label: str | None, pairs: int) -> tqdm:
    """A bar over the ``pairs`` (query, gallery item) a ranking compares, labelled ``label``, shown on a terminal
    only (tqdm's ``disable=None``: a log file or a parsed stream gets no bar), and not at all without a label: what a
    study of a gallery of millions shows while it ranks for minutes (``runner.py adapt``)."""
    return tqdm(total=pairs, desc=label, unit="pair", unit_scale=True, leave=False,
                disable=True if label is None else None)


def similarities(queries: torch.Tensor, gallery: torch.Tensor) -> torch.Tensor:
    """``queries @ gallery.T``; on CPU numpy's float32 product (module docstring), elsewhere torch's."""
    if queries.device.type != "cpu" or queries.dtype != torch.float32 or gallery.dtype != torch.float32:
        return queries @ gallery.t()
    return torch.from_numpy(queries.detach().numpy() @ gallery.detach().numpy().T)


def as_scores(first: torch.Tensor, ap: torch.Tensor, unmatched_queries: str,
              exact_depth: int | None = None) -> list[list[RetrievalScores]]:
    """``[curve][step]`` scores from the first ranks ``(curves, steps, queries)`` and AP / AP@R ``(2, ...)``."""
    first_np, ap_np = first.numpy(), ap.numpy()
    return [[RetrievalScores(first_np[c, t], ap_np[0, c, t], ap_np[1, c, t], unmatched_queries, exact_depth)
             for t in range(first_np.shape[1])] for c in range(first_np.shape[0])]


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
    depth = screen_depth(by_label, device) if screen else None
    room = SCREEN_ROOM * depth + SCREEN_SLACK if screen else None
    rows = max(1, min(len(q), STREAMED_COUNTS // (len(versions) * curves * (steps + 1) * (thresholds + 1)),
                      chunk_elements // min(n, STREAMED_ITEMS), SCREEN_ENTRIES // room if screen else len(q)))
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
            candidates = screen_candidates(block, versions, own, query_labels[start:stop], gallery_labels, depth,
                                           room, items, bar.update)
            similarity, scores, compared = screened_similarity(block, versions, index, valid, pairs, candidates)
            count_above = partial(screened_items_above, scores=scores, items=compared, fresh_from=fresh_from,
                                  steps=steps, processes=processes, finished=finished)
        else:
            similarity = [positive_similarity(block, version, pairs, valid) for version in versions]
            count_above = partial(chunked_items_above, block=block, versions=versions, items=items, own=own,
                                  pairs=pairs, similarity=similarity, fresh_from=fresh_from, steps=steps,
                                  finished=finished, advance=bar.update)
        ranks, counts = positive_ranks(similarity, index, valid, n, fresh_from, steps, count_above, finished)
        block_first, block_ap = summarise_ranks(ranks, counts)
        if screen:
            block_ap[0] = float("nan")
        sizes = processes.shares(stop - start)
        first[:, :, start:stop] = processes.gather(block_first.permute(2, 0, 1).to(device), sizes).permute(1, 2, 0)
        ap[:, :, :, start:stop] = processes.gather(block_ap.permute(3, 0, 1, 2).to(device), sizes).permute(1, 2, 3, 0)
    bar.close()
    return as_scores(first, ap, unmatched_queries, depth)


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
            inside = pairs.within(start, start + len(rows))
            positives[pairs.row[inside], pairs.slot[inside]] = pair_similarities(
                block, rows, pairs.row[inside], pairs.item[inside] - start)
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
    :func:`benchmarks.ranking_cpu.screen`, whose last cut then drops the candidates below it."""
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


def streamed_elements(gallery: GalleryRows) -> int:
    """The similarities of one chunk of a streamed ranking by default: an eighth of the gallery's own elements
    (items x width), within :data:`STREAMED_MIN_ELEMENTS` and :data:`STREAMED_ELEMENTS`, so a gallery streamed
    because it is large next to the process (``model_update.stream_rows: auto``) is ranked in a workspace small next
    to itself: 300,000 x 128 features peaked 1.07 GB with it against 2.2 GB with the fixed 2^26, in the same time."""
    items, width = gallery.shape
    return max(STREAMED_MIN_ELEMENTS, min(STREAMED_ELEMENTS, items * width // 8))


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


def positive_similarity(block: torch.Tensor, gallery: GalleryRows, pairs: PositivePairs,
                        valid: torch.Tensor) -> torch.Tensor:
    """``(rows, P)``: each query's similarity to the gallery items of its label in :class:`LabelIndex` order (the
    slots of :meth:`LabelIndex.positives`; zero where not ``valid``): one pass over the gallery in order, each
    chunk's positives' dot products taken alone (:func:`pair_similarities`), not the chunk's whole product. Processes
    that share the gallery each take the positives of their share and add them up (the others' entries are zeros, so
    the sum is exact)."""
    similarity = torch.zeros(valid.shape, device=block.device)
    for start, rows_read in gallery.chunks():
        inside = pairs.within(start, start + len(rows_read))
        similarity[pairs.row[inside], pairs.slot[inside]] = pair_similarities(
            block, F.normalize(rows_read, dim=1), pairs.row[inside], pairs.item[inside] - start)
    return gallery.processes.total(similarity)


PAIRS_AT_ONCE = 1 << 16
"""Pairs whose dot products one tensor operation takes, off the CPU (:func:`pair_similarities`)."""


def pair_similarities(queries: torch.Tensor, rows: torch.Tensor, query_of: torch.Tensor, row_of: torch.Tensor, *,
                      compiled: bool | None = None) -> torch.Tensor:
    """``queries[query_of[k]] · rows[row_of[k]]`` for every k: ``compiled`` (by default on CPU), the compiled loop of
    :func:`benchmarks.ranking_cpu.pair_dots`; else in slices of :data:`PAIRS_AT_ONCE` pairs (the tests run those
    on CPU)."""
    if queries.device.type == "cpu" if compiled is None else compiled:
        numba_threads_as_torch()
        return torch.from_numpy(ranking_cpu.pair_dots(queries.contiguous().numpy(), rows.contiguous().numpy(),
                                                      query_of.numpy(), row_of.numpy()))
    return torch.cat([(queries[query_of[k:k + PAIRS_AT_ONCE]] * rows[row_of[k:k + PAIRS_AT_ONCE]]).sum(dim=1)
                      for k in range(0, len(query_of), PAIRS_AT_ONCE)] or [queries.new_zeros(0)])


def chunked_items_above(thresholds: torch.Tensor, owner: torch.Tensor, *, block: torch.Tensor,
                        versions: list[GalleryRows], items: int, own: torch.Tensor | None, pairs: PositivePairs,
                        similarity: list[torch.Tensor], fresh_from: torch.Tensor, steps: int,
                        finished: slice, advance: Callable[[int], object]) -> torch.Tensor:
    """:func:`items_above` of the rows ``finished`` over the gallery's chunks of ``items`` rows (:func:`streamed`): on
    CPU the chunks' counts accumulate and are turned into items above once; elsewhere each chunk's items above are
    summed. Counts add up, so processes that share the gallery each count their share for every row and add the
    counts up. ``advance`` is told the pairs each chunk compared."""
    rows = torch.arange(len(block), device=block.device)
    on_cpu = compiled_counting(block.device)
    counter = ItemCounter(thresholds, owner, len(versions), fresh_from, steps) if on_cpu else None
    above = None if on_cpu else torch.zeros(len(fresh_from), len(block), steps, thresholds.shape[1],
                                            dtype=torch.long, device=block.device)
    for chunk in zip(*(version.chunks(items) for version in versions), strict=True):
        start, stop = chunk[0][0], chunk[0][0] + len(chunk[0][1])
        scores = [similarities(block, F.normalize(rows_read, dim=1)) for _, rows_read in chunk]
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
    own = torch.cat([torch.where(valid, version, float("inf")) for version in similarity], dim=1)
    thresholds, placed = own.sort(dim=1)
    position = torch.empty_like(placed).scatter_(1, placed, torch.arange(placed.shape[1], device=device)
                                                 .expand(rows, -1).contiguous())
    above = count_above(thresholds, index[torch.arange(rows, device=device)[:, None], placed % width])
    index, valid, position = index[finished], valid[finished], position[finished]
    rows, counts = len(index), valid.sum(dim=1)
    is_fresh = fresh_from[:, index][:, :, None, :] <= torch.arange(steps, device=device)[None, None, :, None]
    ranks = above.gather(3, position[:, :width][None, :, None, :].expand(curves, rows, steps, width))
    if len(similarity) > 1:
        stale_ranks = above.gather(3, position[:, width:][None, :, None, :].expand(curves, rows, steps, width))
        ranks = torch.where(is_fresh, ranks, stale_ranks)
    ranks = torch.where(valid[None, :, None, :], ranks + 1, n + 1).sort(dim=-1).values
    return ranks.permute(0, 2, 1, 3).contiguous(), counts


def items_above(scores: list[torch.Tensor], thresholds: torch.Tensor, owner: torch.Tensor, fresh_from: torch.Tensor,
                steps: int) -> torch.Tensor:
    """``(curves, rows, steps, m)``: how many gallery items come before the positive whose similarity is
    ``thresholds[row, i]`` (ascending; ``owner[row, i]`` is that positive's gallery index), at each step of each
    curve: the items with a larger similarity, and those with an equal one (few: duplicates and float coincidences)
    and a lower gallery index, the stable sort's tie-break (module docstring). On CPU the compiled kernel of
    :mod:`benchmarks.ranking_cpu` counts them, elsewhere :func:`items_above_vectorised`; both give the same counts."""
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
    """The compiled kernels (:mod:`benchmarks.ranking_cpu`) on as many threads as torch uses (``OMP_NUM_THREADS``,
    which torchrun sets to 1 per process). Starting numba's OpenMP layer sets the process's OpenMP thread count to
    numba's own (every core), so torch's is set back to what it was."""
    threads = torch.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    torch.set_num_threads(threads)


class ItemCounter:
    """The CPU kernel's counts for one block of queries (:mod:`benchmarks.ranking_cpu`): the thresholds' bucket
    table made once, blocks of gallery items added (:meth:`add`), and the items above each positive read at the end
    (:meth:`items_above`), on as many threads as torch uses."""

    def __init__(self, thresholds: torch.Tensor, owner: torch.Tensor, versions: int, fresh_from: torch.Tensor,
                 steps: int) -> None:
        numba_threads_as_torch()
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
        """The items above each threshold of the block's ``rows`` (:func:`benchmarks.ranking_cpu.finish`)."""
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
