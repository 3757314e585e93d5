"""``tinyimagenet``: the standard ``tiny-imagenet-200/`` folder (``train/<wnid>/images``, ``val/images`` with
``val_annotations.txt``; METHODS.md §4), resized to ``data.image_size`` (default 32x32), the decoded images cached as
``.npz`` beside the data when the folder is writable.
"""
from __future__ import annotations

import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cl2r_bench.data.datasets import DataError, DataSet, DataSplits, ImageSet, download_archive, register_dataset

TINY_URL, TINY_MD5 = "http://cs231n.stanford.edu/tiny-imagenet-200.zip", "90528d7ca1a48142e341f4ef8d21d0de"


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
        download_archive(TINY_URL, root, TINY_MD5)
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


@register_dataset("tinyimagenet")
class TinyImageNet(DataSet):
    classes, native_size = 200, 64

    def load(self, root: Path, *, download: bool, image_size: int, verify: str, **options: Any) -> DataSplits:
        return read_tiny_imagenet(root, download=download, image_size=image_size)
