"""MixBCT (METHODS.md §6b): the loss on a tiny batch by hand, the denoising and the mixing on constructed cases, its
registration, and a run on IAM-CL2R, CL2R and the two-model protocol."""
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cl2r_bench import heads
from cl2r_bench.app import cli as runner
from cl2r_bench.heads import CosineHead
from strategies import Step, get_strategy
from strategies.mixbct import CredibleRegions, MixBCT, credible, credible_regions, drawn_rows

UPGRADE = ["--scenario", "upgrade", "--set", "stream.num_tasks=2", "--set", "replacement.tasks=[]",
           "--set", "stream.initial_classes=6", "--set", "stream.increment=6", "--set", "evaluation.dataset=stream"]


def batch_step(strategy, features, old, labels, classifier):
    """The strategy reading ``classifier`` (a cosine head) and a step of the given raw new and unit old features."""
    head = CosineHead(classifier.shape[1], classifier.shape[0])
    with torch.no_grad():
        head.classifier.weight.copy_(classifier)
    features = torch.nn.Parameter(torch.tensor(features))
    logits, feats = head(features)
    strategy.model = SimpleNamespace(head=head)
    labels = torch.tensor(labels)
    step = Step(labels=labels, targets=labels, logits=logits, features=feats,
                from_memory=torch.zeros(len(labels), dtype=torch.bool), teacher_features=torch.tensor(old))
    return step, features, head


def two_classes(radius=(0.1, 0.1)):
    """Class 0's region holds the old feature (0.8, 0.6), class 1's (centred on (0, 1)) does not hold (1, 0)."""
    return CredibleRegions(torch.ones(2, dtype=torch.float64), torch.tensor([[0.8, 0.6], [0.0, 1.0]],
                                                                              dtype=torch.float64),
                           torch.tensor(radius, dtype=torch.float64))


def cross_entropy(logits, target):
    return -logits[target] + math.log(sum(math.exp(z) for z in logits))


# --- The loss by hand ---------------------------------------------------------------------------------------------

def test_the_loss_by_hand_replaces_a_credible_row_by_its_old_feature():
    """Two samples, s = 2, m = 0.5, alpha = 0.5: int(2 x 0.5) = 1 row is replaced, and only row 0's old feature is
    credible. Row 0 then has the old cosines (0.8, 0.6), its target above cos(pi - m): cos(θ + m); row 1 keeps its new
    cosines (0.28, -0.96), its target below cos(pi - m) = -0.878: t - m sin(pi - m)."""
    strategy = get_strategy("mixbct").from_params({"scale": 2.0, "mix_ratio": 0.5})
    strategy.regions = two_classes()
    step, features, head = batch_step(strategy, [[0.0, 3.0], [0.56, -1.92]], [[0.8, 0.6], [1.0, 0.0]], [0, 1],
                                      torch.eye(2))
    loss = strategy.loss(step)
    m = 0.5
    row0 = [2 * (0.8 * math.cos(m) - 0.6 * math.sin(m)), 2 * 0.6]
    row1 = [2 * 0.28, 2 * (-0.96 - m * math.sin(math.pi - m))]
    assert float(loss.detach()) == pytest.approx((cross_entropy(row0, 0) + cross_entropy(row1, 1)) / 2, abs=1e-6)
    assert strategy.mixed.tolist() == [True, False]
    loss.backward()
    assert torch.equal(features.grad[0], torch.zeros(2)) and bool(features.grad[1].abs().sum() > 0)
    assert bool(head.classifier.weight.grad.abs().sum() > 0)


def test_without_mixing_the_loss_is_arcface_on_the_new_features_by_hand():
    """alpha = 0 mixes nothing: row 0's new cosines (0, 1), target 0 at 90°, give cos(90° + m) = -sin m."""
    strategy = get_strategy("mixbct").from_params({"scale": 2.0, "mix_ratio": 0.0})
    strategy.regions = two_classes()
    step, _, _ = batch_step(strategy, [[0.0, 3.0], [0.56, -1.92]], [[0.8, 0.6], [1.0, 0.0]], [0, 1], torch.eye(2))
    m = 0.5
    row0 = [2 * -math.sin(m), 2 * 1.0]
    row1 = [2 * 0.28, 2 * (-0.96 - m * math.sin(math.pi - m))]
    expected = (cross_entropy(row0, 0) + cross_entropy(row1, 1)) / 2
    assert float(strategy.loss(step).detach()) == pytest.approx(expected, abs=1e-6)
    assert not bool(strategy.mixed.any())


