"""Galleries read by rows (benchmarks/gallery_rows.py; docs/scale-out.md, "Galleries of millions"): an adapter's map
stored once per item, the temporary file's life, and reads of ranges."""
import gc
import shutil
import tempfile

import numpy as np
import pytest
import torch

from benchmarks import gallery_rows
from benchmarks.gallery_rows import NpyRows, StoredRows
from benchmarks.ranking import retrieval_scores
from cl2r_bench.distributed import Processes
from cl2r_bench.errors import ConfigError


class CountingMap:
    """A rotation and a scale (as an adapter's map) that counts the rows it maps."""

    def __init__(self, width: int) -> None:
        self.rotation = torch.linalg.qr(torch.randn(width, width, generator=torch.Generator().manual_seed(1)))[0]
        self.rows = 0

    def __call__(self, features: torch.Tensor) -> torch.Tensor:
        self.rows += len(features)
        return 2.0 * features @ self.rotation


@pytest.fixture
def gallery(tmp_path, monkeypatch):
    """150 items of 5 classes in ``gallery.npy``, with their labels; temporary files go to ``tmp_path/scratch``."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 5, (150,), generator=generator)
    features = torch.randn(5, 16, generator=generator)[labels] + torch.randn(150, 16, generator=generator)
    np.save(tmp_path / "gallery.npy", features.numpy())
    return NpyRows(tmp_path / "gallery.npy", chunk_rows=64), features, labels, scratch


def test_a_stored_map_is_applied_once_per_item_however_many_rankings_read_it(gallery):
    """The first ranking's first pass maps the 150 items and writes them; that ranking's counting pass and a second
    ranking read the file, mapping nothing; both rank as the mapped gallery in memory does."""
    rows, features, labels, scratch = gallery
    transform = CountingMap(16)
    stored = rows.mapped(transform, store=True)
    assert isinstance(stored, StoredRows) and stored.shape == (150, 16)
    whole = retrieval_scores(features, labels, transform(features), labels, exclude_self=True)
    before = transform.rows
    first = retrieval_scores(features, labels, stored, labels, exclude_self=True, chunk_elements=3000)
    assert transform.rows - before == 150
    second = retrieval_scores(features, labels, stored, labels, exclude_self=True, chunk_elements=3000)
    assert transform.rows - before == 150
    for scores in (first, second):
        assert np.array_equal(scores.first_rank, whole.first_rank)
        assert scores.mAP == pytest.approx(whole.mAP, abs=1e-9)
    assert len(list(scratch.iterdir())) == 1
    assert rows.mapped(transform, store=True) is stored, "the same map of the same rows is stored once"


def test_the_stored_file_goes_with_the_gallery_and_an_unfinished_pass_leaves_none(gallery):
    rows, _, _, scratch = gallery
    stored = rows.mapped(CountingMap(16), store=True)
    for start, _ in stored.chunks():
        if start > 0:
            break
    assert stored.stored is None and not list(scratch.iterdir()), "a pass left half way stores nothing"
    assert sum(len(chunk) for _, chunk in stored.chunks()) == 150
    assert stored.stored is not None and len(list(scratch.iterdir())) == 1
    del stored
    gc.collect()
    assert not list(scratch.iterdir())


def test_an_identity_map_leaves_the_gallery_as_it_is_and_stores_nothing(gallery):
    """Procrustes' frames hand back the features they are given: no copy of the gallery is written for them."""
    rows, _, _, scratch = gallery
    assert rows.mapped(lambda features: features, store=True) is rows
    assert not list(scratch.iterdir())


