"""Which records make one experiment (docs/METHODS.md §5): every complete, well-formed ``metrics.json`` under a
results folder (:func:`collect`), grouped by scenario, data set, strategy or adapter and every setting that changes
the protocol (:func:`experiment_settings`: the resolved config minus seed, paths and display settings); runs that
differ only by seed are one group, others separate groups whose labels carry the settings that tell them apart
(:func:`experiment_groups`). Incomplete runs and malformed records are listed apart with their reason
(:func:`benchmarks.record.record_problem`), so a partial or damaged result is never mistaken for a finished one."""
from __future__ import annotations

import functools
import itertools
import json
import re
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.record import RunRecord, checked_records
from cl2r_bench.config import CONFIG_DIR, SPEED_OPTIONS, flatten, read_yaml

NOT_EXPERIMENT = {"seed", "output", "device", "data_root", "download", "plugins", "training.progress",
                  *SPEED_OPTIONS, "distributed.connect_timeout", "distributed.timeout", "evaluation.plots",
                  "replacement.pretrain.cache_dir", "model_update.feature_cache", "model_update.encoder_batch_size",
                  "model_update.stream_rows"}
"""Settings that change where or how a run computes, not its figures: ``model_update.stream_rows`` reads the same
features in memory or in chunks, to the same cases and curves (``tests/adapter_study/test_adapt_scale.py``)."""


def collect(results_dir: str | Path) -> tuple[list[RunRecord], list[tuple[Path, str]]]:
    """``(complete records, [(path, reason), ...])`` over every ``metrics.json`` under ``results_dir``.

    Unreadable files, incomplete runs and records :func:`record_problem` rejects are left out with a one-line
    reason (:func:`benchmarks.record.checked_records`), so that a partial or malformed result is neither averaged
    into a row nor crashes a table.
    """
    found, skipped = collect_with_paths(results_dir)
    return [record for _, record in found], skipped


def collect_with_paths(results_dir: str | Path) -> tuple[list[tuple[Path, RunRecord]], list[tuple[Path, str]]]:
    """:func:`collect`, each complete record with the path of its ``metrics.json``; a copy of a record already
    found is skipped and counted once."""
    complete, skipped = [], []
    seen: dict[str, Path] = {}
    for path, record, problem in checked_records(results_dir):
        identity = None if problem else json.dumps(record, sort_keys=True, default=str)
        if problem:
            skipped.append((path, problem))
        elif identity in seen:
            skipped.append((path, f"a copy of {seen[identity]} (the same record), counted once"))
        else:
            seen[identity] = path
            complete.append((path, record))
    return complete, skipped


def experiment_settings(record: RunRecord) -> dict[str, Any]:
    """What makes a run's experiment: its resolved config, flattened, without the seed, where results and data
    are kept and how they are shown, and without the parameters of strategies and adapters it does not use; and
    the number of processes that trained it (``world_size``: their batch norms see a share of each batch)."""
    config = record.get("config") or {}
    adapter = (config.get("adapter") or {}).get("name")
    used = {f"strategy_params.{config.get('strategy')}.", f"adapter_params.{adapter}."}
    return {k: v for k, v in flatten(config).items() if k not in NOT_EXPERIMENT
            and (not k.startswith(("strategy_params.", "adapter_params.")) or k.startswith(tuple(used)))} | {
        "world_size": record.get("world_size", 1)}


ENCODER_KEYS = ("model_update.old", "model_update.new")
"""Settings that hold encoder specs: tags show them by short name (:func:`short_model_name`)."""


def _tag(settings: dict[str, Any], differing: list[str], limit: int | None = 3) -> str:
    """`` [key=value; ...]``: the first ``limit`` of the ``differing`` settings (all of them for None), a setting the
    run predates shown at its default (what it ran with; :func:`_agree`)."""
    def shown_value(key: str, value: Any) -> str:
        if not isinstance(value, str):
            return json.dumps(value)
        return short_model_name(value) if key in ENCODER_KEYS else value

    keys = differing if limit is None else differing[:limit]
    shown = [f"{k}={shown_value(k, settings.get(k, default_settings().get(k)))}" for k in keys]
    return " [" + "; ".join(shown) + ("; ..." if len(keys) < len(differing) else "") + "]"


