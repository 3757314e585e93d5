"""What every encoder family shares: the :class:`Encoder` a spec becomes, its :class:`Preprocessing`, the
:class:`EncoderFamily` template a new family fills in, and the functions the suite calls with a spec string
(docs/METHODS.md §7b).

A spec is ``<family>:<rest>``; the family registered under that name (:func:`register_encoder_family`) parses the
rest, checks it without building or downloading anything, and builds the trunk, the classifier, the preprocessing
and the feature size. Every encoder is a :class:`cl2r_bench.models.RetrievalModel` (images as stored, uint8 at any
square size, in; ``(logits, features)`` out), so the suite's one embedding function (:func:`cl2r_bench.models.embed`)
runs it, and its backbone (:class:`PretrainedBackbone`) can carry another head (an IAM-CL2R replacement model with
the d-Simplex lift, :func:`encoder_backbone`). Images are resized on tensors (antialiased, as
``torchvision.transforms.v2``), the same operations as the libraries' PIL pipelines up to interpolation rounding.

A spec that cannot be built (unknown family or name, missing file, weights that cannot be downloaded, a family's
library not installed) is an :class:`EncoderError`: one line, exit 2, before any data is read.
"""
from __future__ import annotations

import socket
from dataclasses import asdict, dataclass
from typing import Any, ClassVar
from urllib.parse import urlparse

import torch
from torch import nn

from cl2r_bench.errors import PartError
from cl2r_bench.heads import build_head
from cl2r_bench.models import IDENTITY_MEAN, IDENTITY_STD, RetrievalModel, state_sha256
from cl2r_bench.registry import Registry


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


@dataclass(frozen=True)
class EncoderSpec:
    """A parsed spec: ``family``, ``name`` (the family's model name, or a suite checkpoint's path), ``weights`` (a
    named set of weights: torchvision's enum member, open_clip's pretrained tag) and ``file`` (a local checkpoint)."""

    family: str
    name: str
    weights: str | None = None
    file: str | None = None


@dataclass(frozen=True)
class EncoderParts:
    """What a family builds: the trunk (preprocessed images -> retrieval feature), the classifier on that feature
    (None when the encoder has none), the preprocessing, and the feature size."""

    trunk: nn.Module
    classifier: nn.Module | None
    preprocessing: Preprocessing
    out_dim: int


class EncoderFamily:
    """The template of an encoder family: one file that subclasses this, plus one registry line
    (``@register_encoder_family("name")`` on the class; every module of the folder is imported).

    ``syntax`` is how a user writes a spec of the family (shown in errors); :meth:`parse` splits the text after
    ``name:``; :meth:`check` raises :class:`EncoderError` for what can be known without building or downloading
    (the model name, the weights' name, local files), because settings call it before any data is read;
    :meth:`build` makes the :class:`EncoderParts` with the weights loaded, turning download and file failures into
    one line (:func:`unavailable`). :meth:`versions` names the libraries, beyond torch, torchvision and timm, whose
    versions identify the features (the feature cache keys on them)."""

    name: ClassVar[str]
    syntax: ClassVar[str]

    def parse(self, rest: str, spec: str) -> EncoderSpec:
        raise NotImplementedError

    def check(self, parsed: EncoderSpec, spec: str) -> None:
        """Nothing to check by default."""

    def build(self, parsed: EncoderSpec, spec: str) -> EncoderParts:
        raise NotImplementedError

    def versions(self) -> dict[str, str]:
        return {}


ENCODER_FAMILIES = Registry("encoder family", EncoderError)
register_encoder_family = ENCODER_FAMILIES.register


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

    def __init__(self, parts: EncoderParts, *, spec: str, versions: dict[str, str] | None = None) -> None:
        super().__init__(PretrainedBackbone(parts.trunk, parts.preprocessing, parts.out_dim),
                         ClassifierHead(parts.classifier), mean=IDENTITY_MEAN, std=IDENTITY_STD,
                         input_size=parts.preprocessing.input_size)
        self.spec = spec
        self.family_versions = dict(versions or {})
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
                             "timm": timm.__version__, **self.family_versions}}


