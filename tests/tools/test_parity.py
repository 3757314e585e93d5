"""The parity harness's own parts (tools/parity/): checkpoint names, data files, errors. No reference
needed."""
import importlib
import subprocess
import sys

import pytest
import torch

from cl2r_bench.data.cifar import read_cifar
from cl2r_bench.data.datasets import ImageSet
from cl2r_bench.models import build_model, feature_extractor_state


def load(name: str):
    return importlib.import_module(f"tools.parity.{name}")


common = load("common")


def test_reference_names_of_a_dsimplex_resnet_cover_every_weight():
    """The authors load non-strictly, so every suite weight must get a name of their Incremental_ResNet."""
    model = build_model(backbone="resnet18", head="dsimplex", num_classes=10)
    state = common.to_reference_state(model.state_dict(), "dsimplex")
    assert "fc1.weight" in state and state["fc1.weight"].shape == (1023, 512)
    assert state["fc2.weight"].shape == (1024, 1023)
    assert "backbone.conv1.weight" in state and "backbone.layer4.1.bn2.running_var" in state
    assert not any(k.startswith(("backbone.net.", "head.")) for k in state)
    assert len(state) == len(model.state_dict()) + 1


def test_a_learnable_replacement_gets_a_placeholder_head_their_loader_deletes():
    model = build_model(backbone="resnet18", head="learnable", num_classes=25)
    state = common.to_reference_state(feature_extractor_state(model), "learnable", classes=25)
    assert state["fc2.weight"].shape == (25, 512) and not bool(state["fc2.weight"].any())
    full = common.to_reference_state(model.state_dict(), "learnable")
    assert torch.equal(full["fc2.weight"], model.head.classifier.weight)


def test_an_unknown_weight_has_no_reference_name():
    with pytest.raises(KeyError):
        common.reference_name("head.scale")


def test_written_cifar_pickles_read_back_identically(tmp_path):
    gen = torch.Generator().manual_seed(0)
    train = ImageSet(torch.randint(0, 256, (12, 3, 32, 32), dtype=torch.uint8, generator=gen), torch.arange(12) % 3)
    test = ImageSet(torch.randint(0, 256, (6, 3, 32, 32), dtype=torch.uint8, generator=gen), torch.arange(6) % 3)
    common.write_cifar_pickles(tmp_path / "cifar-10-batches-py", train, test, ["a", "b", "c"], "cifar-10-batches-py")
    splits = read_cifar("cifar10", tmp_path, verify="off")
    assert torch.equal(splits.train.images, train.images) and torch.equal(splits.train.labels, train.labels)
    assert torch.equal(splits.test.images, test.images)
    common.write_cifar_pickles(tmp_path / "cifar-100-python", train, test, ["a", "b", "c"], "cifar-100-python")
    splits = read_cifar("cifar100", tmp_path, verify="off")
    assert torch.equal(splits.train.images, train.images) and splits.class_names == ["a", "b", "c"]


def test_first_per_class_keeps_data_set_order():
    images = ImageSet(torch.zeros(9, 3, 2, 2, dtype=torch.uint8), torch.tensor([0, 1, 0, 1, 0, 1, 2, 2, 2]))
    kept = common.first_per_class(images, 2)
    assert kept.labels.tolist() == [0, 1, 0, 1, 2, 2]


