"""Leave-one-out CMC and mAP (benchmarks/ranking/; docs/METHODS.md §7b) against rankings worked out by hand,
a brute-force reference, and chunking."""
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers.progress_bars import RecordedBar

from benchmarks import ranking
from benchmarks.gallery_rows import NpyRows, TensorRows
from benchmarks.ranking import backfilling_scores, counting, in_memory, retrieval_scores

# Five unit vectors; cosines: (0,1) .8, (0,3) .6, (1,3) .96, (1,2) .6, (2,3) .8, (0,2) 0, (2,4) 0, (3,4) -.6,
# (1,4) -.8, (0,4) -1. Item 4 is the only one of class 2.
ITEMS = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [0.6, 0.8], [-1.0, 0.0]])
LABELS = torch.tensor([0, 0, 1, 1, 2])


def test_self_excluded_scores_by_hand():
    """Rankings without the query's own item:
    q0: 1 (.8, class 0), 3, 2, 4 -> hit, AP 1/1;     q1: 3 (.96, class 1), 0 (.8), ... -> miss, AP 1/2;
    q2: 3 (.8, class 1), 1, then 0 and 4 tie at 0 -> hit, AP 1;   q3: 1 (.96), 2 (.8, class 1) -> miss, AP 1/2;
    q4: no other item of class 2 -> miss, left out of the mAP.
    top-1 2/5, top-5 4/5 (every query with a positive sees all four others), mAP (1 + .5 + 1 + .5) / 4; each query
    with a match has R = 1 positive, so AP@R is its top-1 hit: mAP@R (1 + 0 + 1 + 0) / 4."""
    scores = retrieval_scores(ITEMS, LABELS, ITEMS, LABELS, exclude_self=True)
    assert scores.top1 == pytest.approx(40.0)
    assert scores.top5 == pytest.approx(80.0)
    assert scores.mAP == pytest.approx(75.0)
    assert scores.mAP_at_R == pytest.approx(50.0)
    assert (scores.queries, scores.queries_without_positive) == (5, 1)


def test_with_the_own_item_kept_each_query_finds_itself_first():
    """Own item at rank 1: q0 positives at ranks 1, 2 -> AP 1; q1 at 1 and 3 (after item 3, .96) -> (1 + 2/3) / 2;
    q2 at 1, 2 -> 1; q3 at 1 and 3 -> (1 + 2/3) / 2; q4 itself -> 1. mAP@R reads the first R ranks only: R = 2 for
    q0-q3, so q1 and q3 keep only their rank-1 positive, 1/2 each; R = 1 for q4: (1 + .5 + 1 + .5 + 1) / 5."""
    scores = retrieval_scores(ITEMS, LABELS, ITEMS, LABELS, exclude_self=False)
    assert scores.top1 == pytest.approx(100.0)
    assert scores.mAP == pytest.approx(100 * (1 + 5 / 6 + 1 + 5 / 6 + 1) / 5)
    assert scores.mAP_at_R == pytest.approx(80.0)
    assert scores.queries_without_positive == 0


def test_self_exclusion_is_by_position_whichever_model_embedded_each_side():
    """Queries from another model (here the gallery rotated by 90 degrees and back, so identical up to rounding, and
    scaled): query i must still not find gallery item i."""
    rotated = 3.0 * ITEMS @ torch.tensor([[0.0, 1.0], [-1.0, 0.0]]) @ torch.tensor([[0.0, -1.0], [1.0, 0.0]])
    assert retrieval_scores(rotated, LABELS, ITEMS, LABELS, exclude_self=True).as_dict() == pytest.approx(
        retrieval_scores(ITEMS, LABELS, ITEMS, LABELS, exclude_self=True).as_dict())


def test_top5_counts_a_positive_at_rank_5_but_not_at_rank_6():
    """One query at angle 0; six gallery items at angles 10, 20, ..., 60 degrees. Query A (class 0) has its one
    positive at rank 5 -> top-1 miss, top-5 hit, AP 1/5; query B (class 2) has it at rank 6 -> AP 1/6."""
    angles = torch.deg2rad(torch.arange(1, 7) * 10.0)
    gallery = torch.stack([torch.cos(angles), torch.sin(angles)], dim=1)
    gallery_labels = torch.tensor([1, 1, 1, 1, 0, 2])
    queries = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    scores = retrieval_scores(queries, torch.tensor([0, 2]), gallery, gallery_labels, exclude_self=False)
    assert (scores.top1, scores.top5) == (0.0, 50.0)
    assert scores.mAP == pytest.approx(100 * (1 / 5 + 1 / 6) / 2)


