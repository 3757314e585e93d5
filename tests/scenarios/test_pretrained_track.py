"""The pretrained-backbone track (docs/METHODS.md §4b): every model a frozen encoder's cached features under a
trainable embedding network, each model generation on its own encoder, every split embedded once per encoder.

The encoders are timm's small test EfficientNet with two random weight sets (the real EfficientNet-Lite encoders
only in the one slow test): what is checked is which features each model reads, not how good they are."""
import json
import re

import pytest
import torch
from helpers.runs import TINY, interrupt_run_at

from cl2r_bench.app.assembly import assemble
from cl2r_bench.app.run_loop import Run
from cl2r_bench.config import resolve
from cl2r_bench.data.datasets import ImageSet, load_dataset
from cl2r_bench.encoders import EncoderError, build_encoder
from cl2r_bench.errors import ConfigError
from cl2r_bench.models import EmbeddingNetwork, embed
from cl2r_bench.scenario import items_read
from cl2r_bench.settings import RunSettings
from cl2r_bench.training.engine import DeviceBatches

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def encoder_files(tmp_path_factory):
    """Two weight files of timm's test EfficientNet: two different frozen encoders."""
    import timm

    folder = tmp_path_factory.mktemp("encoders")
    specs = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        path = folder / f"encoder{seed}.pth"
        torch.save(timm.create_model("test_efficientnet", pretrained=False).state_dict(), path)
        specs.append(f"timm:test_efficientnet@{path}")
    return specs


def track(folder, specs, **changes):
    """:data:`TINY` (3 tasks, replacements at 0 and 2: two model generations) on the frozen encoders ``specs``."""
    config = dict(TINY, output=str(folder / "out"),
                  model=dict(TINY["model"], backbone="frozen_encoder", encoders=specs, embedding_width=32,
                             embedding_dim=16),
                  replacement=dict(TINY["replacement"], pretrain=dict(TINY["replacement"]["pretrain"],
                                                                      cache_dir=str(folder / "models"))),
                  model_update={"feature_cache": str(folder / "features"), "encoder_batch_size": 64})
    config.update(changes)
    return resolve([("track", config)])


def test_each_generation_reads_its_own_encoders_features_embedded_once(encoder_files, tmp_path, monkeypatch):
    config = track(tmp_path, encoder_files)
    parts = assemble(config)
    assert [parts.scenario.model_encoder(t) for t in range(3)] == [encoder_files[0], encoder_files[0],
                                                                   encoder_files[1]]
    record = Run(parts).execute()
    first, second = (build_encoder(spec) for spec in encoder_files)
    width = first.feature_dim
    stream = parts.scenario.stream()
    assert stream.feature_columns == {encoder_files[0]: (0, width), encoder_files[1]: (width, 2 * width)}
    images = parts.scenario.read_data("synthetic", None)
    raw = load_dataset("synthetic", "data", image_size=32, **RunSettings.from_config(config).data.synthetic)
    assert images.train.images.shape == (len(raw.train), 2 * width)
    with torch.no_grad():
        torch.testing.assert_close(images.test.images[:, :width], first(raw.test.images)[1])
        torch.testing.assert_close(images.test.images[:, width:], second(raw.test.images)[1])
    assert len(list((tmp_path / "features").glob("*.pt"))) == 4  # 2 encoders x (train, test)

    run = tmp_path / "out" / "iamcl2r" / "synthetic" / "dsimplex_hoc" / "seed42"
    models = [torch.load(run / "checkpoints" / f"task{t}.pt", weights_only=True) for t in range(3)]
    assert all(m["backbone.net.0.weight"].shape == (32, width) for m in models)
    rebuilt = parts.new_model(stream.tasks[2].num_seen_classes, stream.mean, stream.std, columns=(width, 2 * width))
    rebuilt.load_state_dict(models[2])
    rebuilt.eval()
    own = EmbeddingNetwork(width, 32, 16)
    own.load_state_dict({k.removeprefix("backbone."): v for k, v in models[2].items() if k.startswith("backbone.")})
    own.eval()
    with torch.no_grad():
        torch.testing.assert_close(rebuilt.backbone(stream.query.images), own(stream.query.images[:, width:]))
    pretrained = [json.loads(p.read_text()) for p in (tmp_path / "models").glob("*.json")]
    assert sorted(p["encoder"] for p in pretrained) == sorted(encoder_files)
    assert record["complete"] and len(record["compatibility_matrix"]) == 3

    monkeypatch.setattr("cl2r_bench.feature_cache.embed_raw", lambda *a, **k: pytest.fail("embedded twice"))
    again = Run(assemble(dict(config, strategy="er"))).execute()
    assert again["complete"]


