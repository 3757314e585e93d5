"""vec2vec (cl2r_bench/adapters/vec2vec.py, METHODS.md §7): its losses against values worked out by hand, the
discriminator's step before the generator's term, the authors' block layouts, the parity batch moving the loss with
every term, the stopping rule, export and restore, and a fit from the old features of some items and the new
features of others through ``runner.py adapt``; the step against the authors' code: tools/parity/vec2vec.py."""
import json
import math

import numpy as np
import pytest
import torch
from helpers.adapt_inputs import adapt
from torch import nn

from cl2r_bench.adapters import AdapterError, FeaturePair, fit_adapter, list_adapters, make_adapter, unpaired_adapters
from cl2r_bench.adapters.learned import FitProgress
from cl2r_bench.adapters.vec2vec import (
    GanSide,
    ResidualMLP,
    cosine_loss,
    discriminator_loss,
    generator_loss,
    geometry_losses,
    residual,
    vsp_loss,
    warmed_up,
)

SMALL = {"width": 16, "discriminator_width": 16, "batch_size": 32, "check_every": 2}
"""A translator small enough for a fit of a few steps in well under a second."""


def vec2vec(**params):
    return make_adapter("vec2vec", {"vec2vec": {**SMALL, **params}})


def features(n: int, dim: int, seed: int) -> torch.Tensor:
    return torch.nn.functional.normalize(torch.randn(n, dim, generator=torch.Generator().manual_seed(seed)), dim=1)


def test_it_is_registered_fitted_without_pairs_with_both_maps_and_the_authors_depths():
    adapter = make_adapter("vec2vec", {})
    assert "vec2vec" in list_adapters() and "vec2vec" in unpaired_adapters()
    assert adapter.directions == ("backward", "forward") and adapter.fitted_by and "Jha et al." in adapter.reference
    c = adapter.config
    assert (c.adapter_depth, c.transform_depth, c.discriminator_depth, c.batch_size, c.norm) == (3, 4, 5, 256, "batch")
    assert (c.rec_weight, c.vsp_weight, c.cycle_weight, c.cycle_vsp_weight) == (1.0, 1.0, 10.0, 10.0)
    assert (c.adversarial_weight, c.latent_adversarial_weight, c.dropout, c.max_grad_norm) == (1.0, 1.0, 0.1, 1000.0)


def test_the_cosine_and_vsp_losses_by_hand():
    """c: rows (1, 0)·(1, 1)/√2 and (0, 1)·(0, 1): 1 - (1/√2 + 1)/2. V: b = I, a = rows (1, 0) and (0.6, 0.8):
    |I - a aᵀ| has 0.6 twice off the diagonal (mean 0.3), |I - a bᵀ| has 0.6 and 0.2 (mean 0.2); the output's
    scale does not matter."""
    target = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    assert float(cosine_loss(target, torch.tensor([[1.0, 1.0], [0.0, 2.0]]))) == pytest.approx(
        1 - (1 / math.sqrt(2) + 1) / 2, abs=1e-6)
    output = torch.tensor([[1.0, 0.0], [0.6, 0.8]])
    assert float(vsp_loss(target, output)) == pytest.approx(0.3 + 0.2, abs=1e-6)
    assert float(vsp_loss(target, 3 * output)) == pytest.approx(0.5, abs=1e-6)
    assert float(vsp_loss(target, target)) == 0.0


def test_the_least_squares_gan_losses_by_hand():
    """Real scores 0.5, -1 and fake scores 2, 1: ½ [(0.25 + 1)/2 + (1 + 0)/2] = 0.5625; the generator's
    ½ (4 + 1)/2 = 1.25 (real is 0, fake 1: the generator pushes its fakes' scores to 0)."""
    assert float(discriminator_loss(torch.tensor([[0.5], [-1.0]]), torch.tensor([[2.0], [1.0]]))) == 0.5625
    assert float(generator_loss(torch.tensor([[2.0], [1.0]]))) == 1.25
    assert float(discriminator_loss(torch.zeros(3, 1), torch.ones(3, 1))) == 0.0


