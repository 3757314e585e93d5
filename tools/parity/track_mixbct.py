"""MixBCT on the track, by ``yuleung/MixBCT`` (MixBCT's authors), driven by ``track_reference.py``.

Their README's flow, in the old and new training sets' place the track's items (class by class, as their data sets
are stored): the old model's features of every item (what ``tools/get_feature/get_feature.py`` writes; here the
old network's outputs, in item order), then ``tools/denoising/denoise_credible.py --T 0.9`` (the credible mask),
then ``BCT_Methods/MixBCT/train.py``'s ``main`` with ``configs/OPclass_ms1mv3_r18_to_r50_MixBCT_softmax_to_arc_f128.py``
(SGD 0.1, momentum 0.9, weight decay 5e-4 on every parameter, 35 epochs, a poly schedule of power 2 per iteration;
``PartialFC`` with ArcFace s 64, m 0.5; mix ratio 0.3), the widths, class count, item count and batch of the track.
Their ``main`` seeds torch with 666 whatever the run: each seed of the track still has its own split and old model.

Around it: their backbone (``get_model``) is the suite's embedding network; their module-level NCCL process group is
one process; their ``MXFaceDataset`` is the track's items, which their ``get_dataloader`` loads
(``DistributedSampler``, seed 0, the last partial batch dropped); without a GPU their ``DataLoaderX`` (CUDA streams)
is a plain ``DataLoader``; ``DistributedDataParallel`` is the module itself. As released one thing stops it: their
``PolyScheduler`` passes ``verbose`` to torch's ``LRScheduler``, which torch 2.x no longer takes (it is dropped, the
schedule unchanged). Their face-verification callback has no targets (``val_targets: []``, as configured);
``mxnet``, which their data and evaluation modules import, is a stand-in (``mixbct_probe.stand_in_modules``). Their
last epoch's ``model.pt`` is the model scored.

The same repository reimplements UniBCT (``BCT_Methods/UniBCT``: another classifier, ``PartialFC`` with ArcFace s 64,
m 0.5, and an unscaled prototype term); the suite's UniBCT reads ``Ashespt/AdvBCT``'s reimplementation, so its
parity runs against that one (``track_advbct.py``).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

REPOSITORY = "yuleung/MixBCT"
MARKER = "BCT_Methods/MixBCT/train.py"
STRATEGIES = ("mixbct",)
ENTRY_POINT = ("tools/denoising/denoise_credible.py main() L27 on the old model's features, then "
               "BCT_Methods/MixBCT/train.py main() L38 with configs/OPclass_ms1mv3_r18_to_r50_MixBCT_softmax_to_"
               "arc_f128.py")
SD = "f128_r18_softmax_class70"
"""Their scenario name: ``class70`` puts the feature files under ``feature_save/OPclass/``."""


def module_at(path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    os.chdir(run.work)  # their tools read and write ./feature_save/
    folder = old_features(run)
    module_at(run.checkout / "tools" / "denoising" / "denoise_credible.py", "mixbct_denoise").main(
        argparse.Namespace(SD=SD, T=0.9))
    sys.path.insert(0, str(run.checkout / "BCT_Methods" / "MixBCT"))
    one_process_group(run)
    track_data(run)
    import train as theirs

    real_config = theirs.get_config

    def config(path: str):
        cfg = real_config(path)
        cfg.update(output=str(run.work / "out"), embedding_size=run.width, num_classes=run.classes,
                   batch_size=run.batch_size, num_image=len(run.train_labels), num_epoch=run.epochs(cfg.num_epoch),
                   rec="track", credible_old_feature=str(folder / f"{SD}_credible_ratio_90_feature.npy"),
                   old_embedding=str(folder / f"{SD}_feature.npy"))
        return cfg

    theirs.get_config = config
    without_verbose()
    theirs.get_model = lambda *args, **kwargs: run.new_network()
    theirs.main(argparse.Namespace(config="configs/OPclass_ms1mv3_r18_to_r50_MixBCT_softmax_to_arc_f128.py",
                                   local_rank=0))
    network = run.new_network().to(run.device)
    network.load_state_dict(torch.load(run.work / "out" / "model.pt", map_location=run.device))
    return network.eval()