def brute_force(queries: np.ndarray, labels: np.ndarray, exclude_self: bool) -> tuple[float, float, float, float]:
    """top-1, top-5, mAP and mAP@R by the definitions, one query at a time (stable descending sort); AP@R is the
    precision at each of the first R ranks that holds a positive, summed and divided by R, the query's positives."""
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    top1 = top5 = 0
    aps, aps_at_r = [], []
    for i in range(len(q)):
        keep = np.array([j for j in range(len(q)) if not (exclude_self and j == i)])
        order = keep[np.argsort(-(q[keep] @ q[i]), kind="stable")]
        relevant = labels[order] == labels[i]
        top1 += relevant[0]
        top5 += relevant[:5].any()
        if relevant.any():
            ranks = np.flatnonzero(relevant) + 1
            aps.append(np.mean(np.arange(1, len(ranks) + 1) / ranks))
            first_r = relevant[:len(ranks)]
            aps_at_r.append(float((np.cumsum(first_r) / np.arange(1, len(ranks) + 1))[first_r].sum() / len(ranks)))
    return 100 * top1 / len(q), 100 * top5 / len(q), 100 * float(np.mean(aps)), 100 * float(np.mean(aps_at_r))


@pytest.mark.parametrize("exclude_self", [True, False])
def test_random_clusters_match_the_brute_force_definition_and_chunking_changes_nothing(exclude_self):
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 7, size=120)
    features = rng.normal(size=(7, 16))[labels] + 1.5 * rng.normal(size=(120, 16))
    x, y = torch.tensor(features, dtype=torch.float32), torch.tensor(labels)
    whole = retrieval_scores(x, y, x, y, exclude_self=exclude_self)
    chunked = retrieval_scores(x, y, x, y, exclude_self=exclude_self, chunk_elements=250)
    assert (whole.top1, whole.top5, whole.mAP, whole.mAP_at_R) == pytest.approx(
        brute_force(features, labels, exclude_self), abs=1e-4)
    assert whole.mAP_at_R < whole.mAP
    assert chunked.as_dict() == pytest.approx(whole.as_dict(), abs=1e-9)
    assert 0 < whole.mAP < 100 and not math.isnan(whole.mAP)


@pytest.mark.parametrize("kwargs, message", [
    ({"gallery": torch.zeros(3, 4)}, "one feature width"),
    ({"query_labels": torch.zeros(2, dtype=torch.long)}, "one label"),
    ({"unmatched_queries": "skip"}, "unmatched_queries must be one of"),
])
def test_bad_shapes_are_one_line(kwargs, message):
    args = {"queries": ITEMS, "query_labels": LABELS, "gallery": ITEMS, "gallery_labels": LABELS, **kwargs}
    gallery_labels = torch.zeros(3, dtype=torch.long) if "gallery" in kwargs else args.pop("gallery_labels")
    args.pop("gallery_labels", None)
    with pytest.raises(ValueError, match=message):
        retrieval_scores(args["queries"], args["query_labels"], args["gallery"], gallery_labels,
                         exclude_self=False, **({"unmatched_queries": kwargs["unmatched_queries"]}
                                                if "unmatched_queries" in kwargs else {}))


def test_exclude_self_needs_the_same_items_on_both_sides():
    with pytest.raises(ValueError, match="same items"):
        retrieval_scores(ITEMS[:3], LABELS[:3], ITEMS, LABELS, exclude_self=True)


