"""The run record: what a run's ``metrics.json`` holds, written once for its writer and its readers.

:class:`RunRecord` and the ``TypedDict`` s it nests name every field the run loop (``cl2r_bench/run.py``,
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
checks first (as :func:`reporting.plots.figure_problem` does for the per-task curves, violations and noise
intervals).
"""
import base64
import dataclasses
import json
import math
import reprlib
import stat
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypedDict, get_args, get_origin, get_type_hints, is_typeddict

import numpy as np

from cl2r_bench.adapters.protocol import ORTHOGONALITY_GAP
from cl2r_bench.files import atomic_write_json, package_versions, strict_json
from cl2r_bench.settings import BACKFILL_ORDERS

from .metrics import MatrixError, all_metrics, as_matrix, is_number

if sys.version_info >= (3, 11):
    from typing import NotRequired
else:
    from typing_extensions import NotRequired

RECORD_FILE = "metrics.json"
PAPER_CASES = ("old/old", "new/old", "new/new", "F/old", "F/F", "new/F", "B/old", "B/F", "B/B")
"""The leave-one-out cases, query/gallery (λ-orth Table 1b)."""
SCORES = ("top1", "top5", "mAP")
"""The scores of each leave-one-out case, in percent."""
LARGE_GALLERY_SCORES = ("mAP@R",)
"""The scores a case adds since the suite measures large galleries (version 0.6.0; benchmarks/ranking.py), absent
from older records."""
CROSS_CASES = ("B/old", "new/F", "new/old")
"""The cross entry of the 2x2 matrix, what a system serves without backfilling, in order of preference: B/old for an
adapter with a backward map, new/F for a forward-only one, new/old without adapter (docs/METHODS.md §7b)."""
BASELINE = "old/old"
"""The case an adapter must beat to be compatible: the old model alone."""


def cross_case(cases: dict[str, Any]) -> str | None:
    """The first case of :data:`CROSS_CASES` the record's ``cases`` hold, or None."""
    return next((case for case in CROSS_CASES if cases.get(case) is not None), None)


def pack_hits(hits: np.ndarray) -> str:
    """Per-query booleans as base64 of packed bits (``retrieval.query_top1``; 10,000 queries: 1.7 kB of JSON)."""
    return base64.b64encode(np.packbits(np.asarray(hits, dtype=bool)).tobytes()).decode("ascii")


def unpack_hits(text: str, queries: int) -> np.ndarray:
    """The inverse of :func:`pack_hits` for ``queries`` queries."""
    return np.unpackbits(np.frombuffer(base64.b64decode(text), dtype=np.uint8), count=queries).astype(bool)


Check = Callable[[Any], bool]


@dataclass(frozen=True)
class Read:
    """A field the readers rely on, marked in the schema below as ``Annotated[type, Read(...)]``: what it must be
    (``expected``, the words of the one-line problem), the test of its value (``check``), and whether a record
    without it is rejected (``required``; ``required_with``: only when that field beside it is present). A
    ``TypedDict`` field (or a list of them) that passes is checked field by field in turn
    (:func:`schema_problem`). Fields without a ``Read`` are as the writer wrote them."""

    expected: str
    check: Check
    required: bool = False
    required_with: str | None = None


def _text(value: Any) -> bool:
    return isinstance(value, str) and value.strip() != ""


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(value: Any) -> bool:
    return _integer(value) and value >= 0


def _object(value: Any) -> bool:
    return isinstance(value, dict)


def _within(low: float, high: float) -> Check:
    return lambda value: is_number(value) and low <= value <= high


def _optional(check: Check) -> Check:
    return lambda value: value is None or check(value)


