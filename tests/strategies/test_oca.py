"""OCA (METHODS.md §6b): the loss against a hand computation, the orthogonal transformation layer, the registration,
and tiny runs on IAM-CL2R, CL2R and the two-model protocol."""
import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cl2r_bench.app import cli as runner
from cl2r_bench.data.datasets import ImageSet
from cl2r_bench.heads import HEADS, OrthogonalTransformationHead, build_head
from cl2r_bench.models import head_over, older_width_in
from strategies import Step, TaskContext, get_strategy, list_strategies


def smoothed_ce(logits, label, smoothing=0.1):
    """Cross-entropy with label smoothing of one sample, from its logits (plain floats)."""
    log_sum = math.log(sum(math.exp(z) for z in logits))
    losses = [log_sum - z for z in logits]
    return (1 - smoothing) * losses[label] + smoothing * sum(losses) / len(losses)


def hand_step():
    """Two samples of a 3-d feature whose first two dimensions (the old frame) are, normalised, e1 and e2."""
    labels = torch.tensor([0, 1])
    features = torch.tensor([[0.6, 0.0, 0.8], [0.0, 0.8, 0.6]], requires_grad=True)
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0]], requires_grad=True)
    return Step(labels=labels, targets=labels, logits=logits, features=features,
                from_memory=torch.zeros(2, dtype=torch.bool))


def with_pseudo_classifier(params=None):
    strategy = get_strategy("oca").from_params(params or {})
    strategy.pseudo_classifier, strategy.old_width = torch.tensor([[0.5, 0.0], [0.3, 0.4]]), 2
    return strategy


def test_oca_loss_by_hand():
    # the old frame of each sample is e1, e2, so the pseudo-classifier's logits are its rows' columns:
    # sample 0 -> (0.5, 0.3), sample 1 -> (0.0, 0.4); the cosines to the label's row are 1 and 0.4 / 0.5 = 0.8
    classification = (smoothed_ce([2.0, 0.0], 0) + smoothed_ce([0.0, 1.0], 1)) / 2
    influence = (smoothed_ce([0.5, 0.3], 0) + smoothed_ce([0.0, 0.4], 1)) / 2
    alignment = 1 - (1.0 + 0.8) / 2
    loss = with_pseudo_classifier().loss(hand_step())
    assert loss.requires_grad
    assert float(loss.detach()) == pytest.approx(5 * classification + 10 * influence + 5 * alignment, abs=1e-5)
    configuration = with_pseudo_classifier({"classification_weight": 1.0}).loss(hand_step())
    assert float(configuration.detach()) == pytest.approx(classification + 10 * influence + 5 * alignment, abs=1e-5)
    plain = with_pseudo_classifier({"label_smoothing": 0.0}).loss(hand_step())
    unsmoothed = (smoothed_ce([2.0, 0.0], 0, 0) + smoothed_ce([0.0, 1.0], 1, 0)) / 2
    unsmoothed_influence = (smoothed_ce([0.5, 0.3], 0, 0) + smoothed_ce([0.0, 0.4], 1, 0)) / 2
    assert float(plain.detach()) == pytest.approx(5 * unsmoothed + 10 * unsmoothed_influence + 5 * alignment, abs=1e-5)


def test_without_an_old_model_the_loss_is_its_classification_term():
    strategy = get_strategy("oca").from_params({})
    assert strategy.pseudo_classifier is None
    expected = 5 * (smoothed_ce([2.0, 0.0], 0) + smoothed_ce([0.0, 1.0], 1)) / 2
    assert float(strategy.loss(hand_step()).detach()) == pytest.approx(expected, abs=1e-5)


class IndexedTeacher(nn.Module):
    """A frozen model whose images are the items' indices and whose features are a given table."""

    def __init__(self, table):
        super().__init__()
        self.register_buffer("table", table)
        self.unused = nn.Parameter(torch.zeros(1))

    def forward(self, images):
        rows = self.table[images.flatten(1)[:, 0].long()]
        return rows.new_zeros(len(rows), 2), rows