def test_ties_are_broken_by_gallery_index():
    """Query (1, 0); gallery items 0 and 1 are both (1, 0) (cosine 1, a tie), item 2 is (0, 1) (cosine 0), and
    items 0 and 2 are the query's class in the first gallery, items 1 and 2 in the second. Ties go to the lower
    index: first gallery positives at ranks 1, 3 -> top-1 hit, AP (1/1 + 2/3) / 2 = 5/6; second gallery at
    ranks 2, 3 -> top-1 miss, AP (1/2 + 2/3) / 2 = 7/12 (scikit-learn, which groups ties, gives 7/12 for both)."""
    gallery = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    query, label = torch.tensor([[2.0, 0.0]]), torch.tensor([0])
    first = retrieval_scores(query, label, gallery, torch.tensor([0, 1, 0]), exclude_self=False)
    second = retrieval_scores(query, label, gallery, torch.tensor([1, 0, 0]), exclude_self=False)
    assert (first.top1, first.mAP) == (100.0, pytest.approx(100 * 5 / 6))
    assert (second.top1, second.mAP) == (0.0, pytest.approx(100 * 7 / 12))


@pytest.mark.parametrize("exclude_self", [True, False])
def test_map_matches_scikit_learn_average_precision_without_ties(exclude_self):
    """Per query, scikit-learn's ``average_precision_score`` on the cosines (own item dropped when excluded),
    averaged over the queries with a positive; the queries are the gallery items plus noise (another "model")."""
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 9, size=100)
    gallery = rng.normal(size=(9, 12))[labels] + 1.2 * rng.normal(size=(100, 12))
    queries = gallery + 0.3 * rng.normal(size=gallery.shape)
    labels[-1] = 9  # one class with a single item: without a positive when excluded
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    g = gallery / np.linalg.norm(gallery, axis=1, keepdims=True)
    aps = []
    for i in range(len(q)):
        keep = np.arange(len(g)) != i if exclude_self else np.ones(len(g), dtype=bool)
        relevant = labels[keep] == labels[i]
        if relevant.any():
            aps.append(metrics.average_precision_score(relevant, g[keep] @ q[i]))
    scores = retrieval_scores(torch.tensor(queries, dtype=torch.float32), torch.tensor(labels),
                              torch.tensor(gallery, dtype=torch.float32), torch.tensor(labels),
                              exclude_self=exclude_self, chunk_elements=700)
    assert scores.mAP == pytest.approx(100 * float(np.mean(aps)), abs=1e-4)
    assert scores.queries_without_positive == (1 if exclude_self else 0)


def clusters_with_duplicates(n: int = 150, classes: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Noisy class clusters where every tenth item repeats the one before it exactly (ties of a duplicate image)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, size=n)
    labels[-1] = classes                                               # one class of a single item: unmatched
    features = rng.normal(size=(classes + 1, 16))[labels] + 1.5 * rng.normal(size=(n, 16))
    features[10::10] = features[9:-1:10]
    labels[10::10] = labels[9:-1:10]
    return torch.tensor(features, dtype=torch.float32), torch.tensor(labels)


def test_cmc_at_any_k_and_the_curve_follow_the_first_positive():
    """Every query's first positive by a stable sort, one at a time; CMC top-k is the share within rank k."""
    x, y = clusters_with_duplicates()
    scores = retrieval_scores(x, y, x, y, exclude_self=True, chunk_elements=900)
    q = torch.nn.functional.normalize(x, dim=1)
    first = []
    for i in range(len(q)):
        similarity = q @ q[i]
        similarity[i] = float("-inf")
        order = torch.sort(similarity, descending=True, stable=True).indices
        found = ((y[order] == y[i]) & (order != i)).nonzero().flatten()
        first.append(int(found[0]) + 1 if len(found) else 0)
    first = np.array(first)
    for k in (1, 3, 5, 10, 40):
        assert scores.cmc(k) == pytest.approx(100 * np.mean((first >= 1) & (first <= k)))
    curve = scores.cmc_curve(100)
    assert len(curve) == 100 and curve[0] == scores.top1 and curve[4] == scores.top5 and curve[-1] == scores.cmc(100)
    assert (scores.top1, scores.top5, scores.mAP, scores.mAP_at_R) == pytest.approx(
        brute_force(x.numpy(), y.numpy(), True), abs=1e-9)


