"""The reference side of the parity check against the methods' own authors: run under the references' Python.

    <reference venv>/bin/python tools/parity/authors_probe.py --opencompatible PATH --lce PATH --mixbct PATH \\
        --work DIR

``DIR/inputs.pt`` (written by ``tools/parity/authors.py``) holds one batch (new features, the old model's raw
features, labels, a classifier) and the old and new models' unit features of an old training set. This script
runs the authors' own code on them and writes what it computes to ``DIR/reference.pt``:

* RACT: ``TencentARC/OpenCompatible``'s ``BackwardCompatibleLoss`` (``model/loss.py``), ``loss_type='contra_ract'``,
  ``temp=0.01``, ``topk_neg=10``, with ``gather_all`` true (their default: the batch gathered by ``all_gather``,
  which carries no gradient) and false; the loss and the gradient of the new features;
* LCE: ``IrvingMeng/LCE``'s ``save_lcefeat`` (``main.py``: the old class centres and cosines) on the old features,
  then one iteration of its ``train`` with ``use_lce=1`` (``lambda_a=100``, ``lambda_b=1``, no transformation)
  around a backbone that returns the given features, their ``NormalizedClassifier`` and their ``ArcFaceLoss`` at
  their configuration's scale 16 and margin 0.1 (``configs/res50_arcface.yaml``); the loss and every gradient;
* UniBCT: ``yuleung/MixBCT``'s ``PrototypeGeneration`` (``BCT_Methods/UniBCT/refine_prototype.py``, the public
  reimplementation of the paper's prototype refinement, ``lamb=0.9``, ``temper=0.05``) on the old and new features.

It imports nothing of the suite and copies none of the authors' code; CUDA calls are made no-ops and a one-process
gloo group stands in for their processes.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn


def without_cuda() -> None:
    """Their code calls ``.cuda()`` on tensors and modules; on this CPU-only check those calls return the object."""
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    nn.Module.cuda = lambda self, *args, **kwargs: self


def one_process_group(work: Path) -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"file://{work / 'gloo'}", rank=0, world_size=1)


def module_at(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Given(nn.Module):
    """A backbone that returns the given features whatever the images, as a parameter whose gradient is read."""

    def __init__(self, features: torch.Tensor, trainable: bool) -> None:
        super().__init__()
        self.features = nn.Parameter(features.clone(), requires_grad=trainable)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.features if self.training else self.features.detach()


class Queued(nn.Module):
    """A model that returns the next of the given feature batches (``pair``: with a second output, as their new
    model's); ``to`` a device is a no-op here."""

    def __init__(self, batches: list[torch.Tensor], pair: bool) -> None:
        super().__init__()
        self.batches, self.pair = iter(batches), pair

    def to(self, *args, **kwargs):
        return self

    def forward(self, images: torch.Tensor):
        features = next(self.batches)
        return (features, None) if self.pair else features


class Parallel(nn.Module):
    """Their code reads ``classifier.module`` as under DataParallel."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args):
        return self.module(*args)


def ract(checkout: Path, inputs: dict) -> dict:
    loss_module = module_at(checkout / "model" / "loss.py", "opencompatible_loss")
    out = {}
    for gather_all in (True, False):
        criterion = loss_module.BackwardCompatibleLoss(temp=0.01, topk_neg=10, loss_type="contra_ract",
                                                       gather_all=gather_all)
        features = nn.Parameter(inputs["features"].clone())
        loss = criterion(features, inputs["old_raw_features"], inputs["labels"])
        loss.backward()
        out[f"gather_all={gather_all}"] = {"loss": loss.detach(), "features_grad": features.grad.clone()}
    return out


def lce(checkout: Path, inputs: dict, work: Path) -> dict:
    sys.path.insert(0, str(checkout))
    main = __import__("main")
    from losses.arcface_loss import ArcFaceLoss
    from models.Classifier import NormalizedClassifier

    folder = work / "lce"
    folder.mkdir()
    old = inputs["lce_old_features"]
    old_model = Given(old, trainable=False).eval()
    images, ids = torch.zeros(len(old), 3, 2, 2), inputs["lce_old_labels"]
    main.save_lcefeat(old_model, [(images, ids, ids)], str(folder))
    centres, cosines = np.load(folder / "old_class_centers.npy"), np.load(folder / "old_class_cos.npy")
    model = Given(inputs["lce_features"], trainable=True)
    classifier = NormalizedClassifier(inputs["lce_features"].shape[1], len(centres))
    with torch.no_grad():
        classifier.weight.copy_(inputs["lce_classifier"])
    head = Parallel(classifier)
    labels = inputs["lce_labels"]
    losses = []

    class Recording(torch.optim.SGD):
        def step(self, closure=None):
            return None

    optimizer = Recording([model.features, *classifier.parameters()], lr=0.0)
    criterion = ArcFaceLoss(scale=16.0, margin=0.1)                 # configs/res50_arcface.yaml

    def recorded(outputs, pids):
        value = criterion(outputs, pids)
        losses.append(value)
        return value

    original_backward = torch.Tensor.backward

    def keep_total(self, *args, **kwargs):
        losses.append(self.detach())
        return original_backward(self, *args, **kwargs)

    torch.Tensor.backward = keep_total
    try:
        main.train(0, model, head, recorded, optimizer, [(torch.zeros(len(labels), 3, 2, 2), labels, labels)],
                   use_lce=True, old_class_centers=torch.tensor(centres).float(),
                   old_class_cos=torch.tensor(cosines).float(), lambda_a=100.0, lambda_b=1.0)
    finally:
        torch.Tensor.backward = original_backward
    return {"centres": torch.tensor(centres), "cosines": torch.tensor(cosines), "loss": losses[-1],
            "features_grad": model.features.grad.clone(), "classifier_grad": classifier.weight.grad.clone()}


def unibct(checkout: Path, inputs: dict, work: Path) -> dict:
    refine = module_at(checkout / "BCT_Methods" / "UniBCT" / "refine_prototype.py", "mixbct_refine")
    old, new, labels = inputs["unibct_old"], inputs["unibct_new"], inputs["unibct_labels"]
    half = len(labels) // 2
    loader = [(torch.zeros(half, 1), labels[:half], None), (torch.zeros(len(labels) - half, 1), labels[half:], None)]
    config = argparse.Namespace(output=str(work), batch_size=half)
    refine.PrototypeGeneration(config, Queued([new[:half], new[half:]], pair=True), None, loader, rank=1)
    refine.PrototypeGeneration(config, None, Queued([old[:half], old[half:]], pair=False), loader, rank=0)
    return {"prototypes": torch.tensor(np.load(work / "old_prototype.npy"))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--opencompatible", required=True)
    parser.add_argument("--lce", required=True)
    parser.add_argument("--mixbct", required=True)
    parser.add_argument("--work", required=True)
    args = parser.parse_args()
    work = Path(args.work)
    without_cuda()
    one_process_group(work)
    inputs = torch.load(work / "inputs.pt", weights_only=False)
    torch.save({"ract": ract(Path(args.opencompatible), inputs), "lce": lce(Path(args.lce), inputs, work),
                "unibct": unibct(Path(args.mixbct), inputs, work)}, work / "reference.pt")


if __name__ == "__main__":
    main()
