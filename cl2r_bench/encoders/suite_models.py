"""``suite:<checkpoint>``: a model this suite trained (docs/METHODS.md §7b).

A pretrained replacement model (a ``.pt`` with the ``.json`` description beside it, ``results/replacement_models/``)
or a run's task checkpoint (``<run folder>/checkpoints/task<t>.pt``, rebuilt from the run's ``config.yaml``).
Preprocessing: resize to the model's training resolution, then its own normalisation. Retrieval feature: what the
suite retrieves with (the backbone output, or the lifted d-Simplex vector); classifier: its learnable head or the
simplex (row y = class y).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cl2r_bench.config import read_yaml, resolve
from cl2r_bench.data.datasets import dataset_statistics
from cl2r_bench.encoders.base import (
    EncoderError,
    EncoderFamily,
    EncoderParts,
    EncoderSpec,
    Preprocessing,
    register_encoder_family,
    unavailable,
)
from cl2r_bench.heads import DSimplexHead
from cl2r_bench.limits import TextFileError, read_text
from cl2r_bench.models import IDENTITY_MEAN, IDENTITY_STD, RetrievalModel, build_model
from cl2r_bench.settings import RunSettings

MODEL_DESCRIPTION = ("backbone", "simplex_vertices_count", "small_width", "small_out_dim", "head", "dataset")
"""The keys of the ``.json`` the suite writes beside a pretrained model (``image_size`` may be absent: 32)."""


class SuiteTrunk(nn.Module):
    """A suite model up to its retrieval feature (its own normalisation included)."""

    def __init__(self, model: RetrievalModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)[1]


@register_encoder_family("suite")
class SuiteFamily(EncoderFamily):
    syntax = "suite:<checkpoint.pt>"

    def parse(self, rest: str, spec: str) -> EncoderSpec:
        return EncoderSpec("suite", rest)

    def check(self, parsed: EncoderSpec, spec: str) -> None:
        if not Path(parsed.name).is_file():
            raise EncoderError(f"encoder {spec!r}: file {parsed.name} does not exist")

    def build(self, parsed: EncoderSpec, spec: str) -> EncoderParts:
        path = Path(parsed.name)
        state = _read_state(path, spec)
        info = path.with_suffix(".json")
        run_config = path.parent.parent / "config.yaml"
        if info.is_file():
            meta = _model_description(info, spec)
            kwargs = {k: meta[k] for k in MODEL_DESCRIPTION[:4]}
            head, dataset, size = meta["head"], meta["dataset"], int(meta.get("image_size", 32))
        elif path.parent.name == "checkpoints" and run_config.is_file():
            settings = RunSettings.from_config(resolve([(str(run_config), read_yaml(run_config))]))
            kwargs = settings.model.build_kwargs
            head = "dsimplex" if "head.lift.weight" in state else "learnable"
            dataset, size = settings.dataset, settings.data.image_size
        else:
            raise EncoderError(f"encoder {spec!r}: not a model of this suite (neither {info.name} beside it nor a "
                               "run's checkpoints/ folder with its config.yaml)")
        classes = state["head.classifier.weight"].shape[0] if "head.classifier.weight" in state else 1
        mean, std = dataset_statistics(dataset)
        model = build_model(head=head, num_classes=classes, mean=mean, std=std, input_size=size, **kwargs)
        missing, unexpected = model.load_state_dict(state, strict=False)
        if unexpected or [k for k in missing if not k.startswith("head.classifier.")]:
            raise EncoderError(f"encoder {spec!r}: the checkpoint does not match its recorded model (missing "
                               f"{missing[:3]}, unexpected {unexpected[:3]})")
        classifier = _suite_classifier(model, has_classifier="head.classifier.weight" in state)
        preprocessing = Preprocessing(input_size=size, resize_size=size, interpolation="bilinear",
                                      mean=IDENTITY_MEAN, std=IDENTITY_STD)
        out_dim = model.head.lift.out_features if isinstance(model.head, DSimplexHead) else model.backbone.out_dim
        return EncoderParts(SuiteTrunk(model), classifier, preprocessing, out_dim)


def _model_description(info: Path, spec: str) -> dict[str, Any]:
    """The model description beside a ``suite:`` checkpoint, checked: a JSON object with every key of
    :data:`MODEL_DESCRIPTION`; an empty, malformed or incomplete file is one :class:`EncoderError` line."""
    try:
        meta = json.loads(read_text(info, "model description"))
    except (TextFileError, RecursionError, json.JSONDecodeError) as exc:
        raise EncoderError(f"encoder {spec!r}: {info} is not the model description the suite writes "
                           f"({type(exc).__name__}: {str(exc)[:80]}); restore it from the run that made the model, "
                           "or delete the model and its .json to pretrain it again") from None
    missing = [k for k in MODEL_DESCRIPTION if not isinstance(meta, dict) or k not in meta]
    if missing:
        raise EncoderError(f"encoder {spec!r}: {info} lacks {', '.join(missing)}; restore it from the run that made "
                           "the model, or delete the model and its .json to pretrain it again")
    return meta


def _suite_classifier(model: RetrievalModel, has_classifier: bool) -> nn.Linear | None:
    """The suite model's classifier as a linear map whose row y scores class y (the d-Simplex vertices in class
    order), or None when the checkpoint dropped it."""
    head = model.head
    if isinstance(head, DSimplexHead):
        vertices = head.vertices[head.targets(torch.arange(head.num_classes))]
        linear = nn.Linear(vertices.shape[1], vertices.shape[0], bias=False)
        linear.weight.data.copy_(vertices)
        return linear
    return head.classifier if has_classifier else None


def _read_state(path: Path, spec: str) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a damaged file fails in torch's zip reader or its unpickler
        raise unavailable(spec, exc, "pass a state dict saved by this suite") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise EncoderError(f"encoder {spec!r}: {path} is not a state dict of named tensors")
    return state
