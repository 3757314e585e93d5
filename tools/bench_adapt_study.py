"""The whole ``runner.py adapt`` evaluation against one plain leave-one-out ranking, timed in the same run.

A synthetic pair of ``--n`` test items (``--classes`` classes, ``--dim`` wide; the new model a noisy rotation of
the old one) and ``--fit`` fitting items is written as the two ``.npz`` files ``adapt`` reads. Then, one after the
other in this process:

* **adapt**: ``runner.py adapt --adapter procrustes`` (by default) on them, everything included: reading the
  files, the fit, every case, both backfilling curves (random and class-mean L2, 11 steps each) and the records;
* **reference**: one leave-one-out ranking of the old features in plain numpy, as the FCT authors' evaluation
  does it: a matrix product and a full sort of every query's row (``np.argsort``), then CMC top-1 / top-5 and mAP
  from the sorted relevance.

It prints both times and their ratio against the goal (:data:`GOAL`; docs/adapters.md, "Cost of a study"), the CPU
seconds of each (every thread's: on cores that other work shares, the wall times depend on that work, the CPU
seconds much less), and with ``--json`` one line of JSON with the figures, the versions and the machine's threads.

    python -m tools.bench_adapt_study [--n 50000] [--dim 512] [--classes 100] [--fit 5000] [--json]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from cl2r_bench.app.cli import main as runner

GOAL = 1.0
"""The most the whole study may take, in plain rankings of the same queries (docs/adapters.md, "Cost of a study")."""


def synthetic_pair(n: int, dim: int, classes: int, seed: int) -> dict[str, np.ndarray]:
    """Old features of clustered classes; the new ones a rotation of them with fresh noise."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, size=n)
    centres = np.random.default_rng(0).normal(size=(classes, dim)).astype(np.float32)
    old = centres[labels] + 1.5 * rng.normal(size=(n, dim)).astype(np.float32)
    rotation = np.linalg.qr(np.random.default_rng(1).normal(size=(dim, dim)))[0].astype(np.float32)
    new = (old + 0.5 * rng.normal(size=(n, dim)).astype(np.float32)) @ rotation
    return {"old": old.astype(np.float32), "new": new.astype(np.float32), "labels": labels}


def reference_ranking(features: np.ndarray, labels: np.ndarray, rows: int = 1000) -> dict[str, float]:
    """Leave-one-out top-1, top-5 and mAP (percent) by a matrix product and a full sort of each query's row."""
    x = features / np.linalg.norm(features, axis=1, keepdims=True)
    top1 = top5 = 0
    ap_sum, with_positive = 0.0, 0
    ranks = np.arange(1, len(x) + 1)
    for start in range(0, len(x), rows):
        block = x[start:start + rows] @ x.T
        own = np.arange(start, start + len(block))
        block[np.arange(len(block)), own] = -np.inf
        order = np.argsort(-block, axis=1)
        relevant = (labels[order] == labels[own, None]) & (order != own[:, None])
        top1 += int(relevant[:, 0].sum())
        top5 += int(relevant[:, :5].any(axis=1).sum())
        positives = relevant.sum(axis=1)
        precision = (np.cumsum(relevant, axis=1) / ranks * relevant).sum(axis=1)
        has = positives > 0
        ap_sum += float((precision[has] / positives[has]).sum())
        with_positive += int(has.sum())
    return {"top1": 100 * top1 / len(x), "top5": 100 * top5 / len(x), "mAP": 100 * ap_sum / max(with_positive, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=50000, help="test items: queries and gallery")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--fit", type=int, default=5000, help="fitting items")
    parser.add_argument("--adapter", nargs="+", default=["procrustes"])
    parser.add_argument("--queries", type=int, help="adapt --queries N: a seeded sample of N queries against the "
                        "whole gallery (the reference still ranks every query)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        paths = {}
        for split, n, seed in (("train", args.fit, 2), ("test", args.n, 3)):
            paths[split] = Path(folder) / f"{split}.npz"
            np.savez(paths[split], **synthetic_pair(n, args.dim, args.classes, seed))
        test = synthetic_pair(args.n, args.dim, args.classes, 3)
        started, cpu_started = time.perf_counter(), time.process_time()
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            code = runner(["adapt", "--train", str(paths["train"]), "--test", str(paths["test"]), "--adapter",
                           *args.adapter, "--output", str(Path(folder) / "out"), "--device", "cpu",
                           *([] if args.queries is None else ["--queries", str(args.queries)]),
                           "--set", "model_update.backfill_orders=[random,class_mean_distance]"])
        adapt_seconds, adapt_cpu = time.perf_counter() - started, time.process_time() - cpu_started
        if code != 0:
            print(printed.getvalue())
            return code
        started, cpu_started = time.perf_counter(), time.process_time()
        reference = reference_ranking(test["old"], test["labels"])
        reference_seconds, reference_cpu = time.perf_counter() - started, time.process_time() - cpu_started
        record = json.loads(next((Path(folder) / "out").rglob("metrics.json")).read_text())
    old_old = record["retrieval"]["cases"]["old/old"]
    result = {"n": args.n, "dim": args.dim, "classes": args.classes, "fit": args.fit, "adapter": args.adapter,
              "queries": args.queries,
              "adapt_seconds": adapt_seconds, "reference_seconds": reference_seconds,
              "ratio": adapt_seconds / reference_seconds, "goal": GOAL, "adapt_cpu_seconds": adapt_cpu,
              "reference_cpu_seconds": reference_cpu, "reference_old_old": reference, "suite_old_old": old_old,
              "torch": torch.__version__, "numpy": np.__version__, "threads": torch.get_num_threads(),
              "processor": platform.processor() or platform.machine()}
    if args.json:
        print(json.dumps(result))
    else:
        sampled = "" if args.queries is None else f", {args.queries} sampled queries"
        print(f"{args.n} x {args.dim}, {args.classes} classes{sampled}, adapter {' '.join(args.adapter)}: whole adapt "
              f"evaluation {adapt_seconds:.1f}s; one numpy leave-one-out ranking {reference_seconds:.1f}s; ratio "
              f"{result['ratio']:.2f} (goal: at most {GOAL:g}); CPU seconds (every thread) {adapt_cpu:.1f} and "
              f"{reference_cpu:.1f}")
        print(f"old/old top-1 / top-5 / mAP: suite {old_old['top1']:.2f} / {old_old['top5']:.2f} / "
              f"{old_old['mAP']:.4f}, reference {reference['top1']:.2f} / {reference['top5']:.2f} / "
              f"{reference['mAP']:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