@pytest.mark.parametrize("threads, part_bytes", [(gallery_rows.READ_THREADS, gallery_rows.READ_PART_BYTES), (7, 100)])
def test_ranges_are_read_as_stored_and_a_file_cut_short_is_named(gallery, tmp_path, monkeypatch, threads, part_bytes):
    """With 7 threads and parts of 100 bytes, a range is read side by side in parts that split rows and values."""
    monkeypatch.setattr(gallery_rows, "READ_THREADS", threads)
    monkeypatch.setattr(gallery_rows, "READ_PART_BYTES", part_bytes)
    rows, features, _, _ = gallery
    assert torch.equal(rows.read(60, 130), features[60:130])
    assert rows.read(149, 149).shape == (0, 16)
    assert torch.equal(torch.cat([chunk for _, chunk in rows.chunks(40)]), features)
    with (tmp_path / "gallery.npy").open("r+b") as file:
        file.truncate(file.seek(0, 2) - 64)
    with pytest.raises(gallery_rows.GalleryReadError, match="ended before row 150: the file was cut short"):
        rows.read(100, 150)
    with pytest.raises(gallery_rows.GalleryReadError, match="could not be read while the study ran"):
        rows.raw(np.array([3, 149]))        # rows picked through a memory map of the shorter file


def test_a_temporary_folder_without_room_for_a_mapped_gallery_is_named_before_anything_is_written(gallery,
                                                                                                monkeypatch):
    rows, _, _, scratch = gallery
    monkeypatch.setattr(shutil, "disk_usage", lambda folder: shutil._ntuple_diskusage(100, 100, 1000))
    stored = rows.mapped(CountingMap(16), store=True)
    with pytest.raises(ConfigError, match=r"\(0.00 GB\) to the temporary folder .*scratch, which has 0.00 GB free; "
                                          "set TMPDIR"):
        next(stored.chunks())
    assert not list(scratch.iterdir())


def test_each_process_passes_over_whole_chunks_in_the_pieces_one_process_reads(gallery):
    """150 items in chunks of 64: of two processes, the first passes over the first two chunks, the second over the
    last; pieces of 40 rows never cross a chunk, so between them the processes read exactly the pieces, and the
    rows, of one process (an adapter's map of a piece then rounds the same wherever it runs). In one chunk of 200,
    the second process reads one empty piece."""
    rows, _, _, _ = gallery
    alone = [(start, piece) for start, piece in rows.chunks(40)]
    assert [(start, len(piece)) for start, piece in alone] == [(0, 40), (40, 24), (64, 40), (104, 24), (128, 22)]
    shared = [[(start, piece) for start, piece in NpyRows(rows.path, chunk_rows=64, processes=Processes(rank, 2))
               .chunks(40)] for rank in range(2)]
    assert [start for start, _ in shared[0]] == [0, 40, 64, 104] and [start for start, _ in shared[1]] == [128]
    for (start, piece), (start_alone, piece_alone) in zip(shared[0] + shared[1], alone, strict=True):
        assert start == start_alone and torch.equal(piece, piece_alone)
    assert NpyRows(rows.path, chunk_rows=64, processes=Processes(1, 2)).share_sizes() == [128, 22]
    one_chunk = NpyRows(rows.path, chunk_rows=200, processes=Processes(1, 2))
    assert [(start, piece.shape) for start, piece in one_chunk.chunks()] == [(150, (0, 16))]


def test_a_process_stores_the_map_of_its_share_only_and_maps_other_rows_as_they_are_read(gallery):
    rows, features, _, scratch = gallery
    transform = CountingMap(16)
    second = NpyRows(rows.path, chunk_rows=64, processes=Processes(1, 2)).mapped(transform, store=True)
    transform.rows = 0
    first_pass = list(second.chunks())
    assert transform.rows == 22 and [start for start, _ in first_pass] == [128]
    stored = next(scratch.iterdir())
    assert np.load(stored).shape == (22, 16)
    again = list(second.chunks(10))
    assert transform.rows == 22 and [start for start, _ in again] == [128, 138, 148]
    assert torch.equal(torch.cat([piece for _, piece in again]), first_pass[0][1])
    outside = torch.tensor([3, 70, 140])
    assert torch.allclose(second.rows(outside), 2.0 * features[outside] @ transform.rotation, atol=1e-6)
    assert transform.rows == 22 + 3
