"""OCA on the track, by its authors' code (``z3n0e/OCA``), driven by ``track_reference.py``.

Their ``train_OCA.py``'s ``main(config)`` runs with ``configs/train/cifar100_OCA.yaml`` (Adam 1e-3, weight decay
2^-15 on every parameter, a 5-epoch warm-up then cosine to 0 per epoch, 100 epochs, label smoothing 0.1,
``to_add_dim`` 32), its widths and class counts those of the track and the suite's batch of 128 instead of 64: it
builds their ``ResNet50_OCA`` and old ``ResNet50`` (``get_model``), loads the old model's checkpoint, makes the
pseudo-classifier and trains with ``OCATrainer.train`` once per epoch. As released it stops after the first epoch:
it calls ``OCATrainer.validate(val_loader=..., model=..., criterion=..., device=...)``, whose signature has no
``criterion``; that call (the classifier's top-1 on CIFAR-100's test split, printed) is a stand-in that returns
zeros, so that the loop runs its epochs; the suite's protocol scores the model. Around it: their ``ResNet`` inside
``ResNet_OCA`` is the suite's embedding network followed by a linear layer to their width (old + added), as the
suite's OCA head widens a fixed-width backbone (its ``compatible`` and ``added`` layers, ``heads.py``); their old
``ResNet50`` is the suite's old network, returning ``(None, unit feature)`` as their ``norm_feature: True`` model,
loaded strictly by their ``load_state_dict`` from a checkpoint in their layout; without a GPU the new model comes
wrapped in ``DataParallel``, as their GPU path wraps it (their checkpoints read ``model.module``);
``SubImageCIFAR100`` gives the track's items as ``(names, (items, labels))``, shuffled, the last partial batch kept,
as their loader. Their
``models`` package imports ``cv2`` (unused): a stand-in (``oca_probe.stand_in_imports``). The retrieval feature is
``ResNet_OCA``'s fourth output (``new_feature``), as their ``eval.py`` ranks.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import yaml
from torch import nn

REPOSITORY = "z3n0e/OCA"
MARKER = "trainers/OCA_trainer.py"
STRATEGIES = ("oca",)
ENTRY_POINT = ("train_OCA.py main() L21 (OCATrainer.train, trainers/OCA_trainer.py L24, per epoch) with "
               "configs/train/cifar100_OCA.yaml; the released main stops at OCATrainer.validate(criterion=...) "
               "after epoch 1 (L112): validation is a stand-in")
CONFIG = "configs/train/cifar100_OCA.yaml"


class Widened(nn.Module):
    """Their ``ResNet``'s place in ``ResNet_OCA``: ``(None, features)``, the embedding network's feature through a
    linear layer to ``width`` channels, ``N x C x 1 x 1``."""

    def __init__(self, network: nn.Module, width: int) -> None:
        super().__init__()
        self.network = network
        self.widen = nn.Linear(network.num_features, width)

    def forward(self, items: torch.Tensor) -> tuple[None, torch.Tensor]:
        return None, self.widen(self.network(items))[:, :, None, None]


class OldModel(nn.Module):
    """Their old ``ResNet50`` (``norm_feature: True``): ``(None, unit feature)``."""

    def __init__(self, network: nn.Module) -> None:
        super().__init__()
        self.network = network

    def forward(self, items: torch.Tensor) -> tuple[None, torch.Tensor]:
        return None, F.normalize(self.network(items), dim=1)


class Named(torch.utils.data.Dataset):
    """The items as ``SubImageCIFAR100`` yields images: ``(name, (item, label))``."""

    def __init__(self, items: torch.Tensor, labels: torch.Tensor) -> None:
        self.items, self.labels = items, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        return f"item{index}", (self.items[index], self.labels[index])


class TrackData:
    """``SubImageCIFAR100``'s loaders on the track's items (no validation items)."""

    def __init__(self, run, batch_size: int) -> None:
        self.train_loader = torch.utils.data.DataLoader(Named(run.train_items, run.train_labels),
                                                        batch_size=batch_size, shuffle=True)
        self.val_loader: list = []


def train(run, strategy: str):
    from oca_probe import stand_in_imports

    stand_in_imports()
    import train_OCA
    from utils.getters import get_model

    config = yaml.safe_load((run.checkout / CONFIG).read_text())
    config["arch_params"].update(num_classes=run.classes, embedding_dim=run.width, embedding_dim_old=run.width)
    config["old_arch_params"].update(num_classes=run.old_classes, embedding_dim=run.width)
    config["dataset_params"].update(num_classes=run.classes, batch_size=run.batch_size)
    config["epochs"] = config["lr_policy_params"]["epochs"] = run.epochs(config["epochs"])
    config["old_model_path"] = str(run.work / "old.pt")
    config["output_model_path"] = str(run.work / "oca_new.pt")
    torch.save({"model_state_dict": OldModel(run.frozen_network("old")).state_dict()}, config["old_model_path"])
    built = []

    def their_model(arch_params: dict, **kwargs) -> nn.Module:
        if arch_params["arch"] != config["arch_params"]["arch"]:
            return OldModel(run.network(tuple(run.data["old"]["columns"])))
        model = get_model(arch_params, **kwargs)
        model.resnet = Widened(run.new_network(), arch_params["embedding_dim_old"] + arch_params["to_add_dim"])
        built.append(model)
        return model if torch.cuda.is_available() else nn.DataParallel(model)

    train_OCA.get_model = their_model
    train_OCA.SubImageCIFAR100 = lambda **kwargs: TrackData(run, kwargs["batch_size"])
    train_OCA.OCATrainer.validate = lambda self, **kwargs: (0.0, 0.0)
    train_OCA.main(config)
    model = built[0].eval()
    return lambda items: model(items)[3]
