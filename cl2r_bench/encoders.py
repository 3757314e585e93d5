"""Image encoders by name, each with its own preprocessing (docs/METHODS.md §7b): the one place a spec string
becomes a model.

Specs:

* ``timm:<model name>``: any timm model with its pretrained weights, fetched through timm's own cache and
  download (Hugging Face hub or URL; a user with internet gets them by name). ``timm:<model name>@<file>`` loads a
  local checkpoint instead, through timm's ``pretrained_cfg_overlay=dict(file=...)`` (for example the converted
  EfficientNet-Lite weights of ``python -m cl2r_bench.tools.convert_efficientnet_lite``). Preprocessing:
  ``timm.data.resolve_data_config`` (input size, crop fraction, interpolation, mean, std). Retrieval feature:
  ``forward_head(forward_features(x), pre_logits=True)``, the pooled (and, where the model has one, normed)
  pre-logits embedding; the classifier is ``get_classifier()``.
* ``torchvision:<builder>:<WEIGHTS>``: ``torchvision.models.get_model(builder, weights=WEIGHTS)`` (e.g. the λ-orth
  paper's ``torchvision:resnet18:IMAGENET1K_V1`` -> ``torchvision:vit_l_16:IMAGENET1K_V1``), downloaded through
  torch.hub's cache. Preprocessing: the weights' own ``transforms()``. Retrieval feature: the input of the model's
  last ``nn.Linear`` (its classifier: ``fc`` of a ResNet, ``heads.head`` of a ViT, the last layer of
  ``classifier`` of DenseNet / EfficientNet / ConvNeXt), i.e. the pooled pre-logits embedding.
* ``suite:<checkpoint>``: a model this suite trained: a pretrained replacement model (a ``.pt`` with the
  ``.json`` spec beside it, ``results/replacement_models/``) or a run's task checkpoint
  (``<run folder>/checkpoints/task<t>.pt``, rebuilt from the run's ``config.yaml``). Preprocessing: resize to the
  model's training resolution, then its own normalisation. Retrieval feature: what the suite retrieves with (the
  backbone output, or the lifted d-Simplex vector); classifier: its learnable head or the simplex (row y =
  class y).

Every encoder is a :class:`cl2r_bench.models.RetrievalModel` (images as stored, uint8 at any square size, in;
``(logits, features)`` out), so the suite's one embedding function (:func:`cl2r_bench.models.embed`) runs it, and
its backbone (:class:`PretrainedBackbone`) can carry another head (an IAM-CL2R replacement model with the d-Simplex
lift, :func:`encoder_backbone`). Images are resized on tensors (antialiased, as ``torchvision.transforms.v2``),
the same operations as the libraries' PIL pipelines up to interpolation rounding.

A spec that cannot be built (unknown family or name, missing file, weights that cannot be downloaded) is an
:class:`EncoderError`: one line, exit 2, before any data is read.
"""
from __future__ import annotations

import json
import math
import socket
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from torch import nn

from cl2r_bench.config import read_yaml, resolve
from cl2r_bench.data.datasets import dataset_statistics
from cl2r_bench.errors import PartError
from cl2r_bench.models import (
    IDENTITY_MEAN,
    IDENTITY_STD,
    DSimplexHead,
    RetrievalModel,
    build_head,
    build_model,
    state_sha256,
)
from cl2r_bench.settings import RunSettings

FAMILIES = ("timm", "torchvision", "suite")


class EncoderError(PartError):
    """An encoder spec that cannot be built; the message says why and what to pass instead."""


@dataclass(frozen=True)
class Preprocessing:
    """An encoder's own input pipeline on square images: resize the shorter side to ``resize_size``, centre-crop
    ``input_size``, standardise with ``mean`` / ``std``. Images are uint8 (0..255) or floating in [0, 1]."""

    input_size: int
    resize_size: int
    interpolation: str
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        from torchvision.transforms.v2 import InterpolationMode
        from torchvision.transforms.v2 import functional as TF

        x = images.float() / 255.0 if not images.is_floating_point() else images
        if x.shape[-1] != self.resize_size or x.shape[-2] != self.resize_size:
            x = TF.resize(x, [self.resize_size], interpolation=InterpolationMode(self.interpolation),
                          antialias=True).clamp(0, 1)
        if self.resize_size != self.input_size:
            x = TF.center_crop(x, [self.input_size])
        return TF.normalize(x, list(self.mean), list(self.std))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class PretrainedBackbone(nn.Module):
    """An encoder's trunk behind its own preprocessing: images -> the pooled pre-logits embedding."""

    def __init__(self, trunk: nn.Module, preprocessing: Preprocessing, out_dim: int) -> None:
        super().__init__()
        self.trunk = trunk
        self.preprocessing = preprocessing
        self.out_dim = out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.trunk(self.preprocessing(x))


