"""One run on several processes under torchrun.

``torchrun --nproc_per_node N runner.py ...`` starts N copies of the run command. Each finds its rank in the
environment torchrun sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) and joins one
process group: NCCL on GPUs (one GPU per process, the one of its local rank), gloo on the CPU. Every rank runs the
same run loop (:class:`cl2r_bench.app.run_loop.Run`) on the same data; what differs:

* **training** (:func:`cl2r_bench.training.loop.train_task`): the model is wrapped in
  ``DistributedDataParallel``, which averages the gradients over ranks. Every rank draws the same global batch from
  the task's seeded random stream (the protocol's 64 new + 64 replay samples, docs/METHODS.md §4, with their crops
  and flips) and trains on its own contiguous share of each half
  (:class:`~cl2r_bench.training.engine.DeviceBatches`), so the global batch and its augmentation are exactly those
  of the one-process run and the shares are disjoint. The model and the teacher run on the rank's share, and their
  outputs are gathered into the global batch's (:meth:`Processes.gather`), so the strategy's loss is the
  one-process loss, batch-level terms included (:class:`cl2r_bench.training.template.CompatibilityTemplate`).
  Batch-norm statistics are those of the rank's share (plain DDP) unless ``distributed.sync_batchnorm`` (CUDA
  only) syncs them over the global batch; the running statistics are averaged over ranks after each task;
* **evaluation**: each rank embeds its share of the gallery and of the queries, and the features are gathered
  (:meth:`Processes.embed`), so every rank holds the whole compatibility matrix;
* **writing**: only rank 0 reads (or downloads) the data first, writes the run folder (config, checkpoints, run state,
  ``metrics.json`` with its ``world_size``, plots, TensorBoard), pretrains the scenario's starting models (the other
  ranks wait, then find them in the cache: :meth:`Processes.main_first`) and prints.
"""
from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist

from cl2r_bench.models import NonFiniteError, embed_and_classify
from cl2r_bench.settings import DistributedSettings

T = TypeVar("T")
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class LaunchError(RuntimeError):
    """The processes cannot start as launched (an unreachable master, more ranks than GPUs): one line, exit 2."""


