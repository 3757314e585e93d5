"""Avalanche for real: streams whose experiences carry the data, the compatibility plugin, the bridge
that runs any Avalanche strategy, and the example."""
import copy
import json
import pathlib
import subprocess
import sys
import time

import pytest
import torch

from benchmarks.avalanche_plugin import CompatibilityPlugin
from benchmarks.retrieval import CompatibilityEvaluator
from cl2r_bench.data.avalanche_import import DeferredModule, avalanche_warnings_filtered
from cl2r_bench.data.streams import build_stream
from cl2r_bench.models import CheckpointError, build_model
from cl2r_bench.training.avalanche import (
    AvalancheStrategyError,
    HeadGrowthPlugin,
    LogitsOnly,
    ReplacementPlugin,
    build_avalanche_strategy,
    check_params,
    is_avalanche_strategy,
    rebind,
    strategy_names,
    train_on_experience,
    unwrap,
)
from cl2r_bench.training_settings import TrainSettings

ROOT = pathlib.Path(__file__).resolve().parents[2]
SETTINGS = TrainSettings.with_defaults(lr=0.05, lr_min=0.001, momentum=0.9, weight_decay=5e-4, epochs=1, batch_size=16,
                                       progress=False, fused_optimizer=True)


@pytest.fixture(scope="module")
def stream():
    """3 experiences of 4 classes x 12 images on generated data; 4 held-out classes for evaluation."""
    return build_stream(dataset="synthetic", data_root="unused", initial_classes=4, increment=4,
                        num_tasks=3, images_per_class=12, replacement_tasks=[0, 2], eval_dataset="heldout",
                        heldout_classes=4, synthetic={"synthetic_classes": 16, "synthetic_train_per_class": 12,
                                                      "synthetic_test_per_class": 4})


def small_model(stream, num_classes=4, head="learnable"):
    torch.manual_seed(0)
    return build_model(backbone="small_cnn", head=head, num_classes=num_classes, small_width=8, small_out_dim=16,
                       mean=stream.mean, std=stream.std)


def test_experiences_carry_the_images_of_each_task(stream):
    from avalanche.training.utils import load_all_dataset

    experiences = list(stream.benchmark.train_stream)
    assert [task.experience for task in stream.tasks] == experiences
    for task, exp in zip(stream.tasks, experiences, strict=True):
        image, label, task_label = exp.dataset.eval()[0]
        assert image.dtype == torch.uint8 and image.shape == (3, 32, 32) and isinstance(label, int) and task_label == 0
        images, labels, _ = load_all_dataset(exp.dataset.eval())
        assert torch.equal(images, task.train.images) and torch.equal(labels, task.train.labels)
        assert sorted(set(labels.tolist())) == task.new_classes == sorted(exp.classes_in_this_experience)
        assert len(labels) == 12 * len(task.new_classes) and task.num_seen_classes == len(exp.classes_seen_so_far)
    assert exp.task_label == 0


def test_the_train_view_crops_and_flips_uint8_images(stream):
    exp = stream.tasks[0].experience
    torch.manual_seed(0)
    augmented = [exp.dataset.train()[i][0] for i in range(len(exp.dataset))]
    plain = stream.tasks[0].train.images
    assert all(a.dtype == torch.uint8 and a.shape == plain[0].shape for a in augmented)
    assert sum(not torch.equal(a, p) for a, p in zip(augmented, plain, strict=True)) > len(plain) // 2


def test_the_plugin_fills_the_matrix_of_a_frozen_model_like_the_evaluator(stream):
    """A model that never changes (learning rate 0, batch-norm statistics frozen) deployed after every experience:
    each row is the evaluator's row of that model, every entry equals the model's own score, so under the strict
    tie rule no pair is compatible (AC 0) and under the inclusive one every pair is (AC 1)."""
    model = small_model(stream)
    model.head.grow(stream.tasks[-1].num_seen_classes)
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.momentum = 0.0
    reference = CompatibilityEvaluator(stream.query, stream.gallery)
    own = reference.deploy(copy.deepcopy(model))[0]
    plugin = CompatibilityPlugin.from_stream(stream)
    strategy = build_avalanche_strategy("avalanche:Naive", {}, model,
                                        optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
                                        epochs=1, batch_size=16, device="cpu", plugins=[plugin])
    with avalanche_warnings_filtered():
        for exp in stream.benchmark.train_stream:
            strategy.train(exp, eval_streams=[])
    assert plugin.matrix == [[own, None, None], [own, own, None], [own, own, own]]
    assert plugin.evaluator.extractions == {"gallery": 3, "query": 3}
    assert plugin.metrics()["AC"] == 0.0 and plugin.metrics()["AA"] == pytest.approx(100 * own)
    assert CompatibilityPlugin(evaluator=plugin.evaluator, tie_rule="inclusive").metrics()["AC"] == 1.0


