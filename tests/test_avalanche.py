"""Avalanche for real (issue 17): streams whose experiences carry the data, the compatibility plugin, the bridge
that runs any Avalanche strategy, and the example."""
import copy
import pathlib
import subprocess
import sys
import time
from types import SimpleNamespace

import json

import pytest
import torch

from benchmarks.avalanche_plugin import CompatibilityPlugin
from benchmarks.retrieval import CompatibilityEvaluator
from cl2r_bench.models import build_model
from scenarios.streams import avalanche_warnings_filtered, build_stream
from strategies.avalanche import (AvalancheStrategyError, LogitsOnly, build_avalanche_strategy, check_params,
                                  is_avalanche_strategy, rebind, strategy_names, train_on_experience, unwrap)

ROOT = pathlib.Path(__file__).resolve().parents[1]
SETTINGS = SimpleNamespace(lr=0.05, lr_min=0.001, momentum=0.9, weight_decay=5e-4, epochs=1, batch_size=16,
                           progress=False)


@pytest.fixture(scope="module")
def stream():
    """3 experiences of 4 classes x 12 images on generated data; 4 held-out classes for evaluation."""
    return build_stream(scenario="iamcl2r", dataset="synthetic", data_root="unused", initial_classes=4, increment=4,
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
    for task, exp in zip(stream.tasks, experiences):
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
    assert sum(not torch.equal(a, p) for a, p in zip(augmented, plain)) > len(plain) // 2


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
    strategy = build_avalanche_strategy("avalanche:Naive", {}, model, optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
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
    strategy = build_avalanche_strategy("avalanche:Naive", {}, model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
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


@pytest.mark.parametrize("name, params, words", [
    ("avalanche:Nope", {}, ["unknown Avalanche strategy 'avalanche:Nope'", "avalanche:Naive"]),
    ("avalanche:PackNet", {}, ["needs a PackNet model", "choose from"]),
    ("avalanche:EWC", {"ewc_lambda": 0.4, "lamda": 1}, ["unknown key(s) ['lamda']", "'ewc_lambda'"]),
    ("avalanche:Naive", {"optimizer": "adam"}, ["['optimizer'] are set by the suite", "valid keys"]),
    ("avalanche:EWC", {}, ["['ewc_lambda'] have no default and must be set"]),
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


def test_rebind_gives_the_strategy_the_new_model_and_optimizer(stream):
    model, other = small_model(stream), small_model(stream)
    strategy = build_avalanche_strategy("avalanche:LwF", {"alpha": 1.0, "temperature": 2.0}, model,
                                        optimizer=torch.optim.SGD(model.parameters(), lr=0.01), epochs=1,
                                        batch_size=16, device="cpu")
    optimizer = torch.optim.SGD(other.parameters(), lr=0.01)
    rebind(strategy, other, optimizer)
    assert isinstance(strategy.model, LogitsOnly) and strategy.model.retrieval_model is other
    assert strategy.optimizer is optimizer and strategy.optimized_param_id is None


def test_logits_only_puts_class_y_in_column_y_for_a_simplex_head(stream):
    model = small_model(stream, head="dsimplex")
    x = stream.tasks[0].train.images[:2]
    logits = model(x)[0]
    wrapped = LogitsOnly(model)(x)
    labels = torch.tensor([0, 5])
    assert torch.equal(wrapped[torch.arange(2), labels], logits[torch.arange(2), model.class_targets(labels)])


def test_the_example_runs():
    started = time.perf_counter()
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "avalanche_iamcl2r.py"), "--tiny"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "compatibility matrix" in done.stdout and "AC " in done.stdout and "AA " in done.stdout
    assert "Warning" not in done.stderr
    assert time.perf_counter() - started < 60


@pytest.mark.parametrize("scenario,strategy,params", [
    ("cl2r", "avalanche:Naive", []),
    ("iamcl2r", "avalanche:EWC", ["--set", "strategy_params.avalanche:EWC.ewc_lambda=0.4"]),
])
def test_an_avalanche_strategy_runs_through_the_suite_into_its_matrix_and_leaderboard(scenario, strategy, params, tiny,
                                                                                        tmp_path, capsys):
    from cl2r_bench import cli

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
    from cl2r_bench import cli

    out = tmp_path / "out"
    assert cli.main(["--config", str(tiny), "--strategy", "avalanche:EWC", "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "ewc_lambda" in err and not out.exists()
