"""The suite's Avalanche training template: a :class:`Strategy`'s loss on device-resident batches (docs/METHODS.md §4).

``CompatibilityTemplate`` is Avalanche's ``SupervisedTemplate`` with the suite's parts in its own hooks: the data
are :class:`~cl2r_bench.training.engine.DeviceBatches` (``make_train_dataloader``), the loss is the strategy's
(``criterion``, checked by :func:`cl2r_bench.strategy.strategy_loss`) on one forward of the model and the frozen teacher
(``forward``; the teacher is frozen in ``_before_training_exp``), the replay memory takes the task's exemplars in
``_after_training_exp``, the learning rate follows the cosine schedule or an epoch hook and the backbone's gradient
norm is clipped at ``training.clip_grad_norm`` where a recipe sets it (``optimizer_step``),
float16 autocast with gradient scaling on GPU, and the divergence check and the loss log run where the loss is read
(``_after_training_iteration``), and each loss term's mean per epoch is logged (:class:`LossTermLog`). The forward, the
loss, the backward and the optimizer step run inside the torch profiler's labels ``cl2r.forward``, ``cl2r.loss``,
``cl2r.backward``, ``cl2r.optimizer`` (``tools/profile_training.py``; free when no profiler runs). A model swap at a
replacement task happens outside ``train()`` (:class:`cl2r_bench.app.run_loop.Run`), as Avalanche requires (the
optimizer is built for the model being trained). This module imports Avalanche (seconds), so
:func:`~cl2r_bench.training.loop.train_task` imports it on first use.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from cl2r_bench.data.avalanche_import import importing_avalanche
from cl2r_bench.distributed import Processes
from cl2r_bench.models import NonFiniteError, RetrievalModel, first_nonfinite_tensor
from cl2r_bench.strategy import Step, Strategy, strategy_loss
from cl2r_bench.tracking import Tracker
from cl2r_bench.training_settings import TrainSettings

from .engine import DeviceBatches, EpochHook, LossTermLog, ReplayMemory, scheduled_lr
from .frozen_outputs import FrozenOutputs, frozen_outputs

with importing_avalanche():
    from avalanche.training.templates import SupervisedTemplate


class CompatibilityTemplate(SupervisedTemplate):
    """``SupervisedTemplate`` whose loss is a :class:`Strategy` and whose data are :class:`DeviceBatches`.

    ``model`` runs the forward (the model itself, or a data-parallel / compiled wrapper of it:
    :func:`~cl2r_bench.training.engine.training_forward`); ``trained`` is the model those share parameters with."""

    def __init__(self, *, strategy: Strategy, teacher: RetrievalModel | None, independent: RetrievalModel | None,
                 batches: DeviceBatches,
                 settings: TrainSettings, amp_dtype: torch.dtype | None, progress,
                 epoch_hook: EpochHook | None, tracker: Tracker, task_index: int,
                 memory: ReplayMemory | None, trained: RetrievalModel, processes: Processes, **kwargs) -> None:
        super().__init__(**kwargs)
        self.trained, self.processes = trained, processes
        self.compat_strategy, self.teacher, self.batches = strategy, teacher, batches
        self.independent = independent if strategy.needs_independent else None
        self.teacher_outputs: FrozenOutputs | None = None
        self.independent_outputs: FrozenOutputs | None = None
        self.epoch_hook, self.tracker, self.task_index, self.memory = epoch_hook, tracker, task_index, memory
        self.settings, self.amp_dtype, self.progress = settings, amp_dtype, progress
        self.scaler = torch.amp.GradScaler("cuda") if amp_dtype == torch.float16 else None
        self.total_steps = settings.epochs * len(batches)
        self.step_count, self.images_seen, self.last_loss = 0, 0, float("nan")
        self.first_nonfinite = torch.tensor(-1, device=self.device)
        self.term_log = LossTermLog()

    def _before_training_exp(self, **kwargs) -> None:
        """The teacher and the independent model are frozen: eval mode (normalisation statistics fixed), no
        gradient; where items are drawn as they are (features), their outputs of every item are tabled once
        (:mod:`~cl2r_bench.training.frozen_outputs`)."""
        for frozen in (self.teacher, self.independent):
            if frozen is not None:
                frozen.eval().requires_grad_(False)
        teacher = self.teacher if self.compat_strategy.needs_teacher else None
        new, memory = self.batches.new, self.batches.memory
        self.teacher_outputs = frozen_outputs(teacher, new, memory, self.amp_dtype)
        self.independent_outputs = frozen_outputs(self.independent, new, memory, self.amp_dtype)
        super()._before_training_exp(**kwargs)

    def _after_training_exp(self, **kwargs) -> None:
        """The replay memory takes this task's exemplars once it is trained."""
        if self.memory is not None:
            self.memory.add(self.batches.new, self.task_index)
        super()._after_training_exp(**kwargs)

    def make_train_dataloader(self, **kwargs) -> None:
        self.dataloader = self.batches

    def train_dataset_adaptation(self, **kwargs) -> None:
        self.adapted_dataset = None

    def model_adaptation(self, model=None):
        return self.model

    def make_optimizer(self, **kwargs) -> None:
        """The optimizer is built per task by :func:`train_task`; nothing to re-bind."""

    def forward(self):
        with torch.profiler.record_function("cl2r.forward"):
            return self._forward()

    def _forward(self) -> torch.Tensor:
        with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
            logits, features = self.model(self.mb_x)
            rows = self.batches.last_rows
            teacher_logits = teacher_features = teacher_raw_features = independent_features = None
            if self.teacher_outputs is not None:
                teacher_logits, teacher_raw_features = self.teacher_outputs(self.mb_x, rows)
                teacher_features = F.normalize(teacher_raw_features, dim=1)
            if self.independent_outputs is not None:
                independent_features = F.normalize(self.independent_outputs(self.mb_x, rows)[1], dim=1)
        new_features = getattr(self.trained.head, "new_features", None)
        outputs = {"labels": self.mb_y, "from_memory": self.mbatch[2], "logits": logits.float(),
                   "features": features.float(), "teacher_logits": teacher_logits,
                   "teacher_features": teacher_features, "teacher_raw_features": teacher_raw_features,
                   "independent_features": independent_features,
                   "new_features": None if new_features is None else new_features.float()}
        if self.processes.distributed:
            outputs = self._global_batch(outputs)
        self._step = Step(targets=self.trained.class_targets(outputs["labels"]), iteration=self.step_count,
                          iterations_per_epoch=len(self.batches), epochs=self.settings.epochs, **outputs)
        return logits

    def _global_batch(self, outputs: dict) -> dict:
        """The outputs of every rank's share, gathered into the global batch's (:class:`DeviceBatches`), so that the
        strategy's loss is the one-process loss, batch-level terms (HOC's pairs, CVS's negatives) included. Each
        rank computes the same loss; the gathered model outputs carry gradients back to each rank's own rows
        (summed over the ranks' identical losses), and DDP's average of the ranks' gradients is then the
        one-process gradient."""
        sizes = self.batches.rank_sizes
        gathered = {name: None if value is None else self.processes.gather(
            value, sizes, differentiable=name in ("logits", "features", "new_features"))
            for name, value in outputs.items()
            if name != "from_memory"}
        gathered["from_memory"] = self.processes.gather(outputs["from_memory"].to(torch.uint8), sizes).bool()
        return gathered

    def criterion(self):
        where = f"task {self.task_index}, iteration {self.step_count + 1} of {self.total_steps}"
        with torch.profiler.record_function("cl2r.loss"):
            self.compat_strategy.last_terms = {}
            loss = strategy_loss(self.compat_strategy, self._step, where)
            self.term_log.add(self.compat_strategy.last_terms or {"loss": loss})
            return loss

    def backward(self) -> None:
        with torch.profiler.record_function("cl2r.backward"):
            (self.loss if self.scaler is None else self.scaler.scale(self.loss)).backward()

    def optimizer_step(self) -> None:
        with torch.profiler.record_function("cl2r.optimizer"):
            self._optimizer_step()

    def _optimizer_step(self) -> None:
        lr = self.epoch_hook.lr if self.epoch_hook is not None else scheduled_lr(
            self.step_count, len(self.batches), self.settings)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.settings.clip_grad_norm is not None:
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.trained.backbone.parameters(), self.settings.clip_grad_norm)
        if self.scaler is None:
            self.optimizer.step()
        else:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        self.step_count += 1

    def _after_training_iteration(self, **kwargs) -> None:
        super()._after_training_iteration(**kwargs)
        self.images_seen += sum(self.batches.rank_sizes)
        nonfinite = ~torch.isfinite(self.loss.detach()) & (self.first_nonfinite < 0)
        self.first_nonfinite = torch.where(nonfinite, self.step_count, self.first_nonfinite)
        if self.step_count % 25 == 0 or self.step_count == self.total_steps:
            self.last_loss = float(self.processes.mean(self.loss.detach()))
            if not math.isfinite(self.last_loss) and (self.scaler is None or self.processes.any(
                    first_nonfinite_tensor(self.trained) is not None, self.device)):
                raise NonFiniteError(f"the loss is {self.last_loss} at iteration {self.step_count} of "
                                     f"{self.total_steps} (first non-finite at iteration "
                                     f"{int(self.first_nonfinite)})")
            self.progress.set_postfix(loss=f"{self.last_loss:.3f}", refresh=False)
            self.tracker.train_step(self.task_index, self.step_count, self.last_loss,
                                    self.optimizer.param_groups[0]["lr"])
        self.progress.update(1)

    def _after_training_epoch(self, **kwargs) -> None:
        super()._after_training_epoch(**kwargs)
        self.term_log.end_epoch()
        if self.epoch_hook is not None and not self.epoch_hook.after_epoch(self.trained, self.optimizer):
            self.stop_training()

