"""The reference side of the track's end-to-end parity (results/parity/README.md §12): run under the reference's own
Python by ``tools/parity/track.py``.

    <reference venv>/bin/python tools/parity/track_reference.py --reference NAME --checkout PATH --work DIR \\
        --strategy S --seed K [--epochs N]

``DIR/data.pt`` (written by ``track.py``) holds the upgrade split as the suite's run reads it: the items of every
class (each item the frozen encoders' cached features side by side) and their labels, the test items, the old
model (its embedding network's weights, the columns it reads and its classifier) and, for BT², the independent new
model. This script puts the checkout first on the import path, seeds Python's, NumPy's and torch's generators with
the seed (each reference then seeds them its own way too), and calls ``train(run, strategy)`` of
``tools/parity/track_<NAME>.py``, which drives the authors' own training loop on these items and returns their
trained model's retrieval feature as a function of a batch of items; the features of the test items go to
``DIR/reference.pt``. It copies none of the authors' code; of the suite it imports only
:class:`cl2r_bench.models.EmbeddingNetwork`, the backbone their models are built around. Without a GPU, their
``.cuda()`` calls return the object they are called on.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

ROOT = Path(__file__).resolve().parents[2]
EVAL_BATCH = 1024


class Items(nn.Module):
    """A backbone over items: the embedding network applied to each item's features, whatever trailing unit
    dimensions a reference's image pipeline gives them (``N x D`` or ``N x D x 1 x 1``); ``num_features`` its
    output width, as timm's backbones say theirs."""

    def __init__(self, network: nn.Module) -> None:
        super().__init__()
        self.network = network
        self.num_features = network.out_dim

    def forward(self, items: torch.Tensor) -> torch.Tensor:
        return self.network(items.flatten(1))


