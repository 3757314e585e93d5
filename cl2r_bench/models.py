"""Model definitions shared by every part of the suite (METHODS.md §4-§5).

A :class:`RetrievalModel` is its input preprocessing, a backbone and a head. It owns the normalisation of its
inputs (the data set's per-channel ``mean`` / ``std``, METHODS.md §4), so every caller hands it images as stored
(uint8, 0..255) and no normalisation statistics travel through the suite. Every model answers the same calls, so
retrieval never special-cases an architecture:

* ``model(x) -> (logits, features)``: training output; ``features`` are the un-normalised retrieval features.
* :func:`embed` ``(model, images) -> features``: L2-normalised retrieval features of a whole image set, the one
  function that embeds images (METHODS.md §1, §3); :func:`forward_in_batches` gives logits and raw features.
* :func:`class_means`: per-class mean features (class templates of the evaluation, BCT's rows, CVS's prototypes).

Heads (the classifier families, and the retrieval feature each gives): :mod:`cl2r_bench.heads`.

Checkpoints are plain state dicts (``torch.save(model.state_dict())``), loadable with ``weights_only=True``.
The classifier weights of a learnable or cosine head are dropped when a replacement model is loaded (§4); the
simplex and the normalisation statistics are non-persistent buffers, set when the model is built, so they are never
stored and every checkpoint loads into a model built with any statistics.

This module imports nothing of the suite but its heads (:mod:`cl2r_bench.heads`; torch, torchvision and the
standard library).

Usage::

    model = build_model(backbone="resnet18", head="dsimplex", num_classes=10, mean=data.mean, std=data.std)
    logits, feats = model(uint8_images)
    features = embed(model, gallery.images, amp="float16")
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import pairwise
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from cl2r_bench.heads import BasisTransformationHead, DSimplexHead, OrthogonalTransformationHead, build_head

BACKBONES = ("resnet18", "resnet18_cifar", "small_cnn", "frozen_encoder")

CLASSIFIER_PREFIX = "head.classifier."
IDENTITY_MEAN: tuple[float, float, float] = (0.0, 0.0, 0.0)
IDENTITY_STD: tuple[float, float, float] = (1.0, 1.0, 1.0)
DEFAULT_AMP = "float16"
"""The autocast setting of every embedding and training default: the authors' fp16 (METHODS.md §4)."""


class CheckpointError(ValueError):
    """A checkpoint file cannot be read or does not fit the model it is loaded into."""


class NonFiniteError(ArithmeticError):
    """Training or a model produced NaN or infinite values (a diverged run): never a result."""