def test_unmatched_queries_are_counted_and_their_convention_is_applied():
    """One query of 150 has no other item of its class: a miss under "miss", left out under "exclude"; the mAP
    leaves it out either way."""
    x, y = clusters_with_duplicates()
    miss = retrieval_scores(x, y, x, y, exclude_self=True)
    leave = retrieval_scores(x, y, x, y, exclude_self=True, unmatched_queries="exclude")
    assert miss.queries_without_positive == leave.queries_without_positive == 1
    hits = miss.top1 * 150 / 100
    assert leave.top1 == pytest.approx(100 * hits / 149) and leave.mAP == miss.mAP
    per_class = miss.per_class_cmc(y.numpy())
    assert per_class[6] == 0.0 and len(per_class) == 7


@pytest.mark.parametrize("exclude_self", [True, False])
def test_every_step_of_a_backfilling_curve_equals_ranking_its_gallery_again(exclude_self):
    """Two orders, eleven steps; the stale gallery is another noisy "model" of the same items, and duplicates make
    ties in both versions, so the rows ranked again by a stable sort are exercised too. Every step's top-1, top-5
    and mAP equal :func:`retrieval_scores` of that step's gallery, to the last digit for CMC."""
    x, y = clusters_with_duplicates(seed=1)
    stale = x + 0.8 * torch.tensor(np.random.default_rng(2).normal(size=x.shape), dtype=torch.float32)
    stale[10::10] = stale[9:-1:10]
    generator = torch.Generator().manual_seed(0)
    betas = [i / 10 for i in range(11)]
    orders = [torch.randperm(len(x), generator=generator), torch.arange(len(x)).flip(0)]
    fresh_from = torch.full((2, len(x)), 11, dtype=torch.long)
    for c, order in enumerate(orders):
        for t in range(len(betas) - 1, -1, -1):
            fresh_from[c, order[:round(betas[t] * len(x))]] = t
    curves = backfilling_scores(x, y, x, stale, y, fresh_from, 11, exclude_self=exclude_self, chunk_elements=700)
    for c, order in enumerate(orders):
        for t, beta in enumerate(betas):
            gallery = stale.clone()
            chosen = order[:round(beta * len(x))]
            gallery[chosen] = x[chosen]
            again = retrieval_scores(x, y, gallery, y, exclude_self=exclude_self)
            step = curves[c][t]
            assert (step.top1, step.top5) == (again.top1, again.top5)
            assert step.mAP == pytest.approx(again.mAP, abs=1e-9)
            assert np.array_equal(step.first_rank, again.first_rank)


def test_a_sample_of_queries_ranks_the_whole_gallery_as_the_full_ranking_does():
    """Queries that are a sample of the gallery's items (``query_index``), each left out of its own ranking, get
    exactly the ranks they have in the ranking of every item."""
    x, y = clusters_with_duplicates(seed=3)
    whole = retrieval_scores(x, y, x, y, exclude_self=True)
    sample = torch.tensor([0, 7, 9, 10, 33, 80, 149])
    part = retrieval_scores(x[sample], y[sample], x, y, exclude_self=True, query_index=sample, chunk_elements=300)
    assert np.array_equal(part.first_rank, whole.first_rank[sample.numpy()])
    assert np.allclose(part.ap, whole.ap[sample.numpy()], equal_nan=True)


@pytest.mark.parametrize("versions, curves, steps, per_version, spread",
                         [(1, 1, 1, 12, 4), (2, 2, 11, 12, 4), (1, 1, 1, 200, 4), (2, 1, 3, 40, 0)])
def test_the_cpu_kernel_counts_exactly_what_the_vectorised_version_counts(versions, curves, steps, per_version,
                                                                         spread):
    """:func:`benchmarks.ranking.counting.items_above` on CPU (the compiled kernel) against
    :func:`benchmarks.ranking.counting.items_above_vectorised` (the GPU path), on similarities rounded to quarters so
    that
    most items tie with some positive, with positives of both versions, padding (+inf) and the own item (-inf).
    200 positives crowd each quarter's bucket of the kernel's table past its binary-search limit; ``spread`` 0 makes
    every finite similarity equal (a table of one span)."""
    generator = torch.Generator().manual_seed(versions)
    rows, n = 9, 301
    scores = [torch.round(torch.randn(rows, n, generator=generator) * spread) / 4 for _ in range(versions)]
    for block in scores:
        block[torch.arange(rows), torch.arange(rows)] = float("-inf")
    positive = torch.randint(0, n, (rows, per_version), generator=generator)
    similarity = torch.cat([block.gather(1, positive) for block in scores], dim=1)
    similarity[:, -3:] = float("inf")
    thresholds, placed = similarity.sort(dim=1)
    owner = positive.repeat(1, versions).gather(1, placed)
    fresh_from = torch.randint(0, steps + 1, (curves, n), generator=generator)
    kernel = counting.items_above(scores, thresholds, owner, fresh_from, steps)
    assert torch.equal(kernel, counting.items_above_vectorised(scores, thresholds, owner, fresh_from, steps))
    assert kernel.shape == (curves, rows, steps, versions * per_version)