def test_the_geometry_terms_vanish_on_a_perfect_translator_and_average_the_spaces():
    x, y = features(6, 4, 0), features(5, 3, 1)
    ins = {"old": x, "new": y}
    zero = geometry_losses(ins, ins, ins)
    assert all(float(value) == pytest.approx(0.0, abs=1e-6) for value in zero.values())
    flipped = geometry_losses(ins, {"old": -x, "new": y}, ins)
    assert float(flipped["rec"]) == pytest.approx((2 + 0) / 2, abs=1e-6)   # 1 - cos(x, -x) = 2 on the old side


def test_the_discriminator_steps_first_and_the_generator_term_reads_its_new_weights():
    """D(v) = w·v + b with w = (1, 0), b = 0; reals (1, 0), (0, 1) score 1, 0; fakes (0, 1), (1, 1) score 0, 1.
    Loss ½ [(1 + 0)/2 + (1 + 0)/2] = 0.5; its gradient: w (0.5, -0.5), b 0. Adam's first step moves each weight
    by lr against the sign of its gradient (b, with gradient 0, stays): w = (0.9, 0.1) at lr 0.1, so the fakes
    score 0.1, 1 and the generator's term is ½ (0.01 + 1)/2 = 0.2525 (0.25 with the old weights)."""
    config = vec2vec(discriminator_depth=1, disc_lr=0.1).config
    side = GanSide(2, config, torch.device("cpu"))
    linear = side.discriminator.layers[0][0]
    with torch.no_grad():
        linear.weight.copy_(torch.tensor([[1.0, 0.0]]))
        linear.bias.zero_()
    real, fake = torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([[0.0, 1.0], [1.0, 1.0]], requires_grad=True)
    term = side.step(real, fake)
    assert side.last_loss == pytest.approx(0.5)
    torch.testing.assert_close(linear.weight.grad, torch.tensor([[0.5, -0.5]]))
    torch.testing.assert_close(linear.weight.detach(), torch.tensor([[0.9, 0.1]]), rtol=0, atol=1e-6)
    assert float(linear.bias) == 0.0 and float(term.detach()) == pytest.approx(0.2525, abs=1e-6)
    term.backward()
    assert linear.weight.grad[0, 0] == 0.5 and fake.grad is not None   # the generator's term trains the fakes only


def test_the_residual_blocks_pad_and_truncate_and_follow_the_authors_layout():
    assert residual(torch.tensor([[1.0, 2.0]]), torch.tensor([[10.0, 20.0, 30.0]])).tolist() == [[11.0, 22.0, 30.0]]
    assert residual(torch.tensor([[1.0, 2.0]]), torch.tensor([[10.0]])).tolist() == [[11.0]]
    one = ResidualMLP(1, 2, 8, 3, "batch", 0.1)
    with torch.no_grad():
        one.layers[0][0].weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
        one.layers[0][0].bias.zero_()
    silu = lambda v: v / (1 + math.exp(-v))  # noqa: E731
    expected = [silu(1.0) + 1.0, silu(-2.0) - 2.0, silu(-1.0)]   # x = (1, -2), padded with a zero
    assert one(torch.tensor([[1.0, -2.0]])).flatten().tolist() == pytest.approx(expected, abs=1e-6)
    deep = ResidualMLP(3, 5, 8, 4, "batch", 0.1)
    kinds = [[type(m).__name__ for m in block] for block in deep.layers]
    assert kinds == [["Linear", "SiLU"], ["Linear", "SiLU", "BatchNorm1d", "Dropout"],
                     ["Linear", "Dropout", "SiLU", "Linear"]]
    assert deep.layers[1][3].p == 0.1 and isinstance(ResidualMLP(3, 5, 8, 4, "layer", 0.1).layers[1][2], nn.LayerNorm)


def test_the_learning_rates_warm_up_linearly_from_zero():
    optimizer = torch.optim.Adam([nn.Parameter(torch.zeros(1))], lr=1.0)
    for step, expected in ((0, 0.0), (25, 0.5), (50, 1.0), (80, 1.0)):
        warmed_up(optimizer, 2e-4, step, 50)
        assert optimizer.param_groups[0]["lr"] == pytest.approx(2e-4 * expected)
    warmed_up(optimizer, 2e-4, 0, 0)
    assert optimizer.param_groups[0]["lr"] == 2e-4


