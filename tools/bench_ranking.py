"""Time and peak memory of the leave-one-out ranking (:func:`benchmarks.ranking.retrieval_scores`) on an n x n split.

Random clustered features (``--classes`` clusters, ``--dim`` wide) are scored with the test split as query and
gallery, each query's own item left out, as the adapter papers' protocol does on a 50,000-image test split
(docs/METHODS.md §7b). Peak memory is the process's resident high-water mark (``VmHWM``) on the CPU and
``torch.cuda.max_memory_allocated`` on a GPU, both against what the features alone take.

    python -m tools.bench_ranking [--n 50000] [--dim 1280] [--device cpu] [--json]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks.ranking import retrieval_scores
from cl2r_bench.app.assembly import resolve_device


def resident_high_water_gb(process: int | str = "self") -> float | None:
    """The peak resident memory so far (Linux ``VmHWM``) of this process or of the process ``process``, in GB
    (GiB); None elsewhere or once the process is gone."""
    try:
        text = Path(f"/proc/{process}/status").read_text()
    except OSError:
        return None
    line = next((entry for entry in text.splitlines() if entry.startswith("VmHWM:")), None)
    return None if line is None else int(line.split()[1]) / 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=50000)
    parser.add_argument("--dim", type=int, default=1280)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--chunk-elements", type=int, help="similarities per block (default: the ranking's own)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, args.classes, (args.n,), generator=generator)
    centres = torch.randn(args.classes, args.dim, generator=generator)
    features = (centres[labels] + 2.0 * torch.randn(args.n, args.dim, generator=generator)).to(device)
    labels = labels.to(device)
    before = resident_high_water_gb()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    scores = retrieval_scores(features, labels, features, labels, exclude_self=True,
                              chunk_elements=args.chunk_elements)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else resident_high_water_gb()
    result = {"n": args.n, "dim": args.dim, "device": str(device), "seconds": seconds, "peak_memory_gb": peak,
              "memory_before_gb": before, "features_gb": features.numel() * 4 / 2**30,
              "chunk_elements": args.chunk_elements, "scores": scores.as_dict(), "torch": torch.__version__,
              "threads": torch.get_num_threads()}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{args.n} x {args.n} leave-one-out ranking ({args.dim}-d) on {device}: {seconds:.1f}s, peak memory "
              f"{peak:.2f} GB (features {result['features_gb']:.2f} GB, process before {before:.2f} GB); top-1 "
              f"{scores.top1:.2f}, mAP {scores.mAP:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