@functools.cache
def default_settings() -> dict[str, Any]:
    """The suite's default settings (``configs/default.yaml``), flattened."""
    return flatten(read_yaml(CONFIG_DIR / "default.yaml"))


MISSING = object()


def _agree(key: str, one: dict[str, Any], other: dict[str, Any]) -> bool:
    """Whether two runs' settings agree on ``key``; where one of them lacks it (a setting added to the suite after
    that run), the other must hold its default (``configs/default.yaml``), which the older run ran with. A part's
    parameter one record lacks disagrees: its default is the part's own, which the records do not say."""
    values = [one.get(key, MISSING), other.get(key, MISSING)]
    if values == [MISSING, MISSING]:
        return True
    if MISSING in values:
        values = [next(v for v in values if v is not MISSING), default_settings().get(key, MISSING)]
    return json.dumps(values[0], sort_keys=True, default=str) == json.dumps(values[1], sort_keys=True, default=str)


def _same_experiment(one: dict[str, Any], other: dict[str, Any]) -> bool:
    """Whether two runs' settings (:func:`experiment_settings`) agree on every key (:func:`_agree`)."""
    return all(_agree(key, one, other) for key in one.keys() | other.keys())


Grouped = list[tuple[dict[str, Any], list[RunRecord]]]
"""Groups of runs that agree on every setting (:func:`_same_experiment`), each with the settings they hold."""


def _by_settings(records: list[RunRecord], key: Callable[[RunRecord], Any],
                 settings_of: Callable[[RunRecord], dict[str, Any]]) -> dict[Any, Grouped]:
    """The records by ``key``, and under each key into groups whose ``settings_of`` agree: a run that predates a
    setting joins the runs at its default (:func:`_agree`)."""
    found: dict[Any, Grouped] = defaultdict(list)
    for record in records:
        settings, groups = settings_of(record), found[key(record)]
        match = next((group for group in groups if _same_experiment(group[0], settings)), None)
        if match is None:
            groups.append((settings, [record]))
        else:
            match[0].update(settings)
            match[1].append(record)
    return found


def _differing(groups: Grouped) -> list[str]:
    """The settings on which some two of ``groups`` disagree, those most groups hold first."""
    keys = sorted(set().union(*(settings for settings, _ in groups)))
    return sorted((k for k in keys if not all(_agree(k, one, other) for (one, _), (other, _) in
                                              itertools.combinations(groups, 2))),
                  key=lambda k: (-sum(k in settings for settings, _ in groups), k))


def experiment_groups(records: list[RunRecord]) -> dict[tuple[str, str, str], list[RunRecord]]:
    """Runs grouped by experiment (:func:`experiment_settings`): runs that differ only by seed, or by a setting one
    of them predates (:func:`_same_experiment`), are one group; when one name covers several experiments, each
    label gets a tag of the settings that tell them apart."""
    experiments = _by_settings(records, lambda r: (r["scenario"], r["dataset"], r.get("method", r["strategy"])),
                               experiment_settings)
    groups: dict[tuple[str, str, str], list[RunRecord]] = {}
    for (scenario, dataset, name), found in experiments.items():
        differing = _differing(found)
        labels = [name + (_tag(settings, differing) if len(found) > 1 else "") for settings, _ in found]
        for i, (settings, runs) in enumerate(found):
            if labels.count(labels[i]) > 1:
                labels[i] = name + _tag(settings, differing, limit=None)
            label = labels[i] if labels.count(labels[i]) == 1 else f"{labels[i]} #{i + 1}"
            groups[(scenario, dataset, label)] = runs
    return dict(sorted(groups.items()))


RESULT_FIELDS = ("compatibility_matrix", "unadapted_matrix", "two_model", "retrieval", "query_hits", "negative_flips")
"""What a run measured: two experiments whose records hold the same values here, seed for seed, are one result."""


