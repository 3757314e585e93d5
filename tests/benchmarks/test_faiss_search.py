"""faiss's exact top-k search (benchmarks/faiss_search.py) against the suite's ranking (benchmarks/ranking/):
CMC top-k and mAP@R agree to the last digit where no two similarities tie (docs/METHODS.md §7b)."""
import numpy as np
import pytest
import torch

from benchmarks.faiss_search import top_k_scores
from benchmarks.ranking import retrieval_scores


def clustered(n: int, dim: int, classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Overlapping classes (so positives lie deep), in float64 rounded to float32: no two similarities tie."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, size=n)
    features = rng.normal(size=(classes, dim))[labels] + 2.0 * rng.normal(size=(n, dim))
    return features.astype(np.float32), labels


@pytest.mark.parametrize("leave_one_out", [True, False])
def test_faiss_top_k_agrees_with_the_ranking_to_the_last_digit(leave_one_out):
    """Queries are a sample of another "model"'s features; with ``leave_one_out`` each query's own gallery item is
    left out. The gallery is searched in chunks of 97 rows, so the merge across chunks is exercised."""
    gallery, labels = clustered(600, 24, 5, seed=0)
    other = gallery + 0.5 * np.random.default_rng(1).normal(size=gallery.shape).astype(np.float32)
    sample = np.sort(np.random.default_rng(2).choice(len(gallery), size=150, replace=False))
    exact = retrieval_scores(torch.from_numpy(other[sample]), torch.from_numpy(labels[sample]),
                             torch.from_numpy(gallery), torch.from_numpy(labels), exclude_self=leave_one_out,
                             query_index=torch.from_numpy(sample) if leave_one_out else None)
    searched = top_k_scores(other[sample], labels[sample], gallery, labels,
                            own_index=sample if leave_one_out else None, depth=100, chunk_rows=97)
    for k in (1, 5, 20, 100):
        assert searched.cmc(k) == exact.cmc(k)
    assert searched.mAP_at_R == exact.mAP_at_R
    assert np.array_equal(np.minimum(exact.first_rank, 101), searched.first_rank)
    assert 0 < searched.mAP_at_R < exact.mAP < 100


def test_a_query_whose_first_positive_lies_deeper_than_the_search_is_a_miss_at_every_searched_k():
    """Gallery items at angles 1°, 2°, ..., 10° from the query; the one positive at 7° has rank 7, beyond a
    search 5 deep: a miss at every k <= 5. Its R is 1, so AP@R is 0. A query of a label with no gallery item has
    first rank 0 and is left out of mAP@R."""
    angles = np.deg2rad(np.arange(1, 11, dtype=np.float64))
    gallery = np.stack([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)
    gallery_labels = np.array([0, 0, 0, 0, 0, 0, 1, 0, 0, 0])
    queries = np.array([[1.0, 0.0], [1.0, 0.0]], dtype=np.float32)
    scores = top_k_scores(queries, np.array([1, 2]), gallery, gallery_labels, depth=5)
    assert scores.first_rank.tolist() == [6, 0]
    assert scores.cmc(5) == 0.0 and scores.mAP_at_R == 0.0
    with pytest.raises(ValueError, match="at least 6 deep"):
        scores.cmc(6)


def test_a_gpu_search_asked_of_a_faiss_without_gpus_is_refused_in_one_line():
    """faiss-cpu (CI's build) has no GPU index: asking for one says what to install, rather than failing inside
    faiss; left to choose, the search runs on the CPU."""
    from benchmarks import faiss_search

    if faiss_search.gpu_available():
        pytest.skip("this faiss sees a GPU")
    gallery, labels = clustered(50, 8, 3, seed=3)
    with pytest.raises(ValueError, match="faiss-gpu"):
        top_k_scores(gallery[:5], labels[:5], gallery, labels, depth=5, use_gpu=True)
    assert top_k_scores(gallery[:5], labels[:5], gallery, labels, depth=5).cmc(1) == 100.0