def test_the_parity_batch_moves_the_loss_with_every_term_by_its_weight():
    """tools/parity/vec2vec.py's batch is not vacuous: each term moves the total by more than 0.05, by exactly its
    weight times its value (the discriminators' steps do not depend on the generator's weights)."""
    from tools.parity.vec2vec import WEIGHTS, batch_inputs, suite_step, term_moves

    inputs = batch_inputs()
    moves, terms = term_moves(inputs), suite_step(inputs)["terms"]
    assert set(moves) == set(WEIGHTS) and min(moves.values()) > 0.05, moves
    weights = {"rec": 1.0, "vsp": 1.0, "cycle": 10.0, "cycle_vsp": 10.0}
    for term, weight in weights.items():
        assert moves[term] == pytest.approx(weight * terms[term], rel=1e-4)
    assert moves["adversarial (both output spaces)"] == pytest.approx(terms["gen_new"] + terms["gen_old"], rel=1e-4)
    assert moves["latent adversarial"] == pytest.approx(terms["gen_latent"], rel=1e-4)


def unpaired(n_old: int = 40, n_new: int = 30) -> FeaturePair:
    old, new = features(n_old, 8, 2), features(n_new, 6, 3)
    return FeaturePair(old=old, new=new, labels=torch.zeros(0, dtype=torch.long), paired=False)


def test_a_flat_watched_loss_converges_after_patience_checks_but_not_before_min_steps():
    """Learning rates of 1e-12 and LayerNorm (no running statistics) keep the held-out loss flat: the first check
    sets the reference, two more without a fall stop the fit at step 6, or at min_steps 10; the log carries the
    usual convergence fields."""
    frozen = {"lr": 1e-12, "disc_lr": 1e-12, "norm": "layer", "patience": 2, "min_steps": 0}
    log = fit_adapter(vec2vec(**frozen), unpaired(), seed=0)
    assert log["converged"] and log["steps"] == 6 and log["holdout_items"] == 4 + 3
    assert [row[0] for row in log["loss_curve"]] == [2, 4, 6] and log["watched"].startswith("held-out")
    assert (log["old_items"], log["new_items"]) == (40, 30) and all(k in log for k in ("best_step", "loss_curve"))
    later = fit_adapter(vec2vec(**{**frozen, "min_steps": 10}), unpaired(), seed=0)
    assert later["converged"] and later["steps"] == 10
    budget = fit_adapter(vec2vec(max_steps=5, holdout=0.0), unpaired(), seed=0)
    assert not budget["converged"] and budget["steps"] == 5 and budget["holdout_items"] == 0
    assert [row[0] for row in budget["loss_curve"]] == [2, 4, 5]


def test_the_fit_reports_progress_and_never_calls_a_paired_watch():
    lines: list[str] = []
    ticks = iter(range(0, 1000, 10))
    progress = FitProgress("vec2vec", lines.append, clock=lambda: next(ticks))

    def watch(*args):
        raise AssertionError("vec2vec uses no pairs, not even to stop")

    old = features(40, 8, 4)
    paired = FeaturePair(old=old, new=old[:, :6], labels=torch.zeros(40, dtype=torch.long))
    fit_adapter(vec2vec(max_steps=4), paired, seed=0, watch=watch, progress=progress)
    assert lines[0].startswith("vec2vec: step 2 of 4, held-out reconstruction, cycle and VSP loss")
    assert lines[-1].startswith("vec2vec: used its whole budget after 4 steps")


