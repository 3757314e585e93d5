"""Data readers on small files written in the official formats, streams and evaluation sets."""
import contextlib
import os
import pickle
import warnings

import numpy as np
import pytest
import torch
from helpers.data_files import write_cifar10, write_cifar100, write_tiny_imagenet

from cl2r_bench.data.cifar import read_cifar
from cl2r_bench.data.datasets import DataError, load_dataset
from cl2r_bench.data.streams import build_stream, first_per_class, make_class_order, task_class_counts
from cl2r_bench.data.synthetic import make_synthetic
from cl2r_bench.data.tiny_imagenet import read_tiny_imagenet


def test_cifar100_reader_reads_official_pickles(tmp_path):
    write_cifar100(tmp_path)
    with pytest.warns(UserWarning, match="differ from the official release"):
        data = read_cifar("cifar100", tmp_path)
    assert data.train.images.shape == (600, 3, 32, 32) and data.train.images.dtype == torch.uint8
    assert data.test.images.shape == (200, 3, 32, 32)
    assert data.num_classes == 100 and data.class_names[3] == "c3"
    assert torch.equal(data.train.images[:, 0, 0, 0].long(), data.train.labels)


def test_cifar_md5_strict_mode_rejects_unofficial_files(tmp_path):
    write_cifar100(tmp_path)
    with pytest.raises(DataError, match="md5"):
        read_cifar("cifar100", tmp_path, verify="strict")


