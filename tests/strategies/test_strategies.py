import copy
import math
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from cl2r_bench.data.datasets import ImageSet
from cl2r_bench.data.transforms import random_crop_flip
from cl2r_bench.heads import simplex_vertices
from cl2r_bench.models import build_model
from cl2r_bench.training.engine import cosine_lr, make_optimizer, update_memory
from cl2r_bench.training.loop import train_task
from cl2r_bench.training_settings import TrainSettings
from strategies import Step, Strategy, StrategyError, get_strategy, list_strategies, register_strategy
from strategies.dsimplex_hoc import DSimplexHOC, hoc_loss
from strategies.er import ExperienceReplay

OLD = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
NEW = torch.tensor([[0.6, 0.8], [1.0, 0.0], [-0.6, 0.8]])
LABELS = torch.tensor([0, 0, 1])


def reference_hoc(old, new, labels, mu, mask):
    total = 0.0
    n = len(labels)
    for i in range(n):
        s_ii = mu * float(old[i] @ new[i])
        denominator = 0.0
        for j in range(n):
            s_ij = mu * float(old[i] @ new[j])
            if labels[j] != labels[i]:
                denominator += math.exp(s_ij)
            elif mask == "zero":
                denominator += 1.0
            elif j == i:
                denominator += math.exp(s_ij)
        total += -s_ii + math.log(denominator)
    return total / n


def random_unit(n, d, seed):
    return F.normalize(torch.randn(n, d, generator=torch.Generator().manual_seed(seed)), dim=1)


def test_hoc_loss_worked_example_zero_mask():
    # S = 10 * OLD @ NEW.T = [[6, 10, -6], [9.6, 8, 0], [8, 0, 8]]
    # l_0 = -6 + log(e^-6 + 2), l_1 = -8 + log(e^0 + 2), l_2 = -8 + log(e^8 + e^0 + 1)
    expected = (-6 + math.log(math.exp(-6) + 2) - 8 + math.log(3) - 8 + math.log(math.exp(8) + 2)) / 3
    assert expected == pytest.approx(-4.069, abs=1e-3)
    assert float(hoc_loss(OLD, NEW, LABELS, mu=10.0, mask="zero")) == pytest.approx(-4.069, abs=1e-3)
    assert float(hoc_loss(OLD, NEW, LABELS, mu=10.0, mask="zero")) == pytest.approx(expected, abs=1e-5)


