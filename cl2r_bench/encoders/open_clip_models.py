"""``open_clip:<model>:<pretrained>``: a CLIP image encoder of OpenCLIP (docs/METHODS.md §7b), the optional extra
``pip install 'cl2r-bench[open-clip]'``.

``<pretrained>`` is one of OpenCLIP's pretrained tags for the model (``open_clip.list_pretrained_tags_by_model``),
downloaded through its own cache (Hugging Face hub or URL), or a local checkpoint file. Preprocessing: the image
tower's ``preprocess_cfg`` (resize the shorter side to the input size, centre-crop, the model's mean and std), as
OpenCLIP's eval transform. Retrieval feature: ``encode_image`` without normalisation, the projected image
embedding CLIP retrieves with. An OpenCLIP encoder has no classifier of its own (zero-shot classes need text), so
its logits are empty and FastFill, which needs the new model's classifier rows, refuses it as new model.
"""
from __future__ import annotations

from pathlib import Path

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

INSTALL = "install it with pip install 'cl2r-bench[open-clip]' (the package open_clip_torch)"


class OpenClipTrunk(nn.Module):
    """An OpenCLIP model's image tower: ``encode_image(x)``, the projected image embedding, not normalised."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.clip = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.clip.encode_image(x)


@register_encoder_family("open_clip")
class OpenClipFamily(EncoderFamily):
    syntax = "open_clip:<model>:<pretrained tag or file>"

    def parse(self, rest: str, spec: str) -> EncoderSpec:
        model, sep, pretrained = rest.partition(":")
        if not sep or not model or not pretrained:
            raise EncoderError(f"encoder {spec!r}: write open_clip:<model>:<pretrained tag or file>, e.g. "
                               "open_clip:ViT-B-32:laion2b_s34b_b79k")
        is_file = Path(pretrained).suffix != "" or "/" in pretrained
        return EncoderSpec("open_clip", model, weights=None if is_file else pretrained,
                           file=pretrained if is_file else None)

    def check(self, parsed: EncoderSpec, spec: str) -> None:
        open_clip = _library(spec)
        if parsed.name not in open_clip.list_models():
            close = [m for m in open_clip.list_models() if parsed.name.lower()[:6] in m.lower()][:5]
            raise EncoderError(f"encoder {spec!r}: OpenCLIP has no model {parsed.name!r}"
                               + (f"; close names: {', '.join(close)}" if close else "; see open_clip.list_models()"))
        if parsed.file is not None and not Path(parsed.file).is_file():
            raise EncoderError(f"encoder {spec!r}: file {parsed.file} does not exist")
        tags = open_clip.list_pretrained_tags_by_model(parsed.name)
        if parsed.weights is not None and parsed.weights not in tags:
            raise EncoderError(f"encoder {spec!r}: OpenCLIP has no pretrained weights {parsed.weights!r} for "
                               f"{parsed.name}; choose from {tags} or pass a checkpoint file")

    def build(self, parsed: EncoderSpec, spec: str) -> EncoderParts:
        open_clip = _library(spec)
        fix = ("check that the file is a state dict of this model" if parsed.file else
               "with no internet, download the checkpoint elsewhere and pass open_clip:<model>:<file>, or fill "
               "OpenCLIP's cache (HF_HOME)")
        hub = None if parsed.file else open_clip.get_pretrained_cfg(parsed.name, parsed.weights).get("hf_hub", "")
        unreachable = hf_hub_unreachable(hub.strip("/"), ["open_clip_model.safetensors", "open_clip_pytorch_model.bin"]
                                         ) if hub else None
        if unreachable:
            raise unavailable(spec, unreachable, fix)
        try:
            model = open_clip.create_model(parsed.name, pretrained=parsed.file or parsed.weights)
        except Exception as exc:  # noqa: BLE001 - network, cache, file and state-dict failures all end here
            raise unavailable(spec, exc, fix) from None
        pipeline = model.visual.preprocess_cfg
        size = pipeline["size"]
        size = int(size[-1] if isinstance(size, (tuple, list)) else size)
        preprocessing = Preprocessing(input_size=size, resize_size=size, interpolation=pipeline["interpolation"],
                                      mean=tuple(pipeline["mean"]), std=tuple(pipeline["std"]))
        return EncoderParts(OpenClipTrunk(model), None, preprocessing, int(model.visual.output_dim))

    def versions(self) -> dict[str, str]:
        return {"open_clip": _library("open_clip").__version__}


def _library(spec: str):
    try:
        import open_clip
    except ImportError:
        raise EncoderError(f"encoder {spec!r}: OpenCLIP is not installed; {INSTALL}") from None
    return open_clip
