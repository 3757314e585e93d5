"""Encoders by spec (cl2r_bench/encoders/; docs/METHODS.md §7b): each family builds offline from a local file or
a pre-filled download cache (the libraries' own download code, with only the network missing), gives the pooled
pre-logits feature the library itself computes, and a spec that cannot be built is one line before anything runs."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from cl2r_bench.encoders import EncoderError, Preprocessing, build_encoder, check_spec, encoder_backbone
from cl2r_bench.models import build_model, embed

ROOT = Path(__file__).resolve().parents[2]
IMAGES = torch.randint(0, 256, (5, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def timm_file(tmp_path_factory):
    """A state dict of timm's small test EfficientNet (random weights), as a user's local checkpoint."""
    import timm

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("timm") / "test_efficientnet.pth"
    torch.save(timm.create_model("test_efficientnet", pretrained=False).state_dict(), path)
    return path


def test_a_timm_spec_with_a_file_gives_timms_own_pre_logits_on_its_own_preprocessing(timm_file):
    import timm
    from timm.data import resolve_data_config

    encoder = build_encoder(f"timm:test_efficientnet@{timm_file}")
    reference = timm.create_model("test_efficientnet", pretrained=False)
    reference.load_state_dict(torch.load(timm_file, weights_only=True))
    reference.eval()
    config = resolve_data_config({}, model=reference)
    assert encoder.preprocessing == Preprocessing(input_size=160, resize_size=int(160 / 0.95), interpolation="bicubic",
                                                  mean=config["mean"], std=config["std"])
    with torch.no_grad():
        pixels = encoder.preprocessing(IMAGES)
        expected_features = reference.forward_head(reference.forward_features(pixels), pre_logits=True)
        logits, features = encoder(IMAGES)
    assert pixels.shape == (5, 3, 160, 160)
    torch.testing.assert_close(features, expected_features)
    torch.testing.assert_close(logits, reference(pixels))
    assert encoder.feature_dim == features.shape[1] and encoder.head.num_classes == 1000
    assert not any(p.requires_grad for p in encoder.parameters())


def test_the_tensor_preprocessing_matches_timms_pil_pipeline_up_to_interpolation_rounding(timm_file):
    """Same resize, crop and standardisation as timm's own transform of the PIL image: differences are the
    rounding of PIL's 8-bit resampling (a few hundredths of a standard deviation)."""
    import timm
    from PIL import Image
    from timm.data import create_transform, resolve_data_config

    encoder = build_encoder(f"timm:test_efficientnet@{timm_file}")
    transform = create_transform(**resolve_data_config({}, model=timm.create_model("test_efficientnet")))
    pil = [Image.fromarray(image.permute(1, 2, 0).numpy()) for image in IMAGES]
    expected = torch.stack([transform(p) for p in pil])
    ours = encoder.preprocessing(IMAGES)
    assert expected.shape == ours.shape
    assert float((ours - expected).abs().mean()) < 0.05


