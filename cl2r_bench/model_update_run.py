"""Run the ``model_update`` scenario: one old and one new model bridged by an adapter (METHODS.md §7).

The old model is trained from scratch with cross-entropy on the first ``stream.initial_classes`` stream classes,
the new one on all ``initial_classes + increment`` classes (the λ-orthogonal and FCT papers' setting), both with
the ``replacement.pretrain`` settings and the ``model_update.head`` family, and cached like replacement models
(every adapter and seed of a study shares them; the run seed drives the adapter's fit and the random backfilling
order). The adapter is fitted on the new model's training images embedded by both models, then measured on the
evaluation set (``benchmarks/adapters.py``): the retrieval cases and the partial backfilling curves.

``metrics.json`` holds ``cases``, ``backfilling``, the adapter's fit log and a 2x2 ``compatibility_matrix``
``[[old/old], [cross, new/new]]`` whose cross entry is ``B(new)/old`` for an adapter with a backward map,
``new/F(old)`` for a forward-only one and ``new/old`` without adapter, with its metrics.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.adapters import TwoModelFeatures, adapted_cases, partial_backfilling
from benchmarks.metrics import all_metrics, as_matrix
from benchmarks.records import atomic_write_json, device_description, package_versions
from cl2r_bench.run import (DivergedError, RunError, RunFolder, adapter_name, make_stream, model_kwargs, pretrain_options,
                        pretrain_seeds, resolve_device, run_directory, run_label, stream_preprocessing,
                        synthetic_options, to_device)
from cl2r_bench.models import NonFiniteError, RetrievalModel, build_model, embed
from scenarios.datasets import ImageSet, load_dataset
from scenarios.streams import Stream
from cl2r_bench.adapters import embed_pair, fit_adapter, make_adapter
from cl2r_bench.training.pretrain import pretrained_replacement
from cl2r_bench.training.engine import TrainSettings

HEADS = ("learnable", "dsimplex")


def cross_entry(cases: dict[str, float | None]) -> float:
    """The 2x2 matrix's cross entry (module docstring)."""
    for key in ("B(new)/old", "new/F(old)", "new/old"):
        if cases[key] is not None:
            return cases[key]
    raise RunError("the old and new features differ in size and the adapter maps neither way; pick another adapter")


