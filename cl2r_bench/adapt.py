"""Adapters between two encoders' features, measured by the papers' leave-one-out protocol (docs/METHODS.md §7b).

Two ways in, one way through:

* the user's own embeddings (``runner.py adapt --train TRAIN --test TEST``): :func:`read_embeddings` reads a
  ``.npz`` (arrays ``old``, ``new``, ``labels``) or a folder (``old.npy``, ``new.npy``, ``labels.npy``, or the
  same as ``.pt`` tensors, read with ``weights_only=True``) and checks it, every problem one line;
* two encoders by spec (``model_update.old`` / ``model_update.new``): :func:`encoder_study` embeds the data set's
  train and test splits once per encoder through the feature cache (:mod:`cl2r_bench.feature_cache`).

Either gives a :class:`Study`: the train split's features of both models (the adapter's fitting data) and the test
split's (query and gallery). :func:`evaluate_adapter` fits one adapter with one seed (:func:`fit_adapter`) and
measures it (:mod:`benchmarks.adapter_study`): the nine cases, the partial-backfilling AUCs and, where the new
encoder has an ImageNet classifier and the data have ImageNet classes, the zero-shot retention. Labels are
renumbered 0..C-1 in order of first appearance in the train split, then the test split's other labels in sorted
order (retrieval compares labels only).
FastFill's discriminative loss reads "the new model's classifier" for the data's classes; a pretrained encoder's
own classifier does not know a downstream data set's classes, so the rows are the new model's class means of the
train split (a nearest-class-mean classifier: the suite's choice, the same for every input).
"""
from __future__ import annotations

import math
import sys
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.adapter_study import (
    Features,
    PairedFeatures,
    Scoring,
    StudySplit,
    backfilling,
    class_means_of,
    held_out_error,
    measure,
    zero_shot_retention,
)
from benchmarks.gallery_rows import NpyRows
from benchmarks.record import RecordError, cross_case, leave_one_out_record, read_record
from cl2r_bench.adapters import Adapter, FeaturePair, fit_adapter, make_adapter
from cl2r_bench.adapters.training import FitProgress
from cl2r_bench.config import (
    CONFIG_DIR,
    config_text,
    differing,
    flatten,
    load_yaml,
    merge,
    parse_assignment,
    read_yaml,
)
from cl2r_bench.data.datasets import DataError, ImageSet, load_dataset, native_image_size
from cl2r_bench.data.streams import first_per_class
from cl2r_bench.distributed import SINGLE, Processes
from cl2r_bench.encoders import Encoder, build_encoder
from cl2r_bench.errors import ConfigError, UsageError
from cl2r_bench.feature_cache import ONE_PIECE, Sharding, cached_features
from cl2r_bench.files import atomic_write, atomic_write_text, device_description
from cl2r_bench.settings import (
    UNMATCHED_CONVENTIONS,
    DistributedSettings,
    at_least,
    check_backfill_orders,
    check_choices,
    check_rules,
)

ARRAYS = ("old", "new", "labels")


class EmbeddingsError(DataError):
    """The user's embedding files cannot be used; the message names the file and the fix."""


ADAPT_KEYS = ("backfill_orders", "backfill_steps", "unmatched_queries", "per_class_cmc", "queries", "stream_rows",
              "screen", "unseen_classes")
UNSEEN_CLASSES_SEED = 0
"""The seed of the draw of ``model_update.unseen_classes`` (:func:`unseen_split`): one draw for every adapter and
seed of a study, so that they are scored on the same classes."""