def state_sha256(model: nn.Module) -> str:
    """sha256 over the names, shapes, dtypes and bytes of every tensor of ``model``'s state dict, in order: the
    identity of its weights, for cache keys."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        t = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}|{tuple(t.shape)}|{t.dtype}".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def first_nonfinite_tensor(model: nn.Module) -> str | None:
    """The name of the first parameter or buffer of ``model`` holding a NaN or infinity, or None (one sync)."""
    tensors = [(n, t) for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_floating_point()]
    if not tensors or bool(torch.stack([torch.isfinite(t).all() for _, t in tensors]).all()):
        return None
    return next(n for n, t in tensors if not bool(torch.isfinite(t).all()))


def normalize(images: torch.Tensor, mean: Sequence[float] | torch.Tensor,
              std: Sequence[float] | torch.Tensor) -> torch.Tensor:
    """Images ``N x 3 x H x W`` standardised per channel, ``(x - mean) / std`` (METHODS.md §4).

    uint8 images (0..255) are first scaled to [0, 1] in float32; floating images are taken as already in [0, 1]
    and keep their dtype (a float64 parity check stays float64). ``mean`` and ``std`` are sequences or tensors (a
    model's float32 buffers hold the same values as a sequence of Python floats, so both give identical bits).
    Elementwise operations are not autocast, so this runs in float32 even inside ``torch.autocast``."""
    scaled = images if images.is_floating_point() else images.float() / 255.0
    mean_t = torch.as_tensor(mean, device=images.device).view(1, -1, 1, 1)
    std_t = torch.as_tensor(std, device=images.device).view(1, -1, 1, 1)
    return (scaled - mean_t) / std_t


class SmallConvNet(nn.Module):
    """A small, fast CNN backbone for CPU presets and tests (4 conv blocks, global pooling)."""

    def __init__(self, width: int = 32, out_dim: int = 128) -> None:
        super().__init__()
        chans = [3, width, width * 2, width * 4, width * 4]
        blocks = []
        for c_in, c_out in pairwise(chans):
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


class EmbeddingNetwork(nn.Module):
    """The trainable backbone of a model on a frozen pretrained encoder (the pretrained-backbone track, METHODS.md
    §4b): a two-layer perceptron, ``Linear -> BatchNorm -> ReLU -> Linear``, from the encoder's cached features to a
    ``out_dim`` feature that the strategy's head reads, as a ResNet-18's 512-d output is read.

    Its input items hold the features of every encoder of the run side by side; ``columns`` ``(start, stop)`` are
    this model's encoder's (all of them when None). They are not part of the state dict, so a model trained on one
    encoder's features alone loads into a model that reads them among others (an IAM-CL2R replacement, pretrained on
    its own encoder, joins the stream whose items hold all three)."""

    def __init__(self, in_dim: int, width: int = 1024, out_dim: int = 512,
                 columns: tuple[int, int] | None = None) -> None:
        super().__init__()
        if columns is not None and columns[1] - columns[0] != in_dim:
            raise ValueError(f"columns {columns} hold {columns[1] - columns[0]} features, not in_dim = {in_dim}")
        self.columns = columns
        self.net = nn.Sequential(nn.Linear(in_dim, width), nn.BatchNorm1d(width), nn.ReLU(inplace=True),
                                 nn.Linear(width, out_dim))
        self.out_dim = out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x if self.columns is None else x[:, self.columns[0]:self.columns[1]])


class RetrievalModel(nn.Module):
    """Input normalisation + backbone + head with a uniform training and retrieval interface.

    The model normalises its own inputs with the statistics it was built with (``input_mean`` / ``input_std``,
    non-persistent buffers: state dicts and checkpoints never hold them). ``input_size`` is the side of the square
    images it was built for; it is recorded, not enforced (the backbones pool globally).
    """

    def __init__(self, backbone: nn.Module, head: nn.Module, *, mean: Sequence[float] = IDENTITY_MEAN,
                 std: Sequence[float] = IDENTITY_STD, input_size: int = 32) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.input_size = input_size
        self.register_buffer("input_mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1),
                             persistent=False)
        self.register_buffer("input_std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1),
                             persistent=False)

    def preprocess(self, x: torch.Tensor) -> torch.Tensor:
        """uint8 images (0..255) or floating images in [0, 1] -> the backbone's normalised input (:func:`normalize`);
        items that are feature vectors (``N x D``, an :class:`EmbeddingNetwork`'s input) pass unchanged."""
        return x if x.ndim == 2 else normalize(x, self.input_mean, self.input_std)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.head(self.backbone(self.preprocess(x)))

    @property
    def feature_width(self) -> int:
        """The width of the retrieval feature (a BT² model's is wider than its backbone's)."""
        return self.head.feature_width

    def class_targets(self, labels: torch.Tensor) -> torch.Tensor:
        """Logit index of each label: identity for a learnable head, the vertex for the d-Simplex head."""
        return self.head.targets(labels) if isinstance(self.head, DSimplexHead) else labels


def autocast_dtype(amp: bool | str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of an ``amp`` argument on ``device``: None on the CPU or when ``amp`` is False; a
    dtype name (``"float16"``, the authors' code and :data:`DEFAULT_AMP`, or ``"bfloat16"``); True means
    ``"bfloat16"``."""
    if not amp or device.type != "cuda":
        return None
    return torch.bfloat16 if amp is True else getattr(torch, amp)


@torch.no_grad()
def forward_in_batches(model: nn.Module, images: torch.Tensor, *, batch_size: int = 512,
                       amp: bool | str = DEFAULT_AMP) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(logits, features)`` in float32 for each batch of uint8 ``images``: eval mode, no augmentation, no
    gradient, autocast on CUDA as :func:`autocast_dtype` says; the model normalises the images itself and its
    train/eval mode is restored afterwards. The one place that runs a frozen model over a data set (gallery and
    query embedding, a teacher's outputs, a validation accuracy)."""
    device = next(model.parameters()).device
    dtype = autocast_dtype(amp, device)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(images), batch_size):
            batch = images[start:start + batch_size].to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                logits, features = model(batch)
            yield logits.float(), features.float()
    finally:
        model.train(was_training)


def embed(model: nn.Module, images: torch.Tensor, *, batch_size: int = 512,
          amp: bool | str = DEFAULT_AMP) -> torch.Tensor:
    """L2-normalised retrieval features (float32, on the model's device) of every image, as
    :func:`forward_in_batches` runs the model (METHODS.md §1, §3): the one function that embeds images, for the
    evaluation's galleries and queries and an adapter's fitting pairs. A model whose features hold NaN or
    infinities (a diverged run) raises :class:`NonFiniteError` instead of giving a result."""
    return embed_and_classify(model, images, batch_size=batch_size, amp=amp)[0]


def embed_and_classify(model: nn.Module, images: torch.Tensor, *, batch_size: int = 512,
                       amp: bool | str = DEFAULT_AMP) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`embed`'s features and, from the same pass, the classifier's top output of each image (an index into
    the model's outputs: compare with :meth:`RetrievalModel.class_targets`), so that a measure of both runs the
    model over the images once."""
    features, predicted = [], []
    for logits, batch_features in forward_in_batches(model, images, batch_size=batch_size, amp=amp):
        features.append(F.normalize(batch_features, dim=1))
        predicted.append(logits.argmax(dim=1))
    features_all = torch.cat(features)
    if not bool(torch.isfinite(features_all).all()):
        raise NonFiniteError(f"the model gives NaN or infinite features for {len(images)} images")
    return features_all, torch.cat(predicted)


SUMMED_ROWS = 4096
"""Rows converted to float64 at a time by :func:`class_means`, so its extra memory stays bounded."""


def class_means(features: torch.Tensor | Iterable[tuple[int, torch.Tensor]], labels: torch.Tensor,
                num_classes: int, total: Callable[[torch.Tensor], torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(means, present)``: the mean float32 feature of each label ``0..num_classes-1`` (zeros where absent) and
    a boolean mask of the labels that have at least one sample; labels ``>= num_classes`` are ignored. ``features``
    in memory, or as ``(start, rows)`` chunks of the items in order (a streamed gallery's), summed chunk by chunk;
    ``total`` adds the class sums of every process's share up before the division (a gallery shared by processes).
    The sums are taken in float64 and the means rounded to float32, so a mean does not depend on how its items are
    divided into chunks or among processes (float64 rounds half a billion times finer than float32).
    The one class-mean computation: evaluation templates (METHODS.md §3), BCT's rows for unseen classes and CVS's
    prototypes (§6), the class-mean-distance backfilling order (§7)."""
    sums = None
    for start, chunk in [(0, features)] if isinstance(features, torch.Tensor) else features:
        if sums is None:
            sums = torch.zeros(num_classes, chunk.shape[1], dtype=torch.float64, device=chunk.device)
        for offset in range(0, len(chunk), SUMMED_ROWS):
            rows = chunk[offset:offset + SUMMED_ROWS]
            rows_labels = labels[start + offset:start + offset + len(rows)]
            keep = rows_labels < num_classes
            sums.index_add_(0, rows_labels[keep], rows[keep].double())
    if total is not None:
        sums = total(sums)
    counts = torch.bincount(labels[labels < num_classes], minlength=num_classes).to(sums.device)
    return (sums / counts.clamp(min=1)[:, None]).float(), counts > 0


def classifier_rows(model: RetrievalModel, num_classes: int) -> torch.Tensor:
    """The classifier's row of each class ``0..num_classes-1`` in feature space (row y scores class y): the
    learnable / cosine weights, or the d-Simplex vertex ``K-1-y``."""
    head = model.head
    if isinstance(head, DSimplexHead):
        return head.vertices[head.targets(torch.arange(num_classes, device=head.vertices.device))]
    return head.classifier.weight[:num_classes].detach()


def build_backbone(name: str, *, width: int = 32, out_dim: int = 128, embedding_width: int = 1024,
                   embedding_dim: int = 512, feature_columns: tuple[int, int] | None = None,
                   feature_dim: int | None = None) -> nn.Module:
    """The backbone ``name`` of :data:`BACKBONES`; ``frozen_encoder`` is an :class:`EmbeddingNetwork` of
    ``feature_dim`` inputs (read from ``feature_columns`` of the items when given)."""
    if name == "frozen_encoder":
        if feature_dim is None:
            raise ValueError("the frozen_encoder backbone needs feature_dim, the width of its encoder's features")
        return EmbeddingNetwork(feature_dim, embedding_width, embedding_dim, feature_columns)
    if name == "resnet18":
        return ResNet18("imagenet")
    if name == "resnet18_cifar":
        return ResNet18("cifar")
    if name == "small_cnn":
        return SmallConvNet(width, out_dim)
    raise ValueError(f"unknown backbone {name!r}; choose from {list(BACKBONES)}")


def build_model(*, backbone: str, head: str, num_classes: int, simplex_vertices_count: int = 1024,
                small_width: int = 32, small_out_dim: int = 128, embedding_width: int = 1024, embedding_dim: int = 512,
                feature_columns: tuple[int, int] | None = None, feature_dim: int | None = None,
                mean: Sequence[float] = IDENTITY_MEAN, std: Sequence[float] = IDENTITY_STD, input_size: int = 32,
                head_options: dict | None = None) -> RetrievalModel:
    """A fresh model: ``head`` is ``"learnable"`` or ``"cosine"`` (sized to ``num_classes``) or ``"dsimplex"``;
    ``backbone`` as :func:`build_backbone` takes it.

    ``mean`` / ``std`` are the per-channel statistics of the data the model will see (a stream's, or a
    pretraining source's while it pretrains); the model normalises its inputs with them. The default is the
    identity standardisation (mean 0, std 1: uint8 images are only scaled to [0, 1], floating ones pass
    unchanged), for models whose inputs are prepared elsewhere (tests, parity checks). ``input_size`` is the side
    of the square images the model is built for (recorded, not enforced)."""
    net = build_backbone(backbone, width=small_width, out_dim=small_out_dim, embedding_width=embedding_width,
                         embedding_dim=embedding_dim, feature_columns=feature_columns, feature_dim=feature_dim)
    return RetrievalModel(net, build_head(head, net.out_dim, num_classes, simplex_vertices_count, head_options),
                          mean=mean, std=std, input_size=input_size)


def replacement_family(head: str) -> str:
    """The family of replacement models a head loads: ``dsimplex`` (lift included) or ``learnable`` (backbone
    only; the learnable and cosine classifiers are dropped on loading, so both heads share these models, and a BT²
    head is built fresh over the loaded backbone)."""
    return "dsimplex" if head == "dsimplex" else "learnable"


def head_over(head: str, older_width: int | None) -> tuple[str, dict]:
    """``(family, options)`` of a fresh head of family ``head`` built over an older model of feature width
    ``older_width`` (None: no older model, e.g. the upgrade protocol's old model, CL2R's first model): a BT² or OCA
    head transforms the older model's frame (``old_width`` = its width), so without one the model has the plain
    ``learnable`` head; other heads take no options."""
    if head not in ("bt2", "oca"):
        return head, {}
    return ("learnable", {}) if older_width is None else (head, {"old_width": older_width})


def older_width_in(state: dict[str, torch.Tensor]) -> int | None:
    """The ``older_width`` of :func:`head_over` that built the model whose state dict this is: a BT² head's old
    width (the size of its ``old_basis``) or an OCA head's (the outputs of its ``compatible`` layer), else None."""
    basis = state.get("head.old_basis.parametrizations.weight.original", state.get("head.compatible.weight"))
    return None if basis is None else basis.shape[0]


def same_features(a: RetrievalModel, b: RetrievalModel) -> bool:
    """Whether ``a`` and ``b`` give the same features: every weight but the learnable classifier's is equal (a task's
    model before fine-tuning and its teacher, a copy of it; their classifiers may differ by the rows grown since)."""
    state_a, state_b = feature_extractor_state(a), feature_extractor_state(b)
    return state_a.keys() == state_b.keys() and all(
        state_a[k].shape == state_b[k].shape and torch.equal(state_a[k], state_b[k].to(state_a[k].device))
        for k in state_a)


def feature_extractor_state(model: RetrievalModel) -> dict[str, torch.Tensor]:
    """The state dict without the learnable classifier: what a replacement checkpoint carries."""
    return {k: v for k, v in model.state_dict().items() if not k.startswith(CLASSIFIER_PREFIX)}


def load_state(model: RetrievalModel, path: str | Path) -> None:
    """Load a whole saved model (classifier included) into ``model``; an unreadable or mismatching file is a
    :class:`CheckpointError`."""
    try:
        model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} does not exist") from None
    except Exception as exc:  # noqa: BLE001 - unpickling or shape failures mean the file is not this model's
        raise CheckpointError(f"checkpoint {path} does not hold this model's state dict ({type(exc).__name__}); "
                              "delete it to train it again") from None


def load_replacement(model: RetrievalModel, path: str | Path) -> None:
    """Load a replacement checkpoint into ``model``, strictly except for the dropped learnable classifier (§4); a
    BT² or OCA head is not in the (learnable-family) checkpoint and keeps its fresh weights.

    Raises :class:`CheckpointError` naming the missing or unexpected weights, or a shape mismatch.
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} does not exist; pass an existing file or let the suite pretrain "
                              "one") from None
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means an unreadable file
        raise CheckpointError(f"cannot read checkpoint {path} as a plain state dict ({type(exc).__name__}); "
                              "save it with torch.save(model.state_dict())") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise CheckpointError(f"checkpoint {path} is not a state dict of named tensors; save it with "
                              "torch.save(model.state_dict())")
    state = {k: v for k, v in state.items() if not k.startswith(CLASSIFIER_PREFIX)}
    expected = feature_extractor_state(model)
    if isinstance(model.head, (BasisTransformationHead, OrthogonalTransformationHead)):
        expected = {k: v for k, v in expected.items() if not k.startswith("head.")}
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