def test_cifar10_reader_concatenates_five_batches(tmp_path):
    write_cifar10(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data = read_cifar("cifar10", tmp_path)
    assert len(data.train) == 150 and len(data.test) == 30 and data.class_names[9] == "k9"


def test_missing_cifar_names_files_and_flag(tmp_path):
    with pytest.raises(DataError) as err:
        load_dataset("cifar100", tmp_path)
    message = str(err.value)
    assert "cifar-100-python" in message and "--download" in message and "\n" not in message


def test_corrupt_cifar_pickle_is_a_data_error(tmp_path):
    folder = write_cifar100(tmp_path)
    (folder / "train").write_bytes(b"not a pickle")
    with pytest.raises(DataError, match="not a readable CIFAR pickle"):
        read_cifar("cifar100", tmp_path, verify="off")


def test_tiny_imagenet_reader_resizes_sorts_and_converts_grey(tmp_path):
    write_tiny_imagenet(tmp_path)
    data = read_tiny_imagenet(tmp_path, image_size=32)
    assert data.class_names == sorted(data.class_names)
    assert data.train.images.shape == (12, 3, 32, 32) and data.test.images.shape == (3, 3, 32, 32)
    assert data.train.labels.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert int(data.train.images[4, 0].float().mean().round()) == 40
    grey = data.test.images[data.test.labels == 2][0]
    assert torch.equal(grey[0], grey[1]) and int(grey[0].float().mean().round()) == 102
    cached = read_tiny_imagenet(tmp_path, image_size=32)
    assert torch.equal(cached.train.images, data.train.images)


def test_missing_tiny_imagenet_is_one_line(tmp_path):
    with pytest.raises(DataError) as err:
        load_dataset("tinyimagenet", tmp_path)
    assert "tiny-imagenet-200" in str(err.value) and "\n" not in str(err.value)


def test_synthetic_is_deterministic_and_learnable_by_nearest_mean():
    a, b = make_synthetic(num_classes=5, train_per_class=20, test_per_class=10), make_synthetic(
        num_classes=5, train_per_class=20, test_per_class=10)
    assert torch.equal(a.train.images, b.train.images)
    means = torch.stack([a.train.images[a.train.labels == c].float().mean(0).flatten() for c in range(5)])
    predicted = torch.cdist(a.test.images.float().flatten(1), means).argmin(1)
    assert (predicted == a.test.labels).float().mean() > 0.9


def test_paper_splits_and_class_orders():
    assert task_class_counts(10, 15, 7) == [10] + [15] * 6 and sum(task_class_counts(10, 3, 31)) == 100
    assert make_class_order(5, "natural", 0) == [0, 1, 2, 3, 4]
    seeded = make_class_order(100, "seeded", 3)
    assert sorted(seeded) == list(range(100)) and seeded == make_class_order(100, "seeded", 3)
    assert make_class_order(4, [2, 0], 0) == [2, 0, 1, 3]
    with pytest.raises(DataError):
        make_class_order(4, [2, 2], 0)


def test_first_per_class_keeps_dataset_order(tmp_path):
    write_cifar100(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data = read_cifar("cifar100", tmp_path)
    kept = first_per_class(data.train, [5, 7], 2)
    expected = torch.nonzero((data.train.labels == 5) | (data.train.labels == 7)).flatten()[:4]
    assert torch.equal(kept.images, data.train.images[expected])


def test_cifar100_stream_has_the_papers_seven_tasks_and_cifar10_evaluation(tmp_path):
    write_cifar100(tmp_path)
    write_cifar10(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stream = build_stream(dataset="cifar100", data_root=str(tmp_path), initial_classes=10,
                              increment=15, num_tasks=7, images_per_class=5, replacement_tasks=[0, 2, 4],
                              eval_dataset="cifar10")
    assert [len(t.new_classes) for t in stream.tasks] == [10] + [15] * 6
    assert stream.tasks[1].new_classes == list(range(10, 25)) and stream.tasks[6].num_seen_classes == 100
    assert all(len(t.train) == 5 * len(t.new_classes) for t in stream.tasks)
    assert all(set(t.train.labels.tolist()) == set(t.new_classes) for t in stream.tasks)
    assert len(stream.query) == 150 and len(stream.gallery) == 30


def test_heldout_evaluation_classes_are_disjoint_from_the_stream():
    stream = build_stream(dataset="synthetic", data_root="unused", initial_classes=4, increment=3,
                          num_tasks=3, images_per_class=10, class_order="seeded", order_seed=5, replacement_tasks=[],
                          eval_dataset="heldout", heldout_classes=6,
                          synthetic={"synthetic_classes": 20, "synthetic_train_per_class": 12,
                                     "synthetic_test_per_class": 4})
    stream_ids = set(stream.class_order[:10])
    assert set(stream.reserved_classes[10:]).isdisjoint(stream_ids) and len(stream.reserved_classes) == 16
    assert len(stream.query) == 6 * 12 and len(stream.gallery) == 6 * 4
    assert sorted(stream.query.labels.unique().tolist()) == list(range(6))


def test_stream_errors_are_clear():
    with pytest.raises(DataError, match="needs 110 classes"):
        build_stream(dataset="synthetic", data_root="x", initial_classes=20, increment=30,
                     num_tasks=4, images_per_class=5, replacement_tasks=[], eval_dataset="heldout")
    with pytest.raises(DataError, match="replacement task"):
        build_stream(dataset="synthetic", data_root="x", initial_classes=2, increment=2,
                     num_tasks=2, images_per_class=5, replacement_tasks=[5], eval_dataset="heldout")


class Payload:
    """Unpickling this object runs ``os.system`` (the classic pickle exploit)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("verify", ["warn", "off"])
def test_a_cifar_pickle_cannot_run_code(tmp_path, verify):
    write_cifar10(tmp_path)
    marker = tmp_path / "payload-ran"
    with open(tmp_path / "cifar-10-batches-py" / "data_batch_3", "wb") as f:
        pickle.dump({b"labels": [0], b"data": np.zeros((1, 3072), np.uint8), b"extra": Payload(marker)}, f)
    with pytest.warns(UserWarning) if verify == "warn" else contextlib.nullcontext(), pytest.raises(DataError) as error:
        read_cifar("cifar10", tmp_path, verify=verify)
    assert "posix.system" in str(error.value) and "data_batch_3" in str(error.value)
    assert not marker.exists()


def test_pickled_numpy_arrays_of_every_protocol_are_read(tmp_path):
    write_cifar10(tmp_path)
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        with open(tmp_path / "cifar-10-batches-py" / "data_batch_2", "wb") as f:
            pickle.dump({"labels": [3, 4], "data": np.arange(2 * 3072).astype(np.uint8).reshape(2, 3072)}, f,
                        protocol=protocol)
        data = read_cifar("cifar10", tmp_path, verify="off")
        assert data.train.labels.tolist()[30:32] == [3, 4]
