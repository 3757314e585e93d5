"""mini-vec2vec (METHODS.md §7): each step equals the arithmetic of the reference notebook
(``guy-dar/mini-vec2vec``, ``linear_vec2vec.ipynb``), written out here, on the same inputs; the fit recovers a
rotation from the features of different items; and the unpaired fitting data hold no item twice."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.linalg import orthogonal_procrustes
from scipy.optimize import quadratic_assignment

from cl2r_bench.adapters import AdapterError, FeaturePair, fit_adapter, make_adapter, unpaired_halves
from cl2r_bench.adapters.mini_vec2vec import centred_gram, pseudo_pairs, refine_by_clusters, refine_by_neighbours
from cl2r_bench.adapters.quadratic_assignment import objective, swap_gains, two_opt_maximum


def cos_sim_matrix(x, y):
    return (x / x.norm(dim=-1, keepdim=True)) @ (y / y.norm(dim=-1, keepdim=True)).T


def reference_procrustes(x, y):
    solution, _ = orthogonal_procrustes(x.double().numpy(), y.double().numpy())
    return torch.tensor(solution).float()


def spaces(n: int = 600, dim: int = 12, seed: int = 0, noise: float = 0.05):
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 15
    centres = torch.randn(15, dim, generator=generator) * torch.linspace(0.5, 3.0, dim)
    old = F.normalize(centres[labels] + 0.5 * torch.randn(n, dim, generator=generator), dim=1)
    rotation = torch.linalg.qr(torch.randn(dim, dim, generator=generator))[0]
    new = F.normalize(old @ rotation + noise * torch.randn(n, dim, generator=generator), dim=1)
    return old, new, labels, rotation


def test_the_centred_gram_matrix_is_the_reference_sim():
    centres = torch.randn(20, 8, generator=torch.Generator().manual_seed(1))
    h = torch.eye(20) - (1 / 20) * torch.ones((20, 20))
    torch.testing.assert_close(centred_gram(centres), h @ centres @ centres.T @ h, rtol=0, atol=1e-5)


def test_the_pseudo_pairs_and_the_first_map_equal_the_reference():
    old, new, _, _ = spaces()
    x, y = F.normalize(new - new.mean(0), dim=1), F.normalize(old - old.mean(0), dim=1)
    generator = torch.Generator().manual_seed(2)
    centres_x, centres_y = torch.randn(40, 12, generator=generator), torch.randn(40, 12, generator=generator)
    sim_similarity = cos_sim_matrix(cos_sim_matrix(x, centres_x), cos_sim_matrix(y, centres_y))
    top_similar = sim_similarity.topk(dim=-1, k=50).indices
    y_matched = y[top_similar].transpose(-1, -2) @ (torch.ones(50) / 50)
    got = pseudo_pairs(x, y, centres_x, centres_y, 50)
    torch.testing.assert_close(got, y_matched, rtol=0, atol=1e-5)
    from cl2r_bench.adapters.translation import procrustes_weight
    torch.testing.assert_close(procrustes_weight(x, got), reference_procrustes(x, y_matched), rtol=0, atol=1e-5)


def test_each_swaps_gain_is_the_change_of_the_objective():
    rng = np.random.default_rng(0)
    a, b, order = rng.normal(size=(7, 7)), rng.normal(size=(7, 7)), rng.permutation(7)
    gains = swap_gains(a, b[order][:, order])
    for i in range(7):
        for j in range(7):
            swapped = order.copy()
            swapped[[i, j]] = swapped[[j, i]]
            assert gains[i, j] == pytest.approx(objective(a, b, swapped) - objective(a, b, order), rel=0, abs=1e-12)


def assignment_inputs(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Square matrices of 1 to 23 rows: Gaussian, centred Gram matrices of rank 3 (as the anchors'), or of zeros and
    ones, whose many swaps change the objective by exactly nothing."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 24))
    if seed % 3 == 0:
        return rng.normal(size=(n, n)), rng.normal(size=(n, n))
    if seed % 3 == 1:
        c, d = rng.normal(size=(n, 3)), rng.normal(size=(n, 3))
        return centred_gram(torch.tensor(c)).numpy(), centred_gram(torch.tensor(d)).numpy()
    return rng.integers(0, 2, size=(n, n)).astype(float), rng.integers(0, 2, size=(n, n)).astype(float)


def test_the_assignment_is_scipys_two_opt_for_the_same_generator():
    """The reference's call, three starts from one generator on each of 60 inputs: the same permutation and the same
    objective, bit for bit (ties included)."""
    for seed in range(60):
        a, b = assignment_inputs(seed)
        theirs, ours = np.random.default_rng(seed + 1000), np.random.default_rng(seed + 1000)
        for _ in range(3):
            expected = quadratic_assignment(a, b, method="2opt", options={"maximize": True, "rng": theirs})
            order, found = two_opt_maximum(a, b, ours)
            assert np.array_equal(order, expected.col_ind) and found == expected.fun, seed


def test_both_refinements_equal_the_reference():
    old, new, _, _ = spaces()
    x, y = F.normalize(new - new.mean(0), dim=1), F.normalize(old - old.mean(0), dim=1)
    weight = torch.linalg.qr(torch.randn(12, 12, generator=torch.Generator().manual_seed(3)))[0]
    sample = x[:200]
    neighbors = cos_sim_matrix(sample @ weight, y).topk(dim=-1, k=50).indices
    expected = 0.5 * weight + 0.5 * reference_procrustes(sample, y[neighbors].mean(dim=1))
    torch.testing.assert_close(refine_by_neighbours(weight, sample, y, 50), expected, rtol=0, atol=1e-5)
    centres_x, centres_y = x[:30], y[5:35]
    expected = 0.5 * weight + 0.5 * reference_procrustes(centres_x, centres_y)
    torch.testing.assert_close(refine_by_clusters(weight, centres_x, centres_y), expected, rtol=0, atol=1e-5)


FAST = {"mini_vec2vec": {"anchor_runs": 10, "refine_iterations": 30, "refine_sample": 300}}
"""Fewer anchor rounds and refinements than the reference; its 30 assignment starts kept: with 10, the same fit
recovered the rotation on two of four draws of these spaces."""


def test_a_rotation_is_recovered_from_the_features_of_different_items():
    """The new space is the old one rotated: fitted on the old features of one half of the items and the new
    features of the other, the map brings each new feature close to its own old one (which it never saw)."""
    old, new, labels, _ = spaces(n=1200)
    pair = unpaired_halves(FeaturePair(old, new, labels), seed=0)
    adapter = make_adapter("mini_vec2vec", FAST)
    log = fit_adapter(adapter, pair, seed=0)
    assert log["new_items"] == log["old_items"] == 600
    with torch.no_grad():
        agreement = F.cosine_similarity(adapter.backward(new), adapter.old_frame(old)).mean()
    assert agreement > 0.9, float(agreement)


def test_the_unpaired_halves_share_no_item_and_carry_no_labels():
    old = torch.arange(10.0)[:, None].repeat(1, 3)
    pair = unpaired_halves(FeaturePair(old, old + 100, torch.arange(10)), seed=4)
    old_items, new_items = set(pair.old[:, 0].tolist()), {v - 100 for v in pair.new[:, 0].tolist()}
    assert not pair.paired and len(pair.labels) == 0
    assert len(old_items) == len(new_items) == 5 and not old_items & new_items
    assert old_items | new_items == set(np.arange(10.0).tolist())


def test_an_adapter_that_needs_pairs_is_refused_unpaired_data_in_one_line():
    old, new, labels, _ = spaces(n=40)
    with pytest.raises(AdapterError, match="needs the same items embedded by both models.*mini_vec2vec"):
        fit_adapter(make_adapter("procrustes", {}), unpaired_halves(FeaturePair(old, new, labels), 0), seed=0)


def test_bad_settings_are_named():
    for bad, word in (({"anchor_runs": 0}, "anchor_runs"), ({"refine_iterations": -1}, "refine_iterations")):
        with pytest.raises(AdapterError, match=word):
            make_adapter("mini_vec2vec", {"mini_vec2vec": bad})
