"""The BCT line's strategies (METHODS.md §6b): LCE, UniBCT, RACT, AdvBCT and BT² against hand computations, and each
from the command line on CL2R and IAM-CL2R."""
import json
import math

import pytest
import torch
import torch.nn.functional as F

from benchmarks.retrieval import nearest_neighbour_hits
from cl2r_bench.app import cli as runner
from cl2r_bench.class_regions import ClassRegions, class_regions, largest_inlier
from cl2r_bench.heads import BasisTransformationHead
from strategies import Step, StrategyError, get_strategy
from strategies.advbct import (
    ElasticBoundary,
    GradientReversal,
    adversarial_weight,
    elastic_boundary_loss,
    reversal_weight,
)
from strategies.lce import alignment_loss, boundary_loss, cosine_boundary_loss, squared_alignment_loss
from strategies.ract import regression_alleviating_loss
from strategies.unibct import UniBCTConfig, arcface_logits, class_prototypes, refined_prototype


def unit(*angles_deg):
    """Unit 2-d vectors at the given angles."""
    return torch.tensor([[math.cos(math.radians(a)), math.sin(math.radians(a))] for a in angles_deg])


def regions_at(centres, distance_radius=None, angle_radius=None, cosine_floor=None):
    centres = torch.tensor(centres, dtype=torch.float)
    n = len(centres)
    nan = torch.full((n,), math.nan)
    return ClassRegions(centres, torch.ones(n, dtype=torch.bool),
                        nan if distance_radius is None else torch.tensor(distance_radius, dtype=torch.float),
                        nan if angle_radius is None else torch.tensor(angle_radius, dtype=torch.float),
                        nan if cosine_floor is None else torch.tensor(cosine_floor, dtype=torch.float))


# --- Class regions --------------------------------------------------------------------------------------------

def test_largest_inlier_drops_values_beyond_one_and_a_half_iqr():
    assert largest_inlier([4, 1, 100, 3, 2]) == (4, 4)   # q1 = 2, q3 = 4: kept within [-1, 7]
    assert largest_inlier([0.5, 0.2]) == (0.5, 2)       # fewer than 4: all kept
    assert largest_inlier([7.0]) == (7.0, 1)


def test_class_regions_by_hand():
    features = unit(0, 90, 0, 0)
    labels = torch.tensor([0, 0, 1, 2])
    regions = class_regions(features, labels, torch.tensor([0, 1]), num_classes=3)
    assert torch.allclose(regions.centres[0], torch.tensor([0.5, 0.5]))
    assert regions.present.tolist() == [True, True, False]
    assert regions.distance_radius[0].item() == pytest.approx(math.sqrt(0.5))
    assert regions.angle_radius[0].item() == pytest.approx(math.pi / 4)
    assert math.isnan(regions.distance_radius[1]) and math.isnan(regions.angle_radius[1])  # one item: no radius
    assert regions.cosine_floor[0].item() == pytest.approx(math.cos(math.pi / 4))           # every item counted
    assert regions.cosine_floor[1].item() == pytest.approx(1.0) and math.isnan(regions.cosine_floor[2])


# --- LCE ------------------------------------------------------------------------------------------------------

def test_lce_boundary_is_the_angle_beyond_theta():
    regions = regions_at([[1.0, 0.0], [0.0, 2.0]], angle_radius=[math.pi / 6, math.nan])
    features = unit(60, 10, 45) * torch.tensor([[3.0], [1.0], [1.0]])
    labels = torch.tensor([0, 0, 1])                      # the class-1 sample has no angle: left out
    assert boundary_loss(features, labels, regions).item() == pytest.approx((math.pi / 3 - math.pi / 6 + 0) / 2)