def _interval(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(map(_within(0, 1), value))


def _objects(value: Any) -> bool:
    return isinstance(value, list) and all(map(_object, value))


def _scores(value: Any) -> bool:
    """A case's scores; a screened ranking's (``model_update.screen``) give mAP@R and no mAP (null)."""
    screened = _object(value) and value.get("mAP") is None and "mAP@R" in value
    return (_object(value) and all(_within(0, 100)(value.get(k)) for k in SCORES if not (screened and k == "mAP"))
            and all(_within(0, 100)(value[k]) for k in LARGE_GALLERY_SCORES if k in value))


def _areas(value: Any) -> bool:
    """An order's areas: top-1 and mAP, or top-1 and mAP@R where the gallery was screened."""
    precision = "mAP@R_auc" if _object(value) and "mAP@R_auc" in value else "mAP_auc"
    return _object(value) and all(_within(0, 100)(value.get(k)) for k in ("top1_auc", precision))


def _packed(value: Any) -> bool:
    """Per-query hits by case, each packed by :func:`pack_hits` (base64 text)."""
    return _object(value) and all(isinstance(hits, str) for hits in value.values())


def _curves(value: Any) -> bool:
    """CMC top-1 ... top-k in percent by case."""
    return _object(value) and all(isinstance(curve, list) and all(map(_within(0, 100), curve))
                                  for curve in value.values())


def _counts(value: Any) -> bool:
    return _object(value) and all(map(_count, value.values()))


NAME = Read("a non-empty string", _text, required=True)
COUNT = Read("a whole number from 0", _count)
PACKED_HITS = Read("an object of per-query hits packed as base64 text", _packed)
CMC_CURVES = Read("an object of CMC curves (lists of percentages)", _curves)
CONVENTION = Read("'miss' or 'exclude'", lambda value: value in ("miss", "exclude"))
FRACTION = "a fraction in [0, 1]"
OPTIONAL_FRACTION = Read("null or a fraction in [0, 1]", _optional(_within(0, 1)))
INTERVAL = "[low, high], fractions in [0, 1]"
RATES = "a list of fractions in [0, 1] (null where not measured)"
FLIPS = "an object with self, cross, mean_self and mean_cross (benchmarks/flips.py)"


class Metrics(TypedDict):
    """The compatibility metrics of a matrix (``benchmarks.metrics.all_metrics``; METHODS.md §2).

    ``AC``: share of pairs t > k with ``M[t][k] > M[k][k]`` (a fraction; 1.0 for one task). ``AA``: mean of the
    lower triangle with the diagonal, percent. ``ACA``: mean of the strictly lower entries, percent (None for one
    task). ``AC_per_task`` / ``AA_per_task``: AC (fractions) and AA (percent) of each top-left (t+1)x(t+1) block,
    one per task. ``BC``: mean over k < T-1 of ``M[T-1][k] - M[k][k]``; ``FC``: mean over t >= 1 of
    ``M[t][t-1] - M[t][t]``; both percent points, None for one task. ``violations``: the pairs ``[t, k]``, t > k,
    that are not compatible. ``tie_rule``: ``strict`` (a tie is a violation) or ``inclusive``.
    ``ACA_definition``: ACA's definition in words (the suite's own; none is published)."""
    AC: Annotated[float, Read(FRACTION, _within(0, 1), required=True)]
    AA: Annotated[float, Read("a percentage in [0, 100]", _within(0, 100), required=True)]
    ACA: Annotated[float | None, Read("a percentage in [0, 100] (null for one task)", _optional(_within(0, 100)),
                                      required=True)]
    AC_per_task: list[float]
    AA_per_task: list[float]
    BC: Annotated[float | None, Read("null or percent points in [-100, 100]", _optional(_within(-100, 100)))]
    FC: Annotated[float | None, Read("null or percent points in [-100, 100]", _optional(_within(-100, 100)))]
    violations: list[list[int]]
    tie_rule: Literal["strict", "inclusive"]
    ACA_definition: str


class NoiseSummary(TypedDict):
    """Noise-aware AC over a set of pairs (``benchmarks/noise.py``). ``AC_outside_noise``: share of the pairs
    compatible beyond noise, a lower bound; ``AC_upper``: share not incompatible beyond noise, an upper bound; both
    fractions, None without pairs. ``pairs``: how many pairs; ``within_noise``: how many are neither."""
    AC_outside_noise: Annotated[float | None, dataclasses.replace(OPTIONAL_FRACTION, required=True)]
    AC_upper: Annotated[float | None, dataclasses.replace(OPTIONAL_FRACTION, required=True)]
    pairs: int
    within_noise: Annotated[int, Read("a number of pairs", _count, required=True)]


class PairDecision(TypedDict):
    """One pair (t, k), t > k. ``difference``: ``M[t][k] - M[k][k]`` (fraction); ``interval``: its ``[low, high]``
    at the record's confidence; ``decision``: ``compatible`` / ``incompatible`` beyond noise or ``within_noise``;
    ``across``: whether a replacement task r has k < r <= t."""
    pair: list[int]
    difference: float
    interval: list[float]
    decision: Literal["compatible", "incompatible", "within_noise"]
    across: bool


class Noise(NoiseSummary):
    """How much of the matrix is query-sampling noise (``benchmarks/noise.py``; METHODS.md §8), with the summary
    over all pairs t > k at the top level.

    ``method``: ``paired_bootstrap`` (per-query hits resampled together) or ``binomial`` (entries drawn
    independently). ``confidence``: the intervals' level (0.95). ``queries``: the n of every entry.
    ``resamples`` / ``seed``: the draws. ``entry_intervals``: the Wilson interval ``[low, high]`` of each entry,
    rows as the matrix, None above the diagonal. ``AC_interval``: AC's percentile interval over the resamples.
    ``across``: the summary over the pairs separated by a replacement. ``pair_decisions``: one per pair, row
    order."""
    method: Literal["paired_bootstrap", "binomial"]
    confidence: float
    queries: Annotated[int, Read("a positive number of queries", lambda v: _count(v) and v > 0, required=True)]
    resamples: int
    seed: int
    entry_intervals: list[list[list[float] | None]]
    AC_interval: Annotated[list[float], Read(INTERVAL, _interval, required=True)]
    across: Annotated[NoiseSummary, Read("an object (benchmarks/noise.py)", _object, required=True)]
    pair_decisions: list[PairDecision]


def _rates(value: Any) -> bool:
    return isinstance(value, list) and all(map(_optional(_within(0, 1)), value))


class NegativeFlips(TypedDict):
    """Negative flips between consecutive models (:func:`benchmarks.flips.negative_flips`; METHODS.md §2), from the
    per-query hits of the matrix the record reports. ``self``: for each pair (t - 1, t), t >= 1, the share of the
    queries that ``[t-1][t-1]`` retrieves correctly at top-1 and ``[t][t]`` does not; ``cross``: the same with
    ``[t][t-1]`` (new queries, old gallery) in place of ``[t][t]``. Fractions, one per pair (none for one task),
    None where an entry was not measured. ``mean_self`` / ``mean_cross``: their means, None unless every pair has
    a rate."""
    self: Annotated[list[float | None], Read(RATES, _rates, required=True)]
    cross: Annotated[list[float | None], Read(RATES, _rates, required=True)]
    mean_self: Annotated[float | None, dataclasses.replace(OPTIONAL_FRACTION, required=True)]
    mean_cross: Annotated[float | None, dataclasses.replace(OPTIONAL_FRACTION, required=True)]


class ReplacementModel(TypedDict):
    """A model a task starts from (a replacement of IAM-CL2R; the old and the new model of ``model_update``).

    ``task``: the task it starts. ``path``: its checkpoint, absolute, or an encoder spec. ``source``: ``user``
    (a file of ``replacement.checkpoints``), ``encoder`` (a spec there, :mod:`cl2r_bench.encoders`), ``pretrained``
    (by this run) or ``cached`` (by an earlier one). ``classes``: how
    many classes it was pretrained on (absent for the user's files). ``own_accuracy``: its retrieval accuracy on
    the evaluation set before any fine-tuning (a fraction) and ``own_accuracy_interval`` its Wilson interval;
    absent where the scenario does not score its starting models."""
    task: Annotated[int, Read("a task index", _count, required_with="own_accuracy")]
    path: str
    source: Literal["user", "encoder", "pretrained", "cached"]
    classes: NotRequired[Annotated[int, Read("a number of classes", _optional(_count))]]
    own_accuracy: NotRequired[Annotated[float, Read(FRACTION, _within(0, 1))]]
    own_accuracy_interval: NotRequired[Annotated[list[float], Read(INTERVAL, _interval, required_with="own_accuracy")]]


class AdapterFit(TypedDict):
    """One fit of the adapter: ``task`` (the incoming model's), ``items`` (images it was fitted on), ``seconds``
    (embedding both models and fitting), beside the adapter's own fit log (e.g. λ-orthogonal's final ``f_W``)."""
    task: int
    items: int
    seconds: float


class Adapter(TypedDict):
    """The adapter between successive models (METHODS.md §7); the record's ``adapter`` is None without one.

    ``name``: the adapter. ``direction``: ``backward`` (new queries mapped into old galleries) or ``forward``
    (kept galleries mapped into the new space), the matrix the record reports. ``at``: ``replacements`` or
    ``every_task``. ``fits``: one per fit, task order. Records of the former ``model_update`` writer carry instead
    ``fit`` (the single fit's log, where the leaderboard reads ``f_W``) and ``fit_items``."""
    name: str
    direction: NotRequired[Literal["backward", "forward"]]
    at: NotRequired[Literal["replacements", "every_task"]]
    fits: NotRequired[list[AdapterFit]]
    fit: NotRequired[dict[str, float]]
    fit_items: NotRequired[int]


class TaskTiming(TypedDict):
    """One task's cost. ``seconds``: training (0 where the scenario does not train); ``iterations``: optimiser
    steps; ``images``: training images seen, each epoch counted (by all ranks together under torchrun);
    ``final_loss``: the last batch's loss (the global batch's; None without training); ``eval_seconds``: deploying the
    model (embedding and scoring); ``images_per_second``: ``images / seconds``."""
    seconds: Annotated[float, Read("a number of seconds", _within(0, math.inf), required=True)]
    iterations: Annotated[int, Read("a number of iterations", _count, required=True)]
    images: int
    final_loss: float | None
    eval_seconds: float
    images_per_second: float


class Timings(TypedDict):
    """The run's cost in seconds. ``tasks``: one :class:`TaskTiming` per finished task; ``pretrain_seconds``:
    finding or pretraining the starting models; ``train_seconds`` / ``eval_seconds``: the tasks' sums;
    ``wall_seconds_this_invocation``: the whole invocation that completed the run (absent before it completes;
    a resumed run's covers the resumed part only). Records of the former ``model_update`` writer carry
    ``model_training_seconds``, ``adapter_fit_seconds`` and ``evaluation_seconds`` instead of the first four;
    ``evaluation_processes``: the processes that shared an adapter study's evaluation (``runner.py adapt`` under
    torchrun), which changes its seconds, not its figures."""
    tasks: Annotated[list[TaskTiming], Read("a list of objects", _objects)]
    pretrain_seconds: float
    train_seconds: float
    eval_seconds: float
    wall_seconds_this_invocation: NotRequired[float]
    model_training_seconds: NotRequired[float]
    adapter_fit_seconds: NotRequired[float]
    evaluation_seconds: NotRequired[float]
    evaluation_processes: NotRequired[int]


class Extractions(TypedDict):
    """How many times a model embedded the whole gallery and the query set: one of each per deployed model."""
    gallery: int
    query: int


class Evaluation(TypedDict):
    """The evaluation set. ``queries``: query images (the n of every accuracy); ``gallery_images``: gallery images;
    ``mode``: ``templates`` (one normalised mean feature per class) or ``images`` (every gallery image);
    ``extractions``: :class:`Extractions` (absent in records of the former ``model_update`` writer)."""
    queries: int
    gallery_images: int
    mode: Literal["templates", "images"]
    extractions: NotRequired[Extractions]


class Stream(TypedDict):
    """The task stream. ``classes_per_task``: new classes of each task; ``train_images_per_task``: training images
    of each task; ``class_order``: the stream's classes in the order they arrive (dataset class indices)."""
    classes_per_task: list[int]
    train_images_per_task: list[int]
    class_order: list[int]


class Device(TypedDict):
    """Where the run computed: ``type`` (``cpu`` / ``cuda``), ``cpu`` (processor), ``cpu_threads`` (torch's
    threads) and, on a GPU, ``gpu`` (its name)."""
    type: str
    cpu: str
    cpu_threads: int
    gpu: NotRequired[str]


RetrievalCases = TypedDict("RetrievalCases", {
    case: Annotated[dict[str, float] | None, Read("null or top1 / top5 / mAP (/ mAP@R) in percent", _optional(_scores))]
    for case in PAPER_CASES}, total=False)
"""Each leave-one-out case's ``top1`` / ``top5`` / ``mAP`` / ``mAP@R`` in percent, None where the adapter cannot
produce it; ``mAP`` is None where the gallery was screened (``model_update.screen``)."""

BackfillAUC = TypedDict("BackfillAUC", {
    order: Annotated[dict[str, float] | None, Read("null or top1_auc / mAP_auc in percent", _optional(_areas))]
    for order in BACKFILL_ORDERS}, total=False)
"""Each backfilling order's ``top1_auc`` / ``mAP_auc`` in percent (``mAP@R_auc`` where the gallery was screened),
None where the adapter cannot rank the gallery."""


class StudyBackfilling(TypedDict):
    """Partial backfilling in an adapter study (:mod:`benchmarks.adapter_study`): ``betas``, per order
    the ``curves`` of ``top1`` and ``mAP`` (``mAP@R`` where the gallery was screened; percent) at each beta, and their
    areas ``auc``."""
    betas: list[float]
    curves: dict[str, dict[str, list[float]] | None]
    auc: Annotated[BackfillAUC, Read("an object of areas per order", _object, required=True)]


class Retrieval(TypedDict):
    """An adapter study's measurements (:func:`benchmarks.adapter_study.measure`), leave-one-out or along a stream: the
    ``cases``, the per-query top-1 hits of old/old, the cross case and new/new (``query_top1``, packed by
    :func:`pack_hits`; new/new since 2026-11-27), the
    :class:`NegativeFlips` of the two models (``negative_flips``: one pair, old/old to new/new and to the cross case;
    absent in records before it), ``backfilling``, ``zero_shot`` retention (None where it does not apply), each case's
    CMC top-1 ... top-100 in percent (``cmc``), the ``queries`` count, of which ``queries_without_match`` have no other
    item of their class in the gallery, counted in CMC by the convention ``unmatched_queries`` (``miss`` or ``exclude``;
    these three are absent in records before version 0.5, which counted such queries as misses), with
    ``model_update.per_class_cmc`` each case's CMC top-1 and top-5 per query class (``per_class_cmc``), with
    ``model_update.queries`` the seeded sample of queries ranked against the whole gallery (``sampled_queries``:
    ``count``, ``of``, ``seed``; ``queries`` is then its count) and each case's 95 % bootstrap interval over those
    queries (``sampling_interval``), and the ``fitting_items`` (leave-one-out) or the ``gallery_items`` and
    ``gallery_mode`` (stream)."""
    cases: Annotated[RetrievalCases, Read("an object of cases", _object, required=True)]
    query_top1: NotRequired[Annotated[dict[str, str], PACKED_HITS]]
    negative_flips: NotRequired[Annotated[NegativeFlips, Read(FLIPS, _object)]]
    backfilling: Annotated[StudyBackfilling, Read("an object with 'auc'", _object, required=True)]
    zero_shot: dict[str, float] | None
    cmc: NotRequired[Annotated[dict[str, list[float]], CMC_CURVES]]
    queries_without_match: NotRequired[Annotated[int, COUNT]]
    unmatched_queries: NotRequired[Annotated[Literal["miss", "exclude"], CONVENTION]]
    per_class_cmc: NotRequired[dict[str, dict[str, list[float | None] | list[int]]]]
    sampled_queries: NotRequired[Annotated[dict[str, int], Read("an object of counts", _counts)]]
    sampling_interval: NotRequired[dict[str, dict[str, list[float]]]]
    queries: Annotated[int, dataclasses.replace(COUNT, required=True)]
    fitting_items: NotRequired[Annotated[int, COUNT]]
    gallery_items: NotRequired[Annotated[int, COUNT]]
    gallery_mode: NotRequired[Literal["templates", "images"]]


class TwoModel(TypedDict):
    """The BCT line's two-model protocol of an ``upgrade`` run (``scenarios/upgrade.py``, docs/METHODS.md §6c): the
    test split of every class is query and gallery, each query's own image left out. ``cases``: old/old, new/old and
    new/new, each ``top1`` / ``top5`` / ``mAP`` in percent; ``negative_flips`` (:class:`NegativeFlips`, one pair:
    old/old to new/new and to new/old); ``query_top1`` (old/old and new/old hits, packed by :func:`pack_hits`);
    each case's ``cmc`` top-1 ... top-100; the ``queries``, of which ``queries_without_match`` have no other item of
    their class, counted by the convention ``unmatched_queries``; ``classification``: the classifiers' reading on the
    same images (:func:`benchmarks.flips.classification_flips`: ``old_top1``, ``new_top1``, ``nfr``,
    ``relative_nfr``, fractions)."""
    cases: Annotated[RetrievalCases, Read("an object of cases", _object, required=True)]
    negative_flips: Annotated[NegativeFlips, Read(FLIPS, _object)]
    query_top1: Annotated[dict[str, str], PACKED_HITS]
    cmc: Annotated[dict[str, list[float]], CMC_CURVES]
    queries: Annotated[int, dataclasses.replace(COUNT, required=True)]
    queries_without_match: Annotated[int, COUNT]
    unmatched_queries: Annotated[Literal["miss", "exclude"], CONVENTION]
    classification: NotRequired[dict[str, float | None]]


class RecordIdentity(TypedDict):
    """What every ``metrics.json`` holds, a stream run's (:class:`RunRecord`) and a leave-one-out study's
    (:class:`LeaveOneOutRecord`) alike: identity, progress and provenance, as :class:`RunRecord` describes them."""
    scenario: Annotated[str, NAME]
    strategy: Annotated[str, NAME]
    method: Annotated[str, dataclasses.replace(NAME, required=False)]
    dataset: Annotated[str, NAME]
    seed: Annotated[int, Read("an integer", _integer, required=True)]
    num_tasks: Annotated[int, Read("a number of tasks", _count)]
    tasks_completed: Annotated[int, Read("a number of tasks", _count)]
    complete: bool
    replacement_tasks: Annotated[list[int], Read("a list of task indices",
                                                 lambda v: isinstance(v, list) and all(map(_count, v)))]
    adapter: Adapter | None
    config: Annotated[dict[str, Any], Read("an object (the resolved settings)", _optional(_object))]
    versions: dict[str, str | None]
    device: Device
    timings: Annotated[Timings, Read("an object", _object)]
    non_finite_values: NotRequired[dict[str, str]]


class RunRecord(RecordIdentity):
    """A run's ``metrics.json``: one scenario, data set, strategy (or adapter) and seed.

    Identity: ``scenario`` (``cl2r``, ``iamcl2r``, ``model_update``), ``strategy`` (the training method; the
    scenario's name where no strategy trains), ``method`` (the run's label in folders and tables: the strategy,
    ``+<adapter>`` when one is used, the adapter alone in ``model_update``, or ``adapter.label``), ``dataset``,
    ``seed``.

    Progress: ``num_tasks``, ``tasks_completed`` (rows of the matrix so far), ``complete`` (every task finished;
    a partial record is written after each task and is never a result).

    Results: ``replacement_tasks`` (tasks that start from a replacement model, 0-based); ``compatibility_matrix``
    (``M[t][k]``: queries embedded by model t against the gallery embedded by model k, fractions, None above the
    diagonal; with an adapter along a stream, the adapted matrix); ``metrics`` (:class:`Metrics` of that matrix);
    ``noise`` (:class:`Noise`); ``negative_flips`` (:class:`NegativeFlips` of that matrix's per-query hits, one per
    consecutive pair of tasks; None where the hits were not kept, absent in records before it); ``unadapted_matrix`` /
    ``unadapted_metrics`` (the plain matrix and its metrics, with an adapter only); ``protocol`` (``stream``) and
    ``retrieval`` (:class:`Retrieval`: the adapter study of a ``model_update`` run along a stream); ``two_model``
    (:class:`TwoModel`: the BCT line's protocol of an ``upgrade`` run).

    Provenance: ``evaluation``, ``stream``, ``replacement_models`` (:class:`ReplacementModel`, task order),
    ``adapter`` (None without one), ``config`` (the resolved settings, as ``config.yaml``), ``versions`` (package
    versions, None where not installed), ``device`` (rank 0's under torchrun), ``world_size`` (the processes that
    trained and evaluated the run: 1, or N under ``torchrun --nproc_per_node N``; absent in older records, made by
    one), ``timings``; ``non_finite_values``: the dotted path of each
    value written as null because it was NaN or infinite, with what it was (absent when there is none).
    Records of the former ``model_update`` writer also carry ``models`` (the old and new checkpoints).

    The fields marked ``Read`` are what the readers rely on: :func:`record_problem` derives its check from them."""
    compatibility_matrix: list[list[float | None]]
    metrics: Annotated[Metrics, Read("an object with AC, AA and ACA", _object, required=True)]
    evaluation: Evaluation
    stream: NotRequired[Stream]
    replacement_models: Annotated[list[ReplacementModel], Read("a list of objects", _objects)]
    world_size: NotRequired[int]
    noise: NotRequired[Annotated[Noise, Read("an object (benchmarks/noise.py)", lambda v: not v or _object(v))]]
    negative_flips: NotRequired[Annotated[NegativeFlips | None, Read(f"null or {FLIPS}", _optional(_object))]]
    unadapted_matrix: NotRequired[list[list[float | None]]]
    unadapted_metrics: NotRequired[Metrics]
    protocol: NotRequired[Literal["stream"]]
    retrieval: NotRequired[Annotated[Retrieval, Read("an object with 'cases' and 'backfilling' (an adapter study)",
                                                     _object)]]
    models: NotRequired[dict[str, dict[str, Any]]]
    two_model: NotRequired[Annotated[TwoModel, Read("an object with 'cases' (the upgrade scenario's protocol)",
                                                    _object)]]


class LeaveOneOutRecord(RecordIdentity):
    """The ``metrics.json`` of one adapter and seed under the adapter papers' leave-one-out protocol (``runner.py
    adapt``, ``model_update`` on encoder specs; docs/METHODS.md §7b): ``protocol`` ``leave_one_out``, the
    ``retrieval`` measurements, the ``models`` (encoder specs or embedding files), and the 2x2 top-1
    ``compatibility_matrix`` ``[[old/old], [cross, new/new]]`` with its ``metrics`` where the cross case exists."""
    protocol: Literal["leave_one_out"]
    retrieval: Annotated[Retrieval, Read("an object with 'cases' and 'backfilling' (a leave-one-out record)", _object,
                                         required=True)]
    models: dict[str, Any]
    compatibility_matrix: NotRequired[list[list[float | None]]]
    metrics: NotRequired[Annotated[Metrics, Read("an object with AC, AA and ACA", _object)]]


def run_record(*, identity: dict[str, Any], num_tasks: int, tasks_completed: int, complete: bool,
               replacement_tasks: list[int], matrix: list[list[float | None]] | None, tie_rule: str,
               evaluation: Evaluation, stream: Stream, replacement_models: list[ReplacementModel],
               adapter: Adapter | None, config: dict[str, Any], device: Device, world_size: int, timings: Timings,
               noise: Noise | None = None, negative_flips: NegativeFlips | None = None,
               unadapted_matrix: list[list[float | None]] | None = None,
               extra: dict[str, Any] | None = None) -> RunRecord:
    """A stream run's record (:class:`RunRecord`), its metrics computed from ``matrix`` under ``tie_rule`` and the
    package versions added; ``identity`` holds ``scenario``, ``strategy``, ``method``, ``dataset`` and ``seed``;
    ``negative_flips`` those of ``matrix``'s per-query hits (None without them);
    ``extra`` adds a scenario's own fields (``model_update``'s ``cases`` and ``backfilling``). The one place
    where this layout is built: the run loop (:class:`cl2r_bench.run.Run`) passes the values."""
    record = {**identity, "num_tasks": num_tasks, "tasks_completed": tasks_completed, "complete": complete,
              "replacement_tasks": replacement_tasks, "compatibility_matrix": matrix,
              "metrics": all_metrics(as_matrix(matrix), tie_rule) if matrix else None,
              "evaluation": evaluation, "stream": stream, "replacement_models": replacement_models,
              "adapter": adapter, "config": config, "versions": package_versions(), "device": device,
              "world_size": world_size, "timings": timings, "negative_flips": negative_flips, **(extra or {})}
    if noise is not None:
        record["noise"] = noise
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
    cross entry exists. The one place where this layout is built (:func:`cl2r_bench.adapt.study_record` passes the
    values)."""
    record = {**identity, "protocol": "leave_one_out", "num_tasks": 2, "tasks_completed": 2, "complete": True,
              "replacement_tasks": [], "retrieval": retrieval, "models": models, "adapter": adapter,
              "config": config, "versions": package_versions(), "device": device, "timings": timings}
    if matrix is not None:
        record["compatibility_matrix"] = matrix
        record["metrics"] = all_metrics(as_matrix(matrix), "strict")
    return record


class RecordError(ValueError):
    """A ``metrics.json`` that cannot be read as a complete run: ``path`` names the file, ``problem`` says why in
    one line (the message is both)."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path, self.problem = path, problem


def read_record(path: str | Path) -> RunRecord:
    """The complete run record in ``path``, checked by :func:`record_problem`.

    Raises :class:`RecordError` naming the file and the one-line problem: unreadable, not UTF-8, not JSON, JSON
    nested too deeply, or a record that :func:`record_problem` rejects (an incomplete run included)."""
    path = Path(path)
    record, problem = _parse(path)
    problem = problem or record_problem(record)
    if problem:
        raise RecordError(path, problem)
    return record


def write_record(folder: str | Path, record: dict[str, Any]) -> None:
    """Write ``record`` as the run folder's :data:`RECORD_FILE` (strict JSON, atomically): the one writer of run
    records. A complete record must pass :func:`record_problem` as its readers will read it, so that a writer and
    the leaderboard can never disagree on the layout; one that does not is a bug in the suite, a
    :class:`RecordError` before anything is written."""
    path = Path(folder) / RECORD_FILE
    if record.get("complete"):
        problem = record_problem(json.loads(json.dumps(strict_json(record))))
        if problem:
            raise RecordError(path, f"the suite wrote a record its readers reject ({problem}); please report it")
    atomic_write_json(path, record)


def holds_complete_record(folder: str | Path) -> bool:
    """Whether ``folder`` holds a ``metrics.json`` that :func:`read_record` accepts: the one test of "this run is
    finished" for the sweep and the study tools, the same as the leaderboard's."""
    try:
        read_record(Path(folder) / RECORD_FILE)
    except RecordError:
        return False
    return True


def checked_records(results_dir: str | Path) -> Iterator[tuple[Path, RunRecord | None, str | None]]:
    """``(path, record, None)`` for every :data:`RECORD_FILE` under ``results_dir`` that :func:`read_record`
    accepts and ``(path, None, why not)`` for the others, in path order: the one walk over a results folder
    (``reporting.leaderboard.collect``, ``reporting.plots.plot_results``)."""
    for path in sorted(Path(results_dir).rglob(RECORD_FILE)):
        try:
            yield path, read_record(path), None
        except RecordError as exc:
            yield path, None, exc.problem


MAX_RECORD_BYTES = 64 << 20
"""A metrics.json is a few hundred kB (the per-entry noise intervals of a 31-task run); larger is not a record."""


def _parse(path: Path) -> tuple[Any, str | None]:
    """``(parsed JSON, None)``, or ``(None, why the file cannot be read)`` in one line. Only regular files of at
    most :data:`MAX_RECORD_BYTES` are read, so a FIFO or a link to a device never hangs a reader."""
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            return None, "not a regular file (a FIFO, device or link to one); a metrics.json is a file"
        if info.st_size > MAX_RECORD_BYTES:
            return None, f"{info.st_size} bytes, more than a record holds ({MAX_RECORD_BYTES >> 20} MB)"
        return json.loads(path.read_text(encoding="utf-8")), None
    except OSError as exc:
        return None, f"unreadable ({exc.strerror or exc})"
    except UnicodeDecodeError as exc:
        return None, (f"not UTF-8 text (byte {exc.object[exc.start]:#04x} at position {exc.start}); a metrics.json "
                      "is UTF-8 JSON")
    except RecursionError:
        return None, "JSON nesting too deep; a metrics.json is an object a few levels deep"
    except ValueError as exc:
        return None, f"not valid JSON ({exc})"


def schema_problem(value: Any, schema: Any, within: str = "") -> str | None:
    """Why ``value`` breaks the fields of the ``TypedDict`` ``schema`` that are marked :class:`Read` (``within``
    prefixes their names in the message), or None: each such field in declaration order, then, for a field that
    passes and is itself a ``TypedDict`` or a list of them, its own marked fields."""
    for key, hint in get_type_hints(schema, include_extras=True).items():
        read = _read_mark(hint)
        if read is None:
            continue
        required = read.required or (read.required_with is not None and read.required_with in value)
        if key not in value:
            if required:
                return f"'{within}{key}' is missing; it must be {read.expected}"
            continue
        if not read.check(value[key]):
            return f"'{within}{key}' is {reprlib.repr(value[key])}; it must be {read.expected}"
        problem = _nested_problem(value[key], hint, f"{within}{key}")
        if problem:
            return problem
    return None


def _read_mark(hint: Any) -> Read | None:
    """The :class:`Read` of a field's type hint (through ``NotRequired``), or None."""
    while get_origin(hint) is NotRequired:
        hint = get_args(hint)[0]
    return next((m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Read)), None)


