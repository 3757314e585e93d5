"""``torchvision:<builder>:<WEIGHTS>``: ``torchvision.models.get_model(builder, weights=WEIGHTS)`` (docs/METHODS.md
§7b; e.g. the λ-orth paper's ``torchvision:resnet18:IMAGENET1K_V1`` -> ``torchvision:vit_l_16:IMAGENET1K_V1``),
downloaded through torch.hub's cache.

Preprocessing: the weights' own ``transforms()``. Retrieval feature: the input of the model's last ``nn.Linear``
(its classifier: ``fc`` of a ResNet, ``heads.head`` of a ViT, the last layer of ``classifier`` of DenseNet /
EfficientNet / ConvNeXt), i.e. the pooled pre-logits embedding.
"""
from __future__ import annotations

from typing import Any

from torch import nn

from cl2r_bench.encoders.base import (
    EncoderError,
    EncoderFamily,
    EncoderParts,
    EncoderSpec,
    Preprocessing,
    register_encoder_family,
    unavailable,
)


@register_encoder_family("torchvision")
class TorchvisionFamily(EncoderFamily):
    syntax = "torchvision:<builder>:<WEIGHTS>"

    def parse(self, rest: str, spec: str) -> EncoderSpec:
        builder, sep, weights = rest.partition(":")
        if not sep or not builder or not weights:
            raise EncoderError(f"encoder {spec!r}: write torchvision:<builder>:<WEIGHTS>, e.g. "
                               "torchvision:resnet18:IMAGENET1K_V1")
        return EncoderSpec("torchvision", builder, weights=weights)

    def check(self, parsed: EncoderSpec, spec: str) -> None:
        torchvision_weights(parsed, spec)

    def build(self, parsed: EncoderSpec, spec: str) -> EncoderParts:
        from torchvision import models

        weights = torchvision_weights(parsed, spec)
        try:
            model = models.get_model(parsed.name, weights=weights)
        except Exception as exc:  # noqa: BLE001 - network, cache and file failures of torch.hub
            raise unavailable(spec, exc, f"with no internet, put the file {weights.url.rsplit('/', 1)[-1]} in "
                              "torch.hub's cache ($TORCH_HOME/hub/checkpoints/)") from None
        linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
        if not linears:
            raise EncoderError(f"encoder {spec!r}: {parsed.name} has no linear classifier whose input is the pooled "
                               "feature (e.g. SqueezeNet); use a timm spec of the model instead")
        name, classifier = linears[-1]
        parent = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
        setattr(parent, name.rpartition(".")[2], nn.Identity())
        transforms = weights.transforms()
        preprocessing = Preprocessing(input_size=int(transforms.crop_size[0]),
                                      resize_size=int(transforms.resize_size[0]),
                                      interpolation=transforms.interpolation.value, mean=tuple(transforms.mean),
                                      std=tuple(transforms.std))
        return EncoderParts(model, classifier, preprocessing, classifier.in_features)


def torchvision_weights(parsed: EncoderSpec, spec: str) -> Any:
    """The weights enum member that ``parsed`` names (``DEFAULT`` included); an unknown builder or weights name is
    one line listing the choices."""
    from torchvision import models

    if parsed.name not in models.list_models():
        raise EncoderError(f"encoder {spec!r}: torchvision has no model {parsed.name!r}; see "
                           "torchvision.models.list_models()")
    enum = models.get_model_weights(parsed.name)
    try:
        return enum[parsed.weights] if parsed.weights != "DEFAULT" else enum.DEFAULT
    except KeyError:
        raise EncoderError(f"encoder {spec!r}: {parsed.name} has no weights {parsed.weights!r}; choose from "
                           f"{[w.name for w in enum]}") from None
