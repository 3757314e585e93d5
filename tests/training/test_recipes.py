"""The authors' recipes (``training.recipe: authors``, docs/strategies.md): each strategy's optimiser and schedule over
the run's training settings, the schedules against torch's own, and the run that names and records them."""
import math

import pytest
import torch

from cl2r_bench.app.assembly import assemble
from cl2r_bench.app.run_options import expanded_strategies
from cl2r_bench.config import resolve
from cl2r_bench.errors import ConfigError
from cl2r_bench.strategy import StrategyError
from cl2r_bench.training.engine import ZeroStartSGD, make_optimizer, scheduled_lr
from cl2r_bench.training.trainers import strategy_training
from cl2r_bench.training_settings import RECIPE_KEYS, TrainSettings
from strategies import get_strategy, list_strategies


def lrs(settings: TrainSettings, per_epoch: int) -> list[float]:
    return [scheduled_lr(i, per_epoch, settings) for i in range(settings.epochs * per_epoch)]


def test_multistep_is_torch_multisteplr_stepped_per_epoch():
    settings = TrainSettings.with_defaults(epochs=8, lr=0.1, schedule="multistep", milestones=[2, 5], gamma=0.1)
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[2, 5], gamma=0.1)
    for epoch in range(8):
        for iteration in (epoch * 3, epoch * 3 + 2):
            assert scheduled_lr(iteration, 3, settings) == pytest.approx(optimizer.param_groups[0]["lr"], rel=1e-12)
        optimizer.step()
        scheduler.step()


def test_warmup_then_cosine_to_zero_by_hand():
    """BT²'s and OCA's: 5 warm-up epochs at lr (e + 1) / 5, then cosine over the remaining 5 epochs from lr to 0."""
    settings = TrainSettings.with_defaults(epochs=10, lr=1e-3, lr_min=0.0, warmup_epochs=5)
    per_epoch = lrs(settings, 2)[::2]
    assert per_epoch[:5] == pytest.approx([2e-4, 4e-4, 6e-4, 8e-4, 1e-3])
    assert per_epoch[5:] == pytest.approx([1e-3 * 0.5 * (1 + math.cos(math.pi * k / 5)) for k in range(5)])


def test_iteration_warmup_ramps_every_iteration_then_cosine_per_iteration():
    """RACT's: one warm-up epoch of 4 iterations at lr (i + 1) / 4, then cosine over the other 2 x 4 iterations."""
    settings = TrainSettings.with_defaults(epochs=3, lr=0.1, lr_min=0.001, schedule_step="iteration",
                                           warmup_epochs=1)
    assert lrs(settings, 4) == pytest.approx([0.025, 0.05, 0.075, 0.1] + [
        0.001 + 0.5 * 0.099 * (1 + math.cos(math.pi * k / 8)) for k in range(8)])


def test_poly_power_two_per_iteration_by_hand():
    """MixBCT's PolyScheduler without warm-up: lr (1 - i / I)^2 over I = 4 x 5 iterations."""
    settings = TrainSettings.with_defaults(epochs=4, lr=0.1, schedule="poly", power=2.0)
    assert lrs(settings, 5) == pytest.approx([0.1 * (1 - i / 20) ** 2 for i in range(20)])


@pytest.mark.parametrize("changes, message", [({"schedule": "step"}, "training.schedule"),
                                              ({"milestones": [5, 2]}, "training.milestones"),
                                              ({"gamma": 0.0}, "training.gamma"),
                                              ({"warmup_epochs": 10, "epochs": 10}, "training.warmup_epochs"),
                                              ({"optimizer": "lamb"}, "training.optimizer"),
                                              ({"recipe": "paper"}, "training.recipe")])
def test_bad_recipe_settings_are_one_line_errors(changes, message):
    with pytest.raises(ConfigError, match=message):
        TrainSettings.with_defaults(**changes)


def test_optimiser_kinds_keep_the_decay_groups():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    for kind, expected in (("sgd", ZeroStartSGD), ("adam", torch.optim.Adam), ("adamw", torch.optim.AdamW)):
        optimizer = make_optimizer(model, TrainSettings.with_defaults(optimizer=kind, nesterov=kind == "sgd"))
        assert type(optimizer) is expected
        decayed, free = optimizer.param_groups
        assert [p.shape for p in decayed["params"]] == [(4, 3)] and decayed["weight_decay"] == 5e-4
        assert free["weight_decay"] == 0.0 and len(free["params"]) == 3
    assert optimizer.defaults["betas"] == (0.9, 0.999)


def test_every_declared_recipe_is_valid_and_applied_over_the_shared_settings():
    shared = TrainSettings.with_defaults(epochs=10, recipe="authors")
    for name in list_strategies():
        strategy = get_strategy(name).from_params({})
        if not strategy.authors_recipe:
            continue
        assert set(strategy.authors_recipe) <= set(RECIPE_KEYS) and strategy.authors_recipe_source, name
        trained = strategy_training(shared, strategy)
        for key, value in strategy.authors_recipe.items():
            assert getattr(trained, key) == value, (name, key)
        assert (trained.batch_size, trained.amp) == (shared.batch_size, shared.amp)
    lce = strategy_training(shared, get_strategy("lce").from_params({}))
    assert (lce.optimizer, lce.lr, lce.epochs, lce.milestones) == ("adam", 3.5e-4, 60, [20, 40])
    assert strategy_training(TrainSettings.with_defaults(), get_strategy("lce").from_params({})).optimizer == "sgd"


