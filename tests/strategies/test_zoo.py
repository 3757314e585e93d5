"""The strategy zoo (METHODS.md §6): each loss against a hand computation, frozen parts, configs, plugins."""
import copy
import dataclasses
import json
import math
import sys

import pytest
import torch
import torch.nn.functional as F
import yaml

from cl2r_bench.app import cli as runner
from cl2r_bench.app.assembly import assemble
from cl2r_bench.config import CONFIG_DIR, resolve
from cl2r_bench.data.datasets import ImageSet
from cl2r_bench.heads import simplex_vertices
from cl2r_bench.models import build_model
from cl2r_bench.training.engine import ReplayMemory
from cl2r_bench.training.loop import train_task
from cl2r_bench.training_settings import TrainSettings
from strategies import Step, StrategyError, TaskContext, get_strategy, list_strategies
from strategies.bct import influence_loss, old_classifier
from strategies.cvs import nearest_negative_triplet_loss, prototype_loss
from strategies.fd import distillation_weight, feature_distillation_loss
from strategies.lwf import distillation_loss

ZOO = [n for n in list_strategies() if get_strategy(n).__module__.startswith("strategies.")]  # the built-in ones
MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


def log_sum_exp(*values):
    return math.log(sum(math.exp(v) for v in values))


def step(labels, logits, features, from_memory=None, teacher_features=None, teacher_logits=None, targets=None):
    labels = torch.tensor(labels)
    return Step(labels=labels, targets=labels if targets is None else targets,
                logits=torch.tensor(logits, dtype=torch.float), features=torch.tensor(features, dtype=torch.float),
                from_memory=torch.tensor(from_memory or [False] * len(labels)),
                teacher_features=None if teacher_features is None else F.normalize(
                    torch.tensor(teacher_features, dtype=torch.float), dim=1),
                teacher_logits=None if teacher_logits is None else torch.tensor(teacher_logits, dtype=torch.float))


def context(num_old, num_new, teacher_classes=0, teacher=None, memory=None, new_data=None, index=1, model=None):
    return TaskContext(index=index, num_old_classes=num_old, num_new_classes=num_new,
                       teacher_classes=teacher_classes, teacher=teacher, new_data=new_data, memory=memory,
                       model=model)


def teacher_features(teacher, data):
    """Reference features: the teacher's un-normalised outputs, one plain forward in eval mode of its backbone and
    head on images normalised here with MEAN / STD (the statistics the teacher was built with)."""
    with torch.no_grad():
        teacher.eval()
        return teacher.head(teacher.backbone((data.images.float() / 255 - torch.tensor(MEAN).view(1, 3, 1, 1))
                                             / torch.tensor(STD).view(1, 3, 1, 1)))[1]


def test_zoo_is_registered_with_the_documented_heads_and_memory():
    expected = {"er": ("learnable", True, False), "cores": ("dsimplex", True, False),
                "bct": ("learnable", False, True), "bct_er": ("learnable", True, True),
                "lwf": ("learnable", False, True), "fd": ("learnable", True, True),
                "dsimplex_fd": ("dsimplex", True, True), "dsimplex_hoc": ("dsimplex", True, True),
                "cvs": ("cosine", True, True), "lce": ("cosine", True, True), "unibct": ("learnable", True, True),
                "ract": ("learnable", True, True), "advbct": ("learnable", True, True), "bt2": ("bt2", False, True),
                "mixbct": ("cosine", True, True), "oca": ("oca", False, True)}
    assert set(expected) == set(ZOO), "every built-in strategy has its documented head, memory and teacher here"
    for name, (head, memory, teacher) in expected.items():
        cls = get_strategy(name)
        assert (cls.head, cls.uses_memory, cls.needs_teacher) == (head, memory, teacher), name


def test_each_strategy_default_is_written_once_and_saved_with_the_run_config():
    assert yaml.safe_load((CONFIG_DIR / "default.yaml").read_text())["strategy_params"] == {}
    for name in ZOO:
        defaults = dataclasses.asdict(get_strategy(name).Config())  # a default of None is resolved by the Config
        assert assemble(resolve([("test", {"strategy": name})])).config["strategy_params"] == {name: defaults}, name