def test_hoc_loss_worked_example_true_mask():
    # l_0 = -6 + log(e^6 + e^-6), l_1 = -8 + log(e^8 + e^0), l_2 = -8 + log(e^8 + e^8 + e^0)
    rows = [-6 + math.log(math.exp(6) + math.exp(-6)),
            -8 + math.log(math.exp(8) + math.exp(0)),
            -8 + math.log(math.exp(8) + math.exp(8) + math.exp(0))]
    expected = sum(rows) / 3
    assert expected == pytest.approx(0.2312, abs=1e-4)
    assert float(hoc_loss(OLD, NEW, LABELS, mu=10.0, mask="true")) == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("mask", ["zero", "true"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hoc_loss_matches_double_loop(mask, seed):
    old, new = random_unit(12, 6, seed), random_unit(12, 6, seed + 100)
    labels = torch.randint(0, 4, (12,), generator=torch.Generator().manual_seed(seed))
    mu = 10.0 if seed else 3.0
    expected = reference_hoc(old.double(), new.double(), labels, mu, mask)
    assert float(hoc_loss(old, new, labels, mu=mu, mask=mask)) == pytest.approx(expected, abs=1e-4)


def dsimplex_step(teacher=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (8,), generator=gen)
    return Step(labels=labels, targets=1023 - labels, logits=torch.randn(8, 1024, generator=gen),
                features=3 * torch.randn(8, 1023, generator=gen), from_memory=torch.zeros(8, dtype=torch.bool),
                teacher_features=random_unit(8, 1023, seed + 1) if teacher else None)


def test_dsimplex_hoc_loss_mixes_ce_and_hoc():
    step = dsimplex_step()
    strategy = get_strategy("dsimplex_hoc").from_params({})
    ce = float(F.cross_entropy(step.logits, step.targets))
    hoc = reference_hoc(step.teacher_features.double(), F.normalize(step.features.double(), dim=1),
                        step.labels, 10.0, "zero")
    assert float(strategy.loss(step)) == pytest.approx(0.1 * ce + 0.9 * hoc, abs=1e-4)


def test_dsimplex_hoc_loss_custom_params():
    step = dsimplex_step(seed=3)
    strategy = DSimplexHOC.from_params({"ce_weight": 0.5, "hoc_weight": 2, "mu": 4.0, "mask": "true"})
    ce = float(F.cross_entropy(step.logits, step.targets))
    hoc = reference_hoc(step.teacher_features.double(), F.normalize(step.features.double(), dim=1),
                        step.labels, 4.0, "true")
    assert float(strategy.loss(step)) == pytest.approx(0.5 * ce + 2 * hoc, abs=1e-4)


def test_dsimplex_hoc_without_teacher_is_plain_ce():
    step = dsimplex_step(teacher=False)
    loss = DSimplexHOC.from_params({}).loss(step)
    assert torch.allclose(loss, F.cross_entropy(step.logits, step.targets))


def test_er_loss_is_cross_entropy():
    gen = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 5, (6,), generator=gen)
    step = Step(labels=labels, targets=labels, logits=torch.randn(6, 5, generator=gen),
                features=torch.randn(6, 16, generator=gen), from_memory=torch.zeros(6, dtype=torch.bool))
    strategy = get_strategy("er").from_params({})
    assert isinstance(strategy, ExperienceReplay)
    assert torch.allclose(strategy.loss(step), F.cross_entropy(step.logits, labels))


def test_registered_strategies_and_heads():
    assert {"dsimplex_hoc", "er"} <= set(list_strategies())
    assert get_strategy("dsimplex_hoc").head == "dsimplex"
    assert get_strategy("dsimplex_hoc").needs_teacher
    assert get_strategy("er").head == "learnable"
    assert not get_strategy("er").needs_teacher


def test_unknown_strategy_lists_valid_names():
    with pytest.raises(StrategyError, match="nope") as info:
        get_strategy("nope")
    assert "dsimplex_hoc" in str(info.value)
    assert "'er'" in str(info.value)


@dataclass(frozen=True)
class ToyConfig:
    weight: float = 1.0


def test_register_and_duplicate_registration():
    name = "toy_test_only_registry_dup"

    @register_strategy(name)
    class Toy(Strategy):
        Config = ToyConfig

    assert get_strategy(name) is Toy
    assert Toy.name == name
    assert Toy.from_params({"weight": 2}).config.weight == 2

    with pytest.raises(StrategyError, match=name):
        @register_strategy(name)
        class Again(Strategy):
            pass

    assert get_strategy(name) is Toy


def test_register_with_bad_head_raises():
    with pytest.raises(StrategyError, match="head"):
        @register_strategy("toy_test_only_bad_head")
        class BadHead(Strategy):
            head = "linear"

    with pytest.raises(StrategyError):
        get_strategy("toy_test_only_bad_head")


@pytest.mark.parametrize("params", [
    {"lambda": 1.0},
    {"mu": "ten"},
    {"mu": True},
    {"mask": 3},
    {"mask": "bogus"},
])
def test_from_params_rejects_bad_params(params):
    with pytest.raises(StrategyError):
        get_strategy("dsimplex_hoc").from_params(params)


def test_from_params_unknown_key_lists_valid_keys():
    with pytest.raises(StrategyError, match="mu"):
        get_strategy("dsimplex_hoc").from_params({"lambda": 1.0})


def test_from_params_defaults_and_int_for_float():
    config = get_strategy("dsimplex_hoc").from_params({"mu": 10}).config
    assert (config.ce_weight, config.hoc_weight, config.mu, config.mask) == (0.1, 0.9, 10, "zero")


def test_er_rejects_any_params():
    with pytest.raises(StrategyError):
        get_strategy("er").from_params({"lr": 0.1})


def test_cosine_lr_endpoints_and_midpoint():
    assert cosine_lr(0, 100, 0.1, 0.001) == pytest.approx(0.1)
    assert cosine_lr(100, 100, 0.1, 0.001) == pytest.approx(0.001)
    assert cosine_lr(50, 100, 0.1, 0.001) == pytest.approx(0.0505)
    assert cosine_lr(150, 100, 0.1, 0.001) == pytest.approx(0.001)


def test_make_optimizer_skips_decay_on_vectors():
    model = build_model(backbone="small_cnn", head="learnable", num_classes=4, small_width=8, small_out_dim=16)
    settings = TrainSettings.with_defaults(lr=0.05, weight_decay=1e-3)
    optimizer = make_optimizer(model, settings)
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 1e-3
    assert no_decay["weight_decay"] == 0.0
    assert decay["params"] and all(p.ndim > 1 for p in decay["params"])
    assert no_decay["params"] and all(p.ndim <= 1 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
    assert optimizer.defaults["momentum"] == 0.9
    assert optimizer.defaults["lr"] == 0.05


def train_steps_under_scaler(model, optimizer, overflow_steps, steps=5, seed=0):
    """``steps`` float16-style steps of ``optimizer`` under a gradient scaler (on the CPU), the loss made infinite at
    ``overflow_steps`` so that the scaler skips them; after step 2 the optimizer's state is cleared, all of it (as
    Avalanche resets it between experiences), and after step 3 the first parameter's alone."""
    scaler = torch.amp.GradScaler("cpu")
    images, labels = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(seed)), torch.arange(8) % 4
    for step in range(steps):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images)[0], labels) * (math.inf if step in overflow_steps else 1.0)
        for group in optimizer.param_groups:
            group["lr"] = 0.05 / (step + 1)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        if step == 2:
            optimizer.state.clear()
        if step == 3:
            optimizer.state.pop(optimizer.param_groups[0]["params"][0], None)


