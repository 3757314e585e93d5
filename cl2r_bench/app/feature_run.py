"""One run of a scenario that measures two encoders' features instead of running tasks
(``Scenario.measures_features``: ``model_update`` on encoder specs, docs/METHODS.md §7b).

Its features are read from the feature cache or embedded first, then the adapter is fitted and measured by the
adapter study's driver (:mod:`cl2r_bench.adapter_study`) and the record written under the run folder's lock. It
answers the same calls as :class:`cl2r_bench.app.run_loop.Run`, so the run command treats both alike; the choice
between them is :func:`start_run`'s.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from benchmarks.record import RECORD_FILE, read_record
from cl2r_bench.adapter_study.driver import Protocol, StudyRun, drive
from cl2r_bench.adapters import convergence_note
from cl2r_bench.app.assembly import Assembly
from cl2r_bench.app.run_folder import RunError, RunFolder
from cl2r_bench.app.run_loop import Run


class FeatureRun:
    """The leave-one-out protocol on two encoders for one seed; :meth:`execute` writes and returns its record."""

    def __init__(self, parts: Assembly, *, resume: bool = False, overwrite: bool = False,
                 log: Callable[[str], None] = print) -> None:
        self.parts, self.settings, self.scenario = parts, parts.settings, parts.scenario
        self.device, self.dir, self.processes = parts.device, parts.directory, parts.processes
        self.main, self.log = parts.processes.is_main, log
        self.folder = RunFolder(self.dir, resume=resume, overwrite=overwrite, writer=self.main, keeps_state=False)
        if self.folder.finished:
            self.folder.check_resumable(parts.config)

    def execute(self) -> dict[str, Any]:
        """The run's record: measured now, or, on ``--resume`` of a finished run with the same settings, the one
        already written (as a sweep skips it)."""
        if self.folder.finished:
            self.log(f"{self.dir}: complete already; --resume has nothing left to do")
            return read_record(self.dir / RECORD_FILE)
        if self.processes.world_size > 1:
            raise RunError("the leave-one-out protocol on encoder features runs in one process; run it without "
                           "torchrun")
        started = time.perf_counter()
        study = self.scenario.feature_study(self.device, self.log)
        run = StudyRun(self.settings.adapter.name, self.settings.seed, self.dir, self.parts.config, self.parts.label)
        (driven,) = drive(study, [run], Protocol.of_run(self.settings, self.device),
                          writing=lambda run: self.folder.writing(run.config), started=started)
        note = convergence_note(self.settings.adapter.name, driven.result["fit"])
        if note:
            self.log(note)
        return driven.record


def start_run(parts: Assembly, *, resume: bool = False, overwrite: bool = False) -> Run | FeatureRun:
    """The run an assembly asks for: the feature protocol when its scenario measures features, else the task loop."""
    kind = FeatureRun if parts.scenario.measures_features() else Run
    return kind(parts, resume=resume, overwrite=overwrite)
