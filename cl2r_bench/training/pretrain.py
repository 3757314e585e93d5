"""Replacement models made by the suite (METHODS.md §4, §8): ``python runner.py pretrain ...``.

IAM-CL2R replaces the model at some tasks by an *improved* pretrained one. The authors trained ResNet-18s from
scratch on 32x32 ImageNet with 100 / 300 / 600 classes; this suite trains them on a disjoint source with growing
class subsets (default Tiny ImageNet at 32x32), for the head family of the strategy (fixed d-Simplex or
learnable), with plain cross-entropy and SGD. Class i of a subset is trained on vertex 1023 - i, the stream's
rule. Each model is saved as a plain state dict without the learnable classifier and cached under a name
derived from every setting that shapes it, so later runs reuse it.

Two schedules (``replacement.pretrain.schedule``):

* ``cosine``: ``epochs`` epochs, cosine from ``lr`` to ``lr_min``.
* ``plateau`` ("trained until accuracy stops improving"): the learning rate is held; after every
  epoch the classification accuracy on the *test split of the pretraining classes* (never the stream's or the
  evaluation's images) is measured; when it has not improved by ``min_delta`` for ``patience`` epochs the rate
  is multiplied by ``decay``, and after ``drops`` decays the next plateau ends training (``epochs`` is the
  cap). The weights of the best epoch are kept. Progress is saved after every epoch (``<model>.partial.pt``),
  so an interrupted pretraining resumes where it stopped (from a re-seeded generator: close to, not
  bit-identical with, an uninterrupted one). The per-epoch history is written beside the model.
"""
from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from cl2r_bench.config import SPEED_OPTIONS
from cl2r_bench.data.datasets import DataSplits, ImageSet
from cl2r_bench.data.streams import first_per_class, relabel
from cl2r_bench.files import atomic_write, atomic_write_json, exclusive
from cl2r_bench.models import (
    CheckpointError,
    RetrievalModel,
    build_model,
    feature_extractor_state,
    forward_in_batches,
    load_replacement,
)
from cl2r_bench.strategy import Step, Strategy
from cl2r_bench.training.loop import train_task
from cl2r_bench.training_settings import PRETRAIN_FIXED, PlateauSettings, TrainSettings


def cache_path(cache_dir: str | Path, spec: dict[str, Any]) -> Path:
    """``<cache_dir>/<head>-<backbone>-<n>cls-<hash>.pt`` where the hash covers the whole ``spec``."""
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    return Path(cache_dir) / f"{spec['head']}-{spec['backbone']}-{len(spec['classes'])}cls-{digest}.pt"


@dataclass
class PlateauProgress:
    """Where a plateau pretraining stands; saved after every epoch."""

    lr: float
    epochs_done: int = 0
    best_accuracy: float = -1.0
    best_epoch: int = 0
    since_best: int = 0
    drops: int = 0
    finished: bool = False
    history: list[dict[str, float]] = field(default_factory=list)

    def update(self, accuracy: float, rule: PlateauSettings, max_epochs: int) -> bool:
        """Record one epoch's validation accuracy; returns whether it beat the best by more than ``min_delta``
        (the model then kept)."""
        self.epochs_done += 1
        self.history.append({"epoch": self.epochs_done, "lr": self.lr, "val_accuracy": accuracy})
        improved = accuracy > self.best_accuracy + rule.min_delta
        if improved:
            self.best_accuracy, self.best_epoch, self.since_best = accuracy, self.epochs_done, 0
        else:
            self.since_best += 1
        if self.since_best >= rule.patience and self.drops < rule.drops:
            self.lr, self.drops, self.since_best = self.lr * rule.decay, self.drops + 1, 0
        self.finished = self.should_stop(rule, max_epochs)
        return improved

    def should_stop(self, rule: PlateauSettings, max_epochs: int) -> bool:
        """At the cap, or on a plateau with no decay left."""
        return self.epochs_done >= max_epochs or (self.drops >= rule.drops and self.since_best >= rule.patience)


def classification_accuracy(model: RetrievalModel, images: ImageSet, *, amp: bool | str) -> float:
    """Top-1 accuracy of the model's own classifier on ``images`` (labels relabelled like training), run with
    the autocast setting ``amp`` (the training's)."""
    correct = 0
    targets = model.class_targets(images.labels.to(next(model.parameters()).device))
    start = 0
    for logits, _ in forward_in_batches(model, images.images, amp=amp):
        correct += int((logits.argmax(dim=1) == targets[start:start + len(logits)]).sum())
        start += len(logits)
    return correct / max(len(images), 1)