@pytest.mark.parametrize("name", [n for n in ZOO if get_strategy(n).needs_teacher])
def test_docstring_says_what_happens_at_a_replacement(name):
    cls = get_strategy(name)
    doc = (cls.__doc__ or "") + sys.modules[cls.__module__].__doc__
    assert "replacement" in doc and ("incoming" in doc or "outgoing" in doc)


@pytest.mark.parametrize("name", [n for n in ZOO if get_strategy(n).needs_teacher])
def test_replacement_teacher_is_validated(name):
    assert get_strategy(name).from_params({"replacement_teacher": "outgoing"}).replacement_teacher == "outgoing"
    with pytest.raises(StrategyError, match=f"strategy_params.{name}.replacement_teacher"):
        get_strategy(name).from_params({"replacement_teacher": "previous"})


# --- FD and d-Simplex-FD --------------------------------------------------------------------------------------

def test_fd_weight_is_five_sqrt_new_over_old():
    assert distillation_weight(5.0, 15, 10) == pytest.approx(5 * math.sqrt(1.5))
    assert distillation_weight(5.0, 15, 70) == pytest.approx(5 * math.sqrt(15 / 70))
    assert distillation_weight(5.0, 15, 0) == 0.0
    assert distillation_weight(5.0, 15, 10, adaptive=False) == 5.0


def test_fd_loss_by_hand_on_the_old_classes_samples():
    # One old class (0) and one new (1): cos(new_1, old_1) = cos((0,1), (1,0)) = 0; cos(new_2, old_2) = cos((1,1),
    # (0,1)) = 1/sqrt 2; sample 0, of the new class, is not distilled. lambda = 5 sqrt(1 / 1).
    teacher = [[0.0, 1.0], [1.0, 0.0], [0.0, 1.0]]
    logits, features = [[2.0, 0.0], [0.0, 1.0], [1.0, 3.0]], [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]
    ce = (0 + log_sum_exp(2, 0) - 0 + log_sum_exp(0, 1) - 1 + log_sum_exp(1, 3)) / 3
    fd = ((1 - 0) + (1 - 1 / math.sqrt(2))) / 2
    replayed = step([1, 0, 0], logits, features, from_memory=[False, True, True], teacher_features=teacher)
    upgrade = step([1, 0, 0], logits, features, teacher_features=teacher)     # old classes in the new data, no memory
    for name in ("fd", "dsimplex_fd"):
        strategy = get_strategy(name).from_params({})
        strategy.before_task(context(1, 1, teacher=torch.nn.Linear(1, 1)))
        for batch in (replayed, upgrade):
            assert float(strategy.loss(batch)) == pytest.approx(ce + 5 * fd, abs=1e-5)
            assert float(strategy.last_terms["distillation"]) == pytest.approx(5 * fd, abs=1e-6)
    memory_only = get_strategy("fd").from_params({"samples": "memory"})
    memory_only.before_task(context(1, 1, teacher=torch.nn.Linear(1, 1)))
    assert float(memory_only.loss(replayed)) == pytest.approx(ce + 5 * fd, abs=1e-5)
    assert float(memory_only.loss(upgrade)) == pytest.approx(ce, abs=1e-6)
    everywhere = get_strategy("fd").from_params({"samples": "all", "adaptive": False, "lambda_base": 2.0})
    everywhere.before_task(context(1, 1, teacher=torch.nn.Linear(1, 1)))
    assert float(everywhere.loss(replayed)) == pytest.approx(ce + 2 * (1 + 1 + 1 - 1 / math.sqrt(2)) / 3, abs=1e-5)


