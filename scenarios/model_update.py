"""Model update: one old and one new model, both trained from scratch, bridged by an adapter (docs/METHODS.md §7-§8).

The λ-orthogonal and FCT papers' setting. Task 0's model is trained with cross-entropy on the first
``stream.initial_classes`` stream classes, task 1's on all ``initial_classes + increment`` classes, both with the
``replacement.pretrain`` settings and the ``model_update.head`` family, and cached like replacement models (every
adapter and seed of a study shares them; the run seed drives the adapter's fit and the random backfilling order).
No strategy fine-tunes them. The adapter is fitted at task 1 on every stream training image embedded by both
models; the run's 2x2 matrix ``[[old/old], [cross, new/new]]`` has the cross entry ``B/old`` for an adapter with a
backward map, ``new/F`` for a forward-only one and ``new/old`` without adapter. The record adds the adapter study
of the stream's query set against its gallery (``protocol: stream``, ``retrieval``: the cases, the per-query hits
and the partial backfilling curves of :mod:`benchmarks.adapted_cases`, in the layout of the leave-one-out records).

With encoder specs (``model_update.old`` / ``model_update.new``: timm, torchvision or the suite's own models,
:mod:`cl2r_bench.encoders`) the two models are pretrained encoders and, by default (``model_update.protocol``), the
adapter papers' own protocol measures them (docs/METHODS.md §7b): the adapter is fitted on the data set's train
split and the test split is query and gallery, each query's own image left out; CMC top-1 / top-5 and mAP of the nine
cases, backfilling AUCs and zero-shot retention (:mod:`cl2r_bench.adapter_study`, :mod:`benchmarks.adapted_cases`). No
stream runs: each split is embedded once per encoder into the feature cache, shared by every adapter and seed.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from benchmarks.adapted_cases import PairedFeatures, Scoring, StudySplit, measure
from cl2r_bench.adapter_study import Study, encoder_study, study_matrix
from cl2r_bench.data.datasets import ImageSet
from cl2r_bench.data.streams import Stream
from cl2r_bench.encoders import check_spec
from cl2r_bench.errors import ConfigError
from cl2r_bench.models import RetrievalModel, load_state
from cl2r_bench.scenario import (
    Finished,
    Scenario,
    ScenarioError,
    check_class_budget,
    register_scenario,
    stream_from_settings,
)
from cl2r_bench.setting_rules import int_list
from cl2r_bench.training.pretrain import pretrained_replacement


@register_scenario("model_update")
class ModelUpdate(Scenario):
    """An old and a new model trained from scratch, bridged by a post-hoc adapter."""

    trains = False
    scores_starting_models = False

    def check_settings(self) -> None:
        """Two models: encoder specs that exist in their library (nothing is built or downloaded here), or two
        models the suite pretrains on the stream's 2 tasks (old classes, then the new ones)."""
        settings = self.settings
        seed = settings.replacement.pretrain.seed
        if isinstance(seed, list) and (not int_list(seed) or len(seed) < 2):
            raise ConfigError(f"replacement.pretrain.seed = {seed!r}: give one int, or a list of 2 ints (the old and "
                              "the new model)")
        for spec in (settings.model_update.old, settings.model_update.new):
            if spec:
                check_spec(spec)
        if settings.model_update.leave_one_out:
            return
        if settings.stream.num_tasks != 2:
            raise ConfigError(f"model_update needs stream.num_tasks = 2 (old classes, then the new ones), not "
                              f"{settings.stream.num_tasks}")
        check_class_budget(settings, pretrains_replacements=False)

    def label(self) -> str:
        """``adapter.label`` when set, else the adapter's name (``none`` without adapter), then ``.<variant>`` when
        ``variant`` names the run."""
        variant = f".{self.settings.variant}" if self.settings.variant else ""
        return (self.settings.adapter.label or self.settings.adapter.name) + variant

    def stream(self) -> Stream:
        return stream_from_settings(self.settings, [], self.read_data)

    def model_generation(self, task: int) -> int:
        """The old model is the first generation, the new one the second (each on its own encoder on the
        pretrained-backbone track)."""
        return task

    def head(self, strategy_head: str) -> str:
        return self.settings.model_update.head

    def starting_models(self, stream: Stream, head: str, device: torch.device,
                        log: Callable[[str], None]) -> list[dict[str, Any]]:
        """The old model (task 0) and the new one (task 1), pretrained on the stream's own classes."""
        settings = self.settings
        pre = settings.replacement.pretrain
        counts = [len(t.new_classes) for t in stream.tasks]
        out = []
        for task, seed in zip(range(2), pre.seeds(2), strict=True):
            classes = stream.class_order[:sum(counts[:task + 1])]
            path, cached = pretrained_replacement(
                self.read_data(settings.dataset, self.model_encoder(task)), classes, head=head,
                model_kwargs=settings.model.build_kwargs,
                settings=pre.train_settings(settings.training),
                images_per_class=settings.stream.images_per_class, device=device, seed=seed, cache_dir=pre.cache_dir,
                keep_classifier=True, plateau=pre.plateau, log=log)
            log(f"model on {len(classes)} classes: {path} ({'cached' if cached else 'trained now'})")
            out.append({"task": task, "path": str(path.resolve()), "source": "cached" if cached else "pretrained",
                        "classes": len(classes), "family": head, **self.encoder_entry(task)})
        return out

    def load_starting_model(self, model: RetrievalModel, path: str) -> None:
        """The whole model, classifier included (FastFill's loss reads the new model's classifier)."""
        load_state(model, path)

    def adapts_at(self, task: int, starts_fresh: bool) -> bool:
        return self.settings.adapter.used and task == 1

    def adapter_data(self, stream: Stream, task: int, memory: ImageSet | None) -> ImageSet:
        """Every stream training image (the new model's training set)."""
        return ImageSet(torch.cat([t.train.images for t in stream.tasks]),
                        torch.cat([t.train.labels for t in stream.tasks]))

    def adapter_seed(self, task: int) -> int:
        return self.settings.seed

    def measures_features(self) -> bool:
        """Encoder specs are measured by the leave-one-out protocol (``model_update.protocol``)."""
        return self.settings.model_update.leave_one_out

    def feature_study(self, device: torch.device, log: Callable[[str], None]) -> Study:
        return encoder_study(self.settings, device, log)

    def finish(self, finished: Finished) -> dict[str, Any]:
        """The adapter study of the old and the new model on the stream's query set and gallery (module
        docstring), with the 2x2 matrix of its top-1 cases."""
        old, new, stream = finished.outgoing, finished.model, finished.stream

        def features(images: ImageSet) -> PairedFeatures:
            return PairedFeatures(finished.embed(old, images.images), finished.embed(new, images.images),
                                  images.labels.to(images.images.device))

        mode, update = self.settings.evaluation.mode, self.settings.model_update
        scoring = Scoring.of(update)
        split = StudySplit(features(stream.query), features(stream.gallery), mode=mode, scoring=scoring,
                           sample=scoring.sample(len(stream.query)))
        with torch.no_grad():
            study = measure(split, finished.adapter, orders=update.backfill_orders, steps=update.backfill_steps,
                            seed=self.settings.seed)
        matrix = study_matrix(study["cases"])
        if matrix is None:
            raise ScenarioError("the old and new features differ in size and the adapter maps neither way; pick "
                                "another adapter")
        return {"compatibility_matrix": matrix, "protocol": "stream",
                "retrieval": {**study, "gallery_items": len(stream.gallery),
                              "gallery_mode": mode}}
