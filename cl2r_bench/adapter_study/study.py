"""A study of two models' features (:class:`Study`), one adapter fitted and measured on it
(:func:`evaluate_adapter`), and its record (:func:`study_record`)."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.adapted_cases import (
    PairedFeatures,
    Scoring,
    StudySplit,
    backfilling,
    held_out_error,
    measure,
    zero_shot_retention,
)
from benchmarks.gallery_rows import class_means_of
from benchmarks.record import cross_case, leave_one_out_record
from cl2r_bench.adapters import Adapter, FeaturePair, fit_adapter, make_adapter, unpaired_halves
from cl2r_bench.adapters.learned import FitProgress
from cl2r_bench.distributed import SINGLE, Processes
from cl2r_bench.files import device_description


@dataclass
class ZeroShot:
    """What zero-shot retention needs: the new encoder's raw test features, each item's class index in its own
    classifier, and that classifier."""

    features: torch.Tensor
    classes: torch.Tensor
    classifier: nn.Module


@dataclass
class Study:
    """The fitting (train) and evaluation (test) features of two models, with what made them (``about``)."""

    name: str
    train: PairedFeatures | None
    """The fitting items under both models; None where the study fits on the embeddings of different items
    (:attr:`unpaired_train`)."""
    test: PairedFeatures
    about: dict[str, Any]
    zero_shot: ZeroShot | None = None
    embedding_seconds: dict[str, float] = field(default_factory=dict)
    class_labels: list[int] | None = None
    """The user's label of each class index (``adapt`` renumbers labels: module docstring), None where the indices
    are the data set's classes."""
    processes: Processes = SINGLE
    """The processes that share the study's streamed splits (torchrun; :func:`read_embeddings`)."""
    progress: bool = False
    """Whether each ranking shows a progress bar on a terminal
    (:attr:`benchmarks.adapted_cases.StudySplit.progress`)."""
    pairing: str = "paired"
    """``model_update.pairing``: ``unpaired`` fits each adapter on the old features of one half of the train split
    and the new features of the other (:func:`cl2r_bench.adapters.unpaired_halves`, drawn with the fit's seed)."""
    unpaired_train: FeaturePair | None = None
    """The user's fitting data without pairs (``runner.py adapt --train-old --train-new``): the old model's features
    of some items and the new model's of others, fitted on as they are."""
    splits: dict[tuple[Scoring, int], StudySplit] = field(default_factory=dict, repr=False)

    @property
    def fitting_items(self) -> int:
        """The items the adapters are fitted on: the paired train split's, or both sides' of the unpaired data."""
        if self.unpaired_train is not None:
            return len(self.unpaired_train.old) + len(self.unpaired_train.new)
        return len(self.train)

    def to(self, device: torch.device) -> None:
        """Move every split in memory to ``device``."""
        self.test = self.test.to(device)
        if self.train is not None:
            self.train = self.train.to(device)
        if self.unpaired_train is not None:
            pair = self.unpaired_train
            self.unpaired_train = FeaturePair(pair.old.to(device), pair.new.to(device), pair.labels.to(device),
                                              paired=False)

    def split(self, scoring: Scoring) -> StudySplit:
        """The test split as a leave-one-out :class:`StudySplit`, one per scoring and test features, so its
        adapter-free cases are ranked once per study, whatever the adapters and seeds."""
        key = (scoring, id(self.test))
        if key not in self.splits:
            self.splits[key] = StudySplit(self.test, scoring=scoring, sample=scoring.sample(len(self.test)),
                                          class_labels=self.class_labels, progress=self.progress)
        return self.splits[key]

    @cached_property
    def classifier_rows(self) -> torch.Tensor:
        """The new model's normalised class means of the train split, row y for label y (module docstring): one
        pass over the train split per study, not one per adapter and seed."""
        means, _ = class_means_of(self.train.new, self.train.labels, int(self.train.labels.max()) + 1)
        return F.normalize(means, dim=1)


def evaluate_adapter(study: Study, name: str, *, adapter_params: dict[str, dict[str, Any]], seed: int,
                     orders: list[str], steps: int, scoring: Scoring,
                     measured: tuple[Adapter, dict[str, Any]] | None = None) -> tuple[Adapter | None, dict[str, Any]]:
    """Fit adapter ``name`` (``none``: no adapter) on the study's train split with ``seed`` and measure it on the
    test split; returns the fitted adapter and ``{"adapter", "seed", "fit", "cases", "query_top1", "backfilling",
    "zero_shot", "unmatched_queries", "seconds"}`` (``query_top1``: each query's top-1 hit in old/old and in the
    cross case, packed by :func:`benchmarks.record.pack_hits`, for the paired comparison of the study's summary).

    ``measured``: a seed-free adapter (:meth:`Adapter.seed_free`) already fitted and measured with another seed;
    its fit and cases are taken as they are (the fit log says ``same_as_seed``) and only the backfilling curves,
    whose random order is this seed's, are measured."""
    if measured is not None:
        return reuse_seed_free(study, measured, seed=seed, orders=orders, steps=steps)
    started = time.perf_counter()
    adapter, fit = None, {}
    if name != "none":
        adapter = make_adapter(name, adapter_params)
        fit = fit_on_main(study, adapter, seed)
        fit["seconds"] = time.perf_counter() - started
        fit["items"] = study.fitting_items
        fit["pairing"] = study.pairing
    measured = time.perf_counter()
    zero_shot = None
    if study.zero_shot is not None:
        z = study.zero_shot
        zero_shot = zero_shot_retention(z.features, z.classes, z.classifier, adapter)
    result = {"adapter": name, "seed": seed, "fit": fit, "scoring": scoring,
              **measure(study.split(scoring), adapter, orders=orders, steps=steps, seed=seed,
                        zero_shot=zero_shot)}
    result["seconds"] = {"fit": fit.get("seconds", 0.0), "evaluation": time.perf_counter() - measured}
    return adapter, result


