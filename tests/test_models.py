import math

import pytest
import torch

from cl2r_bench.heads import CosineHead, DSimplexHead, LearnableHead, simplex_vertices
from cl2r_bench.models import (
    CheckpointError,
    NonFiniteError,
    build_model,
    class_means,
    embed,
    feature_extractor_state,
    forward_in_batches,
    load_replacement,
    normalize,
)

MEAN, STD = (0.5071, 0.4867, 0.4408), (0.2675, 0.2565, 0.2761)


class NotATensor:
    def __init__(self, value):
        self.value = value


def small_model(head="learnable", num_classes=5, seed=0):
    torch.manual_seed(seed)
    return build_model(backbone="small_cnn", head=head, num_classes=num_classes, small_width=8,
                       small_out_dim=16).eval()


def images(n=4, seed=1):
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("k", [4, 1024])
def test_simplex_vertices_geometry(k):
    vertices = simplex_vertices(k)
    assert vertices.shape == (k, k - 1)
    assert torch.allclose(vertices.norm(dim=1), torch.ones(k), atol=1e-5)
    cosines = vertices @ vertices.t()
    off_diagonal = cosines[~torch.eye(k, dtype=torch.bool)]
    assert torch.allclose(off_diagonal, torch.full_like(off_diagonal, -1 / (k - 1)), atol=1e-5)
    assert torch.allclose(vertices.sum(dim=0), torch.zeros(k - 1), atol=1e-4)


def test_dsimplex_head_logits_and_targets():
    model = small_model("dsimplex")
    logits, features = model(images())
    assert logits.shape == (4, 1024)
    assert features.shape == (4, 1023)
    assert model.head.targets(torch.tensor([0, 1, 9])).tolist() == [1023, 1022, 1014]
    assert model.class_targets(torch.tensor([0, 5])).tolist() == [1023, 1018]


def test_dsimplex_vertices_are_frozen_and_not_stored():
    head = DSimplexHead(16)
    assert "vertices" not in head.state_dict()
    assert all(p is not head.vertices for p in head.parameters())
    assert [name for name, _ in head.named_parameters()] == ["lift.weight"]
    assert not head.vertices.requires_grad
    assert torch.equal(head.vertices, simplex_vertices(1024))


def test_dsimplex_head_rejects_too_many_classes():
    head = DSimplexHead(16, num_vertices=8)
    head.grow(8)
    with pytest.raises(ValueError):
        head.grow(9)


def test_learnable_head_grow_copies_old_rows():
    head = LearnableHead(16, 3)
    old = head.classifier.weight.detach().clone()
    head.grow(7)
    assert head.classifier.out_features == 7
    assert head.num_classes == 7
    assert torch.equal(head.classifier.weight[:3], old)
    assert head.classifier.bias is None


def test_learnable_head_grow_smaller_is_noop():
    head = LearnableHead(16, 5)
    classifier = head.classifier
    old = classifier.weight.detach().clone()
    head.grow(3)
    head.grow(5)
    assert head.classifier is classifier
    assert head.classifier.out_features == 5
    assert torch.equal(head.classifier.weight, old)


def test_rows_start_as_row_init_says_and_a_grown_heads_new_rows_too():
    """``linear``: torch's uniform in ±1/√d (standard deviation 1/√(3d)); ``partial_fc``: N(0, 0.01²) (MixBCT)."""
    torch.manual_seed(0)
    linear, partial = LearnableHead(512, 300), CosineHead(512, 300, row_init="partial_fc")
    assert float(linear.classifier.weight.abs().max()) <= 1 / math.sqrt(512)
    assert float(linear.classifier.weight.std()) == pytest.approx(1 / math.sqrt(3 * 512), rel=0.01)
    assert float(partial.classifier.weight.std()) == pytest.approx(0.01, rel=0.01)
    old = partial.classifier.weight.detach().clone()
    partial.grow(600)
    assert torch.equal(partial.classifier.weight[:300], old)
    assert float(partial.classifier.weight[300:].std()) == pytest.approx(0.01, rel=0.01)
    with pytest.raises(ValueError, match="unknown row_init 'zeros'"):
        LearnableHead(4, 2, row_init="zeros")