def _family_of(spec: str) -> tuple[EncoderFamily, str]:
    """The registered family of ``spec`` and the text after its ``family:``; anything else is one line listing
    how each family is written."""
    family, sep, rest = str(spec).partition(":")
    if not sep or family not in ENCODER_FAMILIES.classes or not rest:
        syntaxes = [cls.syntax for cls in ENCODER_FAMILIES.classes.values()]
        raise EncoderError(f"encoder {spec!r}: write {', '.join(syntaxes[:-1])} or {syntaxes[-1]}")
    return ENCODER_FAMILIES.get(family)(), rest


def parse_spec(spec: str) -> EncoderSpec:
    """Split a spec string into its family's fields; a malformed one is an :class:`EncoderError`."""
    family, rest = _family_of(spec)
    return family.parse(rest, spec)


def check_spec(spec: str) -> EncoderSpec:
    """What can be checked without building or downloading anything (:meth:`EncoderFamily.check`). Settings call
    it before any data is read."""
    family, rest = _family_of(spec)
    parsed = family.parse(rest, spec)
    family.check(parsed, spec)
    return parsed


def build_encoder(spec: str) -> Encoder:
    """The frozen encoder of ``spec`` on the CPU, in eval mode."""
    family, rest = _family_of(spec)
    parsed = family.parse(rest, spec)
    family.check(parsed, spec)
    return Encoder(family.build(parsed, spec), spec=spec, versions=family.versions())


def encoder_backbone(spec: str) -> PretrainedBackbone:
    """The trunk of ``spec`` with its preprocessing, trainable, for a model that puts its own head on it (an
    IAM-CL2R replacement model: docs/METHODS.md §4-§5)."""
    return build_encoder(spec).backbone.requires_grad_(True).train()


def is_spec(reference: str) -> bool:
    """Whether a model reference (a ``replacement.checkpoints`` entry) is an encoder spec rather than a file path."""
    family, sep, rest = str(reference).partition(":")
    return bool(sep and rest) and family in ENCODER_FAMILIES.classes


def encoder_model(spec: str, *, head: str, num_classes: int, simplex_vertices_count: int,
                  head_options: dict | None = None) -> RetrievalModel:
    """A trainable model on the pretrained trunk of ``spec`` with a fresh head of family ``head`` (for the d-Simplex
    family the trainable lift of its features; ``head_options`` as :func:`cl2r_bench.heads.build_head`): an
    IAM-CL2R replacement model that is a real pretrained encoder."""
    backbone = encoder_backbone(spec)
    return RetrievalModel(backbone, build_head(head, backbone.out_dim, num_classes, simplex_vertices_count,
                                               head_options),
                          input_size=backbone.preprocessing.input_size)


def unavailable(spec: str, exc: BaseException, fix: str) -> EncoderError:
    """The one-line error of weights that could not be had (no internet, a missing cache entry, a bad file)."""
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return EncoderError(f"encoder {spec!r}: cannot load its weights ({type(exc).__name__}: {reason[:200]}); {fix}")


HUB_PROBE_SECONDS = 3.0


def hf_hub_unreachable(repo_id: str, filenames: list[str]) -> OSError | None:
    """Why the Hugging Face hub files ``repo_id``/``filenames`` cannot be fetched now, or None. Offline, the Hugging
    Face client retries for about 50 s before it gives up; so when none of the files is in its cache and offline
    mode is not set, one connection to the hub's host (:data:`HUB_PROBE_SECONDS`) decides first."""
    import huggingface_hub

    if huggingface_hub.constants.HF_HUB_OFFLINE:
        return None
    for filename in filenames:
        if isinstance(huggingface_hub.try_to_load_from_cache(repo_id, filename), str):
            return None
    host = urlparse(huggingface_hub.constants.ENDPOINT).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=HUB_PROBE_SECONDS).close()
    except OSError as exc:
        return OSError(f"{host} cannot be reached and the weights are not in the Hugging Face cache ({exc})")
    return None