def fit_on_main(study: Study, adapter: Adapter, seed: int) -> dict[str, Any]:
    """Fit ``adapter`` on the study's train split with ``seed`` and return its fit log. Processes that share the
    study (torchrun) take rank 0's fit, its weights and its log: the fit is paid for once, and every rank maps the
    gallery with the very adapter rank 0 records and exports. A fit that fails on rank 0 raises its error on every
    rank, so none waits for it."""
    processes = study.processes
    if study.unpaired_train is not None:
        pair = study.unpaired_train
    elif study.pairing == "unpaired":
        pair = unpaired_halves(FeaturePair(study.train.old, study.train.new, study.train.labels), seed)
    else:
        pair = FeaturePair(old=study.train.old, new=study.train.new, labels=study.train.labels,
                           new_classifier=study.classifier_rows)
    progress = (FitProgress(f"fit {adapter.name} seed {seed}", lambda line: print(line, file=sys.stderr, flush=True))
                if study.progress and processes.is_main else None)
    if not processes.distributed:
        return fit_adapter(adapter, pair, seed, watch=held_out_error, progress=progress)

    def fit_and_export() -> tuple[dict[str, Any], dict[str, Any]]:
        return fit_adapter(adapter, pair, seed, watch=held_out_error, progress=progress), adapter.export()

    fit, exported = processes.decided_on_main(fit_and_export)
    if not processes.is_main:
        adapter.restore(exported, pair.old.device).requires_grad_(False)
    return fit


def reuse_seed_free(study: Study, measured: tuple[Adapter, dict[str, Any]], *, seed: int, orders: list[str],
                    steps: int) -> tuple[Adapter, dict[str, Any]]:
    """:func:`evaluate_adapter` of a seed-free adapter for another ``seed``: the first seed's fit and cases, and
    this seed's backfilling curves."""
    adapter, first = measured
    started = time.perf_counter()
    split = study.split(first["scoring"])
    curves = backfilling(split, adapter, orders=orders, steps=steps, generator=torch.Generator().manual_seed(seed))
    result = {**first, "seed": seed, "fit": {**first["fit"], "same_as_seed": first["seed"]}, "backfilling": curves,
              "seconds": {"fit": 0.0, "evaluation": time.perf_counter() - started}}
    return adapter, result


def result_json(result: dict[str, Any]) -> dict[str, Any]:
    """The one-line JSON of an adapter and seed in ``runner.py adapt --json``: the adapter, its cases, its
    backfilling AUCs, its zero-shot retention and its fit's convergence."""
    fit = result["fit"]
    return {"adapter": result["adapter"], "seed": result["seed"], "cases": result["cases"],
            "backfilling": result["backfilling"]["auc"], "zero_shot": result["zero_shot"],
            "fit": {k: fit[k] for k in ("seconds", "steps", "converged", "best_step") if k in fit}}


def cross_entry(cases: dict[str, dict[str, float] | None]) -> float | None:
    """The 2x2 matrix's cross entry, top-1 as a fraction: what the system delivers without backfilling
    (:func:`benchmarks.record.cross_case`), or None."""
    case = cross_case(cases)
    return None if case is None else cases[case]["top1"] / 100


def study_matrix(cases: dict[str, dict[str, float] | None]) -> list[list[float | None]] | None:
    """The study's 2x2 top-1 matrix ``[[old/old, -], [cross, new/new]]`` as fractions, or None without a cross
    case: the one place a record's ``compatibility_matrix`` is built from the retrieval cases."""
    cross = cross_entry(cases)
    return None if cross is None else [[cases["old/old"]["top1"] / 100, None], [cross, cases["new/new"]["top1"] / 100]]


NOT_MEASURED = ("adapter", "seed", "fit", "scoring", "seconds")
"""The keys of :func:`evaluate_adapter`'s result that are not :func:`benchmarks.adapted_cases.measure`'s (the
record's ``retrieval``)."""


def study_record(result: dict[str, Any], study: Study, *, scenario: str, method: str, dataset: str,
                 config: dict[str, Any], device: torch.device, adapter: Adapter | None) -> dict[str, Any]:
    """The ``metrics.json`` of one adapter and seed under the leave-one-out protocol (:mod:`benchmarks.record`):
    the retrieval cases, backfilling and zero-shot retention under ``retrieval``, with the 2x2 top-1 matrix
    ``[[old/old], [cross, new/new]]`` and its metrics where the cross entry exists."""
    return leave_one_out_record(
        identity={"scenario": scenario, "strategy": scenario, "method": method, "dataset": dataset,
                  "seed": result["seed"]},
        retrieval={**{key: value for key, value in result.items() if key not in NOT_MEASURED},
                   "fitting_items": study.fitting_items},
        models=study.about,
        adapter=None if adapter is None else {"name": adapter.name, "fits": [{"task": 1, **result["fit"]}],
                                              "diagnostics": dict(adapter.diagnostics)},
        config=config, device=device_description(device),
        timings={"tasks": [], "embedding_seconds": study.embedding_seconds,
                 "adapter_fit_seconds": result["seconds"]["fit"],
                 "evaluation_seconds": result["seconds"]["evaluation"],
                 "evaluation_processes": study.processes.world_size},
        matrix=study_matrix(result["cases"]))
