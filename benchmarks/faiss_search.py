"""Exact top-k search with faiss, the field's tool for large galleries: CMC top-k and mAP@R of a set of queries,
the gallery searched in chunks (docs/METHODS.md §7b; docs/scale-out.md, "Galleries of millions").

It is the suite's independent check and yardstick, not its ranking engine: :mod:`benchmarks.ranking` gives the same
CMC top-k (k <= ``depth``) and mAP@R, and also the papers' mAP over the whole ranking and a backfilling curve for
about the price of one ranking, which a top-k search cannot give. ``tests/benchmarks/test_faiss_search.py`` checks that
both agree to the last digit where no two similarities tie; ``python -m tools.bench_large`` times both on the same
arrays.

* Similarity is the inner product of L2-normalised rows (cosine), as in :mod:`benchmarks.ranking`.
* Each gallery chunk is searched with ``faiss.knn`` (a matrix product and a k-selection), or ``faiss.knn_gpu`` on
  the first GPU where faiss is built with GPUs and sees one (``faiss-gpu``; ``use_gpu``), and the chunks' results
  are merged by ``faiss.ResultHeap``, so memory holds one chunk and the ``queries x k`` results. The GPU path has
  not run here: no GPU was lent to the session that wrote it.
* k is the larger of ``depth`` and the most positives a query has, plus one for the own item when it is left out
  (it is searched and then dropped); equal similarities come back in faiss's order, not by gallery index.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

try:
    import faiss
except ImportError as missing:
    raise ImportError("benchmarks.faiss_search needs faiss: pip install -e '.[large]' (faiss-cpu), or faiss-gpu "
                      "for a GPU") from missing

from .ranking import CMC_DEPTH, cmc_at, mean_precision


@dataclass(frozen=True)
class TopKScores:
    """CMC and mAP@R from each query's ``first_rank`` (1-based rank of its first positive within the searched
    ``depth``; ``depth + 1`` when it lies deeper; 0 without a positive) and ``ap_at_r`` (NaN without a positive).
    CMC counts queries without a positive as misses, :mod:`benchmarks.ranking`'s default convention."""

    first_rank: np.ndarray = field(repr=False, compare=False)
    ap_at_r: np.ndarray = field(repr=False, compare=False)
    depth: int

    def cmc(self, k: int) -> float:
        if not 1 <= k <= self.depth:
            raise ValueError(f"CMC top-{k} needs a search at least {k} deep; this one is {self.depth} deep")
        return cmc_at(self.first_rank, k)

    @property
    def mAP_at_R(self) -> float:
        return mean_precision(self.ap_at_r)


def gallery_chunks(gallery: np.ndarray, rows: int) -> Iterator[tuple[int, np.ndarray]]:
    """``(start, rows)`` of an in-memory or memory-mapped gallery, each chunk read and normalised on its own."""
    for start in range(0, len(gallery), rows):
        yield start, normalised(gallery[start:start + rows])


def normalised(rows: np.ndarray) -> np.ndarray:
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)


def search_threads() -> int:
    """The threads faiss's CPU search runs on (OpenMP's; all cores unless ``OMP_NUM_THREADS`` says otherwise)."""
    return faiss.omp_get_max_threads()


def gpu_available() -> bool:
    """Whether this faiss is built with GPUs and sees one."""
    return hasattr(faiss, "knn_gpu") and faiss.get_num_gpus() > 0


def search(queries: np.ndarray, chunks: Iterable[tuple[int, np.ndarray]], k: int,
           use_gpu: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` most similar gallery items of each (normalised) query over every chunk: similarities and gallery
    indices, ``(queries, k)`` each, most similar first; on a GPU when ``use_gpu`` (None: when one is available)."""
    if use_gpu is None:
        use_gpu = gpu_available()
    if use_gpu and not gpu_available():
        raise ValueError("use_gpu needs faiss built with GPUs (faiss-gpu) and a visible GPU; this faiss has none")
    resources = faiss.StandardGpuResources() if use_gpu else None
    heap = faiss.ResultHeap(len(queries), k, keep_max=True)
    for start, chunk in chunks:
        depth = min(k, len(chunk))
        if use_gpu:
            similarity, index = faiss.knn_gpu(resources, queries, chunk, depth, metric=faiss.METRIC_INNER_PRODUCT)
        else:
            similarity, index = faiss.knn(queries, chunk, depth, metric=faiss.METRIC_INNER_PRODUCT)
        heap.add_result(similarity, index + start)
    heap.finalize()
    return heap.D, heap.I


def top_k_scores(queries: np.ndarray, query_labels: np.ndarray, gallery: np.ndarray, gallery_labels: np.ndarray, *,
                 own_index: np.ndarray | None = None, depth: int = CMC_DEPTH, chunk_rows: int = 65536,
                 use_gpu: bool | None = None) -> TopKScores:
    """CMC top-1 ... top-``depth`` and mAP@R of ``queries`` against ``gallery`` (module docstring); ``own_index``:
    each query's own gallery item, left out of its ranking (the leave-one-out protocol), or None; ``use_gpu`` as
    in :func:`search`."""
    label_counts = dict(zip(*np.unique(gallery_labels, return_counts=True), strict=True))
    positives = np.array([label_counts.get(label, 0) for label in query_labels.tolist()], dtype=np.int64)
    if own_index is not None:
        positives -= gallery_labels[own_index] == query_labels
    extra = 0 if own_index is None else 1
    k = min(max(depth, int(positives.max(initial=0))) + extra, len(gallery))
    _, index = search(normalised(queries), gallery_chunks(gallery, chunk_rows), k, use_gpu)
    if own_index is not None:
        index = drop_own(index, own_index)
    relevant = gallery_labels[index] == query_labels[:, None]
    hit = relevant.any(axis=1)
    first_rank = np.where(hit, relevant.argmax(axis=1) + 1, depth + 1)
    first_rank = np.where(positives > 0, np.minimum(first_rank, depth + 1), 0)
    within_r = relevant & (np.arange(1, index.shape[1] + 1) <= positives[:, None])
    precision = np.cumsum(within_r, axis=1) / np.arange(1, index.shape[1] + 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        ap_at_r = np.where(positives > 0, (precision * within_r).sum(axis=1) / positives, np.nan)
    return TopKScores(first_rank, ap_at_r, depth)


def drop_own(index: np.ndarray, own_index: np.ndarray) -> np.ndarray:
    """Each row of ``index`` without its own item (or without its last entry, when the own item was not found)."""
    own = index == own_index[:, None]
    own[~own.any(axis=1), -1] = True
    return index[~own].reshape(len(index), index.shape[1] - 1)
