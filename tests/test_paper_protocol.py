"""The papers' cases, backfilling and zero-shot retention on fitted adapters (benchmarks/paper_protocol.py,
docs/METHODS.md §7b): which cases each adapter produces, backfilling's end points, and zero-shot retention that an
orthogonal map keeps exactly."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.paper_protocol import PAPER_CASES, PairedFeatures, backfilling, paper_cases, zero_shot_retention
from cl2r_bench.adapters import FeaturePair, fit_adapter, make_adapter

FAST = {"lambda_orth": {"max_steps": 4}, "fct": {"max_steps": 4}, "fastfill": {"max_steps": 4}}


def rotated_pair(n: int = 120, dim: int = 8, seed: int = 0) -> tuple[PairedFeatures, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 4
    old = torch.randn(4, dim, generator=generator)[labels] + 0.5 * torch.randn(n, dim, generator=generator)
    rotation = torch.linalg.qr(torch.randn(dim, dim, generator=generator))[0]
    return PairedFeatures.normalised(old, old @ rotation, labels), rotation


def fitted(name: str, pair: PairedFeatures):
    adapter = make_adapter(name, FAST)
    rows = F.normalize(torch.stack([pair.new[pair.labels == c].mean(0) for c in range(4)]), dim=1)
    fit_adapter(adapter, FeaturePair(pair.old, pair.new, pair.labels, new_classifier=rows), seed=0)
    return adapter


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
    result = backfilling(pair, adapter, orders=["random", "class_mean_distance"], steps=4,
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