def test_a_torchvision_spec_loads_from_torch_hubs_cache_and_gives_the_input_of_its_classifier(tmp_path, monkeypatch):
    """The download path of torchvision's weights, with the file already in torch.hub's cache (what a user's first
    run leaves there); the feature is the input of fc, the pooled 512-d vector."""
    import torchvision

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    torch.manual_seed(1)
    reference = torchvision.models.resnet18()
    cache = tmp_path / "hub" / "checkpoints"
    cache.mkdir(parents=True)
    torch.save(reference.state_dict(), cache / "resnet18-f37072fd.pth")
    encoder = build_encoder("torchvision:resnet18:IMAGENET1K_V1")
    reference.eval()
    assert encoder.preprocessing == Preprocessing(input_size=224, resize_size=256, interpolation="bilinear",
                                                  mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    with torch.no_grad():
        pixels = encoder.preprocessing(IMAGES)
        trunk = nn.Sequential(*list(reference.children())[:-1])
        logits, features = encoder(IMAGES)
        torch.testing.assert_close(features, trunk(pixels).flatten(1))
        torch.testing.assert_close(logits, reference(pixels))


def test_a_timm_name_loads_from_a_prefilled_hugging_face_cache_without_network(timm_file, tmp_path):
    """``timm:<name>`` goes through timm's own hub download; with the file in the Hugging Face cache and
    HF_HUB_OFFLINE=1 it loads as a user's second run would, and gives the same weights as the local file."""
    from safetensors.torch import save_file

    snapshot = tmp_path / "models--timm--test_efficientnet.r160_in1k" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    save_file(torch.load(timm_file, weights_only=True), str(snapshot / "model.safetensors"))
    (tmp_path / "models--timm--test_efficientnet.r160_in1k" / "refs").mkdir()
    (tmp_path / "models--timm--test_efficientnet.r160_in1k" / "refs" / "main").write_text("a" * 40)
    code = ("from cl2r_bench.encoders import build_encoder; "
            "print(build_encoder('timm:test_efficientnet').weights_sha256)")
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == build_encoder(f"timm:test_efficientnet@{timm_file}").weights_sha256


def test_a_suite_checkpoint_is_an_encoder_with_the_suites_own_retrieval_feature(tmp_path):
    """A replacement model the suite pretrained (state dict + its .json spec) embeds as the suite embeds it."""
    model = build_model(backbone="small_cnn", head="learnable", num_classes=7, small_width=8, small_out_dim=16,
                        mean=(0.5071, 0.4867, 0.4408), std=(0.2675, 0.2565, 0.2761))
    path = tmp_path / "model.pt"
    torch.save(model.state_dict(), path)
    path.with_suffix(".json").write_text(json.dumps({
        "dataset": "tinyimagenet", "head": "learnable", "backbone": "small_cnn", "simplex_vertices_count": 1024,
        "small_width": 8, "small_out_dim": 16, "image_size": 32}))
    encoder = build_encoder(f"suite:{path}")
    torch.testing.assert_close(embed(encoder, IMAGES), embed(model, IMAGES))
    assert encoder.feature_dim == 16 and encoder.head.num_classes == 7
    torch.testing.assert_close(encoder(IMAGES)[0], model.eval()(IMAGES)[0])


def test_a_run_checkpoint_with_a_dsimplex_head_scores_classes_in_class_order(tmp_path):
    """A CL2R task checkpoint: the model is rebuilt from the run's config.yaml; class y's logit is vertex K-1-y's."""
    import yaml

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    model = build_model(backbone="small_cnn", head="dsimplex", num_classes=4, simplex_vertices_count=8,
                        small_width=8, small_out_dim=16, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    torch.save(model.state_dict(), run / "checkpoints" / "task2.pt")
    (run / "config.yaml").write_text(yaml.safe_dump({"dataset": "synthetic", "data": {"image_size": 32}, "model": {
        "backbone": "small_cnn", "simplex_classes": 8, "small_width": 8, "small_out_dim": 16}}))
    encoder = build_encoder(f"suite:{run / 'checkpoints' / 'task2.pt'}")
    logits, features = encoder(IMAGES)
    own_logits, own_features = model.eval()(IMAGES)
    torch.testing.assert_close(features, own_features)
    torch.testing.assert_close(logits, own_logits[:, model.head.targets(torch.arange(8))])


@pytest.mark.parametrize("spec, message", [
    ("timm:no_such_model_x", "timm has no model 'no_such_model_x'"),
    ("timm:resnet18@/no/such/file.pth", "file /no/such/file.pth does not exist"),
    ("torchvision:resnet18:IMAGENET9K", "resnet18 has no weights 'IMAGENET9K'"),
    ("torchvision:no_such_builder:DEFAULT", "torchvision has no model 'no_such_builder'"),
    ("torchvision:resnet18", "write torchvision:<builder>:<WEIGHTS>"),
    ("keras:resnet", "write timm:<model>[@<file>]"),
    ("suite:/no/such/model.pt", "file /no/such/model.pt does not exist"),
])
def test_a_spec_that_cannot_be_built_is_one_line(spec, message):
    with pytest.raises(EncoderError, match=message.replace("[", r"\[").replace("]", r"\]")) as info:
        check_spec(spec)
    assert "\n" not in str(info.value)


def test_weights_that_cannot_be_downloaded_are_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setattr("torch.hub.download_url_to_file", lambda *a, **k: (_ for _ in ()).throw(
        OSError("network is unreachable")))
    with pytest.raises(EncoderError, match="cannot load its weights .*resnet18-f37072fd.pth") as info:
        build_encoder("torchvision:resnet18:IMAGENET1K_V1")
    assert "\n" not in str(info.value)


def test_a_file_that_is_not_the_models_state_dict_is_one_line(tmp_path):
    path = tmp_path / "other.pth"
    torch.save({"layer.weight": torch.zeros(2, 2)}, path)
    with pytest.raises(EncoderError, match="cannot load its weights"):
        build_encoder(f"timm:test_efficientnet@{path}")


def test_an_encoder_backbone_is_trainable_under_another_head(timm_file):
    backbone = encoder_backbone(f"timm:test_efficientnet@{timm_file}")
    assert backbone.training and all(p.requires_grad for p in backbone.parameters())
    assert backbone(IMAGES).shape == (5, backbone.out_dim)


def test_weights_digest_changes_with_the_weights(timm_file, tmp_path):
    state = torch.load(timm_file, weights_only=True)
    state["conv_stem.weight"] = state["conv_stem.weight"] + 1e-3
    other = tmp_path / "other.pth"
    torch.save(state, other)
    assert build_encoder(f"timm:test_efficientnet@{timm_file}").weights_sha256 != \
        build_encoder(f"timm:test_efficientnet@{other}").weights_sha256


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["dsimplex_hoc", "er"])
def test_iamcl2r_replacements_can_be_pretrained_encoders(tiny, tmp_path, timm_file, strategy):
    """Replacement models named by spec: the task starts from the encoder's trunk and preprocessing with the
    strategy's head (the d-Simplex lift for HOC), fine-tunes, and a resumed run rebuilds the same architecture."""
    import yaml

    from cl2r_bench.app.cli import main

    torch.manual_seed(5)
    import timm

    second = tmp_path / "second.pth"
    torch.save(timm.create_model("test_efficientnet", pretrained=False).state_dict(), second)
    specs = [f"timm:test_efficientnet@{timm_file}", f"timm:test_efficientnet@{second}"]
    config = yaml.safe_load(tiny.read_text())
    config["replacement"]["checkpoints"] = specs
    config["data"]["synthetic_train_per_class"] = 8
    config["stream"]["images_per_class"] = 8
    path = tmp_path / "encoders.yaml"
    path.write_text(yaml.safe_dump(config))
    out = tmp_path / "out"
    assert main(["--config", str(path), "--scenario", "iamcl2r", "--strategy", strategy, "--output", str(out)]) == 0
    record = json.loads(next(out.rglob("metrics.json")).read_text())
    assert [r["path"] for r in record["replacement_models"]] == specs
    assert [r["source"] for r in record["replacement_models"]] == ["encoder", "encoder"]
    assert record["complete"] and len(record["compatibility_matrix"]) == 3
    state = torch.load(next(out.rglob("task1.pt")), weights_only=True)
    assert "backbone.trunk.model.conv_stem.weight" in state
    assert ("head.lift.weight" in state) == (strategy == "dsimplex_hoc")
    from cl2r_bench.app.assembly import assemble
    from cl2r_bench.app.starting_models import load_task_model
    from cl2r_bench.config import read_yaml, resolve

    run_config = resolve([("saved", read_yaml(next(out.rglob("config.yaml"))))])
    parts = assemble(run_config)
    stream = parts.scenario.stream()
    model = load_task_model(parts, stream, 1, next(out.rglob("task1.pt")).parent.parent,
                            replacements=record["replacement_models"])
    assert set(model.state_dict()) == set(state)


def test_a_replacement_spec_that_cannot_be_built_is_one_line_before_anything_runs(tiny, tmp_path, capsys):
    from cl2r_bench.app.cli import main

    code = main(["--config", str(tiny), "--scenario", "iamcl2r", "--set",
                 "replacement.checkpoints=[timm:no_such_net, timm:no_such_net]", "--output", str(tmp_path / "o")])
    assert code == 2
    assert "timm has no model 'no_such_net'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_torchvision_model_without_a_linear_classifier_is_one_line(tmp_path, monkeypatch):
    import torchvision

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    (tmp_path / "hub" / "checkpoints").mkdir(parents=True)
    torch.save(torchvision.models.squeezenet1_0().state_dict(), tmp_path / "hub" / "checkpoints" /
               "squeezenet1_0-b66bff10.pth")
    with pytest.raises(EncoderError, match="has no linear classifier"):
        build_encoder("torchvision:squeezenet1_0:IMAGENET1K_V1")


@pytest.mark.parametrize("description, message", [
    ("", "is not the model description the suite writes (JSONDecodeError"),
    ("{not json", "is not the model description the suite writes (JSONDecodeError"),
    ("[1, 2]", "lacks backbone, simplex_vertices_count"),
    ('{"backbone": "small_cnn"}', "lacks simplex_vertices_count, small_width, small_out_dim, head, dataset"),
    ("[" * 100_000, "is not the model description the suite writes (RecursionError"),
    (b'{"backbone": "sm\xe4ll_cnn"}', "(TextFileError: not UTF-8 text (byte 0xe4 at position 16)"),
])
def test_a_suite_checkpoint_with_a_damaged_description_is_one_line(tmp_path, description, message):
    model = build_model(backbone="small_cnn", head="learnable", num_classes=7, small_width=8, small_out_dim=16,
                        mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    path = tmp_path / "model.pt"
    torch.save(model.state_dict(), path)
    if isinstance(description, bytes):
        path.with_suffix(".json").write_bytes(description)
    else:
        path.with_suffix(".json").write_text(description)
    with pytest.raises(EncoderError) as error:
        build_encoder(f"suite:{path}")
    assert message in str(error.value) and "\n" not in str(error.value) and "delete the model" in str(error.value)


def test_hub_weights_with_no_network_are_one_line_at_once(tmp_path, monkeypatch, capfd):
    """With the weights on the hub, not in the Hugging Face cache, and no network, the spec fails at once (one
    probe of the hub's host) instead of after the client's 50 s of retries."""
    import huggingface_hub

    def no_network(*args, **kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr("socket.create_connection", no_network)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *a, **k: None)
    started = time.monotonic()
    with pytest.raises(EncoderError, match="huggingface.co cannot be reached and the weights are not in the Hugging "
                                           "Face cache") as info:
        build_encoder("timm:test_efficientnet")
    assert time.monotonic() - started < 5 and "\n" not in str(info.value)
    assert "Retrying" not in capfd.readouterr().err


TINY_CLIP = {"embed_dim": 24,
             "vision_cfg": {"image_size": 48, "layers": 2, "width": 32, "head_width": 16, "patch_size": 16},
             "text_cfg": {"context_length": 16, "vocab_size": 64, "width": 32, "heads": 2, "layers": 1}}


@pytest.fixture(scope="module")
def open_clip_file(tmp_path_factory):
    """A randomly initialised OpenCLIP model of a tiny config registered for the test, saved as a user's local
    checkpoint: the ``open_clip`` family end to end without a download."""
    open_clip = pytest.importorskip("open_clip")
    folder = tmp_path_factory.mktemp("open_clip")
    (folder / "cl2r-test-tiny-clip.json").write_text(json.dumps(TINY_CLIP))
    open_clip.add_model_config(folder)
    torch.manual_seed(0)
    path = folder / "tiny_clip.pt"
    torch.save(open_clip.create_model("cl2r-test-tiny-clip").state_dict(), path)
    return path


def test_an_open_clip_spec_with_a_file_gives_the_image_embedding_on_its_own_preprocessing(open_clip_file):
    import open_clip
    from PIL import Image

    encoder = build_encoder(f"open_clip:cl2r-test-tiny-clip:{open_clip_file}")
    reference, _, transform = open_clip.create_model_and_transforms("cl2r-test-tiny-clip",
                                                                    pretrained=str(open_clip_file))
    reference.eval()
    assert encoder.preprocessing == Preprocessing(input_size=48, resize_size=48, interpolation="bicubic",
                                                  mean=open_clip.OPENAI_DATASET_MEAN, std=open_clip.OPENAI_DATASET_STD)
    with torch.no_grad():
        pixels = encoder.preprocessing(IMAGES)
        logits, features = encoder(IMAGES)
        expected = reference.encode_image(pixels)
    torch.testing.assert_close(features, expected)
    assert features.shape == (5, 24) and logits.shape == (5, 0) and encoder.feature_dim == 24
    pil = torch.stack([transform(Image.fromarray(image.permute(1, 2, 0).numpy())) for image in IMAGES])
    assert pil.shape == pixels.shape and float((pixels - pil).abs().mean()) < 0.05
    assert encoder.describe()["versions"]["open_clip"] == open_clip.__version__


@pytest.mark.parametrize("spec, message", [
    ("open_clip:ViT-B-32", "write open_clip:<model>:<pretrained tag or file>"),
    ("open_clip:ViT-B-99:openai", "OpenCLIP has no model 'ViT-B-99'"),
    ("open_clip:ViT-B-32:laion9z", "OpenCLIP has no pretrained weights 'laion9z' for ViT-B-32; choose from ["),
    ("open_clip:ViT-B-32:/no/such/file.pt", "file /no/such/file.pt does not exist"),
])
def test_an_open_clip_spec_that_cannot_be_built_is_one_line(spec, message):
    pytest.importorskip("open_clip")
    with pytest.raises(EncoderError, match=message.replace("[", r"\[")) as info:
        check_spec(spec)
    assert "\n" not in str(info.value)


def test_open_clip_not_installed_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "open_clip", None)
    with pytest.raises(EncoderError, match=r"OpenCLIP is not installed; install it with pip install "
                                           r"'cl2r-bench\[open-clip\]'") as info:
        check_spec("open_clip:ViT-B-32:openai")
    assert "\n" not in str(info.value)


def test_open_clip_hub_weights_with_no_network_are_one_line_at_once(monkeypatch, capfd):
    import huggingface_hub

    pytest.importorskip("open_clip")
    monkeypatch.setattr("socket.create_connection", lambda *a, **k: (_ for _ in ()).throw(OSError("unreachable")))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *a, **k: None)
    started = time.monotonic()
    with pytest.raises(EncoderError, match="huggingface.co cannot be reached .*pass open_clip:<model>:<file>") as info:
        build_encoder("open_clip:ViT-B-32:laion2b_s34b_b79k")
    assert time.monotonic() - started < 5 and "\n" not in str(info.value)
    assert "Retrying" not in capfd.readouterr().err


