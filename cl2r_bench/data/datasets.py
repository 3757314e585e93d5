"""Data sets as uint8 image tensors (METHODS.md §3-§4): what every data set shares, and the template a new one
fills in. Each data set is one file in ``cl2r_bench/data/`` registered by name (:func:`register_dataset`):

* ``cifar100`` / ``cifar10`` (``cifar.py``): the official ``cifar-100-python`` / ``cifar-10-batches-py`` pickles.
* ``tinyimagenet`` (``tiny_imagenet.py``): the standard ``tiny-imagenet-200/`` folder.
* ``synthetic`` (``synthetic.py``): a deterministic generated data set with class structure, for tests and offline
  demos.

Every reader returns a :class:`DataSplits` of :class:`ImageSet` (``N x 3 x H x W`` uint8, int64 labels).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from cl2r_bench.registry import Registry

CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4867, 0.4408), (0.2675, 0.2565, 0.2761)



class DataError(RuntimeError):
    """Data are missing or unreadable; the message says which files were expected and how to get them."""


class DataNotice(UserWarning):
    """Data are usable but not what the official release ships (the runner prints it as one ``notice:`` line)."""


@dataclass
class ImageSet:
    """Images (``N x 3 x H x W`` uint8) with integer labels; or, on the pretrained-backbone track, the items' frozen
    encoder features (``N x D`` float32) in their place (:attr:`DataSplits.feature_columns`)."""

    images: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def are_images(self) -> bool:
        """Whether the items are images (``N x C x H x W``), which training crops and flips, rather than features."""
        return self.images.ndim == 4

    def select(self, index: torch.Tensor) -> ImageSet:
        return ImageSet(self.images[index], self.labels[index])

    def digest(self) -> str:
        """sha256 of the images' shape, dtype and bytes and of the labels: the identity of the data, for cache keys
        that must change with every setting that changes the data."""
        digest = hashlib.sha256(f"{tuple(self.images.shape)}|{self.images.dtype}".encode())
        digest.update(self.images.cpu().contiguous().numpy().tobytes())
        digest.update(self.labels.cpu().to(torch.int64).numpy().tobytes())
        return digest.hexdigest()


@dataclass
class DataSplits:
    """A data set's train and test splits, its class names and normalisation statistics. ``feature_columns`` is
    empty for images; when the items are frozen encoders' features side by side (the pretrained-backbone track,
    :func:`cl2r_bench.feature_cache.feature_splits`), it maps each encoder's spec to its ``(start, stop)`` columns."""

    name: str
    train: ImageSet
    test: ImageSet
    class_names: list[str]
    mean: tuple[float, float, float] = CIFAR100_MEAN
    std: tuple[float, float, float] = CIFAR100_STD
    feature_columns: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def features_of(self, spec: str) -> DataSplits:
        """The splits as the one encoder ``spec`` of :attr:`feature_columns` sees them: its columns alone (what a
        model on that encoder is pretrained on)."""
        start, stop = self.feature_columns[spec]
        return DataSplits(self.name, ImageSet(self.train.images[:, start:stop].contiguous(), self.train.labels),
                          ImageSet(self.test.images[:, start:stop].contiguous(), self.test.labels), self.class_names,
                          self.mean, self.std, {spec: (0, stop - start)})



class DataSet:
    """The template of a data set: one file in ``cl2r_bench/data/`` with a subclass registered by
    ``@register_dataset("name")`` (every module of the folder is imported), and its profile
    ``cl2r_bench/configs/datasets/<name>.yaml`` (the stream's shape on it, its held-out classes, its replacement
    pretraining: the defaults a run on it starts from); a plug-in file instead, with its profile in
    ``configs/datasets/<name>.yaml`` beside it (:data:`cl2r_bench.config.PROFILE_FOLDERS`).

    ``classes`` is its class count, known before reading it (the scenarios check a stream against it);
    ``native_size`` the side of its images as released (None: generated at the configured size); ``mean`` / ``std``
    what a model trained on it normalises with (every real data set uses CIFAR-100's, as the authors' code does;
    METHODS.md §4). :meth:`load` reads both splits under ``root`` (``download`` fetches them first) at ``image_size``
    where its images are resized, and says in one :class:`DataError` line which files are missing or damaged and
    how to get them."""

    name: ClassVar[str]
    classes: ClassVar[int]
    native_size: ClassVar[int | None] = None
    mean: ClassVar[tuple[float, float, float]] = CIFAR100_MEAN
    std: ClassVar[tuple[float, float, float]] = CIFAR100_STD

    def load(self, root: Path, *, download: bool, image_size: int, verify: str, **options: Any) -> DataSplits:
        raise NotImplementedError

    def class_count(self, **options: Any) -> int:
        """Its class count (a generated data set's may be a setting, passed in ``options``)."""
        return self.classes


DATA_SETS = Registry("data set", DataError)
register_dataset = DATA_SETS.register


def load_dataset(name: str, root: str | Path, *, download: bool = False, image_size: int = 32,
                 verify: str = "warn", **options: Any) -> DataSplits:
    """Read data set ``name`` from ``root``; ``options`` are a generated data set's ``synthetic_*`` settings."""
    return DATA_SETS.get(name)().load(Path(root), download=download, image_size=image_size, verify=verify, **options)


def dataset_statistics(name: str) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """``(mean, std)`` that a model trained on data set ``name`` normalises with, known before reading it."""
    source = DATA_SETS.get(name)
    return source.mean, source.std


def class_count(name: str, synthetic_classes: int) -> int:
    """How many classes data set ``name`` has (``synthetic``: as configured), known before reading it."""
    return DATA_SETS.get(name)().class_count(synthetic_classes=synthetic_classes)


def native_image_size(name: str) -> int | None:
    """The side of data set ``name``'s images as released (None for a generated one)."""
    return DATA_SETS.get(name).native_size


def file_md5(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def download_archive(url: str, root: Path, md5: str) -> None:
    from torchvision.datasets.utils import download_and_extract_archive

    try:
        download_and_extract_archive(url, str(root), md5=md5)
    except Exception as exc:  # noqa: BLE001 - network errors come in many types
        raise DataError(f"download of {url} failed ({type(exc).__name__}: {exc}); download it by hand and "
                        f"extract it into {root}") from None

