"""Galleries read by rows, for rankings that stream the gallery in chunks instead of holding it whole
(:func:`benchmarks.ranking.retrieval_scores` with a :class:`GalleryRows`; docs/scale-out.md, "Galleries of
millions").

A gallery gives its rows as float32 on the ranking's device, optionally through ``transforms`` (the study's
normalisation, an adapter's map) applied to each chunk as it is read; the ranking normalises what it compares:

* :class:`TensorRows`: a tensor in memory (the streamed ranking of an in-memory gallery, e.g. to bound the memory
  of a GPU);
* :class:`NpyRows`: a ``.npy`` file: a range of rows read straight into a buffer of its own, by up to
  :data:`READ_THREADS` threads side by side, a set of rows through a memory map made for that read and dropped
  after it, so the pages read leave the process's resident memory with the read (a memory map kept open would
  hold every page it touched);
* :class:`StoredRows`: a gallery read through a costly map (an adapter's), written to a temporary ``.npy`` file
  by the first pass that reads it whole and read from that file afterwards, so each map is applied to each item
  once however many passes a study makes (:meth:`GalleryRows.mapped` with ``store``).

**A gallery shared by processes** (``runner.py adapt`` under torchrun; docs/scale-out.md). Every process reads
any row by index (the sampled queries), but a pass over the gallery (:meth:`GalleryRows.chunks`) reads only the
process's share (:meth:`GalleryRows.share`): contiguous whole chunks of ``chunk_rows`` items, so that each chunk
holds the items it holds in one process and an adapter's map of it rounds as it does there (a matrix product's
rounding can depend on the rows taken together). The ranks thus divide the reading and the ranking between them;
what the passes find is added up over the ranks by their callers: the ranking's counts, the positives'
similarities, a backfilling order's class sums and distances.

**Where the mapped galleries go.** Python's temporary folder (``TMPDIR``; ``tempfile.gettempdir()``), one file per
map as large as the mapped gallery (5.1 GB for 1,000,000 x 1,280 float32), deleted when the study no longer holds
the gallery (after each adapter's measurement); point ``TMPDIR`` at a disk with room, not at a RAM disk.
"""
from __future__ import annotations

import copy
import math
import os
import shutil
import tempfile
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from cl2r_bench.data.datasets import DataError
from cl2r_bench.distributed import SINGLE, Processes
from cl2r_bench.errors import ConfigError
from cl2r_bench.models import class_means

Transform = Callable[[torch.Tensor], torch.Tensor]


CHUNK_ROWS = 65536
"""The most gallery rows a streamed ranking reads at once, by default (1,280-wide float32: 335 MB)."""
READ_THREADS = min(8, os.cpu_count() or 1)
"""The threads that read one range of a ``.npy`` gallery side by side (:meth:`NpyRows.read_range`)."""
READ_PART_BYTES = 16 * 2**20
"""The least each of them reads: smaller parts cost more in starting threads than they gain."""


def normalise_rows(features: torch.Tensor) -> torch.Tensor:
    """Each row L2-normalised: the first transform of a study's features (adapters see normalised features)."""
    return F.normalize(features.float(), dim=1)


