"""Data sets as uint8 image tensors, read from their official on-disk formats (METHODS.md §3-§4).

* ``cifar100`` / ``cifar10``: the official ``cifar-100-python`` / ``cifar-10-batches-py`` pickles, read by this
  module (torchvision's classes insist on the official md5 sums; here a mismatch is a notice, or an error
  with ``verify="strict"``). ``download=True`` fetches the official archives with torchvision's downloader.
* ``tinyimagenet``: the standard ``tiny-imagenet-200/`` folder (``train/<wnid>/images``, ``val/images`` with
  ``val_annotations.txt``), optionally resized (default 32x32), cached as ``.npz`` beside the data when possible.
* ``synthetic``: a deterministic generated data set with class structure (coarse colour layouts, random shifts
  and noise) that a small CNN learns in seconds; for tests and offline demos.

Every reader returns a :class:`DataSplits` of :class:`ImageSet` (``N x 3 x H x W`` uint8, int64 labels).
"""
from __future__ import annotations

import hashlib
import pickle
import warnings
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from cl2r_bench.settings import DATASETS, VERIFY_MODES

CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4867, 0.4408), (0.2675, 0.2565, 0.2761)
SYNTHETIC_MEAN, SYNTHETIC_STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)

_CIFAR = {
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
CLASS_COUNTS = {"cifar100": 100, "cifar10": 10, "tinyimagenet": 200}
NATIVE_IMAGE_SIZES = {"cifar100": 32, "cifar10": 32, "tinyimagenet": 64}
"""The side of each real data set's images as released (the generated one is as large as configured)."""


class DataError(RuntimeError):
    """Data are missing or unreadable; the message says which files were expected and how to get them."""


class DataNotice(UserWarning):
    """Data are usable but not what the official release ships (the runner prints it as one ``notice:`` line)."""


@dataclass
class ImageSet:
    """Images (``N x 3 x H x W`` uint8) with integer labels."""

    images: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return len(self.labels)

    def select(self, index: torch.Tensor) -> ImageSet:
        return ImageSet(self.images[index], self.labels[index])

    def digest(self) -> str:
        """sha256 of the images' shape, dtype and bytes and of the labels: the identity of the data, for cache keys
        that must change with every setting that changes the data."""
        digest = hashlib.sha256(f"{tuple(self.images.shape)}|{self.images.dtype}".encode())
        digest.update(self.images.cpu().contiguous().numpy().tobytes())
        digest.update(self.labels.cpu().to(torch.int64).numpy().tobytes())
        return digest.hexdigest()


@dataclass
class DataSplits:
    """A data set's train and test splits, its class names and normalisation statistics."""

    name: str
    train: ImageSet
    test: ImageSet
    class_names: list[str]
    mean: tuple[float, float, float] = CIFAR100_MEAN
    std: tuple[float, float, float] = CIFAR100_STD

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


def load_dataset(name: str, root: str | Path, *, download: bool = False, image_size: int = 32,
                 verify: str = "warn", synthetic_classes: int = 60, synthetic_train_per_class: int = 120,
                 synthetic_test_per_class: int = 30, synthetic_noise: float = 0.08,
                 synthetic_similarity: float = 0.0) -> DataSplits:
    """Load data set ``name`` from ``root`` (see the module docstring for the layouts)."""
    if name in _CIFAR:
        return read_cifar(name, root, download=download, verify=verify)
    if name == "tinyimagenet":
        return read_tiny_imagenet(root, download=download, image_size=image_size)
    if name == "synthetic":
        return make_synthetic(num_classes=synthetic_classes, train_per_class=synthetic_train_per_class,
                              test_per_class=synthetic_test_per_class, image_size=image_size, noise=synthetic_noise,
                              similarity=synthetic_similarity)
    raise DataError(f"unknown data set {name!r}; choose from {list(DATASETS)}")


def dataset_statistics(name: str) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """``(mean, std)`` that a model trained on data set ``name`` normalises with (every real data set uses CIFAR-100's,
    as the authors' code does; METHODS.md §4), known before reading it."""
    return (SYNTHETIC_MEAN, SYNTHETIC_STD) if name == "synthetic" else (CIFAR100_MEAN, CIFAR100_STD)


def class_count(name: str, synthetic_classes: int) -> int:
    """How many classes data set ``name`` has (``synthetic``: as configured), known before reading it."""
    return synthetic_classes if name == "synthetic" else CLASS_COUNTS[name]


def _md5(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _download(url: str, root: Path, md5: str) -> None:
    from torchvision.datasets.utils import download_and_extract_archive

    try:
        download_and_extract_archive(url, str(root), md5=md5)
    except Exception as exc:  # noqa: BLE001 - network errors come in many types
        raise DataError(f"download of {url} failed ({type(exc).__name__}: {exc}); download it by hand and "
                        f"extract it into {root}") from None


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
    spec = _CIFAR[name]
    root = Path(root)
    folder = root / spec["folder"]
    files = spec["train"] + spec["test"] + [spec["meta"][0]]
    missing = [f for f in files if not (folder / f).is_file()]
    if missing and download:
        _download(spec["url"], root, spec["archive_md5"])
        missing = [f for f in files if not (folder / f).is_file()]
    if missing:
        raise DataError(f"{name}: expected {', '.join(files)} in {folder} (missing {missing[0]}); pass --download "
                        f"or --data-root pointing to the folder that holds {spec['folder']}/")
    if verify != "off":
        bad = [f for f in files if _md5(folder / f) != spec["md5"].get(f)]
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


def _read_jpeg(path: Path, size: int) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as img:
        img = img.convert("RGB")
        if img.size != (size, size):
            img = img.resize((size, size), Image.BILINEAR)
        return np.asarray(img, dtype=np.uint8).transpose(2, 0, 1)


def _read_images(paths: list[Path], size: int) -> torch.Tensor:
    from tqdm import tqdm

    with ThreadPoolExecutor(max_workers=4) as pool:
        arrays = list(tqdm(pool.map(lambda p: _read_jpeg(p, size), paths, chunksize=256), total=len(paths),
                           desc=f"reading {len(paths)} JPEGs", leave=False, mininterval=2.0,
                           disable=len(paths) < 5000))
    return torch.from_numpy(np.stack(arrays)) if arrays else torch.zeros(0, 3, size, size, dtype=torch.uint8)


def read_tiny_imagenet(root: str | Path, *, download: bool = False, image_size: int = 32) -> DataSplits:
    """Read ``root/tiny-imagenet-200`` (classes in sorted wnid order), resized to ``image_size``."""
    root = Path(root)
    folder = root / "tiny-imagenet-200"
    if not (folder / "wnids.txt").is_file() and download:
        _download(TINY_URL, root, TINY_MD5)
    needed = [folder / "wnids.txt", folder / "train", folder / "val" / "val_annotations.txt"]
    missing = [p for p in needed if not p.exists()]
    if missing:
        raise DataError(f"tinyimagenet: expected wnids.txt, train/<wnid>/images/ and val/val_annotations.txt in "
                        f"{folder} (missing {missing[0].name}); pass --download or --data-root pointing to the "
                        "folder that holds tiny-imagenet-200/")
    cache = folder / f"cl2r-cache-{image_size}px.npz"
    if cache.is_file():
        try:
            with np.load(cache) as z:
                wnids = [str(w) for w in z["wnids"]]
                return DataSplits("tinyimagenet",
                                  ImageSet(torch.from_numpy(z["train_x"]), torch.from_numpy(z["train_y"])),
                                  ImageSet(torch.from_numpy(z["val_x"]), torch.from_numpy(z["val_y"])), wnids)
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
            raise DataError(f"the decoded-image cache {cache} is damaged ({type(exc).__name__}); delete it and it is "
                            "rebuilt from the JPEGs") from None
    wnids = sorted(w.strip() for w in (folder / "wnids.txt").read_text().split() if w.strip())
    label_of = {w: i for i, w in enumerate(wnids)}
    train_paths, train_y = [], []
    for wnid in wnids:
        files = sorted((folder / "train" / wnid / "images").glob("*.JPEG"))
        if not files:
            raise DataError(f"tinyimagenet: no images in {folder / 'train' / wnid / 'images'}; the copy is incomplete")
        train_paths += files
        train_y += [label_of[wnid]] * len(files)
    val_paths, val_y = [], []
    for line in (folder / "val" / "val_annotations.txt").read_text().splitlines():
        fields = line.split("\t")
        if len(fields) >= 2 and fields[1] in label_of:
            val_paths.append(folder / "val" / "images" / fields[0])
            val_y.append(label_of[fields[1]])
    train = ImageSet(_read_images(train_paths, image_size), torch.tensor(train_y))
    val = ImageSet(_read_images(val_paths, image_size), torch.tensor(val_y))
    try:
        np.savez(cache, wnids=np.array(wnids), train_x=train.images.numpy(), train_y=train.labels.numpy(),
                 val_x=val.images.numpy(), val_y=val.labels.numpy())
    except OSError:
        pass  # read-only data folder: decode again next time
    return DataSplits("tinyimagenet", train, val, wnids)


def make_synthetic(*, num_classes: int = 60, train_per_class: int = 120, test_per_class: int = 30,
                   image_size: int = 32, seed: int = 0, noise: float = 0.08, similarity: float = 0.0) -> DataSplits:
    """A deterministic data set with learnable class structure.

    Each class is a random 4x4 colour layout upsampled to ``image_size``; each image is its class layout shifted
    by up to 1/8 of the image, with per-image brightness jitter and pixel noise of std ``noise``. Two difficulty
    knobs: ``noise``, and ``similarity`` in [0, 1), the share of every class layout that is one layout common to
    all classes (0: classes as different as random layouts; near 1: classes told apart by small differences).
    Identical for every run seed. The defaults are the plain generator (speed benchmarks); runs take the
    ``data.synthetic_*`` settings (configs/default.yaml), chosen so that the suite's models reach the accuracy
    they reach on real data (docs/configuration.md).
    """
    rng = np.random.default_rng(seed)
    own = rng.uniform(0.1, 0.9, size=(num_classes, 3, 4, 4))
    common = np.random.default_rng([seed, 1]).uniform(0.1, 0.9, size=(1, 3, 4, 4))  # apart: own draws unchanged
    layouts = torch.from_numpy((similarity * common + (1 - similarity) * own).astype(np.float32))
    layouts = torch.nn.functional.interpolate(layouts, size=(image_size, image_size), mode="bilinear",
                                              align_corners=False)

    def split(per_class: int) -> ImageSet:
        labels = torch.arange(num_classes).repeat_interleave(per_class)
        images = layouts[labels].clone()
        max_shift = max(1, image_size // 8)
        shifts = rng.integers(-max_shift, max_shift + 1, size=(len(labels), 2))
        for i, (dy, dx) in enumerate(shifts):
            images[i] = torch.roll(images[i], shifts=(int(dy), int(dx)), dims=(1, 2))
        brightness = torch.from_numpy(rng.uniform(0.8, 1.2, size=(len(labels), 1, 1, 1)).astype(np.float32))
        pixel_noise = torch.from_numpy(rng.normal(0, noise, size=images.shape).astype(np.float32))
        images = (images * brightness + pixel_noise).clamp(0, 1)
        return ImageSet((images * 255).round().to(torch.uint8), labels)

    return DataSplits("synthetic", split(train_per_class), split(test_per_class),
                      [f"class_{i:03d}" for i in range(num_classes)], mean=SYNTHETIC_MEAN, std=SYNTHETIC_STD)