def test_both_maps_are_unit_features_of_the_other_width_and_export_restore_gives_the_same_maps():
    adapter = vec2vec(max_steps=4)
    fit_adapter(adapter, unpaired(), seed=0)
    new, old = features(5, 6, 7), features(5, 8, 8)
    with torch.no_grad():
        back, forth = adapter.backward(new), adapter.forward(old)
    assert back.shape == (5, 8) and forth.shape == (5, 6)
    torch.testing.assert_close(back.norm(dim=1), torch.ones(5))
    exported = adapter.export()
    assert exported["dims"] == [8, 6, 0] and not any("discriminator" in key for key in exported["state"])
    assert any(key.endswith("running_mean") for key in exported["state"])
    restored = vec2vec(max_steps=4).restore(exported)
    with torch.no_grad():
        assert torch.equal(restored.backward(new), back) and torch.equal(restored.forward(old), forth)


def test_too_few_items_and_bad_settings_are_one_line_errors():
    one = FeaturePair(old=features(1, 8, 0), new=features(5, 6, 1), labels=torch.zeros(0, dtype=torch.long),
                      paired=False)
    with pytest.raises(AdapterError, match=r"needs at least 2 items of each model .*1 old, 5 new") as error:
        fit_adapter(vec2vec(), one, seed=0)
    assert "\n" not in str(error.value)
    for params, fragment in (({"norm": "group"}, "adapter_params.vec2vec.norm = 'group'; choose from"),
                             ({"width": 0}, "adapter_params.vec2vec.width = 0 must be at least 1"),
                             ({"batch_size": 1}, "adapter_params.vec2vec.batch_size = 1 must be at least 2"),
                             ({"dropout": 1.0}, "adapter_params.vec2vec.dropout = 1.0 must be at least 0 and below 1"),
                             ({"epochs": 3}, "adapter_params.vec2vec.epochs")):
        with pytest.raises(AdapterError, match=fragment) as error:
            make_adapter("vec2vec", {"vec2vec": params})
        assert "\n" not in str(error.value)


def test_it_fits_on_the_old_and_new_embeddings_of_different_items_through_adapt(rotated, tmp_path, capsys):
    """runner.py adapt --train-old / --train-new: the old model's embeddings of 70 items and the new model's of 50
    others; the record has the fit's counts, both maps' cases and the negative flips; the exported programs are the
    fitted maps; a bad setting is one line."""
    train, test = rotated
    with np.load(train) as z:
        np.save(tmp_path / "old_items.npy", z["old"][:70])
        np.save(tmp_path / "new_items.npy", z["new"][70:])
    given = ["--train-old", tmp_path / "old_items.npy", "--train-new", tmp_path / "new_items.npy", "--test", test,
             "--adapter", "vec2vec"]
    quick = [option for key, value in {**SMALL, "max_steps": 4}.items()
             for option in ("--set", f"adapter_params.vec2vec.{key}={value}")]
    code, out = adapt(*given, *quick, "--output", tmp_path / "out", "--seeds", 0, "--export", tmp_path / "export",
                      capsys=capsys)
    assert code == 0, out.err
    record = json.loads(next((tmp_path / "out").rglob("metrics.json")).read_text())
    fit = record["adapter"]["fits"][0]
    assert (fit["old_items"], fit["new_items"], fit["pairing"]) == (70, 50, "unpaired") and fit["steps"] == 4
    cases = record["retrieval"]["cases"]
    assert cases["B/old"] is not None and cases["new/F"] is not None
    assert record["retrieval"]["negative_flips"]["cross"][0] is not None
    export = tmp_path / "export" / "vec2vec"
    adapter = make_adapter("vec2vec", {"vec2vec": {**SMALL, "max_steps": 4}}).restore(
        torch.load(export / "adapter_state.pt", weights_only=True))
    queries, gallery = features(4, 8, 5), features(3, 8, 6)
    with torch.no_grad():
        torch.testing.assert_close(torch.export.load(export / "backward.pt2").module()(queries),
                                   adapter.backward(queries))
        torch.testing.assert_close(torch.export.load(export / "forward.pt2").module()(gallery),
                                   adapter.forward(gallery))
    code, out = adapt(*given, "--set", "adapter_params.vec2vec.width=0", "--output", tmp_path / "bad", capsys=capsys)
    assert code == 2 and out.err.strip().count("\n") == 0 and "adapter_params.vec2vec.width = 0" in out.err
