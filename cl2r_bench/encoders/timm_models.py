"""``timm:<model name>[@<file>]``: any timm model with its pretrained weights (docs/METHODS.md §7b).

The weights come through timm's own cache and download (Hugging Face hub or URL; a user with internet gets them by
name); ``@<file>`` loads a local checkpoint instead, through timm's ``pretrained_cfg_overlay=dict(file=...)`` (for
example the converted EfficientNet-Lite weights of ``python -m cl2r_bench.encoders.convert_efficientnet_lite``).
Preprocessing: ``timm.data.resolve_data_config`` (input size, crop fraction, interpolation, mean, std). Retrieval
feature: ``forward_head(forward_features(x), pre_logits=True)``, the pooled (and, where the model has one, normed)
pre-logits embedding; the classifier is ``get_classifier()``.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cl2r_bench.encoders.base import (
    EncoderError,
    EncoderFamily,
    EncoderParts,
    EncoderSpec,
    Preprocessing,
    hf_hub_unreachable,
    register_encoder_family,
    unavailable,
)


class TimmTrunk(nn.Module):
    """A timm model up to its pre-logits: ``forward_head(forward_features(x), pre_logits=True)``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.forward_head(self.model.forward_features(x), pre_logits=True)


@register_encoder_family("timm")
class TimmFamily(EncoderFamily):
    syntax = "timm:<model>[@<file>]"

    def parse(self, rest: str, spec: str) -> EncoderSpec:
        name, _, file = rest.partition("@")
        return EncoderSpec("timm", name, file=file or None)

    def check(self, parsed: EncoderSpec, spec: str) -> None:
        import timm

        if not timm.is_model(parsed.name):
            close = timm.list_models(f"*{parsed.name.split('.')[0][:12]}*")[:5]
            raise EncoderError(f"encoder {spec!r}: timm has no model {parsed.name!r}"
                               + (f"; close names: {', '.join(close)}" if close else "; see timm.list_models()"))
        if parsed.file is not None and not Path(parsed.file).is_file():
            raise EncoderError(f"encoder {spec!r}: file {parsed.file} does not exist")

    def build(self, parsed: EncoderSpec, spec: str) -> EncoderParts:
        import timm
        from timm.data import resolve_data_config

        overlay = {"pretrained_cfg_overlay": {"file": str(Path(parsed.file).resolve())}} if parsed.file else {}
        fix = ("check that the file is a state dict of this model" if parsed.file else
               "with no internet, download it elsewhere and pass timm:<model>@<file>, or fill timm's cache "
               "(HF_HOME / TORCH_HOME)")
        unreachable = None if parsed.file else hub_unreachable(parsed.name)
        if unreachable:
            raise unavailable(spec, unreachable, fix)
        try:
            model = timm.create_model(parsed.name, pretrained=True, **overlay)
        except Exception as exc:  # noqa: BLE001 - network, hub-cache, file and state-dict failures all end here
            raise unavailable(spec, exc, fix) from None
        classifier = model.get_classifier()
        return EncoderParts(TimmTrunk(model), classifier if isinstance(classifier, nn.Linear) else None,
                            timm_preprocessing(**resolve_data_config({}, model=model)),
                            getattr(model, "head_hidden_size", model.num_features))


def hub_unreachable(name: str) -> OSError | None:
    """Why timm's pretrained weights of ``name`` cannot be fetched now, or None: weights on the Hugging Face hub,
    not in its cache, and its host unreachable (:func:`cl2r_bench.encoders.base.hf_hub_unreachable`)."""
    from timm.models import get_pretrained_cfg

    config = get_pretrained_cfg(name)
    if config is None or not config.hf_hub_id:
        return None
    filenames = list(filter(None, (config.hf_hub_filename, "model.safetensors", "pytorch_model.bin")))
    return hf_hub_unreachable(config.hf_hub_id, filenames)


def timm_preprocessing(*, input_size: tuple[int, ...], interpolation: str, mean: tuple[float, ...],
                       std: tuple[float, ...], crop_pct: float, **_: Any) -> Preprocessing:
    """timm's data config as a :class:`Preprocessing`: resize to ``floor(size / crop_pct)``, then crop ``size``, as
    timm's eval transform does (square images, so its crop modes coincide)."""
    size = int(input_size[-1])
    return Preprocessing(input_size=size, resize_size=math.floor(size / crop_pct), interpolation=interpolation,
                         mean=tuple(mean), std=tuple(std))