PLUGIN_FAMILY = '''
from torch import nn
from cl2r_bench.encoders import EncoderFamily, EncoderParts, EncoderSpec, Preprocessing, register_encoder_family


@register_encoder_family("pooled")
class PooledFamily(EncoderFamily):
    """pooled:<size>: the image's channel means at <size> pixels, a 3-d feature without weights."""
    syntax = "pooled:<size>"

    def parse(self, rest, spec):
        return EncoderSpec("pooled", rest)

    def build(self, parsed, spec):
        size = int(parsed.name)
        preprocessing = Preprocessing(input_size=size, resize_size=size, interpolation="bilinear",
                                      mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
        return EncoderParts(nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten()), None, preprocessing, 3)
'''


def test_an_encoder_family_is_one_file_loaded_as_a_plugin(tmp_path):
    """docs/plugins.md: a family from outside the suite registers itself when its file is loaded (--plugin)."""
    from cl2r_bench.encoders import ENCODER_FAMILIES, is_spec
    from cl2r_bench.plugins import load_plugin

    path = tmp_path / "pooled_family.py"
    path.write_text(PLUGIN_FAMILY)
    try:
        load_plugin(str(path))
        encoder = build_encoder("pooled:16")
        with torch.no_grad():
            _, features = encoder(IMAGES)
        torch.testing.assert_close(features, IMAGES.float().div(255).mean(dim=(2, 3)), atol=0.02, rtol=0)
        assert is_spec("pooled:16") and encoder.preprocessing.input_size == 16
        with pytest.raises(EncoderError, match=r"or pooled:<size>$"):
            check_spec("keras:resnet")
    finally:
        ENCODER_FAMILIES.classes.pop("pooled", None)