def test_the_interpolating_reading_mixes_every_credible_row_by_hand():
    """``mixing: interpolate``, alpha = 0.5: row 0 becomes 0.5 (0, 1) + 0.5 (0.8, 0.6) = (0.4, 0.8), cosines
    (0.4, 0.8) / |(0.4, 0.8)|, and keeps a gradient to the backbone; row 1 (not credible) is its new feature."""
    strategy = get_strategy("mixbct").from_params({"scale": 2.0, "mix_ratio": 0.5, "mixing": "interpolate"})
    strategy.regions = two_classes()
    step, features, _ = batch_step(strategy, [[0.0, 3.0], [0.56, -1.92]], [[0.8, 0.6], [1.0, 0.0]], [0, 1],
                                   torch.eye(2))
    loss = strategy.loss(step)
    m, c0, c1 = 0.5, 0.4 / math.sqrt(0.8), 0.8 / math.sqrt(0.8)
    row0 = [2 * (c0 * math.cos(m) - c1 * math.sin(m)), 2 * c1]
    row1 = [2 * 0.28, 2 * (-0.96 - m * math.sin(math.pi - m))]
    assert float(loss.detach()) == pytest.approx((cross_entropy(row0, 0) + cross_entropy(row1, 1)) / 2, abs=1e-6)
    loss.backward()
    assert bool(features.grad[0].abs().sum() > 0)


def test_without_a_teacher_the_loss_is_arcface_by_hand():
    strategy = get_strategy("mixbct").from_params({"scale": 3.0})
    step, _, _ = batch_step(strategy, [[0.6, 0.8]], [[1.0, 0.0]], [1], torch.eye(2))
    step.teacher_features = None
    m = 0.5
    expected = cross_entropy([3 * 0.6, 3 * (0.8 * math.cos(m) - 0.6 * math.sin(m))], 1)
    assert float(strategy.loss(step).detach()) == pytest.approx(expected, abs=1e-6)


# --- Denoising ----------------------------------------------------------------------------------------------------

def constructed_set():
    """Class 0: eight features at (1, 0, 0), X off by 0.3 rad in the second dimension, Y by 0.05 in the third;
    class 1: ten features near (0, 1, 0) at angles 0.01 k² (k = 0..9). Only Y has a third dimension, so normalising
    each dimension over the set blows it up."""
    zero = [[1.0, 0.0, 0.0]] * 8
    x = [[math.cos(0.3), math.sin(0.3), 0.0]]
    y = [[math.sqrt(1 - 0.05 ** 2), 0.0, 0.05]]
    one = [[math.sin(0.01 * k * k), math.cos(0.01 * k * k), 0.0] for k in range(10)]
    return torch.tensor(zero + x + y + one), torch.tensor([0] * 10 + [1] * 10)


def test_denoising_keeps_the_nine_of_ten_nearest_their_class_mean_after_normalising_rows_then_columns():
    """ceil(0.9 x 10) = 9 kept per class. On unit features X (0.3 rad off) is the farthest of class 0; once each
    dimension is divided by its norm over the set, Y's third dimension (norm 0.05 over the set) becomes 1 and Y is
    the farthest. Class 1 drops its last feature (0.81 rad, the farthest from the mean angle 0.285) either way."""
    features, labels = constructed_set()
    expected_columns = [True] * 9 + [False] + [True] * 9 + [False]
    expected_rows = [True] * 8 + [False, True] + [True] * 9 + [False]
    columns = credible_regions(features, labels, 2, 0.9, "rows_columns")
    assert credible(columns, features, labels).tolist() == expected_columns
    assert torch.allclose(columns.column_scale[2], torch.tensor(0.05, dtype=torch.float64))
    rows = credible_regions(features, labels, 2, 0.9, "rows")
    assert credible(rows, features, labels).tolist() == expected_rows
    everything = credible_regions(features, labels, 3, 1.0)               # T = 1 keeps every feature
    assert credible(everything, features, labels).all()
    assert not credible(everything, features[:1], torch.tensor([2])).any()  # a class without a region: none credible