def _nested_problem(value: Any, hint: Any, name: str) -> str | None:
    """The problem of a field's own fields: a ``TypedDict`` value, or each item of a list of them."""
    while get_origin(hint) in (NotRequired, Annotated):
        hint = get_args(hint)[0]
    inner = [a for a in get_args(hint) if a is not type(None)] if get_args(hint) else [hint]
    if len(inner) == 1 and is_typeddict(inner[0]) and isinstance(value, dict):
        return schema_problem(value, inner[0], f"{name}.")
    if get_origin(hint) is list and is_typeddict(get_args(hint)[0]) and isinstance(value, list):
        return _first(schema_problem(item, get_args(hint)[0], f"{name}[{i}].") for i, item in enumerate(value))
    return None


def _first(problems: Iterable[str | None]) -> str | None:
    return next((p for p in problems if p), None)


def record_problem(record: Any) -> str | None:
    """Why a parsed ``metrics.json`` cannot be a leaderboard row, or None when it can.

    The fields the readers rely on are checked as the schema marks them (:class:`Read`, :func:`schema_problem`:
    :class:`RunRecord`, or :class:`LeaveOneOutRecord` for the leave-one-out protocol), then the rules between
    fields: an incomplete run is reported as such, a complete one has all its tasks, the matrix is read as
    :func:`benchmarks.metrics.as_matrix` reads it, the config can be grouped by, and a ``model_update`` stream
    record has its cases, backfilling and adapter fit. So a hand-made or damaged file is named and left out
    instead of crashing a table or being averaged.
    """
    if not isinstance(record, dict):
        return f"holds {reprlib.repr(record)}, not a JSON object; a metrics.json is one object"
    if "complete" not in record or not isinstance(record["complete"], bool):
        return (f"'complete' is {reprlib.repr(record['complete'])}; it must be true or false" if "complete" in record
                else "'complete' is missing; it must be true or false")
    return (_incomplete(record)
            or schema_problem(record, LeaveOneOutRecord if leave_one_out(record) else RunRecord)
            or _tasks_problem(record)
            or _matrix_problem(record)
            or _flips_problem(record)
            or _config_problem(record)
            or (_update_problem(record) if record["scenario"] == "model_update" and not leave_one_out(record)
                else None))


