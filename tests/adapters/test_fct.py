"""FCT's transformation (cl2r_bench/adapters/fct.py; METHODS.md §7): ml-fct's side-information projection network
(``network: side_projection``, the default) and the plain MLP (``network: mlp``); its parity with ml-fct's code is
tools/parity/fct.py (results/parity/fct.json)."""
import copy

import pytest
import torch
from torch import nn

from cl2r_bench.adapters import AdapterError, FeaturePair, fit_adapter, make_adapter
from cl2r_bench.adapters.fct import SideProjection

EPS = 1e-5
K = (1 + EPS) ** -0.5
"""What batch norm in eval mode multiplies by with running mean 0, running variance 1, scale 1 and shift 0."""


def built(params: dict, old_dim: int, new_dim: int, side_dim: int = 0):
    adapter = make_adapter("fct", {"fct": params})
    adapter.build(old_dim, new_dim, side_dim)
    return adapter


def unit_network(adapter) -> None:
    """Every linear weight 1, every bias 0 except the last layer's 0.5; batch norm at its initial values."""
    with torch.no_grad():
        for module in adapter.modules():
            if isinstance(module, nn.Linear):
                module.weight.fill_(1.0)
                if module.bias is not None:
                    module.bias.fill_(0.5)


def test_the_side_projection_network_has_ml_fct_widths():
    """old 4 -> 8 -> 2·new, side 3 -> 6 -> 2·new, mixer 4·new -> hidden -> hidden -> new; linear layers without bias
    before batch norm, the last with bias. Parameters: 4·8 + 2·8 + 8·4 + 2·4 = 88 (old), 3·6 + 2·6 + 6·4 + 2·4 = 62
    (side), 8·5 + 2·5 + 5·5 + 2·5 + 5·2 + 2 = 97 (mixer)."""
    adapter = built({"hidden": 5}, old_dim=4, new_dim=2, side_dim=3)
    net = adapter.net
    assert isinstance(net, SideProjection)
    assert [m.weight.shape for m in net.old_branch if isinstance(m, nn.Linear)] == [(8, 4), (4, 8)]
    assert [m.weight.shape for m in net.side_branch if isinstance(m, nn.Linear)] == [(6, 3), (4, 6)]
    linears = [m for m in net.mixer if isinstance(m, nn.Linear)]
    assert [m.weight.shape for m in linears] == [(5, 8), (5, 5), (2, 5)]
    assert [m.bias is not None for m in linears] == [False, False, True]
    assert [type(m) for m in net.old_branch] == [nn.Linear, nn.BatchNorm1d, nn.ReLU] * 2
    assert sum(p.numel() for p in adapter.parameters()) == 88 + 62 + 97
    assert adapter.eval().forward(torch.randn(7, 4), torch.randn(7, 3)).shape == (7, 2)


@pytest.mark.parametrize("side, expected",
                         [(3.0, 20 * K ** 3 + 0.5), (-3.0, 8 * K ** 3 + 0.5), (None, 16 * K ** 3 + 0.5)])
def test_the_map_in_eval_mode_by_hand(side, expected):
    """One-dimensional old, side and new features, mixer of one unit, every weight 1, last bias 0.5. Old x = 2:
    2 -> (2k, 2k) -> (4k², 4k²). Side 3: (6k², 6k²); mixer 4k²+4k²+6k²+6k² = 20k² -> 20k³ -> 20k³ + 0.5. Side -3:
    batch norm before ReLU gives -3k -> 0, so the mixer sees 8k². Without side information the side branch reads
    the old feature again (ml-fct without a side-information model): 16k³ + 0.5."""
    adapter = built({"hidden": 1, "layers": 1}, old_dim=1, new_dim=1, side_dim=0 if side is None else 1)
    unit_network(adapter)
    with torch.no_grad():
        mapped = adapter.eval().forward(torch.tensor([[2.0]]), None if side is None else torch.tensor([[side]]))
    assert mapped.item() == pytest.approx(expected, rel=1e-6)


def test_use_side_info_false_reads_the_old_feature_in_the_side_branch():
    adapter = built({"hidden": 6, "use_side_info": False}, old_dim=4, new_dim=3, side_dim=5)
    assert adapter.net.side_branch[0].in_features == 4
    adapter.eval()
    old = torch.randn(5, 4)
    assert torch.equal(adapter.forward(old, torch.randn(5, 5)), adapter.net(old, old))


def test_a_gallery_without_the_side_information_it_was_fitted_with_is_one_line():
    adapter = built({"hidden": 6}, old_dim=4, new_dim=3, side_dim=5)
    with pytest.raises(AdapterError, match="fitted with side information"):
        adapter.forward(torch.randn(2, 4))