def test_fd_without_old_class_samples_or_teacher_is_ce():
    s = step([10, 11], [[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [0.0, 1.0]], teacher_features=[[0.0, 1.0], [1.0, 0]],
             targets=torch.tensor([0, 1]))
    strategy = get_strategy("fd").from_params({})
    strategy.before_task(context(10, 15, teacher=torch.nn.Linear(1, 1)))
    assert torch.allclose(strategy.loss(s), F.cross_entropy(s.logits, s.targets))
    assert float(feature_distillation_loss(s.features, s.teacher_features, torch.zeros(2, dtype=torch.bool))) == 0
    strategy.before_task(context(10, 15))
    assert strategy.weight == 0.0


# --- BCT / BCT-ER ---------------------------------------------------------------------------------------------

def test_bct_old_classifier_extends_trained_rows_with_class_means():
    trained = torch.tensor([[1.0, 0.0], [0.0, 2.0]])                      # classes 0, 1; mean row norm 1.5
    features = torch.tensor([[3.0, 0.0], [1.0, 0.0], [0.0, 4.0], [9.0, 9.0]])
    labels = torch.tensor([2, 2, 3, 0])                                  # class 0 keeps its trained row
    rows, row_of = old_classifier(trained, features, labels, 5, "match_norm")
    assert torch.allclose(rows, torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.5, 0.0], [0.0, 1.5]]))
    assert row_of.tolist() == [0, 1, 2, 3, -1]                           # class 4 has no data: no row
    raw, _ = old_classifier(trained, features, labels, 5, "raw")
    assert torch.allclose(raw[2:], torch.tensor([[2.0, 0.0], [0.0, 4.0]]))
    only_means, row_of = old_classifier(trained[:0], features, labels, 4, "match_norm")
    assert torch.allclose(only_means, torch.tensor([[9.0, 9.0], [2.0, 0.0], [0.0, 4.0]]))
    assert row_of.tolist() == [0, -1, 1, 2]
    trained_only, row_of = old_classifier(trained, features, labels, 5, "none")
    assert torch.equal(trained_only, trained) and row_of.tolist() == [0, 1, -1, -1, -1]


def test_bct_loss_by_hand():
    rows = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.5, 0.0]])
    row_of = torch.tensor([0, 1, 2, -1])
    s = step([2, 3], [[0.0, 1.0, 2.0, 0.5], [1.0, 0.0, 0.0, 3.0]], [[1.0, 1.0], [2.0, 0.0]])
    # sample 0 (class 2): W_old x = (1, 2, 1.5); sample 1 (class 3) has no old row and is left out.
    influence = -1.5 + log_sum_exp(1, 2, 1.5)
    assert float(influence_loss(s.features, s.labels, rows, row_of)) == pytest.approx(influence, abs=1e-6)
    ce = (-2 + log_sum_exp(0, 1, 2, 0.5) - 3 + log_sum_exp(1, 0, 0, 3)) / 2
    strategy = get_strategy("bct").from_params({"influence_weight": 0.5})
    strategy.old_rows, strategy.row_of_label = rows, row_of
    assert float(strategy.loss(s)) == pytest.approx(ce + 0.5 * influence, abs=1e-5)


def small_model(head, classes=4):
    torch.manual_seed(0)
    return build_model(backbone="small_cnn", head=head, num_classes=classes, small_width=8, small_out_dim=16,
                       mean=MEAN, std=STD)


def images(n, labels, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return ImageSet(torch.randint(0, 256, (n, 3, 16, 16), dtype=torch.uint8, generator=gen), labels)


def test_bct_er_builds_old_classifier_from_teacher_rows_and_means():
    teacher = small_model("learnable", classes=4).eval()
    new_data = images(12, torch.tensor([4, 5] * 6))
    memory = images(8, torch.tensor([0, 1, 2, 3] * 2), seed=1)
    strategy = get_strategy("bct_er").from_params({"new_class_rows": "raw"})
    strategy.before_task(context(4, 2, teacher_classes=4, teacher=teacher, memory=memory, new_data=new_data))
    assert torch.equal(strategy.old_rows[:4], teacher.head.classifier.weight.detach())
    feats = teacher_features(teacher, new_data)
    assert torch.allclose(strategy.old_rows[4], feats[0::2].mean(0), atol=1e-5)
    assert torch.allclose(strategy.old_rows[5], feats[1::2].mean(0), atol=1e-5)
    assert strategy.row_of_label.tolist() == [0, 1, 2, 3, 4, 5]
    # at an incoming replacement the teacher knows no class: every row is a class mean (memory included)
    strategy.before_task(context(4, 2, teacher_classes=0, teacher=teacher, memory=memory, new_data=new_data))
    mem_feats = teacher_features(teacher, memory)
    assert torch.allclose(strategy.old_rows[0], mem_feats[0::4].mean(0), atol=1e-5)


# --- LwF ------------------------------------------------------------------------------------------------------

def test_lwf_distillation_by_hand():
    # T = 2: teacher (0, 1) -> softmax(0, 0.5); student (1, 0) -> log softmax(0.5, 0)
    p = [1 / (1 + math.exp(0.5)), math.exp(0.5) / (1 + math.exp(0.5))]
    log_q = [0.5 - log_sum_exp(0.5, 0), 0 - log_sum_exp(0.5, 0)]
    expected = -(p[0] * log_q[0] + p[1] * log_q[1])
    assert float(distillation_loss(torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]]), 2.0)) == \
        pytest.approx(expected, abs=1e-6)


