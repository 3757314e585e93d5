"""The SHA-256 of every image and label array the fidelity preset reads, as the suite decodes them from a data root:
Tiny ImageNet's 32x32 cache (train and validation, built from the JPEGs by the suite's own reader) and the CIFAR-10
pickles. Written here (``data_sha.json``) and compared there, so a GPU run says whether it saw the pixels of the CPU
runs (the same JPEGs decoded by another Pillow can differ).

    python -m tools.gpu_data_sha DATA_ROOT [--expect results/gpu/speed/data_sha.json]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import pickle
import sys
from pathlib import Path

import numpy as np

from cl2r_bench.data.tiny_imagenet import read_tiny_imagenet

CIFAR_FILES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


def sha(array: np.ndarray) -> str:
    """The SHA-256 of ``array``'s bytes in C order."""
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def data_sha(root: Path) -> dict[str, str]:
    """``{array name: SHA-256}`` of the Tiny ImageNet cache the suite's reader decodes under ``root`` (it writes the
    cache if absent) and of the CIFAR-10 pickles' images and labels."""
    tiny = read_tiny_imagenet(root)
    digests = {"tiny_train_x": sha(tiny.train.images.numpy()), "tiny_train_y": sha(tiny.train.labels.numpy()),
               "tiny_val_x": sha(tiny.test.images.numpy()), "tiny_val_y": sha(tiny.test.labels.numpy())}
    for name in CIFAR_FILES:
        with open(root / "cifar-10-batches-py" / name, "rb") as f:
            batch = pickle.load(f, encoding="bytes")
        batch = {k.decode() if isinstance(k, bytes) else k: v for k, v in batch.items()}
        digests[f"cifar_{name}_x"] = sha(np.asarray(batch["data"], np.uint8))
        digests[f"cifar_{name}_y"] = sha(np.asarray(batch["labels"], np.int64))
    return digests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--expect", type=Path)
    args = parser.parse_args()
    digests = data_sha(args.root)
    if args.expect is None:
        print(json.dumps(digests, indent=1))
        return
    expected = json.loads(args.expect.read_text())
    differ = sorted(k for k in expected if digests.get(k) != expected[k])
    print("every SHA-256 equal" if not differ else f"SHA-256 differs for {', '.join(differ)}")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