def test_a_strategy_without_a_recipe_is_refused_and_left_out_of_all():
    with pytest.raises(StrategyError, match="declares no authors' recipe"):
        strategy_training(TrainSettings.with_defaults(recipe="authors"), get_strategy("cvs").from_params({}))
    authors = expanded_strategies("authors")
    assert "lce" in authors and not {"cvs", "lwf", "cores"} & set(authors)
    assert expanded_strategies("shared") == list_strategies()


def test_a_run_with_the_authors_recipe_is_named_and_records_what_trained_it(tiny):
    import yaml

    layers = [("tiny", yaml.safe_load(tiny.read_text())),
              ("command line", {"strategy": "lce", "training": {"recipe": "authors"}})]
    parts = assemble(resolve(layers))
    assert parts.label == "lce.authors" and parts.directory.parent.name == "lce.authors"
    assert parts.config["training"]["optimizer"] == "adam" and parts.config["training"]["epochs"] == 60
    assert parts.trainer.settings.milestones == [20, 40]
    assert parts.settings.training.optimizer == "sgd"               # what pretraining reads stays the run's own
    pretraining = parts.settings.replacement.pretrain.train_settings(parts.settings.training)
    assert (pretraining.optimizer, pretraining.schedule, pretraining.recipe) == ("sgd", "cosine", "shared")


def test_a_run_of_the_other_teacher_arm_is_named_by_it(tiny):
    """bct's default is outgoing: incoming is the other arm (bct.incoming); d-Simplex-HOC's default is incoming."""
    import yaml

    base = yaml.safe_load(tiny.read_text())
    for strategy, teacher, label in (("bct", "incoming", "bct.incoming"), ("bct", "outgoing", "bct"),
                                     ("dsimplex_hoc", "outgoing", "dsimplex_hoc.outgoing")):
        layers = [("tiny", base), ("command line", {"strategy": strategy, "strategy_params": {
            strategy: {"replacement_teacher": teacher}}})]
        assert assemble(resolve(layers)).label == label


def test_a_named_variant_is_labelled_after_its_arm_and_recipe_and_a_dotted_name_is_refused(tiny):
    """``variant`` names a run of other settings, ``<strategy>[.<arm>][.authors].<variant>``, so that ``compare
    --variants`` pairs it with its experiment (splitting at the last dot)."""
    import yaml

    from cl2r_bench.errors import ConfigError

    base = yaml.safe_load(tiny.read_text())
    for command, label in (({"strategy": "bt2", "variant": "cayley"}, "bt2.cayley"),
                           ({"strategy": "bct", "variant": "x-1", "training": {"recipe": "authors"},
                             "strategy_params": {"bct": {"replacement_teacher": "incoming"}}},
                            "bct.incoming.authors.x-1"),
                           ({"strategy": "bt2", "variant": ""}, "bt2")):
        parts = assemble(resolve([("tiny", base), ("command line", command)]))
        assert parts.label == label and parts.directory.parent.name == label
    with pytest.raises(ConfigError, match="variant = 'a.b'"):
        assemble(resolve([("tiny", base), ("command line", {"strategy": "bt2", "variant": "a.b"})]))


def one_step(clip: float | None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The change of the backbone's and of the head's parameters after one SGD step (lr 1, no momentum, no weight
    decay) of ER on 32 feature items, with the backbone's gradient norm clipped at ``clip``."""
    from cl2r_bench.data.datasets import ImageSet
    from cl2r_bench.models import build_model
    from cl2r_bench.training.loop import train_task

    torch.manual_seed(0)
    model = build_model(head="learnable", num_classes=4, backbone="frozen_encoder", feature_dim=12)
    before = [[p.detach().clone() for p in part.parameters()] for part in (model.backbone, model.head)]
    data = ImageSet(torch.randn(32, 12) * 10, torch.arange(4).repeat(8))
    settings = TrainSettings.with_defaults(epochs=1, lr=1.0, momentum=0.0, weight_decay=0.0, batch_size=32,
                                           progress=False, clip_grad_norm=clip)
    train_task(model, get_strategy("er").from_params({}), data, None, settings)
    return tuple([after.detach() - start for after, start in zip(part.parameters(), old, strict=True)]
                 for part, old in zip((model.backbone, model.head), before, strict=True))


def test_the_clip_rescales_the_backbones_gradient_to_its_norm_and_leaves_the_classifier():
    """MixBCT's and UniBCT's code: ``clip_grad_norm_(backbone.parameters(), 5)`` before each step; at lr 1 the
    backbone's step is minus its clipped gradient, whose norm is the clip where the gradient was longer."""
    backbone, head = one_step(None)
    norm = float(torch.cat([d.flatten() for d in backbone]).norm())
    clip = norm / 4
    clipped_backbone, clipped_head = one_step(clip)
    assert float(torch.cat([d.flatten() for d in clipped_backbone]).norm()) == pytest.approx(clip, rel=1e-4)
    for plain, clipped in zip(backbone, clipped_backbone, strict=True):
        assert torch.allclose(clipped, plain / 4, rtol=1e-3, atol=1e-7)
    for plain, clipped in zip(head, clipped_head, strict=True):
        assert torch.equal(clipped, plain)
    assert one_step(norm * 2)[0][0].equal(backbone[0])


@pytest.mark.parametrize("value", [0, -5, "5", True])
def test_a_bad_clip_is_a_one_line_error(value):
    with pytest.raises(ConfigError, match="training.clip_grad_norm"):
        TrainSettings.with_defaults(clip_grad_norm=value)