def adapter_study(record: dict[str, Any]) -> bool:
    """Whether a record holds an adapter study (``retrieval``): leave-one-out, or a ``model_update`` run along a
    stream."""
    return "retrieval" in record


def leave_one_out(record: dict[str, Any]) -> bool:
    """Whether a record measures the adapter papers' leave-one-out protocol (``runner.py adapt``, ``model_update``
    with encoder specs; docs/METHODS.md §7b) rather than a compatibility matrix along a stream."""
    return record.get("protocol") == "leave_one_out"


def _incomplete(record: dict[str, Any]) -> str | None:
    if record["complete"]:
        return None
    done, total = (record.get(k) if _count(record.get(k)) else "?" for k in ("tasks_completed", "num_tasks"))
    return f"incomplete run ({done} of {total} tasks)"


def _tasks_problem(record: dict[str, Any]) -> str | None:
    done, total = record.get("tasks_completed"), record.get("num_tasks")
    if done is None or total is None or done == total:
        return None
    return f"'complete' is true but tasks_completed is {done} of num_tasks {total}; rerun it or fix the record"


def _matrix_problem(record: dict[str, Any]) -> str | None:
    if "compatibility_matrix" not in record:
        return None
    try:
        size = len(as_matrix(record["compatibility_matrix"]))
    except MatrixError as exc:
        return f"compatibility_matrix: {exc}"
    tasks = record.get("num_tasks")
    if tasks is not None and size != tasks:
        return f"compatibility_matrix has {size} rows but num_tasks is {tasks}; a complete run has one row per task"
    return None