def test_the_plugin_publishes_ac_and_aa_to_the_strategy_loggers(stream):
    from avalanche.logging import BaseLogger
    from avalanche.training.plugins import EvaluationPlugin

    class Recorder(BaseLogger):
        def __init__(self):
            super().__init__()
            self.seen = []

        def log_single_metric(self, name, value, x_plot):
            self.seen.append((name, x_plot))

    model, recorder, plugin = small_model(stream), Recorder(), CompatibilityPlugin.from_stream(stream)
    strategy = build_avalanche_strategy("avalanche:Naive", {}, model,
                                        optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
                                        epochs=1, batch_size=16, device="cpu", plugins=[plugin])
    strategy.evaluator = EvaluationPlugin(loggers=[recorder])
    strategy.plugins = [p for p in strategy.plugins if not isinstance(p, EvaluationPlugin)] + [strategy.evaluator]
    with avalanche_warnings_filtered():
        strategy.train(stream.tasks[0].experience, eval_streams=[])
    assert ("Compatibility/AC", 0) in recorder.seen and ("Compatibility/AA", 0) in recorder.seen


def test_strategy_names_and_their_checks():
    names = strategy_names()
    assert {"avalanche:Naive", "avalanche:LwF", "avalanche:EWC", "avalanche:Replay"} <= set(names)
    assert is_avalanche_strategy("avalanche:EWC") and not is_avalanche_strategy("dsimplex_hoc")
    assert check_params("avalanche:EWC", {"ewc_lambda": 0.4}) == {
        "ewc_lambda": 0.4, "mode": "separate", "decay_factor": None, "keep_importance_data": False, "eval_every": -1}
    assert check_params("avalanche:Replay", {"mem_size": 50})["mem_size"] == 50
    assert check_params("avalanche:EWC", {"ewc_lambda": 1, "decay_factor": None})["ewc_lambda"] == 1


@pytest.mark.parametrize("name, params, words", [
    ("avalanche:Nope", {}, ["unknown Avalanche strategy 'avalanche:Nope'", "avalanche:Naive"]),
    ("avalanche:PackNet", {}, ["needs a PackNet model", "choose from"]),
    ("avalanche:EWC", {"ewc_lambda": 0.4, "lamda": 1}, ["unknown key(s) ['lamda']", "'ewc_lambda'"]),
    ("avalanche:Naive", {"optimizer": "adam"}, ["['optimizer'] are set by the suite", "valid keys"]),
    ("avalanche:EWC", {}, ["['ewc_lambda'] have no default and must be set"]),
    ("avalanche:EWC", {"ewc_lambda": "abc"}, ["ewc_lambda = 'abc' has type str; the constructor takes float"]),
    ("avalanche:Replay", {"mem_size": -5}, ["mem_size = -5 is negative"]),
    ("avalanche:Replay", {"mem_size": 2.5}, ["mem_size = 2.5 has type float; the constructor takes int"]),
    ("avalanche:EWC", {"ewc_lambda": 0.4, "keep_importance_data": "yes"}, ["has type str; the constructor takes bool"]),
])
def test_the_bridge_refuses_in_one_line(name, params, words):
    with pytest.raises(AvalancheStrategyError) as caught:
        check_params(name, params)
    message = str(caught.value)
    assert "\n" not in message and all(w in message for w in words)