class ModelUpdateRun:
    """One (adapter, seed) of the ``model_update`` scenario; :meth:`execute` writes ``metrics.json``."""

    def __init__(self, cfg: dict[str, Any], *, resume: bool = False, overwrite: bool = False, log=print) -> None:
        self.cfg, self.log = cfg, log
        self.amp = TrainSettings(**cfg["training"]).autocast
        name = adapter_name(cfg)
        self.adapter = make_adapter(name, cfg["adapter_params"]) if name else None
        self.device = resolve_device(cfg["device"])
        self.dir = run_directory(cfg)
        self.folder = RunFolder(self.dir, "metrics.json", resume=resume, overwrite=overwrite)
        self.done = resume and (self.dir / "metrics.json").exists()

    def _train(self, source, stream: Stream, classes: list[int], images_per_class: int | None,
               seed: int) -> tuple[RetrievalModel, Path]:
        """The cached model trained on ``classes`` of ``source`` (pretrained first when absent), built to embed
        ``stream``'s images (its statistics; METHODS.md §7)."""
        pre = self.cfg["replacement"]["pretrain"]
        settings, plateau = pretrain_options(self.cfg)
        head = self.cfg["model_update"]["head"]
        path, cached = pretrained_replacement(
            source, classes, head=head, model_kwargs=model_kwargs(self.cfg), settings=settings,
            images_per_class=images_per_class, device=self.device, seed=seed, cache_dir=pre["cache_dir"],
            keep_classifier=True, plateau=plateau, log=self.log)
        self.log(f"model on {len(classes)} classes: {path} ({'cached' if cached else 'trained now'})")
        model = build_model(head=head, num_classes=len(classes), **model_kwargs(self.cfg),
                            **stream_preprocessing(stream))
        model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        return model.to(self.device).eval(), path

    def execute(self) -> dict[str, Any]:
        """The record of a finished run (``--resume``), or train, fit and measure while holding the folder's lock."""
        if self.done:
            try:
                return json.loads((self.dir / "metrics.json").read_text())
            except (OSError, ValueError, RecursionError):
                raise RunError(f"--resume: {self.dir / 'metrics.json'} is damaged; start over with --overwrite"
                               ) from None
        with self.folder.writing(self.cfg):
            try:
                return self._execute()
            except NonFiniteError as exc:
                raise DivergedError(f"the model update diverged: {exc}; lower replacement.pretrain.lr (now "
                                    f"{self.cfg['replacement']['pretrain']['lr']:g}) or the adapter's lr") from None

    def _execute(self) -> dict[str, Any]:
        started = time.perf_counter()
        stream = make_stream({**self.cfg, "replacement": {**self.cfg["replacement"], "tasks": []}})
        source = load_dataset(self.cfg["dataset"], self.cfg["data_root"], download=self.cfg["download"],
                              image_size=self.cfg["data"]["image_size"], verify=self.cfg["data"]["verify"],
                              **synthetic_options(self.cfg))
        counts = [len(t.new_classes) for t in stream.tasks]
        per_class = self.cfg["stream"]["images_per_class"]
        t0 = time.perf_counter()
        old_seed, new_seed = pretrain_seeds(self.cfg, 2)
        old, old_path = self._train(source, stream, stream.class_order[:counts[0]], per_class, old_seed)
        new, new_path = self._train(source, stream, stream.class_order[:sum(counts)], per_class, new_seed)
        train_seconds = time.perf_counter() - t0
        fit_data = to_device(ImageSet(torch.cat([t.train.images for t in stream.tasks]),
                                      torch.cat([t.train.labels for t in stream.tasks])), self.device)
        t0 = time.perf_counter()
        fit_log: dict[str, float] = {}
        if self.adapter is not None:
            pair = embed_pair(old, new, fit_data, num_classes=sum(counts), amp=self.amp)
            fit_log = fit_adapter(self.adapter, pair, self.cfg["seed"])
            self.log(f"adapter {self.adapter.name} fitted on {len(fit_data)} items in {time.perf_counter() - t0:.1f}s "
                     + " ".join(f"{k}={v:.3g}" for k, v in fit_log.items()))
        fit_seconds = time.perf_counter() - t0
        t0 = time.perf_counter()
        features = self._features(old, new, stream)
        mode = self.cfg["evaluation"]["mode"]
        with torch.no_grad():
            cases = adapted_cases(features, self.adapter, mode)
            generator = torch.Generator().manual_seed(self.cfg["seed"])
            backfilling = partial_backfilling(features, self.adapter, orders=self.cfg["model_update"]["backfill_orders"],
                                              steps=self.cfg["model_update"]["backfill_steps"], mode=mode,
                                              generator=generator)
        matrix = [[cases["old/old"], None], [cross_entry(cases), cases["new/new"]]]
        record = {
            "scenario": "model_update", "strategy": "model_update", "method": run_label(self.cfg),
            "dataset": self.cfg["dataset"], "seed": self.cfg["seed"], "num_tasks": 2, "tasks_completed": 2,
            "complete": True, "replacement_tasks": [], "compatibility_matrix": matrix,
            "metrics": all_metrics(as_matrix(matrix), self.cfg["evaluation"]["tie_rule"]),
            "cases": cases, "backfilling": backfilling,
            "adapter": None if self.adapter is None else {"name": self.adapter.name, "fit": fit_log,
                                                          "fit_items": len(fit_data)},
            "models": {"old": {"path": str(old_path), "classes": counts[0]},
                       "new": {"path": str(new_path), "classes": sum(counts)}},
            "evaluation": {"queries": len(stream.query), "gallery_images": len(stream.gallery), "mode": mode},
            "config": self.cfg, "versions": package_versions(), "device": device_description(self.device),
            "timings": {"model_training_seconds": train_seconds, "adapter_fit_seconds": fit_seconds,
                        "evaluation_seconds": time.perf_counter() - t0,
                        "wall_seconds_this_invocation": time.perf_counter() - started},
        }
        atomic_write_json(self.dir / "metrics.json", record)
        if self.cfg["evaluation"]["plots"]:
            from benchmarks.plots import save_backfilling_plot

            save_backfilling_plot(record, self.dir)
        return record

    def _features(self, old: RetrievalModel, new: RetrievalModel, stream: Stream) -> TwoModelFeatures:
        query, gallery = to_device(stream.query, self.device), to_device(stream.gallery, self.device)
        return TwoModelFeatures(
            query_old=embed(old, query.images, amp=self.amp), query_new=embed(new, query.images, amp=self.amp),
            gallery_old=embed(old, gallery.images, amp=self.amp), gallery_new=embed(new, gallery.images, amp=self.amp),
            query_labels=query.labels, gallery_labels=gallery.labels)