def _flips_problem(record: dict[str, Any]) -> str | None:
    """Negative flips whose lists do not hold one rate per consecutive pair: of the compatibility matrix's tasks at
    the top level, of the two models in ``retrieval`` and ``two_model``."""
    retrieval, two_model = record.get("retrieval"), record.get("two_model")
    found = [("retrieval.negative_flips", retrieval.get("negative_flips") if _object(retrieval) else None, 1),
             ("two_model.negative_flips", two_model.get("negative_flips") if _object(two_model) else None, 1)]
    if "compatibility_matrix" in record:
        found.insert(0, ("negative_flips", record.get("negative_flips"), len(record["compatibility_matrix"]) - 1))
    for name, flips, pairs in found:
        for kind in ("self", "cross") if flips else ():
            if len(flips[kind]) != pairs:
                return (f"'{name}.{kind}' has {len(flips[kind])} rates; it must have {pairs}, one per consecutive "
                        "pair of models")
    return None


def _config_problem(record: dict[str, Any]) -> str | None:
    """A config whose adapter is not an object, or that is nested too deeply for the leaderboard to group runs by
    it (``reporting.leaderboard.experiment_settings`` flattens it and serialises its values)."""
    config = record.get("config") or {}
    adapter = config.get("adapter")
    if adapter and not isinstance(adapter, dict):
        return f"'config.adapter' is {reprlib.repr(adapter)}; it must be an object with a 'name'"
    try:
        json.dumps(config, sort_keys=True, default=str)
    except RecursionError:
        return "'config' is nested too deeply; it must be the resolved settings of configs/default.yaml"
    return None


