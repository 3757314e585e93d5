"""A cache of encoder features on disk (docs/METHODS.md §7b): each image set is embedded once per encoder, and
every adapter and seed of a study reuses it.

A cache entry is keyed by what the features depend on: the encoder (its spec, the sha256 of its weights and its
preprocessing, :meth:`cl2r_bench.encoders.Encoder.describe`), the data (its name, split, and the sha256 of the
images and labels actually embedded, so a subset or another copy of the data never hits a wrong entry) and the
precision (``amp`` on a GPU). The entry ``<cache_dir>/<key>.pt`` holds the pooled pre-logits features (float32,
not normalised) and labels, next to ``<key>.json`` saying what made it; both are written atomically, under a
lock, so two processes embedding the same set wait for one another instead of doing it twice. A damaged entry
(unreadable, or whose shapes or description do not match) is embedded again.

**Embedding in shards** (:class:`Sharding`; ``runner.py embed``, docs/scale-out.md): a split is cut into
``shards`` contiguous pieces, each written as ``<key>.shard-<i>-of-<k>.pt`` when done. Any number of processes
(torchrun ranks on one machine, SLURM array tasks on many) work on one split: each takes its own shards first
(``worker``, ``worker + workers``, ...), then any shard nobody holds, each under the shard's lock
(:func:`cl2r_bench.files.exclusive`, which a dead holder's lock does not outlive), and waits for the shards others
hold. When every shard is on disk, the first process to take the entry's lock joins them into the one entry and
removes the shard files; the others read it. A killed process loses only the shard it was embedding: its lock goes
stale and the shard is embedded again, by whoever runs next; the finished shards are kept.

Usage::

    features = cached_features(encoder, test_images, data={"dataset": "cifar10", "split": "test"},
                               cache_dir="results/feature_cache", batch_size=64, device=device)
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cl2r_bench.data.datasets import DataSplits, ImageSet
from cl2r_bench.data.streams import first_rows
from cl2r_bench.encoders import Encoder
from cl2r_bench.files import POLL_SECONDS, FolderBusyError, atomic_write, atomic_write_json, exclusive
from cl2r_bench.models import DEFAULT_AMP, autocast_dtype, forward_in_batches


@dataclass(frozen=True)
class Sharding:
    """How a split is embedded: in ``shards`` pieces, by ``workers`` processes of which this is ``worker``
    (module docstring). One shard is the whole split, in one piece."""

    shards: int = 1
    worker: int = 0
    workers: int = 1

    def __post_init__(self) -> None:
        if self.shards < 1 or self.workers < 1 or not 0 <= self.worker < self.workers:
            raise ValueError(f"sharding needs shards >= 1 and 0 <= worker < workers, not {self}")

    def order(self) -> list[int]:
        """The shards this worker takes first (its own), then the others."""
        own = list(range(self.worker % self.shards, self.shards, self.workers))
        return own + [shard for shard in range(self.shards) if shard not in own]


ONE_PIECE = Sharding()
"""The whole split embedded by this one process."""


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
                    progress: bool = True, log: Callable[[str], Any] = print,
                    sharding: Sharding = ONE_PIECE, digest: str | None = None) -> CachedFeatures:
    """The features of ``images`` under ``encoder``, from the cache or embedded now and cached (module docstring).

    ``data`` names the images for people (data set, split, selection); the key adds their digest (``digest``, when
    the caller has it already: :meth:`ImageSet.digest` of ``images``). ``sharding``: this process's part in
    embedding the split in shards."""
    device = torch.device(device)
    path, description = entry_path(encoder, images, data=data, cache_dir=cache_dir, device=device, amp=amp,
                                   digest=digest)
    entry = read_entry(path, description)
    if entry is not None:
        return CachedFeatures(*entry, cached=True, seconds=0.0)
    if sharding.shards > 1:
        return in_shards(encoder, images, path, description, sharding, batch_size=batch_size, device=device, amp=amp,
                         progress=progress, log=log)
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


def entry_path(encoder: Encoder, images: ImageSet, *, data: dict[str, Any], cache_dir: str | Path,
               device: torch.device, amp: bool | str, digest: str | None = None) -> tuple[Path, dict[str, Any]]:
    """``(path, description)`` of the cache entry of ``images`` under ``encoder`` (:func:`cached_features`)."""
    precision = str(autocast_dtype(amp, device) or "float32")
    description = json.loads(json.dumps({"encoder": encoder.describe(), "precision": precision,
                                         "data": {**data, "images": len(images),
                                                  "sha256": digest or images.digest()}}))
    return Path(cache_dir) / f"{cache_key(description)}.pt", description


def whole_split(data: DataSplits, split: str, encoders: Sequence[Encoder], *, cache_dir: str | Path,
                device: torch.device, amp: bool | str) -> list[torch.Tensor] | None:
    """Each encoder's features of every item of ``split``, when the cache holds them all (else None): a selection
    of the split is then read from them instead of being embedded again."""
    images = getattr(data, split)
    wanted = {"dataset": data.name, "split": split, "per_class": None, "images": len(images)}
    if not all(described(cache_dir, encoder, wanted) for encoder in encoders):
        return None
    digest = images.digest()
    found = []
    for encoder in encoders:
        entry = read_entry(*entry_path(encoder, images, data={"dataset": data.name, "split": split, "per_class": None},
                                       cache_dir=cache_dir, device=device, amp=amp, digest=digest))
        if entry is None:
            return None
        found.append(entry[0])
    return found


def described(cache_dir: str | Path, encoder: Encoder, data: dict[str, Any]) -> bool:
    """Whether some entry's description (its ``.json``) names ``encoder``'s weights and ``data``: a look that costs no
    digest of the images (:func:`whole_split` checks the entry itself only then)."""
    for about in Path(cache_dir).glob("*.json"):
        try:
            found = json.loads(about.read_text())
            if (found["encoder"]["weights_sha256"] == encoder.weights_sha256
                    and all(found["data"].get(key) == value for key, value in data.items())):
                return True
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return False


def feature_splits(data: DataSplits, encoders: Sequence[Encoder], per_class: Mapping[str, int | None], *,
                   cache_dir: str | Path, batch_size: int, device: torch.device | str = "cpu",
                   amp: bool | str = DEFAULT_AMP, progress: bool = True, log: Callable[[str], Any] = print,
                   sharding: Sharding = ONE_PIECE) -> DataSplits:
    """``data`` as its encoders see it (the pretrained-backbone track, docs/METHODS.md §4b): each split cut to the
    first ``per_class[split]`` items of every class (all of them for None), each item's image replaced by the
    concatenation of its raw features under ``encoders`` in turn (``N x sum of feature_dim``, float32; the
    ``feature_columns`` of each encoder's spec say where its features are). Each split is
    embedded once per encoder and cached (:func:`cached_features`), whatever the class order or seed of the run that
    reads it; a later selection of at most ``per_class[split]`` items per class in data set order picks the same
    items (:func:`cl2r_bench.data.streams.first_per_class`). A selection whose whole split is cached under every
    encoder is read from those entries (:func:`whole_split`), not embedded again."""
    device = torch.device(device)
    splits = {}
    for split in ("train", "test"):
        rows = first_rows(getattr(data, split).labels, list(range(data.num_classes)), per_class[split])
        chosen = getattr(data, split).select(rows)
        whole = None if per_class[split] is None else whole_split(data, split, encoders, cache_dir=cache_dir,
                                                                   device=device, amp=amp)
        if whole is not None:
            features = [every[rows] for every in whole]
        else:
            digest = chosen.digest()
            features = [cached_features(encoder, chosen, data={"dataset": data.name, "split": split,
                                                               "per_class": per_class[split]},
                                        cache_dir=cache_dir, batch_size=batch_size, device=device, amp=amp,
                                        progress=progress, log=log, sharding=sharding, digest=digest).features
                        for encoder in encoders]
        splits[split] = ImageSet(torch.cat(features, dim=1), chosen.labels)
    ends = list(itertools.accumulate(encoder.feature_dim for encoder in encoders))
    columns = {encoder.spec: (end - encoder.feature_dim, end) for encoder, end in zip(encoders, ends, strict=True)}
    return DataSplits(data.name, splits["train"], splits["test"], data.class_names, data.mean, data.std, columns)


def in_shards(encoder: Encoder, images: ImageSet, path: Path, description: dict[str, Any], sharding: Sharding, *,
              batch_size: int, device: torch.device, amp: bool | str, progress: bool,
              log: Callable[[str], Any]) -> CachedFeatures:
    """Embed the shards nobody holds, wait for the others, join them into the entry (module docstring)."""
    bounds = [round(i * len(images) / sharding.shards) for i in range(sharding.shards + 1)]

    def finished(shard: int) -> torch.Tensor | None:
        return read_shard(path, shard, sharding.shards, description, bounds[shard + 1] - bounds[shard])

    def joined() -> tuple[torch.Tensor, torch.Tensor] | None:
        return read_entry(path, description) if path.is_file() else None

    embedded, seconds, said = 0, 0.0, False
    while (entry := joined()) is None:
        missing = [i for i in sharding.order() if finished(i) is None]
        if not missing:
            entry = join_shards(path, description, images, sharding.shards, finished, log)
            break
        progressed = False
        for shard in missing:
            shard_path = shard_file(path, shard, sharding.shards)
            try:
                with exclusive(shard_path.with_suffix(".lock"), f"shard {shard} of {path}"):
                    if finished(shard) is not None or joined() is not None:
                        continue
                    started = time.perf_counter()
                    features = embed_raw(encoder, images.images[bounds[shard]:bounds[shard + 1]], device=device,
                                         batch_size=batch_size, amp=amp, progress=progress,
                                         description=f"embed shard {shard + 1}/{sharding.shards} with {encoder.spec}")
                    atomic_write(shard_path, lambda f, x=features, i=shard: torch.save(
                        {"description": description, "shard": [i, sharding.shards], "features": x}, f))
                    seconds += time.perf_counter() - started
                    embedded, progressed = embedded + 1, True
            except FolderBusyError:
                continue
        if not progressed:
            if not said:
                log(f"waiting for shards {missing} of {path}, which other processes are embedding")
                said = True
            time.sleep(POLL_SECONDS)
    log(f"{path.name}: {embedded} of {sharding.shards} shards embedded here" + (f" in {seconds:.1f}s" if embedded
                                                                                 else ""))
    return CachedFeatures(*entry, cached=embedded == 0, seconds=seconds)


def join_shards(path: Path, description: dict[str, Any], images: ImageSet, shards: int,
                finished: Callable[[int], torch.Tensor | None],
                log: Callable[[str], Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """The entry made of the finished shards, written by the first process to take the entry's lock (the others
    read it), the shard files removed after it is written."""
    with exclusive(path.with_suffix(".lock"), f"the feature cache entry {path}", wait=log):
        entry = read_entry(path, description)
        if entry is None:
            features = torch.cat([finished(i) for i in range(shards)])
            labels = images.labels.cpu()
            atomic_write(path, lambda f: torch.save({"description": description, "features": features,
                                                     "labels": labels}, f))
            atomic_write_json(path.with_suffix(".json"), {**description, "shards": shards})
            entry = (features, labels)
        for shard in range(shards):
            shard_file(path, shard, shards).unlink(missing_ok=True)
    return entry


def shard_file(path: Path, shard: int, shards: int) -> Path:
    return path.with_name(f"{path.stem}.shard-{shard}-of-{shards}.pt")


def read_shard(path: Path, shard: int, shards: int, description: dict[str, Any], rows: int) -> torch.Tensor | None:
    """The ``rows`` features of a finished shard of the entry ``path``, or None when it is absent or damaged."""
    shard_path = shard_file(path, shard, shards)
    if not shard_path.is_file():
        return None
    try:
        saved = torch.load(shard_path, map_location="cpu", weights_only=True)
        features = saved["features"]
        ok = (saved["description"] == description and saved["shard"] == [shard, shards] and features.ndim == 2
              and len(features) == rows and features.shape[1] == description["encoder"]["feature_dim"]
              and bool(torch.isfinite(features).all()))
    except Exception:  # noqa: BLE001 - a truncated or foreign file fails in torch's zip reader or its unpickler
        return None
    return features if ok else None


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
    :func:`cl2r_bench.models.forward_in_batches` (eval mode, no gradient, autocast on a GPU), with a progress bar.
    The encoder runs in the channels-last memory format on every device: on 2 CPU cores it embeds 1.8x as many
    images a second as in the default format (EfficientNet-Lite0, 22.7 -> 40.9 images/s, features equal within
    1e-5), and on a GPU it is the format its convolutions prefer."""
    from tqdm import tqdm

    model = encoder.to(device).to(memory_format=torch.channels_last)
    batches = forward_in_batches(model, images, batch_size=batch_size, amp=amp)
    chunks = [features.cpu() for _, features in tqdm(batches, total=math.ceil(len(images) / batch_size),
                                                       desc=description, disable=not progress, leave=False)]
    encoder.to("cpu").to(memory_format=torch.contiguous_format)
    return torch.cat(chunks) if chunks else torch.zeros(0, encoder.feature_dim)
