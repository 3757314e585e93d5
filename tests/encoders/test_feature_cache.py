"""The feature cache (cl2r_bench/feature_cache.py): each image set is embedded once per encoder, reused, keyed by
what the features depend on, and a damaged entry is embedded again."""
import json

import pytest
import torch

from cl2r_bench.data.datasets import ImageSet
from cl2r_bench.encoders import build_encoder
from cl2r_bench.feature_cache import Sharding, cached_features

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


def sharded(encoder, cache, sharding):
    return cached_features(encoder, IMAGES, data={"dataset": "unit", "split": "test"}, cache_dir=cache,
                           batch_size=4, progress=False, log=lambda _: None, sharding=sharding)


def test_a_split_embedded_in_shards_is_one_entry_equal_to_the_whole(encoder, tmp_path):
    whole = features(encoder, tmp_path / "whole")
    pieces = sharded(encoder, tmp_path / "shards", Sharding(shards=3))
    torch.testing.assert_close(pieces.features, whole.features)
    assert torch.equal(pieces.labels, IMAGES.labels) and not pieces.cached
    assert len(list((tmp_path / "shards").glob("*.pt"))) == 1 and not list((tmp_path / "shards").glob("*.shard-*"))
    assert json.loads(next((tmp_path / "shards").glob("*.json")).read_text())["shards"] == 3
    assert sharded(encoder, tmp_path / "shards", Sharding(shards=3)).cached


def test_a_killed_embedding_keeps_its_finished_shards_and_the_next_one_embeds_only_the_rest(encoder, tmp_path,
                                                                                          monkeypatch):
    """Worker 1 of 2 takes shards 1 and 3 first; it is killed while embedding shard 3 (its second). The next
    process, worker 0, embeds shards 0 and 2, finds shard 1 done, embeds 3 again, and joins all four."""
    from cl2r_bench import feature_cache

    real, calls = feature_cache.embed_raw, []

    def dying(encoder, images, **kwargs):
        calls.append(kwargs["description"])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(encoder, images, **kwargs)

    monkeypatch.setattr(feature_cache, "embed_raw", dying)
    with pytest.raises(KeyboardInterrupt):
        sharded(encoder, tmp_path, Sharding(shards=4, worker=1, workers=2))
    assert [p.name.split(".", 1)[1] for p in tmp_path.glob("*.pt")] == ["shard-1-of-4.pt"]
    assert not list(tmp_path.glob("*.lock"))
    calls.clear()
    monkeypatch.setattr(feature_cache, "embed_raw", lambda encoder, images, **kwargs: calls.append(
        kwargs["description"]) or real(encoder, images, **kwargs))
    joined = sharded(encoder, tmp_path, Sharding(shards=4, worker=0, workers=2))
    assert [c.split()[2] for c in calls] == ["1/4", "3/4", "4/4"]
    torch.testing.assert_close(joined.features, features(encoder, tmp_path / "whole").features)
    assert len(list(tmp_path.glob("*.pt"))) == 1


def test_sharding_is_checked():
    with pytest.raises(ValueError, match="worker < workers"):
        Sharding(shards=2, worker=2, workers=2)
    assert Sharding(shards=5, worker=1, workers=2).order() == [1, 3, 0, 2, 4]


def test_feature_splits_put_each_encoders_features_side_by_side(encoder, tmp_path):
    import timm

    from cl2r_bench.data.datasets import DataSplits
    from cl2r_bench.feature_cache import feature_splits

    torch.manual_seed(1)
    path = tmp_path / "other.pth"
    torch.save(timm.create_model("test_efficientnet", pretrained=False).state_dict(), path)
    other = build_encoder(f"timm:test_efficientnet@{path}")
    data = DataSplits("unit", IMAGES, IMAGES, ["a", "b", "c"])
    split = feature_splits(data, [encoder, other], {"train": 1, "test": None}, cache_dir=tmp_path / "cache",
                           batch_size=4, progress=False, log=lambda _: None)
    width = encoder.feature_dim
    assert split.feature_columns == {encoder.spec: (0, width), other.spec: (width, 2 * width)}
    with torch.no_grad():  # the first image of each class (rows 0, 2, 4), then every image
        torch.testing.assert_close(split.train.images, torch.cat([encoder(IMAGES.images[::2])[1],
                                                                  other(IMAGES.images[::2])[1]], dim=1))
        torch.testing.assert_close(split.test.images[:, width:], other(IMAGES.images)[1])
    assert torch.equal(split.train.labels, torch.tensor([0, 1, 2]))
    alone = split.features_of(other.spec)
    assert torch.equal(alone.train.images, split.train.images[:, width:]) and alone.feature_columns == {
        other.spec: (0, width)}


def test_a_selection_is_read_from_the_whole_split_when_it_is_cached(encoder, tmp_path, monkeypatch):
    from cl2r_bench.data.datasets import DataSplits
    from cl2r_bench.feature_cache import feature_splits

    data = DataSplits("unit", IMAGES, IMAGES, ["a", "b", "c"])
    whole = feature_splits(data, [encoder], {"train": None, "test": None}, cache_dir=tmp_path, batch_size=4,
                           progress=False, log=lambda _: None)
    monkeypatch.setattr("cl2r_bench.feature_cache.embed_raw", lambda *a, **k: pytest.fail("embedded again"))
    first = feature_splits(data, [encoder], {"train": 1, "test": None}, cache_dir=tmp_path, batch_size=4,
                           progress=False, log=lambda _: None)
    assert torch.equal(first.train.images, whole.train.images[::2])
