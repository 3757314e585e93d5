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
hundred values), every gallery item is placed among them (on CPU by a bucket table, :mod:`benchmarks.ranking.cpu`;
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
times D), get their float32 similarities in a second pass (:func:`benchmarks.ranking.cpu.candidate_dots`). The
positives and the candidates are then counted as the full ranking counts every item, and every rank within D is
exactly the full ranking's when each similarity is rounded alike (``tests/benchmarks/test_screen.py``); a rank beyond D
is only known to be beyond it, so the full mAP is not given (None) and CMC stops at D
(:attr:`RetrievalScores.exact_depth`). One caveat of rounding: the candidates' similarities are summed in one order
(:func:`benchmarks.ranking.cpu.dot`), a BLAS product's in another, and two similarities closer than that rounding
(about 1e-7) can be ordered differently; mAP@R moved by 0.0001 points in the fourth decimal against faiss at
100,000 items (docs/scale-out.md).

Every score is in percent; precisions are summed in float64, so chunking changes no digit that matters. The
queries are processed in blocks of at most ``chunk_elements`` query x gallery entries (by default
:data:`~benchmarks.ranking.in_memory.CPU_CHUNK_ELEMENTS` in memory on CPU, :data:`CHUNK_ELEMENTS` in memory
elsewhere, :data:`STREAMED_ELEMENTS` streamed; ``python -m tools.bench_ranking`` measures time and peak memory,
``python -m tools.bench_adapt_study`` a whole study's time). On CPU the similarities are numpy's float32 matrix
products (its OpenBLAS ran at about 200 GFLOPS on 2 cores where torch's MKL ran at 170: docs/scale-out.md).
"""
from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from cl2r_bench.settings import UNMATCHED_CONVENTIONS

from ..gallery_rows import GalleryRows
from .counting import numba_threads_as_torch, pair_similarities, similarities
from .in_memory import ranked
from .scores import CMC_DEPTH, RetrievalScores, cmc_at, mean_precision
from .screen import screen_problem
from .streamed import streamed

__all__ = ["CMC_DEPTH", "RetrievalScores", "backfilling_scores", "cmc_at", "mean_precision", "numba_threads_as_torch",
           "pair_similarities", "retrieval_scores", "screen_problem", "similarities"]
"""The package's interface; its modules, one idea each: :mod:`.scores`, :mod:`.in_memory`,
:mod:`.streamed`, :mod:`.screen`, :mod:`.counting` and :mod:`.cpu` (the compiled kernels)."""


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