class TrackRun:
    """What a reference's file gets: the data, the networks their models are built around, loaders, the seed,
    the epochs and a folder of its own."""

    def __init__(self, data: dict, checkout: Path, work: Path, seed: int, epochs: int | None) -> None:
        from cl2r_bench.models import EmbeddingNetwork

        self.data, self.checkout, self.work, self.seed, self.epochs_override = data, checkout, work, seed, epochs
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.train_items, self.train_labels = data["train_items"], data["train_labels"]
        self.test_items = data["test_items"]
        self.classes, self.old_classes, self.batch_size = data["classes"], data["old_classes"], data["batch_size"]
        self.width = data["embedding"]["out_dim"]
        self._network = EmbeddingNetwork

    def epochs(self, released: int) -> int:
        """The authors' number of epochs, or the smoke run's ``--epochs``."""
        return self.epochs_override or released

    def new_network(self) -> Items:
        """A freshly initialised embedding network over the new encoder's columns (the new model's backbone)."""
        return self.network(tuple(self.data["embedding"]["new_columns"]))

    def network(self, columns: tuple[int, int]) -> Items:
        """A freshly initialised embedding network over the items' ``columns``."""
        shape = self.data["embedding"]
        return Items(self._network(columns[1] - columns[0], shape["width"], shape["out_dim"], columns=columns))

    def frozen_network(self, name: str) -> Items:
        """The embedding network of the old model (``name`` ``old``) or of the independent new model
        (``independent``), with its weights, in eval mode and without gradients."""
        network = self.network(tuple(self.data[name]["columns"]))
        network.network.load_state_dict(self.data[name]["backbone"])
        return network.eval().requires_grad_(False)

    @property
    def old_classifier(self) -> torch.Tensor:
        """The old model's classifier rows (old classes x width; bias-free)."""
        return self.data["old"]["classifier"]

    def loader(self, *tensors: torch.Tensor, train: bool = True) -> DataLoader:
        """``tensors`` (one row per training item, e.g. the items and their labels) in batches of the run's size:
        for training shuffled by torch's generator with the last partial batch dropped, as the suite's epochs
        are; else every item once, in order."""
        return DataLoader(TensorDataset(*tensors), batch_size=self.batch_size, shuffle=train, drop_last=train)

    def spawned(self, main: Callable, *args) -> None:
        """Their ``main(*args)``, which spawns one worker per GPU (``torch.multiprocessing.spawn``, in fresh processes
        that would not hold the stand-ins), with one worker in this process: while it runs, ``spawn`` calls the worker
        as process 0 and ``torch.cuda.device_count`` is 1 (the GPU, or the CPU standing in for it)."""
        spawn, count = torch.multiprocessing.spawn, torch.cuda.device_count
        torch.multiprocessing.spawn = lambda worker, nprocs, args=(), **kwargs: worker(0, *args)
        torch.cuda.device_count = lambda: 1
        try:
            main(*args)
        finally:
            torch.multiprocessing.spawn, torch.cuda.device_count = spawn, count

    def process_group(self) -> tuple[str, str]:
        """``(backend, init_method)`` of a one-process group: NCCL on a GPU (their backend), else gloo, and a file
        in the run's folder."""
        return "nccl" if self.device.type == "cuda" else "gloo", f"file://{self.work / 'process_group'}"

    @torch.no_grad()
    def features(self, feature: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """``feature`` of every test item, in batches, on the CPU."""
        out = [feature(batch.to(self.device)).float().cpu() for batch in self.test_items.split(EVAL_BATCH)]
        return torch.cat(out).reshape(len(self.test_items), -1)


class OneProcess(nn.Module):
    """``DistributedDataParallel`` in one process: the module under ``.module``, its tensor arguments moved to the
    run's device as DDP moves them to its device (gradients of one process need no averaging)."""

    device = torch.device("cpu")

    def __init__(self, module: nn.Module, *args, **kwargs) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        def moved(value):
            return value.to(self.device) if isinstance(value, torch.Tensor) else value

        return self.module(*map(moved, args), **{k: moved(v) for k, v in kwargs.items()})


def one_process(run: TrackRun) -> None:
    """Their multi-process training as one process: ``DistributedDataParallel`` is :class:`OneProcess` and
    ``SyncBatchNorm.convert_sync_batchnorm`` keeps batch norm (the same function in one process); their process
    group, when they make one, has one process (:meth:`TrackRun.process_group`)."""
    OneProcess.device = run.device
    torch.nn.parallel.DistributedDataParallel = OneProcess
    torch.nn.SyncBatchNorm.convert_sync_batchnorm = classmethod(lambda cls, module, *args, **kwargs: module)


def import_suite_package() -> None:
    """The suite's ``cl2r_bench`` package from this checkout, without putting the checkout on the import path (its
    ``tools`` package would hide a reference's ``tools`` folder)."""
    location = ROOT / "cl2r_bench"
    spec = importlib.util.spec_from_file_location("cl2r_bench", location / "__init__.py",
                                                  submodule_search_locations=[str(location)])
    package = importlib.util.module_from_spec(spec)
    sys.modules["cl2r_bench"] = package
    spec.loader.exec_module(package)


def without_cuda() -> None:
    """Their ``.cuda()`` calls, ``torch.cuda.set_device`` and moves to a GPU (``.to(0)``, ``.to("cuda:0")``) on a
    machine without a GPU: no-ops."""
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    nn.Module.cuda = lambda self, *args, **kwargs: self
    torch.cuda.set_device = lambda *args, **kwargs: None
    for kind in (torch.Tensor, nn.Module):
        kind.to = staying(kind.to)


def staying(move: Callable) -> Callable:
    """``move`` (a ``to`` method) returning its object where the target is a GPU."""
    def to(self, *args, **kwargs):
        target = args[0] if args else kwargs.get("device")
        gpu = (isinstance(target, int) and not isinstance(target, bool)) or \
            (isinstance(target, (str, torch.device)) and str(target).startswith("cuda"))
        return self if gpu else move(self, *args, **kwargs)
    return to


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reference", required=True)
    parser.add_argument("--checkout", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--epochs", type=int)
    args = parser.parse_args()
    work = Path(args.work).resolve()
    data = torch.load(work / "data.pt", weights_only=False)
    reference = importlib.import_module(f"track_{args.reference}")
    checkout = Path(args.checkout).resolve()
    sys.path.insert(0, str(checkout))
    import_suite_package()
    sys.dont_write_bytecode = True
    if not torch.cuda.is_available():
        without_cuda()
    folder = work / "reference"
    folder.mkdir(exist_ok=True)
    run = TrackRun(data, checkout, folder, args.seed, args.epochs)
    one_process(run)
    seed_everything(args.seed)
    started = time.perf_counter()
    feature = reference.train(run, args.strategy)
    seconds = time.perf_counter() - started
    torch.save({"test_features": run.features(feature), "train_seconds": seconds, "device": str(run.device),
                "torch": torch.__version__}, work / "reference.pt")


if __name__ == "__main__":
    main()
