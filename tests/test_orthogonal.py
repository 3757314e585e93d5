"""The orthogonal layer of BT² and OCA (cl2r_bench/orthogonal.py): torch's orthogonal(nn.Linear) in every state it
holds and every value it gives, with a training step computed by the exponential's series."""
import math

import pytest
import torch
from torch import nn
from torch.nn.utils.parametrizations import orthogonal

from cl2r_bench.orthogonal import OrthogonalLinear, spectral_norm_estimate, times_exponential

WIDTH, BATCH = 48, 16


def moved_layer(scale: float, bias: bool = True, seed: int = 0) -> OrthogonalLinear:
    """A layer whose trained parameter is moved ``scale`` (entry standard deviation) away from its start."""
    torch.manual_seed(seed)
    layer = OrthogonalLinear(WIDTH, bias=bias)
    with torch.no_grad():
        layer.parametrizations.weight.original.add_(scale * torch.randn(WIDTH, WIDTH))
    return layer


def step(layer: nn.Module, rows: torch.Tensor, upstream: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Output, gradient of the input and gradient of the trained parameter of one forward and backward."""
    rows = rows.clone().requires_grad_()
    layer.zero_grad()
    output = layer(rows)
    output.backward(upstream)
    return output.detach(), rows.grad, layer.parametrizations.weight.original.grad


def reference(layer: OrthogonalLinear, dtype: torch.dtype) -> nn.Module:
    """torch's own layer holding ``layer``'s state, in ``dtype``."""
    twin = orthogonal(nn.Linear(WIDTH, WIDTH, bias=layer.bias is not None)).to(dtype)
    twin.load_state_dict({key: value.to(dtype) for key, value in layer.state_dict().items()})
    return twin


def test_same_construction_state_and_weight_as_torch_layer():
    torch.manual_seed(3)
    ours = OrthogonalLinear(WIDTH)
    torch.manual_seed(3)
    theirs = orthogonal(nn.Linear(WIDTH, WIDTH))
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    for key, value in ours.state_dict().items():
        assert torch.equal(value, theirs.state_dict()[key]), key
    assert torch.equal(ours.weight, theirs.weight)


@pytest.mark.parametrize("scale", [0.0, 0.01, 0.05, 0.2])
@pytest.mark.parametrize("bias", [True, False])
def test_training_step_is_the_exact_exponential_step(scale, bias):
    """Output and gradients within 1e-6 (relative to their largest entry) of torch's layer in float64, and no farther
    from it than torch's float32 layer (whose block-exponential backward is up to 1e-4 from it at scale 0.2)."""
    layer = moved_layer(scale, bias)
    rows, upstream = torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)
    ours = step(layer.train(), rows, upstream)
    exact = step(reference(layer, torch.float64).train(), rows.double(), upstream.double())
    theirs = step(reference(layer, torch.float32).train(), rows, upstream)
    for mine, truth, torch_32 in zip(ours, exact, theirs, strict=True):
        largest = truth.abs().max()
        assert (mine.double() - truth).abs().max() <= 1e-6 * largest
        assert (mine.double() - truth).abs().max() <= (torch_32.double() - truth).abs().max() + 1e-7 * largest


def test_evaluation_and_no_gradient_use_torch_weight():
    layer = moved_layer(0.05)
    rows = torch.randn(BATCH, WIDTH)
    expected = rows @ layer.weight.detach().t() + layer.bias.detach()
    assert torch.equal(layer.eval()(rows), torch.nn.functional.linear(rows, layer.weight, layer.bias))
    with torch.no_grad():
        assert torch.allclose(layer.train()(rows), expected, atol=1e-6)


def test_times_exponential_hand_computed_rotation():
    """A 2 x 2 generator [[0, t], [-t, 0]] is the rotation by t: [1, 0] exp(G) = [cos t, sin t], for t past the
    step norm (several steps)."""
    for angle in (0.3, 2.5):
        generator = torch.tensor([[0.0, angle], [-angle, 0.0]], dtype=torch.float64)
        rotated = times_exponential(torch.tensor([[1.0, 0.0]], dtype=torch.float64), generator)
        assert torch.allclose(rotated, torch.tensor([[math.cos(angle), math.sin(angle)]], dtype=torch.float64),
                              atol=1e-12)


def test_spectral_estimate_bounds():
    """A 2 x 2 rotation generator of angle t has singular values t, t: the estimate is min(1-norm, 1.5 t) = t; the
    zero matrix gives 0."""
    generator = torch.tensor([[0.0, 0.7], [-0.7, 0.0]])
    assert spectral_norm_estimate(generator) == pytest.approx(0.7)
    assert spectral_norm_estimate(torch.zeros(3, 3)) == 0.0
