"""The settings of ``runner.py adapt`` and the config of each of its records."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from benchmarks.backfill_orders import check_backfill_orders
from cl2r_bench.adapters import make_adapter
from cl2r_bench.config import (
    CONFIG_DIR,
    merge,
    parse_assignment,
    read_yaml,
)
from cl2r_bench.errors import ConfigError
from cl2r_bench.settings import (
    AUTO,
    PAIRINGS,
    UNMATCHED_CONVENTIONS,
    DistributedSettings,
    at_least,
    check_choices,
    check_rules,
)

ADAPT_KEYS = ("backfill_orders", "backfill_steps", "unmatched_queries", "per_class_cmc", "queries", "stream_rows",
              "screen", "unseen_classes", "pairing")


def adapt_settings(assignments: list[str]) -> dict[str, Any]:
    """The settings of ``runner.py adapt``: ``adapter_params``, the :data:`ADAPT_KEYS` of ``model_update`` and
    ``distributed`` (under torchrun) from ``configs/default.yaml``, overridden by ``--set`` assignments, checked like
    a run's (each adapter's parameters by its own ``Config``), and the default ``seed`` and ``output`` (written once,
    there)."""
    defaults = read_yaml(CONFIG_DIR / "default.yaml")
    merged = {"adapter_params": defaults["adapter_params"], "distributed": defaults["distributed"],
              "model_update": {k: defaults["model_update"][k] for k in ADAPT_KEYS}}
    for assignment in assignments:
        merged = merge(merged, parse_assignment(assignment), f"--set {assignment}")
    check_backfill_orders(merged["model_update"]["backfill_orders"])
    update = SimpleNamespace(**merged["model_update"])
    check_rules("model_update", update, at_least(1, "backfill_steps", "queries"))
    if update.stream_rows != AUTO:
        check_rules("model_update", update, at_least(1, "stream_rows"))
    check_choices("model_update", update, {"unmatched_queries": UNMATCHED_CONVENTIONS, "pairing": PAIRINGS})
    if not 0 <= update.unseen_classes < 1:
        raise ConfigError(f"model_update.unseen_classes = {update.unseen_classes!r} must be a share in [0, 1) (e.g. "
                          "0.5: half the classes are held out of fitting and scored)")
    if update.unseen_classes and update.stream_rows not in (None, AUTO):
        raise ConfigError("model_update.unseen_classes selects items in memory; leave model_update.stream_rows null "
                          "with it, or split the classes into the two files yourself")
    if update.screen and update.stream_rows in (None, AUTO):
        raise ConfigError("model_update.screen screens a streamed gallery: add --set model_update.stream_rows=65536 "
                          "(with a folder of .npy files), or leave screen false")
    for name in merged["adapter_params"]:
        make_adapter(name, merged["adapter_params"])
    return {"adapter_params": merged["adapter_params"], **merged["model_update"], "seed": defaults["seed"],
            "output": defaults["output"], "distributed": DistributedSettings(**merged["distributed"])}


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
