"""A run's folder (``<output>/<scenario>/<dataset>/<label>/seed<k>/``): whether it holds results this run may
resume or overwrite, the settings a resumed run must share with the interrupted one, its saved run state, and the
lock held while a run writes (:class:`RunFolder`). The run loop (:mod:`cl2r_bench.app.run_loop`) writes into it."""
from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import yaml

from benchmarks.record import holds_complete_record
from cl2r_bench.config import SPEED_OPTIONS, config_text, differing, flatten, load_yaml
from cl2r_bench.distributed import SINGLE, Processes
from cl2r_bench.errors import ConfigError
from cl2r_bench.files import atomic_write_text, exclusive
from cl2r_bench.limits import TextFileError, read_text

IGNORED_ON_RESUME = ("training.progress", *SPEED_OPTIONS, "evaluation.plots", "tracking.",
                     "distributed.connect_timeout", "distributed.timeout", "device", "output",
                     "model_update.stream_rows", "model_update.screen")
"""Settings that leave a run's results as they are: where they go, speed, progress and logging, and the two that only
``runner.py adapt`` reads (a run ranks in memory whatever they say, so a default changed since does not block it)."""
RUN_MARKER = ".cl2r-run"
STATE_KEYS = {"next_task", "timings", "replacements", "pretrain_seconds"}


class RunError(RuntimeError):
    """The run cannot start or continue as asked (e.g. results exist, resume mismatch, damaged run folder)."""


