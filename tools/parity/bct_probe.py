"""The reference side of the BCT line's parity check: run under the reference's own Python environment.

    <reference venv>/bin/python tools/parity/bct_probe.py --advbct PATH --work DIR

``DIR/inputs.pt`` (written by ``tools/parity/bct_line.py``) holds one batch: new features, the old model's raw
features, labels, the classifier, the discriminator's and the elastic boundary's weights, and the old model's
features of the old training set. This script runs the authors' code of ``Ashespt/AdvBCT`` on them: their
``gen_class_meta`` / ``gen_class_theta`` (``extract_feat.py``) make the class summaries from the old features, and
one iteration of their ``LandmarkComTrainer._back_comp_train_epoch`` (``trainer/trainer.py``) computes each method's
loss and back-propagates it, with their ``CreateBaseModel`` (``models/base_model.py``: classifier, discriminator,
gradient reversal, elastic boundary) around a backbone that returns the given features, their
``BackwardCompatibleLoss`` for RACT and a stand-in optimiser that keeps the gradients. It writes the loss (what
their loop hands to the gradient scaler), every gradient and the class summaries to ``DIR/reference.pt``. It imports
nothing of the suite and copies none of the authors' code; CUDA calls are made no-ops and a one-process gloo group
stands in for their gathered batch.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

METHODS = {"lce": ("lce", "compatible", False), "unibct": ("uni_bct", "compatible", False),
           "ract": ("hot_refresh", "compatible", False), "advbct": ("bct_limit", "adv_compatible", True)}
"""The suite's name -> the authors' ``COMP_LOSS.TYPE``, ``TRAIN.TYPE`` and ``ELASTIC_BOUNDARY``."""


def without_cuda() -> None:
    """Their code calls ``.cuda()`` on tensors and modules; on this CPU-only check those calls return the object."""
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    nn.Module.cuda = lambda self, *args, **kwargs: self


def one_process_group(work: Path) -> None:
    """Their losses gather the batch over processes (``GATHER_ALL``); one gloo process keeps the batch as it is."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"file://{work / 'gloo'}", rank=0, world_size=1)


class Backbone(nn.Module):
    """What ``timm.create_model`` returns here: the given features, as a parameter whose gradient is read back."""

    def __init__(self, features: torch.Tensor) -> None:
        super().__init__()
        self.features = nn.Parameter(features.clone())
        self.num_features = features.shape[1]

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.features


class Frozen(nn.Module):
    """The old model: the given raw features."""

    def __init__(self, features: torch.Tensor) -> None:
        super().__init__()
        self.features = features

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.features


class Parallel(nn.Module):
    """Their trainer reads ``model.module`` as under DistributedDataParallel."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


class KeepGradients:
    """The optimiser: ``zero_grad`` clears, ``step`` does nothing, so the gradients stay for reading."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.param_groups = [{"lr": 0.0}]

    def zero_grad(self) -> None:
        self.model.zero_grad(set_to_none=True)

    def step(self) -> None:
        pass


class RecordingScaler:
    """The gradient scaler: records the loss their loop back-propagates."""

    loss: torch.Tensor | None = None

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        self.loss = loss.detach().clone()
        return loss

    def step(self, optimizer) -> None:
        optimizer.step()

    def update(self) -> None:
        pass


class NoWriter:
    def add_scalar(self, *args, **kwargs) -> None:
        pass


def reference_config(method: str, inputs: dict, work: Path):
    from configs.defaults import _C

    comp_type, train_type, elastic = METHODS[method]
    config = _C.clone()
    config.defrost()
    config.COMP_LOSS.TYPE, config.TRAIN.TYPE, config.COMP_LOSS.ELASTIC_BOUNDARY = comp_type, train_type, elastic
    config.TRAIN.THRESHOLD = inputs["threshold"]
    config.LOSS.TYPE, config.UPGRADE_LOSS.TYPE, config.USE_AMP, config.DEVICE = "softmax", "base", False, "cpu"
    config.NEW_MODEL.NUM_CLASSES = config.MODEL.NUM_CLASSES = inputs["classifier"].shape[0]
    config.OLD_MODEL.NUM_CLASSES = inputs["old_classes"]
    config.TRAIN.EPOCHS = inputs["epochs"]
    config.EVAL.SAVE_DIR, config.TRAIN.DATASET = str(work), "parity"
    config.EVAL.OLD_SAVE_FILE = str(work / f"parity_{len(inputs['old_labels'])}_meta_radius_centernorm.json")
    return config


