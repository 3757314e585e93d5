"""``runner.py embed``: the features of a model-update study's two encoders on its data set, or of every split a run
on the pretrained-backbone track reads under each of its frozen encoders (``model.encoders``), embedded into the
feature cache in shards spread over processes (docs/scale-out.md, "Embedding over processes"), so that the study or
the runs themselves (on the same settings) find them cached.

Who embeds which shards (:class:`cl2r_bench.feature_cache.Sharding`):

* one process: every shard, one after the other (a killed embedding keeps its finished shards);
* torchrun (``torchrun --nproc_per_node N runner.py embed ... --shards K``): rank r of N is worker r of N, each on
  its local GPU when there are GPUs;
* SLURM (``--launcher slurm``): one job array of ``--workers`` tasks (default: one per shard) through submitit, the
  sweep's launcher and options (:mod:`cl2r_bench.app.slurm`); each task runs this command as its worker. When the array
  has ended, the submitting process runs it once more as the only worker: it joins the shards, and embeds again any
  shard whose task was killed.

The workers agree through the cache's files and locks alone (no process group), so a worker that dies only leaves
its shard to the others.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cl2r_bench.config import config_text
from cl2r_bench.errors import UsageError
from cl2r_bench.feature_cache import Sharding
from cl2r_bench.files import atomic_write_text
from cl2r_bench.limits import SHARDS_MAX, number


def add_embed_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shards", type=number(int, at_least=1, at_most=SHARDS_MAX), default=1, metavar="K",
                        help="pieces each split is embedded in, at most its images (default %(default)s); the same K "
                        "for every worker of one embedding")
    parser.add_argument("--launcher", default="local", choices=("local", "slurm"),
                        help="local: this process (or each torchrun rank) is a worker; slurm: one job array")
    parser.add_argument("--workers", type=number(int, at_least=1, at_most=SHARDS_MAX), metavar="N",
                        help="--launcher slurm: array tasks (default: --shards)")
    parser.add_argument("--worker", type=number(int, at_least=0, below=SHARDS_MAX), help=argparse.SUPPRESS)
    parser.add_argument("--done-file", help=argparse.SUPPRESS)


def this_worker(args: argparse.Namespace) -> Sharding:
    """This process's part: the array task's ``--worker`` of ``--workers``, else the torchrun rank, else all."""
    if args.worker is not None:
        workers = args.workers or args.shards
        if not 0 <= args.worker < workers:
            raise UsageError(f"--worker must be in 0..{workers - 1}, not {args.worker}")
        return Sharding(args.shards, args.worker, workers)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    return Sharding(args.shards, rank, world)


def embed_study(parts: Any, sharding: Sharding, log: Any = print) -> None:
    """Embed (or find cached) the study's splits under both encoders, or the track's data sets under every encoder
    of the run (:func:`embed_track`), this worker's shards first."""
    from cl2r_bench.adapter_study import embedded, study_images  # here: every command's parser imports this module

    settings = parts.settings
    device = parts.device
    if device.type == "cuda" and "LOCAL_RANK" in os.environ:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    if settings.model.on_encoders:
        embed_track(settings, device, sharding, log)
        return
    encoders, _, splits = study_images(settings)
    smallest = min(splits.items(), key=lambda item: len(item[1]))
    if sharding.shards > len(smallest[1]):
        raise UsageError(f"--shards {sharding.shards} is more than the {len(smallest[1])} images of the "
                         f"{smallest[0]} split; give at most {len(smallest[1])} (a shard holds at least one image)")
    embedded(settings, encoders, splits, device, log, sharding)


def embed_track(settings: Any, device: torch.device, sharding: Sharding, log: Any = print) -> None:
    """Embed (or find cached) every split the run reads (:func:`cl2r_bench.scenario.items_read`) of every data set
    it reads under each of its frozen encoders: what its runs, of any strategy and seed, then find cached."""
    from cl2r_bench.scenario import datasets_read, read_data

    for name in datasets_read(settings):
        data = read_data(settings, name, device, sharding)
        log(f"{name}: {len(data.train)} train and {len(data.test)} test items under "
            f"{', '.join(data.feature_columns)}")


@dataclass
class EmbedWorker:
    """One SLURM array task: ``runner.py embed`` on the resolved ``config`` as worker ``index`` of ``workers`` (the
    sweep launcher's job interface: a name, a status and the command)."""

    config: Path
    shards: int
    index: int
    workers: int
    folder: Path

    @property
    def name(self) -> str:
        return f"embed-worker-{self.index}-of-{self.workers}"

    @property
    def done_file(self) -> Path:
        return self.folder / f"{self.name}.done"

    def status(self) -> str:
        return "complete" if self.done_file.is_file() else "new"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "cl2r_bench", "embed", "--config", str(self.config), "--no-progress",
                "--shards", str(self.shards), "--worker", str(self.index), "--workers", str(self.workers),
                "--done-file", str(self.done_file)]


def slurm_workers(parts: Any, args: argparse.Namespace, folder: Path) -> list[EmbedWorker]:
    """The array's tasks, the run's resolved config written once for all of them."""
    config = folder / "embed.yaml"
    atomic_write_text(config, config_text(parts.config))
    workers = args.workers or args.shards
    for stale in folder.glob("embed-worker-*.done"):
        stale.unlink()
    return [EmbedWorker(config, args.shards, index, workers, folder) for index in range(workers)]


def mark_done(path: str | None) -> None:
    if path:
        atomic_write_text(path, "done\n")
