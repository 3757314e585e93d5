"""Class-incremental streams (Avalanche) and the retrieval evaluation sets of CL2R / IAM-CL2R (METHODS.md §3-§4).

The stream is an Avalanche ``class_incremental_benchmark`` with explicit per-experience class counts (never
``num_experiences=``, which silently drops classes), kept as :attr:`Stream.benchmark`. Its experiences carry the
data: items are ``(uint8 image 3 x H x W, label, task label 0)``, with two transform groups, ``train`` (random crop
with zero padding 4 and horizontal flip, METHODS.md §4, on the uint8 image) and ``eval`` (none). The models
normalise their own input, so an Avalanche strategy trains on ``experience.dataset`` as it is
(``cl2r_bench/training/avalanche.py``).

Each :class:`Task` keeps its experience and an :class:`ImageSet` read back from that experience's ``eval`` view in
Avalanche's sample order: the suite's own trainer draws its batches from it on the device (no per-image work on the
training path), so both trainers see the same samples per task.

Labels are remapped to stream positions: the i-th class of the class order gets label i, so a learnable
head indexes classes in arrival order and the d-Simplex head puts class i on vertex K-1-i.

Evaluation (open set, never trained on):

* ``eval_dataset="heldout"``: the ``heldout_classes`` classes that follow the stream classes in the class
  order; gallery = their test images, query = their train images.
* any other data set name (``cifar10`` for the CIFAR-100 protocol): gallery = its test split, query = its
  train split.

Closed set (the stream's own classes, for the BCT line's two-model protocol, ``scenarios/upgrade.py``):

* ``eval_dataset="stream"``: query = the stream classes' test images, gallery = their training images of the
  stream (per image or as class templates, ``evaluation.mode``), so no query is in the gallery.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .avalanche_import import importing_avalanche
from .datasets import DataError, DataSplits, ImageSet, load_dataset
from .transforms import CROP_PADDING


@dataclass
class Task:
    """One experience: its new classes (stream labels), the number of classes seen so far, its images (read from
    ``experience``, the Avalanche experience that carries them) and the experience itself."""

    index: int
    new_classes: list[int]
    num_seen_classes: int
    train: ImageSet
    experience: Any = field(repr=False, default=None)


@dataclass
class Stream:
    """A built stream: tasks, replacement schedule, evaluation sets and bookkeeping; ``benchmark`` is the
    Avalanche benchmark the tasks come from (``benchmark.train_stream`` / ``test_stream``)."""

    dataset: str
    tasks: list[Task]
    replacement_tasks: list[int]
    query: ImageSet
    gallery: ImageSet
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    class_order: list[int]
    reserved_classes: list[int]
    benchmark: Any = field(repr=False, default=None)
    feature_columns: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Empty for images; on the pretrained-backbone track the columns of each encoder's features in the items
    (:attr:`cl2r_bench.data.datasets.DataSplits.feature_columns`)."""

    @property
    def num_tasks(self) -> int:
        return len(self.tasks)


def task_class_counts(initial: int, increment: int, num_tasks: int) -> list[int]:
    """``[initial, increment, ..., increment]``: e.g. 10 + 15x6 (7 tasks) or 10 + 3x30 (31 tasks)."""
    if num_tasks < 1 or initial < 1 or (num_tasks > 1 and increment < 1):
        raise DataError(f"a stream needs num_tasks >= 1 and positive class counts (got initial={initial}, "
                        f"increment={increment}, num_tasks={num_tasks})")
    return [initial] + [increment] * (num_tasks - 1)


def make_class_order(num_classes: int, order: str | list[int], seed: int) -> list[int]:
    """``"natural"`` (0..n-1), ``"seeded"`` (permutation from ``seed``) or an explicit list of class ids
    (:data:`cl2r_bench.settings.CLASS_ORDERS`)."""
    if order == "natural":
        return list(range(num_classes))
    if order == "seeded":
        return [int(c) for c in np.random.default_rng(seed).permutation(num_classes)]
    if isinstance(order, list) and sorted(order) == sorted(set(order)) and all(0 <= c < num_classes for c in order):
        return [int(c) for c in order] + [c for c in range(num_classes) if c not in set(order)]
    raise DataError(f"stream.class_order must be 'natural', 'seeded' or a list of distinct class ids "
                    f"below {num_classes}; got {order!r}")


def first_per_class(images: ImageSet, classes: list[int], per_class: int | None) -> ImageSet:
    """The first ``per_class`` images of each class in data set order (all of them when ``None``)."""
    return images.select(first_rows(images.labels, classes, per_class))


def first_rows(labels: torch.Tensor, classes: list[int], per_class: int | None) -> torch.Tensor:
    """The rows of :func:`first_per_class`, in data set order."""
    keep = []
    for c in classes:
        idx = torch.nonzero(labels == c).flatten()
        keep.append(idx if per_class is None else idx[:per_class])
    return torch.sort(torch.cat(keep)).values


