"""``tools/pretrained_study.py``'s run configs: the subset study's splits, the control's fitting share, and
``--full-splits`` (the study on a GPU: every train image fitted, every test image scored)."""
import argparse

import pytest

from tools.pretrained_study import DATASETS, run_config


def study_args(**changes) -> argparse.Namespace:
    values = {"data_root": "/data", "device": "cpu", "output": "results/pretrained", "unseen_classes": 0.0,
              "pairing": "paired", "fit_per_class": 0, "full_splits": False, **changes}
    return argparse.Namespace(**values)


@pytest.mark.parametrize("dataset", list(DATASETS))
def test_full_splits_fit_every_train_image_and_score_every_test_image(dataset, tmp_path):
    pair = {"old": "timm:a@x.pth", "new": "timm:b@y.pth"}
    subset = run_config(study_args(), pair, dataset, "none", 0, tmp_path)["model_update"]
    control = run_config(study_args(fit_per_class=3), pair, dataset, "none", 0, tmp_path)["model_update"]
    full = run_config(study_args(full_splits=True), pair, dataset, "none", 0, tmp_path)["model_update"]
    assert (subset["fit_per_class"], subset["test_per_class"]) == tuple(DATASETS[dataset].values())
    assert (control["fit_per_class"], control["test_per_class"]) == (3, DATASETS[dataset]["test_per_class"])
    assert (full["fit_per_class"], full["test_per_class"]) == (None, None)
