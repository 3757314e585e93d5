"""Negative flips (benchmarks/flips.py, METHODS.md §2): exact rates on hand-made hits, None where they do not exist,
and an adapter study's flips from the very per-query hits of its cases."""
import numpy as np
import pytest
import torch
from helpers.adapter_pairs import fitted, rotated_pair
from helpers.hits import H00, H10, H11, H20, H21, H22

from benchmarks.adapted_cases import PairedFeatures, StudySplit, case_scores, measure
from benchmarks.flips import negative_flip_rate, negative_flips


def test_a_negative_flip_is_a_query_the_old_entry_hits_and_the_new_one_misses():
    assert negative_flip_rate(H00, H11) == pytest.approx(2 / 5)  # queries 0 and 1
    assert negative_flip_rate(H11, H00) == pytest.approx(2 / 5)  # queries 3 and 4: gains are not flips back
    assert negative_flip_rate(H00, H22) == 0.0 and negative_flip_rate(H22, H20) == 1.0
    assert negative_flip_rate([1, 1, 0, 0], [0, 1, 0, 1]) == 0.25


def test_self_and_cross_rates_per_consecutive_pair_and_their_means():
    """self(1): 0, 1 lost by [1][1] -> 2/5; self(2): none lost by [2][2] -> 0. cross(1): query 1 lost by [1][0] ->
    1/5; cross(2): queries 2 and 4 hit by [1][1] and missed by [2][1] -> 2/5."""
    flips = negative_flips([[H00], [H10, H11], [H20, H21, H22]])
    assert flips["self"] == pytest.approx([2 / 5, 0.0]) and flips["cross"] == pytest.approx([1 / 5, 2 / 5])
    assert flips["mean_self"] == pytest.approx(1 / 5) and flips["mean_cross"] == pytest.approx(3 / 10)
    assert set(flips) == {"self", "cross", "mean_self", "mean_cross"}


def test_one_model_has_no_pair_and_a_missing_entry_has_no_rate():
    assert negative_flips([[H00]]) == {"self": [], "cross": [], "mean_self": None, "mean_cross": None}
    flips = negative_flips([[H00], [None, H11]])
    assert flips["self"] == pytest.approx([2 / 5]) and flips["mean_self"] == pytest.approx(2 / 5)
    assert flips["cross"] == [None] and flips["mean_cross"] is None


@pytest.mark.parametrize("before, after", [(H00, H00[:4]), (H00[:0], H00[:0]), (np.ones((2, 5)), np.ones((2, 5)))])
def test_hits_of_different_queries_are_refused(before, after):
    with pytest.raises(ValueError, match="the same queries"):
        negative_flip_rate(before, after)


def test_an_adapter_study_records_the_flips_of_its_cases_query_by_query():
    """Along a stream with Procrustes, the new model a noisy rotation of the old: old/old to new/new (self) and to
    B/old, the cross case (cross)."""
    rotated, _ = rotated_pair(n=200)
    noise = 0.6 * torch.randn(200, 8, generator=torch.Generator().manual_seed(1))
    pair = PairedFeatures.normalised(rotated.old, rotated.new + noise, rotated.labels)
    queries, gallery = (PairedFeatures(pair.old[i], pair.new[i], pair.labels[i])
                        for i in (slice(0, 80), slice(80, None)))
    adapter = fitted("procrustes", pair)
    split = StudySplit(queries, gallery, mode="images")
    hits = {case: scores.query_top1 for case, scores in case_scores(split, adapter).items() if scores}
    with torch.no_grad():
        flips = measure(split, adapter, orders=["random"], steps=2, seed=0)["negative_flips"]
    old = hits["old/old"]
    assert flips["self"] == pytest.approx([np.sum(old & ~hits["new/new"]) / 80]) and flips["self"][0] > 0
    assert flips["cross"] == pytest.approx([np.sum(old & ~hits["B/old"]) / 80]) and flips["cross"][0] > 0
    assert flips["mean_self"] == flips["self"][0] and flips["mean_cross"] == flips["cross"][0]


def test_classification_flips_by_hand():
    from benchmarks.flips import classification_flips

    old = np.array([True, True, True, False, False])
    new = np.array([True, False, True, True, False])
    got = classification_flips(old, new)
    assert got["old_top1"] == pytest.approx(0.6) and got["new_top1"] == pytest.approx(0.6)
    assert got["nfr"] == pytest.approx(0.2)
    assert got["relative_nfr"] == pytest.approx(0.2 / (0.6 * 0.4))
    assert classification_flips(old, np.ones(5, dtype=bool))["relative_nfr"] is None
