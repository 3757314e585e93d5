"""Published figures to show beside the suite's own, with their source (docs/METHODS.md §2 and §7b): never merged
with measured rows, always labelled as the papers' runs on their models and data (``leaderboard --published``,
``runner.py report``).

``IAMCL2R_RELEASED``: the IAM-CL2R authors' released 7-task runs (CIFAR-100 stream, CIFAR-10 open-set evaluation,
replacements at tasks 0, 2, 4), the compatibility matrices in percent; their AC / AA / ACA are computed from them by
the suite's own metric code. ``IAMCL2R_31_TASKS``: the AC and AA the authors report for 31 tasks (no matrix). Either
may carry, where a paper gives them, the negative flip rates of its strategies as the suite records them (fractions;
per-query hits cannot be recovered from a matrix): an optional ``"negative_flips": {strategy: {"mean_self": x,
"mean_cross": y}}``, shown as NFR self and NFR cross (``leaderboard --published``); none is given yet.
``LAMBDA_ORTH_TABLE_1A`` / ``_1B``: λ-orth (Ricci et al., NeurIPS 2025), Table 1a (class extension, ResNet-34) and
Table 1b (ImageNet-1k ResNet-18 -> ViT-L/16), each case ``(CMC top-1, mAP)`` in percent and the backfilling AUC
``(top-1, mAP)``. ``LAMBDA_ORTH_TABLE_2``: the same paper, Table 2, CIFAR-100 downstream, λ = 12, top-1 only, and
the zero-shot change. ``ML_FCT_README``: apple/ml-fct's README, ``(top-1, top-5, mAP)``. ``BT2_README``: the BT²
authors' README (``YifeiZhou02/BT-2``), the BCT line's two-model protocol on CIFAR-100 (``--scenario upgrade``),
``(top-1, top-5, mAP)`` per case; its "independent" new model is the suite's ``er`` there (plain cross-entropy). The
authors call these example results, some different from the paper's (sensitivity to hyper-parameters and seeds).
"""
from __future__ import annotations

IAMCL2R_SOURCE = "IAM-CL2R authors' released runs (docs/METHODS.md §2)"
LAMBDA_ORTH_SOURCE = "λ-orth paper (Ricci et al., NeurIPS 2025)"
ML_FCT_SOURCE = "apple/ml-fct README"
BT2_SOURCE = "YifeiZhou02/BT-2 README (example results)"

IAMCL2R_RELEASED = {
    "setting": "CIFAR-100 stream, CIFAR-10 evaluation, 7 tasks, replacements at 0, 2, 4",
    "replacement_tasks": [0, 2, 4],
    "matrices": {
        "dsimplex_hoc": [
            [58.89],
            [59.70, 61.56],
            [63.05, 65.28, 69.31],
            [63.34, 65.30, 70.63, 72.37],
            [65.01, 67.87, 70.75, 72.11, 73.83],
            [64.08, 67.19, 71.17, 72.71, 74.70, 76.19],
            [63.14, 66.35, 72.10, 73.50, 75.23, 76.65, 77.16],
        ],
        "er": [
            [63.42],
            [61.56, 63.09],
            [11.71, 11.23, 72.73],
            [11.43, 10.53, 69.23, 70.30],
            [9.08, 7.76, 9.30, 8.55, 74.46],
            [8.51, 7.36, 10.34, 9.52, 72.26, 72.31],
            [9.72, 8.58, 9.75, 9.75, 70.35, 70.63, 71.54],
        ],
    },
}

IAMCL2R_31_TASKS = {
    "setting": "CIFAR-100 stream, CIFAR-10 evaluation, 31 tasks",
    "metrics": {"dsimplex_hoc": {"AC": 0.65, "AA": 68.07}, "er": {"AC": 0.00, "AA": 30.32}},
}

LAMBDA_ORTH_TABLE_1A = {
    "setting": "class extension, ResNet-34 128-d, ImageNet classes 1-500 -> 1-1000 (Table 1a)",
    "rows": {
        "none": {"old/old": (43.56, 25.18), "new/new": (61.61, 35.69)},
        "fct": {"F/F": (50.13, 30.93), "new/F": (57.21, 33.00), "auc": (58.72, 33.57)},
        "fastfill": {"F/F": (50.63, 31.48), "new/F": (57.21, 33.19), "auc": (60.49, 35.59)},
        "lambda_orth": {"F/old": (44.59, 26.70), "F/F": (51.46, 33.75), "B/F": (57.41, 34.53),
                        "B/old": (43.94, 25.75), "auc": (61.20, 36.46)},
    },
}

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

ML_FCT_README = {
    "CIFAR-100, ResNet-50 128-d, old on 50 classes": {
        "none": {"old/old": (32.9, 59.3, 16.1), "new/new": (56.4, 77.5, 36.5)},
        "fct": {"new/F": (50.6, 74.2, 34.2)},
    },
    "ImageNet-1k, ResNet-50 128-d, old on 500 classes": {
        "none": {"old/old": (46.4, 65.1, 28.3), "new/new": (68.4, 84.7, 45.6)},
        "fct": {"new/F": (65.1, 82.7, 44.0)},
    },
}

BT2_README = {
    "setting": "CIFAR-100, old on 50 classes, new on 100, ResNet-50 128-d (BT²: 128 + 32)",
    "rows": {
        "er": {"old/old": (33.6, 55.4, 24.4), "new/old": (0.8, 4.9, 1.5), "new/new": (62.7, 74.6, 49.9)},
        "bct": {"new/old": (25.0, 62.1, 24.7), "new/new": (60.0, 71.9, 47.3)},
        "bt2": {"new/old": (38.7, 64.6, 27.7), "new/new": (62.4, 75.1, 50.5)},
    },
}
