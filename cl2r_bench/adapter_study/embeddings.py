"""The user's own embeddings (``runner.py adapt --train TRAIN --test TEST``): read, checked (every problem one line),
optionally cut to the open set, as a :class:`~cl2r_bench.adapter_study.study.Study`."""
from __future__ import annotations

import math
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.adapted_cases import (
    Features,
    PairedFeatures,
)
from benchmarks.gallery_rows import NpyRows, normalise_rows
from cl2r_bench.adapters import FeaturePair
from cl2r_bench.data.datasets import DataError
from cl2r_bench.distributed import SINGLE, Processes

from .study import Study

ARRAYS = ("old", "new", "labels")


class EmbeddingsError(DataError):
    """The user's embedding files cannot be used; the message names the file and the fix."""


AUTO_STREAM_BYTES = 256 * 2**20
"""``model_update.stream_rows: auto`` streams a folder whose ``old.npy`` and ``new.npy`` together exceed this size."""
AUTO_STREAM_ROWS = 65536
"""The rows a folder streamed by ``auto`` reads at a time."""


def stream_rows_for(path: str | Path, setting: int | str | None, unseen_classes: float = 0.0) -> int | None:
    """``model_update.stream_rows`` for the test split at ``path``: the setting itself unless it is ``auto``, which
    streams (:data:`AUTO_STREAM_ROWS` rows at a time) a folder of ``.npy`` files whose ``old`` and ``new`` arrays
    exceed :data:`AUTO_STREAM_BYTES`, and reads anything else into memory, as it does an open-set study's
    (``unseen_classes`` selects items in memory)."""
    if setting != "auto":
        return setting
    path = Path(path)
    if unseen_classes or not npy_folder(path):
        return None
    size = sum((path / f"{name}.npy").stat().st_size for name in ("old", "new"))
    return AUTO_STREAM_ROWS if size > AUTO_STREAM_BYTES else None


UNSEEN_CLASSES_SEED = 0
"""The seed of the draw of ``model_update.unseen_classes`` (:func:`unseen_split`): one draw for every adapter and
seed of a study, so that they are scored on the same classes."""


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
        except EmbeddingsError:
            raise
        except Exception as exc:  # noqa: BLE001 - zip, zlib and numpy failures of a damaged or foreign file
            raise EmbeddingsError(f"{path} is not a readable .npz file ({type(exc).__name__}: {_first_line(exc)}); "
                                  "save it again with np.savez(FILE, old=..., new=..., labels=...)") from None
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


def _first_line(exc: Exception) -> str:
    """The first line of an exception's message, at most 120 characters (its type's name where it has none)."""
    return (str(exc).splitlines() or [type(exc).__name__])[0][:120]