@pytest.mark.parametrize("head", ["learnable", "dsimplex"])
def test_embed_returns_unit_rows(head):
    embedded = embed(small_model(head), images(6), batch_size=4)
    assert embedded.shape[0] == 6
    assert torch.allclose(embedded.norm(dim=1), torch.ones(6), atol=1e-5)


def test_embed_refuses_non_finite_features():
    model = small_model("learnable")
    with torch.no_grad():
        model.backbone.proj.weight.fill_(float("nan"))
    with pytest.raises(NonFiniteError):
        embed(model, images(2))


def uint8_images(n=4, seed=1):
    return torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def test_model_normalises_uint8_images_as_the_data_transform_did():
    torch.manual_seed(0)
    model = build_model(backbone="small_cnn", head="dsimplex", num_classes=5, small_width=8, small_out_dim=16,
                        mean=MEAN, std=STD).eval()
    x = uint8_images()
    expected = (x.float() / 255.0 - torch.tensor(MEAN).view(1, -1, 1, 1)) / torch.tensor(STD).view(1, -1, 1, 1)
    assert torch.equal(model.preprocess(x), expected)
    assert torch.equal(normalize(x, MEAN, STD), expected)
    assert torch.equal(model.preprocess(x.float() / 255.0), expected)
    with torch.no_grad():
        logits, features = model(x)
        reference = model.head(model.backbone(expected))
    assert torch.equal(logits, reference[0]) and torch.equal(features, reference[1])
    assert model.input_size == 32


def test_normalisation_statistics_are_not_stored(tmp_path):
    source = build_model(backbone="small_cnn", head="learnable", num_classes=3, small_width=8, small_out_dim=16,
                         mean=MEAN, std=STD)
    assert not any(key.startswith("input_") for key in source.state_dict())
    path = tmp_path / "ckpt.pt"
    torch.save(source.state_dict(), path)
    target = build_model(backbone="small_cnn", head="learnable", num_classes=3, small_width=8, small_out_dim=16)
    target.load_state_dict(torch.load(path, weights_only=True))
    load_replacement(target, path)
    assert torch.equal(target.input_mean.flatten(), torch.zeros(3)) and torch.equal(target.input_std.flatten(),
                                                                                     torch.ones(3))


def test_forward_in_batches_restores_the_training_mode():
    model = small_model("learnable").train()
    outputs = list(forward_in_batches(model, uint8_images(5), batch_size=2, amp=False))
    assert [len(logits) for logits, _ in outputs] == [2, 2, 1]
    assert model.training


def test_class_means_ignores_labels_beyond_the_count_and_marks_absent_classes():
    features = torch.tensor([[1.0, 0.0], [3.0, 2.0], [0.0, 4.0], [9.0, 9.0]])
    means, present = class_means(features, torch.tensor([0, 0, 2, 3]), 3)
    assert torch.equal(means, torch.tensor([[2.0, 1.0], [0.0, 0.0], [0.0, 4.0]]))
    assert present.tolist() == [True, False, True]


def test_learnable_model_returns_backbone_features():
    model = small_model("learnable", num_classes=3)
    logits, features = model(images())
    assert logits.shape == (4, 3)
    assert features.shape == (4, 16)
    assert model.class_targets(torch.tensor([2, 0])).tolist() == [2, 0]


def test_feature_extractor_state_drops_classifier():
    model = small_model("learnable")
    state = feature_extractor_state(model)
    assert "head.classifier.weight" in model.state_dict()
    assert not any(key.startswith("head.classifier.") for key in state)
    assert set(state) == set(model.state_dict()) - {"head.classifier.weight"}


def test_load_replacement_across_class_counts(tmp_path):
    source = small_model("learnable", num_classes=10, seed=0)
    path = tmp_path / "ckpt.pt"
    torch.save(source.state_dict(), path)
    target = small_model("learnable", num_classes=4, seed=123)
    x = images()
    assert not torch.allclose(embed(target, x), embed(source, x))
    load_replacement(target, path)
    assert target.head.classifier.out_features == 4
    assert torch.allclose(embed(target, x), embed(source, x), atol=1e-6)


