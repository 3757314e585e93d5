"""The record's layout (:class:`RunRecord`, :class:`LeaveOneOutRecord` and the ``TypedDict`` s they nest), each field
with its unit and, where readers rely on it, its :class:`~benchmarks.record.marks.Read` mark."""
import dataclasses
import math
import sys
from typing import Annotated, Any, Literal, TypedDict

if sys.version_info >= (3, 11):
    from typing import NotRequired
else:
    from typing_extensions import NotRequired

from .marks import (
    CASE_FLIPS,
    CMC_CURVES,
    CONVENTION,
    COUNT,
    FLIPS,
    FRACTION,
    INTERVAL,
    NAME,
    OPTIONAL_FRACTION,
    PACKED_HITS,
    PAPER_CASES,
    RATES,
    Read,
    _areas,
    _count,
    _counts,
    _integer,
    _interval,
    _object,
    _objects,
    _optional,
    _packed_list,
    _rates,
    _scores,
    _within,
)


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

    ``task``: the task it starts. ``path``: its checkpoint (relative to the run's working directory when inside
    it, :func:`cl2r_bench.files.portable_path`), or an encoder spec. ``source``: ``user`` (a file of
    ``replacement.checkpoints``), ``encoder`` (a spec there, :mod:`cl2r_bench.encoders`), ``pretrained`` (by this
    run) or ``cached`` (by an earlier one). ``classes``: how many classes it was pretrained on (absent for the
    user's files). ``family``: the head family it was pretrained in (``dsimplex`` or ``learnable``; absent for the
    user's files and in records before 2026-11-28); ``encoder``: on the pretrained-backbone track, the frozen
    encoder whose features it reads. ``own_accuracy``: its retrieval accuracy on the evaluation set before any
    fine-tuning (a fraction) and ``own_accuracy_interval`` its Wilson interval; absent where the scenario does not
    score its starting models."""
    task: Annotated[int, Read("a task index", _count, required_with="own_accuracy")]
    path: str
    source: Literal["user", "encoder", "pretrained", "cached"]
    classes: NotRequired[Annotated[int, Read("a number of classes", _optional(_count))]]
    family: NotRequired[Literal["dsimplex", "learnable"]]
    encoder: NotRequired[str]
    own_accuracy: NotRequired[Annotated[float, Read(FRACTION, _within(0, 1))]]
    own_accuracy_interval: NotRequired[Annotated[list[float], Read(INTERVAL, _interval, required_with="own_accuracy")]]


class AdapterFit(TypedDict):
    """One fit of the adapter: ``task`` (the incoming model's), ``items`` (images it was fitted on), ``seconds``
    (embedding both models and fitting), beside the adapter's own fit log (e.g. λ-orthogonal's final ``f_W``; the
    numbers its ``diagnostics`` name are checked to be numbers)."""
    task: int
    items: int
    seconds: float


class Adapter(TypedDict):
    """The adapter between successive models (METHODS.md §7); the record's ``adapter`` is None without one.

    ``name``: the adapter. ``direction``: ``backward`` (new queries mapped into old galleries) or ``forward``
    (kept galleries mapped into the new space), the matrix the record reports. ``at``: ``replacements`` or
    ``every_task``. ``fits``: one per fit, task order. ``diagnostics``: the fit-log keys the adapter declares as
    report columns, with their titles (``Adapter.diagnostics``; records written before it hold none, and
    :data:`~benchmarks.record.check.LEGACY_DIAGNOSTICS` stands for it). Records of the former ``model_update`` writer
    carry instead ``fit`` (the single fit's log) and ``fit_items``."""
    name: str
    direction: NotRequired[Literal["backward", "forward"]]
    at: NotRequired[Literal["replacements", "every_task"]]
    fits: NotRequired[list[AdapterFit]]
    diagnostics: NotRequired[dict[str, str]]
    fit: NotRequired[dict[str, float]]
    fit_items: NotRequired[int]


class TaskTiming(TypedDict):
    """One task's training and cost. ``seconds``: training (0 where the scenario does not train); ``iterations``:
    optimiser steps; ``images``: training images seen, each epoch counted (by all ranks together under torchrun);
    ``final_loss``: the last batch's loss (the global batch's; None without training); ``loss_terms``: each term of
    the strategy's loss (``classification`` and its compatibility terms, weighted as they enter the loss;
    ``loss`` alone for a strategy that names none) and its mean per epoch, so an inert term shows as 0 (absent
    without training, for an Avalanche strategy and in records written before it); ``eval_seconds``: deploying the
    model (embedding and scoring); ``images_per_second``: ``images / seconds``."""
    seconds: Annotated[float, Read("a number of seconds", _within(0, math.inf), required=True)]
    iterations: Annotated[int, Read("a number of iterations", _count, required=True)]
    images: int
    final_loss: float | None
    loss_terms: NotRequired[dict[str, list[float]]]
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
    ``extractions``: :class:`Extractions` (absent in records of the former ``model_update`` writer);
    ``query_sha256`` / ``gallery_sha256``: the digests of the query and gallery items and labels
    (:meth:`cl2r_bench.data.datasets.ImageSet.digest`), which tell whether two runs were scored on the same queries,
    so that ``runner.py compare`` pairs their per-query hits (absent in records before 2026-11-28)."""
    queries: int
    gallery_images: int
    mode: Literal["templates", "images"]
    extractions: NotRequired[Extractions]
    query_sha256: NotRequired[str]
    gallery_sha256: NotRequired[str]


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


BackfillAUC = dict[str, dict[str, float] | None]
"""Each backfilling order's ``top1_auc`` / ``mAP_auc`` in percent (``mAP@R_auc`` where the gallery was screened),
None where the adapter cannot rank the gallery; keyed by the order's name (:mod:`benchmarks.backfill_orders`, any
registered one)."""


class StudyBackfilling(TypedDict):
    """Partial backfilling in an adapter study (:mod:`benchmarks.adapted_cases`): ``betas``, per order
    the ``curves`` of ``top1`` and ``mAP`` (``mAP@R`` where the gallery was screened; percent) at each beta, and their
    areas ``auc``."""
    betas: list[float]
    curves: dict[str, dict[str, list[float]] | None]
    auc: Annotated[BackfillAUC, Read("an object of areas per order", _object, required=True,
                                     each=Read("null or top1_auc / mAP_auc in percent", _optional(_areas)))]


class Retrieval(TypedDict):
    """An adapter study's measurements (:func:`benchmarks.adapted_cases.measure`), leave-one-out or along a stream: the
    ``cases``, the per-query top-1 hits of old/old, the cross case and new/new (``query_top1``, packed by
    :func:`pack_hits`; new/new since 2026-11-27), the
    :class:`NegativeFlips` of the two models (``negative_flips``: one pair, old/old to new/new and to the cross case;
    absent in records before it), every other case's negative flip rate against old/old (``case_flips``, fractions;
    since 2026-11-27), ``backfilling``, ``zero_shot`` retention (None where it does not apply), each case's
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
    case_flips: NotRequired[Annotated[dict[str, float], CASE_FLIPS]]
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
    consecutive pair of tasks; None where the hits were not kept, absent in records before it); ``query_hits``
    (each lower-triangular entry's per-query top-1 hits, row order, packed by :func:`pack_hits`: what
    ``runner.py compare`` resamples; absent where the hits were not kept and in records before 2026-11-28);
    ``unadapted_matrix`` /
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
    query_hits: NotRequired[Annotated[list[str], Read("a list of per-query hits packed as base64 text", _packed_list)]]
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