def class_meta(config, inputs: dict, work: Path) -> dict:
    """Their ``gen_class_meta`` and ``gen_class_theta`` on the old features, read back from the JSON they write."""
    import extract_feat

    count = len(inputs["old_labels"])
    np.save(work / f"parity_{count}_feat.npy", inputs["old_features"].numpy().astype(np.float32))
    np.save(work / f"parity_{count}_label.npy", inputs["old_labels"].numpy().astype(np.float32))
    extract_feat.gen_class_meta(config, feat_num=count)
    extract_feat.gen_class_theta(config, feat_num=count)
    return {kind: json.loads((work / f"parity_{count}_meta_{name}.json").read_text())
            for kind, name in (("distance", "radius_centernorm"), ("angle", "theta_centernorm_after1.5iqr"))}


def reference_model(method: str, inputs: dict) -> nn.Module:
    """Their ``CreateBaseModel`` around :class:`Backbone`, its projection and batch norm made the identity so the
    loss sees the given features, with the given classifier, discriminator and boundary weights."""
    import timm
    from models.base_model import CreateBaseModel

    timm.list_models = lambda *args, **kwargs: ["parity_backbone"]
    timm.create_model = lambda *args, **kwargs: Backbone(inputs["features"])
    _, _, elastic = METHODS[method]
    width = inputs["features"].shape[1]
    model = CreateBaseModel({"arch": "parity_backbone", "pretrained": False, "pretrained_path": None,
                             "num_class": inputs["classifier"].shape[0], "use_cls": True, "out_dim": width,
                             "adversarial": elastic, "eboundary": elastic})
    model.projection_dim, model.bn = nn.Identity(), nn.Identity()
    with torch.no_grad():
        model.projection_cls.weight.copy_(inputs["classifier"])
        if elastic:
            for theirs, ours in zip(model.discriminator.state_dict().values(), inputs["discriminator"], strict=True):
                theirs.copy_(ours)
            model.eboundary.weight.copy_(inputs["boundary_logit"])
    return model


def training_iteration(method: str, inputs: dict, work: Path) -> dict:
    """One batch through their ``_back_comp_train_epoch``: the loss and the gradient of every weight."""
    from models.loss import BackwardCompatibleLoss
    from trainer.trainer import LandmarkComTrainer

    config = reference_config(method, inputs, work)
    meta = class_meta(config, inputs, work)
    model = Parallel(reference_model(method, inputs))
    trainer = LandmarkComTrainer.__new__(LandmarkComTrainer)
    trainer.config, trainer.logger, trainer.K = config, logging.getLogger("reference"), 0
    trainer.model, trainer.old_model = model, Frozen(inputs["old_raw_features"])
    images = torch.zeros(len(inputs["labels"]), 3, 2, 2)
    trainer.train_loader = [(images, inputs["labels"])]
    trainer.criterion = {"base": nn.CrossEntropyLoss()}
    if method == "ract":
        trainer.criterion["back_comp"] = BackwardCompatibleLoss(
            temp=config.COMP_LOSS.TEMPERATURE, margin=config.COMP_LOSS.TRIPLET_MARGIN,
            topk_neg=config.COMP_LOSS.TOPK_NEG, loss_type=config.COMP_LOSS.TYPE,
            loss_weight=config.COMP_LOSS.WEIGHT, gather_all=config.GATHER_ALL)
    trainer.optimizer, trainer.grad_scaler = KeepGradients(model), RecordingScaler()
    trainer.epochs, trainer.len_epoch, trainer.writer, trainer.device = inputs["epochs"], 1, NoWriter(), "cpu"
    trainer.old_meta = meta["angle"] if method == "lce" else meta["distance"]
    trainer.model_criterion = nn.NLLLoss()
    if method == "unibct":
        trainer.old_centers = trainer.load_old_centers()
    trainer._back_comp_train_epoch(inputs["epoch"], inputs["epochs"])
    grads = {name: p.grad.clone() for name, p in model.module.named_parameters() if p.grad is not None}
    return {"loss": trainer.grad_scaler.loss, "grads": grads, "meta": meta,
            "settings": {"temperature": config.COMP_LOSS.TEMPERATURE, "topk_neg": config.COMP_LOSS.TOPK_NEG,
                         "scale": config.LOSS.SCALE, "margin": config.LOSS.MARGIN}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--advbct", required=True)
    parser.add_argument("--work", required=True)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(args.advbct).resolve()))
    work = Path(args.work)
    without_cuda()
    one_process_group(work)
    inputs = torch.load(work / "inputs.pt", weights_only=False)
    results = {}
    for method in METHODS:
        torch.manual_seed(0)
        results[method] = training_iteration(method, inputs, work)
    torch.save(results, work / "reference.pt")


if __name__ == "__main__":
    main()
