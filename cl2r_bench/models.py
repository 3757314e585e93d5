"""Model definitions shared by every part of the suite (METHODS.md §4-§5).

A :class:`RetrievalModel` is a backbone plus a head. Every model answers the same two calls, so retrieval never
special-cases an architecture:

* ``model(x) -> (logits, features)``: training output; ``features`` are the un-normalised retrieval features.
* ``model.embed(x) -> features``: L2-normalised retrieval features (METHODS.md §1).

Heads:

* :class:`LearnableHead`: bias-free linear classifier that grows as classes arrive (old rows copied, §5);
  the retrieval feature is the backbone output.
* :class:`CosineHead`: the same growing classifier, but its logits are cosine similarities between the
  normalised feature and the normalised class rows (CVS, §6; the strategy applies the temperature).
* :class:`DSimplexHead`: trainable bias-free lift ``d -> K-1`` followed by the frozen d-Simplex classifier
  (K = 1024 vertices, class y on vertex K-1-y, §5); the retrieval feature is the lifted vector.

Checkpoints are plain state dicts (``torch.save(model.state_dict())``), loadable with ``weights_only=True``.
The classifier weights of a learnable or cosine head are dropped when a replacement model is loaded (§4); the
simplex is a non-persistent buffer, regenerated identically, so it is never stored.

Usage::

    model = build_model(backbone="resnet18", head="dsimplex", num_classes=10)
    logits, feats = model(images)
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from scenarios.transforms import normalize

BACKBONES = ("resnet18", "resnet18_cifar", "small_cnn")
HEADS = ("learnable", "cosine", "dsimplex")
CLASSIFIER_PREFIX = "head.classifier."


class CheckpointError(ValueError):
    """A checkpoint file cannot be read or does not fit the model it is loaded into."""


class NonFiniteError(ArithmeticError):
    """Training or a model produced NaN or infinite values (a diverged run, issue 16): never a result."""


def first_nonfinite_tensor(model: nn.Module) -> str | None:
    """The name of the first parameter or buffer of ``model`` holding a NaN or infinity, or None (one sync)."""
    tensors = [(n, t) for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_floating_point()]
    if not tensors or bool(torch.stack([torch.isfinite(t).all() for _, t in tensors]).all()):
        return None
    return next(n for n, t in tensors if not bool(torch.isfinite(t).all()))


def simplex_vertices(num_vertices: int) -> torch.Tensor:
    """The d-Simplex fixed classifier: ``K`` unit rows in ``K-1`` dims, pairwise cosine ``-1/(K-1)`` (§5).

    Rows are the identity ``I_{K-1}`` plus one row with every entry ``(1 - sqrt(K)) / (K-1)``; the column mean
    is subtracted and each row (not the whole matrix) is normalised.
    """
    k = num_vertices
    extra = torch.full((1, k - 1), (1.0 - math.sqrt(k)) / (k - 1), dtype=torch.float64)
    vertices = torch.cat([torch.eye(k - 1, dtype=torch.float64), extra])
    vertices = vertices - vertices.mean(dim=0, keepdim=True)
    return F.normalize(vertices, dim=1).float()


class SmallConvNet(nn.Module):
    """A small, fast CNN backbone for CPU presets and tests (4 conv blocks, global pooling)."""

    def __init__(self, width: int = 32, out_dim: int = 128) -> None:
        super().__init__()
        chans = [3, width, width * 2, width * 4, width * 4]
        blocks = []
        for c_in, c_out in zip(chans[:-1], chans[1:]):
            blocks += [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True),
                       nn.MaxPool2d(2)]
        self.features = nn.Sequential(*blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.proj = nn.Linear(chans[-1], out_dim)
        self.out_dim = out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.features(x))


class ResNet18(nn.Module):
    """torchvision ResNet-18 without its classifier: 512-d output.

    ``stem="imagenet"`` keeps the 7x7 stride-2 conv and max-pool, as the authors' code does on 32x32 inputs;
    ``stem="cifar"`` uses a 3x3 stride-1 conv and no max-pool (slower, usually more accurate).
    """

    def __init__(self, stem: str = "imagenet") -> None:
        super().__init__()
        from torchvision.models import resnet18

        net = resnet18(weights=None)
        if stem == "cifar":
            net.conv1 = nn.Conv2d(3, 64, 3, stride=1, padding=1, bias=False)
            net.maxpool = nn.Identity()
        net.fc = nn.Identity()
        self.net = net
        self.out_dim = 512

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class LearnableHead(nn.Module):
    """Bias-free linear classifier over the seen classes; grows with :meth:`grow` (old rows copied)."""

    def __init__(self, in_dim: int, num_classes: int) -> None:
        super().__init__()
        self.classifier = nn.Linear(in_dim, num_classes, bias=False)

    @property
    def num_classes(self) -> int:
        return self.classifier.out_features

    def grow(self, num_classes: int) -> None:
        old = self.classifier
        if num_classes <= old.out_features:
            return
        new = nn.Linear(old.in_features, num_classes, bias=False).to(old.weight.device)
        with torch.no_grad():
            new.weight[: old.out_features] = old.weight
        self.classifier = new

    def forward(self, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.classifier(feats), feats


class CosineHead(LearnableHead):
    """:class:`LearnableHead` whose logits are ``cos(w_c, x)`` in [-1, 1] (no scale: the loss divides by its
    temperature). Its only weight is ``classifier.weight``, so it loads the learnable family's replacements."""

    def forward(self, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return F.linear(F.normalize(feats, dim=1), F.normalize(self.classifier.weight, dim=1)), feats


class DSimplexHead(nn.Module):
    """Trainable lift ``in_dim -> K-1`` then the frozen d-Simplex classifier; class y is vertex ``K-1-y``.

    The logits are ``lift(x) @ vertices.T`` over all K vertices, with no scale; the retrieval feature is the
    lifted vector (normalised by :meth:`RetrievalModel.embed`).
    """

    def __init__(self, in_dim: int, num_vertices: int = 1024) -> None:
        super().__init__()
        self.lift = nn.Linear(in_dim, num_vertices - 1, bias=False)
        self.register_buffer("vertices", simplex_vertices(num_vertices), persistent=False)

    @property
    def num_classes(self) -> int:
        return self.vertices.shape[0]

    def grow(self, num_classes: int) -> None:
        if num_classes > self.num_classes:
            raise ValueError(f"the d-Simplex head has {self.num_classes} vertices, {num_classes} classes requested")

    def targets(self, labels: torch.Tensor) -> torch.Tensor:
        """Vertex index of each class label (class y -> vertex K-1-y, as the authors' code)."""
        return self.num_classes - 1 - labels

    def forward(self, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lifted = self.lift(feats)
        return lifted @ self.vertices.t(), lifted


class RetrievalModel(nn.Module):
    """Backbone + head with a uniform training and retrieval interface."""

    def __init__(self, backbone: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.head(self.backbone(x))

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.forward(x)[1].float(), dim=1)

    def class_targets(self, labels: torch.Tensor) -> torch.Tensor:
        """Logit index of each label: identity for a learnable head, the vertex for the d-Simplex head."""
        return self.head.targets(labels) if isinstance(self.head, DSimplexHead) else labels


def autocast_dtype(amp: bool | str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of an ``amp`` argument on ``device``: None on the CPU or when ``amp`` is False; a
    dtype name (``"float16"``, the authors' code, or ``"bfloat16"``); True means ``"bfloat16"``."""
    if not amp or device.type != "cuda":
        return None
    return torch.bfloat16 if amp is True else getattr(torch, amp)


@torch.no_grad()
def forward_in_batches(model: RetrievalModel, images: torch.Tensor, *, mean: Sequence[float], std: Sequence[float],
                       batch_size: int = 512, amp: bool | str = True) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(logits, features)`` in float32 for each batch of uint8 ``images``: eval mode, no augmentation, no
    gradient, autocast on CUDA as :func:`autocast_dtype` says; the model's train/eval mode is restored afterwards.
    The one place that runs a frozen model over a data set (gallery and query embedding, a teacher's class means)."""
    device = next(model.parameters()).device
    dtype = autocast_dtype(amp, device)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(images), batch_size):
            batch = normalize(images[start:start + batch_size].to(device, non_blocking=True), mean, std)
            with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                logits, features = model(batch)
            yield logits.float(), features.float()
    finally:
        model.train(was_training)


def classifier_rows(model: RetrievalModel, num_classes: int) -> torch.Tensor:
    """The classifier's row of each class ``0..num_classes-1`` in feature space (row y scores class y): the
    learnable / cosine weights, or the d-Simplex vertex ``K-1-y``."""
    head = model.head
    if isinstance(head, DSimplexHead):
        return head.vertices[head.targets(torch.arange(num_classes, device=head.vertices.device))]
    return head.classifier.weight[:num_classes].detach()


def build_backbone(name: str, *, width: int = 32, out_dim: int = 128) -> nn.Module:
    if name == "resnet18":
        return ResNet18("imagenet")
    if name == "resnet18_cifar":
        return ResNet18("cifar")
    if name == "small_cnn":
        return SmallConvNet(width, out_dim)
    raise ValueError(f"unknown backbone {name!r}; choose from {list(BACKBONES)}")


def build_model(*, backbone: str, head: str, num_classes: int, simplex_vertices_count: int = 1024,
                small_width: int = 32, small_out_dim: int = 128) -> RetrievalModel:
    """A fresh model: ``head`` is ``"learnable"`` or ``"cosine"`` (sized to ``num_classes``) or ``"dsimplex"``."""
    net = build_backbone(backbone, width=small_width, out_dim=small_out_dim)
    if head == "learnable":
        return RetrievalModel(net, LearnableHead(net.out_dim, num_classes))
    if head == "cosine":
        return RetrievalModel(net, CosineHead(net.out_dim, num_classes))
    if head == "dsimplex":
        return RetrievalModel(net, DSimplexHead(net.out_dim, simplex_vertices_count))
    raise ValueError(f"unknown head {head!r}; choose from {list(HEADS)}")


def replacement_family(head: str) -> str:
    """The family of replacement models a head loads: ``dsimplex`` (lift included) or ``learnable`` (backbone
    only; the learnable and cosine classifiers are dropped on loading, so both heads share these models)."""
    return "dsimplex" if head == "dsimplex" else "learnable"


def feature_extractor_state(model: RetrievalModel) -> dict[str, torch.Tensor]:
    """The state dict without the learnable classifier: what a replacement checkpoint carries."""
    return {k: v for k, v in model.state_dict().items() if not k.startswith(CLASSIFIER_PREFIX)}


def load_replacement(model: RetrievalModel, path: str | Path) -> None:
    """Load a replacement checkpoint into ``model``, strictly except for the dropped learnable classifier (§4).

    Raises :class:`CheckpointError` naming the missing or unexpected weights, or a shape mismatch.
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} does not exist; pass an existing file or let the suite pretrain one")
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means an unreadable file
        raise CheckpointError(f"cannot read checkpoint {path} as a plain state dict ({type(exc).__name__}); "
                              "save it with torch.save(model.state_dict())") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise CheckpointError(f"checkpoint {path} is not a state dict of named tensors; save it with "
                              "torch.save(model.state_dict())")
    state = {k: v for k, v in state.items() if not k.startswith(CLASSIFIER_PREFIX)}
    expected = feature_extractor_state(model)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {path} does not match the model: missing {missing[:4]}"
                              f"{'...' if len(missing) > 4 else ''}, unexpected {unexpected[:4]}"
                              f"{'...' if len(unexpected) > 4 else ''}; check model.backbone and the head family")
    for key, value in state.items():
        if value.shape != expected[key].shape:
            raise CheckpointError(f"checkpoint {path}: {key} has shape {tuple(value.shape)}, the model expects "
                                  f"{tuple(expected[key].shape)}; check model.backbone and model settings")
    model.load_state_dict(state, strict=False)
