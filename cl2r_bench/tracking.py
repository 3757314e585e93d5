"""Optional experiment logging to TensorBoard; off by default.

Turned on by the config key ``tracking.tensorboard: true``; the event files then go to
``<run folder>/tensorboard/``. Without it a run uses :class:`NullTracker`, which writes nothing, and TensorBoard
need not be installed.

What is logged (TensorBoard scalars, tag: value at step):

- ``train/loss`` and ``train/lr``: the training loss and learning rate every 25 iterations (where the training
  loop reads the loss anyway) and at each task's last iteration, at a global step that counts the iterations of
  the whole run, so one run's loss curve is continuous across tasks (:meth:`TensorBoardTracker.train_step`).
- ``compatibility/M[t][k]``: the compatibility matrix entry of query model ``t`` against gallery model ``k`` (a
  fraction) for ``k = 0..t``, at step ``t``, logged when task ``t`` finishes.
- ``metrics/<name>`` (``metrics/AC``, ``metrics/AA``, ...): the running metrics after task ``t``, at step ``t``;
  metrics that are not defined yet (``None``) are skipped.

View them with ``tensorboard --logdir <output folder>``: every run folder below it is one TensorBoard run.
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol

INSTALL_HINT = 'pip install tensorboard (or pip install "cl2r-bench[tensorboard]")'
LOSS_TAG = "train/loss"


class TrackingError(RuntimeError):
    """Experiment logging was asked for but cannot run (TensorBoard is not installed)."""


class Tracker(Protocol):
    """What a run reports to an experiment logger while it trains and evaluates."""

    def train_step(self, task: int, iteration: int, loss: float, lr: float) -> None:
        """Training loss and learning rate at ``iteration`` (counted from 1 within the task) of ``task``."""

    def task_finished(self, task: int, row: list[float], metrics: dict[str, float | None]) -> None:
        """Task ``task`` is evaluated: ``row`` is ``M[task][0..task]`` (fractions), ``metrics`` the running
        metrics so far (``None`` where not defined yet)."""

    def close(self) -> None:
        """Write out everything and release the files; called once at the end of a run, also after a failure."""


class NullTracker:
    """The default tracker: logging is off, nothing is written."""

    def train_step(self, task: int, iteration: int, loss: float, lr: float) -> None:
        pass

    def task_finished(self, task: int, row: list[float], metrics: dict[str, float | None]) -> None:
        pass

    def close(self) -> None:
        pass


class TensorBoardTracker:
    """Logs to TensorBoard event files in ``log_dir`` (created if missing) through ``SummaryWriter``.

    A resumed run appends: its writer opens a new events file in the same folder, TensorBoard shows the files of
    one folder as one run, and the global training step continues after the largest ``train/loss`` step already
    there, so the loss curve does not go back. The iterations of a task that was interrupted and is trained again
    therefore appear twice on that curve, one after the other; the task-level scalars (step = task) are only
    written for tasks finished by the run that logs them.

    Raises :class:`TrackingError` when TensorBoard is not installed.
    """

    def __init__(self, log_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise TrackingError(f"tracking.tensorboard needs TensorBoard, which is not installed: "
                                f"{INSTALL_HINT}") from exc
        self.log_dir = Path(log_dir)
        self._last_step = _last_logged_step(self.log_dir, LOSS_TAG)
        self._offset = max(self._last_step, 0)
        self._segment: tuple[int, int] | None = None
        self._writer = SummaryWriter(log_dir=str(self.log_dir))
        self._closed = False

    @property
    def global_step(self) -> int:
        """The step of the latest ``train/loss`` point (-1 before the first one of a fresh folder)."""
        return self._last_step

    def train_step(self, task: int, iteration: int, loss: float, lr: float) -> None:
        """Log ``train/loss`` and ``train/lr`` at a global step that never goes back within the folder.

        The global step is the number of iterations logged before the current task (the iteration of its
        previous ``train_step``, which the training loop reports at each task's last iteration) plus
        ``iteration``: with the loop's calls it counts every training iteration of the run. A new segment starts
        when ``task`` changes or ``iteration`` does not grow (a task trained again); a step that would not exceed
        the previous one is moved just past it.
        """
        if self._segment is None or task != self._segment[0] or iteration <= self._segment[1]:
            self._offset = max(self._last_step, 0)
        self._segment = (task, iteration)
        step = max(self._offset + iteration, self._last_step + 1)
        self._writer.add_scalar(LOSS_TAG, float(loss), step)
        self._writer.add_scalar("train/lr", float(lr), step)
        self._last_step = step

    def task_finished(self, task: int, row: list[float], metrics: dict[str, float | None]) -> None:
        """Log ``compatibility/M[task][k]`` for each ``k`` and each numeric ``metrics/<name>`` (AC, AA, ACA, ...;
        undefined ones and non-numbers such as the list of violations are left out), all at step ``task``, and
        flush, so a run killed later keeps the finished tasks' scalars."""
        for k, value in enumerate(row):
            self._writer.add_scalar(f"compatibility/M[{task}][{k}]", float(value), task)
        for name, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self._writer.add_scalar(f"metrics/{name}", float(value), task)
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the events file; calling it again does nothing."""
        if not self._closed:
            self._writer.close()
            self._closed = True


def make_tracker(enabled: bool, log_dir: Path) -> Tracker:
    """A :class:`TensorBoardTracker` writing to ``log_dir`` if ``enabled`` (``tracking.tensorboard``), else a
    :class:`NullTracker`; nothing is created or imported when logging is off."""
    return TensorBoardTracker(log_dir) if enabled else NullTracker()


def _last_logged_step(log_dir: Path, tag: str) -> int:
    """The largest step of ``tag`` in the events files already in ``log_dir``, -1 if none.

    A record cut short by a killed run ends the reading of its file; the records before it count."""
    files = sorted(log_dir.glob("events.out.tfevents.*")) if log_dir.is_dir() else []
    if not files:
        return -1
    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

    last = -1
    for path in files:
        for event in LegacyEventFileLoader(str(path)).Load():
            if event.step > last and any(value.tag == tag for value in event.summary.value):
                last = event.step
    return last
