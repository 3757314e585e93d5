"""A cache of encoder features on disk (docs/METHODS.md §7b): each image set is embedded once per encoder, and
every adapter and seed of a study reuses it.

A cache entry is keyed by what the features depend on: the encoder (its spec, the sha256 of its weights and its
preprocessing, :meth:`cl2r_bench.encoders.Encoder.describe`), the data (its name, split, and the sha256 of the
images and labels actually embedded, so a subset or another copy of the data never hits a wrong entry) and the
precision (``amp`` on a GPU). The entry ``<cache_dir>/<key>.pt`` holds the pooled pre-logits features (float32,
not normalised) and labels, next to ``<key>.json`` saying what made it; both are written atomically, under a
lock, so two processes embedding the same set wait for one another instead of doing it twice. A damaged entry
(unreadable, or whose shapes or description do not match) is embedded again.

Usage::

    features = cached_features(encoder, test_images, data={"dataset": "cifar10", "split": "test"},
                               cache_dir="results/feature_cache", batch_size=64, device=device)
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cl2r_bench.data.datasets import ImageSet
from cl2r_bench.encoders import Encoder
from cl2r_bench.files import atomic_write, atomic_write_json, exclusive
from cl2r_bench.models import DEFAULT_AMP, autocast_dtype, forward_in_batches


@dataclass
class CachedFeatures:
    """Raw features (``n x d`` float32, as the encoder outputs them) and labels of one image set; ``cached`` says
    whether they came from the cache, ``seconds`` how long embedding took when they did not."""

    features: torch.Tensor
    labels: torch.Tensor
    cached: bool
    seconds: float


def cache_key(description: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:24]


def cached_features(encoder: Encoder, images: ImageSet, *, data: dict[str, Any], cache_dir: str | Path,
                    batch_size: int, device: torch.device | str = "cpu", amp: bool | str = DEFAULT_AMP,
                    progress: bool = True, log: Callable[[str], Any] = print) -> CachedFeatures:
    """The features of ``images`` under ``encoder``, from the cache or embedded now and cached (module docstring).

    ``data`` names the images for people (data set, split, selection); the key adds their digest."""
    device = torch.device(device)
    precision = str(autocast_dtype(amp, device) or "float32")
    description = json.loads(json.dumps({"encoder": encoder.describe(), "precision": precision,
                                         "data": {**data, "images": len(images), "sha256": images.digest()}}))
    path = Path(cache_dir) / f"{cache_key(description)}.pt"
    entry = read_entry(path, description)
    if entry is not None:
        return CachedFeatures(*entry, cached=True, seconds=0.0)
    with exclusive(path.with_suffix(".lock"), f"the feature cache entry {path}", wait=log):
        entry = read_entry(path, description)
        if entry is not None:
            return CachedFeatures(*entry, cached=True, seconds=0.0)
        started = time.perf_counter()
        features = embed_raw(encoder, images.images, device=device, batch_size=batch_size, amp=amp,
                             progress=progress, description=f"embed {data.get('dataset', '')} "
                             f"{data.get('split', '')} with {encoder.spec}")
        seconds = time.perf_counter() - started
        labels = images.labels.cpu()
        atomic_write(path, lambda f: torch.save({"description": description, "features": features,
                                                 "labels": labels}, f))
        atomic_write_json(path.with_suffix(".json"), {**description, "seconds": seconds,
                                                      "images_per_second": len(images) / max(seconds, 1e-9)})
    return CachedFeatures(features, labels, cached=False, seconds=seconds)


def read_entry(path: Path, description: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(features, labels)`` of a cache entry that matches ``description``, or None when it is absent or
    damaged (then it is embedded again)."""
    if not path.is_file():
        return None
    try:
        entry = torch.load(path, map_location="cpu", weights_only=True)
        features, labels = entry["features"], entry["labels"]
        ok = (entry["description"] == description and features.ndim == 2
              and len(features) == len(labels) == description["data"]["images"]
              and features.shape[1] == description["encoder"]["feature_dim"] and bool(torch.isfinite(features).all()))
    except Exception:  # noqa: BLE001 - a truncated or foreign file fails in torch's zip reader or its unpickler
        return None
    return (features, labels) if ok else None


def embed_raw(encoder: Encoder, images: torch.Tensor, *, device: torch.device, batch_size: int,
              amp: bool | str, progress: bool, description: str) -> torch.Tensor:
    """Raw (un-normalised) features of ``images`` on the CPU, embedded in batches on ``device`` through
    :func:`cl2r_bench.models.forward_in_batches` (eval mode, no gradient, autocast on a GPU), with a progress bar."""
    from tqdm import tqdm

    model = encoder.to(device)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    batches = forward_in_batches(model, images, batch_size=batch_size, amp=amp)
    chunks = [features.cpu() for _, features in tqdm(batches, total=math.ceil(len(images) / batch_size),
                                                       desc=description, disable=not progress, leave=False)]
    encoder.to("cpu")
    return torch.cat(chunks) if chunks else torch.zeros(0, encoder.feature_dim)
