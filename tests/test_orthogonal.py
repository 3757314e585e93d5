"""The orthogonal layer of BT² and OCA (cl2r_bench/orthogonal.py): torch's orthogonal(nn.Linear) in every state it
holds and every value it gives, with a training step computed by the exponential's series."""
import math

import pytest
import torch
from torch import nn
from torch.nn.utils.parametrizations import orthogonal

from cl2r_bench.heads import build_head
from cl2r_bench.orthogonal import OrthogonalLinear, spectral_norm_estimate, times_cayley, times_exponential

WIDTH, BATCH = 48, 16


def moved_layer(scale: float, bias: bool = True, seed: int = 0,
                orthogonal_map: str = "matrix_exp") -> OrthogonalLinear:
    """A layer whose trained parameter is moved ``scale`` (entry standard deviation) away from its start."""
    torch.manual_seed(seed)
    layer = OrthogonalLinear(WIDTH, bias=bias, orthogonal_map=orthogonal_map)
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
    twin = orthogonal(nn.Linear(WIDTH, WIDTH, bias=layer.bias is not None),
                      orthogonal_map=layer.orthogonal_map).to(dtype)
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


@pytest.mark.parametrize("scale", [0.0, 0.05, 0.5])
def test_cayley_training_step_is_torch_cayley_layer(scale):
    """The option's solve on the batch gives torch's Cayley layer (float64) within 1e-5 of each tensor's largest
    entry, output and gradients, and its evaluation weight is torch's."""
    layer = moved_layer(scale, orthogonal_map="cayley")
    rows, upstream = torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)
    ours = step(layer.train(), rows, upstream)
    exact = step(reference(layer, torch.float64).train(), rows.double(), upstream.double())
    for mine, truth in zip(ours, exact, strict=True):
        assert (mine.double() - truth).abs().max() <= 1e-5 * truth.abs().max()
    assert torch.allclose(layer.weight, reference(layer, torch.float32).weight)


def test_cayley_of_a_rotation_generator_by_hand():
    """For G = [[0, t], [-t, 0]]: [1, 0] (I - G/2)(I + G/2)^{-1} = [1 - t^2/4, -t] / (1 + t^2/4), a rotation."""
    t = 0.8
    generator = torch.tensor([[0.0, t], [-t, 0.0]], dtype=torch.float64)
    mapped = times_cayley(torch.tensor([[1.0, 0.0]], dtype=torch.float64), generator)
    expected = torch.tensor([[1 - t * t / 4, -t]], dtype=torch.float64) / (1 + t * t / 4)
    assert torch.allclose(mapped, expected, atol=1e-12)


def test_the_heads_pass_the_map_to_every_orthogonal_layer():
    bt2 = build_head("bt2", 16, 4, head_options={"old_width": 16, "added_dims": 4, "orthogonal_map": "cayley"})
    oca = build_head("oca", 16, 4, head_options={"old_width": 12, "added_dims": 4, "orthogonal_map": "cayley"})
    assert {bt2.new_basis.orthogonal_map, bt2.old_basis.orthogonal_map, oca.transform.orthogonal_map} == {"cayley"}
    assert build_head("oca", 16, 4, head_options={"old_width": 12}).transform.orthogonal_map == "matrix_exp"
    with pytest.raises(ValueError, match="orthogonal_map must be one of"):
        OrthogonalLinear(4, orthogonal_map="householder")