class GalleryRows(ABC):
    """The rows of a gallery (module docstring): :meth:`read` a range or :meth:`rows` a set of items, each read
    through ``transforms`` in order. ``width`` is the rows' width as read; ``chunk_rows`` the most rows a ranking
    reads at once; ``processes`` the processes that share its passes (module docstring). Two galleries are equal
    when they read the same stored rows through equal transforms (an adapter's bound methods compare equal), so a
    study recognises a ranking it has done."""

    def __init__(self, items: int, stored_width: int, device: torch.device | str, transforms: tuple[Transform, ...],
                 chunk_rows: int, processes: Processes = SINGLE) -> None:
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be at least 1, not {chunk_rows}")
        self.items, self.device, self.chunk_rows = items, torch.device(device), chunk_rows
        self.processes = processes
        self.transforms = tuple(transforms)
        self.width = self.read(0, 1).shape[1] if self.transforms and items else stored_width
        self.stored_maps: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

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

    def mapped(self, transform: Transform, *, store: bool = False) -> GalleryRows:
        """The same rows read through ``transform`` too, after this gallery's transforms; with ``store``, a
        :class:`StoredRows` (module docstring), one per map of these stored rows while it is held. A transform that
        hands back the rows it is given (an adapter's identity frame) leaves the gallery as it is."""
        other = copy.copy(self)
        other.transforms = (*self.transforms, transform)
        if self.items:
            probe = self.read(0, 1)
            mapped_probe = transform(probe)
            if mapped_probe is probe:
                return self
            other.width = mapped_probe.shape[1]
        if not store:
            return other
        key = (str(self.device), other.transforms)
        stored = self.stored_maps.get(key)
        if stored is None:
            stored = self.stored_maps[key] = StoredRows(other)
        return stored

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

    def __getitem__(self, index: torch.Tensor) -> torch.Tensor:
        """:meth:`rows`, indexed as a tensor is: what an adapter that picks its fitting rows reads
        (:class:`cl2r_bench.adapters.base.FeaturePair`)."""
        return self.rows(index)

    def share(self, rank: int | None = None) -> slice:
        """The items the passes of process ``rank`` (default: this one) read: its share of the gallery's chunks of
        :attr:`chunk_rows` items (:meth:`cl2r_bench.distributed.Processes.share`), all of them with one process
        (module docstring)."""
        chunks = self.processes.share(math.ceil(self.items / self.chunk_rows), rank)
        return slice(min(chunks.start * self.chunk_rows, self.items), min(chunks.stop * self.chunk_rows, self.items))

    def share_sizes(self) -> list[int]:
        """How many items each process's passes read, in rank order."""
        return [len(range(self.items)[self.share(rank)]) for rank in range(self.processes.world_size)]

    def chunks(self, rows: int | None = None) -> Iterator[tuple[int, torch.Tensor]]:
        """``(start, rows)`` from the first item of :meth:`share` to its last, at most ``rows`` at a time: each chunk
        of :attr:`chunk_rows` items in pieces of ``rows``, so every piece holds the items it holds in one process
        (module docstring); one piece of no rows for an empty share (a process with fewer chunks than its peers
        still takes part in what a pass adds up). The next piece is read (and mapped) by a thread while the caller
        works on this one, so a disk's reads overlap the ranking's work."""
        rows = self.chunk_rows if rows is None else min(rows, self.chunk_rows)
        share = self.share()
        pieces = [(start, min(start + rows, chunk + self.chunk_rows, share.stop))
                  for chunk in range(share.start, share.stop, self.chunk_rows)
                  for start in range(chunk, min(chunk + self.chunk_rows, share.stop), rows)]
        pieces = pieces or [(share.start, share.start)]
        with ThreadPoolExecutor(max_workers=1) as reader:
            pending = reader.submit(self.read, *pieces[0])
            for i, (start, _) in enumerate(pieces):
                piece = pending.result()
                if i + 1 < len(pieces):
                    pending = reader.submit(self.read, *pieces[i + 1])
                yield start, piece


class TensorRows(GalleryRows):
    """A gallery in memory."""

    def __init__(self, features: torch.Tensor, transforms: tuple[Transform, ...] = (),
                 chunk_rows: int = CHUNK_ROWS, processes: Processes = SINGLE) -> None:
        self.features = features
        super().__init__(len(features), int(features.shape[1]), features.device, transforms, chunk_rows, processes)

    def raw(self, index: slice | np.ndarray) -> torch.Tensor:
        return self.features[index if isinstance(index, slice) else torch.from_numpy(index).to(self.device)]

    def source(self) -> object:
        return id(self.features)


class GalleryReadError(DataError):
    """A streamed gallery file that fails while it is read (cut short, removed, unreadable): one line naming it."""


