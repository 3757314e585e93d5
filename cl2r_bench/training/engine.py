"""Training one task on Avalanche's ``SupervisedTemplate`` (METHODS.md §4).

Per task, rebuilt from scratch: SGD (momentum 0.9, weight decay 5e-4 not applied to normalisation weights and biases),
cosine schedule from ``lr`` to ``lr_min`` stepped once per epoch (``CosineAnnealingLR(T_max=epochs)`` of the authors'
code; ``schedule_step: iteration`` steps it every iteration); an authors' recipe may train with Adam or AdamW and a
multistep or poly schedule and a warm-up instead (``training.optimizer``, ``schedule``, :func:`make_optimizer`,
:func:`scheduled_lr`); fp16 autocast with gradient scaling on GPU as the authors' code (``amp_dtype: bfloat16`` without
scaling). Batches come from :class:`DeviceBatches`: images live as uint8 on the device and are cropped / flipped there;
the model normalises them itself (:class:`cl2r_bench.models.RetrievalModel`), so neither the loop nor the teacher needs
the data's statistics. The epoch length follows the authors' code (METHODS.md §4, ``epoch_length: reference``): a
shuffled pass of ``N // 128`` batches without a memory; with one, ``(N_new + N_mem) // 128`` batches of 64 new + 64
replay samples, each half drawn without replacement inside the batch and independently across batches. ``epoch_length:
full_pass`` is this suite's earlier rule: one pass over the new samples per epoch, replay drawn with replacement.

The strategy only computes the loss (:class:`cl2r_bench.strategy.Strategy`); this module owns the loop, the teacher
(frozen, eval mode, no gradient) and the replay memory (:func:`update_memory`).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import torch
from torch import nn

from cl2r_bench.data.datasets import ImageSet
from cl2r_bench.data.transforms import crop_flip, crop_flip_draws
from cl2r_bench.distributed import SINGLE, Processes
from cl2r_bench.models import RetrievalModel
from cl2r_bench.settings import task_seed
from cl2r_bench.training_settings import TrainSettings


def draw_indices(population: int, count: int, device: torch.device) -> torch.Tensor:
    """``count`` random indices below ``population``: without replacement unless ``population <= count``
    (the authors' ``np.random.choice(..., replace=len <= size)``)."""
    if population <= count:
        return torch.randint(0, population, (count,), device=device)
    return torch.randperm(population, device=device)[:count]


class DeviceBatches:
    """Mini-batches ``[images, labels, from_memory]`` drawn from device-resident uint8 images, randomly cropped and
    flipped (still uint8: the model normalises them); items that are frozen encoders' features (the
    pretrained-backbone track) are drawn as they are, as features cached once per image are.

    ``epoch_length="reference"`` (the authors' code, METHODS.md §4): without a memory an epoch is a shuffled
    pass of ``N // new_batch`` batches (the last partial batch dropped; one batch of all samples when fewer);
    with a memory it is ``(N_new + N_mem) // (new_batch + memory_batch)`` batches (at least 1), each made of
    ``new_batch`` new and ``memory_batch`` replay samples drawn without replacement inside the batch and
    independently across batches. ``"full_pass"``: one shuffled pass over ``new`` per epoch, each batch adding
    ``memory_batch`` replay samples drawn with replacement; a trailing batch of one sample is dropped.

    The sizes are those of the global batch. Under torchrun every rank draws the global batch's indices and crops
    from the same seeded stream and keeps its own share of the new and of the replay half
    (:meth:`cl2r_bench.distributed.Processes.share`); ``rank_sizes`` are then the sizes of every rank's share of
    the last batch, with which the training template gathers the global batch's outputs. A trailing
    ``full_pass`` batch is dropped unless every rank gets at least 2 of its samples (batch norm needs 2).
    ``channels_last`` yields the images in that memory format.
    """

    def __init__(self, new: ImageSet, memory: ImageSet | None, *, new_batch: int, memory_batch: int,
                 epoch_length: str, processes: Processes = SINGLE, channels_last: bool = False) -> None:
        self.new, self.memory = new, memory if memory is not None and len(memory) else None
        self.new_batch, self.memory_batch = new_batch, memory_batch
        self.epoch_length, self.processes, self.channels_last = epoch_length, processes, channels_last
        self.rank_sizes = [0]
        self.last_rows: torch.Tensor | None = None
        """The items of this rank's share of the last batch, as rows of ``new`` then ``memory`` (``memory``'s after
        ``new``'s): where :class:`~cl2r_bench.training.frozen_outputs.FrozenOutputs` reads their outputs."""

    def __len__(self) -> int:
        n = len(self.new)
        if self.epoch_length == "full_pass":
            return n // self.new_batch + (n % self.new_batch >= 2 * self.processes.world_size)
        if self.memory is None:
            return max(1, n // self.new_batch)
        return max(1, (n + len(self.memory)) // (self.new_batch + self.memory_batch))

    def _batch_indices(self) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
        """``(new indices, memory indices or None)`` of each batch of one epoch."""
        device, n = self.new.images.device, len(self.new)
        if self.memory is not None and self.epoch_length == "reference":
            total = n + len(self.memory)
            halves = (self.new_batch, self.memory_batch) if total >= self.new_batch + self.memory_batch \
                else (total // 2, total // 2)
            for _ in range(len(self)):
                yield draw_indices(n, halves[0], device), draw_indices(len(self.memory), halves[1], device)
            return
        order = torch.randperm(n, device=device)
        for b in range(len(self)):
            pick = None if self.memory is None else torch.randint(0, len(self.memory), (self.memory_batch,),
                                                                  device=device)
            yield order[b * self.new_batch:(b + 1) * self.new_batch], pick

    def __iter__(self) -> Iterator[list[torch.Tensor]]:
        for idx, pick in self._batch_indices():
            with torch.profiler.record_function("cl2r.batch"):
                batch = self._share_of_batch(idx, pick)
            yield batch

    def _share_of_batch(self, idx: torch.Tensor, pick: torch.Tensor | None) -> list[torch.Tensor]:
        """This rank's share of the global batch ``new[idx] + memory[pick]`` (all of it with one process), cropped
        and flipped by the global batch's draws."""
        device = self.new.images.device
        new_share = self.processes.share(len(idx))
        positions = torch.arange(len(idx), device=device)[new_share]
        rows = idx[new_share]
        images, labels = self.new.images[rows], self.new.labels[rows]
        from_memory = torch.zeros(len(positions), dtype=torch.bool, device=device)
        if pick is not None:
            replay_share = self.processes.share(len(pick))
            replayed = pick[replay_share]
            rows = torch.cat([rows, len(self.new) + replayed])
            images = torch.cat([images, self.memory.images[replayed]])
            labels = torch.cat([labels, self.memory.labels[replayed]])
            from_memory = torch.cat([from_memory, torch.ones(len(replayed), dtype=torch.bool, device=device)])
            positions = torch.cat([positions, len(idx) + torch.arange(len(pick), device=device)[replay_share]])
        self.rank_sizes = [a + b for a, b in zip(self.processes.shares(len(idx)),
                                                 self.processes.shares(len(pick) if pick is not None else 0),
                                                 strict=True)]
        self.last_rows = rows
        if self.new.are_images:
            with torch.profiler.record_function("cl2r.augmentation"):
                top, left, flip = crop_flip_draws(sum(self.rank_sizes), device)
                images = crop_flip(images, top[positions], left[positions], flip[positions])
                if self.channels_last:
                    images = images.contiguous(memory_format=torch.channels_last)
        return [images, labels, from_memory]


class LossTermLog:
    """Each loss term's mean per epoch (:meth:`cl2r_bench.strategy.Strategy.terms`): sums kept on the device, read
    once per epoch, so logging adds no host synchronisation to an iteration. A term missing from an iteration counts
    as 0 there; ``means[name]`` has one value per epoch (a term first seen in a later epoch: 0 for the earlier
    ones)."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.iterations = 0
        self.means: dict[str, list[float]] = {}
        self.epochs = 0

    def add(self, terms: dict[str, torch.Tensor]) -> None:
        for name, value in terms.items():
            value = value.detach().float()
            self.sums[name] = self.sums[name] + value if name in self.sums else value
        self.iterations += 1

    def end_epoch(self) -> None:
        for name in self.sums.keys() | self.means.keys():
            total = self.sums.get(name)
            mean = float(total) / self.iterations if total is not None and self.iterations else 0.0
            self.means.setdefault(name, [0.0] * self.epochs).append(mean)
        self.sums, self.iterations = {}, 0
        self.epochs += 1


class EpochHook(Protocol):
    """Epoch-level control of :func:`~cl2r_bench.training.loop.train_task` (replacement pretraining until a plateau,
    ``cl2r_bench/training/pretrain.py``).

    With a hook the learning rate is held at ``lr`` during an epoch instead of the cosine schedule; the loop
    resumes after ``epochs_done`` epochs, and stops early when :meth:`after_epoch` returns False."""

    lr: float
    epochs_done: int

    def begin(self, optimizer: torch.optim.Optimizer) -> None:
        """Called once before training (restore an interrupted run's optimizer state here)."""

    def after_epoch(self, model: RetrievalModel, optimizer: torch.optim.Optimizer) -> bool:
        """Called after each epoch; returns whether to train another epoch."""


class ZeroStartSGD(torch.optim.SGD):
    """torch's SGD whose momentum buffers start at zero and whose update stays the kind it was built with.

    With ``fused=True`` torch allocates the buffers uninitialised (``torch.empty_like``) at the first step and lets the
    kernel fill them, but the kernel returns at once when the float16 gradient scaler found an overflow, as it often
    does at a task's first step; the next step then reads memory garbage as momentum: a replacement pretraining on an
    H200 diverged at iteration 3 (torch 2.11; results/gpu/speed/speed.md), and torch 2.14 on the CPU does the same
    (``tests/strategies/test_strategies.py``). A zero buffer gives the first step its own value, 0.9 x 0 + gradient
    (dampening is 0, fixed here), so the weights equal the unfused update's, skipped first step or not. A buffer is
    added wherever one is missing, so an optimizer whose state was cleared in whole or in part (Avalanche's reset
    between experiences) is covered too.

    A loaded state keeps this optimizer's ``fused`` and ``foreach``: torch would take the saved ones, and a progress
    file saved by the other kind of update would then change it (with float16 the gradient scaler, which hands a fused
    optimizer its overflow check, would fail the unfused step)."""

    def __init__(self, groups: list[dict], *, lr: float, momentum: float, fused: bool, nesterov: bool = False) -> None:
        super().__init__(groups, lr=lr, momentum=momentum, dampening=0.0, nesterov=nesterov, fused=fused or None)

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's load, with this optimizer's kind of update kept."""
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            group["fused"], group["foreach"] = self.defaults["fused"], self.defaults["foreach"]

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """torch's step, after a zero momentum buffer for every parameter with a gradient and none yet."""
        for group in self.param_groups:
            if group["momentum"]:
                for param in group["params"]:
                    if param.grad is not None and self.state[param].get("momentum_buffer") is None:
                        self.state[param]["momentum_buffer"] = torch.zeros_like(param)
        return super().step(closure)


def make_optimizer(model: nn.Module, settings: TrainSettings,
                   extra: Sequence[nn.Module] = ()) -> torch.optim.Optimizer:
    """``settings.optimizer`` with weight decay on weight matrices and kernels only (not on norm weights and biases),
    over the parameters of ``model`` and of the ``extra`` modules a strategy trains with it
    (:meth:`cl2r_bench.strategy.Strategy.trainable_modules`): SGD (momentum, Nesterov's with ``nesterov``), updated
    by torch's fused kernel with ``settings.fused_optimizer`` (:class:`ZeroStartSGD`), or torch's Adam (L2 weight
    decay added to the gradient) or AdamW (decoupled weight decay), at their default betas and epsilon."""
    params = [p for module in (model, *extra) for p in module.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim > 1]
    no_decay = [p for p in params if p.ndim <= 1]
    groups = [{"params": decay, "weight_decay": settings.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if settings.optimizer == "adam":
        return torch.optim.Adam(groups, lr=settings.lr)
    if settings.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=settings.lr)
    return ZeroStartSGD(groups, lr=settings.lr, momentum=settings.momentum, nesterov=settings.nesterov,
                        fused=settings.fused_optimizer)


def cosine_lr(step: int, total: int, lr: float, lr_min: float) -> float:
    """Cosine annealing from ``lr`` (step 0) to ``lr_min`` (step ``total``)."""
    return lr_min + 0.5 * (lr - lr_min) * (1 + math.cos(math.pi * min(step, total) / max(total, 1)))


def multistep_lr(epoch: int, lr: float, milestones: Sequence[int], gamma: float) -> float:
    """``lr`` times ``gamma`` for each milestone reached by the 0-based ``epoch`` (torch's ``MultiStepLR`` stepped
    after each epoch: epoch ``m`` is the first at the lower rate)."""
    return lr * gamma ** sum(epoch >= milestone for milestone in milestones)


def scheduled_lr(iteration: int, iterations_per_epoch: int, settings: TrainSettings) -> float:
    """The learning rate of an iteration: during the first ``warmup_epochs`` epochs a linear ramp, ``lr (e + 1) /
    warmup_epochs`` at epoch e (the BT² and OCA code's warm-up) or, with ``schedule_step: iteration``, ``lr (i + 1) /
    (warmup_epochs x iterations per epoch)`` at iteration i (RACT's timm warm-up, which starts at lr x 1e-3); then
    ``schedule: multistep`` at its epoch, ``poly`` at the iteration (``lr (1 - i / I)^power`` over the remaining
    iterations, MixBCT's ``PolyScheduler``), or the cosine schedule over the remaining epochs at its epoch
    (``schedule_step: epoch``, as ``CosineAnnealingLR(T_max=epochs)`` stepped after each epoch) or at the iteration
    itself."""
    per_epoch = max(iterations_per_epoch, 1)
    epoch, warmup = iteration // per_epoch, settings.warmup_epochs
    if epoch < warmup:
        if settings.schedule_step == "iteration":
            return settings.lr * (iteration + 1) / (warmup * per_epoch)
        return settings.lr * (epoch + 1) / warmup
    if settings.schedule == "multistep":
        return multistep_lr(epoch, settings.lr, settings.milestones, settings.gamma)
    iteration, epochs = iteration - warmup * per_epoch, settings.epochs - warmup
    if settings.schedule == "poly":
        return settings.lr * (1 - min(iteration / (epochs * per_epoch), 1)) ** settings.power
    if settings.schedule_step == "epoch":
        return cosine_lr(iteration // per_epoch, epochs, settings.lr, settings.lr_min)
    return cosine_lr(iteration, epochs * per_epoch, settings.lr, settings.lr_min)


def training_forward(model: RetrievalModel, settings: TrainSettings, processes: Processes = SINGLE) -> nn.Module:
    """What runs the training forward of ``model`` (whose parameters it shares): the model itself, in the
    channels-last format with ``settings.channels_last``, wrapped in ``DistributedDataParallel`` under torchrun
    (its batch norms turned into ``SyncBatchNorm`` in place with ``distributed.sync_batchnorm``; they behave as
    batch norms outside a process group), and compiled by ``torch.compile`` in the mode of ``settings.compile``
    (``reduce-overhead`` replays CUDA graphs: fewer kernel launches, for a step bound by the host)."""
    if settings.channels_last:
        model.to(memory_format=torch.channels_last)
    forward: nn.Module = model
    if processes.sync_batchnorm:
        nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if processes.distributed:
        device = next(model.parameters()).device
        forward = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda"
                                                      else None, broadcast_buffers=False)
    return forward if settings.compile_mode is None else torch.compile(forward, mode=settings.compile_mode)


def teacher_forward(teacher: RetrievalModel | None, settings: TrainSettings) -> nn.Module | None:
    """What runs the frozen teacher on each batch: the teacher in the channels-last format with
    ``settings.channels_last`` (it receives the same batches as the model) and compiled in the mode of
    ``settings.compile``."""
    if teacher is None:
        return None
    if settings.channels_last:
        teacher.to(memory_format=torch.channels_last)
    return teacher if settings.compile_mode is None else torch.compile(teacher, mode=settings.compile_mode)


class ReplayMemory:
    """The class-balanced replay memory of a run (docs/METHODS.md §4). The training template adds ``per_class``
    random exemplars of each class of a task once it is trained (its ``after_training_exp`` hook), drawn with the
    task's own seed (:func:`cl2r_bench.settings.task_seed`), so a resumed run draws the same ones. ``items`` is
    what batches replay from (None while empty)."""

    def __init__(self, per_class: int, run_seed: int, items: ImageSet | None = None) -> None:
        self.per_class, self.run_seed = per_class, run_seed
        self.items = items if items is not None and len(items) else None

    def add(self, task_data: ImageSet, task: int) -> None:
        generator = torch.Generator().manual_seed(task_seed(self.run_seed, task))
        self.items = update_memory(self.items, task_data, self.per_class, generator)


def update_memory(memory: ImageSet | None, task_data: ImageSet, per_class: int,
                  generator: torch.Generator) -> ImageSet:
    """Add ``per_class`` random exemplars of each class of ``task_data`` to the class-balanced replay memory."""
    picked = []
    for c in task_data.labels.unique(sorted=True):
        idx = torch.nonzero(task_data.labels == c).flatten().cpu()
        chosen = idx[torch.randperm(len(idx), generator=generator)[:per_class]]
        picked.append(chosen.to(task_data.labels.device))
    new = task_data.select(torch.cat(picked)) if picked else None
    if memory is None or len(memory) == 0:
        return new
    if new is None:
        return memory
    return ImageSet(torch.cat([memory.images, new.images]), torch.cat([memory.labels, new.labels]))
