"""``cifar100`` / ``cifar10``: the official ``cifar-100-python`` / ``cifar-10-batches-py`` pickles (METHODS.md §3),
read by this module (torchvision's classes insist on the official md5 sums; here a mismatch is a notice, or an error
with ``data.verify=strict``). ``download`` fetches the official archives with torchvision's downloader. The pickles
are read by an unpickler that builds only what CIFAR files hold, so a tampered copy cannot run code.
"""
from __future__ import annotations

import pickle
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cl2r_bench.data.datasets import (
    DataError,
    DataNotice,
    DataSet,
    DataSplits,
    ImageSet,
    download_archive,
    file_md5,
    register_dataset,
)
from cl2r_bench.settings import VERIFY_MODES

CIFAR_RELEASES = {
    "cifar100": {
        "folder": "cifar-100-python", "train": ["train"], "test": ["test"], "label_key": "fine_labels",
        "meta": ("meta", "fine_label_names"),
        "url": "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
        "archive_md5": "eb9058c3a382ffc7106e4002c42a8d85",
        "md5": {"train": "16019d7e3df5f24257cddd939b257f8d", "test": "f0ef6b0ae62326f3e7ffdfab6717acfc",
                "meta": "7973b15100ade9c7d40fb424638fde48"},
    },
    "cifar10": {
        "folder": "cifar-10-batches-py", "train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"],
        "label_key": "labels", "meta": ("batches.meta", "label_names"),
        "url": "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
        "archive_md5": "c58f30108f718f92721af3b95e74349a",
        "md5": {"data_batch_1": "c99cafc152244af753f735de768cd75f", "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
                "data_batch_3": "54ebc095f3ab1f0389bbae665268c751", "data_batch_4": "634d18415352ddfa80567beed471001a",
                "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb", "test_batch": "40351d587109b95175f43aff81a1287e",
                "batches.meta": "5ff9c542aee3614f3951f8cda6e48888"},
    },
}
TINY_URL, TINY_MD5 = "http://cs231n.stanford.edu/tiny-imagenet-200.zip", "90528d7ca1a48142e341f4ef8d21d0de"


def _latin1_bytes(text: str, encoding: str = "latin1") -> bytes:
    """``_codecs.encode`` as Python 3 pickles (protocol <= 2) use it for bytes, restricted to that use."""
    if encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError(f"encoding {encoding!r} is not used by CIFAR pickles")
    return text.encode(encoding)


def _empty_bytes() -> bytes:
    """``bytes()``, as protocol 2 pickles an empty bytes object (the data of an empty array)."""
    return b""


def _numpy_globals() -> dict[tuple[str, str], object]:
    from numpy._core import multiarray, numeric

    allowed = {"ndarray": np.ndarray, "dtype": np.dtype}
    for package in ("numpy.core", "numpy._core"):
        allowed[(f"{package}.multiarray", "_reconstruct")] = multiarray._reconstruct
        allowed[(f"{package}.multiarray", "scalar")] = multiarray.scalar
        allowed[(f"{package}.numeric", "_frombuffer")] = numeric._frombuffer
    return {("numpy", k) if isinstance(k, str) else k: v for k, v in allowed.items()}


class _CifarUnpickler(pickle.Unpickler):
    """An unpickler that builds only what CIFAR files hold (builtin containers, bytes, text, numbers and numpy
    arrays): any other global, i.e. anything that could run code on loading, is refused. Used whatever
    ``data.verify`` says, so a tampered copy cannot execute anything."""

    ALLOWED = {("_codecs", "encode"): _latin1_bytes, ("__builtin__", "bytes"): _empty_bytes,
               ("builtins", "bytes"): _empty_bytes}

    def find_class(self, module: str, name: str) -> object:
        allowed = {**self.ALLOWED, **_numpy_globals()}
        if (module, name) not in allowed:
            raise pickle.UnpicklingError(f"it refers to {module}.{name}, which CIFAR files never hold")
        return allowed[(module, name)]


def _unpickle(path: Path) -> dict:
    """A CIFAR pickle with text keys, read by :class:`_CifarUnpickler`: the official (Python 2) files give byte
    keys, copies written by Python 3 (torchvision's reader expects those) give text keys; both are read alike."""
    try:
        with open(path, "rb") as f:
            content = _CifarUnpickler(f, encoding="bytes").load()
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, AttributeError, TypeError, IndexError,
            RecursionError, MemoryError) as exc:
        raise DataError(f"{path} is not a readable CIFAR pickle ({exc}); delete it and pass --download") from None
    if not isinstance(content, dict):
        raise DataError(f"{path} is not a CIFAR pickle (it holds a {type(content).__name__}, not a dict); delete it "
                        "and pass --download")
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in content.items()}


def read_cifar(name: str, root: str | Path, *, download: bool = False, verify: str = "warn") -> DataSplits:
    """Read CIFAR-10/100 from the official pickles under ``root/<folder>``.

    ``verify``: ``"warn"`` (a notice when the md5 sums differ from the official release, e.g. a JPEG-decoded
    copy), ``"strict"`` (an error) or ``"off"``.
    """
    if verify not in VERIFY_MODES:
        raise DataError(f"data.verify must be one of {list(VERIFY_MODES)}, not {verify!r}")
    spec = CIFAR_RELEASES[name]
    root = Path(root)
    folder = root / spec["folder"]
    files = spec["train"] + spec["test"] + [spec["meta"][0]]
    missing = [f for f in files if not (folder / f).is_file()]
    if missing and download:
        download_archive(spec["url"], root, spec["archive_md5"])
        missing = [f for f in files if not (folder / f).is_file()]
    if missing:
        raise DataError(f"{name}: expected {', '.join(files)} in {folder} (missing {missing[0]}); pass --download "
                        f"or --data-root pointing to the folder that holds {spec['folder']}/")
    if verify != "off":
        bad = [f for f in files if file_md5(folder / f) != spec["md5"].get(f)]
        if bad and verify == "strict":
            raise DataError(f"{name}: md5 of {', '.join(bad)} in {folder} differs from the official release; "
                            "re-download with --download or set data.verify to warn")
        if bad:
            warnings.warn(f"{name}: {len(bad)} of {len(files)} files in {folder} differ from the official release "
                          f"(md5 of {bad[0]}, ...); reading them as they are (e.g. a JPEG-decoded copy), so results "
                          "are not comparable to the official images; set data.verify=strict to refuse them",
                          DataNotice, stacklevel=2)

    def split(parts: list[str]) -> ImageSet:
        batches = [_unpickle(folder / p) for p in parts]
        data = np.concatenate([np.asarray(b["data"], dtype=np.uint8) for b in batches])
        labels = np.concatenate([np.asarray(b[spec["label_key"]], dtype=np.int64) for b in batches])
        return ImageSet(torch.from_numpy(data.reshape(-1, 3, 32, 32).copy()), torch.from_numpy(labels))

    names = [n.decode() if isinstance(n, bytes) else n for n in _unpickle(folder / spec["meta"][0])[spec["meta"][1]]]
    return DataSplits(name, split(spec["train"]), split(spec["test"]), names)



@register_dataset("cifar100")
class Cifar100(DataSet):
    classes, native_size = 100, 32

    def load(self, root: Path, *, download: bool, image_size: int, verify: str, **options: Any) -> DataSplits:
        return read_cifar(self.name, root, download=download, verify=verify)


@register_dataset("cifar10")
class Cifar10(Cifar100):
    classes = 10
