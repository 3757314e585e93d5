"""``runner.py adapt --resume``: the records an earlier study finished with the same settings, kept as measured."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.record import RecordError, read_record
from cl2r_bench.config import (
    config_text,
    differing,
    flatten,
    load_yaml,
    read_yaml,
)
from cl2r_bench.errors import UsageError

from .settings import Key


def finished_record(folder: Path, config: dict[str, Any]) -> dict[str, Any] | None:
    """The record an earlier ``runner.py adapt`` finished in ``folder`` (``metrics.json``, written last) with the
    same ``config`` (its ``config.yaml``), for ``--resume`` to keep; None where it finished none. Only a record the
    record schema accepts (:func:`benchmarks.record.read_record`) is finished; any other is a :class:`UsageError`
    naming the file and its problem, as is a record measured with other settings (naming the first that differs:
    keeping it would mix two studies in one summary)."""
    if not (folder / "metrics.json").exists():
        return None
    try:
        record = read_record(folder / "metrics.json")
    except RecordError as exc:
        raise UsageError(f"--resume: {exc.path} is not a finished record ({exc.problem[:160]}); delete {folder} to "
                         "measure it again") from None
    try:
        earlier = flatten(read_yaml(folder / "config.yaml"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"--resume: the config beside the record in {folder} cannot be read "
                         f"({str(exc).splitlines()[0][:120]}); delete that folder to measure it again") from None
    now = flatten(load_yaml(config_text(config)))
    changed = differing(earlier, now)
    if changed:
        key = changed[0]
        raise UsageError(f"--resume: {folder} was measured with {key} = {earlier.get(key)!r} where this run has "
                         f"{now.get(key)!r}; pass another --output, or drop --resume to measure it again")
    return record


def finished_records(folders: dict[Key, Path], configs: dict[Key, dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    """:func:`finished_record` of each adapter and seed (``key``) whose folder holds one."""
    found = {key: finished_record(folders[key], configs[key]) for key in configs}
    return {key: record for key, record in found.items() if record is not None}


def result_of_record(record: dict[str, Any]) -> dict[str, Any]:
    """What :func:`result_json` and the study's case line read of one adapter and seed, from its record
    (:func:`study_record`): a resumed study reports the records it keeps as it reports those it measures."""
    retrieval = record["retrieval"]
    fit = record["adapter"]["fits"][0] if record["adapter"] else {}
    return {"adapter": record["method"], "seed": record["seed"], "fit": {k: v for k, v in fit.items() if k != "task"},
            "cases": retrieval["cases"], "backfilling": retrieval["backfilling"], "zero_shot": retrieval["zero_shot"]}
