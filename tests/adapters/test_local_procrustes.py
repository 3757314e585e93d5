"""Local Procrustes (cl2r_bench/adapters/local_procrustes.py, METHODS.md §7): two clusters under two rotations that
one global map cannot fit, the routing weights worked out by hand, scikit-learn's k-means from the same seeding,
small clusters and the global map, widths that differ, the affine map, export and restore, its settings' errors, and
a fit through ``runner.py adapt``."""
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers.adapt_inputs import adapt

from cl2r_bench.adapter_study.export import export_adapter
from cl2r_bench.adapters import AdapterError, FeaturePair, fit_adapter, list_adapters, make_adapter
from cl2r_bench.adapters.learned import FitProgress
from cl2r_bench.adapters.local_procrustes import kmeans, kmeans_plus_plus
from cl2r_bench.app.cli import main

DIM = 8


def keeping(axis: int, seed: int, dim: int = DIM) -> torch.Tensor:
    """An orthogonal matrix that keeps ``e_axis`` and turns the other coordinates at random."""
    others = torch.tensor([i for i in range(dim) if i != axis])
    q = torch.eye(dim)
    q[others[:, None], others] = torch.linalg.qr(torch.randn(dim - 1, dim - 1,
                                                             generator=torch.Generator().manual_seed(seed)))[0]
    return q


def blobs(seed: int, sizes=(150, 150), dim: int = DIM, spread: float = 0.3) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit rows around e_0, e_1, ... (one blob per size) and each row's blob."""
    g = torch.Generator().manual_seed(seed)
    which = torch.cat([torch.full((n,), k) for k, n in enumerate(sizes)])
    return F.normalize(2 * torch.eye(dim)[which] + spread * torch.randn(len(which), dim, generator=g), dim=1), which