def test_lwf_distils_only_the_old_classes():
    s = step([2], [[1.0, 0.0, 3.0]], [[1.0, 0.0]], teacher_features=[[1.0, 0.0]],
             teacher_logits=[[0.0, 1.0, 50.0]])
    strategy = get_strategy("lwf").from_params({"kd_weight": 2.0})
    strategy.before_task(context(2, 1, teacher_classes=2, teacher=torch.nn.Linear(1, 1)))
    ce = -3 + log_sum_exp(1, 0, 3)
    kd = float(distillation_loss(torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]]), 2.0))
    assert float(strategy.loss(s)) == pytest.approx(ce + 2 * kd, abs=1e-5)
    strategy.before_task(context(2, 1, teacher_classes=0, teacher=torch.nn.Linear(1, 1), index=2))
    assert float(strategy.loss(s)) == pytest.approx(ce, abs=1e-5)


# --- CVS ------------------------------------------------------------------------------------------------------

def test_cvs_triplet_by_hand():
    anchors = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    teacher = torch.tensor([[0.0, 1.0], [0.0, 1.0], [1.0, 0.0]])
    labels = torch.tensor([0, 1, 1])
    # anchor 0 (class 0): positive (0,1) at sqrt 2; nearest class-1 teacher is (1,0) at 0 -> sqrt 2 + 0.1
    # anchor 1 (class 1): positive (0,1) at 0; its only class-0 teacher is (0,1) at 0 -> 0.1
    # anchor 2 (class 1): positive (1,0) at sqrt 0.8; class-0 teacher (0,1) at sqrt 0.4 -> sqrt .8 - sqrt .4 + .1
    expected = ((math.sqrt(2) + 0.1) + 0.1 + (math.sqrt(0.8) - math.sqrt(0.4) + 0.1)) / 3
    assert float(nearest_negative_triplet_loss(anchors, teacher, labels, 0.1)) == pytest.approx(expected, abs=1e-5)
    one_class = torch.tensor([0, 0, 0])
    assert float(nearest_negative_triplet_loss(anchors, teacher, one_class, 0.1)) == 0.0


def test_cvs_prototype_loss_by_hand():
    prototypes = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    has = torch.tensor([True, True])
    features = torch.tensor([[0.0, 1.0], [0.5, 0.5], [1.0, 0.0]])
    labels = torch.tensor([0, 1, 2])                                     # class 2 is new: no prototype
    assert float(prototype_loss(features, labels, prototypes, has)) == pytest.approx((2.0 + 0.0) / 2)
    assert float(prototype_loss(features, labels, prototypes, torch.tensor([False, True]))) == 0.0


def test_cvs_total_loss_weights_and_temperature():
    s = step([0, 1], [[0.5, -0.2], [0.1, 0.9]], [[2.0, 0.0], [0.0, 3.0]], teacher_features=[[0.6, 0.8], [0.0, 1.0]])
    strategy = get_strategy("cvs").from_params({})
    strategy.prototypes, strategy.has_prototype = torch.tensor([[0.0, 1.0]]), torch.tensor([True])
    ce = (-10 + log_sum_exp(10, -4) - 18 + log_sum_exp(2, 18)) / 2
    unit = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    triplet = float(nearest_negative_triplet_loss(unit, s.teacher_features, s.labels, 0.1))
    expected = ce + 10 * triplet + 1 * 2.0 / 1
    assert float(strategy.loss(s)) == pytest.approx(expected, abs=1e-4)


