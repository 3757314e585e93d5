"""Published figures to show beside the suite's own, with their source (docs/METHODS.md §7b): never merged with
measured rows, always labelled as other models and data.

``LAMBDA_ORTH_TABLE_1B``: λ-orth (Ricci et al., NeurIPS 2025), Table 1b: ImageNet-1k ResNet-18 -> ViT-L/16, adapters
fitted on ImageNet; each case ``(CMC top-1, mAP)`` in percent, and the backfilling AUC ``(top-1, mAP)``.
``LAMBDA_ORTH_TABLE_2``: the same paper, Table 2, CIFAR-100 downstream, λ = 12, top-1 only, and the zero-shot change.
"""
from __future__ import annotations

LAMBDA_ORTH_SOURCE = "λ-orth paper (Ricci et al., NeurIPS 2025)"

LAMBDA_ORTH_TABLE_1B = {
    "setting": "ResNet-18 -> ViT-L/16, ImageNet-1k (Table 1b)",
    "rows": {
        "none": {"old/old": (55.62, 26.91), "new/old": (0.04, 0.17), "new/new": (76.62, 56.84)},
        "fct": {"F/F": (59.39, 42.65), "new/F": (72.54, 49.85), "auc": (73.86, 52.02)},
        "fastfill": {"F/F": (61.17, 46.28), "new/F": (73.33, 52.83), "auc": (75.06, 55.34)},
        "lambda_orth (strict)": {"F/old": (60.83, 40.69), "F/F": (61.10, 45.91), "B/F": (73.53, 52.06),
                                 "B/old": (65.54, 38.55), "B/B": (76.62, 56.84), "auc": (76.59, 57.72)},
    },
}

LAMBDA_ORTH_TABLE_2 = {
    "setting": "CIFAR-100 downstream, λ = 12 (Table 2, top-1)",
    "rows": {
        "none": {"old/old": 51.13, "new/old": 0.8, "new/new": 74.08},
        "fct": {"F/F": 57.35, "new/F": 69.80},
        "fastfill": {"F/F": 66.17, "new/F": 67.23},
        "lambda_orth": {"F/old": 67.29, "F/F": 67.72, "B/F": 72.08, "B/old": 71.85, "B/B": 78.23, "ZS": 0.112},
    },
}
