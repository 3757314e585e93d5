"""Two encoders by spec (``model_update.old`` / ``new``): the data set's splits embedded once per encoder through the
feature cache, as a :class:`~cl2r_bench.adapter_study.study.Study`."""
from __future__ import annotations

from typing import Any

import torch

from benchmarks.adapted_cases import (
    PairedFeatures,
)
from cl2r_bench.data.datasets import ImageSet, load_dataset, native_image_size
from cl2r_bench.data.streams import first_per_class
from cl2r_bench.encoders import Encoder, build_encoder
from cl2r_bench.feature_cache import ONE_PIECE, Sharding, cached_features

from .embeddings import class_overlap, unseen_rows
from .study import Study, ZeroShot


def encoder_study(settings: Any, device: torch.device, log: Any = print) -> Study:
    """The :class:`Study` of ``model_update.old`` / ``new`` on the run's data set at its native resolution: the
    first ``fit_per_class`` train-split images per class to fit on, the first ``test_per_class`` test-split
    images per class to measure on, each embedded once per encoder (:mod:`cl2r_bench.feature_cache`); with
    ``model_update.unseen_classes``, the open set of :func:`unseen_rows`. Both encoders are built before the data are
    read, so a spec that cannot be built fails first."""
    update = settings.model_update
    encoders, data, splits = study_images(settings)
    raw, seconds = embedded(settings, encoders, splits, device, log)
    train_rows, test_rows, unseen = unseen_rows(splits["train"].labels, splits["test"].labels, update.unseen_classes,
                                                f"the {settings.dataset} test split")
    rows = {"train": torch.as_tensor(train_rows), "test": torch.as_tensor(test_rows)}
    labels = {split: images.labels[rows[split]] for split, images in splits.items()}
    paired = {split: PairedFeatures.normalised(raw["old", split][rows[split]], raw["new", split][rows[split]],
                                               labels[split]).to(device) for split in splits}
    about = {"old": encoders["old"].describe(), "new": encoders["new"].describe(),
             "data": {"dataset": settings.dataset, "train_items": len(labels["train"]),
                      "test_items": len(labels["test"]), "fit_per_class": update.fit_per_class,
                      "test_per_class": update.test_per_class},
             **class_overlap(labels["train"], labels["test"], unseen)}
    classifier = encoders["new"].classifier
    zero_shot = None
    imagenet = imagenet_classes(data.class_names) if classifier is not None else None
    if imagenet is not None and classifier.weight.shape[0] == IMAGENET_CLASSES:
        zero_shot = ZeroShot(raw["new", "test"][rows["test"]].to(device), imagenet[labels["test"]].to(device),
                             classifier.to(device))
    return Study(settings.dataset, paired["train"], paired["test"], about, zero_shot, seconds,
                 progress=settings.training.progress, pairing=update.pairing)


def study_images(settings: Any) -> tuple[dict[str, Encoder], Any, dict[str, ImageSet]]:
    """The two encoders (built before the data are read, so a spec that cannot be built fails first), the data
    set, and the train and test images a study embeds (:func:`encoder_study`)."""
    update, data_settings = settings.model_update, settings.data
    encoders = {"old": build_encoder(update.old), "new": build_encoder(update.new)}
    data = load_dataset(settings.dataset, settings.data_root, download=settings.download,
                        image_size=native_image_size(settings.dataset) or data_settings.image_size,
                        verify=data_settings.verify, **data_settings.synthetic)
    classes = list(range(data.num_classes))
    splits = {"train": first_per_class(data.train, classes, update.fit_per_class),
              "test": first_per_class(data.test, classes, update.test_per_class)}
    return encoders, data, splits


def embedded(settings: Any, encoders: dict[str, Encoder], splits: dict[str, ImageSet], device: torch.device,
             log: Any, sharding: Sharding = ONE_PIECE
             ) -> tuple[dict[tuple[str, str], torch.Tensor], dict[str, float]]:
    """Each split's raw features under each encoder, from the feature cache or embedded into it (``sharding``:
    this process's part, ``runner.py embed``), and the seconds each embedding took here."""
    update = settings.model_update
    raw: dict[tuple[str, str], torch.Tensor] = {}
    seconds: dict[str, float] = {}
    for role, encoder in encoders.items():
        for split, images in splits.items():
            per_class = update.fit_per_class if split == "train" else update.test_per_class
            got = cached_features(encoder, images, data={"dataset": settings.dataset, "split": split,
                                                         "per_class": per_class},
                                  cache_dir=update.feature_cache, device=device, batch_size=update.encoder_batch_size,
                                  amp=settings.training.autocast, progress=settings.training.progress, log=log,
                                  sharding=sharding)
            raw[role, split] = got.features
            seconds[f"{role}/{split}"] = got.seconds
            log(f"{role} encoder, {split} split: {len(images)} images "
                + ("(cached)" if got.cached else f"embedded in {got.seconds:.1f}s "
                   f"({len(images) / max(got.seconds, 1e-9):.1f} images/s)"))
    return raw, seconds


IMAGENET_CLASSES = 1000


def imagenet_classes(class_names: list[str]) -> torch.Tensor | None:
    """The ImageNet-1k class index of each class when every name is an ImageNet wnid (Tiny ImageNet's 200 classes),
    else None: the zero-shot retention offline (docs/METHODS.md §7b)."""
    from timm.data import ImageNetInfo

    index = {wnid: i for i, wnid in enumerate(ImageNetInfo().label_names())}
    if not class_names or any(name not in index for name in class_names):
        return None
    return torch.tensor([index[name] for name in class_names])