class NpyRows(GalleryRows):
    """A 2-D float ``.npy`` file (module docstring): a range of rows is read from the file into a buffer of its own,
    a set of rows through a memory map made for that read."""

    def __init__(self, path: str | Path, device: torch.device | str = "cpu", transforms: tuple[Transform, ...] = (),
                 chunk_rows: int = CHUNK_ROWS, processes: Processes = SINGLE) -> None:
        self.path = Path(path)
        mapped = np.load(self.path, mmap_mode="r")
        if mapped.ndim != 2 or mapped.dtype.kind != "f":
            raise ValueError(f"{self.path} holds a {mapped.ndim}-D {mapped.dtype} array; a gallery needs 2-D "
                             "floating-point features, one row per item")
        items, stored_width = mapped.shape
        self.dtype, self.columns = mapped.dtype, int(stored_width)
        self.offset = mapped.offset if mapped.flags.c_contiguous else None
        del mapped
        super().__init__(items, int(stored_width), device, transforms, chunk_rows, processes)

    def raw(self, index: slice | np.ndarray) -> torch.Tensor:
        """Rows of the file; any failure to read them (the file cut short, removed or unreadable while the study
        runs) is a :class:`GalleryReadError` naming it."""
        try:
            if isinstance(index, slice) and self.offset is not None:
                start, stop, _ = index.indices(self.items)
                return torch.from_numpy(self.read_range(start, max(stop, start)))
            mapped = np.load(self.path, mmap_mode="r")
            rows = np.array(mapped[index], dtype=np.float32)
            del mapped
        except GalleryReadError:
            raise
        except (OSError, ValueError) as exc:
            raise GalleryReadError(f"{self.path} could not be read while the study ran ({exc}); check the file, "
                                   "or write it again") from None
        return torch.from_numpy(rows)

    def read_range(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` as float32, read straight into their buffer (faster than copying from a memory map),
        in parts of at least :data:`READ_PART_BYTES` read side by side by up to :data:`READ_THREADS` threads: one
        thread's reads bounded a study on a GPU (docs/scale-out.md, "On one GPU")."""
        rows = np.empty((stop - start, self.columns), dtype=self.dtype)
        buffer = memoryview(rows.reshape(-1)).cast("B")
        first_byte = self.offset + start * self.columns * self.dtype.itemsize
        part = max(READ_PART_BYTES, -(-len(buffer) // READ_THREADS))
        parts = range(0, len(buffer), part)

        def read_part(at: int) -> None:
            read_into(self.path, buffer[at:at + part], first_byte + at, stop)
        if len(parts) <= 1:
            read_part(0)
        else:
            with ThreadPoolExecutor(max_workers=len(parts), thread_name_prefix="gallery-read") as readers:
                list(readers.map(read_part, parts))
        return rows.astype(np.float32, copy=False)

    def source(self) -> object:
        return self.path.resolve()


def read_into(path: Path, buffer: memoryview, offset: int, stop: int) -> None:
    """Fill ``buffer`` from ``path`` at byte ``offset``, through a file handle of its own (so threads read side by
    side on any system); a read may return less than asked for. ``stop``: the range's end row, for the error."""
    with path.open("rb", buffering=0) as file:
        file.seek(offset)
        done = 0
        while done < len(buffer):
            got = file.readinto(buffer[done:])
            if not got:
                raise GalleryReadError(f"{path} ended before row {stop}: the file was cut short; write it again")
            done += got


def check_room(size: int) -> None:
    """A one-line :class:`~cl2r_bench.errors.ConfigError` when Python's temporary folder has less than ``size`` bytes
    free for a mapped gallery (module docstring), before anything is written."""
    folder = tempfile.gettempdir()
    free = shutil.disk_usage(folder).free
    if free < size:
        raise ConfigError(f"a streamed study writes each adapter-mapped gallery ({size / 1e9:.2f} GB) to the "
                          f"temporary folder {folder}, which has {free / 1e9:.2f} GB free; set TMPDIR to a folder "
                          "on a disk with room")


class StoredRows(GalleryRows):
    """The rows of ``lazy`` (a gallery read through its maps), written to a temporary ``.npy`` file as the first
    pass of :meth:`chunks` reads them from the first item of its share to the last, and read from that file by
    every later pass (module docstring). A range or a set of rows read alone (sampled queries, a probe) is mapped
    again as it is read, the same wherever the process's share lies. It equals ``lazy`` in what it reads, so it
    compares as ``lazy`` does."""

    def __init__(self, lazy: GalleryRows) -> None:
        self.lazy = lazy
        self.items, self.device, self.chunk_rows = lazy.items, lazy.device, lazy.chunk_rows
        self.transforms, self.width, self.processes = lazy.transforms, lazy.width, lazy.processes
        self.stored_maps = lazy.stored_maps
        self.stored: NpyRows | None = None
        self.writing = False

    def raw(self, index: slice | np.ndarray) -> torch.Tensor:
        return self.lazy.raw(index)

    def source(self) -> object:
        return self.lazy.source()

    def to(self, device: torch.device | str) -> GalleryRows:
        return self if torch.device(device) == self.device else StoredRows(self.lazy.to(device))

    def mapped(self, transform: Transform, *, store: bool = False) -> GalleryRows:
        return self.lazy.mapped(transform, store=store)

    def chunks(self, rows: int | None = None) -> Iterator[tuple[int, torch.Tensor]]:
        first = self.share().start
        if self.stored is not None:
            for start, chunk in self.stored.chunks(rows):
                yield first + start, chunk
            return
        if self.writing:
            yield from self.lazy.chunks(rows)
            return
        share_items = self.share().stop - first
        check_room(share_items * self.width * 4)
        handle, name = tempfile.mkstemp(prefix="cl2r-mapped-", suffix=".npy")
        self.writing, complete = True, False
        try:
            with os.fdopen(handle, "wb") as file:
                np.lib.format.write_array_header_1_0(file, {"descr": "<f4", "fortran_order": False,
                                                            "shape": (share_items, self.width)})
                for start, chunk in self.lazy.chunks(rows):
                    file.write(np.ascontiguousarray(chunk.detach().float().cpu().numpy()).data)
                    yield start, chunk
            complete = True
        finally:
            self.writing = False
            if complete:
                self.stored = NpyRows(name, self.device, chunk_rows=self.chunk_rows)
                weakref.finalize(self, os.unlink, name)
            else:
                os.unlink(name)


Features = torch.Tensor | GalleryRows
"""Features in memory, or a gallery streamed from its rows (:mod:`benchmarks.gallery_rows`; galleries of
millions, leave-one-out only)."""


def in_chunks(features: Features) -> Iterator[tuple[int, torch.Tensor]]:
    """``(start, rows)``: a streamed gallery's chunks as they are read, or features in memory as one chunk."""
    if isinstance(features, GalleryRows):
        yield from features.chunks()
    else:
        yield 0, features


def class_means_of(features: Features, labels: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`cl2r_bench.models.class_means` of features in memory or streamed (:func:`in_chunks`); processes that
    share a streamed gallery add their shares' class sums up (:mod:`benchmarks.gallery_rows`)."""
    shared = isinstance(features, GalleryRows)
    return class_means(in_chunks(features), labels, num_classes, total=features.processes.total if shared else None)


def per_item(features: Features, value: Callable[[int, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``value(start, rows)`` of every item, chunk by chunk (:func:`in_chunks`), in item order; processes that
    share a streamed gallery each compute their share's and every process gets them all
    (:mod:`benchmarks.gallery_rows`)."""
    part = torch.cat([value(start, chunk) for start, chunk in in_chunks(features)])
    if not isinstance(features, GalleryRows):
        return part
    return features.processes.gather(part, features.share_sizes())


def first_rows(features: Features) -> torch.Tensor:
    return features.read(0, 1) if isinstance(features, GalleryRows) else features[:1]
