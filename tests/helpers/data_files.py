"""Small data sets in the official file formats: CIFAR-10 / CIFAR-100 pickles, Tiny ImageNet folders of JPEGs."""
import pickle

import numpy as np
from PIL import Image


def write_cifar100(root, per_class_train=6, per_class_test=2, classes=100):
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split, per_class in (("train", per_class_train), ("test", per_class_test)):
        labels = [c for _ in range(per_class) for c in range(classes)]
        data = rng.integers(0, 256, size=(len(labels), 3072), dtype=np.uint8)
        data[:, 0] = np.array(labels, dtype=np.uint8)
        with open(folder / split, "wb") as f:
            pickle.dump({b"filenames": [b"x.png"] * len(labels), b"batch_label": split.encode(),
                         b"fine_labels": labels, b"coarse_labels": [c // 5 for c in labels], b"data": data}, f)
    with open(folder / "meta", "wb") as f:
        pickle.dump({b"fine_label_names": [f"c{i}".encode() for i in range(classes)],
                     b"coarse_label_names": [f"s{i}".encode() for i in range(20)]}, f)
    return folder


def write_cifar10(root, per_class=3):
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        labels = list(range(10)) * per_class
        data = np.full((len(labels), 3072), 7, dtype=np.uint8)
        with open(folder / name, "wb") as f:
            pickle.dump({b"labels": labels, b"data": data, b"batch_label": name.encode()}, f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [f"k{i}".encode() for i in range(10)]}, f)


def write_tiny_imagenet(root, classes=3, train_per_class=4):
    folder = root / "tiny-imagenet-200"
    wnids = [f"n{i:08d}" for i in range(classes)]
    (folder / "val" / "images").mkdir(parents=True)
    (folder / "wnids.txt").write_text("\n".join(reversed(wnids)) + "\n")
    lines = []
    for c, wnid in enumerate(wnids):
        (folder / "train" / wnid / "images").mkdir(parents=True)
        for i in range(train_per_class):
            Image.new("RGB", (64, 64),
                      (40 * c, 10 * i, 0)).save(folder / "train" / wnid / "images" / f"{wnid}_{i}.JPEG")
        name = f"val_{c}.JPEG"
        Image.new("L", (64, 64), 100 + c).save(folder / "val" / "images" / name)
        lines.append(f"{name}\t{wnid}\t0\t0\t63\t63")
    (folder / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    return folder
