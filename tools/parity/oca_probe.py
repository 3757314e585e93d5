"""The reference side of OCA's parity check: run under a Python environment with torch, torchvision, tqdm, pyyaml,
scikit-learn and accelerate.

    <reference venv>/bin/python tools/parity/oca_probe.py --oca PATH --work DIR

``DIR/inputs.pt`` (written by ``tools/parity/oca.py``) holds one batch: the widened backbone features of each
image, the old model's normalised features, the labels and the weights of ``ResNet_OCA``'s orthogonal layer and
classifier. This script runs the authors' own entry points (``z3n0e/OCA``) on them:

* ``train_OCA.main`` with their ``configs/train/cifar100_OCA.yaml`` (widths and class count made small): it builds
  their ``ResNet50_OCA``, whose backbone is replaced by one that returns the given features, the label-smoothing
  criterion of the configuration, and the pseudo-classifier from an old model that returns the given old features;
  then one iteration of ``OCATrainer.train`` on a one-batch loader with a stand-in optimiser that keeps the
  gradients. The run stops after that iteration (their loop would go on to ``OCATrainer.validate``, which as
  released is called with a ``criterion`` argument its signature lacks).
* ``eval.main`` with ``configs/eval/cifar100_eval_new_new_OCA.yaml`` and ``..._old_new_OCA.yaml``: the distance
  matrix their ``cmc_evaluate`` ranks (new/new, and new/old against the old model), captured on its way to their
  ``cmc``.

It writes the pseudo-classifier, the orthogonal matrix, the loss and its three terms (their averages over the one
batch), every gradient and both distance matrices to ``DIR/reference.pt``. It imports nothing of the suite and copies
none of the authors' code; the data set, optimiser, learning-rate policy, accelerator and ``torch.load`` are
stand-ins (the checkpoint ``torch.load`` returns is the given weights). Their ``models`` package imports ``cv2``
(``from cv2 import add``, unused): a stand-in module satisfies it.
"""
from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

import torch
import yaml
from torch import nn


class StopAfterTraining(Exception):
    """Raised once the one training iteration is done."""


def stand_in_imports() -> None:
    """``cv2``, which their ``models/resnet.py`` imports and never uses."""
    module = types.ModuleType("cv2")
    module.add = None
    sys.modules.setdefault("cv2", module)


class Backbone(nn.Module):
    """What their ``ResNet`` returns to ``ResNet_OCA``: ``(logits, features)``, the given features as a parameter
    whose gradient is read back (``N x C x 1 x 1``, as their average pool gives)."""

    def __init__(self, features: torch.Tensor) -> None:
        super().__init__()
        self.features = nn.Parameter(features.clone()[:, :, None, None])

    def forward(self, images: torch.Tensor) -> tuple[None, torch.Tensor]:
        return None, self.features


