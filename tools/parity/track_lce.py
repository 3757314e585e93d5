"""LCE on the track, by the paper's authors' code (``IrvingMeng/LCE``), driven by ``track_reference.py``.

Their ``main.py``'s ``main(config)`` runs twice, as ``scripts/train_lce.sh`` runs it, with
``configs/res50_arcface.yaml`` (ArcFace s 16, m 0.1 on their ``NormalizedClassifier``; Adam 3.5e-4, weight decay
5e-4 on every parameter, ``MultiStepLR`` [20, 40] x 0.1, 60 epochs; ``lambda_a`` 100, ``lambda_b`` 1 as the
script's): first ``--eval 1 --save_lcefeat 1 --resume OLD`` (their resume loads the old model, ``save_lcefeat``
writes the class centres and cosine floors of its features of every training item), then ``--use_lce 1 --path_ccb
OLD`` (``train`` once per epoch). Their ``ResNet50`` is the suite's embedding network (the old one reading the old
encoder's columns, the new one the new encoder's) and their ``build_dataloader`` gives the track's items, as
``N x D x 1 x 1`` "images" (their feature extraction flips dimension 3, of size 1 here), in the suite's batch of 128
shuffled without their identity sampler. Their ``test`` (Market-1501's query and gallery) is not run: the suite's
protocol scores the model their last epoch saves (``checkpoint_ep60.pth.tar``). As released, ``test`` reads a
global ``config`` that only their ``__main__`` block sets.
"""
from __future__ import annotations

import argparse
import sys

import torch

REPOSITORY = "IrvingMeng/LCE"
MARKER = "losses/arcface_loss.py"
STRATEGIES = ("lce",)
ENTRY_POINT = ("main.py main() L50-171 twice, as scripts/train_lce.sh: --eval 1 --save_lcefeat 1 on the old model "
               "(save_lcefeat L317), then --use_lce 1 (train L174 per epoch); configs/res50_arcface.yaml")
CONFIG = "configs/res50_arcface.yaml"
LOGGERS: list = []
"""The ``Logger`` each ``main`` puts in ``sys.stdout``, kept alive: collected, it would close the console."""


def options(run, folder, **flags) -> argparse.Namespace:
    """Their command line (``parse_option``'s arguments and defaults)."""
    defaults = {"cfg": str(run.checkout / CONFIG), "root": None, "dataset": None, "output": str(folder), "eval": 0,
                "resume": None, "gpu": "0", "train_half": 0, "save_lcefeat": 0, "use_lce": 0, "use_trans": 0,
                "path_ccb": None, "lambda_a": 100.0, "lambda_b": 1.0}
    return argparse.Namespace(**{**defaults, **flags})


def run_main(lce, run, flags: argparse.Namespace):
    """Their ``main`` with the configuration their command line makes, the track's widths, epochs and seed; the
    configuration."""
    from configs.default import get_config

    config = get_config(flags)
    config.defrost()
    config.MODEL.FEATURE_DIM, config.SEED = run.width, run.seed
    config.TRAIN.MAX_EPOCH = run.epochs(config.TRAIN.MAX_EPOCH)
    config.freeze()
    console = sys.stdout
    try:
        lce.main(config)
    finally:
        LOGGERS.append(sys.stdout)
        sys.stdout = console
    return config


def train(run, strategy: str):
    import main as lce
    import models

    items = run.train_items[:, :, None, None]

    def build_dataloader(config):
        loader = run.loader(items, run.train_labels, run.train_labels, train=not config.LCE.SAVE_LCEFEAT)
        return loader, None, None, run.classes

    lce.build_dataloader = build_dataloader
    lce.test = lambda *args, **kwargs: 0.0
    old, new = run.work / "old", run.work / "new"
    old.mkdir(exist_ok=True)
    torch.save({"state_dict": run.frozen_network("old").state_dict(), "epoch": 0}, old / "old_model.pth.tar")
    models.ResNet50 = lambda **kwargs: run.frozen_network("old")
    run_main(lce, run, options(run, old, eval=1, save_lcefeat=1, resume=str(old / "old_model.pth.tar")))
    models.ResNet50 = lambda **kwargs: run.new_network()
    config = run_main(lce, run, options(run, new, use_lce=1, path_ccb=str(old)))
    saved = torch.load(new / f"checkpoint_ep{config.TRAIN.MAX_EPOCH}.pth.tar", map_location=run.device)
    network = run.new_network().to(run.device)
    network.load_state_dict(saved["state_dict"])
    return network.eval()