class PlateauTraining:
    """The :class:`cl2r_bench.training.engine.EpochHook` of the ``plateau`` schedule, saving progress to
    ``partial``; the validation runs with the training's autocast setting."""

    def __init__(self, model: RetrievalModel, validation: ImageSet, rule: PlateauSettings, settings: TrainSettings,
                 partial: Path, *, log=print) -> None:
        self.validation, self.rule, self.settings = validation, rule, settings
        self.partial, self.log = partial, log
        self.progress = PlateauProgress(lr=settings.lr)
        self.best_state = copy.deepcopy(model.state_dict())
        self.optimizer_state = None
        if partial.is_file():
            try:
                saved = torch.load(partial, map_location="cpu", weights_only=True)
                model.load_state_dict(saved["model"])
                self.best_state, self.optimizer_state = saved["best_model"], saved["optimizer"]
                self.progress = PlateauProgress(**saved["progress"])
            except Exception as exc:  # noqa: BLE001 - a damaged file fails in torch, pickle or the dataclass
                raise CheckpointError(f"the pretraining progress file {partial} is damaged ({type(exc).__name__}); "
                                      "delete it to pretrain this model from its first epoch") from None
            self.progress.finished = self.progress.should_stop(rule, settings.epochs)
            log(f"resuming pretraining from {partial} after epoch {self.progress.epochs_done}")

    @property
    def lr(self) -> float:
        return self.progress.lr

    @property
    def epochs_done(self) -> int:
        return self.progress.epochs_done

    def begin(self, optimizer: torch.optim.Optimizer) -> None:
        if self.optimizer_state is not None:
            optimizer.load_state_dict(self.optimizer_state)

    def after_epoch(self, model: RetrievalModel, optimizer: torch.optim.Optimizer) -> bool:
        accuracy = classification_accuracy(model, self.validation, amp=self.settings.autocast)
        lr = self.progress.lr
        if self.progress.update(accuracy, self.rule, self.settings.epochs):
            self.best_state = copy.deepcopy(model.state_dict())
        self.log(f"  epoch {self.progress.epochs_done}: lr {lr:.2g}, validation accuracy {accuracy:.4f} "
                 f"(best {self.progress.best_accuracy:.4f} at epoch {self.progress.best_epoch})")
        save_state({"model": model.state_dict(), "best_model": self.best_state, "optimizer": optimizer.state_dict(),
                    "progress": asdict(self.progress)}, self.partial)
        return not self.progress.finished


def pretrain_model(data: DataSplits, classes: list[int], *, head: str, model_kwargs: dict[str, Any],
                   settings: TrainSettings, images_per_class: int | None, device: torch.device,
                   seed: int, plateau: PlateauSettings | None = None, partial: Path | None = None,
                   log=print) -> tuple[RetrievalModel, dict[str, Any]]:
    """Train a fresh model with cross-entropy on ``classes`` of ``data`` (relabelled 0..n-1); returns the
    model and a training log (the per-epoch validation history under the ``plateau`` schedule). The model
    normalises with ``data``'s statistics while it pretrains; a run that loads it builds its own model with the
    stream's (the statistics are not part of the checkpoint)."""
    torch.manual_seed(seed)
    subset = relabel(first_per_class(data.train, classes, images_per_class), classes)
    subset.images, subset.labels = subset.images.to(device), subset.labels.to(device)
    model = build_model(head=head, num_classes=len(classes), **model_kwargs, **feature_input(data), mean=data.mean,
                        std=data.std, input_size=int(data.train.images.shape[-1])).to(device)
    strategy = CrossEntropy(None)
    description = f"pretrain {head} on {len(classes)} classes"
    if plateau is None:
        train_task(model, strategy, subset, None, settings, description=description)
        return model, {"schedule": "cosine", "epochs": settings.epochs}
    validation = relabel(first_per_class(data.test, classes, None), classes)
    hook = PlateauTraining(model, validation, plateau, settings, partial, log=log)
    if not hook.progress.finished:
        torch.manual_seed(seed + hook.epochs_done)
        train_task(model, strategy, subset, None, settings, description=description, epoch_hook=hook)
    model.load_state_dict(hook.best_state)
    return model, {"schedule": "plateau", **asdict(hook.progress), "validation_images": len(validation)}