def test_denoising_equals_the_nearest_ceil_t_n_per_class_on_a_random_set():
    """Their procedure written out with numpy (rows, then columns normalised; per class the ceil(T n) smallest
    Euclidean distances to the class mean kept) gives the suite's mask, class sizes 1 to 13, T = 0.7."""
    gen = np.random.default_rng(0)
    sizes = list(range(1, 14))
    labels = np.repeat(np.arange(len(sizes)), sizes)
    data = gen.normal(size=(len(labels), 6)) + gen.normal(size=(len(sizes), 6))[labels]
    data = data / np.linalg.norm(data, axis=1, keepdims=True)
    scaled = data / np.linalg.norm(data, axis=0, keepdims=True)
    expected = np.zeros(len(labels), dtype=bool)
    for c in range(len(sizes)):
        members = np.flatnonzero(labels == c)
        distances = np.linalg.norm(scaled[members] - scaled[members].mean(axis=0), axis=1)
        expected[members[np.argsort(distances)[:math.ceil(0.7 * len(members))]]] = True
    features, tensor_labels = torch.tensor(data, dtype=torch.float32), torch.tensor(labels)
    regions = credible_regions(features, tensor_labels, len(sizes), 0.7)
    assert credible(regions, features, tensor_labels).tolist() == expected.tolist()


# --- Mixing -------------------------------------------------------------------------------------------------------

def test_rows_are_drawn_uniformly_among_the_credible_ones_and_at_most_all_of_them():
    eligible = torch.tensor([True, False, True, True, False, True, False, True])
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(8)
    for _ in range(2000):
        drawn = drawn_rows(eligible, 2, generator)
        assert int(drawn.sum()) == 2 and not bool((drawn & ~eligible).any())
        counts += drawn
    assert torch.allclose(counts[eligible] / 2000, torch.full((5,), 0.4), atol=0.05)
    assert torch.equal(drawn_rows(eligible, 7), eligible)                    # fewer credible rows than asked: all
    assert torch.equal(drawn_rows(eligible, 3, torch.Generator().manual_seed(5)),
                       drawn_rows(eligible, 3, torch.Generator().manual_seed(5)))


def test_a_batch_mixes_int_alpha_b_credible_rows_with_their_old_features():
    """Ten samples, alpha = 0.3: int(3.0) = 3 rows replaced, all credible; the replaced rows' cosines are their old
    features' and carry no gradient to the backbone."""
    torch.manual_seed(0)
    strategy = get_strategy("mixbct").from_params({})
    old = F.normalize(torch.randn(10, 4), dim=1)
    labels = [0, 1] * 5
    strategy.regions = credible_regions(old, torch.tensor(labels), 2, 0.5)   # 3 of each class's 5 credible
    strategy.generator = torch.Generator().manual_seed(1)
    step, features, head = batch_step(strategy, torch.randn(10, 4).tolist(), old.tolist(), labels, torch.randn(2, 4))
    eligible = credible(strategy.regions, old, torch.tensor(labels))
    assert int(eligible.sum()) == 6
    loss = strategy.loss(step)
    mixed = strategy.mixed
    assert int(mixed.sum()) == 3 and not bool((mixed & ~eligible).any())
    loss.backward()
    assert torch.equal(features.grad[mixed], torch.zeros(3, 4)) and bool((features.grad[~mixed].abs().sum(1) > 0).all())


# --- Registration and the task's set-up ---------------------------------------------------------------------------

