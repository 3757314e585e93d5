"""Replacement models made by the suite (METHODS.md §4, §8): ``python runner.py pretrain ...``.

IAM-CL2R replaces the model at some tasks by an *improved* pretrained one. The authors trained ResNet-18s from
scratch on 32x32 ImageNet with 100 / 300 / 600 classes; this suite trains them on a disjoint source with growing
class subsets (default Tiny ImageNet at 32x32), for the head family of the strategy (fixed d-Simplex or
learnable), with plain cross-entropy, SGD and a cosine schedule. Class i of a subset is trained on vertex
1023 - i, the stream's rule. Each model is saved as a plain state dict without the learnable classifier and
cached under a name derived from every setting that shapes it, so later runs reuse it.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from models import RetrievalModel, build_model, feature_extractor_state
from scenarios.datasets import DataSplits
from scenarios.streams import first_per_class, relabel

from .base import Strategy
from .er import ExperienceReplay
from .trainer import TrainSettings, train_task


def cache_path(cache_dir: str | Path, spec: dict[str, Any]) -> Path:
    """``<cache_dir>/<head>-<backbone>-<n>cls-<hash>.pt`` where the hash covers the whole ``spec``."""
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    return Path(cache_dir) / f"{spec['head']}-{spec['backbone']}-{len(spec['classes'])}cls-{digest}.pt"


def pretrain_model(data: DataSplits, classes: list[int], *, head: str, model_kwargs: dict[str, Any],
                   settings: TrainSettings, images_per_class: int | None, device: torch.device,
                   seed: int) -> RetrievalModel:
    """Train a fresh model with cross-entropy on ``classes`` of ``data`` (relabelled 0..n-1)."""
    torch.manual_seed(seed)
    subset = relabel(first_per_class(data.train, classes, images_per_class), classes)
    subset.images, subset.labels = subset.images.to(device), subset.labels.to(device)
    model = build_model(head=head, num_classes=len(classes), **model_kwargs).to(device)
    strategy: Strategy = ExperienceReplay(None)
    train_task(model, strategy, subset, None, settings, mean=data.mean, std=data.std,
               description=f"pretrain {head} on {len(classes)} classes")
    return model


def save_state(state: dict[str, torch.Tensor], path: Path) -> None:
    """``torch.save`` to a temporary file, then rename: a crash never leaves a half-written checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def pretrained_replacement(data: DataSplits, classes: list[int], *, head: str, model_kwargs: dict[str, Any],
                           settings: TrainSettings, images_per_class: int | None, device: torch.device, seed: int,
                           cache_dir: str | Path, keep_classifier: bool = False) -> tuple[Path, bool]:
    """The cached checkpoint for this spec, trained first if absent; returns ``(path, was_cached)``.

    ``keep_classifier`` saves the whole model, classifier included (the model_update scenario's models)."""
    spec = {"dataset": data.name, "classes": classes, "head": head, **model_kwargs,
            "settings": settings.__dict__ | {"progress": None}, "images_per_class": images_per_class,
            "seed": seed, "image_size": int(data.train.images.shape[-1])}
    if keep_classifier:
        spec["classifier"] = True
    path = cache_path(cache_dir, spec)
    if path.is_file():
        return path, True
    model = pretrain_model(data, classes, head=head, model_kwargs=model_kwargs, settings=settings,
                           images_per_class=images_per_class, device=device, seed=seed)
    save_state(model.state_dict() if keep_classifier else feature_extractor_state(model), path)
    path.with_suffix(".json").write_text(json.dumps(spec, indent=1))
    return path, False