def test_cvs_prototypes_are_old_class_means_of_normalised_teacher_features():
    """From the replay memory in a stream, from the new training set's old-class images in the upgrade protocol."""
    teacher = small_model("cosine").eval()
    memory = images(6, torch.tensor([0, 1, 2] * 2))
    new = images(4, torch.tensor([3, 4] * 2))
    unit = F.normalize(teacher_features(teacher, memory), dim=1)
    strategy = get_strategy("cvs").from_params({})
    strategy.before_task(context(3, 2, teacher_classes=3, teacher=teacher, memory=memory, new_data=new))
    assert strategy.prototypes.shape == (3, unit.shape[1])
    assert torch.allclose(strategy.prototypes[1], (unit[1] + unit[4]) / 2, atol=1e-5)
    both = ImageSet(torch.cat([new.images, memory.images]), torch.cat([new.labels, memory.labels]))
    strategy.before_task(context(3, 2, teacher_classes=3, teacher=teacher, new_data=both))
    assert torch.allclose(strategy.prototypes[1], (unit[1] + unit[4]) / 2, atol=1e-5)


def test_cosine_head_logits_are_cosines():
    model = small_model("cosine")
    x = torch.randn(4, 3, 16, 16)
    logits, feats = model(x)
    expected = F.normalize(feats, dim=1) @ F.normalize(model.head.classifier.weight, dim=1).t()
    assert torch.allclose(logits, expected, atol=1e-6) and logits.abs().max() <= 1 + 1e-6


# --- CoReS ----------------------------------------------------------------------------------------------------

def test_cores_is_cross_entropy_on_simplex_vertices():
    labels = torch.tensor([0, 3])
    logits = torch.randn(2, 1024, generator=torch.Generator().manual_seed(0))
    s = Step(labels=labels, targets=1023 - labels, logits=logits, features=torch.randn(2, 1023),
             from_memory=torch.zeros(2, dtype=torch.bool))
    assert torch.allclose(get_strategy("cores").from_params({}).loss(s), F.cross_entropy(logits, 1023 - labels))


# --- What must stay frozen ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [n for n in ZOO if get_strategy(n).needs_teacher])
def test_training_leaves_teacher_and_fixed_parts_unchanged(name):
    cls = get_strategy(name)
    teacher = small_model(cls.head, classes=4)
    model = copy.deepcopy(teacher)
    model.head.grow(6)
    teacher_before = {k: v.clone() for k, v in teacher.state_dict().items()}
    new_data = images(48, torch.tensor([4, 5] * 24))
    memory = images(16, torch.tensor([0, 1, 2, 3] * 4), seed=1) if cls.uses_memory else None
    strategy = cls.from_params({})
    teacher.eval().requires_grad_(False)
    strategy.before_task(context(4, 2, teacher_classes=4, teacher=teacher, memory=memory, new_data=new_data,
                                 model=model))
    frozen_rows = None if getattr(strategy, "old_rows", None) is None else strategy.old_rows.clone()
    before = {k: v.clone() for k, v in model.named_parameters()}
    settings = TrainSettings.with_defaults(epochs=2, batch_size=16, new_batch_size=8, memory_batch_size=8, lr=0.05,
                             progress=False)
    replay = ReplayMemory(per_class=4, run_seed=0, items=memory)
    train_task(model, strategy, new_data, replay, settings, teacher=teacher)
    assert all(torch.equal(teacher_before[k], v) for k, v in teacher.state_dict().items())
    assert all(p.grad is None for p in teacher.parameters())
    assert any(not torch.equal(before[k], p) for k, p in model.named_parameters())
    if frozen_rows is not None:
        assert torch.equal(frozen_rows, strategy.old_rows) and not strategy.old_rows.requires_grad
    if cls.head == "dsimplex":
        assert torch.equal(model.head.vertices, simplex_vertices(1024))
        assert not model.head.vertices.requires_grad


# --- Replacement teacher inside a run -------------------------------------------------------------------------