def test_naive_trains_the_model_the_run_loop_hands_it_also_after_a_replacement(stream):
    model = small_model(stream)
    before = copy.deepcopy(model.state_dict())
    strategy, timing = train_on_experience(None, "avalanche:Naive", {}, model, stream.tasks[0].experience, SETTINGS,
                                           device="cpu")
    assert timing["iterations"] == 3 and timing["images"] == 48 and timing["final_loss"] > 0
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert unwrap(strategy.model) is model

    replacement = small_model(stream, num_classes=stream.tasks[1].num_seen_classes)
    kept, new_before = copy.deepcopy(model.state_dict()), copy.deepcopy(replacement.state_dict())
    strategy, _ = train_on_experience(strategy, "avalanche:Naive", {}, replacement, stream.tasks[1].experience,
                                      SETTINGS, device="cpu")
    assert unwrap(strategy.model) is replacement
    assert all(torch.equal(kept[k], v) for k, v in model.state_dict().items())
    assert not torch.equal(new_before["backbone.proj.weight"], replacement.backbone.proj.weight)

    replacement.head.grow(stream.tasks[2].num_seen_classes)
    grown = replacement.head.classifier.weight.detach().clone()
    strategy, _ = train_on_experience(strategy, "avalanche:Naive", {}, replacement, stream.tasks[2].experience,
                                      SETTINGS, device="cpu")
    assert replacement.head.classifier.weight.shape == (12, 16)
    assert not torch.equal(grown[8:], replacement.head.classifier.weight[8:])


def test_gem_trains_with_the_qpsolvers_the_suite_deferred_imported_before_its_training(stream):
    """GEM keeps Avalanche's stand-in for qpsolvers (cl2r_bench/data/avalanche_import.py); building the strategy
    imports qpsolvers for real, so a projection reads the real solver and no import is timed as training."""
    from avalanche.training.plugins import gem

    model = small_model(stream, num_classes=stream.tasks[1].num_seen_classes)
    strategy, _ = train_on_experience(None, "avalanche:GEM", {"patterns_per_exp": 8}, model,
                                      stream.tasks[0].experience, SETTINGS, device="cpu")
    assert isinstance(gem.qpsolvers, DeferredModule) and not isinstance(sys.modules["qpsolvers"], DeferredModule)
    assert gem.qpsolvers.solve_qp is sys.modules["qpsolvers"].solve_qp
    before = copy.deepcopy(model.state_dict())
    strategy, timing = train_on_experience(strategy, "avalanche:GEM", {"patterns_per_exp": 8}, model,
                                           stream.tasks[1].experience, SETTINGS, device="cpu")
    assert timing["iterations"] == 3 and timing["final_loss"] > 0
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_rebind_gives_the_strategy_the_new_model_and_optimizer(stream):
    model, other = small_model(stream), small_model(stream)
    strategy = build_avalanche_strategy("avalanche:LwF", {"alpha": 1.0, "temperature": 2.0}, model,
                                        optimizer=torch.optim.SGD(model.parameters(), lr=0.01), epochs=1,
                                        batch_size=16, device="cpu")
    optimizer = torch.optim.SGD(other.parameters(), lr=0.01)
    rebind(strategy, other, optimizer)
    assert isinstance(strategy.model, LogitsOnly) and strategy.model.retrieval_model is other
    assert strategy.optimizer is optimizer and strategy.optimized_param_id is None


def pretrained_file(stream, path, seed=1):
    """A stand-in replacement checkpoint: a model initialised with another seed, saved as a plain state dict."""
    torch.manual_seed(seed)
    model = build_model(backbone="small_cnn", head="learnable", num_classes=3, small_width=8, small_out_dim=16,
                        mean=stream.mean, std=stream.std)
    torch.save(model.state_dict(), path)
    return model.state_dict()