class ClassifierHead(nn.Module):
    """The encoder's own classifier beside its retrieval feature (FastFill's rows, zero-shot retention); an
    encoder without one gives empty logits. It never grows: its classes are the encoder's."""

    def __init__(self, classifier: nn.Module | None) -> None:
        super().__init__()
        self.classifier = classifier

    @property
    def num_classes(self) -> int:
        return 0 if self.classifier is None else self.classifier.weight.shape[0]

    def grow(self, num_classes: int) -> None:
        raise EncoderError("a pretrained encoder's classifier has the classes it was trained on; give the "
                           "encoder another head to train it on a stream (encoder_backbone)")

    def forward(self, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = feats.new_zeros(len(feats), 0) if self.classifier is None else self.classifier(feats)
        return logits, feats


class Encoder(RetrievalModel):
    """A frozen pretrained image encoder (module docstring). ``spec`` is the string it was built from and
    ``weights_sha256`` the digest of its state dict (:func:`cl2r_bench.models.state_sha256`); with its
    preprocessing, the normalisation of a suite model and the libraries' versions (:meth:`describe`) it identifies
    its features."""

    def __init__(self, trunk: nn.Module, classifier: nn.Module | None, preprocessing: Preprocessing, out_dim: int,
                 *, spec: str) -> None:
        super().__init__(PretrainedBackbone(trunk, preprocessing, out_dim), ClassifierHead(classifier),
                         mean=IDENTITY_MEAN, std=IDENTITY_STD, input_size=preprocessing.input_size)
        self.spec = spec
        self.requires_grad_(False).eval()
        self.weights_sha256 = state_sha256(self)

    @property
    def preprocessing(self) -> Preprocessing:
        return self.backbone.preprocessing

    @property
    def feature_dim(self) -> int:
        return self.backbone.out_dim

    @property
    def classifier(self) -> nn.Module | None:
        return self.head.classifier

    def describe(self) -> dict[str, Any]:
        """What identifies the encoder's features: spec, weights digest, preprocessing (and a suite model's own
        normalisation, a non-persistent buffer the weights digest does not see), feature size, classes, and the
        versions of the libraries that run it."""
        import timm
        import torchvision

        inner = getattr(self.backbone.trunk, "model", None)
        normalisation = {name: getattr(inner, name).flatten().tolist() for name in ("input_mean", "input_std")
                         if isinstance(getattr(inner, name, None), torch.Tensor)}
        return {"spec": self.spec, "weights_sha256": self.weights_sha256, "feature_dim": self.feature_dim,
                "classes": self.head.num_classes, "preprocessing": self.preprocessing.as_dict(),
                "normalisation": normalisation,
                "versions": {"torch": torch.__version__, "torchvision": torchvision.__version__,
                             "timm": timm.__version__}}


@dataclass(frozen=True)
class EncoderSpec:
    """A parsed spec: ``family``, ``name`` (timm model, torchvision builder, or suite checkpoint path), ``weights``
    (torchvision's weights name) and ``file`` (timm's local checkpoint)."""

    family: str
    name: str
    weights: str | None = None
    file: str | None = None


def parse_spec(spec: str) -> EncoderSpec:
    """Split a spec string (module docstring); a malformed one is an :class:`EncoderError`."""
    family, sep, rest = str(spec).partition(":")
    if not sep or family not in FAMILIES or not rest:
        raise EncoderError(f"encoder {spec!r}: write timm:<model>[@<file>], torchvision:<builder>:<WEIGHTS> or "
                           "suite:<checkpoint.pt>")
    if family == "timm":
        name, _, file = rest.partition("@")
        return EncoderSpec("timm", name, file=file or None)
    if family == "torchvision":
        builder, sep, weights = rest.partition(":")
        if not sep or not builder or not weights:
            raise EncoderError(f"encoder {spec!r}: write torchvision:<builder>:<WEIGHTS>, e.g. "
                               "torchvision:resnet18:IMAGENET1K_V1")
        return EncoderSpec("torchvision", builder, weights=weights)
    return EncoderSpec("suite", rest)


def check_spec(spec: str) -> EncoderSpec:
    """What can be checked without building or downloading anything: the syntax, that the model name and weights
    exist in their library, and that local files exist. Settings call it before any data is read."""
    parsed = parse_spec(spec)
    if parsed.family == "timm":
        import timm

        if not timm.is_model(parsed.name):
            close = timm.list_models(f"*{parsed.name.split('.')[0][:12]}*")[:5]
            raise EncoderError(f"encoder {spec!r}: timm has no model {parsed.name!r}"
                               + (f"; close names: {', '.join(close)}" if close else "; see timm.list_models()"))
    elif parsed.family == "torchvision":
        _torchvision_weights(parsed, spec)
    for path in (parsed.file, parsed.name if parsed.family == "suite" else None):
        if path is not None and not Path(path).is_file():
            raise EncoderError(f"encoder {spec!r}: file {path} does not exist")
    return parsed


def build_encoder(spec: str) -> Encoder:
    """The frozen encoder of ``spec`` on the CPU, in eval mode (module docstring)."""
    parsed = check_spec(spec)
    builder = {"timm": _timm_parts, "torchvision": _torchvision_parts, "suite": _suite_parts}[parsed.family]
    trunk, classifier, preprocessing, out_dim = builder(parsed, spec)
    return Encoder(trunk, classifier, preprocessing, out_dim, spec=spec)


def encoder_backbone(spec: str) -> PretrainedBackbone:
    """The trunk of ``spec`` with its preprocessing, trainable, for a model that puts its own head on it (an
    IAM-CL2R replacement model: docs/METHODS.md §4-§5)."""
    return build_encoder(spec).backbone.requires_grad_(True).train()


def is_spec(reference: str) -> bool:
    """Whether a model reference (a ``replacement.checkpoints`` entry) is an encoder spec rather than a file path."""
    family, sep, rest = str(reference).partition(":")
    return bool(sep and rest) and family in FAMILIES


def encoder_model(spec: str, *, head: str, num_classes: int, simplex_vertices_count: int) -> RetrievalModel:
    """A trainable model on the pretrained trunk of ``spec`` with a fresh head of family ``head`` (for the d-Simplex
    family the trainable lift of its features): an IAM-CL2R replacement model that is a real pretrained encoder."""
    backbone = encoder_backbone(spec)
    return RetrievalModel(backbone, build_head(head, backbone.out_dim, num_classes, simplex_vertices_count),
                          input_size=backbone.preprocessing.input_size)


def unavailable(spec: str, exc: BaseException, fix: str) -> EncoderError:
    """The one-line error of weights that could not be had (no internet, a missing cache entry, a bad file)."""
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return EncoderError(f"encoder {spec!r}: cannot load its weights ({type(exc).__name__}: {reason[:200]}); {fix}")


class TimmTrunk(nn.Module):
    """A timm model up to its pre-logits: ``forward_head(forward_features(x), pre_logits=True)``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.forward_head(self.model.forward_features(x), pre_logits=True)


def _timm_parts(parsed: EncoderSpec, spec: str):
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
    preprocessing = timm_preprocessing(**resolve_data_config({}, model=model))
    classifier = model.get_classifier()
    return (TimmTrunk(model), classifier if isinstance(classifier, nn.Linear) else None, preprocessing,
            getattr(model, "head_hidden_size", model.num_features))


HUB_PROBE_SECONDS = 3.0


def hub_unreachable(name: str) -> OSError | None:
    """Why timm's pretrained weights of ``name`` cannot be fetched now, or None. Offline, the Hugging Face client
    retries for about 50 s before it gives up; so when the weights are on the hub, not in its cache, and offline
    mode is not set, one connection to the hub's host (:data:`HUB_PROBE_SECONDS`) decides first."""
    import huggingface_hub
    from timm.models import get_pretrained_cfg

    config = get_pretrained_cfg(name)
    if config is None or not config.hf_hub_id or huggingface_hub.constants.HF_HUB_OFFLINE:
        return None
    for filename in filter(None, (config.hf_hub_filename, "model.safetensors", "pytorch_model.bin")):
        if isinstance(huggingface_hub.try_to_load_from_cache(config.hf_hub_id, filename), str):
            return None
    host = urlparse(huggingface_hub.constants.ENDPOINT).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=HUB_PROBE_SECONDS).close()
    except OSError as exc:
        return OSError(f"{host} cannot be reached and the weights are not in the Hugging Face cache ({exc})")
    return None


