"""The reference side of BT²'s parity check: run under a Python environment with torch, tqdm and scikit-learn.

    <reference venv>/bin/python tools/parity/bt2_probe.py --bt2 PATH --work DIR

``DIR/inputs.pt`` (written by ``tools/parity/bt2.py``) holds one batch: the backbone features (with the ``d_old``
channels their ResNet adds for ``fc3``), the old model's and
the independent new model's normalised features of each image, the labels, the pseudo-classifier and the
weights of ``ResNet_ortho``'s basis transformation. This script builds the authors' ``ResNet_ortho``
(``YifeiZhou02/BT-2``, ``models/resnet.py``) with those weights around a backbone that returns the given features,
and runs one iteration of their ``TransferTrainer.train`` (``trainers/transfer_trainer.py``) on a one-batch loader
with a stand-in optimiser that keeps the gradients. It writes the loss (their average over the one batch) and
every gradient to ``DIR/reference.pt``. It imports nothing of the suite and copies none of the authors' code.
Their ``models`` package imports ``cv2`` and ``transformers`` for other architectures (``from cv2 import add``,
unused; the ViT and CLIP models); stand-in modules satisfy those imports, and nothing on ``ResNet_ortho``'s path
reads them.
"""
from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

import torch
from torch import nn


def stand_in_imports() -> None:
    """Modules their package imports for code this check never runs (module docstring)."""
    def stand_in(attribute: str) -> type:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return type(attribute, (), {})

    for name in ("cv2", "transformers"):
        module = types.ModuleType(name)
        module.__getattr__ = stand_in
        sys.modules.setdefault(name, module)


class Backbone(nn.Module):
    """What their ``ResNet`` returns to ``ResNet_ortho``: ``(logits, features)``, the given features as a
    parameter whose gradient is read back (``N x C x 1 x 1``, as their average pool gives)."""

    def __init__(self, features: torch.Tensor) -> None:
        super().__init__()
        self.features = nn.Parameter(features.clone()[:, :, None, None])

    def forward(self, images: torch.Tensor) -> tuple[None, torch.Tensor]:
        return None, self.features


class KeepGradients:
    """The optimiser their loop steps: ``zero_grad`` clears, ``step`` does nothing, so the gradients stay."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def zero_grad(self) -> None:
        self.model.zero_grad(set_to_none=True)

    def step(self) -> None:
        pass


class Accelerator:
    """Hugging Face ``accelerate``'s ``backward`` on one CPU process."""

    @staticmethod
    def backward(loss: torch.Tensor) -> None:
        loss.backward()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bt2", required=True)
    parser.add_argument("--work", required=True)
    args = parser.parse_args()
    work = Path(args.work)
    inputs = torch.load(work / "inputs.pt", weights_only=False)
    stand_in_imports()
    sys.path.insert(0, str(Path(args.bt2).resolve()))
    from models.resnet import Bottleneck, ResNet_ortho
    from trainers.transfer_trainer import TransferTrainer

    widths = inputs["widths"]
    model = ResNet_ortho(Bottleneck, [1, 1, 1, 1], num_classes=inputs["classes"], embedding_dim=widths["new"],
                         embedding_dim_old=widths["old"], norm_feature=True, to_add_dim=widths["old_part"],
                         C=inputs["scale"])
    model.resnet = Backbone(inputs["reference_features"])
    model.load_state_dict(inputs["reference_state"], strict=False)
    paths = [f"image{i}" for i in range(len(inputs["labels"]))]
    old_table = dict(zip(paths, inputs["old_features"], strict=True))
    independent_table = dict(zip(paths, inputs["independent_features"], strict=True))
    images = torch.zeros(len(paths), 3, 1, 1)
    loss = TransferTrainer().train(
        [((paths, images), inputs["labels"])], model, old_table, independent_table, criterion=None,
        optimizer=KeepGradients(model), device=torch.device("cpu"), accelerator=Accelerator(),
        pseudo_classifier=inputs["pseudo_classifier"], lambda_1=inputs["weights"]["independent"],
        lambda_2=inputs["weights"]["influence"], lambda_3=inputs["weights"]["old"])
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    torch.save({"loss": torch.tensor(loss), "grads": grads}, work / "reference.pt")


if __name__ == "__main__":
    main()