def test_load_replacement_dsimplex_round_trip(tmp_path):
    source = small_model("dsimplex", seed=0)
    path = tmp_path / "ckpt.pt"
    torch.save(source.state_dict(), path)
    target = small_model("dsimplex", seed=7)
    load_replacement(target, path)
    x = images()
    assert torch.allclose(embed(target, x), embed(source, x), atol=1e-6)


def test_load_replacement_missing_key_is_named(tmp_path):
    state = small_model().state_dict()
    del state["backbone.proj.weight"]
    path = tmp_path / "ckpt.pt"
    torch.save(state, path)
    with pytest.raises(CheckpointError, match="backbone.proj.weight"):
        load_replacement(small_model(), path)


def test_load_replacement_unexpected_key(tmp_path):
    state = small_model().state_dict()
    state["backbone.extra.weight"] = torch.zeros(3)
    path = tmp_path / "ckpt.pt"
    torch.save(state, path)
    with pytest.raises(CheckpointError, match="backbone.extra.weight"):
        load_replacement(small_model(), path)


def test_load_replacement_wrong_shape(tmp_path):
    state = small_model().state_dict()
    state["backbone.proj.weight"] = torch.zeros(17, 32)
    path = tmp_path / "ckpt.pt"
    torch.save(state, path)
    with pytest.raises(CheckpointError, match="shape"):
        load_replacement(small_model(), path)


def test_load_replacement_head_family_mismatch(tmp_path):
    path = tmp_path / "ckpt.pt"
    torch.save(small_model("learnable").state_dict(), path)
    with pytest.raises(CheckpointError, match="head.lift.weight"):
        load_replacement(small_model("dsimplex"), path)


def test_load_replacement_refuses_pickled_objects(tmp_path):
    path = tmp_path / "ckpt.pt"
    torch.save({"cfg": NotATensor(3)}, path)
    with pytest.raises(CheckpointError, match="cannot read"):
        load_replacement(small_model(), path)


def test_load_replacement_refuses_non_dict(tmp_path):
    path = tmp_path / "ckpt.pt"
    torch.save([torch.zeros(2)], path)
    with pytest.raises(CheckpointError, match="not a state dict"):
        load_replacement(small_model(), path)


def test_load_replacement_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_replacement(small_model(), tmp_path / "absent.pt")


def test_failed_load_leaves_model_untouched(tmp_path):
    state = small_model(seed=0).state_dict()
    del state["backbone.proj.bias"]
    path = tmp_path / "ckpt.pt"
    torch.save(state, path)
    target = small_model(seed=5)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(CheckpointError):
        load_replacement(target, path)
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())


def test_state_dict_with_non_tensor_values_or_keys_is_a_checkpoint_error(tmp_path):
    model = build_model(backbone="small_cnn", head="learnable", num_classes=3, small_width=8, small_out_dim=16)
    for bad in ({**model.state_dict(), "backbone.proj.bias": [0.0] * 16}, {**model.state_dict(), 3: torch.zeros(1)}):
        path = tmp_path / "bad.pt"
        torch.save(bad, path)
        with pytest.raises(CheckpointError, match="named tensors"):
            load_replacement(model, path)


@pytest.mark.parametrize("backbone", ["resnet18", "resnet18_cifar"])
def test_resnet18_backbones_give_512d_features_and_the_1023d_simplex_lift(backbone):
    learnable = build_model(backbone=backbone, head="learnable", num_classes=5)
    simplex = build_model(backbone=backbone, head="dsimplex", num_classes=5)
    images = torch.randn(2, 3, 32, 32)
    assert learnable(images)[1].shape == (2, 512) and learnable(images)[0].shape == (2, 5)
    assert simplex(images)[1].shape == (2, 1023) and simplex(images)[0].shape == (2, 1024)
    stem = learnable.backbone.net.conv1
    assert stem.kernel_size == ((7, 7) if backbone == "resnet18" else (3, 3))