def result_groups(records: list[RunRecord]) -> dict[tuple[str, str, str], list[RunRecord]]:
    """:func:`experiment_groups`, with the experiments of one scenario and data set whose records measured the same,
    seed for seed (:data:`RESULT_FIELDS`), as one, labelled with their names joined by `` = ``: two strategies that
    the protocol makes one (``bct`` and ``bct_er`` in ``upgrade``, whose new model has no replay memory), so a
    leaderboard shows one row for one result."""
    def measured(runs: list[RunRecord]) -> str:
        return json.dumps(sorted((r["seed"], [r.get(field) for field in RESULT_FIELDS]) for r in runs),
                          sort_keys=True, default=str)

    merged: dict[tuple[str, str, str], list[RunRecord]] = {}
    seen: dict[tuple[str, str, str], tuple[str, str, str]] = {}
    for (scenario, dataset, label), runs in experiment_groups(records).items():
        fingerprint = (scenario, dataset, measured(runs))
        if fingerprint in seen:
            first = seen[fingerprint]
            merged[(*first[:2], f"{first[2]} = {label}")] = merged.pop(first)
            seen[fingerprint] = (*first[:2], f"{first[2]} = {label}")
        else:
            merged[(scenario, dataset, label)] = runs
            seen[fingerprint] = (scenario, dataset, label)
    return merged


ADAPTER_KEYS = ("adapter.", "adapter_params.")
"""The settings of the adapter a study record measures: the one thing its study's records may differ by."""


def study_groups(records: list[RunRecord]) -> dict[str, list[RunRecord]]:
    """Adapter-study records grouped by study: one pair of models (:func:`models_label`) and every setting but the
    adapter's and the seed (:func:`experiment_settings`), so that one answer never pools two protocols (a study
    fitted on 1,000 items with one fitted on 2,000). A label is the models', tagged with the settings that tell the
    studies of one pair apart."""
    found = _by_settings(records, models_label, lambda r: {k: v for k, v in experiment_settings(r).items()
                                                          if not k.startswith(ADAPTER_KEYS)})
    return {label + (_tag(settings, _differing(studies), limit=None) if len(studies) > 1 else ""): runs
            for label, studies in found.items() for settings, runs in studies}


def models_label(record: RunRecord) -> str:
    """``old → new`` encoders of a leave-one-out record by short name (:func:`short_model_name`; the full specs are
    in the record's ``models`` and in the report's settings), ``embeddings`` for the user's own, or ``trained on
    the stream`` for a ``model_update`` run along a stream (its models are in ``replacement_models``); with ``, open
    set`` where classes were held out of fitting (``model_update.unseen_classes``), so that a study scored on unseen
    classes is never summarised with one of the same models scored on fitted classes, and ``, unpaired`` where the
    adapters were fitted on different items under each model (``model_update.pairing``)."""
    if record.get("protocol") == "stream":
        return STREAM_MODELS
    old, new = model_specs(record)
    label = "embeddings" if old is None else f"{short_model_name(old)} → {short_model_name(new)}"
    unpaired = ((record.get("config") or {}).get("model_update") or {}).get("pairing") == "unpaired"
    return (label + (", open set" if (record.get("models") or {}).get("unseen_classes_drawn") else "")
            + (", unpaired" if unpaired else ""))


STREAM_MODELS = "trained on the stream"


def model_specs(record: RunRecord) -> tuple[str | None, str | None]:
    """The old and new encoder specs of a leave-one-out record, or ``(None, None)`` for the user's embeddings."""
    models = record.get("models") or {}
    if isinstance(models.get("old"), dict) and isinstance(models.get("new"), dict):
        return str(models["old"].get("spec")), str(models["new"].get("spec"))
    return None, None


SHORT_NAMES = ((re.compile(r"(?:efficientnet_)?lite(\d)$"), "Lite{}"), (re.compile(r"resnet(\d+)"), "ResNet-{}"),
               (re.compile(r"efficientnet_(b\d)"), "EfficientNet-{}"))


WEIGHT_FILES = (".pt", ".pth", ".bin", ".safetensors", ".ckpt")


def short_model_name(spec: str) -> str:
    """A person's name for an encoder spec: the family and size of a known architecture ("Lite0", "ResNet-18"), else
    the model's name without its source, weights file and folders."""
    name = spec.split(":", 1)[-1].split("@", 1)[0]
    for pattern, short in SHORT_NAMES:
        found = pattern.search(Path(name).name)
        if found:
            return short.format(found.group(1).upper() if short.startswith("EfficientNet") else found.group(1))
    base = Path(name).name
    return (base.rsplit(".", 1)[0] if Path(base).suffix in WEIGHT_FILES else base) or spec