def assert_same_scores(streamed, whole):
    assert np.array_equal(streamed.first_rank, whole.first_rank)
    assert np.allclose(streamed.ap, whole.ap, rtol=0, atol=1e-12, equal_nan=True)
    assert np.allclose(streamed.ap_at_r, whole.ap_at_r, rtol=0, atol=1e-12, equal_nan=True)


@pytest.mark.parametrize("exclude_self, sample", [(True, None), (False, None),
                                                  (True, torch.tensor([0, 7, 9, 10, 33, 80, 149]))])
def test_a_gallery_streamed_in_chunks_ranks_exactly_as_the_whole_one(exclude_self, sample):
    """A gallery read in chunks of 40 rows (:class:`TensorRows`; ``chunk_elements`` small enough for several query
    blocks too) gives every query the first rank, AP and AP@R it has when the gallery is ranked whole, with
    duplicate items (ties), an unmatched query, another "model" on the query side and a sample of queries."""
    x, y = clusters_with_duplicates(seed=4)
    queries = x + 0.3 * torch.tensor(np.random.default_rng(5).normal(size=x.shape), dtype=torch.float32)
    picked = queries if sample is None else queries[sample]
    labels = y if sample is None else y[sample]
    whole = retrieval_scores(picked, labels, x, y, exclude_self=exclude_self, query_index=sample)
    streamed = retrieval_scores(picked, labels, TensorRows(x, chunk_rows=40), y, exclude_self=exclude_self,
                                query_index=sample, chunk_elements=2000)
    assert_same_scores(streamed, whole)


def test_a_backfilling_curve_over_a_streamed_gallery_equals_the_whole_one():
    x, y = clusters_with_duplicates(seed=6)
    stale = x + 0.8 * torch.tensor(np.random.default_rng(7).normal(size=x.shape), dtype=torch.float32)
    stale[10::10] = stale[9:-1:10]
    fresh_from = torch.randint(0, 12, (2, len(x)), generator=torch.Generator().manual_seed(0))
    whole = backfilling_scores(x, y, x, stale, y, fresh_from, 11, exclude_self=True)
    streamed = backfilling_scores(x, y, TensorRows(x, chunk_rows=40), TensorRows(stale, chunk_rows=40), y,
                                  fresh_from, 11, exclude_self=True, chunk_elements=20000)
    for curve_whole, curve_streamed in zip(whole, streamed, strict=True):
        for step_whole, step_streamed in zip(curve_whole, curve_streamed, strict=True):
            assert_same_scores(step_streamed, step_whole)