def test_the_loss_gradient_of_the_last_bias_by_hand_and_every_gradient_by_finite_differences():
    """loss = mean_i ‖h_i - y_i‖², so d loss / d b (the last layer's bias) = 2 mean_i (h_i - y_i); every parameter's
    gradient of the network under that loss, batch statistics included, agrees with central differences (float64)."""
    torch.manual_seed(0)
    adapter = built({"hidden": 6}, old_dim=4, new_dim=3, side_dim=2).train()
    old, side, new = torch.randn(8, 4), torch.randn(8, 2), torch.randn(8, 3)
    pair = FeaturePair(old, new, torch.zeros(8, dtype=torch.long), side=side)
    loss = adapter.batch_loss(pair, torch.arange(8))
    loss.backward()
    with torch.no_grad():
        mapped = adapter.net(old, side)
    assert torch.allclose(adapter.net.mixer[-1].bias.grad, 2 * (mapped - new).mean(dim=0), atol=1e-6)

    net = copy.deepcopy(adapter.net).double()
    names = [n for n, _ in net.named_parameters()]
    buffers = {n: b.clone() for n, b in net.named_buffers()}
    old, side, new = old.double(), side.double(), new.double()

    def loss_of(*params: torch.Tensor) -> torch.Tensor:
        state = dict(zip(names, params, strict=True)) | {n: b.clone() for n, b in buffers.items()}
        return (torch.func.functional_call(net, state, (old, side)) - new).pow(2).sum(dim=1).mean()

    values = tuple(p.detach().clone().requires_grad_() for p in net.parameters())
    assert loss_of(*values).item() == pytest.approx(loss.item(), rel=1e-5)
    assert torch.autograd.gradcheck(loss_of, values, eps=1e-6, atol=1e-6)


def test_batches_of_one_item_are_left_to_the_next_epoch():
    """9 fitting items in batches of 4: 4, 4, and the ninth waits for the next epoch's draw (batch norm needs two)."""
    adapter = make_adapter("fct", {"fct": {"batch_size": 4, "holdout": 0.0, "max_steps": 6, "hidden": 4}})
    sizes = []
    original = type(adapter).batch_loss

    def recorded(data, idx):
        sizes.append(len(idx))
        return original(adapter, data, idx)

    adapter.batch_loss = recorded
    old, new = torch.randn(9, 4), torch.randn(9, 3)
    fit_adapter(adapter, FeaturePair(old, new, torch.zeros(9, dtype=torch.long)), seed=0)
    assert sizes == [4] * 6


def test_held_out_checks_move_no_running_statistics():
    """Held-out items are scored in eval mode: the kept weights' batch count is the step they were kept at."""
    adapter = make_adapter("fct", {"fct": {"batch_size": 8, "max_steps": 12, "check_every": 3, "hidden": 4}})
    old, new = torch.randn(60, 4), torch.randn(60, 3)
    log = fit_adapter(adapter, FeaturePair(old, new, torch.zeros(60, dtype=torch.long)), seed=0)
    assert log["holdout_items"] == 6
    for module in adapter.modules():
        if isinstance(module, nn.BatchNorm1d):
            assert int(module.num_batches_tracked) == log["best_step"]


def test_batch_norm_needs_two_items_one_line_each():
    with pytest.raises(AdapterError, match=r"adapter_params\.fct\.batch_size = 1: network side_projection"):
        make_adapter("fct", {"fct": {"batch_size": 1}})
    assert make_adapter("fct", {"fct": {"batch_size": 1, "network": "mlp"}}).config.batch_size == 1
    with pytest.raises(AdapterError, match="1 fitting item"):
        fit_adapter(make_adapter("fct", {}), FeaturePair(torch.randn(1, 4), torch.randn(1, 3),
                                                         torch.zeros(1, dtype=torch.long)), seed=0)


def test_the_mlp_option_is_the_plain_mlp_on_old_and_side():
    """[old, side] (4 + 3) -> 5 -> 5 -> 2 with biases and ReLU: 7·5 + 5 + 5·5 + 5 + 5·2 + 2 = 82 parameters."""
    adapter = built({"network": "mlp", "hidden": 5}, old_dim=4, new_dim=2, side_dim=3)
    assert [type(m) for m in adapter.net] == [nn.Linear, nn.ReLU, nn.Linear, nn.ReLU, nn.Linear]
    assert sum(p.numel() for p in adapter.parameters()) == 82
    old, side = torch.randn(3, 4), torch.randn(3, 3)
    assert torch.equal(adapter.forward(old, side), adapter.net(torch.cat([old, side], dim=1)))


def test_defaults_fct_is_ml_fct_network_fastfill_keeps_the_mlp():
    fct, fastfill = make_adapter("fct", {}).config, make_adapter("fastfill", {}).config
    assert (fct.network, fct.hidden, fct.layers) == ("side_projection", 2048, 2)
    assert (fastfill.network, fastfill.hidden, fastfill.layers) == ("mlp", 1024, 2)
    with pytest.raises(AdapterError, match="choose from"):
        make_adapter("fct", {"fct": {"network": "resnet"}})


def test_fastfill_with_the_side_projection_network_has_one_more_output():
    adapter = make_adapter("fastfill", {"fastfill": {"network": "side_projection", "hidden": 6}})
    adapter.build(4, 3, 0)
    assert adapter.net.mixer[-1].out_features == 4 and adapter.net.side_branch[0].in_features == 4
    adapter.eval()
    assert adapter.forward(torch.randn(5, 4)).shape == (5, 3) and adapter.uncertainty(torch.randn(5, 4)).shape == (5,)