def query_sample(images: ImageSet, classes: list[int], per_class: int | None, seed: int | None) -> ImageSet:
    """The query sample: the first ``per_class`` images of each class (:func:`first_per_class`), or with ``seed`` a
    random ``per_class`` of each class's images drawn from that seed (``seed_scope: split``), in data set order."""
    if seed is None or per_class is None:
        return first_per_class(images, classes, per_class)
    generator = torch.Generator().manual_seed(seed)
    keep = []
    for c in classes:
        idx = torch.nonzero(images.labels == c).flatten()
        keep.append(idx[torch.randperm(len(idx), generator=generator)[:per_class]])
    return images.select(torch.sort(torch.cat(keep)).values)


def relabel(images: ImageSet, class_order: list[int]) -> ImageSet:
    """Replace each original class id by its position in ``class_order``."""
    lookup = torch.full((max(class_order) + 1,), -1, dtype=torch.long)
    lookup[torch.tensor(class_order)] = torch.arange(len(class_order))
    return ImageSet(images.images, lookup[images.labels])


class CropFlip:
    """Random crop (zero padding ``padding``) and horizontal flip with probability 1/2 of one uint8 ``3 x H x W``
    image: the per-sample form of :func:`cl2r_bench.data.transforms.random_crop_flip` (the same distribution, METHODS.md
    §4), the stream's ``train`` transform. Plain slicing, so it costs microseconds per image."""

    def __init__(self, padding: int = CROP_PADDING) -> None:
        self.padding = padding

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        p = self.padding
        h, w = image.shape[-2:]
        top, left = torch.randint(0, 2 * p + 1, (2,)).tolist()
        crop = F.pad(image, (p, p, p, p))[..., top:top + h, left:left + w]
        return crop.flip(-1) if bool(torch.rand(()) < 0.5) else crop.contiguous()

    def __repr__(self) -> str:
        return f"CropFlip(padding={self.padding})"


class ImageSetDataset(torch.utils.data.Dataset):
    """The items ``(uint8 image 3 x H x W, int label)`` of an :class:`ImageSet` (a view, nothing is copied)."""

    def __init__(self, images: ImageSet) -> None:
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.images.images[i], int(self.images.labels[i])


def classification_dataset(images: ImageSet, *, padding: int = CROP_PADDING) -> Any:
    """``images`` as an Avalanche classification dataset with ``targets``, task labels (all 0: a class-incremental
    stream, as Avalanche's own; strategies such as LwF and EWC read them) and the ``train`` (:class:`CropFlip`;
    none for items that are features) and ``eval`` (identity) transform groups. Items are ``(uint8 image, label,
    0)``."""
    with importing_avalanche():
        from avalanche.benchmarks.utils import DataAttribute
        from avalanche.benchmarks.utils.classification_dataset import TaskAwareSupervisedClassificationDataset
        from avalanche.benchmarks.utils.transform_groups import TransformGroups

    return TaskAwareSupervisedClassificationDataset(
        [ImageSetDataset(images)],
        data_attributes=[DataAttribute(images.labels.tolist(), "targets"),
                         DataAttribute([0] * len(images), "targets_task_labels", use_in_getitem=True)],
        transform_groups=TransformGroups({"train": CropFlip(padding) if images.are_images else None, "eval": None}))


def avalanche_benchmark(train: ImageSet, test: ImageSet, class_counts: list[int]) -> Any:
    """The Avalanche class-incremental benchmark over ``train`` / ``test`` (labels already in stream order):
    experience i holds classes ``sum(class_counts[:i]) .. sum(class_counts[:i+1]) - 1``, task label 0
    (``experience.task_label``)."""
    with importing_avalanche():
        from avalanche.benchmarks import class_incremental_benchmark
        from avalanche.benchmarks.scenarios.task_aware import with_task_labels

    return with_task_labels(class_incremental_benchmark(
        {"train": classification_dataset(train), "test": classification_dataset(test)},
        class_order=list(range(sum(class_counts))), num_classes_per_exp=class_counts))


def single_experience(images: ImageSet) -> Any:
    """One Avalanche experience carrying ``images`` (e.g. a replacement model's pretraining set), for training
    outside a class-incremental stream."""
    with importing_avalanche():
        from avalanche.benchmarks.scenarios.dataset_scenario import benchmark_from_datasets

    cpu = ImageSet(images.images.cpu(), images.labels.cpu())
    return benchmark_from_datasets(train=[classification_dataset(cpu)]).train_stream[0]


def experience_images(experience: Any) -> ImageSet:
    """The images and labels an experience carries, untransformed (its ``eval`` view), in Avalanche's order
    (Avalanche's ``load_all_dataset``: one batch of the whole experience)."""
    with importing_avalanche():
        from avalanche.training.utils import load_all_dataset

    images, labels = load_all_dataset(experience.dataset.eval())[:2]
    return ImageSet(images, labels.long())


