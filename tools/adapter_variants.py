"""Settings of the training-free adapters side by side on the pretrained study's Lite0 -> Lite2 Tiny ImageNet
features (``results/pretrained/``, closed set): which step of latent-space translation costs what (per-dimension
standard scaling, the map), and what SLERP's interpolation adds over its own uncentred Procrustes (α = 1) and over
the old model alone (α = 0). Each is a closed form on every fitting item, so one seed decides it.

    python -m tools.adapter_variants --data-root DATA [--output results/pretrained]

Reads the feature cache of ``tools.pretrained_study``; prints one Markdown row per variant: the cross case, its
top-1 and its paired gain over old/old with the 95 % interval, and its negative flips.
"""
from __future__ import annotations

import argparse

from benchmarks.adapted_cases import Scoring
from benchmarks.record import cross_case, unpack_hits
from cl2r_bench.adapter_study import evaluate_adapter
from cl2r_bench.reporting.adapter_recommendation import paired_gain_interval
from tools.open_set_control import lite_study

VARIANTS = (
    ("procrustes", {}),
    ("latent_translation", {}),
    ("latent_translation", {"scaling": "none"}),
    ("latent_translation", {"map": "svd"}),
    ("latent_translation", {"map": "svd", "scaling": "none"}),
    ("latent_translation", {"map": "lstsq"}),
    ("slerp", {}),
    ("slerp", {"alpha": 1.0}),
    ("slerp", {"alpha": 0.5}),
)
"""``(adapter, adapter_params)``; an empty dict is the adapter's defaults."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", required=True)
    parser.add_argument("--output", default="results/pretrained")
    args = parser.parse_args()
    study = lite_study(args, 0.0)
    n = study.test.labels.numel()
    print("| adapter | settings | cross case | top-1 | gain over old/old (95% interval) | negative flips % |")
    print("|---|---|---|---|---|---|")
    for name, params in VARIANTS:
        _, result = evaluate_adapter(study, name, adapter_params={name: params}, seed=0, orders=["random"], steps=2,
                                     scoring=Scoring("miss", False, None, False))
        cases = result["cases"]
        cross = cross_case(cases)
        gain, (low, high) = paired_gain_interval(unpack_hits(result["query_top1"][cross], n)[None, :],
                                                 unpack_hits(result["query_top1"]["old/old"], n))
        settings = ", ".join(f"{k}={v}" for k, v in params.items()) or "defaults"
        print(f"| {name} | {settings} | {cross} | {cases[cross]['top1']:.1f} | {gain:+.1f} ({low:+.1f}, {high:+.1f}) | "
              f"{100 * result['case_flips'][cross]:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