@pytest.mark.parametrize("streamed", [False, True])
def test_a_ranking_counts_every_pair_it_compares_on_its_progress_bar(monkeypatch, streamed):
    """In memory and streamed (several query blocks, chunks of 40 rows), a ranking's bar is labelled as asked,
    counts the queries x gallery items it compares, all of them by its end, and closes; a backfilling curve counts
    each pair once for its two versions. Without a label the bar is disabled, and the scores are the same."""
    made: list[RecordedBar] = []
    monkeypatch.setattr(in_memory, "tqdm", lambda **kwargs: RecordedBar(made, **kwargs))
    x, y = clusters_with_duplicates(seed=4)
    stale = x.flip(1)
    sample = torch.tensor([0, 7, 9, 10, 33, 80, 149])

    def gallery(features):
        return TensorRows(features, chunk_rows=40) if streamed else features

    labelled = retrieval_scores(x[sample], y[sample], gallery(x), y, exclude_self=True, query_index=sample,
                                chunk_elements=200, progress="rank old/old")
    fresh_from = torch.randint(0, 3, (2, len(x)), generator=torch.Generator().manual_seed(0))
    backfilling_scores(x, y, gallery(x), gallery(stale), y, fresh_from, 2, exclude_self=True, chunk_elements=2000,
                       progress="rank backfilling curves")
    quiet = retrieval_scores(x[sample], y[sample], gallery(x), y, exclude_self=True, query_index=sample,
                             chunk_elements=200)
    assert [(bar.desc, bar.total, bar.done, bar.disable, bar.closed) for bar in made] == [
        ("rank old/old", len(sample) * len(x), len(sample) * len(x), None, True),
        ("rank backfilling curves", len(x) * len(x), len(x) * len(x), None, True),
        (None, len(sample) * len(x), len(sample) * len(x), True, True)]
    assert_same_scores(quiet, labelled)


def test_a_progress_bar_is_drawn_on_a_terminal_and_not_in_a_log(capsys, monkeypatch):
    """tqdm's own rule (``disable=None``): on a terminal the bar and its label are drawn, on a stream that is not one
    (a log file, a pipe, a study's parsed output) nothing is written."""
    for terminal in (False, True):
        monkeypatch.setattr(sys.stderr, "isatty", lambda terminal=terminal: terminal)
        bar = in_memory.progress_bar("rank new/F", 100)
        bar.update(100)
        bar.close()
        assert ("rank new/F" in capsys.readouterr().err) == terminal


def test_the_vectorised_counting_of_a_streamed_gallery_equals_the_compiled_one(monkeypatch):
    """The GPU's path (:func:`benchmarks.ranking.counting.items_above_vectorised`, each chunk's items above summed over
    the chunks), run on the CPU: a backfilling curve over a gallery streamed in chunks of 40, with duplicates (ties),
    gives the compiled kernel's scores at every step."""
    x, y = clusters_with_duplicates(seed=9)
    stale = x + 0.8 * torch.tensor(np.random.default_rng(10).normal(size=x.shape), dtype=torch.float32)
    fresh_from = torch.randint(0, 4, (2, len(x)), generator=torch.Generator().manual_seed(1))

    def curve():
        return backfilling_scores(x, y, TensorRows(x, chunk_rows=40), TensorRows(stale, chunk_rows=40), y,
                                  fresh_from, 3, exclude_self=True, chunk_elements=20000)

    compiled = curve()
    monkeypatch.setattr(counting, "compiled_counting", lambda device: False)
    for curve_compiled, curve_vectorised in zip(compiled, curve(), strict=True):
        for step_compiled, step_vectorised in zip(curve_compiled, curve_vectorised, strict=True):
            assert_same_scores(step_vectorised, step_compiled)


@pytest.mark.parametrize("exclude_self", [True, False])
def test_the_compiled_scores_of_the_ranks_equal_the_tensor_operations(monkeypatch, exclude_self):
    """:func:`benchmarks.ranking.cpu.rank_rows` (the CPU's pass over each row of a block in memory: its counts and
    the summary of each positive's rank) against :func:`benchmarks.ranking.counting.items_above_vectorised`,
    ``positive_ranks`` and ``summarise_ranks`` (the GPU's tensor operations, run on the CPU): a ranking and a
    backfilling curve of three orders with duplicates in both versions (ties) and an unmatched query give every query
    the same first rank at every step, and APs and AP@Rs within 1e-12 (the compiled loop sums each AP in rank order,
    the tensor sum in its own, so the last bit may differ)."""
    x, y = clusters_with_duplicates(seed=11)
    stale = x + 0.8 * torch.tensor(np.random.default_rng(12).normal(size=x.shape), dtype=torch.float32)
    stale[10::10] = stale[9:-1:10]
    fresh_from = torch.randint(0, 6, (3, len(x)), generator=torch.Generator().manual_seed(2))

    def scores():
        return [[retrieval_scores(stale, y, x, y, exclude_self=exclude_self, chunk_elements=900)],
                *backfilling_scores(x, y, x, stale, y, fresh_from, 5, exclude_self=exclude_self, chunk_elements=5000)]

    compiled = scores()
    monkeypatch.setattr(counting, "compiled_counting", lambda device: False)
    vectorised = scores()
    assert len(compiled) == len(vectorised) == 4
    for curve_compiled, curve_vectorised in zip(compiled, vectorised, strict=True):
        for step_compiled, step_vectorised in zip(curve_compiled, curve_vectorised, strict=True):
            assert_same_scores(step_compiled, step_vectorised)
            assert step_compiled.queries_without_positive == (0 if not exclude_self else 1)


