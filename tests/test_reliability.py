"""Issue 16: hostile files, diverged runs, unsafe names, concurrent runs, damaged run folders, late errors."""
import contextlib
import os
import pickle

import numpy as np
import pytest

from scenarios.datasets import DataError, read_cifar
from test_data import write_cifar10


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
