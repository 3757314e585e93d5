"""How the leaderboard names and summarises experiments (reporting/leaderboard.py): encoders by short name, and
no spread for a value that no seed changes."""
import pytest

from reporting.leaderboard import Column, Kind, _spread, cell_text, models_label, short_model_name


@pytest.mark.parametrize("spec, name", [
    ("timm:tf_efficientnet_lite0@results/pretrained/weights/tf_efficientnet_lite0.pth", "Lite0"),
    ("timm:tf_efficientnet_lite2", "Lite2"),
    ("suite:results/pretrained/models/learnable-resnet18-200cls-b3c40a4bcac8.pt", "ResNet-18"),
    ("torchvision:resnet50:IMAGENET1K_V2", "ResNet-50"),
    ("timm:efficientnet_b3", "EfficientNet-B3"),
    ("timm:vit_small_patch14_dinov2.lvd142m", "vit_small_patch14_dinov2.lvd142m"),
])
def test_encoders_get_short_names(spec, name):
    assert short_model_name(spec) == name


def test_a_study_is_labelled_by_its_encoders_short_names():
    record = {"models": {"old": {"spec": "timm:tf_efficientnet_lite0@w0.pth"},
                         "new": {"spec": "timm:tf_efficientnet_lite2"}}}
    assert models_label(record) == "Lite0 → Lite2" and models_label({"models": {"train": "a.npz"}}) == "embeddings"
    assert models_label({"protocol": "stream"}) == "trained on the stream"


def test_a_value_no_seed_changes_has_no_spread():
    column = Column("old/old top-1", "x", Kind.SPREAD)
    assert cell_text(_spread([51.7, 51.7, 51.7]), column) == "51.70"
    assert cell_text(_spread([51.0, 52.0]), column) == "51.50 ± 0.71"
    assert _spread([51.7]) == (51.7, None) and _spread([]) is None