@pytest.mark.parametrize("choice, expected", [("incoming", [(0, True, 0), (1, False, 4), (2, True, 0)]),
                                              ("outgoing", [(0, True, 0), (1, False, 4), (2, True, 8)])])
def test_run_gives_the_chosen_teacher_at_a_replacement(tiny, tmp_path, monkeypatch, choice, expected):
    seen = []
    lwf = get_strategy("lwf")
    original = lwf.before_task

    def spy(self, ctx):
        seen.append((ctx.index, ctx.replacement, ctx.teacher_classes))
        return original(self, ctx)

    monkeypatch.setattr(lwf, "before_task", spy)
    assert runner.main(["--config", str(tiny), "--strategy", "lwf", "--output", str(tmp_path / "out"),
                        "--set", f"strategy_params.lwf.replacement_teacher={choice}"]) == 0
    assert seen == expected


# --- A strategy from outside the package ----------------------------------------------------------------------

TOY = '''
from dataclasses import dataclass
import torch.nn.functional as F
from cl2r_bench.strategy import Step, Strategy, TaskContext, register_strategy

CALLS = []

@dataclass(frozen=True)
class ToyConfig:
    smoothing: float = 0.0

@register_strategy("toy_smoothing")
class ToySmoothing(Strategy):
    """Cross-entropy with label smoothing (a plugin used by the tests)."""
    head = "learnable"
    Config = ToyConfig

    def before_task(self, context: TaskContext) -> None:
        CALLS.append(context.index)

    def loss(self, step: Step):
        return F.cross_entropy(step.logits, step.targets, label_smoothing=self.config.smoothing)
'''


def test_plugin_strategy_runs_end_to_end(tiny, tmp_path, capsys):
    plugin = tmp_path / "toy_plugin.py"
    plugin.write_text(TOY)
    out = tmp_path / "out"
    assert runner.main(["--config", str(tiny), "--plugin", str(plugin), "--strategy", "toy_smoothing",
                        "--set", "strategy_params.toy_smoothing.smoothing=0.1", "--output", str(out)]) == 0
    record = json.loads((out / "iamcl2r/synthetic/toy_smoothing/seed42/metrics.json").read_text())
    assert record["complete"] and record["strategy"] == "toy_smoothing"
    assert record["config"]["plugins"] == [str(plugin)]
    assert record["config"]["strategy_params"]["toy_smoothing"] == {"smoothing": 0.1}
    assert [len(row) for row in record["compatibility_matrix"]] == [3, 3, 3]
    assert sys.modules[get_strategy("toy_smoothing").__module__].CALLS == [0, 1, 2]
    assert "toy_smoothing" in capsys.readouterr().out


def test_plugin_errors_are_one_line(tiny, tmp_path, capsys):
    assert runner.main(["--config", str(tiny), "--plugin", str(tmp_path / "missing.py"), "--strategy", "er"]) == 2
    assert "missing.py does not exist" in capsys.readouterr().err
    broken = tmp_path / "broken_plugin.py"
    broken.write_text("import not_a_module_anywhere\n")
    assert runner.main(["--config", str(tiny), "--plugin", str(broken), "--strategy", "er"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: plugin") and "ModuleNotFoundError" in err and len(err.strip().splitlines()) == 1


def test_readme_strategy_example_runs_as_a_plugin(tiny, tmp_path):
    readme = (CONFIG_DIR.parents[1] / "README.md").read_text()
    section = readme[readme.index("### Adding a strategy"):]
    code = section[section.index("```python") + len("```python"):section.index("```", section.index("```python") + 3)]
    plugin = tmp_path / "smooth_er.py"
    plugin.write_text(code)
    out = tmp_path / "out"
    assert runner.main(["--config", str(tiny), "--plugin", str(plugin), "--strategy", "smooth_er",
                        "--output", str(out)]) == 0
    record = json.loads((out / "iamcl2r/synthetic/smooth_er/seed42/metrics.json").read_text())
    defaults = dataclasses.asdict(get_strategy("smooth_er").Config())
    assert record["complete"] and record["config"]["strategy_params"]["smooth_er"] == defaults