def test_a_track_run_resumes_with_the_same_matrix(encoder_files, tmp_path, monkeypatch):
    config = track(tmp_path, encoder_files, strategy="bct")
    whole = Run(assemble(dict(config, output=str(tmp_path / "whole")))).execute()
    undo = interrupt_run_at(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        Run(assemble(config)).execute()
    undo()
    resumed = Run(assemble(config), resume=True).execute()
    assert resumed["compatibility_matrix"] == whole["compatibility_matrix"]


def test_upgrade_and_model_update_put_the_old_and_the_new_model_on_their_encoders(encoder_files, tmp_path):
    two_models = {"stream": dict(TINY["stream"], num_tasks=2),
                  "replacement": {"tasks": [], "pretrain": {"cache_dir": str(tmp_path / "models")}}}
    for scenario, extra in (("upgrade", {"strategy": "bct", "evaluation": dict(TINY["evaluation"],
                                                                                dataset="stream")}),
                            ("model_update", {"adapter": {"name": "procrustes"}})):
        config = track(tmp_path, encoder_files, scenario=scenario, **two_models, **extra)
        parts = assemble(config)
        assert [parts.scenario.model_encoder(t) for t in range(2)] == encoder_files
        assert Run(parts).execute()["complete"]


@pytest.mark.parametrize(("scenario", "tasks", "generations"), [
    ("iamcl2r", [0, 2, 4], [0, 0, 1, 1, 2, 2, 2]),
    ("iamcl2r", [2, 4], [0, 0, 1, 1, 2, 2, 2]),
    ("cl2r", [], [0] * 7),
])
def test_a_model_generation_starts_at_every_replacement(scenario, tasks, generations):
    config = resolve([("unit", {"scenario": scenario, "device": "cpu", "replacement": {"tasks": tasks}})])
    parts = assemble(config)
    assert [parts.scenario.model_generation(t) for t in range(7)] == generations


@pytest.mark.parametrize(("changes", "message"), [
    ({"model": {"backbone": "frozen_encoder"}}, "model.backbone=frozen_encoder needs model.encoders"),
    ({"model": {"encoders": ["efficientnet_lite:lite0"]}}, "other backbones take none"),
    ({"model": {"backbone": "frozen_encoder", "encoders": ["efficientnet_lite:lite0", "efficientnet_lite:lite2"]}},
     "this iamcl2r stream has 3 model generation(s)"),
    ({"model": {"backbone": "frozen_encoder", "encoders": ["efficientnet_lite:lite9"]}},
     "no EfficientNet-Lite variant 'lite9'"),
    ({"model": {"backbone": "frozen_encoder", "encoders": ["efficientnet_lite:lite0"]},
      "replacement": {"checkpoints": ["a.pt", "b.pt", "c.pt"]}}, "set replacement.checkpoints=[]"),
])
def test_track_settings_that_cannot_run_are_one_line_errors(changes, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("a.pt", "b.pt", "c.pt"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises((ConfigError, EncoderError), match=re.escape(message)):
        assemble(resolve([("unit", {"device": "cpu", "output": str(tmp_path), **changes})]))


def test_items_read_are_the_most_any_part_of_the_run_reads_per_class():
    settings = RunSettings.from_config(resolve([("unit", {"preset": "pretrained"})]))
    assert items_read(settings, "tinyimagenet") == {"train": 300, "test": None}
    assert items_read(settings, "cifar10") == {"train": None, "test": None}
    heldout = RunSettings.from_config(resolve([("unit", {"dataset": "tinyimagenet", "evaluation": {
        "queries_per_class": 400}, "stream": {"images_per_class": 250},
        "replacement": {"pretrain": {"images_per_class": 100}}})]))
    assert items_read(heldout, "tinyimagenet") == {"train": 400, "test": None}
    every = RunSettings.from_config(resolve([("unit", {"dataset": "tinyimagenet", "replacement": {"pretrain": {
        "images_per_class": None}}})]))
    assert items_read(every, "tinyimagenet") == {"train": None, "test": None}


def test_the_pretrained_preset_fits_each_scenario():
    encoders = {}
    for scenario in ("iamcl2r", "cl2r", "upgrade", "model_update"):
        settings = RunSettings.from_config(resolve([("unit", {"scenario": scenario, "preset": "pretrained"})]))
        assert settings.model.backbone == "frozen_encoder" and settings.dataset == "tinyimagenet"
        encoders[scenario] = [spec.split(":")[1] for spec in settings.model.encoders]
        assert settings.replacement.pretrain.lr == (0.01 if scenario == "iamcl2r" else 0.1)
        if scenario == "upgrade":
            assert (settings.stream.initial_classes, settings.stream.increment) == (100, 100)
            assert settings.evaluation.dataset == "stream"
        else:
            assert settings.evaluation.dataset == "cifar10"
    assert encoders == {"iamcl2r": ["lite0", "lite1", "lite2"], "cl2r": ["lite0"], "upgrade": ["lite0", "lite2"],
                        "model_update": ["lite0", "lite2"]}


def test_items_that_are_features_are_drawn_as_they_are():
    features = ImageSet(torch.arange(40, dtype=torch.float32).view(8, 5), torch.arange(8))
    torch.manual_seed(0)
    for items, labels, _ in DeviceBatches(features, None, new_batch=4, memory_batch=4, epoch_length="reference"):
        torch.testing.assert_close(items, features.images[labels])


def test_the_efficientnet_lite_family_gives_timms_model_on_the_packages_weights():
    from cl2r_bench.encoders.convert_efficientnet_lite import convert

    encoder = build_encoder("efficientnet_lite:lite0")
    images = torch.randint(0, 256, (2, 3, 64, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    import timm

    reference = timm.create_model("tf_efficientnet_lite0", pretrained=False)
    reference.load_state_dict(convert("lite0"))
    reference.eval()
    with torch.no_grad():
        expected = reference.forward_head(reference.forward_features(encoder.preprocessing(images)), pre_logits=True)
    torch.testing.assert_close(embed(encoder, images, amp=False), torch.nn.functional.normalize(expected))
    assert encoder.feature_dim == 1280 and encoder.preprocessing.input_size == 224
    assert encoder.describe()["spec"] == "efficientnet_lite:lite0"


def test_runner_embed_fills_the_cache_every_run_of_the_track_reads(encoder_files, tmp_path, monkeypatch):
    import yaml

    from cl2r_bench.app.cli import main

    config = track(tmp_path, encoder_files)
    (tmp_path / "track.yaml").write_text(yaml.safe_dump(config))
    assert main(["embed", "--config", str(tmp_path / "track.yaml"), "--shards", "2", "--no-progress"]) == 0
    assert len(list((tmp_path / "features").glob("*.pt"))) == 4 and not list((tmp_path / "features").glob("*shard*"))
    monkeypatch.setattr("cl2r_bench.feature_cache.embed_raw", lambda *a, **k: pytest.fail("embedded twice"))
    assert Run(assemble(config)).execute()["complete"]
