"""The papers' cases, backfilling and zero-shot retention on fitted adapters (benchmarks/paper_protocol.py,
docs/METHODS.md §7b): which cases each adapter produces, backfilling's end points, and zero-shot retention that an
orthogonal map keeps exactly."""
import numpy as np
import pytest
import torch
from helpers.adapter_pairs import fitted, rotated_pair
from torch import nn

from benchmarks.adapted_cases import PairedFeatures, StudySplit, backfilling, case_scores, zero_shot_retention
from benchmarks.record import PAPER_CASES
from benchmarks.retrieval import gallery_hits


def paper_cases(pair: PairedFeatures, adapter) -> dict:
    """Top-1 / top-5 / mAP of every case, leave-one-out on ``pair``."""
    return {case: None if r is None else r.as_dict() for case, r in case_scores(StudySplit(pair), adapter).items()}


@pytest.mark.parametrize("name, produced", [
    (None, {"old/old", "new/old", "new/new"}),
    ("procrustes", {"old/old", "new/old", "new/new", "F/F", "new/F", "B/old", "B/B"}),
    ("fct", {"old/old", "new/old", "new/new", "F/F", "new/F"}),
    ("lambda_orth", {"old/old", "new/old", "new/new", "F/old", "F/F", "B/old", "B/F", "B/B"}),
])
def test_each_adapter_produces_the_cases_whose_sides_share_a_frame(name, produced):
    """λ-orth's F maps into B's (old) frame: F/old and B/F, not new/F; FCT's F maps into the new space: new/F only."""
    pair, _ = rotated_pair()
    cases = paper_cases(pair, None if name is None else fitted(name, pair))
    assert {c for c in PAPER_CASES if cases[c] is not None} == produced


def test_backfilling_starts_at_new_on_f_and_ends_at_new_on_new():
    pair, _ = rotated_pair()
    adapter = fitted("procrustes", pair)
    result = backfilling(StudySplit(pair), adapter, orders=["random", "class_mean_distance"], steps=4,
                         generator=torch.Generator().manual_seed(0))
    cases = paper_cases(pair, adapter)
    for order, curve in result["curves"].items():
        assert curve["top1"][0] == pytest.approx(cases["new/F"]["top1"]), order
        assert curve["mAP"][-1] == pytest.approx(cases["new/new"]["mAP"]), order
    assert result["betas"] == [0, 0.25, 0.5, 0.75, 1.0]


def test_zero_shot_retention_is_kept_by_an_orthogonal_map_and_lost_by_an_unrelated_affine_one():
    """Procrustes recovers the rotation (orthogonal, up to a scale): every logit keeps its rank, change 0. An
    affine map fitted to unrelated features moves the classifier's geometry: the accuracy drops. IRP's normalising
    map is not affine, and FCT has no backward map: no figure."""
    pair, _ = rotated_pair()
    torch.manual_seed(1)
    classifier = nn.Linear(8, 5)
    features = 3 * torch.randn(300, 8)
    classes = classifier(features).argmax(dim=1)
    kept = zero_shot_retention(features, classes, classifier, fitted("procrustes", pair))
    assert kept == {"before": 100.0, "after": 100.0, "change": 0.0}
    unrelated = PairedFeatures.normalised(pair.old, torch.randn(len(pair), 8), pair.labels)
    lost = zero_shot_retention(features, classes, classifier, fitted("affine", unrelated))
    assert lost["before"] == 100.0 and lost["change"] < -20
    assert zero_shot_retention(features, classes, classifier, fitted("irp", pair)) is None
    assert zero_shot_retention(features, classes, classifier, fitted("fct", pair)) is None
    assert zero_shot_retention(features, classes, classifier, None) is None


