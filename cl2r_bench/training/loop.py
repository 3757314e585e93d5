"""One task's training: :func:`train_task` runs the suite's Avalanche template
(:class:`cl2r_bench.training.template.CompatibilityTemplate`) on :mod:`cl2r_bench.training.engine`'s batches,
optimiser and schedule (docs/METHODS.md §4)."""
from __future__ import annotations

import time
import warnings
from typing import Any

import torch

from cl2r_bench.data.datasets import ImageSet
from cl2r_bench.data.streams import single_experience
from cl2r_bench.distributed import SINGLE, Processes
from cl2r_bench.models import NonFiniteError, RetrievalModel, autocast_dtype, first_nonfinite_tensor
from cl2r_bench.strategy import Strategy
from cl2r_bench.tracking import NullTracker, Tracker
from cl2r_bench.training_settings import TrainSettings

from .engine import DeviceBatches, EpochHook, ReplayMemory, make_optimizer, teacher_forward, training_forward


def train_task(model: RetrievalModel, strategy: Strategy, new: ImageSet, memory: ReplayMemory | None,
               settings: TrainSettings, *, teacher: RetrievalModel | None = None,
               independent: RetrievalModel | None = None, experience: Any = None,
               description: str = "", epoch_hook: EpochHook | None = None,
               tracker: Tracker | None = None, task_index: int = 0,
               processes: Processes = SINGLE) -> dict[str, Any]:
    """Train ``model`` in place on one task; returns ``{"seconds", "iterations", "images", "final_loss",
    "loss_terms"}`` (images and loss of the global batch; each loss term's mean per epoch, :class:`LossTermLog`).

    ``teacher`` and ``independent`` are frozen models whose features of each batch the strategy reads
    (``Step.teacher_*``, ``Step.independent_features``). A strategy that uses the replay memory draws its replay
    half of each batch from ``memory`` and, once the task is trained, the template adds the task's exemplars to it
    (task ``task_index``'s seed).

    A non-finite loss (checked every 25 iterations, where the loss is read anyway; the first non-finite
    iteration is tracked on the device) or non-finite weights at the end raise :class:`models.NonFiniteError`.
    With float16 gradient scaling a non-finite loss stops training only when the weights are non-finite too: the
    scaler skips such a step, as in the authors' code, and a transient overflow is not a divergence.

    ``epoch_hook`` replaces the cosine schedule by epoch-level control (:class:`EpochHook`); ``tracker`` receives
    the loss and learning rate where the loss is read (:mod:`cl2r_bench.tracking`). Under torchrun (``processes``)
    the model trains data-parallel on each rank's share of every global batch (:mod:`cl2r_bench.distributed`);
    ``training.channels_last``, ``training.compile`` (:func:`training_forward`) and ``training.fused_optimizer``
    (:func:`~cl2r_bench.training.engine.make_optimizer`) are speed options."""
    from tqdm import tqdm

    # The template imports Avalanche's training templates (3 s): only when a task trains, not for `runner.py list`.
    from .template import CompatibilityTemplate

    device = next(model.parameters()).device
    replay = memory.items if memory is not None and strategy.uses_memory else None
    batches = DeviceBatches(new, replay,
                            new_batch=settings.new_batch_size if replay is not None else settings.batch_size,
                            memory_batch=settings.memory_batch_size, epoch_length=settings.epoch_length,
                            processes=processes, channels_last=settings.channels_last)
    amp_dtype = autocast_dtype(settings.autocast, device)
    epochs = settings.epochs - (epoch_hook.epochs_done if epoch_hook is not None else 0)
    progress = tqdm(total=epochs * len(batches), desc=description, leave=False, mininterval=1.0,
                    disable=not (settings.progress and processes.is_main))
    optimizer = make_optimizer(model, settings, strategy.trainable_modules())
    if epoch_hook is not None:
        epoch_hook.begin(optimizer)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No loggers specified")
        template = CompatibilityTemplate(
            strategy=strategy, teacher=teacher_forward(teacher, settings),
            independent=teacher_forward(independent, settings), batches=batches, settings=settings,
            amp_dtype=amp_dtype, progress=progress, epoch_hook=epoch_hook, tracker=tracker or NullTracker(),
            task_index=task_index, memory=memory if strategy.uses_memory else None, trained=model,
            processes=processes, model=training_forward(model, settings, processes), optimizer=optimizer,
            train_mb_size=settings.batch_size, train_epochs=epochs, device=device, evaluator=None)
    started = time.perf_counter()
    model.train()
    try:
        template.train(experience if experience is not None else single_experience(new), eval_streams=[])
    finally:
        progress.close()
    if device.type == "cuda":
        torch.cuda.synchronize()
    processes.average_norm_statistics(model)
    broken = first_nonfinite_tensor(model)
    if broken is not None:
        raise NonFiniteError(f"{broken} holds NaN or infinite values after {template.step_count} iterations")
    return {"seconds": time.perf_counter() - started, "iterations": template.step_count,
            "images": template.images_seen, "final_loss": template.last_loss, "loss_terms": template.term_log.means}
