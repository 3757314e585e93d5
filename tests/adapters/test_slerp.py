"""SLERP (METHODS.md §7): parity with the arithmetic of the reference code (``miccunifi/SLERP_backward_compatibility``:
zero-padding, rectangular Procrustes, the spherical interpolation and α chosen on the support set), written out
here, and the dual-query case in a study."""
import math

import pytest
import torch
import torch.nn.functional as F

from benchmarks.adapted_cases import PairedFeatures, StudySplit, case_scores, measure
from benchmarks.record import DUAL_CASE, cross_case
from cl2r_bench.adapters import AdapterError, FeaturePair, fit_adapter, make_adapter
from cl2r_bench.adapters.slerp import slerp


def reference_map(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """The reference's Procrustes: old zero-padded to max(d_new, d_old), then P Qᵀ of svd(Vᵀ U)."""
    width = max(old.shape[1], new.shape[1])
    padded = F.pad(old, (0, width - old.shape[1]))
    p, _, qt = torch.linalg.svd(new.T @ padded, full_matrices=False)
    return p @ qt


def reference_slerp(u: torch.Tensor, v: torch.Tensor, alpha: float, eps: float = 1e-7) -> torch.Tensor:
    u, v = F.normalize(u, dim=-1), F.normalize(v, dim=-1)
    theta = torch.acos((u * v).sum(-1, keepdim=True).clamp(-1 + eps, 1 - eps))
    return F.normalize((torch.sin((1 - alpha) * theta) * u + torch.sin(alpha * theta) * v) / torch.sin(theta), dim=-1)


def paired(n: int, old_dim: int, new_dim: int, noise: float, seed: int, classes: int = 6):
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % classes
    centres = torch.randn(classes, old_dim, generator=generator)
    old = F.normalize(centres[labels] + 0.8 * torch.randn(n, old_dim, generator=generator), dim=1)
    mixing = torch.randn(old_dim, new_dim, generator=generator)
    new = F.normalize(old @ mixing + noise * torch.randn(n, new_dim, generator=generator), dim=1)
    return old, new, labels


@pytest.mark.parametrize("old_dim, new_dim", [(12, 12), (8, 14), (14, 8)])
def test_the_map_and_the_queries_equal_the_reference_on_the_same_inputs(old_dim, new_dim):
    old, new, labels = paired(240, old_dim, new_dim, 0.5, 0)
    adapter = make_adapter("slerp", {"slerp": {"alpha": 0.4}})
    fit_adapter(adapter, FeaturePair(old, new, labels), seed=0)
    rotation = reference_map(new, old)
    torch.testing.assert_close(adapter.rotation, rotation, rtol=0, atol=1e-5)
    width = max(old_dim, new_dim)
    with torch.no_grad():
        got = adapter.dual_query(old[:30], new[:30])
    expected = reference_slerp(F.pad(old[:30], (0, width - old_dim)), new[:30] @ rotation, 0.4)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(adapter.old_frame(old[:3]), F.pad(old[:3], (0, width - old_dim)))


def test_slerp_ends_and_midpoint_by_hand():
    """α = 0 gives u, α = 1 gives v; u = e1, v = e2 (θ = π/2) at α = 1/2 gives (e1 + e2) / √2."""
    u, v = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])
    torch.testing.assert_close(slerp(u, v, 0.0), u)
    torch.testing.assert_close(slerp(u, v, 1.0), v, rtol=0, atol=1e-6)
    torch.testing.assert_close(slerp(u, v, 0.5), torch.tensor([[1.0, 1.0]]) / math.sqrt(2))


def test_alpha_is_the_grid_point_of_the_best_leave_one_out_top1_on_the_anchors_smallest_on_ties():
    old, new, labels = paired(180, 10, 10, 0.6, 1)
    adapter = make_adapter("slerp", {"slerp": {"alpha_steps": 5}})
    log = fit_adapter(adapter, FeaturePair(old, new, labels), seed=0)
    rotation = reference_map(new, old)
    expected_curve = []
    for step in range(6):
        queries = reference_slerp(old, new @ rotation, step / 5)
        similarity = queries @ old.T
        similarity.fill_diagonal_(-math.inf)
        expected_curve.append(100.0 * float((labels[similarity.argmax(dim=1)] == labels).float().mean()))
    assert [a for a, _ in log["alpha_curve"]] == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert [t for _, t in log["alpha_curve"]] == pytest.approx(expected_curve)
    best = max(expected_curve)
    assert log["alpha"] == [a / 5 for a, t in enumerate(expected_curve) if t == best][0]
    assert float(adapter.alpha) == pytest.approx(log["alpha"])


def test_the_dual_case_is_the_cross_case_and_has_no_backfilling_curve_of_its_own():
    old, new, labels = paired(120, 8, 12, 0.4, 2)
    adapter = make_adapter("slerp", {})
    fit_adapter(adapter, FeaturePair(old, new, labels), seed=0)
    split = StudySplit(PairedFeatures.normalised(old, new, labels))
    cases = case_scores(split, adapter)
    assert cases[DUAL_CASE] is not None and cases["B/old"] is None and cases["new/F"] is None
    result = measure(split, adapter, orders=["random"], steps=2, seed=0)
    assert cross_case(result["cases"]) == DUAL_CASE
    assert result["backfilling"]["curves"] == {"random": None}
    with torch.no_grad():
        queries = adapter.dual_query(old, new)
    similarity = queries @ adapter.old_frame(old).T
    similarity.fill_diagonal_(-math.inf)
    dual_hits = labels[similarity.argmax(dim=1)] == labels
    assert result["cases"][DUAL_CASE]["top1"] == pytest.approx(100.0 * float(dual_hits.float().mean()))
    similarity = old @ old.T
    similarity.fill_diagonal_(-math.inf)
    old_hits = labels[similarity.argmax(dim=1)] == labels
    assert result["case_flips"][DUAL_CASE] == pytest.approx(float((old_hits & ~dual_hits).float().mean()))
    assert set(result["case_flips"]) == {"new/new", DUAL_CASE}


def test_bad_settings_are_named():
    for bad, word in (({"alpha": 1.5}, "alpha"), ({"alpha_steps": 0}, "alpha_steps"), ({"anchors": 0}, "anchors")):
        with pytest.raises(AdapterError, match=word):
            make_adapter("slerp", {"slerp": bad})
