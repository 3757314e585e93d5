"""``synthetic``: a deterministic generated data set with class structure (coarse colour layouts, random shifts and
noise) that a small CNN learns in seconds; for tests and offline demos. Its size and difficulty are the
``data.synthetic_*`` settings.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from cl2r_bench.data.datasets import DataSet, DataSplits, ImageSet, register_dataset

SYNTHETIC_MEAN, SYNTHETIC_STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


def make_synthetic(*, num_classes: int = 60, train_per_class: int = 120, test_per_class: int = 30,
                   image_size: int = 32, seed: int = 0, noise: float = 0.08, similarity: float = 0.0) -> DataSplits:
    """A deterministic data set with learnable class structure.

    Each class is a random 4x4 colour layout upsampled to ``image_size``; each image is its class layout shifted
    by up to 1/8 of the image, with per-image brightness jitter and pixel noise of std ``noise``. Two difficulty
    knobs: ``noise``, and ``similarity`` in [0, 1), the share of every class layout that is one layout common to
    all classes (0: classes as different as random layouts; near 1: classes told apart by small differences).
    Identical for every run seed. The defaults are the plain generator (speed benchmarks); runs take the
    ``data.synthetic_*`` settings (configs/default.yaml), chosen so that the suite's models reach the accuracy
    they reach on real data (docs/configuration.md).
    """
    rng = np.random.default_rng(seed)
    own = rng.uniform(0.1, 0.9, size=(num_classes, 3, 4, 4))
    common = np.random.default_rng([seed, 1]).uniform(0.1, 0.9, size=(1, 3, 4, 4))  # apart: own draws unchanged
    layouts = torch.from_numpy((similarity * common + (1 - similarity) * own).astype(np.float32))
    layouts = torch.nn.functional.interpolate(layouts, size=(image_size, image_size), mode="bilinear",
                                              align_corners=False)

    def split(per_class: int) -> ImageSet:
        labels = torch.arange(num_classes).repeat_interleave(per_class)
        images = layouts[labels].clone()
        max_shift = max(1, image_size // 8)
        shifts = rng.integers(-max_shift, max_shift + 1, size=(len(labels), 2))
        for i, (dy, dx) in enumerate(shifts):
            images[i] = torch.roll(images[i], shifts=(int(dy), int(dx)), dims=(1, 2))
        brightness = torch.from_numpy(rng.uniform(0.8, 1.2, size=(len(labels), 1, 1, 1)).astype(np.float32))
        pixel_noise = torch.from_numpy(rng.normal(0, noise, size=images.shape).astype(np.float32))
        images = (images * brightness + pixel_noise).clamp(0, 1)
        return ImageSet((images * 255).round().to(torch.uint8), labels)

    return DataSplits("synthetic", split(train_per_class), split(test_per_class),
                      [f"class_{i:03d}" for i in range(num_classes)], mean=SYNTHETIC_MEAN, std=SYNTHETIC_STD)


@register_dataset("synthetic")
class Synthetic(DataSet):
    classes, mean, std = 0, SYNTHETIC_MEAN, SYNTHETIC_STD

    def load(self, root: Path, *, download: bool, image_size: int, verify: str, synthetic_classes: int = 60,
             synthetic_train_per_class: int = 120, synthetic_test_per_class: int = 30, synthetic_noise: float = 0.08,
             synthetic_similarity: float = 0.0, **options: Any) -> DataSplits:
        return make_synthetic(num_classes=synthetic_classes, train_per_class=synthetic_train_per_class,
                              test_per_class=synthetic_test_per_class, image_size=image_size, noise=synthetic_noise,
                              similarity=synthetic_similarity)

    def class_count(self, *, synthetic_classes: int, **options: Any) -> int:
        return synthetic_classes
