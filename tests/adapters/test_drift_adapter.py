"""Drift-Adapter (cl2r_bench/adapters/drift.py, METHODS.md §7): each parameterization against maps worked out by
hand on whitened features, the rank of the low-rank update, the residual variants' Procrustes start, diagonal
scaling, different widths, export and restore, reading rows from disk, and its parameters' errors."""
import pytest
import torch

from cl2r_bench.adapters import AdapterError, FeaturePair, fit_adapter, list_adapters, make_adapter
from cl2r_bench.adapters.drift import PARAMETERIZATIONS, DriftAdapter

QUICK = {"holdout": 0.0, "check_every": 10, "max_steps": 40}


def orthogonal(dim: int, generator: torch.Generator) -> torch.Tensor:
    return torch.linalg.qr(torch.randn(dim, dim, generator=generator))[0]


def whitened(dim: int = 8, frames: int = 20, seed: int = 0) -> torch.Tensor:
    """Unit rows with ``XᵀX = (n / dim) I``: the rows of ``frames`` random orthogonal matrices and their negatives,
    so ``mean_i (x_i · u)² = ‖u‖² / dim`` for every ``u``."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.cat([orthogonal(dim, g) for _ in range(frames)])
    return torch.cat([rows, -rows])


def pair(new: torch.Tensor, old: torch.Tensor) -> FeaturePair:
    return FeaturePair(old=old, new=new, labels=torch.zeros(len(old), dtype=torch.long))


def drift(parameterization: str, **params) -> DriftAdapter:
    return make_adapter("drift_adapter", {"drift_adapter": {"parameterization": parameterization, **params}})


def fitted(parameterization: str, new: torch.Tensor, old: torch.Tensor, **params):
    adapter = drift(parameterization, **params)
    log = fit_adapter(adapter, pair(new, old), seed=0)
    return adapter, log


def mse(adapter, new: torch.Tensor, old: torch.Tensor) -> float:
    with torch.no_grad():
        return float((adapter.backward(new) - old).pow(2).sum(dim=1).mean())


def test_it_is_registered_backward_only_with_the_residual_mlp_by_default():
    adapter = make_adapter("drift_adapter", {})
    assert "drift_adapter" in list_adapters() and adapter.directions == ("backward",)
    assert adapter.config.parameterization == "residual_mlp" and not adapter.config.diagonal_scaling
    with pytest.raises(AdapterError, match="no forward map"):
        adapter.forward(torch.zeros(1, 4))


def test_procrustes_recovers_a_rotation_in_closed_form_without_training():
    """new = old Q with Q orthogonal: R = Qᵀ, so B(new) = old exactly, and nothing is trained."""
    old = whitened()
    q = orthogonal(8, torch.Generator().manual_seed(5))
    adapter, log = fitted("procrustes", old @ q, old, anchors=len(old))
    assert torch.allclose(adapter.rotation, q.t(), atol=1e-5)
    assert torch.allclose(adapter.backward(old @ q), old, atol=1e-5)
    assert "steps" not in log and log["anchors"] == len(old) and log["start_mse"] < 1e-10
    assert adapter.seed_free(len(old)) and not adapter.seed_free(len(old) + 1)
    assert not drift("residual_mlp").seed_free(10)


@pytest.mark.parametrize("parameterization", PARAMETERIZATIONS)
def test_every_parameterization_recovers_a_rotation(parameterization):
    old = whitened()
    q = orthogonal(8, torch.Generator().manual_seed(5))
    adapter, _ = fitted(parameterization, old @ q, old, **QUICK)
    assert mse(adapter, old @ q, old) < 1e-3


def stretch(a: float = 2.0, dim: int = 8):
    """new = x, old = x P Q with P = I + a u uᵀ (symmetric positive definite) and Q orthogonal. The orthogonal
    polar factor of P Q is Q, so Procrustes gives R = Q and leaves ``old - x R = a (x·u) uᵀQ``: a squared error of
    ``a² mean (x·u)² = a² / dim``, and a rank-1 remainder that the low-rank update can take up exactly."""
    g = torch.Generator().manual_seed(3)
    x = whitened(dim)
    u = torch.nn.functional.normalize(torch.randn(dim, generator=g), dim=0)
    q = orthogonal(dim, g)
    return x, x @ (torch.eye(dim) + a * torch.outer(u, u)) @ q, q


def test_the_procrustes_start_of_a_stretch_leaves_a_squared_error_of_a_squared_over_dim():
    x, y, q = stretch(a=2.0)
    adapter, log = fitted("procrustes", x, y)
    assert torch.allclose(adapter.rotation, q, atol=1e-5)
    assert log["start_mse"] == pytest.approx(4.0 / 8, rel=1e-4)


def test_a_rank_one_update_takes_up_the_stretch_that_procrustes_leaves():
    x, y, _ = stretch(a=2.0)
    settings = {"holdout": 0.0, "max_steps": 300, "lr": 0.01}
    low_rank, log = fitted("low_rank_affine", x, y, rank=1, **settings)
    assert log["start_mse"] == pytest.approx(0.5, rel=1e-4) and mse(low_rank, x, y) < 1e-6
    mlp, _ = fitted("residual_mlp", x, y, hidden=64, **settings)
    assert mse(mlp, x, y) < 0.01 * 0.5


def test_the_low_rank_affine_update_has_rank_at_most_r():
    """A full-rank target map: the trained map is still x (R + U V) + b with rank(U V) ≤ 2."""
    g = torch.Generator().manual_seed(1)
    x = whitened()
    y = x @ torch.randn(8, 8, generator=g) + 0.1
    adapter, log = fitted("low_rank_affine", x, y, rank=2, holdout=0.0, max_steps=300, lr=0.01)
    with torch.no_grad():
        bias = adapter.backward(torch.zeros(1, 8))
        update = adapter.backward(torch.eye(8)) - bias - adapter.rotation
    singular = torch.linalg.svdvals(update.double())
    assert singular[0] > 0.1 and float(singular[2:].max()) < 1e-5 * float(singular[0])
    assert torch.allclose(update, adapter.correction.update, atol=1e-5)
    assert torch.allclose(bias[0], adapter.correction.bias, atol=1e-6)
    assert mse(adapter, x, y) < 0.9 * log["start_mse"]


@pytest.mark.parametrize("scaling", [False, True])
@pytest.mark.parametrize("parameterization", ["low_rank_affine", "residual_mlp"])
def test_the_residual_variants_start_as_the_procrustes_map(parameterization, scaling):
    g = torch.Generator().manual_seed(2)
    new, old = torch.randn(200, 8, generator=g), torch.randn(200, 8, generator=g)
    reference, _ = fitted("procrustes", new, old, diagonal_scaling=scaling)
    adapter = drift(parameterization, diagonal_scaling=scaling)
    adapter.prepare(pair(new, old))
    assert adapter.start(new, old) == pytest.approx(mse(reference, new, old), rel=1e-5)
    with torch.no_grad():
        assert torch.allclose(adapter.backward(new), reference.backward(new), atol=1e-6)


def test_diagonal_scaling_is_fitted_in_closed_form_after_the_rotation():
    """old = x Q diag(s): R = Q (the orthogonal polar factor of Q diag(s)), then s_j = Σ z_j y_j / Σ z_j² = s_j.
    Without scaling the error is Σ_j (s_j - 1)² / dim = (0.25 + 0.25 + 1) / 8."""
    x = whitened()
    q = orthogonal(8, torch.Generator().manual_seed(4))
    s = torch.tensor([0.5, 1.5, 1.0, 1.0, 2.0, 1.0, 1.0, 1.0])
    y = x @ q * s
    scaled, log = fitted("procrustes", x, y, diagonal_scaling=True)
    assert torch.allclose(scaled.scale, s, atol=1e-5) and log["start_mse"] < 1e-10
    assert torch.allclose(scaled.backward(x), y, atol=1e-5)
    _, plain = fitted("procrustes", x, y)
    assert plain["start_mse"] == pytest.approx(1.5 / 8, rel=1e-4)


@pytest.mark.parametrize("parameterization", PARAMETERIZATIONS)
@pytest.mark.parametrize("new_dim, old_dim", [(12, 8), (8, 12)])
def test_widths_that_differ_are_mapped_by_a_semi_orthogonal_start(parameterization, new_dim, old_dim):
    """E (small × large) with orthonormal rows: the larger space holds the smaller one isometrically, and R is E or
    Eᵀ exactly."""
    g = torch.Generator().manual_seed(6)
    e = orthogonal(max(new_dim, old_dim), g)[:min(new_dim, old_dim)]
    if new_dim > old_dim:
        old = whitened(old_dim)
        new, rotation = old @ e, e.t()
    else:
        new = whitened(new_dim)
        old, rotation = new @ e, e
    adapter, _ = fitted(parameterization, new, old, **QUICK)
    assert adapter.rotation.shape == (new_dim, old_dim) and torch.allclose(adapter.rotation, rotation, atol=1e-5)
    assert adapter.backward(new).shape == (len(new), old_dim) and mse(adapter, new, old) < 1e-3


@pytest.mark.parametrize("scaling", [False, True])
@pytest.mark.parametrize("parameterization", PARAMETERIZATIONS)
def test_export_and_restore_give_the_same_map(parameterization, scaling):
    g = torch.Generator().manual_seed(7)
    new, old = torch.randn(150, 12, generator=g), torch.randn(150, 8, generator=g)
    params = {"diagonal_scaling": scaling, "rank": 3, "hidden": 16, **QUICK}
    adapter, _ = fitted(parameterization, new, old, **params)
    exported = adapter.export()
    assert exported["dims"] == [8, 12, 0]
    restored = drift(parameterization, **params).restore(exported)
    with torch.no_grad():
        assert torch.equal(restored.backward(new), adapter.backward(new))


class DiskRows:
    """Fitting rows read by index, as a streamed study hands them over, counting whole reads."""

    def __init__(self, features: torch.Tensor) -> None:
        self.features, self.shape, self.device = features, tuple(features.shape), features.device
        self.whole_reads = 0

    def __len__(self) -> int:
        return len(self.features)

    def __getitem__(self, index: torch.Tensor) -> torch.Tensor:
        return self.features[index]

    def read(self, start: int, stop: int) -> torch.Tensor:
        self.whole_reads += (start, stop) == (0, len(self))
        return self.features[start:stop]


@pytest.mark.parametrize("parameterization", PARAMETERIZATIONS)
def test_rows_read_from_disk_fit_as_in_memory(parameterization):
    g = torch.Generator().manual_seed(8)
    new, old = torch.randn(300, 8, generator=g), torch.randn(300, 6, generator=g)
    params = {"anchors": 100, "max_steps": 20, "check_every": 5}
    on_disk = FeaturePair(DiskRows(old), DiskRows(new), torch.zeros(300, dtype=torch.long))
    streamed, in_memory = drift(parameterization, **params), drift(parameterization, **params)
    fit_adapter(streamed, on_disk, seed=0)
    fit_adapter(in_memory, pair(new, old), seed=0)
    assert on_disk.old.whole_reads == on_disk.new.whole_reads == 0
    for mine, reference in zip(streamed.state_dict().values(), in_memory.state_dict().values(), strict=True):
        assert torch.equal(mine, reference)


@pytest.mark.parametrize("params, fragment", [
    ({"parameterization": "lora"}, "adapter_params.drift_adapter.parameterization = 'lora'; choose from"),
    ({"rank": 0}, "adapter_params.drift_adapter.rank = 0 must be at least 1 and at most 16384"),
    ({"rank": 10**9}, "adapter_params.drift_adapter.rank = 1000000000 must be at least 1 and at most 16384"),
    ({"hidden": 0}, "adapter_params.drift_adapter.hidden = 0 must be at least 1"),
    ({"anchors": 0}, "adapter_params.drift_adapter.anchors = 0 must be at least 1"),
    ({"diagonal_scaling": 1}, "adapter_params.drift_adapter.diagonal_scaling = 1: expected bool"),
    ({"max_steps": 0}, "adapter_params.drift_adapter.max_steps = 0 must be at least 1"),
    ({"width": 3}, "adapter_params.drift_adapter: unknown parameter"),
    ({"epochs": 3}, "adapter_params.drift_adapter.epochs"),
])
def test_invalid_parameters_are_adapter_errors_naming_the_setting(params, fragment):
    with pytest.raises(AdapterError, match=fragment):
        make_adapter("drift_adapter", {"drift_adapter": params})
