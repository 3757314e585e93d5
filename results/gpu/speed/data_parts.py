"""The issue-56 data, carried to a lent GPU in parts that each fit the device tool's 64 MiB beside the working tree.

``pack`` (here) reads the decoded 32x32 Tiny ImageNet cache the CPU runs use (``cl2r-cache-32px.npz``) and the
CIFAR-10 pickles, and writes their images as lossless WebP mosaics of 4,096 images (55 % of the raw bytes) with
one ``meta.npz`` (labels, class names, the SHA-256 of every image array) into ``DEST/p1`` ... ``DEST/pK``.
``unpack`` (there) rebuilds the exact arrays from every part it is given, checks each SHA-256, and writes the
folders the suite reads (``tiny-imagenet-200/`` with its cache, ``cifar-10-batches-py/``), so the GPU run sees
the very pixels of the CPU runs.

    python results/gpu/speed/data_parts.py pack DATA_ROOT DEST --first-part-mb 20 --part-mb 46
    python results/gpu/speed/data_parts.py unpack PARTS_DIR DATA_ROOT
"""
from __future__ import annotations

import argparse
import hashlib
import io
import pickle
import sys
from pathlib import Path

import numpy as np
from PIL import Image

CHUNK, COLUMNS = 4096, 64
CIFAR_FILES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


def sha(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def mosaic(images: np.ndarray) -> bytes:
    """``images`` (N, 3, 32, 32) uint8 as one lossless WebP of ``COLUMNS`` images a row."""
    rows = -(-len(images) // COLUMNS)
    padded = np.zeros((rows * COLUMNS, 3, 32, 32), np.uint8)
    padded[: len(images)] = images
    grid = padded.reshape(rows, COLUMNS, 3, 32, 32).transpose(0, 3, 1, 4, 2).reshape(rows * 32, COLUMNS * 32, 3)
    out = io.BytesIO()
    Image.fromarray(grid).save(out, "WEBP", lossless=True, quality=100, method=2)
    return out.getvalue()


def unmosaic(blob: bytes, count: int) -> np.ndarray:
    grid = np.asarray(Image.open(io.BytesIO(blob)).convert("RGB"))
    rows = grid.shape[0] // 32
    return grid.reshape(rows, 32, COLUMNS, 32, 3).transpose(0, 2, 4, 1, 3).reshape(-1, 3, 32, 32)[:count]


def read_sources(root: Path) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    with np.load(root / "tiny-imagenet-200" / "cl2r-cache-32px.npz") as z:
        for key in ("wnids", "train_x", "train_y", "val_x", "val_y"):
            arrays[f"tiny_{key}"] = z[key]
    for name in CIFAR_FILES:
        with open(root / "cifar-10-batches-py" / name, "rb") as f:
            batch = {k.decode() if isinstance(k, bytes) else k: v for k, v in pickle.load(f, encoding="bytes").items()}
        arrays[f"cifar_{name}_x"] = np.asarray(batch["data"], np.uint8).reshape(-1, 3, 32, 32)
        arrays[f"cifar_{name}_y"] = np.asarray(batch["labels"], np.int64)
    with open(root / "cifar-10-batches-py" / "batches.meta", "rb") as f:
        meta = pickle.load(f, encoding="bytes")
    names = meta.get(b"label_names", meta.get("label_names"))
    arrays["cifar_label_names"] = np.array([n.decode() if isinstance(n, bytes) else n for n in names])
    return arrays


def pack(root: Path, dest: Path, first_part_mb: float, part_mb: float) -> None:
    arrays = read_sources(root)
    images = {k: v for k, v in arrays.items() if k.endswith("_x")}
    meta = {k: v for k, v in arrays.items() if not k.endswith("_x")}
    chunks = []
    for key, array in images.items():
        meta[f"sha_{key}"] = np.array(sha(array))
        meta[f"count_{key}"] = np.array(len(array))
        for start in range(0, len(array), CHUNK):
            chunks.append((f"{key}.{start // CHUNK:03d}.webp", mosaic(array[start:start + CHUNK])))
            print(f"\r{len(chunks)} mosaics", end="", file=sys.stderr)
    part, budget, used = 1, first_part_mb * 1e6, 0.0
    (dest / "p1").mkdir(parents=True, exist_ok=True)
    np.savez(dest / "p1" / "meta.npz", **meta)
    for name, blob in chunks:
        if used + len(blob) > budget:
            part, budget, used = part + 1, part_mb * 1e6, 0.0
            (dest / f"p{part}").mkdir(parents=True, exist_ok=True)
        (dest / f"p{part}" / name).write_bytes(blob)
        used += len(blob)
    total = sum(len(b) for _, b in chunks) / 1e6
    print(f"\n{len(chunks)} mosaics, {total:.1f} MB in {part} parts under {dest}", file=sys.stderr)


def unpack(parts: Path, root: Path) -> None:
    meta = dict(np.load(parts / "meta.npz"))
    arrays = {}
    for key in [k[len("count_"):] for k in meta if k.startswith("count_")]:
        files = sorted(parts.glob(f"{key}.*.webp"))
        count = int(meta[f"count_{key}"])
        pieces = [unmosaic(f.read_bytes(), min(CHUNK, count - i * CHUNK)) for i, f in enumerate(files)]
        array = np.concatenate(pieces) if pieces else np.zeros((0, 3, 32, 32), np.uint8)
        if len(array) != count or sha(array) != str(meta[f"sha_{key}"]):
            sys.exit(f"{key}: {len(array)} of {count} images, or their SHA-256 differs: a part is missing or damaged")
        arrays[key] = array
    tiny = root / "tiny-imagenet-200"
    (tiny / "train").mkdir(parents=True, exist_ok=True)
    (tiny / "val").mkdir(exist_ok=True)
    (tiny / "wnids.txt").write_text("\n".join(str(w) for w in meta["tiny_wnids"]) + "\n")
    (tiny / "val" / "val_annotations.txt").write_text("")
    np.savez(tiny / "cl2r-cache-32px.npz", wnids=meta["tiny_wnids"], train_x=arrays["tiny_train_x"],
             train_y=meta["tiny_train_y"], val_x=arrays["tiny_val_x"], val_y=meta["tiny_val_y"])
    cifar = root / "cifar-10-batches-py"
    cifar.mkdir(parents=True, exist_ok=True)
    for name in CIFAR_FILES:
        batch = {"data": arrays[f"cifar_{name}_x"].reshape(-1, 3072), "labels": meta[f"cifar_{name}_y"].tolist()}
        with open(cifar / name, "wb") as f:
            pickle.dump(batch, f)
    with open(cifar / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [str(n) for n in meta["cifar_label_names"]]}, f)
    print(f"unpacked {sum(len(a) for a in arrays.values())} images, every SHA-256 equal, into {root}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack")
    p.add_argument("root", type=Path)
    p.add_argument("dest", type=Path)
    p.add_argument("--first-part-mb", type=float, default=20.0)
    p.add_argument("--part-mb", type=float, default=46.0)
    u = sub.add_parser("unpack")
    u.add_argument("parts", type=Path)
    u.add_argument("root", type=Path)
    args = parser.parse_args()
    if args.command == "pack":
        pack(args.root, args.dest, args.first_part_mb, args.part_mb)
    else:
        unpack(args.parts, args.root)


if __name__ == "__main__":
    main()