@pytest.mark.parametrize("mode", ["templates", "images"])
def test_a_stream_split_scores_queries_against_a_separate_gallery_as_the_evaluator_does(mode):
    """Along a stream the query set and the gallery are different items: no item is left out, the gallery is kept per
    image or reduced to class templates, and each case's top-1 counts the evaluator's hits (``gallery_hits``), for the
    adapted sides too."""
    pair, _ = rotated_pair(n=200)
    queries, gallery = (PairedFeatures(pair.old[i], pair.new[i], pair.labels[i])
                        for i in (slice(0, 80), slice(80, None)))
    adapter = fitted("procrustes", pair)
    split = StudySplit(queries, gallery, mode=mode)
    scores = case_scores(split, adapter)
    with torch.no_grad():
        expected = {"old/old": (queries.old, gallery.old), "new/old": (queries.new, gallery.old),
                    "B/old": (adapter.backward(queries.new), adapter.old_frame(gallery.old)),
                    "new/F": (queries.new, adapter.forward(gallery.old))}
    for case, (q, g) in expected.items():
        hits = gallery_hits(q, queries.labels, g, gallery.labels, mode)
        assert scores[case].top1 == 100.0 * int(hits.sum()) / 80, case
        assert (scores[case].query_top1 == hits.numpy()).all(), case
        assert scores[case].queries == 80
    fill = backfilling(split, adapter, orders=["random"], steps=2, generator=torch.Generator().manual_seed(0))
    assert fill["curves"]["random"]["top1"][0] == pytest.approx(scores["new/F"].top1)
    assert fill["curves"]["random"]["top1"][-1] == pytest.approx(scores["new/new"].top1)
    sample = torch.tensor([3, 10, 41, 77])
    sampled = case_scores(StudySplit(queries, gallery, mode=mode, sample=sample), adapter)
    for case in expected:
        assert (sampled[case].query_top1 == scores[case].query_top1[sample.numpy()]).all(), case


def test_an_unknown_gallery_mode_is_refused():
    pair, _ = rotated_pair()
    with pytest.raises(ValueError, match="unknown gallery mode 'classes'"):
        StudySplit(pair, pair, mode="classes")


def test_the_sampling_interval_of_a_query_sample_covers_the_all_queries_figure():
    """600 items of 12 noisy classes: 40 seeded samples of 150 queries each rank the whole gallery; their 95 %
    bootstrap intervals cover the all-queries top-1 and mAP in at least 34 of 40 (binomial: 38 expected)."""
    from benchmarks.adapted_cases import Scoring

    rng = np.random.default_rng(5)
    labels = rng.integers(0, 12, size=600)
    old = torch.tensor(rng.normal(size=(12, 16))[labels] + 2.0 * rng.normal(size=(600, 16)), dtype=torch.float32)
    items = PairedFeatures.normalised(old, old, torch.tensor(labels))
    scoring = Scoring("miss", per_class_cmc=False)
    full = case_scores(StudySplit(items, scoring=scoring), None)["old/old"]
    covered = {"top1": 0, "mAP": 0}
    for seed in range(40):
        sample = torch.randperm(600, generator=torch.Generator().manual_seed(seed))[:150].sort().values
        part = case_scores(StudySplit(items, scoring=scoring, sample=sample), None)["old/old"]
        assert part.queries == 150
        interval = part.interval(0.95, 1000)
        for name, value in (("top1", full.top1), ("mAP", full.mAP)):
            covered[name] += interval[name][0] <= value <= interval[name][1]
    assert min(covered.values()) >= 34, covered


def test_a_sample_of_queries_none_of_which_has_a_match_is_refused_under_exclude():
    """Under unmatched_queries=exclude such a sample would leave no query to count: 0 / 0 shown as 0.0."""
    from benchmarks.adapted_cases import Scoring
    from cl2r_bench.errors import ConfigError

    labels = torch.tensor([0, 1, 2, 3, 3])
    pair = PairedFeatures.normalised(torch.randn(5, 4), torch.randn(5, 4), labels)
    with pytest.raises(ConfigError, match="every one of the 2 sampled queries has no other item of its class"):
        StudySplit(pair, scoring=Scoring("exclude", False, 2, False), sample=torch.tensor([0, 2]))
    StudySplit(pair, scoring=Scoring("exclude", False, 2, False), sample=torch.tensor([0, 3]))
    StudySplit(pair, scoring=Scoring("miss", False, 2, False), sample=torch.tensor([0, 2]))
