"""The feature cache (cl2r_bench/feature_cache.py): each image set is embedded once per encoder, reused, keyed by
what the features depend on, and a damaged entry is embedded again."""
import json

import pytest
import torch

from cl2r_bench.data.datasets import ImageSet
from cl2r_bench.encoders import build_encoder
from cl2r_bench.feature_cache import cached_features

IMAGES = ImageSet(torch.randint(0, 256, (6, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(3)),
                  torch.tensor([0, 0, 1, 1, 2, 2]))


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    import timm

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("timm") / "test_efficientnet.pth"
    torch.save(timm.create_model("test_efficientnet", pretrained=False).state_dict(), path)
    return build_encoder(f"timm:test_efficientnet@{path}")


def features(encoder, cache, images=IMAGES, **data):
    return cached_features(encoder, images, data={"dataset": "unit", "split": "test", **data}, cache_dir=cache,
                           batch_size=4, progress=False, log=lambda _: None)


def test_a_set_is_embedded_once_then_read_back_identically(encoder, tmp_path, monkeypatch):
    first = features(encoder, tmp_path)
    assert not first.cached and first.features.shape == (6, encoder.feature_dim)
    with torch.no_grad():
        torch.testing.assert_close(first.features, encoder(IMAGES.images)[1])
    monkeypatch.setattr("cl2r_bench.feature_cache.embed_raw", lambda *a, **k: pytest.fail("embedded twice"))
    second = features(encoder, tmp_path)
    assert second.cached
    assert torch.equal(second.features, first.features) and torch.equal(second.labels, IMAGES.labels)
    entries = list(tmp_path.glob("*.json"))
    assert len(entries) == 1
    about = json.loads(entries[0].read_text())
    assert about["encoder"]["weights_sha256"] == encoder.weights_sha256 and about["data"]["images"] == 6


def test_other_images_or_another_split_name_are_other_entries(encoder, tmp_path):
    features(encoder, tmp_path)
    other = ImageSet(IMAGES.images.flip(0), IMAGES.labels)
    assert not features(encoder, tmp_path, images=other).cached
    assert not features(encoder, tmp_path, split="train").cached
    assert len(list(tmp_path.glob("*.pt"))) == 3


@pytest.mark.parametrize("damage", [lambda p: p.write_bytes(p.read_bytes()[:100]),
                                    lambda p: torch.save({"features": torch.zeros(2, 2)}, p)])
def test_a_damaged_entry_is_embedded_again(encoder, tmp_path, damage):
    first = features(encoder, tmp_path)
    damage(next(tmp_path.glob("*.pt")))
    again = features(encoder, tmp_path)
    assert not again.cached
    assert torch.equal(again.features, first.features)