def test_lce_alignment_is_one_minus_cosine_of_the_class_rows():
    regions = regions_at([[2.0, 0.0], [0.0, 1.0]], angle_radius=[0.3, 0.2])
    classifier = torch.tensor([[0.0, 5.0], [1.0, 1.0]])
    labels = torch.tensor([0, 1, 1])
    expected = ((1 - 0) + 2 * (1 - 1 / math.sqrt(2))) / 3
    assert alignment_loss(classifier, labels, regions).item() == pytest.approx(expected)


def test_lce_authors_boundary_is_the_cosine_below_the_floor():
    regions = regions_at([[1.0, 0.0], [0.0, 2.0]], cosine_floor=[math.cos(math.pi / 6), 0.99])
    features = unit(60, 10, 80) * torch.tensor([[3.0], [1.0], [1.0]])
    labels = torch.tensor([0, 0, 1])                      # cosines 0.5, cos 10°, cos 10°: below their floors by
    expected = ((math.cos(math.pi / 6) - 0.5) + 0 + (0.99 - math.cos(math.radians(10)))) / 3
    assert cosine_boundary_loss(features, labels, regions).item() == pytest.approx(expected)


def test_lce_authors_alignment_is_the_mean_squared_error_of_the_unit_rows():
    regions = regions_at([[2.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    regions.present[2] = False                             # a class without a centre is left out
    classifier = torch.tensor([[0.0, 5.0], [1.0, 1.0], [3.0, 3.0]])
    s = 1 / math.sqrt(2)
    expected = ((0 - 1) ** 2 + (1 - 0) ** 2 + (s - 0) ** 2 + (s - 1) ** 2) / 4
    assert squared_alignment_loss(classifier, regions).item() == pytest.approx(expected)


def test_lce_forms_bring_their_own_weights_classes_and_classifier():
    authors = get_strategy("lce").from_params({})
    assert authors.config.__dict__ == {
        "form": "authors", "alignment_weight": 100.0, "boundary_weight": 1.0, "centre_classes": "seen",
        "scale": 16.0, "margin": 0.1, "replacement_teacher": "outgoing"}
    assert authors.head == get_strategy("lce").head == "cosine"            # their NormalizedClassifier
    advbct = get_strategy("lce").from_params({"form": "advbct", "boundary_weight": 3.0})
    assert (advbct.config.alignment_weight, advbct.config.boundary_weight, advbct.config.centre_classes) == (
        1.0, 3.0, "old")
    assert advbct.head == "learnable" and advbct.config.scale is None
    with pytest.raises(StrategyError, match="scale and margin are the ArcFace of form authors"):
        get_strategy("lce").from_params({"form": "advbct", "scale": 16.0})


def test_lce_authors_classification_is_their_arcface_on_cosines():
    """Target cosine 0.6 of class 0 moved by m = 0.1: cos(acos 0.6 + 0.1) = 0.6 cos 0.1 - 0.8 sin 0.1; the other
    class's cosine 0.2 kept; both times s = 16 (their res50_arcface.yaml)."""
    lce = get_strategy("lce").from_params({})
    target = 0.6 * math.cos(0.1) - 0.8 * math.sin(0.1)
    expected = -16 * target + math.log(math.exp(16 * target) + math.exp(16 * 0.2))
    step = Step(labels=torch.tensor([0]), targets=torch.tensor([0]), logits=torch.tensor([[0.6, 0.2]]),
                features=torch.randn(1, 2), from_memory=torch.zeros(1, dtype=torch.bool))
    assert lce.loss(step).item() == pytest.approx(expected, rel=1e-5)
    assert set(lce.last_terms) == {"classification"}


def test_lce_loss_adds_both_terms_to_ce():
    lce = get_strategy("lce").from_params({"form": "advbct", "alignment_weight": 2.0, "boundary_weight": 0.5})
    lce.regions = regions_at([[1.0, 0.0], [0.0, 1.0]], angle_radius=[0.1, 0.1])
    lce.model = torch.nn.Module()
    lce.model.head = torch.nn.Module()
    lce.model.head.classifier = torch.nn.Linear(2, 2, bias=False)
    logits, features, labels = torch.randn(4, 2), torch.randn(4, 2), torch.tensor([0, 1, 0, 1])
    got = lce.loss(Step(labels=labels, targets=labels, logits=logits, features=features,
                        from_memory=torch.zeros(4, dtype=torch.bool)))
    weight = lce.model.head.classifier.weight
    expected = (F.cross_entropy(logits, labels) + 2.0 * alignment_loss(weight, labels, lce.regions)
                + 0.5 * boundary_loss(features, labels, lce.regions))
    assert got.item() == pytest.approx(expected.item())


# --- RACT -----------------------------------------------------------------------------------------------------

def ract_by_loops(new, old, labels, tau, k):
    new = F.normalize(new, dim=1)
    total = 0.0
    for i in range(len(labels)):
        others = [j for j in range(len(labels)) if labels[j] != labels[i]]
        n2o = sorted((float(new[i] @ old[j]) for j in others), reverse=True)[:k or None]
        n2n = sorted((float(new[i] @ new[j]) for j in others), reverse=True)[:k or None]
        positive = float(new[i] @ old[i])
        total += -positive / tau + math.log(sum(math.exp(v / tau) for v in [positive, *n2o, *n2n]))
    return total / len(labels)


@pytest.mark.parametrize("hard_negatives", [0, 1, 10])
def test_ract_loss_by_loops(hard_negatives):
    gen = torch.Generator().manual_seed(hard_negatives)
    new, old = torch.randn(6, 4, generator=gen), F.normalize(torch.randn(6, 4, generator=gen), dim=1)
    labels = torch.tensor([0, 0, 1, 1, 2, 0])
    got = regression_alleviating_loss(new.double(), old.double(), labels, 0.5, hard_negatives)
    assert got.item() == pytest.approx(ract_by_loops(new.double(), old.double(), labels, 0.5, hard_negatives))


def test_ract_without_teacher_is_ce():
    logits, labels = torch.randn(3, 4), torch.tensor([0, 1, 2])
    step = Step(labels=labels, targets=labels, logits=logits, features=torch.randn(3, 2),
                from_memory=torch.zeros(3, dtype=torch.bool))
    assert get_strategy("ract").from_params({}).loss(step).item() == pytest.approx(
        F.cross_entropy(logits, labels).item())


# --- AdvBCT ---------------------------------------------------------------------------------------------------

def test_elastic_boundary_grows_small_radii_and_shrinks_large_ones_towards_the_threshold():
    boundary = ElasticBoundary(torch.tensor([0.4, 1.2]), threshold=1.0)
    with torch.no_grad():
        boundary.logit.zero_()                          # sigmoid = 1/2
    assert boundary(torch.tensor([0, 1])).tolist() == pytest.approx([0.4 + 0.6 / 2, 1.2 - 0.2 / 2])


def test_elastic_boundary_by_default_shrinks_each_radius_as_the_paper():
    """T = 0: R = r (1 - sigmoid(b)), the paper's r_max - r_e; at b = 0 half of each radius, and never above r."""
    assert get_strategy("advbct").from_params({}).config.threshold == 0.0
    boundary = ElasticBoundary(torch.tensor([0.4, 1.2]), threshold=0.0)
    with torch.no_grad():
        boundary.logit.zero_()
    assert boundary(torch.tensor([0, 1])).tolist() == pytest.approx([0.2, 0.6])
    with torch.no_grad():
        boundary.logit.fill_(5.0)
    assert bool((boundary(torch.tensor([0, 1])) < torch.tensor([0.4, 1.2]) * 0.01).all())


def test_elastic_boundary_loss_is_the_mean_excess_of_the_samples_outside():
    regions = regions_at([[1.0, 0.0]], distance_radius=[0.4])
    boundary = ElasticBoundary(regions.distance_radius.clone(), threshold=1.0)
    with torch.no_grad():
        boundary.logit.fill_(-100.0)                    # R = r = 0.4
    features = unit(90, 0, 180)                         # distances sqrt(2), 0, 2
    got = elastic_boundary_loss(features, torch.tensor([0, 0, 0]), regions, boundary)
    assert got.item() == pytest.approx(((math.sqrt(2) - 0.4) + (2 - 0.4)) / 2, rel=1e-6)


def test_adversarial_schedule_and_gradient_reversal():
    assert reversal_weight(0.0) == 0.0
    assert reversal_weight(0.5) == pytest.approx(2 / (1 + math.exp(-5)) - 1)
    assert adversarial_weight(0, 10) == pytest.approx(1.1) and adversarial_weight(9, 10) == pytest.approx(0.2)
    x = torch.ones(3, requires_grad=True)
    GradientReversal.apply(x, 0.25).sum().backward()
    assert x.grad.tolist() == [-0.25] * 3


def test_advbct_step_progress_drives_alpha_and_weight():
    step = Step(labels=torch.tensor([0]), targets=torch.tensor([0]), logits=torch.zeros(1, 1),
                features=torch.zeros(1, 1), from_memory=torch.zeros(1, dtype=torch.bool), iteration=15,
                iterations_per_epoch=10, epochs=3)
    assert (step.epoch, step.progress) == (1, pytest.approx(0.5))


# --- UniBCT ---------------------------------------------------------------------------------------------------

def propagated_by_series(old, new, lam, tau, dim):
    """``(1 - lambda) sum_k lambda^k S^k O``, the series the closed form sums."""
    affinity = new @ new.t() / tau
    affinity.fill_diagonal_(-math.inf)
    steps = torch.softmax(affinity, dim=dim)
    total, power = torch.zeros_like(old), old.clone()
    for _ in range(400):
        total += power
        power = lam * steps @ power
    return ((1 - lam) * total).mean(dim=0)


@pytest.mark.parametrize("transition, dim", [("rows", 1), ("columns", 0)])
def test_refined_prototype_is_the_propagation_series(transition, dim):
    gen = torch.Generator().manual_seed(3)
    old = F.normalize(torch.randn(5, 3, generator=gen, dtype=torch.float64), dim=1)
    new = F.normalize(torch.randn(5, 3, generator=gen, dtype=torch.float64), dim=1)
    got = refined_prototype(old, new, 0.9, 0.5, transition)
    assert torch.allclose(got, propagated_by_series(old, new, 0.9, 0.5, dim), atol=1e-10)


def test_column_normalised_refinement_leaves_the_class_mean_unchanged():
    gen = torch.Generator().manual_seed(4)
    old, new = torch.randn(7, 3, generator=gen), torch.randn(7, 3, generator=gen)
    assert torch.allclose(refined_prototype(old, new, 0.9, 0.05, "columns"), old.double().mean(dim=0), atol=1e-10)
    assert not torch.allclose(refined_prototype(old, new, 0.9, 0.05, "rows"), old.double().mean(dim=0), atol=1e-3)


def test_unibct_prototypes_cover_the_chosen_classes_and_are_unit():
    old = F.normalize(torch.randn(6, 3), dim=1)
    labels = torch.tensor([0, 0, 2, 2, 2, 3])
    prototypes, rows = class_prototypes(old, None, labels, [0, 2], 4, UniBCTConfig(refinement="none"))
    assert rows.tolist() == [0, -1, 1, -1]
    assert torch.allclose(prototypes[1], F.normalize(old[2:5].mean(dim=0), dim=0), atol=1e-6)


def test_arcface_adds_the_margin_to_the_target_angle_only():
    cosine = torch.tensor([[0.5, 0.5]])
    got = arcface_logits(cosine, torch.tensor([1]), scale=30.0, margin=0.3)
    assert got.tolist()[0] == pytest.approx([30 * 0.5, 30 * math.cos(math.pi / 3 + 0.3)])


# --- From the command line ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["lce", "unibct", "ract", "advbct", "bt2"])
def test_runs_on_iamcl2r_from_the_command_line(tiny, tmp_path, name):
    out = tmp_path / "out"
    assert runner.main(["--config", str(tiny), "--strategy", name, "--output", str(out)]) == 0
    record = json.loads((out / f"iamcl2r/synthetic/{name}/seed42/metrics.json").read_text())
    assert record["complete"] and [len(row) for row in record["compatibility_matrix"]] == [3, 3, 3]


@pytest.mark.parametrize("name", ["advbct", "bt2"])
def test_runs_on_cl2r_from_the_command_line(tiny, tmp_path, name):
    out = tmp_path / "out"
    assert runner.main(["--config", str(tiny), "--scenario", "cl2r", "--set", "replacement.tasks=[]",
                        "--strategy", name, "--output", str(out)]) == 0
    record = json.loads((out / f"cl2r/synthetic/{name}/seed42/metrics.json").read_text())
    assert record["complete"]


# --- BT² ----------------------------------------------------------------------------------------------------------

def test_bt2_head_keeps_the_old_frame_first_and_a_constant_norm():
    torch.manual_seed(0)
    head = BasisTransformationHead(6, 3, old_width=4, added_dims=3, scale=2.0)
    assert head.old_part == 1                                   # 4 + 3 - 6 dimensions come from the old branch
    feats = torch.rand(5, 6)
    logits, merged = head(feats)
    assert merged.shape == (5, 7) and torch.allclose(merged.norm(dim=1), torch.full((5,), 5 ** 0.5))
    new = F.normalize(feats, dim=1)
    spread = head.new_basis(2.0 * new)
    old = F.normalize(head.old_branch(feats), dim=1)            # ReLU of non-negative features changes nothing
    assert torch.allclose(merged[:, :4], head.old_basis(torch.cat([old, spread[:, :3]], dim=1)), atol=1e-6)
    assert torch.allclose(merged[:, 4:], spread[:, 3:], atol=1e-6)
    assert torch.allclose(logits, head.classifier(new)) and torch.equal(head.new_features, new)


def test_bt2_loss_by_hand():
    strategy = get_strategy("bt2").from_params({})
    labels = torch.tensor([0, 1])
    features = F.normalize(torch.tensor([[1.0, 0.0, 0.3], [0.0, 1.0, -0.2]]), dim=1)
    old = torch.tensor([[0.6, 0.8], [0.0, 1.0]])
    independent = torch.tensor([[1.0, 0.0], [0.6, 0.8]])
    new = torch.tensor([[0.8, 0.6], [0.0, 1.0]])
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0]], requires_grad=True)
    strategy.pseudo_classifier, strategy.old_width = torch.tensor([[1.0, 0.0], [0.0, 1.0]]), 2
    step = Step(labels=labels, targets=labels, logits=logits, features=features.requires_grad_(),
                from_memory=torch.zeros(2, dtype=torch.bool), teacher_raw_features=3 * old,
                independent_features=independent, new_features=new)
    compatible = torch.tensor([[1.0, 0.0], [0.0, 1.0]])         # the first two dimensions, normalised
    influence = F.cross_entropy(compatible, labels)              # identity pseudo-classifier: the logits are b
    old_gap = 1 - (0.6 + 1.0) / 2
    independent_gap = 1 - (0.8 + 0.8) / 2
    expected = (F.cross_entropy(logits, labels) + 10 * influence + 5 * old_gap + 1 * independent_gap).detach()
    assert float(strategy.loss(step).detach()) == pytest.approx(float(expected), abs=1e-6)
    step.independent_features = None                             # no independent model: the last term is dropped
    assert float(strategy.loss(step).detach()) == pytest.approx(float(expected) - independent_gap, abs=1e-6)