def adapt_settings(assignments: list[str]) -> dict[str, Any]:
    """The settings of ``runner.py adapt``: ``adapter_params``, the :data:`ADAPT_KEYS` of ``model_update`` and
    ``distributed`` (under torchrun) from ``configs/default.yaml``, overridden by ``--set`` assignments, checked like
    a run's (each adapter's parameters by its own ``Config``), and the default ``seed`` and ``output`` (written once,
    there)."""
    defaults = read_yaml(CONFIG_DIR / "default.yaml")
    merged = {"adapter_params": defaults["adapter_params"], "distributed": defaults["distributed"],
              "model_update": {k: defaults["model_update"][k] for k in ADAPT_KEYS}}
    for assignment in assignments:
        merged = merge(merged, parse_assignment(assignment), f"--set {assignment}")
    check_backfill_orders(merged["model_update"]["backfill_orders"])
    update = SimpleNamespace(**merged["model_update"])
    check_rules("model_update", update, at_least(1, "backfill_steps", "queries", "stream_rows"))
    check_choices("model_update", update, {"unmatched_queries": UNMATCHED_CONVENTIONS})
    if not 0 <= update.unseen_classes < 1:
        raise ConfigError(f"model_update.unseen_classes = {update.unseen_classes!r} must be a share in [0, 1) (e.g. "
                          "0.5: half the classes are held out of fitting and scored)")
    if update.unseen_classes and update.stream_rows is not None:
        raise ConfigError("model_update.unseen_classes selects items in memory; leave model_update.stream_rows null "
                          "with it, or split the classes into the two files yourself")
    if update.screen and update.stream_rows is None:
        raise ConfigError("model_update.screen screens a streamed gallery: add --set model_update.stream_rows=65536 "
                          "(with a folder of .npy files), or leave screen false")
    for name in merged["adapter_params"]:
        make_adapter(name, merged["adapter_params"])
    return {"adapter_params": merged["adapter_params"], **merged["model_update"], "seed": defaults["seed"],
            "output": defaults["output"], "distributed": DistributedSettings(**merged["distributed"])}


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
    train: PairedFeatures
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
    (:attr:`benchmarks.adapter_study.StudySplit.progress`)."""
    splits: dict[tuple[Scoring, int], StudySplit] = field(default_factory=dict, repr=False)

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


def read_embeddings(path: str | Path, stream_rows: int | None = None, processes: Processes = SINGLE
                    ) -> tuple[Features, Features, np.ndarray]:
    """``(old, new, labels)`` of a ``.npz`` file or a folder (module docstring), checked: 2-D finite float arrays
    with one row per label, integer labels; each problem is an :class:`EmbeddingsError` in one line. With
    ``stream_rows`` (``model_update.stream_rows``) the folder's ``old.npy`` and ``new.npy`` stay on disk, memory-mapped,
    checked and later read ``stream_rows`` rows at a time (:class:`benchmarks.gallery_rows.NpyRows`); ``processes``
    that share them each check, and later pass over, their share of the rows (torchrun; docs/scale-out.md)."""
    path = Path(path)
    if stream_rows is not None:
        if not npy_folder(path):
            raise EmbeddingsError(f"model_update.stream_rows reads a folder holding old.npy, new.npy and labels.npy; "
                                  f"{path} is not one: save the arrays with np.save, or leave stream_rows null")
        arrays = {name: _read_array(path / f"{name}.npy", mapped=name != "labels") for name in ARRAYS}
    elif path.is_dir():
        arrays = {name: _read_array(_array_file(path, name)) for name in ARRAYS}
    elif path.is_file() and path.suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as archive:
                missing = [name for name in ARRAYS if name not in archive.files]
                if missing:
                    raise EmbeddingsError(f"{path} has no array {missing[0]!r} (it holds {archive.files}); save "
                                          "it with np.savez(FILE, old=..., new=..., labels=...)")
                with zipfile.ZipFile(path) as members:
                    for name in ARRAYS:
                        info = members.getinfo(f"{name}.npy")
                        with members.open(info) as member:
                            _check_header(f"{path} ({name})", member, info.file_size)
                arrays = {name: archive[name] for name in ARRAYS}
        except (OSError, ValueError) as exc:
            raise EmbeddingsError(f"{path} is not a readable .npz file ({str(exc).splitlines()[0][:120]})") from None
    else:
        raise EmbeddingsError(f"{path} is neither a .npz file nor a folder holding old.npy, new.npy and labels.npy "
                              "(or .pt); check the path")
    old, new, labels = _checked(path, arrays, processes, stream_rows)
    if stream_rows is not None:
        old, new = (NpyRows(path / f"{name}.npy", chunk_rows=stream_rows, processes=processes)
                    for name in ("old", "new"))
    return old, new, labels


def npy_folder(path: Path) -> bool:
    """Whether ``path`` is a folder holding ``old.npy``, ``new.npy`` and ``labels.npy`` (a split that can stream)."""
    return path.is_dir() and all((path / f"{name}.npy").is_file() for name in ARRAYS)


def _array_file(folder: Path, name: str) -> Path:
    found = [folder / f"{name}{suffix}" for suffix in (".npy", ".pt") if (folder / f"{name}{suffix}").is_file()]
    if not found:
        raise EmbeddingsError(f"{folder} has no {name}.npy or {name}.pt; a folder holds old, new and labels")
    return found[0]


def _read_array(path: Path, mapped: bool = False) -> np.ndarray:
    """The array of a ``.npy`` or ``.pt`` file; ``mapped``: a ``.npy`` file memory-mapped, not read."""
    if path.suffix == ".npy":
        with path.open("rb") as handle:
            _check_header(str(path), handle, path.stat().st_size)
    try:
        if path.suffix == ".npy":
            return np.load(path, allow_pickle=False, mmap_mode="r" if mapped else None)
        value = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - numpy, zip and unpickling failures of a damaged or foreign file
        raise EmbeddingsError(f"{path} cannot be read ({type(exc).__name__}); save it with np.save or "
                              "torch.save(tensor)") from None
    if not isinstance(value, torch.Tensor):
        raise EmbeddingsError(f"{path} holds a {type(value).__name__}, not a tensor; save it with torch.save(tensor)")
    value = value.detach().cpu()
    return (value.float() if value.is_floating_point() else value).numpy()


def _check_header(name: str, handle: Any, stored_bytes: int) -> None:
    """Refuse a ``.npy`` stream whose header claims more data than the file holds, before anything is allocated
    (a damaged or forged header would otherwise ask for terabytes)."""
    try:
        version = np.lib.format.read_magic(handle)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(handle)
    except (ValueError, OSError, SyntaxError) as exc:
        raise EmbeddingsError(f"{name} is not a numpy array file ({str(exc).splitlines()[0][:120]}); save it with "
                              "np.save or np.savez") from None
    claimed = math.prod(shape) * dtype.itemsize
    if claimed > stored_bytes - handle.tell():
        raise EmbeddingsError(f"{name}: its header claims an array of shape {tuple(shape)} ({dtype}, "
                              f"{claimed / 2**30:.3g} GiB) but the file holds {stored_bytes} bytes; the file is "
                              "damaged or not what np.save wrote: save it again")


def _checked(path: Path, arrays: dict[str, np.ndarray], processes: Processes,
             stream_rows: int | None) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    labels = arrays["labels"]
    if labels.ndim != 1 or labels.dtype.kind not in "iub":
        raise EmbeddingsError(f"{path}: labels must be a 1-D array of integers, not {labels.dtype} of shape "
                              f"{labels.shape}; map class names to integers first")
    out = []
    for name in ("old", "new"):
        x = arrays[name]
        if x.ndim != 2 or x.dtype.kind != "f" or x.shape[1] < 1:
            raise EmbeddingsError(f"{path}: {name} must be a 2-D float array (items x dimensions), not {x.dtype} of "
                                  f"shape {x.shape}")
        if len(x) != len(labels):
            raise EmbeddingsError(f"{path}: {name} has {len(x)} rows but labels has {len(labels)}; one row per item")
        _check_rows(path, name, x, processes, stream_rows)
        out.append(x if isinstance(x, np.memmap) else torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)))
    if len(labels) < 2:
        raise EmbeddingsError(f"{path}: {len(labels)} item(s); retrieval needs at least 2")
    return out[0], out[1], labels.astype(np.int64)


def _row_chunks(x: np.ndarray, processes: Processes, stream_rows: int | None) -> Iterator[tuple[int, np.ndarray]]:
    """``(start, rows)`` of an array: in memory, whole; memory-mapped (with ``stream_rows``), ``stream_rows`` rows
    at a time, each read into a buffer of its own (:class:`benchmarks.gallery_rows.NpyRows`), so the pages read leave
    resident memory (a map kept open holds every page it touched: 10 GB for two 1,000,000 x 1,280 files), and only
    the share of this process among ``processes``."""
    if not isinstance(x, np.memmap):
        yield 0, x
        return
    for start, rows in NpyRows(x.filename, chunk_rows=stream_rows, processes=processes).chunks():
        yield start, rows.numpy()


def _check_rows(path: Path, name: str, x: np.ndarray, processes: Processes, stream_rows: int | None) -> None:
    """Refuse rows with NaN or inf, or all zero (no direction to compare), counted and the first named; processes
    that share a memory-mapped file each check their share, and every process refuses what any found."""
    problems: dict[str, list[int]] = {"with NaN or inf": [], "all-zero": []}
    for start, rows in _row_chunks(x, processes, stream_rows):
        problems["with NaN or inf"] += (start + np.flatnonzero(~np.isfinite(rows).all(axis=1))).tolist()
        problems["all-zero"] += (start + np.flatnonzero(~np.abs(rows).any(axis=1))).tolist()
    if isinstance(x, np.memmap):
        shares = processes.from_every_rank(problems)
        problems = {kind: [row for share in shares for row in share[kind]] for kind in problems}
    bad = problems["with NaN or inf"]
    if bad:
        raise EmbeddingsError(f"{path}: {name} has {len(bad)} row(s) with NaN or inf (first: row {bad[0]}); "
                              "drop or re-embed those items")
    zero = problems["all-zero"]
    if zero:
        raise EmbeddingsError(f"{path}: {name} has {len(zero)} all-zero row(s) (first: row {zero[0]}), which "
                              "have no direction to compare; drop or re-embed those items")


def unseen_rows(train_labels: np.ndarray, test_labels: np.ndarray, share: float,
                test_path: str | Path) -> tuple[np.ndarray, np.ndarray, int]:
    """``(train rows, test rows, classes)`` kept by the open-set protocol of metric learning: with ``share`` > 0,
    that share of the classes both splits hold (a draw seeded by :data:`UNSEEN_CLASSES_SEED`) leaves the train split
    and only they stay in the test split, so the adapters are scored on classes they never saw; ``classes`` is how
    many were drawn (0 and every row where ``share`` is 0)."""
    train_labels, test_labels = np.asarray(train_labels), np.asarray(test_labels)
    if not share:
        return np.arange(len(train_labels)), np.arange(len(test_labels)), 0
    shared = sorted(set(train_labels.tolist()) & set(test_labels.tolist()))
    count = round(share * len(shared))
    if count < 2 or count == len(shared):
        raise EmbeddingsError(f"model_update.unseen_classes = {share} of the {len(shared)} classes both splits hold "
                              f"draws {count}; choose a share that leaves at least 2 classes on each side")
    drawn = np.random.default_rng(UNSEEN_CLASSES_SEED).permutation(shared)[:count]
    test_rows = np.flatnonzero(np.isin(test_labels, drawn))
    if len(set(test_labels[test_rows].tolist())) == len(test_rows):
        raise EmbeddingsError(f"{test_path}: the drawn classes have one item each; lower model_update.unseen_classes")
    return np.flatnonzero(~np.isin(train_labels, drawn)), test_rows, count


def unseen_split(train: tuple, test: tuple, share: float, test_path: str | Path) -> tuple[tuple, tuple, int]:
    """``(train, test, classes)``: the ``(old, new, labels)`` splits cut to the rows :func:`unseen_rows` keeps."""
    if not share:
        return train, test, 0
    train_rows, test_rows, count = unseen_rows(train[2], test[2], share, test_path)

    def keep(split: tuple, rows: np.ndarray) -> tuple:
        old, new, labels = split
        return (*(torch.as_tensor(np.asarray(x)[rows]) for x in (old, new)), np.asarray(labels)[rows])

    return keep(train, train_rows), keep(test, test_rows), count


def class_overlap(train_labels: Any, test_labels: Any, unseen: int) -> dict[str, int]:
    """What the summary's closed / open set line reads (:func:`reporting.adapter_summary.classes_line`): how many
    test classes there are, how many of them the adapters were fitted on, and how many were held out by
    ``model_update.unseen_classes``."""
    test_classes = set(np.asarray(test_labels).tolist())
    return {"test_classes": len(test_classes),
            "test_classes_fitted": len(test_classes & set(np.asarray(train_labels).tolist())),
            "unseen_classes_drawn": unseen}


def study_from_embeddings(train_path: str | Path, test_path: str | Path, stream_rows: int | None = None,
                          processes: Processes = SINGLE, progress: bool = False, unseen_classes: float = 0.0) -> Study:
    """A :class:`Study` of the user's train and test embeddings, checked against each other; ``stream_rows``: the
    test split's features stay memory-mapped (:func:`read_embeddings`), and so do the train split's when it is a
    folder of ``.npy`` files (an adapter then reads the rows it fits on: :class:`cl2r_bench.adapters.FeaturePair`);
    ``processes``: the processes that share the streamed splits' passes; ``progress``: :attr:`Study.progress`;
    ``unseen_classes``: the share of classes held out of fitting and alone scored (:func:`unseen_split`)."""
    train_rows = stream_rows if npy_folder(Path(train_path)) else None
    train = read_embeddings(train_path, train_rows, processes)
    test = read_embeddings(test_path, stream_rows, processes)
    train, test, unseen = unseen_split(train, test, unseen_classes, test_path)
    for i, name in enumerate(("old", "new")):
        if train[i].shape[1] != test[i].shape[1]:
            raise EmbeddingsError(f"{name} has {train[i].shape[1]} dimensions in {train_path} but "
                                  f"{test[i].shape[1]} in {test_path}; embed both splits with the same model")
    classes = {label: index for index, label in enumerate(dict.fromkeys(train[2].tolist()))}
    unknown = sorted(set(test[2].tolist()) - set(classes))
    index = {**classes, **{label: len(classes) + i for i, label in enumerate(unknown)}}
    labels = [torch.tensor([index[v] for v in split[2].tolist()]) for split in (train, test)]
    if len(set(test[2].tolist())) == len(test[2]):
        raise EmbeddingsError(f"{test_path}: every label occurs once, so no query has another item of its class "
                              "in the gallery; the test split needs classes with at least 2 items")
    about = {"train": str(train_path), "test": str(test_path), "train_items": len(labels[0]),
             "test_items": len(labels[1]), "old_dim": train[0].shape[1], "new_dim": train[1].shape[1],
             "classes": len(index), **class_overlap(train[2], test[2], unseen)}
    return Study(Path(train_path).stem, PairedFeatures.normalised(train[0], train[1], labels[0]),
                 PairedFeatures.normalised(test[0], test[1], labels[1]), about, class_labels=list(index),
                 processes=processes, progress=progress)


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
        fit["items"] = len(study.train)
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


NOT_MEASURED = ("adapter", "seed", "fit", "scoring", "seconds")
"""The keys of :func:`evaluate_adapter`'s result that are not :func:`benchmarks.adapter_study.measure`'s (the
record's ``retrieval``)."""


def study_record(result: dict[str, Any], study: Study, *, scenario: str, method: str, dataset: str,
                 config: dict[str, Any], device: torch.device, adapter: Adapter | None) -> dict[str, Any]:
    """The ``metrics.json`` of one adapter and seed under the leave-one-out protocol (:mod:`benchmarks.record`):
    the retrieval cases, backfilling and zero-shot retention under ``retrieval``, with the 2x2 top-1 matrix
    ``[[old/old], [cross, new/new]]`` and its metrics where the cross entry exists."""
    cases = result["cases"]
    cross = cross_entry(cases)
    return leave_one_out_record(
        identity={"scenario": scenario, "strategy": scenario, "method": method, "dataset": dataset,
                  "seed": result["seed"]},
        retrieval={**{key: value for key, value in result.items() if key not in NOT_MEASURED},
                   "fitting_items": len(study.train)},
        models=study.about,
        adapter=None if adapter is None else {"name": adapter.name, "fits": [{"task": 1, **result["fit"]}]},
        config=config, device=device_description(device),
        timings={"tasks": [], "embedding_seconds": study.embedding_seconds,
                 "adapter_fit_seconds": result["seconds"]["fit"],
                 "evaluation_seconds": result["seconds"]["evaluation"],
                 "evaluation_processes": study.processes.world_size},
        matrix=None if cross is None else [[cases["old/old"]["top1"] / 100, None],
                                           [cross, cases["new/new"]["top1"] / 100]])


Key = tuple[str, int]
"""An adapter's name and a seed: one record of ``runner.py adapt``."""


def adapt_config(train: str | Path, test: str | Path, name: str, seed: int, settings: dict[str, Any]
                 ) -> dict[str, Any]:
    """The ``config.yaml`` of one adapter and seed of ``runner.py adapt`` (``settings``: :func:`adapt_settings`'s,
    with each adapter's parameters as it uses them): the embeddings, the adapter, its parameters, the seed and the
    :data:`ADAPT_KEYS`; what ``--resume`` compares with an earlier run's (:func:`finished_record`)."""
    return {"command": "adapt", "train": str(Path(train).resolve()), "test": str(Path(test).resolve()),
            "adapter": {"name": name}, "seed": seed,
            "adapter_params": {name: settings["adapter_params"].get(name, {})} if name != "none" else {},
            "model_update": {key: settings[key] for key in ADAPT_KEYS}}


def finished_record(folder: Path, config: dict[str, Any]) -> dict[str, Any] | None:
    """The record an earlier ``runner.py adapt`` finished in ``folder`` (``metrics.json``, written last) with the
    same ``config`` (its ``config.yaml``), for ``--resume`` to keep; None where it finished none. Only a record the
    record schema accepts (:func:`benchmarks.record.read_record`) is finished; any other is a :class:`UsageError`
    naming the file and its problem, as is a record measured with other settings (naming the first that differs:
    keeping it would mix two studies in one summary)."""
    if not (folder / "metrics.json").exists():
        return None
    try:
        record = read_record(folder / "metrics.json")
    except RecordError as exc:
        raise UsageError(f"--resume: {exc.path} is not a finished record ({exc.problem[:160]}); delete {folder} to "
                         "measure it again") from None
    try:
        earlier = flatten(read_yaml(folder / "config.yaml"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"--resume: the config beside the record in {folder} cannot be read "
                         f"({str(exc).splitlines()[0][:120]}); delete that folder to measure it again") from None
    now = flatten(load_yaml(config_text(config)))
    changed = differing(earlier, now)
    if changed:
        key = changed[0]
        raise UsageError(f"--resume: {folder} was measured with {key} = {earlier.get(key)!r} where this run has "
                         f"{now.get(key)!r}; pass another --output, or drop --resume to measure it again")
    return record


def finished_records(folders: dict[Key, Path], configs: dict[Key, dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    """:func:`finished_record` of each adapter and seed (``key``) whose folder holds one."""
    found = {key: finished_record(folders[key], configs[key]) for key in configs}
    return {key: record for key, record in found.items() if record is not None}


def result_of_record(record: dict[str, Any]) -> dict[str, Any]:
    """What :func:`result_json` and the study's case line read of one adapter and seed, from its record
    (:func:`study_record`): a resumed study reports the records it keeps as it reports those it measures."""
    retrieval = record["retrieval"]
    fit = record["adapter"]["fits"][0] if record["adapter"] else {}
    return {"adapter": record["method"], "seed": record["seed"], "fit": {k: v for k, v in fit.items() if k != "task"},
            "cases": retrieval["cases"], "backfilling": retrieval["backfilling"], "zero_shot": retrieval["zero_shot"]}


class DeployedMap(nn.Module):
    """One fitted map of an adapter as a production system applies it: normalised features in, normalised
    features out (``backward``: new queries into the old index's frame; ``old_frame``: the stored old vectors as
    those queries compare with them; ``forward``: the old index into the new model's space)."""

    def __init__(self, adapter: Adapter, which: str) -> None:
        super().__init__()
        self.adapter, self.which = adapter, which

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return F.normalize(getattr(self.adapter, self.which)(F.normalize(features, dim=1)), dim=1)


EXPORT_README = """# Adapter `{name}`, fitted by cl2r-bench (`runner.py adapt`)

Old model: {old_dim}-d features; new model: {new_dim}-d features. Files:

- `adapter_state.pt`: the fitted adapter as plain tensors (`torch.load(..., weights_only=True)`;
  `cl2r_bench.adapters.make_adapter("{name}", {{}}).restore(state)` rebuilds it).
{files}
Every map takes and returns L2-normalised float32 features (`n x d`, any n) and needs only `torch`:

```python
import torch
{snippet}
```
"""
SNIPPETS = {
    "backward": """to_old = torch.export.load("backward.pt2").module()     # new-model features -> the old index frame
old_frame = torch.export.load("old_frame.pt2").module()   # once, on the stored old vectors (identity or truncation)
index = old_frame(old_index_vectors)
scores = to_old(new_model(query_images)) @ index.T   # search the old index with the new model, no backfilling""",
    "forward": """to_new = torch.export.load("forward.pt2").module()       # old-model features -> the new space
index = to_new(old_index_vectors)              # once, on the stored old vectors (no images re-embedded)
scores = new_model(query_images) @ index.T     # new queries on the upgraded index; backfill items over time""",
}
EXPORT_FILES = {"backward": ("backward", "old_frame"), "forward": ("forward",)}


def export_adapter(adapter: Adapter, directory: str | Path) -> list[Path]:
    """Write the fitted ``adapter`` to ``directory``: its state dict, a ``torch.export`` program (``.pt2``, loaded
    by ``torch.export.load(path).module()`` with torch alone, any number of rows) per map a production system
    applies (the backward pair where the adapter has a backward map, the forward map where it has one: every map
    of every deployment the answer lists, partial backfilling through F included) and a README snippet for each;
    returns the files written. Each file is written atomically (:func:`cl2r_bench.files.atomic_write`): a link in
    its place is replaced, never followed. TorchScript is not written: torch 2.14 deprecates loading it."""
    directory = Path(directory)
    old_dim, new_dim, _ = adapter.dims
    state = adapter.export()
    atomic_write(directory / "adapter_state.pt", lambda f: torch.save(state, f))
    directions = [d for d in ("backward", "forward") if d in adapter.directions]
    written = [directory / "adapter_state.pt"]
    rows = torch.export.Dim("rows", min=1)
    for which in (name for direction in directions for name in EXPORT_FILES[direction]):
        width = new_dim if which == "backward" else old_dim
        program = torch.export.export(DeployedMap(adapter.cpu().eval(), which), (torch.randn(3, width),),
                                      dynamic_shapes=({0: rows},))
        atomic_write(directory / f"{which}.pt2", lambda f, program=program: torch.export.save(program, f))
        written.append(directory / f"{which}.pt2")
    files = "".join(f"- `{p.name}`: a `torch.export` program, `torch.export.load(...).module()`.\n"
                    for p in written[1:])
    atomic_write_text(directory / "README.md", EXPORT_README.format(
        name=adapter.name, old_dim=old_dim, new_dim=new_dim, files=files,
        snippet="\n\n".join(SNIPPETS[d] for d in directions)))
    return written + [directory / "README.md"]


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
                 progress=settings.training.progress)


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
