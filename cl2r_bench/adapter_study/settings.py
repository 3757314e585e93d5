"""The settings of ``runner.py adapt`` and the config of each of its records."""
from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

from benchmarks.backfill_orders import check_backfill_orders
from cl2r_bench.adapters import make_adapter
from cl2r_bench.config import (
    CONFIG_DIR,
    merge,
    parse_assignment,
    read_yaml,
)
from cl2r_bench.settings import DistributedSettings, StudySettings

ADAPT_KEYS = tuple(f.name for f in fields(StudySettings))
"""The ``model_update`` settings ``runner.py adapt`` reads: the study's own
(:class:`~cl2r_bench.settings.StudySettings`)."""


def adapt_settings(assignments: list[str]) -> dict[str, Any]:
    """The settings of ``runner.py adapt``: ``adapter_params``, the :data:`ADAPT_KEYS` of ``model_update`` and
    ``distributed`` (under torchrun) from ``configs/default.yaml``, overridden by ``--set`` assignments, checked as a
    run's are (the study's by :class:`~cl2r_bench.settings.StudySettings`, the orders by their registry, each
    adapter's parameters by its own ``Config``), the typed ``study``, and the default ``seed`` and ``output``
    (written once, there)."""
    defaults = read_yaml(CONFIG_DIR / "default.yaml")
    merged = {"adapter_params": defaults["adapter_params"], "distributed": defaults["distributed"],
              "model_update": {k: defaults["model_update"][k] for k in ADAPT_KEYS}}
    for assignment in assignments:
        merged = merge(merged, parse_assignment(assignment), f"--set {assignment}")
    study = StudySettings(**merged["model_update"])
    check_backfill_orders(merged["model_update"]["backfill_orders"])
    for name in merged["adapter_params"]:
        make_adapter(name, merged["adapter_params"])
    return {"adapter_params": merged["adapter_params"], **merged["model_update"], "study": study,
            "seed": defaults["seed"], "output": defaults["output"],
            "distributed": DistributedSettings(**merged["distributed"])}


Key = tuple[str, int]
"""An adapter's name and a seed: one record of ``runner.py adapt``."""


def adapt_config(train: str | Path | tuple[str | Path, str | Path], test: str | Path, name: str, seed: int,
                 settings: dict[str, Any]) -> dict[str, Any]:
    """The ``config.yaml`` of one adapter and seed of ``runner.py adapt`` (``settings``: :func:`adapt_settings`'s,
    with each adapter's parameters as it uses them): the embeddings (``train``: a file or folder, or the old and
    the new model's files of different items), the adapter, its parameters, the seed and the :data:`ADAPT_KEYS`;
    what ``--resume`` compares with an earlier run's (:func:`finished_record`)."""
    fitting = ({"train_old": str(Path(train[0]).resolve()), "train_new": str(Path(train[1]).resolve())}
               if isinstance(train, tuple) else {"train": str(Path(train).resolve())})
    return {"command": "adapt", **fitting, "test": str(Path(test).resolve()),
            "adapter": {"name": name}, "seed": seed,
            "adapter_params": {name: settings["adapter_params"].get(name, {})} if name != "none" else {},
            "model_update": {key: settings[key] for key in ADAPT_KEYS},
            **({"plugins": settings["plugins"]} if settings.get("plugins") else {})}