def test_bt2_parity_batch_moves_the_loss_with_every_term():
    from tools.parity.bt2 import batch_inputs, suite_iteration
    inputs = batch_inputs()
    full = float(suite_iteration(inputs)["loss"])
    for weight in ("influence_weight", "old_weight", "independent_weight"):
        without = float(suite_iteration(inputs, {weight: 0.0})["loss"])
        assert full - without > 0.05, weight


def test_a_wider_query_meets_an_older_gallery_on_its_first_dimensions():
    gallery = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    queries = F.normalize(torch.tensor([[0.9, 0.1, -5.0, 0.0], [0.1, 0.9, 0.0, 5.0]]), dim=1)
    assert nearest_neighbour_hits(queries, torch.tensor([0, 1]), gallery, torch.tensor([0, 1])).all()


def test_bt2_grows_the_feature_at_a_replacement_against_the_outgoing_model(tiny, tmp_path, monkeypatch):
    from cl2r_bench.training.trainers import StrategyTrainer
    calls, original = [], StrategyTrainer.train

    def spy(self, model, task, memory, **kwargs):
        teacher, independent = kwargs["teacher"], kwargs["independent"]
        calls.append({"task": task.index, "width": model.feature_width,
                      "teacher_width": None if teacher is None else teacher.feature_width,
                      "independent_width": None if independent is None else independent.feature_width})
        return original(self, model, task, memory, **kwargs)

    monkeypatch.setattr(StrategyTrainer, "train", spy)
    out = tmp_path / "out"
    assert runner.main(["--config", str(tiny), "--strategy", "bt2", "--output", str(out)]) == 0
    # task 0 starts from a replacement with nothing under it: the plain 16-d feature; task 1 fine-tunes it; task 2's
    # replacement gets a BT² head over the outgoing 16-d model (16 + 32 wide), that model as its old model and the
    # incoming replacement as its independent model
    assert calls == [{"task": 0, "width": 16, "teacher_width": 16, "independent_width": None},
                     {"task": 1, "width": 16, "teacher_width": 16, "independent_width": None},
                     {"task": 2, "width": 48, "teacher_width": 16, "independent_width": 16}]
    folder = out / "iamcl2r/synthetic/bt2/seed42"
    record = json.loads((folder / "metrics.json").read_text())
    assert record["complete"] and all(v is None or 0 <= v <= 1 for row in record["compatibility_matrix"] for v in row)
    assert runner.main(["--config", str(tiny), "--strategy", "bt2", "--output", str(out), "--resume"]) == 0