def small_model():
    torch.manual_seed(0)
    return build_model(backbone="small_cnn", head="learnable", num_classes=4, small_width=8, small_out_dim=16)


def optimizer_of(model, fused):
    return make_optimizer(model, TrainSettings.with_defaults(lr=0.05, weight_decay=1e-3, fused_optimizer=fused))


def assert_same_weights(first, second):
    for weight, other in zip(first.parameters(), second.parameters(), strict=True):
        torch.testing.assert_close(weight, other, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("overflow_steps", [(), (0,), (0, 4), (1,)])
def test_fused_optimizer_changes_how_sgd_is_launched_not_what_it_computes(overflow_steps):
    """``training.fused_optimizer`` leaves the weights of torch's unfused update (momentum, weight decay on the
    decayed group only, a changing learning rate, state cleared in whole and in part), also where the gradient scaler
    skips a first step: torch's own fused SGD then reads uninitialised momentum (ZeroStartSGD)."""
    model = small_model()
    models = {fused: copy.deepcopy(model) for fused in (True, False)}
    optimizers = {fused: optimizer_of(m, fused) for fused, m in models.items()}
    assert optimizers[True].defaults["fused"] and not optimizers[False].defaults["fused"]
    for fused, m in models.items():
        train_steps_under_scaler(m, optimizers[fused], overflow_steps)
    moved = [(a - b).abs().max().item() for a, b in zip(model.parameters(), models[True].parameters(), strict=True)]
    assert min(moved) > 0
    assert_same_weights(models[True], models[False])


def test_a_first_step_the_scaler_skips_leaves_zero_momentum_and_the_weights_as_they_were():
    model = small_model()
    before = copy.deepcopy(model)
    optimizer = optimizer_of(model, fused=True)
    train_steps_under_scaler(model, optimizer, overflow_steps=(0,), steps=1)
    assert_same_weights(model, before)
    buffers = [optimizer.state[p]["momentum_buffer"] for p in model.parameters() if p.grad is not None]
    assert buffers and all(torch.count_nonzero(b) == 0 for b in buffers)


@pytest.mark.parametrize("saved_fused", [False, True])
def test_a_saved_state_loads_into_either_optimizer_and_keeps_its_kind_of_update(saved_fused):
    """A pretraining's progress file saved by one kind of update resumes under the other: the loaded optimizer keeps
    its own (with float16 the gradient scaler hands a fused optimizer its overflow check, and an unfused step would
    refuse it), and both reach the same weights."""
    model = small_model()
    saved = optimizer_of(model, saved_fused)
    train_steps_under_scaler(model, saved, overflow_steps=(), steps=2)
    resumed = {fused: copy.deepcopy(model) for fused in (True, False)}
    for fused, m in resumed.items():
        optimizer = optimizer_of(m, fused)
        optimizer.load_state_dict(copy.deepcopy(saved.state_dict()))
        assert bool(optimizer.param_groups[0]["fused"]) is fused
        train_steps_under_scaler(m, optimizer, overflow_steps=(1,), steps=3, seed=1)
    assert_same_weights(resumed[True], resumed[False])


def indexed_set(counts, first_label=0):
    labels = torch.cat([torch.full((n,), first_label + c, dtype=torch.long) for c, n in enumerate(counts)])
    images = torch.arange(len(labels), dtype=torch.uint8).view(-1, 1, 1, 1).expand(-1, 3, 2, 2).clone()
    return ImageSet(images, labels)


def test_update_memory_per_class_counts():
    data = indexed_set([5, 3, 10])
    memory = update_memory(None, data, 4, torch.Generator().manual_seed(0))
    assert torch.bincount(memory.labels).tolist() == [4, 3, 4]
    picked = memory.images[:, 0, 0, 0].long()
    assert torch.equal(data.labels[picked], memory.labels)
    assert len(set(picked.tolist())) == 11


def test_update_memory_accumulates():
    gen = torch.Generator().manual_seed(0)
    memory = update_memory(None, indexed_set([5, 3]), 2, gen)
    memory = update_memory(memory, indexed_set([6, 1], first_label=2), 2, gen)
    assert torch.bincount(memory.labels).tolist() == [2, 2, 2, 1]
    assert memory.images.shape == (7, 3, 2, 2)


def test_update_memory_deterministic_for_seed():
    data = indexed_set([20, 20, 20])
    first = update_memory(None, data, 5, torch.Generator().manual_seed(7))
    second = update_memory(None, data, 5, torch.Generator().manual_seed(7))
    other = update_memory(None, data, 5, torch.Generator().manual_seed(8))
    assert torch.equal(first.images, second.images)
    assert torch.equal(first.labels, second.labels)
    assert not torch.equal(first.images, other.images)


def test_train_task_keeps_teacher_frozen():
    torch.manual_seed(0)
    model = build_model(backbone="small_cnn", head="dsimplex", num_classes=4, small_width=8, small_out_dim=16,
                        mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    teacher = copy.deepcopy(model)
    teacher_before = {k: v.clone() for k, v in teacher.state_dict().items()}
    model_before = {k: v.clone() for k, v in model.named_parameters()}
    gen = torch.Generator().manual_seed(0)
    data = ImageSet(torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8, generator=gen),
                    torch.arange(64) % 4)
    settings = TrainSettings.with_defaults(epochs=1, batch_size=16, progress=False, lr=0.01)
    result = train_task(model, get_strategy("dsimplex_hoc").from_params({}), data, None, settings, teacher=teacher)
    assert all(torch.equal(teacher_before[k], v) for k, v in teacher.state_dict().items())
    assert all(not p.requires_grad for p in teacher.parameters())
    assert not teacher.training
    assert any(not torch.equal(model_before[k], p) for k, p in model.named_parameters())
    assert torch.equal(model.head.vertices, simplex_vertices(1024))
    assert result["iterations"] == 4
    assert result["images"] == 64
    assert math.isfinite(result["final_loss"])


def test_random_crop_flip_keeps_shape():
    images = torch.randint(0, 256, (5, 3, 32, 32), dtype=torch.uint8)
    out = random_crop_flip(images)
    assert out.shape == images.shape
    assert out.dtype == torch.uint8


def test_random_crop_flip_without_padding_is_identity_or_flip():
    torch.manual_seed(0)
    images = torch.randint(0, 256, (32, 3, 8, 8), dtype=torch.uint8)
    out = random_crop_flip(images, padding=0)
    same = (out == images).flatten(1).all(1)
    flipped = (out == images.flip(3)).flatten(1).all(1)
    assert bool((same | flipped).all())
    assert bool(same.any()) and bool(flipped.any())