def timm_preprocessing(*, input_size: tuple[int, ...], interpolation: str, mean: tuple[float, ...],
                       std: tuple[float, ...], crop_pct: float, **_: Any) -> Preprocessing:
    """timm's data config as a :class:`Preprocessing`: resize to ``floor(size / crop_pct)``, then crop ``size``, as
    timm's eval transform does (square images, so its crop modes coincide)."""
    size = int(input_size[-1])
    return Preprocessing(input_size=size, resize_size=math.floor(size / crop_pct), interpolation=interpolation,
                         mean=tuple(mean), std=tuple(std))


def _torchvision_weights(parsed: EncoderSpec, spec: str):
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


def _torchvision_parts(parsed: EncoderSpec, spec: str):
    from torchvision import models

    weights = _torchvision_weights(parsed, spec)
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
    return model, classifier, preprocessing, classifier.in_features


class SuiteTrunk(nn.Module):
    """A suite model up to its retrieval feature (its own normalisation included)."""

    def __init__(self, model: RetrievalModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)[1]


def _suite_parts(parsed: EncoderSpec, spec: str):
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
        raise EncoderError(f"encoder {spec!r}: not a model of this suite (neither {info.name} beside it nor a run's "
                           "checkpoints/ folder with its config.yaml)")
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
    return SuiteTrunk(model), classifier, preprocessing, out_dim


MODEL_DESCRIPTION = ("backbone", "simplex_vertices_count", "small_width", "small_out_dim", "head", "dataset")
"""The keys of the ``.json`` the suite writes beside a pretrained model (``image_size`` may be absent: 32)."""


def _model_description(info: Path, spec: str) -> dict[str, Any]:
    """The model description beside a ``suite:`` checkpoint, checked: a JSON object with every key of
    :data:`MODEL_DESCRIPTION`; an empty, malformed or incomplete file is one :class:`EncoderError` line."""
    try:
        meta = json.loads(info.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
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
