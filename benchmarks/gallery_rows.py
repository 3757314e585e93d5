"""Galleries read by rows, for rankings that stream the gallery in chunks instead of holding it whole
(:func:`benchmarks.ranking.retrieval_scores` with a :class:`GalleryRows`; docs/scale-out.md, "Galleries of
millions").

A gallery gives its rows as float32 on the ranking's device, optionally through ``transforms`` (the study's
normalisation, an adapter's map) applied to each chunk as it is read; the ranking normalises what it compares:

* :class:`TensorRows`: a tensor in memory (the streamed ranking of an in-memory gallery, e.g. to bound the memory
  of a GPU);
* :class:`NpyRows`: a ``.npy`` file, memory-mapped afresh for every read and unmapped after it, so the pages read
  leave the process's resident memory with the read (a memory map kept open would hold every page it touched).
"""
from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

Transform = Callable[[torch.Tensor], torch.Tensor]


CHUNK_ROWS = 65536
"""The most gallery rows a streamed ranking reads at once, by default (1,280-wide float32: 335 MB)."""


def normalise_rows(features: torch.Tensor) -> torch.Tensor:
    """Each row L2-normalised: the first transform of a study's features (adapters see normalised features)."""
    return F.normalize(features.float(), dim=1)


class GalleryRows(ABC):
    """The rows of a gallery (module docstring): :meth:`read` a range or :meth:`rows` a set of items, each read
    through ``transforms`` in order. ``width`` is the rows' width as read; ``chunk_rows`` the most
    rows a ranking reads at once. Two galleries are equal when they read the same stored rows through equal
    transforms (an adapter's bound methods compare equal), so a study recognises a ranking it has done."""

    def __init__(self, items: int, stored_width: int, device: torch.device | str, transforms: tuple[Transform, ...],
                 chunk_rows: int) -> None:
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be at least 1, not {chunk_rows}")
        self.items, self.device, self.chunk_rows = items, torch.device(device), chunk_rows
        self.transforms = tuple(transforms)
        self.width = self.read(0, 1).shape[1] if self.transforms and items else stored_width

    @property
    def shape(self) -> tuple[int, int]:
        return self.items, self.width

    @property
    def ndim(self) -> int:
        return 2

    def __len__(self) -> int:
        return self.items

    def __eq__(self, other: object) -> bool:
        return (type(other) is type(self) and other.source() == self.source()
                and other.transforms == self.transforms)

    __hash__ = None

    @abstractmethod
    def raw(self, index: slice | np.ndarray) -> torch.Tensor:
        """The stored rows at ``index``, as they are."""

    @abstractmethod
    def source(self) -> object:
        """What identifies the stored rows."""

    def to(self, device: torch.device | str) -> GalleryRows:
        """The same rows, read onto ``device``."""
        other = copy.copy(self)
        other.device = torch.device(device)
        return other

    def mapped(self, transform: Transform) -> GalleryRows:
        """The same rows read through ``transform`` too, after this gallery's transforms."""
        other = copy.copy(self)
        other.transforms = (*self.transforms, transform)
        other.width = other.read(0, 1).shape[1] if self.items else self.width
        return other

    def prepared(self, raw: torch.Tensor) -> torch.Tensor:
        rows = raw.to(self.device).float()
        for transform in self.transforms:
            rows = transform(rows).float()
        return rows

    def read(self, start: int, stop: int) -> torch.Tensor:
        return self.prepared(self.raw(slice(start, stop)))

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """The rows of the items ``index``, in that order."""
        return self.prepared(self.raw(index.cpu().numpy()))

    def chunks(self, rows: int | None = None) -> Iterator[tuple[int, torch.Tensor]]:
        """``(start, rows)`` from the first item to the last, at most ``rows`` (and :attr:`chunk_rows`) at a time."""
        rows = self.chunk_rows if rows is None else min(rows, self.chunk_rows)
        for start in range(0, self.items, rows):
            yield start, self.read(start, min(start + rows, self.items))


class TensorRows(GalleryRows):
    """A gallery in memory."""

    def __init__(self, features: torch.Tensor, transforms: tuple[Transform, ...] = (),
                 chunk_rows: int = CHUNK_ROWS) -> None:
        self.features = features
        super().__init__(len(features), int(features.shape[1]), features.device, transforms, chunk_rows)

    def raw(self, index: slice | np.ndarray) -> torch.Tensor:
        return self.features[index if isinstance(index, slice) else torch.from_numpy(index).to(self.device)]

    def source(self) -> object:
        return id(self.features)


class NpyRows(GalleryRows):
    """A 2-D float ``.npy`` file, memory-mapped for each read (module docstring)."""

    def __init__(self, path: str | Path, device: torch.device | str = "cpu", transforms: tuple[Transform, ...] = (),
                 chunk_rows: int = CHUNK_ROWS) -> None:
        self.path = Path(path)
        mapped = np.load(self.path, mmap_mode="r")
        if mapped.ndim != 2 or mapped.dtype.kind != "f":
            raise ValueError(f"{self.path} holds a {mapped.ndim}-D {mapped.dtype} array; a gallery needs 2-D "
                             "floating-point features, one row per item")
        items, stored_width = mapped.shape
        del mapped
        super().__init__(items, int(stored_width), device, transforms, chunk_rows)

    def raw(self, index: slice | np.ndarray) -> torch.Tensor:
        mapped = np.load(self.path, mmap_mode="r")
        rows = np.array(mapped[index], dtype=np.float32)
        del mapped
        return torch.from_numpy(rows)

    def source(self) -> object:
        return self.path.resolve()