def evaluation_sets(data: DataSplits, class_order: list[int], num_stream: int, *, eval_dataset: str,
                    heldout_classes: int, queries_per_class: int | None, data_root: str, download: bool,
                    verify: str, image_size: int, images_per_class: int | None = None,
                    load: Callable[..., DataSplits] = load_dataset, query_seed: int | None = None
                    ) -> tuple[ImageSet, ImageSet, list[int]]:
    """``(query, gallery, reserved original class ids)`` for the evaluation protocol (module docstring);
    ``images_per_class`` are the stream's training images per class (the ``stream`` gallery's); ``load`` reads
    another evaluation data set as :func:`build_stream` reads the stream's; ``query_seed`` draws the
    ``queries_per_class`` of each class at random (:func:`query_sample`)."""
    stream_ids = class_order[:num_stream]
    if eval_dataset == "heldout":
        held = class_order[num_stream:num_stream + heldout_classes]
        if len(held) < max(heldout_classes, 2):
            raise DataError(f"{data.name} has {data.num_classes} classes: {num_stream} stream classes leave "
                            f"{len(held)} for held-out evaluation, {heldout_classes} requested; shrink the stream or "
                            "evaluation.heldout_classes")
        query = relabel(query_sample(data.train, held, queries_per_class, query_seed), held)
        gallery = relabel(first_per_class(data.test, held, None), held)
        return query, gallery, stream_ids + held
    if eval_dataset == "stream":
        query = relabel(query_sample(data.test, stream_ids, queries_per_class, query_seed), stream_ids)
        gallery = relabel(first_per_class(data.train, stream_ids, images_per_class), stream_ids)
        return query, gallery, stream_ids
    other = load(eval_dataset, data_root, download=download, verify=verify, image_size=image_size)
    if other.feature_columns != data.feature_columns:
        raise DataError(f"the evaluation data set {eval_dataset} holds the features of {list(other.feature_columns)}, "
                        f"the stream of {list(data.feature_columns)}; load both with the same encoders")
    if other.train.are_images and other.train.images.shape[-2:] != data.train.images.shape[-2:]:
        raise DataError(f"the evaluation data set {eval_dataset} has {tuple(other.train.images.shape[-2:])} images, "
                        f"the stream {tuple(data.train.images.shape[-2:])}; set data.image_size=32 or evaluate on "
                        "--eval-dataset heldout")
    query = query_sample(other.train, list(range(other.num_classes)), queries_per_class, query_seed)
    return query, other.test, stream_ids


def build_stream(*, dataset: str, data_root: str, download: bool = False, verify: str = "warn",
                 image_size: int = 32, initial_classes: int, increment: int, num_tasks: int,
                 images_per_class: int | None, class_order: str | list[int] = "natural", order_seed: int = 0,
                 replacement_tasks: list[int], eval_dataset: str, heldout_classes: int = 20,
                 queries_per_class: int | None = None, synthetic: dict[str, int] | None = None,
                 load: Callable[..., DataSplits] = load_dataset, query_seed: int | None = None) -> Stream:
    """Build the stream on ``dataset`` with its evaluation sets (see the module docstring); which tasks are
    replacements is the scenario's business (``cl2r_bench/scenario.py``). ``load`` reads a data set, with the
    arguments of :func:`cl2r_bench.data.datasets.load_dataset`: the images, or on the pretrained-backbone track
    their encoders' features (:func:`cl2r_bench.scenario.data_loader`)."""
    counts = task_class_counts(initial_classes, increment, num_tasks)
    bad = [t for t in replacement_tasks if not 0 <= t < num_tasks]
    if bad:
        raise DataError(f"replacement task(s) {bad} outside 0..{num_tasks - 1}; fix replacement.tasks")
    data = load(dataset, data_root, download=download, image_size=image_size, verify=verify, **(synthetic or {}))
    if sum(counts) > data.num_classes:
        raise DataError(f"the stream needs {sum(counts)} classes ({initial_classes} + {increment} x "
                        f"{num_tasks - 1}); {dataset} has {data.num_classes}")
    order = make_class_order(data.num_classes, class_order, order_seed)
    stream_ids = order[: sum(counts)]
    train = relabel(first_per_class(data.train, stream_ids, images_per_class), stream_ids)
    test = relabel(first_per_class(data.test, stream_ids, None), stream_ids)
    benchmark = avalanche_benchmark(train, test, counts)
    tasks = [Task(t, sorted(int(c) for c in exp.classes_in_this_experience), len(exp.classes_seen_so_far),
                  experience_images(exp), exp) for t, exp in enumerate(benchmark.train_stream)]
    query, gallery, reserved = evaluation_sets(
        data, order, sum(counts), eval_dataset=eval_dataset, heldout_classes=heldout_classes,
        queries_per_class=queries_per_class, data_root=data_root, download=download, verify=verify,
        image_size=image_size, images_per_class=images_per_class, load=load, query_seed=query_seed)
    return Stream(dataset, tasks, sorted(set(replacement_tasks)), query, gallery, data.mean, data.std,
                  order, reserved, benchmark, data.feature_columns)
