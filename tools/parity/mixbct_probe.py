"""The reference side of MixBCT's parity check: run under the references' Python (torch, torchvision, numpy, scipy,
scikit-learn, easydict).

    <reference venv>/bin/python tools/parity/mixbct_probe.py --mixbct PATH --work DIR

``DIR/inputs.pt`` (written by ``tools/parity/mixbct.py``) holds the old model's raw features of a training set and
its labels (sorted by class), a batch (indices into it, the new model's raw features), the new classifier's weights
and the positions their ``random.sample`` is to return. This script, importing nothing of the suite and copying
none of the authors' code:

1. writes the features and labels where ``tools/denoising/denoise_credible.py`` reads them
   (``DIR/feature_save/OPclass/<SD>_feature.npy``, ``_label.npy``) and runs its ``main`` with ``T = 0.9`` (their
   README's command), which writes the credible mask;
2. runs ``BCT_Methods/MixBCT/train.py``'s ``main`` for one iteration with their
   ``configs/OPclass_ms1mv3_r18_to_r50_MixBCT_softmax_to_arc_f128.py`` (mix ratio 0.3, ``ArcFace()`` s 64 m 0.5,
   ``PartialFC`` at sample rate 1), its data fields pointed at these files and sizes, one epoch of one batch, fp16
   off. Stand-ins replace what needs a GPU or the data set and does not enter the loss: the data loader (the one
   batch), the backbone (returns the given features, a parameter whose gradient is read), ``DistributedDataParallel``
   (the module itself), CUDA calls (no-ops), their NCCL process group (a one-process gloo group: ``PartialFC``'s
   all-gather and all-reduce run for real over one process), ``random.sample`` (the given positions, checked against
   the population and count it is asked for), the optimiser's ``step`` (records the gradients, changes nothing),
   ``clip_grad_norm_`` (records the norm, clips nothing: the suite has no clipping), the learning-rate schedule
   (their ``PolyScheduler`` passes ``verbose`` to torch's ``LRScheduler``, which torch 2.14 no longer takes; the
   rate does not enter the loss), ``mxnet`` (imported by their data and evaluation modules, unused here) and the
   tensorboard writer.

It writes the credible mask, the loss, the gradients of the features and of ``PartialFC.weight_activated``, the
backbone gradient's norm and how many credible rows the batch had to ``DIR/reference.pt``, with their ``ArcFace()``'s
logits on the given cosines (both of its branches) and their gradient.
"""
from __future__ import annotations

import argparse
import os
import sys
import types
from pathlib import Path

import numpy as np
import torch
from torch import nn

SD = "f32_r18_softmax_class70"
"""Their scenario name: ``class70`` puts the files under ``feature_save/OPclass/``."""
CONFIG = "configs/OPclass_ms1mv3_r18_to_r50_MixBCT_softmax_to_arc_f128.py"
RECORD: dict = {}


def module_at(path: Path, name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def without_cuda() -> None:
    """CUDA calls are no-ops on this CPU-only check (``.cuda()``, ``set_device``, ``.to(local_rank)``)."""
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    nn.Module.cuda = lambda self, *args, **kwargs: self
    torch.cuda.set_device = lambda *args, **kwargs: None
    original_to = torch.Tensor.to

    def to(self, *args, **kwargs):
        if args and isinstance(args[0], int) and not isinstance(args[0], bool):
            return self
        return original_to(self, *args, **kwargs)

    torch.Tensor.to = to


def one_process_group(work: Path) -> None:
    """Their ``init_process_group("nccl", tcp://...)`` becomes a one-process gloo group."""
    import torch.distributed as dist

    original = dist.init_process_group

    def gloo(*args, **kwargs):
        return original("gloo", init_method=f"file://{work / 'gloo'}", rank=0, world_size=1)

    dist.init_process_group = gloo


def stand_in_modules() -> None:
    """``mxnet``: their data set and evaluation modules import it; nothing this check runs reads it."""
    mxnet = types.ModuleType("mxnet")
    mxnet.ndarray = types.ModuleType("mxnet.ndarray")
    sys.modules.setdefault("mxnet", mxnet)
    sys.modules.setdefault("mxnet.ndarray", mxnet.ndarray)


class Given(nn.Module):
    """The backbone: returns the given features (a copy, so their in-place mixing writes to a non-leaf)."""

    def __init__(self, features: torch.Tensor) -> None:
        super().__init__()
        self.features = nn.Parameter(features.clone())
        RECORD["backbone"] = self

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.features.clone()


class Wrapped(nn.Module):
    """``DistributedDataParallel`` on one process: the module itself, under ``.module``."""

    def __init__(self, module: nn.Module, **kwargs) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args):
        return self.module(*args)


class KeepGradients(torch.optim.SGD):
    """Their SGD whose ``step`` records the gradients and changes no weight."""

    def step(self, closure=None):
        RECORD["grads"] = {"features": RECORD["backbone"].features.grad.clone(),
                           "classifier": RECORD["classifier"].weight_activated.grad.clone()}