def _update_problem(record: dict[str, Any]) -> str | None:
    """A ``model_update`` stream record: its adapter study (``retrieval``; a record of the former layout, with
    top-level ``cases`` as fractions, is refused), and its adapter's fit log (``fits``, or ``fit`` in older
    records) with a numeric ``f_W`` where there is one."""
    if "retrieval" not in record:
        return ("a model_update record of the former layout (top-level 'cases', top-1 only); run it again with this "
                "version, which reads its cached models, to get the cases' top-1 / top-5 / mAP" if "cases" in record
                else "'retrieval' is missing; it must be an object with 'cases' and 'backfilling' (an adapter study)")
    if not record.get("adapter"):
        return None
    adapter = record["adapter"]
    if not (_object(adapter) and (_object(adapter.get("fit")) or _fits(adapter.get("fits")))):
        return (f"'adapter' is {reprlib.repr(adapter)}; it must be null or an object with a 'fits' list (or, in "
                "older records, a 'fit' object)")
    fit = update_fit(record)
    if ORTHOGONALITY_GAP in fit and not is_number(fit[ORTHOGONALITY_GAP]):
        within = "adapter.fit." if "fit" in adapter else f"adapter.fits[{len(adapter['fits']) - 1}]."
        return f"'{within}{ORTHOGONALITY_GAP}' is {reprlib.repr(fit[ORTHOGONALITY_GAP])}; it must be a number"
    return None


def _fits(value: Any) -> bool:
    return isinstance(value, list) and len(value) > 0 and all(map(_object, value))


def update_fit(record: RunRecord) -> dict[str, Any]:
    """The fit log of a ``model_update`` run's adapter (its one fit; ``adapter.fit`` in older records), or ``{}``
    without adapter."""
    adapter = record.get("adapter") or {}
    return adapter.get("fit") or (adapter.get("fits") or [{}])[-1]