def test_the_replacement_plugin_trains_the_new_model_and_keeps_the_strategy_state(stream, tmp_path):
    """LwF with a replacement at experience 1 (METHODS.md §4): the incoming model, built from its file with its head
    grown to the 8 classes seen, is the one the optimizer updates and the compatibility plugin deploys; the outgoing
    model object is never touched again; LwF's teacher from experience 0 (its weights; LwF runs it in train mode, so
    its batch-norm statistics move) teaches the incoming model, and the optimizer object and the clock carry on."""
    from avalanche.core import SupervisedPlugin

    class Teachers(SupervisedPlugin):
        def __init__(self):
            super().__init__()
            self.seen = set()

        def before_backward(self, strategy, **kwargs):
            self.seen.add(id(lwf.prev_model))

    saved = pretrained_file(stream, tmp_path / "replacement.pt")
    built = []

    def build():
        built.append(small_model(stream, num_classes=2))
        return built[-1]

    old = small_model(stream)
    optimizer = torch.optim.SGD(old.parameters(), lr=0.05, momentum=0.9)
    replacement, teachers = ReplacementPlugin.from_files({1: tmp_path / "replacement.pt"}, build), Teachers()
    compatibility = CompatibilityPlugin.from_stream(stream)
    strategy = build_avalanche_strategy("avalanche:LwF", {"alpha": 1.0, "temperature": 2.0}, old,
                                        optimizer=optimizer, epochs=1, batch_size=16, device="cpu",
                                        plugins=[replacement, compatibility, teachers])
    lwf = next(p for p in strategy.plugins if hasattr(p, "lwf")).lwf
    experiences = list(stream.benchmark.train_stream)
    with avalanche_warnings_filtered():
        strategy.train(experiences[0], eval_streams=[])
        outgoing, teacher = copy.deepcopy(old.state_dict()), lwf.prev_model
        teachers.seen.clear()
        strategy.train(experiences[1], eval_streams=[])

    assert replacement.replaced == [1] and len(built) == 1
    new = built[0]
    assert unwrap(strategy.model) is new and new.head.classifier.weight.shape == (8, 16)
    assert strategy.optimizer is optimizer and optimizer.param_groups[0]["momentum"] == 0.9
    assert [id(p) for p in optimizer.param_groups[0]["params"]] == [id(p) for p in strategy.model.parameters()]
    assert all(torch.equal(outgoing[k], v) for k, v in old.state_dict().items())
    assert old.head.classifier.weight.shape == (4, 16)
    weights = [k for k in saved if k.endswith("weight") and not k.startswith("head.")]
    assert weights and all(not torch.equal(saved[k], new.state_dict()[k]) for k in weights)
    assert teachers.seen == {id(teacher)} and all(torch.equal(outgoing[k], v) for k, v in
                                                  unwrap(teacher).named_parameters())
    assert lwf.expcount == 2 and strategy.clock.train_exp_counter == 2

    own = CompatibilityEvaluator(stream.query, stream.gallery).deploy(copy.deepcopy(new))[0]
    assert len(compatibility.matrix) == 2 and compatibility.matrix[1][1] == own

    with avalanche_warnings_filtered():
        strategy.train(experiences[2], eval_streams=[])
    assert unwrap(strategy.model) is new and new.head.classifier.weight.shape == (12, 16)
    assert replacement.replaced == [1] and len(compatibility.matrix) == 3


def test_a_replacement_at_the_first_experience_leaves_the_placeholder_model_untrained(stream):
    """IAM-CL2R replaces at task 0 (METHODS.md §4): the model the strategy was built with is only a placeholder, and
    the optimizer built on it ends up holding the replacement's parameters alone."""
    placeholder, incoming = small_model(stream), small_model(stream, num_classes=4)
    before = copy.deepcopy(placeholder.state_dict())
    optimizer = torch.optim.SGD(placeholder.parameters(), lr=0.05)
    strategy = build_avalanche_strategy("avalanche:Naive", {}, placeholder, optimizer=optimizer, epochs=1,
                                        batch_size=16, device="cpu", plugins=[ReplacementPlugin({0: lambda: incoming})])
    initial = copy.deepcopy(incoming.state_dict())
    with avalanche_warnings_filtered():
        strategy.train(stream.tasks[0].experience, eval_streams=[])
    assert unwrap(strategy.model) is incoming
    assert all(torch.equal(before[k], v) for k, v in placeholder.state_dict().items())
    assert not torch.equal(initial["backbone.proj.weight"], incoming.backbone.proj.weight)
    assert {id(p) for g in optimizer.param_groups for p in g["params"]} == {id(p) for p in incoming.parameters()}


def test_the_head_growth_plugin_grows_the_head_before_the_optimizer_is_bound(stream):
    """The head is grown to the classes seen so far before each experience, early enough that the new rows are
    trained (growing it in before_training_exp would leave them untouched)."""
    from avalanche.core import SupervisedPlugin

    class Snapshot(SupervisedPlugin):
        def __init__(self):
            super().__init__()
            self.at_start = []

        def before_training_exp(self, strategy, **kwargs):
            self.at_start.append(unwrap(strategy.model).head.classifier.weight.detach().clone())

    model, snapshot = small_model(stream), Snapshot()
    strategy = build_avalanche_strategy("avalanche:Naive", {}, model,
                                        optimizer=torch.optim.SGD(model.parameters(), lr=0.05), epochs=1,
                                        batch_size=16, device="cpu", plugins=[HeadGrowthPlugin(), snapshot])
    with avalanche_warnings_filtered():
        for exp in stream.benchmark.train_stream:
            strategy.train(exp, eval_streams=[])
    assert [w.shape[0] for w in snapshot.at_start] == [4, 8, 12]
    assert not torch.equal(snapshot.at_start[2][8:], model.head.classifier.weight[8:])