def test_the_pseudo_classifier_is_the_mean_unit_old_feature_of_each_class():
    raw = torch.tensor([[3.0, 0.0], [0.0, 2.0], [1.0, 1.0], [0.0, 5.0]])
    labels = torch.tensor([0, 0, 1, 1])
    images = torch.arange(4, dtype=torch.uint8)[:, None, None, None]
    strategy = get_strategy("oca").from_params({})
    strategy.before_task(TaskContext(index=1, num_old_classes=0, num_new_classes=2, teacher=IndexedTeacher(raw),
                                     new_data=ImageSet(images, labels), amp=False))
    half = math.sqrt(0.5)
    expected = torch.tensor([[0.5, 0.5], [half / 2, (half + 1) / 2]])     # means of unit rows, not re-normalised
    assert strategy.old_width == 2 and torch.allclose(strategy.pseudo_classifier, expected, atol=1e-6)
    strategy.before_task(TaskContext(index=0, num_old_classes=0, num_new_classes=2))
    assert strategy.pseudo_classifier is None                               # no teacher: no pseudo-classifier


def test_the_parity_batch_moves_the_loss_with_every_term():
    from tools.parity.oca import WEIGHTS, batch_inputs, term_moves
    assert {k: v for k, v in dataclasses.asdict(get_strategy("oca").Config()).items() if k in WEIGHTS} == WEIGHTS
    moves = term_moves(batch_inputs())
    assert all(abs(value) > 0.05 for value in moves.values()), moves


# --- The orthogonal transformation layer -------------------------------------------------------------------------

def test_the_head_widens_normalises_and_classifies_through_the_orthogonal_layer():
    torch.manual_seed(0)
    head = OrthogonalTransformationHead(6, 3, old_width=4, added_dims=3)
    assert head.feature_width == 7 and head.classifier.in_features == 7
    feats = torch.rand(5, 6)
    logits, retrieval = head(feats)
    widened = torch.cat([head.compatible(feats), head.added(feats)], dim=1)
    assert torch.allclose(retrieval, widened / widened.norm(dim=1, keepdim=True), atol=1e-6)
    q = head.transform.weight
    assert torch.allclose(logits, (retrieval @ q.t() + head.transform.bias) @ head.classifier.weight.t(), atol=1e-6)
    head.grow(5)
    assert head(feats)[0].shape == (5, 5) and torch.allclose(head(feats)[0][:, :3], logits, atol=1e-6)


def test_the_orthogonal_layer_stays_orthogonal_while_it_trains():
    torch.manual_seed(1)
    head = OrthogonalTransformationHead(6, 4, old_width=4, added_dims=4)
    start = head.transform.weight.detach().clone()
    optimizer = torch.optim.SGD(head.parameters(), lr=0.5)
    feats, labels = torch.rand(16, 6), torch.arange(4).repeat(4)
    for _ in range(20):
        optimizer.zero_grad()
        F.cross_entropy(5 * head(feats)[0], labels).backward()
        optimizer.step()
    q = head.transform.weight.detach()
    assert (q - start).abs().max() > 0.01, "the layer trained"
    assert torch.allclose(q @ q.t(), torch.eye(8), atol=1e-5) and torch.allclose(q.t() @ q, torch.eye(8), atol=1e-5)
    a, b = F.normalize(torch.randn(2, 8), dim=1)
    assert float((q @ a - q @ b).norm()) == pytest.approx(float((a - b).norm()), abs=1e-5)   # distances kept


def test_an_oca_head_is_built_over_an_older_model_and_found_again_in_its_checkpoint():
    assert head_over("oca", None) == ("learnable", {})
    assert head_over("oca", 16) == ("oca", {"old_width": 16})
    head = build_head("oca", 10, 3, head_options={"old_width": 16, "added_dims": 8})
    assert isinstance(head, OrthogonalTransformationHead) and head.feature_width == 24
    assert older_width_in({f"head.{k}": v for k, v in head.state_dict().items()}) == 16