def test_unibct_does_not_embed_again_what_its_teacher_already_did(monkeypatch):
    """A fine-tuning task's model is its teacher's copy: the new model's features are the teacher's, not a second
    pass over the data; a model that differs is embedded."""
    import copy

    from cl2r_bench.data.datasets import ImageSet
    from cl2r_bench.models import build_model
    from strategies import TaskContext, unibct

    torch.manual_seed(0)
    model = build_model(backbone="small_cnn", head="learnable", num_classes=4, small_width=4, small_out_dim=8)
    data = ImageSet(torch.randint(0, 255, (16, 3, 32, 32), dtype=torch.uint8), torch.arange(4).repeat(4))
    teacher = copy.deepcopy(model)
    model.head.grow(6)
    context = TaskContext(index=1, num_old_classes=4, num_new_classes=2, teacher=teacher, new_data=data, model=model,
                          teacher_classes=4, amp=False)
    calls, original = [], unibct.embed
    monkeypatch.setattr(unibct, "embed", lambda *a, **k: calls.append(1) or original(*a, **k))
    shortcut = get_strategy("unibct").from_params({})
    shortcut.before_task(context)
    assert calls == [] and shortcut.prototypes is not None
    monkeypatch.setattr(unibct, "same_features", lambda a, b: False)      # the long way: the model embedded
    long_way = get_strategy("unibct").from_params({})
    long_way.before_task(context)
    assert calls == [1] and torch.allclose(long_way.prototypes, shortcut.prototypes, atol=1e-6)
    monkeypatch.undo()
    with torch.no_grad():
        model.backbone.proj.weight.add_(0.1)
    assert not unibct.same_features(model, teacher)