@dataclass(frozen=True)
class Processes:
    """This process's place among the run's processes (one process: rank 0 of 1)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    sync_batchnorm: bool = False

    @property
    def is_main(self) -> bool:
        """Whether this process writes results and prints (rank 0)."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def share(self, count: int, rank: int | None = None) -> slice:
        """The contiguous share of ``count`` items that ``rank`` (default: this one) takes; when the ranks do not
        divide ``count``, the first ranks take one more."""
        rank = self.rank if rank is None else rank
        base, extra = divmod(count, self.world_size)
        start = rank * base + min(rank, extra)
        return slice(start, start + base + (rank < extra))

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The mean of ``value`` over ranks (every rank gets it)."""
        if not self.distributed:
            return value
        total = value.detach().clone()
        dist.all_reduce(total)
        return total / self.world_size

    def total(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` summed over ranks, in place, on every rank (a share's partial counts or sums; a tensor on the
        CPU may be a view of a numpy array)."""
        if self.distributed:
            dist.all_reduce(value)
        return value

    def from_every_rank(self, value: T) -> list[T]:
        """Every rank's ``value`` (any picklable object), in rank order, on every rank."""
        if not self.distributed:
            return [value]
        values: list[T] = [None] * self.world_size  # type: ignore[list-item]
        dist.all_gather_object(values, value)
        return values

    def any(self, flag: bool, device: torch.device) -> bool:
        """Whether ``flag`` holds on any rank (so that every rank takes the same branch)."""
        if not self.distributed:
            return flag
        value = torch.tensor(int(flag), device=device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value)

    def shares(self, count: int) -> list[int]:
        """The size of every rank's share of ``count`` items (:meth:`share`)."""
        return [len(range(count)[self.share(count, rank)]) for rank in range(self.world_size)]

    def gather(self, part: torch.Tensor, sizes: list[int], *, differentiable: bool = False) -> torch.Tensor:
        """Every rank's ``part`` (``sizes[r]`` rows on rank r) concatenated in rank order, on every rank;
        ``differentiable``: gradients flow back to each rank's own rows (summed over ranks, as DDP then averages)."""
        if not self.distributed:
            return part
        padding = max(sizes) - len(part)
        padded = torch.cat([part, part.new_zeros((padding, *part.shape[1:]))]) if padding else part
        if differentiable:
            from torch.distributed.nn.functional import all_gather

            pieces = all_gather(padded)
        else:
            pieces = [torch.empty_like(padded) for _ in range(self.world_size)]
            dist.all_gather(pieces, padded.contiguous())
        return torch.cat([piece[:size] for piece, size in zip(pieces, sizes, strict=True)])

    def average_norm_statistics(self, model: torch.nn.Module) -> None:
        """Average the batch norms' running statistics over ranks (each rank tracked those of its shares), so that
        every rank evaluates and rank 0 saves the same model."""
        if not self.distributed:
            return
        for module in model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._NormBase) and module.track_running_stats:
                for statistic in (module.running_mean, module.running_var):
                    dist.all_reduce(statistic)
                    statistic.div_(self.world_size)

    def embed(self, model: torch.nn.Module, images: torch.Tensor, *, batch_size: int,
              amp: bool | str) -> torch.Tensor:
        """:func:`cl2r_bench.models.embed` of ``images``, each rank embedding its share; a non-finite feature on any
        rank raises :class:`NonFiniteError` on every rank."""
        return self.embed_and_classify(model, images, batch_size=batch_size, amp=amp)[0]

    def embed_and_classify(self, model: torch.nn.Module, images: torch.Tensor, *, batch_size: int,
                           amp: bool | str) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`cl2r_bench.models.embed_and_classify` of ``images``, each rank running its share, as :meth:`embed`."""
        if not self.distributed or len(images) < self.world_size:
            return embed_and_classify(model, images, batch_size=batch_size, amp=amp)
        device = next(model.parameters()).device
        try:
            part, problem = embed_and_classify(model, images[self.share(len(images))], batch_size=batch_size,
                                               amp=amp), None
        except NonFiniteError as exc:
            part, problem = None, exc
        if self.any(problem is not None, device):
            raise problem or NonFiniteError(f"another rank's model gives NaN or infinite features for "
                                            f"{len(images)} images")
        sizes = self.shares(len(images))
        return self.gather(part[0], sizes), self.gather(part[1], sizes)

    def from_main(self, value: T) -> T:
        """Rank 0's ``value`` on every rank (any picklable object; the other ranks' ``value`` is ignored), so that
        every rank acts on the decision rank 0 took."""
        if not self.distributed:
            return value
        box = [value if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def decided_on_main(self, work: Callable[[], T]) -> T:
        """``work()`` run on rank 0 only, and its result on every rank; an exception it raises is raised on every
        rank, so none waits for a result that will not come (a fit, a check of earlier records)."""
        if not self.distributed:
            return work()
        result, failure = None, None
        if self.is_main:
            try:
                result = work()
            except Exception as exc:  # every rank raises it, below
                failure = exc
        result, failure = self.from_main((result, failure))
        if failure is not None:
            raise failure
        return result

    def main_first(self, work: Callable[[], T]) -> T:
        """``work()`` on rank 0, then on the other ranks, which find what rank 0 left (a cache of pretrained
        models); with one process, just ``work()``."""
        if self.is_main:
            result = work()
            self.barrier()
            return result
        self.barrier()
        return work()


SINGLE = Processes()


def processes_note(world_size: int) -> str:
    """What a progress line adds for a run shared by several processes (torchrun), empty for one."""
    return f", {world_size} processes" if world_size > 1 else ""


def torchrun_ranks() -> tuple[int, int, int] | None:
    """``(rank, world_size, local_rank)`` set by torchrun, or None outside torchrun or with one process."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    missing = [name for name in TORCHRUN_VARIABLES if not os.environ.get(name)]
    if missing:
        raise LaunchError(f"WORLD_SIZE is {os.environ['WORLD_SIZE']} but {', '.join(missing)} is not set: start "
                          "several processes with torchrun --nproc_per_node N runner.py ...")
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])


