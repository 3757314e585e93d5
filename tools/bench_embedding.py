"""Embedding speed of the feature cache's path against a plain PyTorch loop on the same encoder and batches.

The suite embeds a split through :func:`cl2r_bench.feature_cache.embed_raw` (the encoder's own preprocessing inside
the model, :func:`cl2r_bench.models.forward_in_batches`, autocast on a GPU). The plain loop does by hand what a user
would write: each batch scaled to [0, 1], resized, centre-cropped and standardised with torchvision's functional
ops, then the trunk under ``torch.inference_mode``. Both run the same images in the same batches, interleaved over
``--repeats`` so that the machine's load hits both alike; the figure is images/s and the ratio suite / plain (the
target is at least 0.9).

    python -m tools.bench_embedding --spec timm:tf_efficientnet_lite0@FILE [--images 256] [--size 32]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from cl2r_bench.app.assembly import resolve_device
from cl2r_bench.encoders import build_encoder
from cl2r_bench.feature_cache import embed_raw
from cl2r_bench.models import autocast_dtype


def plain_loop(encoder, images: torch.Tensor, batch_size: int, device: torch.device, amp: str) -> torch.Tensor:
    """The hand-written loop: preprocessing as the encoder's, then its trunk, batch by batch."""
    from torchvision.transforms.v2 import InterpolationMode
    from torchvision.transforms.v2 import functional as TF

    p = encoder.preprocessing
    trunk = encoder.backbone.trunk
    dtype = autocast_dtype(amp, device)
    out = []
    with torch.inference_mode(), torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
        for start in range(0, len(images), batch_size):
            x = images[start:start + batch_size].to(device).float() / 255.0
            x = TF.resize(x, [p.resize_size], interpolation=InterpolationMode(p.interpolation), antialias=True)
            x = TF.normalize(TF.center_crop(x.clamp(0, 1), [p.input_size]), list(p.mean), list(p.std))
            out.append(trunk(x).float().cpu())
    return torch.cat(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", required=True, help="an encoder spec (cl2r_bench/encoders.py)")
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--size", type=int, default=32, help="side of the stored images (32: CIFAR, 64: Tiny ImageNet)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--amp", default="float16")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    encoder = build_encoder(args.spec).to(device)
    images = torch.randint(0, 256, (args.images, 3, args.size, args.size), dtype=torch.uint8,
                           generator=torch.Generator().manual_seed(0))
    suite = lambda: embed_raw(encoder, images, device=device, batch_size=args.batch_size, amp=args.amp,  # noqa: E731
                              progress=False, description="")
    plain = lambda: plain_loop(encoder, images, args.batch_size, device, args.amp)  # noqa: E731
    difference = float((suite() - plain()).abs().max())
    seconds: dict[str, list[float]] = {"suite": [], "plain": []}
    for _ in range(args.repeats):
        for name, run in (("suite", suite), ("plain", plain)):
            if device.type == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            run()
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds[name].append(time.perf_counter() - started)
    rate = {name: args.images / statistics.median(values) for name, values in seconds.items()}
    result = {"spec": args.spec, "device": str(device), "images": args.images, "stored_size": args.size,
              "input_size": encoder.preprocessing.input_size, "batch_size": args.batch_size,
              "suite_images_per_second": rate["suite"], "plain_images_per_second": rate["plain"],
              "ratio": rate["suite"] / rate["plain"], "max_feature_difference": difference,
              "torch": torch.__version__, "threads": torch.get_num_threads()}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{args.spec} on {device}: suite {rate['suite']:.1f} images/s, plain loop {rate['plain']:.1f} images/s, "
              f"ratio {result['ratio']:.3f} (median of {args.repeats}; {args.images} images {args.size}px -> "
              f"{result['input_size']}px, batch {args.batch_size}; features differ by at most {difference:.2e})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
