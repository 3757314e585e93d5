"""BT² on the track, by its authors' code (``YifeiZhou02/BT-2``), driven by ``track_reference.py``.

Their ``train_feature_transfer.py``'s ``main(config)`` runs with ``configs/cifar100_transfer.yaml`` (Adam 1e-3,
weight decay 2^-15 on every parameter, a 5-epoch warm-up then cosine to 0 per epoch, 100 epochs; lambda_1 1,
lambda_2 10, lambda_3 5; ``to_add_dim`` 32, ``C`` 2), its widths and class count those of the track: it builds
their ``ResNet50_ortho`` (``get_model``), the pseudo-classifier from the old model, the tables of old and
independent features (``build_feature_dict``) and trains with ``TransferTrainer.train`` once per epoch. Around it:
their ``ResNet`` inside ``ResNet_ortho`` returns the suite's embedding network's feature with ``embedding_dim_old``
zero channels after it (their backbone is that much wider so that ``fc3`` reads them; zeros make their model the
suite's function, as in the step check, ``bt2_probe.py``); the old and the independent new model, which their
config loads as TorchScript files (``torch.jit.load``), are the suite's, returning ``(logits, unit feature)`` as
their ``norm_feature: True`` backbones do; ``SubImageFolder`` gives the track's items as ``((names, items),
labels)`` in the suite's batch of 128, shuffled, the last partial batch kept (as their loader: their feature
tables are built over it), and no validation items (their
per-epoch validation prints the classifier's top-1 on CIFAR-100's test split; the suite's protocol scores the
model). Their ``models`` package imports ``cv2`` and ``transformers`` for other architectures: stand-ins
(``bt2_probe.stand_in_imports``). The retrieval feature is ``ResNet_ortho``'s fourth output, as their ``eval.py``
ranks.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import yaml
from torch import nn

REPOSITORY = "YifeiZhou02/BT-2"
MARKER = "trainers/transfer_trainer.py"
STRATEGIES = ("bt2",)
ENTRY_POINT = ("train_feature_transfer.py main() L26 (TransferTrainer.train, trainers/transfer_trainer.py L28, per "
               "epoch) with configs/cifar100_transfer.yaml")
CONFIG = "configs/cifar100_transfer.yaml"


class WidenedBackbone(nn.Module):
    """Their ``ResNet``'s place in ``ResNet_ortho``: ``(None, features)``, the embedding network's feature and
    ``zeros`` more channels, ``N x C x 1 x 1``."""

    def __init__(self, network: nn.Module, zeros: int) -> None:
        super().__init__()
        self.network, self.zeros = network, zeros

    def forward(self, items: torch.Tensor) -> tuple[None, torch.Tensor]:
        feature = self.network(items)
        return None, torch.cat([feature, feature.new_zeros(len(feature), self.zeros)], dim=1)[:, :, None, None]


class FrozenModel(nn.Module):
    """A frozen suite model as their TorchScript backbones answer: ``(logits, unit feature)``."""

    def __init__(self, network: nn.Module, classifier: torch.Tensor | None) -> None:
        super().__init__()
        self.network = network
        self.classifier = classifier

    def forward(self, items: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        feature = self.network(items)
        logits = None if self.classifier is None else feature @ self.classifier.to(feature.device).t()
        return logits, F.normalize(feature, dim=1)


class Named(torch.utils.data.Dataset):
    """The items as their ``SubImageFolder`` yields images: ``((name, item), label)``; the names key their feature
    tables."""

    def __init__(self, items: torch.Tensor, labels: torch.Tensor) -> None:
        self.items, self.labels = items, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        return (f"item{index}", self.items[index]), self.labels[index]


class TrackData:
    """Their ``SubImageFolder``'s loaders on the track's items."""

    def __init__(self, run) -> None:
        self.train_loader = torch.utils.data.DataLoader(Named(run.train_items, run.train_labels),
                                                        batch_size=run.batch_size, shuffle=True)
        self.val_loader: list = []


def train(run, strategy: str):
    from bt2_probe import stand_in_imports

    stand_in_imports()
    import train_feature_transfer as transfer
    from utils.getters import get_model

    config = yaml.safe_load((run.checkout / CONFIG).read_text())
    config["arch_params"].update(num_classes=run.classes, embedding_dim=run.width, embedding_dim_old=run.width)
    config["epochs"] = config["lr_policy_params"]["epochs"] = run.epochs(config["epochs"])
    config["output_model_path"] = str(run.work / "transfer_new.pt")
    built = []

    def their_model(arch_params: dict, **kwargs) -> nn.Module:
        model = get_model(arch_params, **kwargs)
        model.resnet = WidenedBackbone(run.new_network(), arch_params["embedding_dim_old"])
        built.append(model)
        return model

    frozen = iter([FrozenModel(run.frozen_network("old"), run.old_classifier),
                   FrozenModel(run.frozen_network("independent"), None)])
    transfer.get_model = their_model
    transfer.SubImageFolder = lambda **kwargs: TrackData(run)
    torch.jit.load = lambda *args, **kwargs: next(frozen)
    transfer.main(config)
    model = built[0].eval()
    return lambda items: model(items)[3]