def test_oca_is_registered_with_its_head_and_defaults():
    assert "oca" in list_strategies() and "oca" in HEADS
    cls = get_strategy("oca")
    assert (cls.head, cls.uses_memory, cls.needs_teacher, cls.needs_independent) == ("oca", False, True, False)
    assert cls.loss_summary.startswith("`") and cls.reference.startswith("Ricci et al.")
    assert dataclasses.asdict(cls.Config()) == {
        "classification_weight": 5.0, "influence_weight": 10.0, "alignment_weight": 5.0, "label_smoothing": 0.1,
        "added_dims": 32, "orthogonal_map": "matrix_exp", "replacement_teacher": "outgoing"}
    assert cls.from_params({"added_dims": 8}).head_options() == {"added_dims": 8, "orthogonal_map": "matrix_exp"}


# --- From the command line ------------------------------------------------------------------------------------

def test_oca_widens_a_replacement_over_the_outgoing_model_on_iamcl2r(tiny, tmp_path, monkeypatch):
    from cl2r_bench.training.trainers import StrategyTrainer
    calls, original = [], StrategyTrainer.train

    def spy(self, model, task, memory, **kwargs):
        teacher = kwargs["teacher"]
        calls.append({"task": task.index, "width": model.feature_width, "head": type(model.head).__name__,
                      "teacher_width": None if teacher is None else teacher.feature_width})
        return original(self, model, task, memory, **kwargs)

    monkeypatch.setattr(StrategyTrainer, "train", spy)
    out = tmp_path / "out"
    assert runner.main(["--config", str(tiny), "--strategy", "oca", "--output", str(out)]) == 0
    # task 2's replacement gets an OCA head over the outgoing 16-d model: 16 + 32 wide, that model its old model
    assert calls == [{"task": 0, "width": 16, "head": "LearnableHead", "teacher_width": 16},
                     {"task": 1, "width": 16, "head": "LearnableHead", "teacher_width": 16},
                     {"task": 2, "width": 48, "head": "OrthogonalTransformationHead", "teacher_width": 16}]
    folder = out / "iamcl2r/synthetic/oca/seed42"
    record = json.loads((folder / "metrics.json").read_text())
    assert record["complete"] and [len(row) for row in record["compatibility_matrix"]] == [3, 3, 3]
    assert all(v is None or 0 <= v <= 1 for row in record["compatibility_matrix"] for v in row)
    state = torch.load(folder / "checkpoints/task2.pt", weights_only=True)
    q = state["head.transform.parametrizations.weight.original"]
    assert q.shape == (48, 48) and state["head.compatible.weight"].shape[0] == 16
    assert runner.main(["--config", str(tiny), "--strategy", "oca", "--output", str(out), "--resume"]) == 0


def test_oca_runs_on_cl2r(tiny, tmp_path):
    out = tmp_path / "out"
    assert runner.main(["--config", str(tiny), "--scenario", "cl2r", "--set", "replacement.tasks=[]",
                        "--strategy", "oca", "--output", str(out)]) == 0
    assert json.loads((out / "cl2r/synthetic/oca/seed42/metrics.json").read_text())["complete"]


def test_oca_widens_the_upgrade_protocols_new_model(tiny, tmp_path):
    from benchmarks.record import record_problem

    out = tmp_path / "out"
    assert runner.main(["--config", str(tiny), "--scenario", "upgrade", "--set", "stream.num_tasks=2",
                        "--set", "replacement.tasks=[]", "--set", "stream.initial_classes=6",
                        "--set", "stream.increment=6", "--set", "evaluation.dataset=stream", "--strategy", "oca",
                        "--output", str(out)]) == 0
    record = json.loads((out / "upgrade/synthetic/oca/seed42/metrics.json").read_text())
    old = torch.load(out / "upgrade/synthetic/oca/seed42/checkpoints/task0.pt", weights_only=True)
    new = torch.load(out / "upgrade/synthetic/oca/seed42/checkpoints/task1.pt", weights_only=True)
    width = old["head.classifier.weight"].shape[1]
    assert "head.transform.bias" not in old and new["head.compatible.weight"].shape[0] == width   # the old frame
    assert new["head.classifier.weight"].shape[1] == width + 32
    two = record["two_model"]
    assert all(two["cases"][case] is not None for case in ("old/old", "new/old", "new/new"))
    assert record_problem(record) is None
