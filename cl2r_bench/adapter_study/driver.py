"""The one driver of an adapter study (docs/METHODS.md §7b): every adapter and seed fitted, measured, recorded and,
where asked, exported, each record kept when an earlier study finished it. ``runner.py adapt``, the
``model_update`` scenario on two encoders and ``tools/pretrained_study.py`` all go through :func:`drive`; they differ
only in the runs they list and in how a run's folder is held while it is written (:data:`Writing`)."""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks.adapted_cases import Scoring
from benchmarks.record import write_record
from cl2r_bench.adapters import Adapter
from cl2r_bench.config import config_text
from cl2r_bench.files import atomic_write_text

from .export import export_adapter
from .resume import result_of_record
from .study import Study, evaluate_adapter, study_record


@dataclass(frozen=True)
class StudyRun:
    """One adapter and seed of a study: the record's method label, its resolved config and its folder."""

    adapter: str
    seed: int
    folder: Path
    config: dict[str, Any]
    method: str = ""

    @property
    def label(self) -> str:
        return self.method or self.adapter


@dataclass(frozen=True)
class Protocol:
    """How every run of a study is measured (``model_update`` settings) and named in its record."""

    scenario: str
    dataset: str
    adapter_params: dict[str, dict[str, Any]]
    orders: list[str]
    steps: int
    scoring: Scoring
    device: torch.device

    @classmethod
    def of_run(cls, settings: Any, device: torch.device, dataset: str | None = None) -> Protocol:
        """The protocol of a run's resolved settings (:class:`cl2r_bench.settings.RunSettings`: its scenario, data
        set, ``adapter_params`` and ``model_update`` section)."""
        update = settings.model_update
        return cls(settings.scenario, dataset or settings.dataset, settings.adapter_params, update.backfill_orders,
                   update.backfill_steps, Scoring.of(update), device)


@dataclass
class Driven:
    """One run as the driver left it: its record (written, or ``kept`` from an earlier study), the adapter's
    result, the fitted adapter (None for ``none`` and for a kept record) and the files exported after its last
    seed."""

    run: StudyRun
    record: dict[str, Any]
    result: dict[str, Any]
    adapter: Adapter | None
    kept: bool
    exported: list[Path] = field(default_factory=list)


Writing = Callable[[StudyRun], contextlib.AbstractContextManager[Any]]
"""How a run's folder is held while its record is written: it saves ``config.yaml`` on entry (a lock and the
resume and overwrite checks of :class:`cl2r_bench.app.run_folder.RunFolder` for a run; none for ``adapt``)."""


@contextlib.contextmanager
def config_beside(run: StudyRun) -> Iterator[None]:
    """:data:`Writing` without a lock: ``config.yaml`` written atomically, then the record."""
    atomic_write_text(run.folder / "config.yaml", config_text(run.config))
    yield


def drive(study: Study, runs: list[StudyRun], protocol: Protocol, *, kept: dict[tuple[str, int], dict] | None = None,
          writing: Writing = config_beside, export: Path | None = None,
          started: float | None = None) -> Iterator[Driven]:
    """Fit, measure and record each run in order, yielding it when its record is written (rank 0 only under
    torchrun; the other ranks fit and measure beside it and yield nothing). A seed-free adapter
    (:meth:`Adapter.seed_free`) is fitted once and only its backfilling measured again for its other seeds; a
    run in ``kept`` (``(adapter, seed)`` -> record) keeps that record; with ``export``, each adapter is exported
    to ``export/<adapter>`` as its last run fitted it (``runner.py adapt`` refuses ``--export`` with
    ``--resume``). ``started``: when the invocation began (``time.perf_counter``), so that the first record's wall
    time counts the embedding before it."""
    kept = kept or {}
    main = study.processes.is_main
    measured: dict[str, tuple[Adapter, dict[str, Any]]] = {}
    last = {run.adapter: n for n, run in enumerate(runs)}
    for n, run in enumerate(runs):
        key = (run.adapter, run.seed)
        if key in kept:
            driven = Driven(run, kept[key], result_of_record(kept[key]), None, kept=True)
        else:
            driven = measured_run(study, run, protocol, measured.get(run.adapter), writing if main else None,
                                  started if n == 0 else None)
            if driven.adapter is not None and driven.adapter.seed_free(study.fitting_items):
                measured.setdefault(run.adapter, (driven.adapter, driven.result))
        if export is not None and last[run.adapter] == n and driven.adapter is not None and main:
            driven.exported = export_adapter(driven.adapter, export / run.adapter)
        if main:
            yield driven


def measured_run(study: Study, run: StudyRun, protocol: Protocol, measured: tuple[Adapter, dict[str, Any]] | None,
                 writing: Writing | None, started: float | None = None) -> Driven:
    """Fit and measure one run (:func:`evaluate_adapter`) and, where ``writing`` is given, write its record
    under it; the record's ``wall_seconds_this_invocation`` counts from ``started``, else from the run's fit."""
    started = time.perf_counter() if started is None else started
    held = writing(run) if writing is not None else contextlib.nullcontext()
    with held:
        adapter, result = evaluate_adapter(study, run.adapter, adapter_params=protocol.adapter_params, seed=run.seed,
                                           orders=protocol.orders, steps=protocol.steps, scoring=protocol.scoring,
                                           measured=measured)
        record = study_record(result, study, scenario=protocol.scenario, method=run.label, dataset=protocol.dataset,
                              config=run.config, device=protocol.device, adapter=adapter)
        record["timings"]["wall_seconds_this_invocation"] = time.perf_counter() - started
        if writing is not None:
            write_record(run.folder, record)
    return Driven(run, record, result, adapter, kept=False)
