"""Each learned adapter's fit time and accuracy against Procrustes's, on one pair of embeddings, in the same run.

Two spaces that share class structure (a new user's first try at ``adapt``): ``--classes`` classes, old
``--old-dim`` wide, new ``--new-dim`` wide (a better new model: :func:`paired_spaces`), ``--fit`` fitting and
``--test`` test items. Each adapter is fitted by ``runner.py adapt``'s own code
(:func:`cl2r_bench.adapter_study.evaluate_adapter`, default parameters, one seed) and measured on the test split. It
prints, per adapter, the fit time, its ratio to Procrustes's, the steps and whether the fit converged, and the cross
case's top-1 beside Procrustes's; ``--json`` adds one JSON line. The goal (docs/adapters.md, "Fit times"): each learned
fit within a minute at 3,000 x 256 on 2 CPU cores. Measure on an idle machine: another heavy process slows every
fit, by more than its share of the cores (two torch processes on 2 cores made a 1-minute fit take half an hour).

    python -m tools.bench_adapter_fits [--fit 3000] [--test 2000] [--old-dim 128] [--new-dim 256] [--classes 80]
"""
from __future__ import annotations

import argparse
import json
import platform

import numpy as np
import torch

from benchmarks.adapted_cases import WATCHING, PairedFeatures
from benchmarks.record import cross_case
from cl2r_bench.adapter_study import Study, evaluate_adapter

ADAPTERS = ("procrustes", "lambda_orth", "fct", "fastfill")
NOISE = 2.0
"""How far, per dimension, the old model places an item from its class centre (old/old top-1 about 80 %)."""
"""Each item's spread around its class centre, per dimension (the new space adds half of it again): old/old top-1
near 70 % at the defaults, so that no adapter saturates."""


def paired_spaces(items: int, classes: int, old_dim: int, new_dim: int, seed: int) -> PairedFeatures:
    """``items`` of ``classes`` clustered classes: the old model sees each item's offset from its class centre in
    full (:data:`NOISE`), the new, better one 80 % of it, through an orthonormal map into its wider space, plus
    noise of its own, so that new/new is above old/old and no map between them is exact."""
    rng = np.random.default_rng(seed)
    structure = np.random.default_rng(0)
    centres = structure.normal(size=(classes, old_dim))
    mixing = np.linalg.qr(structure.normal(size=(new_dim, old_dim)))[0].T
    labels = rng.integers(0, classes, size=items)
    offsets = rng.normal(size=(items, old_dim))
    old = centres[labels] + NOISE * offsets
    new = (centres[labels] + 0.8 * NOISE * offsets) @ mixing + 0.8 * rng.normal(size=(items, new_dim))
    return PairedFeatures.normalised(torch.tensor(old, dtype=torch.float32), torch.tensor(new, dtype=torch.float32),
                                     torch.tensor(labels))


def measure(args: argparse.Namespace) -> list[dict]:
    train = paired_spaces(args.fit, args.classes, args.old_dim, args.new_dim, seed=1)
    test = paired_spaces(args.test, args.classes, args.old_dim, args.new_dim, seed=2)
    study = Study("bench", train, test, {"train_items": args.fit, "test_items": args.test})
    rows = []
    for name in args.adapters:
        _, result = evaluate_adapter(study, name, adapter_params={}, seed=0, orders=["random"], steps=2,
                                     scoring=WATCHING)
        case = cross_case(result["cases"])
        rows.append({"adapter": name, "fit_seconds": result["seconds"]["fit"], "steps": result["fit"].get("steps"),
                     "converged": result["fit"].get("converged"), "cross_case": case,
                     "top1": result["cases"][case]["top1"], "old_old": result["cases"]["old/old"]["top1"],
                     "new_new": result["cases"]["new/new"]["top1"]})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", type=int, default=3000)
    parser.add_argument("--test", type=int, default=2000)
    parser.add_argument("--old-dim", type=int, default=128)
    parser.add_argument("--new-dim", type=int, default=256)
    parser.add_argument("--classes", type=int, default=80)
    parser.add_argument("--adapters", nargs="+", default=list(ADAPTERS))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = measure(args)
    base = next((r for r in rows if r["adapter"] == "procrustes"), rows[0])
    print(f"{args.fit} fitting x {args.old_dim} -> {args.new_dim} dims, {args.test} test items, {args.classes} "
          f"classes; {torch.get_num_threads()} threads; old/old {base['old_old']:.1f}, new/new {base['new_new']:.1f}")
    for r in rows:
        ratio = r["fit_seconds"] / max(base["fit_seconds"], 1e-9)
        print(f"{r['adapter']:12s} fit {r['fit_seconds']:7.1f} s ({ratio:8.1f} x {base['adapter']}), "
              f"steps {r['steps'] or '-'}, converged {r['converged']}, {r['cross_case']} top-1 {r['top1']:.1f} "
              f"({r['top1'] - base['top1']:+.1f} against {base['adapter']})")
    if args.json:
        print(json.dumps({"rows": rows, "threads": torch.get_num_threads(), "machine": platform.processor(),
                          "torch": torch.__version__, "settings": vars(args)}))


if __name__ == "__main__":
    main()