class OldModel(nn.Module):
    """Their old ``ResNet50`` (``norm_feature: True``): ``(logits, unit feature)`` of the images, which are the
    items' indices here; any checkpoint loads."""

    def __init__(self, features: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("table", features.clone())

    def forward(self, images: torch.Tensor) -> tuple[None, torch.Tensor]:
        return None, self.table[images.flatten(1)[:, 0].long()][:, :, None, None]

    def load_state_dict(self, *args, **kwargs) -> None:
        return None


class KeepGradients:
    """The optimiser their loop steps: ``zero_grad`` clears, ``step`` does nothing, so the gradients stay."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def zero_grad(self) -> None:
        self.model.zero_grad(set_to_none=True)

    def step(self) -> None:
        pass


class Accelerator:
    """Hugging Face ``accelerate``'s ``Accelerator`` on one CPU process."""

    device = torch.device("cpu")

    @staticmethod
    def prepare(*objects):
        return objects[0] if len(objects) == 1 else objects

    @staticmethod
    def backward(loss: torch.Tensor) -> None:
        loss.backward()


class Data:
    """``SubImageCIFAR100``: one batch of ``(paths, (images, labels))``, the images being the items' indices."""

    def __init__(self, labels: torch.Tensor) -> None:
        paths = [f"image{i}" for i in range(len(labels))]
        images = torch.arange(len(labels), dtype=torch.float32)[:, None, None, None]
        self.train_loader = self.val_loader = [(paths, (images, labels))]


def small(config: dict, inputs: dict) -> dict:
    """Their configuration with the check's widths and class count (every other value as released)."""
    widths = inputs["widths"]
    for key in ("arch_params", "gallery_arch_params", "old_arch_params"):
        params = config.get(key)
        if params is None:
            continue
        if params["arch"] == "ResNet50_OCA":
            params.update(num_classes=inputs["classes"], embedding_dim=widths["old"],
                          embedding_dim_old=widths["old"], to_add_dim=widths["added"])
        else:
            params.update(embedding_dim=widths["old"])
    return config


def model_getter(real_get_model, inputs: dict):
    """Their ``get_model``, building ``ResNet50_OCA`` for real around :class:`Backbone`, and the old model as
    :class:`OldModel`."""
    def get_model(arch_params: dict, **kwargs) -> nn.Module:
        if arch_params["arch"] != "ResNet50_OCA":
            return OldModel(inputs["old_features"])
        model = real_get_model(arch_params, **kwargs)
        model.resnet = Backbone(inputs["reference_features"])
        missing, unexpected = model.load_state_dict(inputs["reference_state"], strict=False)
        if missing != ["resnet.features"] or unexpected:
            raise RuntimeError(f"the reference weights do not fit ResNet_OCA: {missing}, {unexpected}")
        return model
    return get_model


def train(oca: Path, inputs: dict, work: Path) -> dict:
    import train_OCA
    from trainers import OCATrainer
    from utils.getters import get_model

    recorded = {}

    class Recording(OCATrainer):
        def train(self, **kwargs):
            recorded["terms"] = super().train(**kwargs)
            recorded["pseudo_classifier"] = kwargs["pseudo_classifier"].clone()
            recorded["orthogonal"] = kwargs["model"].fc_orth.weight.detach().clone()
            recorded["grads"] = {name: p.grad.clone() for name, p in kwargs["model"].named_parameters()
                                 if p.grad is not None}
            raise StopAfterTraining

    train_OCA.get_model = model_getter(get_model, inputs)
    train_OCA.Accelerator = Accelerator
    train_OCA.get_optimizer = lambda model, **kwargs: KeepGradients(model)
    train_OCA.get_policy = lambda optimizer, **kwargs: (lambda epoch, iteration=None: None)
    train_OCA.SubImageCIFAR100 = lambda **kwargs: Data(inputs["labels"])
    train_OCA.OCATrainer = Recording
    config = small(yaml.safe_load((oca / "configs/train/cifar100_OCA.yaml").read_text()), inputs)
    config["output_model_path"] = str(work / "unused.pt")
    try:
        train_OCA.main(config)
    except StopAfterTraining:
        pass
    loss, bct, ce, cosine = recorded["terms"]
    return {"loss": loss, "terms": {"classification": ce, "influence": bct, "alignment": cosine},
            "pseudo_classifier": recorded["pseudo_classifier"], "grads": recorded["grads"],
            "orthogonal": recorded["orthogonal"],
            "label_smoothing": config["label_smoothing"]}


def evaluate(oca: Path, inputs: dict, work: Path) -> dict[str, torch.Tensor]:
    import eval as oca_eval
    from utils import eval_utils
    from utils.getters import get_model

    captured, real_cmc = {}, eval_utils.cmc

    def cmc(distmat, **kwargs):
        captured["distmat"] = distmat.clone()
        return real_cmc(distmat, **kwargs)

    eval_utils.cmc = cmc
    oca_eval.get_model = model_getter(get_model, inputs)
    oca_eval.SubImageCIFAR100 = lambda **kwargs: Data(inputs["labels"])
    out = {}
    for case, name in (("new/new", "cifar100_eval_new_new_OCA.yaml"), ("new/old", "cifar100_eval_old_new_OCA.yaml")):
        config = small(yaml.safe_load((oca / "configs/eval" / name).read_text()), inputs)
        config["txt_log_path"] = str(work / f"{name}.txt")
        oca_eval.main(config)
        out[case] = captured.pop("distmat")
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--oca", required=True)
    parser.add_argument("--work", required=True)
    args = parser.parse_args()
    work, oca = Path(args.work), Path(args.oca).resolve()
    inputs = torch.load(work / "inputs.pt", weights_only=False)
    state = {**inputs["reference_state"], "resnet.features": inputs["reference_features"][:, :, None, None]}
    torch.load = lambda *args, **kwargs: {"model_state_dict": state}
    sys.dont_write_bytecode = True
    stand_in_imports()
    sys.path.insert(0, str(oca))
    result = train(oca, inputs, work)
    result["distances"] = evaluate(oca, inputs, work)
    torch.save(result, work / "reference.pt")


if __name__ == "__main__":
    main()