def place(settings: DistributedSettings, device: torch.device) -> tuple[Processes, torch.device]:
    """This process's :class:`Processes` and device, from torchrun's environment (rank 0 of 1 on ``device``
    outside torchrun): each process on the GPU of its local rank when ``device`` is CUDA. Nothing is connected yet
    (:func:`connect`), so every input is checked first, each a :class:`LaunchError`: more processes on this
    machine than GPUs, an explicit ``cuda:N`` (each process takes its local rank's GPU), ``sync_batchnorm`` off
    CUDA."""
    ranks = torchrun_ranks()
    if ranks is None:
        return SINGLE, device
    rank, world_size, local_rank = ranks
    device = _rank_device(device, local_rank)
    if settings.sync_batchnorm and device.type != "cuda":
        raise LaunchError("distributed.sync_batchnorm needs CUDA devices (PyTorch's SyncBatchNorm runs on GPUs "
                          "only); set it to false or run on GPUs")
    return Processes(rank, world_size, local_rank, settings.sync_batchnorm), device


def connect(processes: Processes, settings: DistributedSettings, device: torch.device, *, trains: bool = True) -> None:
    """Join the process group of a torchrun run (once per process; nothing with one process): gloo on the CPU,
    NCCL on GPUs. A master that cannot be reached within ``settings.connect_timeout`` seconds is a
    :class:`LaunchError`; afterwards ranks wait ``settings.timeout`` seconds for each other. A process that
    ``trains`` imports Avalanche first: its import makes loggers, which it refuses off rank 0 once a group exists;
    one that trains no strategy (``adapt``) is spared that import (3.4 s of CPU per process, measured)."""
    if not processes.distributed or dist.is_initialized():
        return
    _wait_for_master(processes.rank, processes.world_size, settings.connect_timeout)
    if trains:
        from cl2r_bench.data.avalanche_import import importing_avalanche  # here: adapt processes never import it

        with importing_avalanche():
            import avalanche  # noqa: F401
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=processes.rank,
                            world_size=processes.world_size, timeout=timedelta(seconds=settings.timeout),
                            device_id=device if device.type == "cuda" else None)


def leave() -> None:
    """Leave the process group at the end of the command (nothing without one)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def _rank_device(device: torch.device, local_rank: int) -> torch.device:
    if device.type not in ("cuda", "cpu"):
        raise LaunchError(f"torchrun runs on CUDA GPUs or the CPU, not {device.type}; pass --device cuda or cpu")
    if device.type == "cpu":
        return device
    if device.index is not None:
        raise LaunchError(f"--device {device} under torchrun: each process takes the GPU of its local rank; pass "
                          "--device cuda (or choose GPUs with CUDA_VISIBLE_DEVICES)")
    count = torch.cuda.device_count()
    if local_rank >= count:
        local = os.environ.get("LOCAL_WORLD_SIZE", str(local_rank + 1))
        raise LaunchError(f"torchrun started {local} processes on this machine but it has {count} GPU(s), one per "
                          f"process: use --nproc_per_node {count} or fewer, or --device cpu")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def _wait_for_master(rank: int, world_size: int, timeout: float) -> None:
    """Refuse in one line when the master's address does not resolve, or when a rank that connects to the
    master's store cannot reach it within ``timeout`` seconds (rank 0 hosts it unless torchrun's agent does)."""
    address, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
    where = f"the torchrun master at {address}:{port} (rank {rank} of {world_size})"
    try:
        socket.getaddrinfo(address, int(port))
    except (socket.gaierror, ValueError) as exc:
        raise LaunchError(f"cannot resolve {where}: {exc}; check MASTER_ADDR and MASTER_PORT") from None
    if rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((address, int(port)), timeout=min(5.0, timeout)).close()
            return
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise LaunchError(f"cannot reach {where} within {timeout:g} s ({exc.strerror or exc}): check "
                                  "MASTER_ADDR and MASTER_PORT, that rank 0 is running, and the firewall "
                                  "(distributed.connect_timeout sets the wait)") from None
            time.sleep(0.5)
