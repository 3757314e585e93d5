"""The run record: what a run's ``metrics.json`` holds, written once for its writer and its readers.

:class:`RunRecord` and the ``TypedDict`` s it nests name every field the run loop (``cl2r_bench/app/run_loop.py``,
``Run.record``) writes, with its unit; the leaderboard, the figures and the tools read records as these types.
:func:`record_problem` is the schema's runtime check and :func:`read_record` the one way to read a file, so a
hand-made, damaged or partial ``metrics.json`` is named in one line instead of crashing a reader or being averaged.

Conventions of every field:

* **Tasks are 0-based**: task t is row t of the compatibility matrix, ``replacement_tasks`` and every ``task``
  field count from 0.
* **Accuracies are fractions in [0, 1]**: matrix entries, ``own_accuracy``, retrieval ``cases``, backfilling
  curves and areas, noise intervals, AC and its noise-aware variants, the negative flip rates. **AA and ACA are
  percent** in [0, 100] and **BC and FC percent points** in [-100, 100], as the papers report them
  (``benchmarks/metrics.py``).
* **Seconds** for every duration; ``null`` where a value does not exist (the matrix above its diagonal, ACA of
  one task, a case an adapter cannot produce), never 0.

The schema is also the readers' contract: a field they rely on is marked ``Annotated[type, Read(...)]`` with what
it must be, and :func:`record_problem` derives its check from those marks (:func:`schema_problem`), adding only the
rules between fields. It guarantees a complete run with its identity (``scenario``, ``dataset``, ``strategy``,
``seed``), AC / AA / ACA in range, a well-formed matrix of ``num_tasks`` rows, and, where present, the replacement
tasks, config, noise summary, replacement models' own accuracies, task timings, the negative flip rates (one per
consecutive pair of models), the ``model_update`` cases and backfilling areas and the leave-one-out cases and
areas. The other fields are as the writer wrote them; a hand-made record may lack them, so a reader that needs them
checks first (as :func:`cl2r_bench.reporting.plots.figure_problem` does for the per-task curves, violations and noise
intervals).

The package, one idea per module: :mod:`.schema` (the layout), :mod:`.marks` (what readers rely on), :mod:`.check`
(the runtime check), :mod:`.build`, :mod:`.files` (write and read) and :mod:`.cases`.
"""
from .build import leave_one_out_record, run_record
from .cases import BASELINE, CROSS_CASES, cross_case, pack_hits, unpack_hits
from .check import adapter_diagnostics, adapter_study, leave_one_out, record_problem, schema_problem, update_fit
from .files import (
    MAX_RECORD_BYTES,
    RECORD_FILE,
    RecordError,
    checked_records,
    holds_complete_record,
    read_record,
    write_record,
)
from .marks import (
    CASE_FLIPS,
    CMC_CURVES,
    CONVENTION,
    COUNT,
    DUAL_CASE,
    FLIPS,
    FRACTION,
    INTERVAL,
    LARGE_GALLERY_SCORES,
    NAME,
    OPTIONAL_FRACTION,
    PACKED_HITS,
    PAPER_CASES,
    RATES,
    SCORES,
    Check,
    Read,
)
from .schema import (
    Adapter,
    AdapterFit,
    BackfillAUC,
    Device,
    Evaluation,
    Extractions,
    LeaveOneOutRecord,
    Metrics,
    NegativeFlips,
    Noise,
    NoiseSummary,
    PairDecision,
    RecordIdentity,
    ReplacementModel,
    Retrieval,
    RetrievalCases,
    RunRecord,
    Stream,
    StudyBackfilling,
    TaskTiming,
    Timings,
    TwoModel,
)

__all__ = [
    "Adapter", "AdapterFit", "BASELINE", "BackfillAUC", "CASE_FLIPS", "CMC_CURVES", "CONVENTION", "COUNT",
    "CROSS_CASES", "Check", "DUAL_CASE",
    "Device", "Evaluation", "Extractions", "FLIPS", "FRACTION", "INTERVAL", "LARGE_GALLERY_SCORES",
    "LeaveOneOutRecord", "MAX_RECORD_BYTES", "Metrics", "NAME", "NegativeFlips", "Noise", "NoiseSummary",
    "OPTIONAL_FRACTION", "PACKED_HITS", "PAPER_CASES", "PairDecision", "RATES", "RECORD_FILE", "Read", "RecordError",
    "RecordIdentity", "ReplacementModel", "Retrieval", "RetrievalCases", "RunRecord", "SCORES", "Stream",
    "StudyBackfilling", "TaskTiming", "Timings", "TwoModel", "adapter_diagnostics", "adapter_study", "checked_records",
    "cross_case", "holds_complete_record", "leave_one_out", "leave_one_out_record", "pack_hits", "read_record",
    "record_problem", "run_record", "schema_problem", "unpack_hits", "update_fit", "write_record",
]
