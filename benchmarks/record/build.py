"""Records built in one place, for the run loop (:func:`run_record`) and the adapter studies
(:func:`leave_one_out_record`)."""
from typing import Any

from cl2r_bench.files import package_versions

from ..metrics import all_metrics, as_matrix
from .schema import Adapter, Device, Evaluation, NegativeFlips, Noise, ReplacementModel, RunRecord, Stream, Timings


def run_record(*, identity: dict[str, Any], num_tasks: int, tasks_completed: int, complete: bool,
               replacement_tasks: list[int], matrix: list[list[float | None]] | None, tie_rule: str,
               evaluation: Evaluation, stream: Stream, replacement_models: list[ReplacementModel],
               adapter: Adapter | None, config: dict[str, Any], device: Device, world_size: int, timings: Timings,
               noise: Noise | None = None, negative_flips: NegativeFlips | None = None,
               unadapted_matrix: list[list[float | None]] | None = None, query_hits: list[str] | None = None,
               extra: dict[str, Any] | None = None) -> RunRecord:
    """A stream run's record (:class:`RunRecord`), its metrics computed from ``matrix`` under ``tie_rule`` and the
    package versions added; ``identity`` holds ``scenario``, ``strategy``, ``method``, ``dataset`` and ``seed``;
    ``negative_flips`` those of ``matrix``'s per-query hits (None without them) and ``query_hits`` the hits
    themselves, packed per entry (:func:`benchmarks.record.pack_hits`);
    ``extra`` adds a scenario's own fields (``model_update``'s ``cases`` and ``backfilling``). The one place
    where this layout is built: the run loop (:class:`cl2r_bench.app.run_loop.Run`) passes the values."""
    record = {**identity, "num_tasks": num_tasks, "tasks_completed": tasks_completed, "complete": complete,
              "replacement_tasks": replacement_tasks, "compatibility_matrix": matrix,
              "metrics": all_metrics(as_matrix(matrix), tie_rule) if matrix else None,
              "evaluation": evaluation, "stream": stream, "replacement_models": replacement_models,
              "adapter": adapter, "config": config, "versions": package_versions(), "device": device,
              "world_size": world_size, "timings": timings, "negative_flips": negative_flips, **(extra or {})}
    if noise is not None:
        record["noise"] = noise
    if query_hits is not None:
        record["query_hits"] = query_hits
    if unadapted_matrix is not None:
        record["unadapted_matrix"] = unadapted_matrix
        record["unadapted_metrics"] = all_metrics(as_matrix(unadapted_matrix), tie_rule)
    return record


def leave_one_out_record(*, identity: dict[str, Any], retrieval: dict[str, Any], models: dict[str, Any],
                         adapter: Adapter | None, config: dict[str, Any], device: Device,
                         timings: dict[str, Any], matrix: list[list[float | None]] | None) -> RunRecord:
    """The record of one adapter and seed measured by the leave-one-out protocol (``runner.py adapt`` and
    ``model_update`` on encoder specs; :func:`leave_one_out`): the cases, backfilling and zero-shot retention under
    ``retrieval``, with the 2x2 top-1 ``matrix`` ``[[old/old], [cross, new/new]]`` and its metrics where the
    cross entry exists. The one place where this layout is built (:func:`cl2r_bench.adapter_study.study_record`
    passes the values)."""
    record = {**identity, "protocol": "leave_one_out", "num_tasks": 2, "tasks_completed": 2, "complete": True,
              "replacement_tasks": [], "retrieval": retrieval, "models": models, "adapter": adapter,
              "config": config, "versions": package_versions(), "device": device, "timings": timings}
    if matrix is not None:
        record["compatibility_matrix"] = matrix
        record["metrics"] = all_metrics(as_matrix(matrix), "strict")
    return record