def _check_header(name: str, handle: Any, stored_bytes: int) -> None:
    """Refuse a ``.npy`` stream whose header claims more data than the file holds, before anything is allocated
    (a damaged or forged header would otherwise ask for terabytes)."""
    try:
        version = np.lib.format.read_magic(handle)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(handle)
    except Exception as exc:  # noqa: BLE001 - numpy's header parser raises what its tokenizer and literal_eval do
        raise EmbeddingsError(f"{name} is not a numpy array file ({_first_line(exc)}); save it with "
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
    """What the summary's closed / open set line reads (:func:`cl2r_bench.reporting.adapter_answer.classes_line`): how
    many
    test classes there are, how many of them the adapters were fitted on, and how many were held out by
    ``model_update.unseen_classes``."""
    test_classes = set(np.asarray(test_labels).tolist())
    return {"test_classes": len(test_classes),
            "test_classes_fitted": len(test_classes & set(np.asarray(train_labels).tolist())),
            "unseen_classes_drawn": unseen}


def read_unpaired(old_path: str | Path, new_path: str | Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The old model's embeddings of some items and the new model's of others (``runner.py adapt --train-old
    --train-new``): each a ``.npy`` or ``.pt`` file of one 2-D float array, any number of rows, checked like a split's
    (finite, no all-zero row); every problem one line naming the file."""
    arrays = []
    for name, path in (("old", Path(old_path)), ("new", Path(new_path))):
        if not path.is_file() or path.suffix not in (".npy", ".pt"):
            raise EmbeddingsError(f"{path} is not a .npy or .pt file; save the {name} model's embeddings with np.save "
                                  "or torch.save(tensor)")
        x = _read_array(path)
        if x.ndim != 2 or x.dtype.kind != "f" or x.shape[1] < 1 or len(x) < 2:
            raise EmbeddingsError(f"{path} must hold a 2-D float array of at least 2 rows (items x dimensions), not "
                                  f"{x.dtype} of shape {x.shape}")
        _check_rows(path, name, x, SINGLE, None)
        arrays.append(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)))
    return arrays[0], arrays[1]


def study_from_embeddings(train_path: str | Path | tuple[str | Path, str | Path], test_path: str | Path,
                          stream_rows: int | None = None, processes: Processes = SINGLE, progress: bool = False,
                          unseen_classes: float = 0.0) -> Study:
    """A :class:`Study` of the user's train and test embeddings, checked against each other (``train_path`` a pair
    of files: the old and the new model's embeddings of different items, :func:`unpaired_study`); ``stream_rows``: the
    test split's features stay memory-mapped (:func:`read_embeddings`), and so do the train split's when it is a
    folder of ``.npy`` files (an adapter then reads the rows it fits on: :class:`cl2r_bench.adapters.FeaturePair`);
    ``processes``: the processes that share the streamed splits' passes; ``progress``: :attr:`Study.progress`;
    ``unseen_classes``: the share of classes held out of fitting and alone scored (:func:`unseen_split`)."""
    if isinstance(train_path, tuple):
        return unpaired_study(train_path, test_path, stream_rows, processes, progress)
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


def unpaired_study(train_paths: tuple[str | Path, str | Path], test_path: str | Path, stream_rows: int | None,
                   processes: Processes, progress: bool) -> Study:
    """The :class:`Study` of :func:`study_from_embeddings` whose fitting data are the old and the new model's
    embeddings of different items (:func:`read_unpaired`; :attr:`Study.unpaired_train`), with no labels: the test
    split is read and scored as always, and nothing is said of which test classes were fitted."""
    old, new = read_unpaired(*train_paths)
    test = read_embeddings(test_path, stream_rows, processes)
    for name, fitted, scored in (("old", old, test[0]), ("new", new, test[1])):
        if fitted.shape[1] != scored.shape[1]:
            raise EmbeddingsError(f"{name} has {fitted.shape[1]} dimensions in the train files but {scored.shape[1]} "
                                  f"in {test_path}; embed both with the same model")
    index = {label: i for i, label in enumerate(dict.fromkeys(test[2].tolist()))}
    if len(index) == len(test[2]):
        raise EmbeddingsError(f"{test_path}: every label occurs once, so no query has another item of its class "
                              "in the gallery; the test split needs classes with at least 2 items")
    labels = torch.tensor([index[v] for v in test[2].tolist()])
    fitting = [normalise_rows(x) for x in (old, new)]
    about = {"train_old": str(train_paths[0]), "train_new": str(train_paths[1]), "test": str(test_path),
             "train_items": len(old) + len(new), "train_old_items": len(old), "train_new_items": len(new),
             "test_items": len(labels), "old_dim": old.shape[1], "new_dim": new.shape[1], "classes": len(index)}
    return Study(Path(train_paths[0]).stem, None, PairedFeatures.normalised(test[0], test[1], labels), about,
                 class_labels=list(index), processes=processes, progress=progress, pairing="unpaired",
                 unpaired_train=FeaturePair(*fitting, torch.zeros(0, dtype=torch.long), paired=False))