class Schedule:
    """The learning-rate schedule's interface their loop calls."""

    def __init__(self, optimizer, **kwargs) -> None:
        self.optimizer = optimizer

    def step(self) -> None:
        pass

    def get_last_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]


class Writer:
    def __init__(self, *args, **kwargs) -> None:
        pass

    def add_scalar(self, *args, **kwargs) -> None:
        pass


def denoise(checkout: Path, inputs: dict, work: Path) -> np.ndarray:
    folder = work / "feature_save" / "OPclass"
    folder.mkdir(parents=True)
    np.save(folder / f"{SD}_feature.npy", inputs["old_features"].numpy().astype(np.float32))
    np.save(folder / f"{SD}_label.npy", inputs["labels"].numpy())
    script = module_at(checkout / "tools" / "denoising" / "denoise_credible.py", "mixbct_denoise")
    script.main(argparse.Namespace(SD=SD, T=0.9))
    return np.load(folder / f"{SD}_credible_ratio_90_feature.npy")


def train_one_iteration(checkout: Path, inputs: dict, work: Path) -> None:
    sys.path.insert(0, str(checkout / "BCT_Methods" / "MixBCT"))
    import train

    folder = work / "feature_save" / "OPclass"
    batch, index = inputs["batch"], inputs["index"]
    labels = inputs["labels"][index]
    real_config = train.get_config

    def config(path: str):
        cfg = real_config(path)
        cfg.update(output=str(work / "out"), embedding_size=inputs["width"], num_classes=inputs["classes"],
                   batch_size=batch, num_image=batch, num_epoch=1, fp16=False, rec="unused",
                   old_embedding=str(folder / f"{SD}_feature.npy"),
                   credible_old_feature=str(folder / f"{SD}_credible_ratio_90_feature.npy"))
        RECORD["config"] = dict(cfg)
        return cfg

    class Classifier(train.PartialFC):
        """Their ``PartialFC`` with the given weights; records the loss it returns."""

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            with torch.no_grad():
                self.weight_activated.copy_(inputs["classifier"])
            RECORD["classifier"] = self

        def forward(self, *args):
            loss = super().forward(*args)
            RECORD["loss"] = loss.detach().clone()
            return loss

    def sample(population, k):
        positions = list(inputs["positions"])
        if k != len(positions):
            raise RuntimeError(f"their draw asks for {k} rows, the suite drew {len(positions)}")
        RECORD["credible_in_batch"] = len(population)
        return positions

    def clip(parameters, max_norm, *args, **kwargs):
        norm = torch.cat([p.grad.flatten() for p in parameters if p.grad is not None]).norm()
        RECORD["backbone_grad_norm"] = float(norm)
        return norm

    train.get_config = config
    train.get_dataloader = lambda *args, **kwargs: [(torch.zeros(batch, 3, 1, 1), labels.clone(), index.clone())]
    train.get_model = lambda *args, **kwargs: Given(inputs["new_features"])
    train.PartialFC = Classifier
    train.PolyScheduler = Schedule
    train.SummaryWriter = Writer
    train.random = types.SimpleNamespace(sample=sample)
    torch.nn.parallel.DistributedDataParallel = Wrapped
    torch.optim.SGD = KeepGradients
    torch.nn.utils.clip_grad_norm_ = clip
    train.main(argparse.Namespace(config=CONFIG, local_rank=0))


def arcface(inputs: dict) -> dict:
    """Their ``losses.ArcFace()`` (the one ``train.py`` builds) on the given cosines, and the gradient of a linear
    read-out of its logits."""
    from losses import ArcFace

    cosine = nn.Parameter(inputs["arcface_cosines"].clone())
    logits = ArcFace()(cosine.clone(), inputs["arcface_targets"].view(-1, 1))
    (logits * inputs["arcface_readout"]).sum().backward()
    return {"logits": logits.detach(), "grad": cosine.grad.clone()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mixbct", required=True)
    parser.add_argument("--work", required=True)
    args = parser.parse_args()
    work, checkout = Path(args.work).resolve(), Path(args.mixbct).resolve()
    inputs = torch.load(work / "inputs.pt", weights_only=False)
    without_cuda()
    one_process_group(work)
    stand_in_modules()
    os.chdir(work)                                  # their denoising script reads and writes ./feature_save/
    credible = denoise(checkout, inputs, work)
    train_one_iteration(checkout, inputs, work)
    torch.save({"credible": torch.tensor(credible.astype(bool)), "loss": RECORD["loss"], "grads": RECORD["grads"],
                "backbone_grad_norm": RECORD["backbone_grad_norm"], "credible_in_batch": RECORD["credible_in_batch"],
                "mix_ratio": float(RECORD["config"]["mix_ratio"]), "arcface": arcface(inputs)}, work / "reference.pt")


if __name__ == "__main__":
    main()