class RunFolder:
    """A run's folder: what may be resumed or overwritten, and the lock held while a run writes.

    ``state.pt`` (or a ``metrics.json`` of an older run without one) means results exist. ``--overwrite`` deletes only
    a folder the suite made (a ``.cl2r-run`` marker, or the ``config.yaml`` of a run made before the marker existed).
    The lock is ``<folder>.lock`` beside the folder, so it survives the folder's deletion; a second process on the
    same folder is refused. Under torchrun only rank 0 is the ``writer``; the others read the folder only."""

    def __init__(self, path: Path, *, resume: bool, overwrite: bool, writer: bool = True,
                 keeps_state: bool = True) -> None:
        if resume and overwrite:
            raise RunError("--resume continues a run and --overwrite deletes it: pass one of them")
        self.path, self.resume, self.overwrite, self.writer = path, resume, overwrite, writer
        self.keeps_state = keeps_state
        self.lock = path.with_name(path.name + ".lock")
        self.state = path / "state.pt"
        self.decided_resuming: bool | None = None
        self.check()

    def check(self) -> None:
        """Refuse a folder whose results this run may not write over: called when the run is set up (to fail before
        any data is read) and again once the lock is held (:meth:`writing`), since another run may have written the
        folder in between."""
        path, resume = self.path, self.resume
        results = self.state.exists() or (path / "metrics.json").exists()
        if results and not (resume or self.overwrite):
            raise RunError(f"{path} holds results of an earlier run; pass --resume to continue it or --overwrite to "
                           "start over (or --output elsewhere)")
        if resume and results and not self.state.exists() and not self.finished:
            raise RunError(f"--resume: {path} holds results without a run state (state.pt), e.g. a model_update run "
                           "made before version 0.2; there is nothing to continue: pass --overwrite to run it again")
        if path.is_dir() and any(path.iterdir()) and not self.made_by_suite():
            raise RunError(f"{path} holds files that this suite did not write, so it neither writes into it nor "
                           "deletes it; move them away or pass another --output")

    @property
    def finished(self) -> bool:
        """Whether ``--resume`` finds nothing left to do: a run that keeps no state (``keeps_state`` false, the
        feature protocol's :class:`cl2r_bench.app.feature_run.FeatureRun`) whose complete record is there."""
        return (self.resume and not self.keeps_state and not self.state.exists()
                and holds_complete_record(self.path))

    @property
    def resuming(self) -> bool:
        """Whether the run continues the folder's results: rank 0's decision under the lock once :meth:`writing`
        has taken it, until then what the folder holds now."""
        if self.decided_resuming is not None:
            return self.decided_resuming
        return self.resume and self.state.exists()

    def made_by_suite(self) -> bool:
        if (self.path / RUN_MARKER).is_file():
            return True
        try:
            config = load_yaml(read_text(self.path / "config.yaml", "config file"))
        except (TextFileError, yaml.YAMLError, ConfigError):
            return False
        return isinstance(config, dict) and {"scenario", "dataset", "seed"} <= set(config)

    def check_resumable(self, config: dict[str, Any]) -> None:
        """Refuse to resume with settings other than the interrupted run's; a missing or damaged ``config.yaml``
        is a :class:`RunError`."""
        path = self.path / "config.yaml"
        try:
            saved = load_yaml(read_text(path, "config file"))
        except (TextFileError, yaml.YAMLError, ConfigError) as exc:
            saved = exc
        if not isinstance(saved, dict):
            raise RunError(f"--resume: {path} is missing, empty or damaged, so the run's settings are unknown; "
                           "start over with --overwrite")
        diff = differing(_run_defining(saved), _run_defining(config))
        if diff:
            raise RunError(f"--resume: the settings differ from the interrupted run in {diff[:5]}; use the same "
                           "settings, or --overwrite to start over")

    def saved_state(self, world_size: int) -> dict[str, Any]:
        """The state of the run being resumed; a damaged ``state.pt``, or one of a run with another number of
        processes (the ranks' batch-norm statistics depend on it), is a :class:`RunError`."""
        try:
            state = torch.load(self.state, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - a damaged file fails in torch's zip reader or its unpickler
            state = exc
        if not isinstance(state, dict) or not STATE_KEYS <= set(state):
            raise RunError(f"--resume: {self.state} is damaged or not a run state of this suite; start over "
                           "with --overwrite")
        if state.get("world_size", 1) != world_size:
            raise RunError(f"--resume: the run was made by {state.get('world_size', 1)} process(es), not "
                           f"{world_size}; resume it with torchrun --nproc_per_node {state.get('world_size', 1)} "
                           "(or without torchrun for 1), or --overwrite to start over")
        return state

    @contextlib.contextmanager
    def writing(self, config: dict[str, Any], processes: Processes = SINGLE) -> Iterator[None]:
        """Hold the folder's lock; check the folder again under it (:meth:`check`, and the settings of a run to
        resume); delete an earlier run first with ``overwrite``; mark the folder and save ``config.yaml``. The run
        decides whether it resumes only after this (``resuming``). Under torchrun the other ranks write nothing and
        take rank 0's outcome: whether it resumes, or the error that refused the folder, which they raise too."""
        if not self.writer:
            refused, resuming = processes.from_main(None)
            if refused is not None:
                raise refused
            self.decided_resuming = resuming
            yield
            return
        told = False
        try:
            with exclusive(self.lock, f"run folder {self.path}"):
                self.check()
                if self.resuming:
                    self.check_resumable(config)
                if self.overwrite and self.path.exists():
                    shutil.rmtree(self.path)
                atomic_write_text(self.path / RUN_MARKER, "a run folder of the cl2r benchmark suite\n")
                atomic_write_text(self.path / "config.yaml", config_text(config))
                self.decided_resuming = self.resuming
                processes.from_main((None, self.decided_resuming))
                told = True
                yield
        except Exception as exc:
            if not told:
                processes.from_main((exc, False))
            raise


def _run_defining(config: dict[str, Any]) -> dict[str, Any]:
    """The settings a resumed run must share with the interrupted one: all but where results go, progress and
    logging, and the parameters of strategies, adapters and scenarios the run does not use."""
    used = (f"strategy_params.{config.get('strategy')}.", f"adapter_params.{config.get('adapter', {}).get('name')}.",
            f"scenario_params.{config.get('scenario')}.")
    return {k: v for k, v in flatten(config).items() if not k.startswith(IGNORED_ON_RESUME)
            and (not k.startswith(("strategy_params.", "adapter_params.", "scenario_params.")) or k.startswith(used))}
