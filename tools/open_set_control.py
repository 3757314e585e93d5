"""The control of the open-set pretrained study (``results/pretrained/open-set/``): the same 1,000 fitting items (10
per class of the 100 fitting classes, ``model_update.unseen_classes=0.5``), scored once on the test items of those
same classes (seen) and once on the other 100 (unseen, the open set), for the adapters without training. It tells
apart the two things the open set changes at once: fewer fitting items (1,000, fewer than the 1,280 dimensions)
and classes the adapter never saw.

    python -m tools.open_set_control --data-root DATA [--output results/pretrained]

Reads the feature cache of ``tools.pretrained_study`` (Lite0 -> Lite2 on Tiny ImageNet); prints one Markdown row
per split and adapter: old/old, new/new, the cross case and its paired top-1 gain over old/old with its 95 % interval.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from benchmarks.adapted_cases import PairedFeatures, Scoring
from benchmarks.record import cross_case, unpack_hits
from cl2r_bench.adapter_study import Study, encoder_study, evaluate_adapter
from cl2r_bench.app.assembly import assemble
from cl2r_bench.reporting.adapter_recommendation import paired_gain_interval
from tools.pretrained_study import lite_pair, run_config

ADAPTERS = ("none", "procrustes", "least_squares", "irp")


def lite_study(args: argparse.Namespace, share: float) -> Study:
    """The Lite0 -> Lite2 Tiny ImageNet study, with ``share`` of its classes held out of fitting."""
    output = Path(args.output)
    pair = lite_pair(output)
    config = argparse.Namespace(data_root=args.data_root, device="cpu", unseen_classes=share, output=str(output),
                                pairing="paired")
    parts = assemble(run_config(config, pair, "tinyimagenet", "none", 0, Path(args.output) / "open-set-control"))
    return encoder_study(parts.settings, parts.device, lambda *_: None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", required=True)
    parser.add_argument("--output", default="results/pretrained")
    args = parser.parse_args()
    unseen, closed = lite_study(args, 0.5), lite_study(args, 0.0)
    fitted = set(unseen.train.labels.tolist())
    keep = torch.tensor([label in fitted for label in closed.test.labels.tolist()])
    seen = Study("seen", unseen.train, PairedFeatures(closed.test.old[keep], closed.test.new[keep],
                                                      closed.test.labels[keep]), unseen.about)
    print("| scored on | adapter | fitting items | queries | old/old | new/new | cross case | gain (95% interval) |")
    print("|---|---|---|---|---|---|---|---|")
    for label, study in (("seen (the fitting classes)", seen), ("unseen (the other classes)", unseen)):
        for name in ADAPTERS:
            _, result = evaluate_adapter(study, name, adapter_params={}, seed=0, orders=["random"], steps=2,
                                         scoring=Scoring("miss", False, None, False))
            cases, n = result["cases"], study.test.labels.numel()
            cross = cross_case(cases)
            gain, (low, high) = paired_gain_interval(unpack_hits(result["query_top1"][cross], n)[None, :],
                                                     unpack_hits(result["query_top1"]["old/old"], n))
            print(f"| {label} | {name} | {len(study.train.labels)} | {n} | {cases['old/old']['top1']:.1f} | "
                  f"{cases['new/new']['top1']:.1f} | {cross} {cases[cross]['top1']:.1f} | {gain:+.1f} "
                  f"({low:+.1f}, {high:+.1f}) |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
