"""Upgrade: the BCT line's two-model protocol (docs/METHODS.md §6c). An old model trained on the first
``stream.initial_classes`` classes, then a new model trained from scratch by the strategy on every class, old and
new, with the old model as its teacher.

The setting of BCT (Shen et al. 2020), LCE, UniBCT, RACT, AdvBCT and BT² (CIFAR-100 50 → 100 classes in BT² and
ml-fct; here also Tiny ImageNet 100 → 200). Task 0's model is the old model: the suite pretrains it with
cross-entropy on the first classes (``replacement.pretrain`` settings, the head family of the strategy, classifier
kept so that BCT's influence loss and LwF read it; the first ``replacement.pretrain.seed``), caches it and shares it
with every strategy and seed, and no strategy trains it. Task 1's model starts from a fresh initialisation (the
task's seed) and the strategy trains it on the training images of all ``initial_classes + increment`` classes
(``training`` settings), with the old model as the teacher (``teacher_classes`` = the old classes). The replay
memory stays empty: the new training set holds the old classes. ``--strategy er`` (plain cross-entropy here) is the
papers' "independent" new model.

Measured: the per-task matrix on ``evaluation.dataset`` (by default ``stream``: the classes' test images against the
stream's training images of them), and after the last task the papers' protocol (:meth:`Upgrade.finish`): the test
split of every class is query and gallery, each query's own image left out, CMC top-1 / top-5 and mAP of old/old,
new/old and new/new (:mod:`benchmarks.adapted_cases`), with the negative flips of both upgrades, in the record's
``two_model``.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.adapted_cases import PairedFeatures, Scoring, StudySplit, measure
from benchmarks.flips import classification_flips
from cl2r_bench.data.datasets import ImageSet
from cl2r_bench.data.streams import Stream, Task, experience_images, single_experience
from cl2r_bench.errors import ConfigError
from cl2r_bench.models import RetrievalModel, load_state, replacement_family
from cl2r_bench.scenario import (
    Finished,
    Scenario,
    check_class_budget,
    register_scenario,
    stream_from_settings,
)
from cl2r_bench.settings import RunSettings
from cl2r_bench.training.pretrain import pretrained_replacement

TWO_MODEL_CASES = ("old/old", "new/old", "new/new")


def classified_correctly(model: RetrievalModel, predicted: torch.Tensor, labels: torch.Tensor) -> np.ndarray:
    """Whether ``model``'s classifier put each image's class first (``predicted``: its top outputs; the old model's
    classifier knows the old classes only, so it misses every new-class image)."""
    return (predicted == model.class_targets(labels.to(predicted.device))).cpu().numpy()


def test_split(stream: Stream) -> ImageSet:
    """The test items of every stream class, in the order the two-model protocol ranks them (task by task)."""
    test = [experience_images(exp) for exp in stream.benchmark.test_stream]
    return ImageSet(torch.cat([t.images for t in test]), torch.cat([t.labels for t in test]))


def two_model_study(old_features: torch.Tensor, new_features: torch.Tensor, labels: torch.Tensor,
                    settings: RunSettings) -> dict[str, Any]:
    """The papers' leave-one-out protocol on the test split (module docstring): ``old_features`` and
    ``new_features`` the two models' L2-normalised features of the same items (a new model wider than the old one
    meets the old gallery with its first dimensions), scored as ``settings.model_update`` says
    (:func:`benchmarks.adapted_cases.measure`). :meth:`Upgrade.finish` measures a run's models with it, and the
    track's end-to-end parity (``tools/parity/track.py``) the authors' models."""
    split = StudySplit(PairedFeatures(old_features, new_features, labels), scoring=Scoring.of(settings.model_update),
                       old_frame_prefix=True)
    with torch.no_grad():
        return measure(split, None, orders=[], steps=1, seed=settings.seed)


@register_scenario("upgrade")
class Upgrade(Scenario):
    """The BCT line's protocol: an old model on the first classes, a new one trained by the strategy on all."""

    def check_settings(self) -> None:
        settings = self.settings
        if settings.stream.num_tasks != 2:
            raise ConfigError(f"upgrade needs stream.num_tasks = 2 (the old classes, then all of them), not "
                              f"{settings.stream.num_tasks}")
        if settings.replacement.tasks:
            raise ConfigError(f"replacement.tasks = {settings.replacement.tasks}: upgrade pretrains its old model "
                              "itself; set replacement.tasks=[]")
        check_class_budget(settings, pretrains_replacements=False)

    def stream(self) -> Stream:
        """The two tasks, task 1 carrying the training images of every class (old and new)."""
        stream = stream_from_settings(self.settings, [], self.read_data)
        old, new = stream.tasks
        both = ImageSet(torch.cat([old.train.images, new.train.images]), torch.cat([old.train.labels,
                                                                                    new.train.labels]))
        stream.tasks = [old, Task(1, new.new_classes, new.num_seen_classes, both, single_experience(both))]
        return stream

    def trains_task(self, task: int) -> bool:
        """The strategy trains the new model only; the old one is pretrained."""
        return task == 1

    def starts_from_scratch(self, task: int) -> bool:
        return task == 1

    def starting_models(self, stream: Stream, head: str, device: torch.device,
                        log: Callable[[str], None]) -> list[dict[str, Any]]:
        """The old model: pretrained on the stream's first classes, classifier kept, cached."""
        classes = stream.class_order[:len(stream.tasks[0].new_classes)]
        path, cached = self._pretrained(classes, replacement_family(head), 0, device, log)
        log(f"old model on {len(classes)} classes: {path} ({'cached' if cached else 'trained now'})")
        return [{"task": 0, "path": str(path.resolve()), "source": "cached" if cached else "pretrained",
                 "classes": len(classes), "family": replacement_family(head), **self.encoder_entry(0)}]

    def independent_models(self, stream: Stream, starting: list[dict[str, Any]], device: torch.device,
                           log: Callable[[str], None]) -> dict[int, str]:
        """The papers' independent new model (BT²'s target): a learnable model trained with cross-entropy on
        every class by the old model's recipe (``replacement.pretrain``, as the authors' ``train_backbone.py``
        trains both), cached and shared like the old model."""
        classes = stream.class_order[:stream.tasks[1].num_seen_classes]
        path, cached = self._pretrained(classes, "learnable", 1, device, log)
        log(f"independent new model on {len(classes)} classes: {path} "
            f"({'cached' if cached else 'trained now'})")
        return {1: str(path.resolve())}

    def _pretrained(self, classes: list[int], head: str, task: int, device: torch.device,
                    log: Callable[[str], None]) -> tuple[Path, bool]:
        """The cached model of ``head`` trained on ``classes`` by ``replacement.pretrain``, classifier kept, on the
        data as task ``task``'s model reads them (on the pretrained-backbone track, its encoder's features)."""
        settings = self.settings
        pre = settings.replacement.pretrain
        return pretrained_replacement(
            self.read_data(settings.dataset, self.model_encoder(task)), classes, head=head,
            model_kwargs=settings.model.build_kwargs,
            settings=pre.train_settings(settings.training), images_per_class=settings.stream.images_per_class,
            device=device, seed=pre.seeds(1)[0], cache_dir=pre.cache_dir, keep_classifier=True, plateau=pre.plateau,
            log=log)

    def load_starting_model(self, model: RetrievalModel, path: str) -> None:
        """The whole old model, classifier included (BCT's influence loss, LwF and LCE read it)."""
        load_state(model, path)

    def finish(self, finished: Finished) -> dict[str, Any]:
        """The papers' leave-one-out protocol on the test split of every stream class (module docstring), and the
        classifiers' negative flips on the same images, as the record's ``two_model``
        (:class:`benchmarks.record.TwoModel`)."""
        old, new = finished.outgoing, finished.model
        test = test_split(finished.stream)
        images, labels = test.images, test.labels.to(test.images.device)
        (old_features, old_predicted), (new_features, new_predicted) = (
            finished.embed_and_classify(model, images) for model in (old, new))
        study = two_model_study(old_features, new_features, labels, self.settings)
        cases = {case: study["cases"][case] for case in TWO_MODEL_CASES}
        correct = [classified_correctly(old, old_predicted, labels), classified_correctly(new, new_predicted, labels)]
        return {"two_model": {"cases": cases, "negative_flips": study["negative_flips"],
                              "classification": classification_flips(*correct),
                              "query_top1": study["query_top1"],
                              "cmc": {case: study["cmc"][case] for case in TWO_MODEL_CASES},
                              **{key: study[key] for key in ("queries", "queries_without_match",
                                                             "unmatched_queries")}}}
