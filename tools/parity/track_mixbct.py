"""MixBCT and UniBCT on the track, by ``yuleung/MixBCT`` (MixBCT's authors; UniBCT's authors released no code, and
this repository's reimplementation is the one the suite's recipe reads), driven by ``track_reference.py``.

Their README's flow, in the old and new training sets' place the track's items (class by class, as their data sets
are stored): the old model's features of every item (what ``tools/get_feature/get_feature.py`` writes; here the
old network's outputs, in item order), then ``tools/denoising/denoise_credible.py --T 0.9`` (MixBCT's credible
mask) or ``tools/get_feature/get_avg_feature.py`` (UniBCT's first prototypes), then
``BCT_Methods/<method>/train.py``'s ``main`` with ``configs/OPclass_ms1mv3_r18_to_r50_<method>_softmax_to_arc_f128.py``
(SGD 0.1, momentum 0.9, weight decay 5e-4 on every parameter, 35 epochs; ``PartialFC`` with ArcFace s 64, m 0.5;
MixBCT: mix ratio 0.3, a poly schedule of power 2 per iteration; UniBCT: ``StepLR`` x 0.1 after epochs 20, 26 and
32, its compatibility term weighted 0 before epoch 10, the prototypes refined at epochs 10 and 20 by
``refine_prototype.PrototypeGeneration``), the widths, class count, item count and batch of the track. Their
``main`` seeds torch with 666 whatever the run: each seed of the track still has its own split and old model.

Around it: their backbone (``get_model``; UniBCT's ``get_model_bct`` adds their ``BCT_FC`` on the prototypes) is
the suite's embedding network; their module-level NCCL process group is one process; their ``MXFaceDataset`` is the
track's items, which their ``get_dataloader`` loads (``DistributedSampler``, seed 0, the last partial batch
dropped); without a GPU their ``DataLoaderX`` (CUDA streams) is a plain ``DataLoader``; ``DistributedDataParallel``
is the module itself. As released two things stop them: MixBCT's ``PolyScheduler`` passes ``verbose`` to torch's
``LRScheduler``, which torch 2.x no longer takes (it is dropped, the schedule unchanged); UniBCT's
``PrototypeGeneration`` splits its work between processes 0 (old features) and 1 (new features) and reads the
latter's file, so in one process it is called as process 1, then as process 0. Their face-verification callback
has no targets (``val_targets: []``, as configured); ``mxnet``, which their data and evaluation modules import, is a
stand-in (``mixbct_probe.stand_in_modules``). Their last epoch's ``model.pt`` is the model scored.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

REPOSITORY = "yuleung/MixBCT"
MARKER = "BCT_Methods/MixBCT/train.py"
STRATEGIES = ("mixbct", "unibct")
METHODS = {"mixbct": "MixBCT", "unibct": "UniBCT"}
ENTRY_POINT = ("tools/denoising/denoise_credible.py main() L27 (mixbct) or tools/get_feature/get_avg_feature.py "
               "main() L9 (unibct) on the old model's features, then BCT_Methods/MixBCT/train.py main() L38 or "
               "BCT_Methods/UniBCT/train.py main() L42 with configs/OPclass_ms1mv3_r18_to_r50_<method>_softmax_to_"
               "arc_f128.py")
SD = "f128_r18_softmax_class70"
"""Their scenario name: ``class70`` puts the feature files under ``feature_save/OPclass/``."""


def module_at(path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class WithPrototypes(nn.Module):
    """UniBCT's backbone (``iresnet_bct``): ``(feature, BCT_FC(feature))``, their ``BCT_FC`` on the prototypes."""

    def __init__(self, network: nn.Module, prototypes: torch.Tensor) -> None:
        super().__init__()
        from backbones.iresnet_bct import BCT_FC

        self.network = network
        self.BCT_FC = BCT_FC(fix_weights=prototypes)

    def forward(self, items: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        feature = self.network(items)
        return feature, self.BCT_FC(feature)


def old_features(run) -> str:
    """The old model's features and labels of every item, where their tools read them; the folder."""
    folder = run.work / "feature_save" / "OPclass"
    folder.mkdir(parents=True, exist_ok=True)
    old = run.frozen_network("old").to(run.device)
    with torch.no_grad():
        features = torch.cat([old(batch.to(run.device)).cpu() for batch in run.train_items.split(1024)])
    np.save(folder / f"{SD}_feature.npy", features.numpy())
    np.save(folder / f"{SD}_label.npy", run.train_labels.numpy())
    return folder


def without_verbose() -> None:
    """torch's ``LRScheduler`` taking (and dropping) the ``verbose`` argument their ``PolyScheduler`` passes."""
    from torch.optim.lr_scheduler import LRScheduler

    init = LRScheduler.__init__
    LRScheduler.__init__ = lambda self, optimizer, last_epoch=-1, verbose=None: init(self, optimizer, last_epoch)


def one_process_group(run) -> None:
    """Their module-level ``init_process_group("nccl", tcp://...)`` as one process (:meth:`run.process_group`)."""
    import torch.distributed as dist

    backend, url = run.process_group()
    original = dist.init_process_group
    dist.init_process_group = lambda *args, **kwargs: original(backend, init_method=url, rank=0, world_size=1)


def track_data(run) -> None:
    """Their ``MXFaceDataset`` as the track's items ``(item, label, index)``; without a GPU, ``DataLoaderX`` as a
    plain ``DataLoader``."""
    import dataset

    items = TensorDataset(run.train_items, run.train_labels, torch.arange(len(run.train_labels)))
    dataset.MXFaceDataset = lambda root_dir, local_rank: items
    if run.device.type != "cuda":
        dataset.DataLoaderX = lambda local_rank, **kwargs: DataLoader(**kwargs)


def train(run, strategy: str):
    from mixbct_probe import stand_in_modules

    stand_in_modules()
    method = METHODS[strategy]
    os.chdir(run.work)  # their tools read and write ./feature_save/
    folder = old_features(run)
    tools = run.checkout / "tools"
    if strategy == "mixbct":
        module_at(tools / "denoising" / "denoise_credible.py", "mixbct_denoise").main(argparse.Namespace(SD=SD, T=0.9))
    else:
        module_at(tools / "get_feature" / "get_avg_feature.py", "mixbct_average").main(argparse.Namespace(SD=SD))
    sys.path.insert(0, str(run.checkout / "BCT_Methods" / method))
    one_process_group(run)
    track_data(run)
    import train as theirs

    real_config = theirs.get_config
    old_path = run.work / "old_model.pt"
    torch.save(run.frozen_network("old").state_dict(), old_path)

    def config(path: str):
        cfg = real_config(path)
        cfg.update(output=str(run.work / "out"), embedding_size=run.width, num_classes=run.classes,
                   batch_size=run.batch_size, num_image=len(run.train_labels), num_epoch=run.epochs(cfg.num_epoch),
                   rec="track", credible_old_feature=str(folder / f"{SD}_credible_ratio_90_feature.npy"),
                   old_embedding=str(folder / f"{SD}_feature.npy"),
                   old_prototype=str(folder / f"{SD}_avg_feature.npy"), old_model_path=str(old_path))
        return cfg

    theirs.get_config = config
    if strategy == "mixbct":
        without_verbose()
        theirs.get_model = lambda *args, **kwargs: run.new_network()
    else:
        refine = theirs.PrototypeGeneration
        theirs.get_model_bct = lambda *args, syn_weight, **kwargs: WithPrototypes(run.new_network(), syn_weight)
        theirs.get_model = lambda *args, **kwargs: run.network(tuple(run.data["old"]["columns"]))
        theirs.PrototypeGeneration = lambda cfg, new, old, loader, rank: [refine(cfg, new, old, loader, r)
                                                                         for r in (1, 0)]
    theirs.main(argparse.Namespace(config=f"configs/OPclass_ms1mv3_r18_to_r50_{method}_softmax_to_arc_f128.py",
                                   local_rank=0))
    saved = torch.load(run.work / "out" / "model.pt", map_location=run.device)
    if strategy == "unibct":
        saved = {k.removeprefix("network."): v for k, v in saved.items() if k.startswith("network.")}
    network = run.new_network().to(run.device)
    network.load_state_dict(saved)
    return network.eval()