@pytest.mark.parametrize("compiled", [True, False])
def test_a_pairs_similarity_is_the_same_wherever_it_is_taken(monkeypatch, compiled):
    """The positives' dot products of a streamed ranking (:func:`benchmarks.ranking.pair_similarities`; the GPU's
    torch slices run on the CPU, here of 7 pairs): a pair gives one value bit for bit in whatever slice and position
    it falls, so duplicate items tie, and each value is the dot product to float32 rounding."""
    monkeypatch.setattr(counting, "PAIRS_AT_ONCE", 7)
    x, _ = clusters_with_duplicates(seed=3)
    unit = torch.nn.functional.normalize(x, dim=1)
    generator = torch.Generator().manual_seed(0)
    query_of, row_of = torch.randint(0, 150, (500,), generator=generator), torch.randint(0, 150, (500,),
                                                                                        generator=generator)
    values = ranking.pair_similarities(unit, unit, query_of, row_of, compiled=compiled)
    reference = (unit.double()[query_of] * unit.double()[row_of]).sum(dim=1)
    assert torch.allclose(values.double(), reference, rtol=0, atol=1e-6)
    for shift in (1, 3, 5):
        moved = ranking.pair_similarities(unit, unit, query_of.roll(shift), row_of.roll(shift), compiled=compiled)
        assert torch.equal(moved, values.roll(shift))
    duplicate = torch.arange(10, 150, 10)
    assert torch.equal(ranking.pair_similarities(unit, unit, duplicate, duplicate, compiled=compiled),
                       ranking.pair_similarities(unit, unit, duplicate, duplicate - 1, compiled=compiled))

def test_a_memory_mapped_npy_gallery_and_a_transform_read_per_chunk(tmp_path):
    """An ``.npy`` gallery (:class:`NpyRows`) mapped for each read, through a transform (a rotation and a scale, as
    an adapter's map), ranks as the transformed gallery in memory does."""
    x, y = clusters_with_duplicates(seed=8)
    rotation = torch.linalg.qr(torch.randn(16, 16, generator=torch.Generator().manual_seed(1)))[0]
    np.save(tmp_path / "gallery.npy", x.numpy())
    rows = NpyRows(tmp_path / "gallery.npy", transforms=(lambda features: 2.0 * features @ rotation,), chunk_rows=64)
    assert rows.shape == (150, 16)
    whole = retrieval_scores(x @ rotation, y, 2.0 * x @ rotation, y, exclude_self=True)
    streamed = retrieval_scores(x @ rotation, y, rows, y, exclude_self=True, chunk_elements=3000)
    assert np.array_equal(streamed.first_rank, whole.first_rank)
    assert streamed.mAP == pytest.approx(whole.mAP, abs=1e-9)


def test_an_npy_file_that_is_not_a_feature_matrix_is_refused_in_one_line(tmp_path):
    np.save(tmp_path / "labels.npy", np.arange(5))
    with pytest.raises(ValueError, match="1-D int64 array; a gallery needs 2-D floating-point features"):
        NpyRows(tmp_path / "labels.npy")


def test_a_ranking_leaves_torch_on_the_threads_it_was_given():
    """numba's OpenMP layer, started by the first compiled kernel, sets the process's OpenMP thread count to every
    core; under torchrun (OMP_NUM_THREADS=1 per process) torch must stay on one thread."""
    script = ("import torch\nfrom benchmarks.ranking import retrieval_scores\n"
              "x, y = torch.randn(300, 16), torch.randint(0, 5, (300,))\n"
              "retrieval_scores(x, y, x, y, exclude_self=True)\nprint(torch.get_num_threads())")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "2"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["1"]