def feature_input(data: DataSplits) -> dict[str, int]:
    """The input width of a model pretrained on ``data`` whose items are one frozen encoder's features (the
    pretrained-backbone track's ``feature_dim``); nothing for images."""
    return {} if data.train.are_images else {"feature_dim": int(data.train.images.shape[1])}


class CrossEntropy(Strategy):
    """The pretraining objective: cross-entropy on the model's own classifier, nothing else (METHODS.md §4). Not
    registered: the suite's own objective, not a strategy a run can name."""

    def loss(self, step: Step) -> torch.Tensor:
        return F.cross_entropy(step.logits, step.targets)


def save_state(state: dict[str, torch.Tensor], path: Path) -> None:
    """``torch.save`` atomically (:func:`cl2r_bench.files.atomic_write`): a crash never leaves a half-written
    checkpoint."""
    atomic_write(path, lambda f: torch.save(state, f))


def pretrained_replacement(data: DataSplits, classes: list[int], *, head: str, model_kwargs: dict[str, Any],
                           settings: TrainSettings, images_per_class: int | None, device: torch.device, seed: int,
                           cache_dir: str | Path, keep_classifier: bool = False,
                           plateau: PlateauSettings | None = None, log=print) -> tuple[Path, bool]:
    """The cached checkpoint for this spec, trained first if absent; returns ``(path, was_cached)``.

    ``keep_classifier`` saves the whole model, classifier included (the model_update scenario's models).
    ``plateau`` selects the plateau schedule (module docstring); ``None`` is the cosine schedule. The spec and
    the training log are written to ``<model>.json``."""
    spec = {"dataset": data.name, "data_sha256": [data.train.digest(), data.test.digest()], "classes": classes,
            "head": head, **model_kwargs,
            "settings": {k: v for k, v in settings.__dict__.items()
                         if f"training.{k}" not in SPEED_OPTIONS and k not in PRETRAIN_FIXED} | {"progress": None},
            "images_per_class": images_per_class,
            "seed": seed, "image_size": int(data.train.images.shape[-1])}
    if not data.train.are_images:
        spec["encoder"] = next(iter(data.feature_columns))
    if keep_classifier:
        spec["classifier"] = True
    if plateau is not None:
        spec["plateau"] = asdict(plateau)
    path = cache_path(cache_dir, spec)
    if path.is_file():
        return path, True
    with exclusive(path.with_suffix(".lock"), f"the pretraining of {path}", wait=log):
        if path.is_file():
            return path, True
        partial = path.with_suffix(".partial.pt")
        model, training = pretrain_model(data, classes, head=head, model_kwargs=model_kwargs, settings=settings,
                                         images_per_class=images_per_class, device=device, seed=seed,
                                         plateau=plateau, partial=partial, log=log)
        atomic_write_json(path.with_suffix(".json"), {**spec, "training": training})
        save_state(model.state_dict() if keep_classifier else feature_extractor_state(model), path)
        partial.unlink(missing_ok=True)
    return path, False


MODEL_SPEC_KEYS = ("backbone", "simplex_vertices_count", "small_width", "small_out_dim")


def load_cached_model(path: str | Path, *, mean: Sequence[float], std: Sequence[float]
                      ) -> tuple[RetrievalModel, dict[str, Any]]:
    """A model cached by :func:`pretrained_replacement` (in eval mode, without its classifier unless it was kept)
    and its spec, rebuilt from the ``<model>.json`` beside it, normalising with the statistics ``mean`` / ``std``
    of the data it will embed (as :func:`cl2r_bench.models.build_model`)."""
    spec = json.loads(Path(path).with_suffix(".json").read_text())
    track = {"embedding_width": spec["embedding_width"], "embedding_dim": spec["embedding_dim"],
             "feature_dim": spec["image_size"]} if spec["backbone"] == "frozen_encoder" else {}
    model = build_model(head=spec["head"], num_classes=len(spec["classes"]),
                        **{key: spec[key] for key in MODEL_SPEC_KEYS}, **track, mean=mean, std=std,
                        input_size=spec.get("image_size", 32))
    load_replacement(model, path)
    return model.eval(), spec