@pytest.mark.parametrize("script", ["steps", "end_to_end"])
def test_a_wrong_reference_path_is_a_one_line_error(script, tmp_path):
    args = ["--iamcl2r", str(tmp_path / "nowhere"), "--data-root", str(tmp_path), "--work", str(tmp_path)] \
        if script == "end_to_end" else ["--iamcl2r", str(tmp_path / "nowhere"), "--cl2r", "x",
                                           "--cifar10", str(tmp_path)]
    done = subprocess.run([sys.executable, "-m", f"tools.parity.{script}"] + args,
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "not a checkout of miccunifi/iamcl2r" in done.stderr


def test_fct_harness_wrong_reference_path_is_a_one_line_error(tmp_path):
    done = subprocess.run([sys.executable, "-m", "tools.parity.fct", "--ml-fct", str(tmp_path / "nowhere")],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "not a checkout of apple/ml-fct" in done.stderr


def test_fct_weights_get_ml_fct_names_and_kernel_shapes():
    """Every weight of the suite's side-projection network gets the name of ml-fct's MLP_BN_SIDE_PROJECTION
    (p1 / p2 / mixer, ConvBlock i = layers 3i..3i+2), linear weights as 1x1 kernels; their load is strict."""
    from cl2r_bench.adapters import make_adapter

    fct = load("fct")
    adapter = make_adapter("fct", {"fct": {"hidden": 8}})
    adapter.build(4, 3, 5)
    state = fct.to_reference_state(adapter.state_dict())
    assert state["p1.0.conv.weight"].shape == (8, 4, 1, 1) and state["p1.1.conv.weight"].shape == (6, 8, 1, 1)
    assert state["p2.0.conv.weight"].shape == (10, 5, 1, 1) and state["p2.1.normalizer.running_var"].shape == (6,)
    assert state["mixer.0.conv.weight"].shape == (8, 12, 1, 1) and state["mixer.1.normalizer.weight"].shape == (8,)
    assert state["mixer.2.conv.weight"].shape == (3, 8, 1, 1) and state["mixer.2.conv.bias"].shape == (3,)
    blocks = {f"{branch}.{i}" for branch, count in (("p1", 2), ("p2", 2), ("mixer", 2)) for i in range(count)}
    expected = {f"{b}.conv.weight" for b in blocks} | {"mixer.2.conv.weight", "mixer.2.conv.bias"} | {
        f"{b}.normalizer.{p}" for b in blocks
        for p in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")}
    assert set(state) == expected


def test_the_protocol_table_reads_the_paper_preset():
    rows = {r["setting"]: r for r in load("report").protocol()}
    assert rows["epoch length, tasks 1-6"]["agree"] and "36 batches" in rows["epoch length, tasks 1-6"]["suite"]
    assert rows["schedule"]["agree"] and rows["mixed precision"]["agree"]
    assert not rows["AA"]["agree"]


def test_a_reference_run_folder_is_parsed(tmp_path):
    """Their comp-matrix.txt (numpy's print of the matrix) and log lines give the matrix and the timings."""
    import numpy as np

    out = tmp_path / "out" / "20261123" / "er-cifar-045701"
    out.mkdir(parents=True)
    matrix = np.array([[0.5, 0.0, 0.0], [0.25, 0.625, 0.0], [0.125, 0.375, 0.75]])
    (out / "comp-matrix.txt").write_text(f"Compatibility Matrix ID:\n{matrix}\nAvg. Comp. = 0.33\nAM. Comp. = 43.750\n")
    (out / "train-045701-gpuNone.log").write_text(
        "23.11.2026 04:57:24       Utils[ 46]    INFO Task 1 Epoch [1]/[2]\t Training Loss: 4.0"
        "\t Training Accuracy: 2.0\t Time: 2.50\n"
        "23.11.2026 04:57:27       Utils[ 46]    INFO Task 1 Epoch [2]/[2]\t Training Loss: 3.9"
        "\t Training Accuracy: 2.8\t Time: 3.25\n"
        "23.11.2026 04:57:30 IAM-CL2R-Train[239]    INFO Starting Evaluation\n"
        "23.11.2026 04:58:10        Eval[ 89]    INFO Avg. Comp. = 0.33\n")
    parsed = load("end_to_end").parse_reference_run(tmp_path)
    assert parsed["matrix"] == [[0.5], [0.25, 0.625], [0.125, 0.375, 0.75]]
    assert parsed["train_s"] == pytest.approx(5.75) and parsed["eval_s"] == 40.0


def test_bct_line_harness_wrong_reference_path_is_a_one_line_error(tmp_path):
    done = subprocess.run([sys.executable, "-m", "tools.parity.bct_line", "--advbct", str(tmp_path / "nowhere")],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "not a checkout of Ashespt/AdvBCT" in done.stderr


def test_bct_line_batch_exercises_every_term():
    """The parity batch is not vacuous: each compatibility term moves the loss, some samples are outside their
    boundary, the IQR rule drops one item per class, and RACT's two readings differ in the gradient only."""
    bct_line = load("bct_line")
    inputs = bct_line.batch_inputs()
    off = {"lce": {"form": "advbct", "alignment_weight": 0, "boundary_weight": 0}, "ract": {"weight": 0},
           "unibct": {"weight": 0}, "advbct": {"boundary_weight": 0}}
    for name, params in off.items():
        full = bct_line.suite_iteration(name, inputs, bct_line.REFERENCE_READINGS.get("lce") if name == "lce" else None)
        without = bct_line.suite_iteration(name, inputs, params)
        assert float(full["loss"] - without["loss"]) > 0.05, name
    regions = bct_line.suite_iteration("lce", inputs)["regions"]
    assert torch.isfinite(regions.distance_radius[:6]).all() and not torch.isfinite(regions.distance_radius[6:]).any()
    paper = bct_line.suite_iteration("ract", inputs)
    reference = bct_line.suite_iteration("ract", inputs, {"detach_new_negatives": True})
    assert torch.equal(paper["loss"], reference["loss"])
    assert not torch.allclose(paper["grads"]["convnet.features"], reference["grads"]["convnet.features"])


def test_authors_parity_inputs_exercise_every_term():
    """The inputs of tools/parity/authors.py are not vacuous: LCE's alignment and boundary each move its loss by more
    than 0.05, some samples lie below their class's cosine floor, RACT's term is far from zero, and UniBCT's default
    refinement moves the prototypes away from MixBCT's (which are the plain means)."""
    import torch.nn.functional as F

    from cl2r_bench.class_regions import class_regions
    from strategies import Step, get_strategy
    from strategies.ract import regression_alleviating_loss
    from strategies.unibct import UniBCTConfig, class_prototypes

    authors = load("authors")
    inputs = {**authors.batch_inputs(), **authors.lce_inputs(), **authors.unibct_inputs()}
    regions = class_regions(inputs["lce_old_features"], inputs["lce_old_labels"], torch.arange(6), 6)
    labels, features = inputs["lce_labels"], inputs["lce_features"]

    def lce_loss(params):
        strategy = get_strategy("lce").from_params(params)
        classifier = torch.nn.Linear(32, 6, bias=False)
        with torch.no_grad():
            classifier.weight.copy_(inputs["lce_classifier"])
        strategy.regions, strategy.model = regions, torch.nn.Module()
        strategy.model.head = torch.nn.Module()
        strategy.model.head.classifier = classifier
        return float(strategy.loss(Step(labels=labels, targets=labels, logits=classifier(features), features=features,
                                        from_memory=torch.zeros(len(labels), dtype=torch.bool))).detach())

    full = lce_loss({})
    assert full - lce_loss({"alignment_weight": 0}) > 0.05 and full - lce_loss({"boundary_weight": 0}) > 0.05
    cosine = (features * regions.unit_centres[labels]).sum(dim=1)
    assert 0 < int((cosine < regions.cosine_floor[labels]).sum()) < len(labels)
    ract = regression_alleviating_loss(inputs["features"], F.normalize(inputs["old_raw_features"], dim=1),
                                       inputs["labels"], 0.01, 10)
    assert float(ract) > 0.05
    old, new, unibct_labels = inputs["unibct_old"], inputs["unibct_new"], inputs["unibct_labels"]
    rows = class_prototypes(old, new, unibct_labels, list(range(6)), 6, UniBCTConfig())[0]
    plain = class_prototypes(old, new, unibct_labels, list(range(6)), 6, UniBCTConfig(refinement="none"))[0]
    assert float((rows - plain).abs().max()) > 0.05