def two_rotations(seed: int = 0, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """Old rows in blobs (two by default, around e_0 and e_1); the new model turns the first blob by Q_A (which keeps
    e_0) and the second by Q_B (which keeps e_1): two rotations, so no one orthogonal map fits both, and the blobs
    stay apart in both spaces."""
    old, which = blobs(seed, **kwargs)
    rotations = torch.stack([keeping(k, 1 + k) for k in range(int(which.max()) + 1)])
    return old, torch.einsum("nd,nde->ne", old, rotations[which])


def local(**params):
    return make_adapter("local_procrustes", {"local_procrustes": params})


def fitted(name_or_adapter, old, new, seed: int = 0, **params):
    adapter = make_adapter(name_or_adapter, {}) if isinstance(name_or_adapter, str) else name_or_adapter
    log = fit_adapter(adapter, FeaturePair(old, new, torch.zeros(len(old), dtype=torch.long)), seed=seed)
    return adapter, log


def cosines(mapped: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    return F.cosine_similarity(mapped, truth, dim=1)


def test_it_is_registered_both_ways_with_its_row_in_the_table_of_adapters(capsys):
    adapter = local()
    assert "local_procrustes" in list_adapters() and adapter.directions == ("backward", "forward")
    assert adapter.config.clusters == 8 and adapter.config.temperature == 0.1 and adapter.config.map == "procrustes"
    assert main(["list", "--markdown", "adapters"]) == 0
    assert "| `local_procrustes` | backward and forward | k-means of the query side" in capsys.readouterr().out


def test_two_clusters_under_two_rotations_are_recovered_where_one_global_map_fails():
    old, new = two_rotations()
    test_old, test_new = two_rotations(seed=5)
    adapter, log = fitted(local(clusters=2), old, new)
    with torch.no_grad():
        assert float(cosines(adapter.forward(test_old), test_new).min()) >= 0.99
        assert float(cosines(adapter.backward(test_new), test_old).min()) >= 0.99
    assert log["forward_clusters"] == log["backward_clusters"] == 2 and log["forward_fallback_clusters"] == 0
    assert log["forward_smallest_cluster"] == 150 and log["forward_kmeans_converged"]
    procrustes, _ = fitted("procrustes", old, new)
    one_cluster, _ = fitted(local(clusters=1), old, new)
    with torch.no_grad():
        for single in (procrustes, one_cluster):
            missed = cosines(single.forward(test_old), test_new)
            assert float(missed.min()) < 0.9 and float(missed.mean()) < 0.97


def hand_built(**params):
    """Two clusters in 2 dimensions: centres e_0 and e_1, maps I and the quarter turn [[0, -1], [1, 0]]; a third
    cluster slot left inactive."""
    adapter = local(clusters=3, **params)
    adapter.build(2, 2)
    maps = adapter.to_new
    maps.centres[:2] = torch.eye(2)
    maps.weight[0], maps.weight[1] = torch.eye(2), torch.tensor([[0.0, -1.0], [1.0, 0.0]])
    maps.active[:2] = True
    return adapter.eval()


def test_the_soft_weights_and_the_blend_as_worked_out_by_hand():
    """x = (0.6, 0.8), τ = 0.5: cosines 0.6 and 0.8, logits 1.2 and 1.6, w = (1, e^0.4) / (1 + e^0.4) = (0.401312,
    0.598688). x I = (0.6, 0.8), x [[0, -1], [1, 0]] = (0.8, -0.6); the blend (0.719738, -0.038163) has norm
    0.720749, so A(x) = (0.998597, -0.052949)."""
    adapter = hand_built(temperature=0.5)
    x = torch.tensor([[0.6, 0.8]])
    weights = adapter.to_new.routing(x, "soft", 0.5)
    assert weights[0].tolist() == pytest.approx([0.401312, 0.598688, 0.0], abs=1e-6)
    assert adapter.forward(x)[0].tolist() == pytest.approx([0.998597, -0.052949], abs=1e-5)
    assert adapter.forward(2 * x)[0].tolist() == pytest.approx([0.998597, -0.052949], abs=1e-5)
    hard = hand_built(routing="hard")
    assert hard.to_new.routing(x, "hard", 0.1)[0].tolist() == [0.0, 1.0, 0.0]
    assert hard.forward(x)[0].tolist() == pytest.approx([0.8, -0.6], abs=1e-6)


def test_a_cosine_softmax_is_a_softmax_of_minus_half_the_squared_distance_over_tau():
    adapter = hand_built(temperature=0.25)
    x = F.normalize(torch.tensor([[0.3, 0.9], [-0.2, 0.5]]), dim=1)
    distances = torch.cdist(x, torch.eye(2)).pow(2)
    assert torch.allclose(adapter.to_new.routing(x, "soft", 0.25)[:, :2], torch.softmax(-distances / 0.5, dim=1),
                          atol=1e-6)


def test_kmeans_from_the_same_seeding_is_scikit_learns():
    from sklearn.cluster import KMeans

    points, _ = blobs(3, sizes=(60, 50, 40, 30), spread=0.6)
    generator = torch.Generator().manual_seed(4)
    start = kmeans_plus_plus(points - points.mean(0), 4, generator)
    ours = kmeans(points, 4, torch.Generator(), max_iter=300, tol=1e-4, start=start)
    theirs = KMeans(4, init=points[start].numpy(), n_init=1, max_iter=300, tol=1e-4).fit(points.numpy())
    assert np.array_equal(ours.labels.numpy(), theirs.predict(points.numpy()))
    assert np.allclose(ours.centres.numpy(), theirs.cluster_centers_, atol=1e-5)
    assert ours.converged and ours.iterations == theirs.n_iter_


def test_kmeans_stops_at_max_iter_and_reports_each_iteration_as_a_step():
    old, new = two_rotations(sizes=(100, 100, 100), spread=1.5)
    lines, ticks = [], iter(range(0, 1000, 10))
    adapter = local(clusters=3, max_iter=1)
    fit_adapter(adapter, FeaturePair(old, new, torch.zeros(len(old), dtype=torch.long)), seed=0,
                progress=FitProgress("fit local_procrustes seed 0", lines.append, clock=lambda: float(next(ticks))))
    assert lines[0].startswith("fit local_procrustes seed 0: step 1 of 2, backward k-means inertia ")
    assert lines[1].startswith("fit local_procrustes seed 0: step 2 of 2, forward k-means inertia ")
    assert lines[-1].startswith("fit local_procrustes seed 0: used its whole budget after 2 steps")
    _, log = fitted(local(clusters=3, max_iter=1), old, new)
    assert log["forward_kmeans_iterations"] == 1 and not log["forward_kmeans_converged"]
    assert "converged" not in log    # no convergence warning: the maps themselves are closed forms


def test_a_small_cluster_takes_the_global_map_unless_allowed_and_the_prior_shrinks_towards_it():
    """150 items around e_0 and 5 around e_1 in 8 dimensions: the 5 cannot determine a map of 8 (min_items null
    means d_X = 8), so their cluster takes the global fit; with min_items 5 it has its own."""
    old, new = two_rotations(sizes=(150, 5))
    adapter, log = fitted(local(clusters=2), old, new)
    whole, _ = adapter.closed_form(old, new)
    small = int(F.normalize(adapter.to_new.centres, dim=1)[:, 1].argmax())
    assert log["forward_fallback_clusters"] == 1 and log["forward_smallest_cluster"] == 5
    assert torch.allclose(adapter.to_new.weight[small], whole, atol=1e-6)
    assert not torch.allclose(adapter.to_new.weight[1 - small], whole, atol=1e-2)
    allowed, log = fitted(local(clusters=2, min_items=5), old, new)
    assert log["forward_fallback_clusters"] == 0
    assert not torch.allclose(allowed.to_new.weight[small], whole, atol=1e-2)
    shrunk, _ = fitted(local(clusters=2, min_items=1, prior_items=1e7), old, new)
    assert torch.allclose(shrunk.to_new.weight, whole.expand(2, -1, -1), atol=1e-4)


@pytest.mark.parametrize("old_dim, new_dim", [(6, 10), (10, 6)])
def test_widths_that_differ_are_mapped_by_semi_orthogonal_maps(old_dim, new_dim):
    """The narrow side in two blobs; the wide side holds each blob isometrically through its own E_k (orthonormal
    rows, keeping e_k): the maps are E_k one way and E_kᵀ the other."""
    narrow, wide = min(old_dim, new_dim), max(old_dim, new_dim)
    embeddings = torch.stack([keeping(k, 3 + k, wide)[:narrow] for k in range(2)])

    def sides(seed):
        rows, which = blobs(seed, dim=narrow)
        embedded = torch.einsum("nd,nde->ne", rows, embeddings[which])
        return (rows, embedded) if old_dim < new_dim else (embedded, rows)

    old, new = sides(0)
    adapter, log = fitted(local(clusters=2), old, new)
    test_old, test_new = sides(5)
    with torch.no_grad():
        assert adapter.forward(test_old).shape == (len(test_old), new_dim)
        assert adapter.backward(test_new).shape == (len(test_new), old_dim)
        assert float(cosines(adapter.forward(test_old), test_new).min()) >= 0.99
        assert float(cosines(adapter.backward(test_new), test_old).min()) >= 0.99
    assert adapter.to_new.weight.shape == (2, old_dim, new_dim) and log["backward_fallback_clusters"] == 0


def test_the_affine_map_takes_up_each_clusters_offset():
    old, new = two_rotations()
    which = (old[:, 1] > old[:, 0]).long()
    shifted = new + torch.tensor([[0.3] * DIM, [-0.2] * DIM])[which]
    adapter, _ = fitted(local(clusters=2, map="affine"), old, shifted)
    with torch.no_grad():
        assert float(cosines(adapter.forward(old), shifted).min()) >= 0.999
    procrustes, _ = fitted(local(clusters=2), old, shifted)
    with torch.no_grad():
        assert float(cosines(procrustes.forward(old), shifted).min()) < 0.99


def test_drift_aware_clusters_recover_the_two_rotations_and_route_by_the_query_side_means():
    old, new = two_rotations()
    adapter, log = fitted(local(clusters=2, clustering="drift_aware"), old, new)
    with torch.no_grad():
        assert float(cosines(adapter.forward(old), new).min()) >= 0.99
    which = (old[:, 1] > old[:, 0]).long()
    means = torch.stack([old[which == k].mean(0) for k in range(2)])
    assert torch.allclose(adapter.to_new.centres.sort(dim=0).values, means.sort(dim=0).values, atol=1e-6)
    assert log["forward_clusters"] == 2


@pytest.mark.parametrize("routing", ["soft", "hard"])
def test_export_and_restore_give_the_same_maps_and_the_deployed_programs_serve_queries(routing, tmp_path):
    """Five clusters over four anchors leave a slot inactive; the torch.export programs of
    ``runner.py adapt --export`` take any number of rows."""
    old, new = two_rotations()
    adapter, _ = fitted(local(clusters=3, routing=routing), old, new)
    restored = local(clusters=3, routing=routing).restore(adapter.export())
    with torch.no_grad():
        assert torch.equal(restored.forward(old), adapter.forward(old))
        assert torch.equal(restored.backward(new), adapter.backward(new))
    sparse, _ = fitted(local(clusters=5, routing=routing), old[:4], new[:4])
    assert int(sparse.to_new.active.sum()) == 4
    export_adapter(sparse, tmp_path)
    to_new = torch.export.load(tmp_path / "forward.pt2").module()
    to_old = torch.export.load(tmp_path / "backward.pt2").module()
    with torch.no_grad():
        torch.testing.assert_close(to_new(old[:7]), sparse.forward(old[:7]))
        torch.testing.assert_close(to_old(new[:2]), sparse.backward(new[:2]))


def test_one_cluster_is_seed_free():
    old, new = two_rotations()
    assert local(clusters=1).seed_free(300) and not local(clusters=1, anchors=10).seed_free(300)
    assert not local().seed_free(300)
    other, _ = fitted(local(clusters=1), old, new, seed=7)
    once, _ = fitted(local(clusters=1), old, new, seed=0)
    assert torch.allclose(other.to_new.weight, once.to_new.weight, atol=1e-6)


@pytest.mark.parametrize("params, message", [
    ({"temperature": 0}, "adapter_params.local_procrustes.temperature = 0 must be above 0"),
    ({"map": "svd"}, "adapter_params.local_procrustes.map = 'svd'; choose from ['procrustes', 'affine']"),
    ({"clusters": 0}, "adapter_params.local_procrustes.clusters = 0 must be at least 1 and at most 256"),
    ({"min_items": 0}, "adapter_params.local_procrustes.min_items = 0 must be at least 1"),
    ({"routing": "top2"}, "adapter_params.local_procrustes.routing = 'top2'; choose from ['soft', 'hard']"),
    ({"k": 16}, "adapter_params.local_procrustes: unknown parameter(s) ['k']"),
])
def test_a_bad_setting_is_one_line_naming_it(params, message):
    with pytest.raises(AdapterError) as refused:
        local(**params)
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_runner_adapt_fits_it_and_the_rotation_is_recovered(rotated, tmp_path, capsys):
    """The new model is one rotation of the old: every cluster's map (or the global one for a cluster of fewer than
    8 items) is that rotation, so the adapted cases equal old/old."""
    train, test = rotated
    code, out = adapt("--train", train, "--test", test, "--adapter", "local_procrustes", "--json", "--output",
                      tmp_path / "out", capsys=capsys)
    assert code == 0, out.err
    line = json.loads(out.out.strip().splitlines()[0])
    cases = line["cases"]
    assert line["adapter"] == "local_procrustes"
    for case in ("B/old", "B/B", "new/F", "F/F"):
        for score in ("top1", "mAP"):
            assert cases[case][score] == pytest.approx(cases["old/old"][score], abs=0.01), (case, score)
    assert "fit local_procrustes seed 42: converged after " in out.err
    record = json.loads((tmp_path / "out/adapt/train/local_procrustes/seed42/metrics.json").read_text())
    fit = record["adapter"]["fits"][0]
    assert fit["anchors"] == 120 and fit["forward_clusters"] == 8 and math.isfinite(fit["forward_kmeans_iterations"])