def test_mixbct_is_registered_with_the_authors_defaults():
    cls = get_strategy("mixbct")
    assert cls is MixBCT and (cls.head, cls.uses_memory, cls.needs_teacher) == ("cosine", True, True)
    assert cls.from_params({}).config.__dict__ == {
        "mix_ratio": 0.3, "credible_ratio": 0.9, "scale": 64.0, "margin": 0.5, "mixing": "replace",
        "denoise_space": "rows_columns", "replacement_teacher": "outgoing", "classifier_init": "partial_fc"}
    assert cls.from_params({}).head_options() == {"row_init": "partial_fc"}
    assert cls.from_params({"classifier_init": "linear"}).head_options() == {"row_init": "linear"}
    assert cls.loss_summary.startswith("`ArcFace") and cls.reference == "Liang et al., arXiv 2023"


def test_before_task_makes_the_regions_and_refuses_an_old_model_of_another_width():
    from cl2r_bench.data.datasets import ImageSet
    from cl2r_bench.models import build_model
    from strategies import TaskContext

    torch.manual_seed(0)

    def small(width):
        return build_model(backbone="small_cnn", head="cosine", num_classes=4, small_width=4, small_out_dim=width)

    data = ImageSet(torch.randint(0, 255, (20, 3, 32, 32), dtype=torch.uint8), torch.arange(4).repeat(5))
    strategy = get_strategy("mixbct").from_params({})
    strategy.before_task(TaskContext(index=1, num_old_classes=2, num_new_classes=2, teacher=small(8).eval(),
                                     new_data=data, model=small(8), amp=False))
    assert strategy.regions.radius.isfinite().all() and strategy.regions.centres.shape == (4, 8)
    with pytest.raises(ValueError, match="widths must be equal"):
        strategy.before_task(TaskContext(index=1, num_old_classes=2, num_new_classes=2, teacher=small(8).eval(),
                                         new_data=data, model=small(16), amp=False))
    strategy.before_task(TaskContext(index=0, num_old_classes=0, num_new_classes=4, new_data=data, model=small(8)))
    assert strategy.regions is None


def test_the_parity_batch_moves_the_loss_with_every_term_and_holds_uncredible_rows():
    """tools/parity/mixbct.py's batch is not vacuous: mixing, the margin and the denoising each move the loss by more
    than 0.05, some batch rows are not credible and none of those is replaced."""
    from tools.parity.mixbct import TERMS, batch_inputs, suite_iteration
    inputs = batch_inputs()
    full = suite_iteration(inputs)
    for name, params in TERMS.items():
        assert abs(float(full["loss"]) - float(suite_iteration(inputs, params)["loss"])) > 0.05, name
    assert 0 < int((~full["batch_credible"]).sum()) and int(full["mixed"].sum()) == 6
    assert not bool((full["mixed"] & ~full["batch_credible"]).any())


# --- Runs ---------------------------------------------------------------------------------------------------------

@pytest.fixture
def mixed_rows(monkeypatch):
    """How many rows each training batch mixed."""
    counts, original = [], MixBCT.loss

    def spy(self, step):
        loss = original(self, step)
        counts.append(0 if self.mixed is None else int(self.mixed.sum()))
        return loss

    monkeypatch.setattr(MixBCT, "loss", spy)
    return counts


@pytest.mark.parametrize("scenario, args", [
    ("iamcl2r", []),
    ("cl2r", ["--scenario", "cl2r", "--set", "replacement.tasks=[]"]),
    ("upgrade", UPGRADE)])
def test_runs_from_the_command_line(tiny, tmp_path, mixed_rows, scenario, args, monkeypatch):
    started = []
    original = heads.classifier_rows
    monkeypatch.setattr(heads, "classifier_rows", lambda in_dim, count, row_init: started.append(row_init)
                        or original(in_dim, count, row_init))
    out = tmp_path / "out"
    assert runner.main(["--config", str(tiny), *args, "--strategy", "mixbct", "--output", str(out)]) == 0
    assert "partial_fc" in started, "the trained models' classifiers start as their PartialFC's"
    record = json.loads((out / f"{scenario}/synthetic/mixbct/seed42/metrics.json").read_text())
    assert record["complete"]
    assert max(mixed_rows) > 0, "old features were mixed into some batch"