def test_the_replacement_plugin_refuses_bad_maps_and_names_a_missing_file(stream, tmp_path):
    with pytest.raises(ValueError, match="non-negative ints"):
        ReplacementPlugin({-1: lambda: None})
    with pytest.raises(TypeError, match=r"experiences \[2\]"):
        ReplacementPlugin({2: "model.pt"})
    model = small_model(stream)
    plugin = ReplacementPlugin.from_files({0: tmp_path / "missing.pt"}, lambda: small_model(stream))
    strategy = build_avalanche_strategy("avalanche:Naive", {}, model,
                                        optimizer=torch.optim.SGD(model.parameters(), lr=0.05), epochs=1,
                                        batch_size=16, device="cpu", plugins=[plugin])
    with avalanche_warnings_filtered(), pytest.raises(CheckpointError, match="missing.pt does not exist"):
        strategy.train(stream.tasks[0].experience, eval_streams=[])


def test_logits_only_puts_class_y_in_column_y_for_a_simplex_head(stream):
    model = small_model(stream, head="dsimplex")
    x = stream.tasks[0].train.images[:2]
    logits = model(x)[0]
    wrapped = LogitsOnly(model)(x)
    labels = torch.tensor([0, 5])
    assert torch.equal(wrapped[torch.arange(2), labels], logits[torch.arange(2), model.class_targets(labels)])


def test_the_example_runs_iamcl2r_with_the_scenarios_replacement_models(tmp_path):
    """The example from another working directory (no sys.path edit; its replacement models are pretrained and
    cached under that directory): the models of experiences 0 and 2 are the scenario's replacements, and the
    matrix has one row per experience."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "avalanche_iamcl2r.py"), "--tiny"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "replacement model for task 0" in out and "replacement model for task 2" in out
    assert "experience 0: classes 0-3, replaced, then trained" in out and "experience 1: classes 4-7, fine-tuned" in out
    assert "experience 2: classes 8-11, replaced, then trained" in out
    assert "replacements at experiences [0, 2]" in out and "AC " in out and "AA " in out and "ACA " in out
    matrix = out.split("model k's gallery:\n")[1].splitlines()[:3]
    assert [len(row.split()) for row in matrix] == [1, 2, 3]
    assert len(list((tmp_path / "results" / "replacement_models").glob("*.pt"))) == 2
    assert "Warning" not in done.stderr
    assert time.perf_counter() - started < 60


@pytest.mark.parametrize("scenario,strategy,params", [
    ("cl2r", "avalanche:Naive", []),
    ("iamcl2r", "avalanche:EWC", ["--set", "strategy_params.avalanche:EWC.ewc_lambda=0.4"]),
])
def test_an_avalanche_strategy_runs_through_the_suite_into_its_matrix_and_leaderboard(scenario, strategy, params, tiny,
                                                                                        tmp_path, capsys):
    from cl2r_bench.app import cli

    out = tmp_path / "out"
    no_replacements = ["--set", "replacement.tasks=[]"] if scenario == "cl2r" else []
    assert cli.main(["--config", str(tiny), "--scenario", scenario, "--strategy", strategy, "--output", str(out),
                     *no_replacements, *params]) == 0
    label = strategy.replace(":", "-")
    record = json.loads((out / scenario / "synthetic" / label / "seed42" / "metrics.json").read_text())
    assert record["complete"] and record["strategy"] == strategy and record["method"] == label
    assert [len(row) for row in record["compatibility_matrix"]] == [3, 3, 3]
    assert all(t["iterations"] > 0 for t in record["timings"]["tasks"])
    if params:
        assert record["config"]["strategy_params"][strategy]["ewc_lambda"] == 0.4
    capsys.readouterr()
    assert cli.main(["leaderboard", "--results", str(out)]) == 0
    assert f"| {label}" in capsys.readouterr().out


def test_an_avalanche_strategy_without_its_required_arguments_is_a_one_line_error(tiny, tmp_path, capsys):
    from cl2r_bench.app import cli

    out = tmp_path / "out"
    assert cli.main(["--config", str(tiny), "--strategy", "avalanche:EWC", "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "ewc_lambda" in err and not out.exists()
