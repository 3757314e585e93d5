"""Latent-space translation (METHODS.md §7): parity with the arithmetic of the reference code (``Flegyas/latentis``:
standard scaling, zero-padding, the svd / lstsq / l-ortho maps), written out here, and its closed-form behaviour."""
import pytest
import torch
import torch.nn.functional as F

from cl2r_bench.adapters import AdapterError, FeaturePair, fit_adapter, make_adapter


def reference_translation(x: torch.Tensor, y: torch.Tensor, queries: torch.Tensor, method: str) -> torch.Tensor:
    """latentis's Translator with StandardScaling on both sides, ZeroPadding and one aligner, step by step: fit on
    ``x`` -> ``y``, then translate ``queries``."""
    def scaling(t):
        scale = t.std(dim=0)
        eps = torch.finfo(t.dtype).eps
        scale[scale < 10 * eps] = 1.0
        scale[scale == 0.0] = 1.0
        return t.mean(dim=0), scale

    shift_x, scale_x = scaling(x)
    shift_y, scale_y = scaling(y)
    xs, ys = (x - shift_x) / scale_x, (y - shift_y) / scale_y
    x_pad, y_pad = max(0, y.shape[1] - x.shape[1]), max(0, x.shape[1] - y.shape[1])
    xs, ys = F.pad(xs, (0, x_pad)), F.pad(ys, (0, y_pad))
    if method == "svd":
        u, _, v = torch.svd((ys.T @ xs).T)
        matrix = u @ v.T
    else:
        matrix = torch.linalg.lstsq(xs, ys).solution
        if method == "lstsq_ortho":
            u, _, v = torch.svd(matrix)
            matrix = u @ v.T
    out = F.pad((queries - shift_x) / scale_x, (0, x_pad)) @ matrix
    if y_pad:
        out = out[..., :-y_pad]
    return out * scale_y + shift_y


def features(n: int, dim: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(n, dim, generator=generator) * torch.linspace(0.2, 2.0, dim), dim=1)


@pytest.mark.parametrize("method", ["svd", "lstsq", "lstsq_ortho"])
@pytest.mark.parametrize("old_dim, new_dim", [(12, 12), (10, 16), (16, 10)])
def test_both_maps_equal_the_reference_on_the_same_inputs(method, old_dim, new_dim):
    old, new = features(300, old_dim, 0), features(300, new_dim, 1)
    old = F.normalize(old + 0.5 * F.pad(new, (0, max(0, old_dim - new_dim)))[:, :old_dim], dim=1)
    adapter = make_adapter("latent_translation", {"latent_translation": {"map": method}})
    fit_adapter(adapter, FeaturePair(old, new, torch.zeros(300, dtype=torch.long)), seed=0)
    queries_new, queries_old = features(20, new_dim, 2), features(20, old_dim, 3)
    with torch.no_grad():
        torch.testing.assert_close(adapter.backward(queries_new), reference_translation(new, old, queries_new, method),
                                   rtol=0, atol=1e-5)
        torch.testing.assert_close(adapter.forward(queries_old), reference_translation(old, new, queries_old, method),
                                   rtol=0, atol=1e-5)


def test_l_ortho_recovers_a_rotation_and_scaling_none_is_a_plain_orthogonal_map():
    """New features that are an exact rotation of the old ones: the l-ortho map of unscaled features is that
    rotation, so B(new) is old to float precision."""
    old = features(400, 8, 4)
    rotation, _ = torch.linalg.qr(torch.randn(8, 8, generator=torch.Generator().manual_seed(5)))
    adapter = make_adapter("latent_translation", {"latent_translation": {"scaling": "none"}})
    fit_adapter(adapter, FeaturePair(old, old @ rotation, torch.zeros(400, dtype=torch.long)), seed=0)
    with torch.no_grad():
        torch.testing.assert_close(adapter.backward(old @ rotation), old, rtol=0, atol=1e-5)
        torch.testing.assert_close(adapter.to_old.weight @ rotation.T @ rotation, adapter.to_old.weight)


def test_every_anchor_is_seed_free_and_bad_settings_are_named():
    adapter = make_adapter("latent_translation", {"latent_translation": {"anchors": 100}})
    assert adapter.seed_free(100) and not adapter.seed_free(101)
    for bad, word in (({"map": "ortho"}, "map"), ({"scaling": "minmax"}, "scaling"), ({"anchors": 0}, "anchors")):
        with pytest.raises(AdapterError, match=word):
            make_adapter("latent_translation", {"latent_translation": bad})
