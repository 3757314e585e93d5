"""RACT on the track, by the hot-refresh authors' code (``TencentARC/OpenCompatible``), driven by
``track_reference.py``.

Their ``train_bct.py``'s ``main(config)`` runs with the configuration their ``parser_option`` makes of the command
in ``docs/train_test.md`` ("Train new (compatible) model": ``config.json``, ``--comp_loss_type contra_ract
--comp_loss_topk 10 --lr_scheduler cosine --lr 0.1 --epochs 30 --use_amp``; SGD, momentum 0.9, weight decay 1e-4 on
every parameter; timm's ``CosineLRScheduler`` per iteration with a one-epoch warm-up from lr x 1e-3 to lr x 1e-2;
``BackwardCompatibleLoss`` with ``gather_all`` true), the batch the suite's 128 instead of ``-bs 192``. Its
``main`` spawns one ``main_worker`` per GPU; here one, in this process (``TrackRun.spawned``), with a one-process
gloo group; ``main_worker`` builds their models (``build_model``), optimiser, scheduler and loss and trains with
``LandmarkTrainer.train``. Around it: their ``Resnet_GeM`` is built around the suite's embedding network in place
of torchvision's ResNet, its ``fc_emb`` the identity (the network ends at the feature); the old model loads the old
network's weights from a checkpoint through their ``load_pretrained_model`` (its ``fc_classifier``, which
``contra_ract`` never reads, keeps its initial weights: the old classifier has fewer rows than theirs); the track's
items are a data set their ``generate_train_dataloder`` loads (``DistributedSampler``, seed 0 as released, the last
partial batch kept); ``cudalize`` wraps the new model in the one-process ``DistributedDataParallel``, as its
distributed branch does (on a machine without a GPU it would return the model unwrapped, and their trainer reads
``new_model.module``). Their evaluation (``evaluate_func`` on GLDv2 every 5 epochs and at the end) is not run:
the suite's protocol scores the new model after their last epoch.
"""
from __future__ import annotations

import sys

import torch
from torch import nn
from torch.utils.data import TensorDataset

REPOSITORY = "TencentARC/OpenCompatible"
MARKER = "model/loss.py"
STRATEGIES = ("ract",)
ENTRY_POINT = ("train_bct.py main() L18 (one main_worker L38, LandmarkTrainer.train trainer/trainer.py L50) with "
               "the configuration of docs/train_test.md's command (--comp_loss_type contra_ract --comp_loss_topk 10)")
ARCH = "track_embedding"


def command(run) -> list[str]:
    """Their documented command (module docstring) with the track's paths, widths, class count, batch and seed."""
    backend, url = run.process_group()
    return ["train_bct.py", "--name", "new_track", "-c", str(run.checkout / "config.json"),
            "--dist-url", url, "--dist-backend", backend, "--multiprocessing-distributed", "--world-size", "1",
            "--rank", "0", "--arch", ARCH, "--old_arch", ARCH, "--emb_dim", str(run.width),
            "--old_emb_dim", str(run.width), "--class_num", str(run.classes), "--epochs", str(run.epochs(30)),
            "-bs", str(run.batch_size), "--lr_scheduler", "cosine", "--lr", "0.1", "--val_period", "5",
            "--use_amp", "--old_pretrained_model_path", str(run.work / "old_checkpoint.pth.tar"),
            "--comp_loss_type", "contra_ract", "--comp_loss_topk", "10", "--seed", str(run.seed)]


def train(run, strategy: str):
    import model.build
    import train_bct
    import trainer.trainer
    from data_loader.GLDv2 import generate_train_dataloder
    from model.model import Resnet_GeM
    from utils.util import parser_option

    built = []

    def backbone(model_type: str, class_num: int, emb_dim: int) -> nn.Module:
        network = run.new_network() if not built else run.network(tuple(run.data["old"]["columns"]))
        network.fc = nn.Linear(network.num_features, 1)
        model = Resnet_GeM(network, class_num, emb_dim)
        model.fc_emb = nn.Identity()
        built.append(model)
        return model

    def checked(args, logger):
        models = build(args, logger)
        state = models.old_model.backbone.network.state_dict()
        if not all(torch.equal(state[k].cpu(), v) for k, v in run.data["old"]["backbone"].items()):
            raise RuntimeError("their load_pretrained_model did not give the old model its weights")
        return models

    class TrackTrain:
        def __init__(self, args) -> None:
            self.train_loader = generate_train_dataloder(
                TensorDataset(run.train_items, run.train_labels), args.distributed,
                batch_size=args.trainer["batch_size"], num_workers=args.trainer["num_workers"],
                use_pos_sampler=args.use_pos_sampler)
            self.class_num = run.classes

    class NoEvaluation:
        def __init__(self, args) -> None:
            self.query_loader = self.gallery_loader = self.query_gts = None

    old = run.frozen_network("old")
    torch.save({"model": {f"backbone.{k}": v for k, v in old.state_dict().items()}},
               run.work / "old_checkpoint.pth.tar")
    build = train_bct.build_model
    model.build.build_backbone = backbone
    train_bct.build_model = checked
    train_bct.cudalize = lambda module, args: torch.nn.parallel.DistributedDataParallel(module.to(run.device))
    train_bct.module_data.GLDv2TrainDataset = TrackTrain
    train_bct.module_data.GLDv2EvalDataset = train_bct.module_data.GLDv2TestDataset = NoEvaluation
    trainer.trainer.evaluate_func = lambda *args, **kwargs: 0.0
    sys.argv = command(run)
    run.spawned(train_bct.main, parser_option())
    return built[0].eval()
