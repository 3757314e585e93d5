"""One config schema, one override path (``configs/default.yaml`` is the schema and shows every default).

Layers, later wins: ``default.yaml`` < ``datasets/<dataset>.yaml`` < ``scenarios/<scenario>.yaml`` <
``scenarios/per_dataset/<scenario>-<dataset>.yaml`` (a scenario's defaults adapted to a data set's class count,
where one exists) < ``presets/<preset>.yaml`` < ``--config FILE`` < command-line flags. Every value is checked
against the type of its default; unknown keys are errors that list the valid ones. The resolved config is then
validated as a whole (:func:`validate`: ranges, allowed values, rules between settings, and
``strategy_params.<name>`` / ``adapter_params.<name>`` by the strategy's or adapter's own config dataclass), the
one place where settings are checked, before any data is read.
"""
from __future__ import annotations

import copy
import itertools
import re
from pathlib import Path
from typing import Any

import yaml

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
FREE_FORM = {"strategy_params", "adapter_params"}
EXTRA_TYPES: dict[str, tuple[type, ...]] = {
    "stream.class_order": (str, list),
    "stream.images_per_class": (int, type(None)),
    "evaluation.queries_per_class": (int, type(None)),
    "replacement.pretrain.images_per_class": (int, type(None)),
    "replacement.pretrain.seed": (int, list),
    "model_update.fit_per_class": (int, type(None)),
    "model_update.test_per_class": (int, type(None)),
}


FLOAT_TEXT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")  # 1e-3: a string in YAML 1.1, a float here
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+=,-]{0,99}")


class ConfigError(ValueError):
    """A config file, key or value is invalid; the message says which and how to fix it."""


class PlainLoader(yaml.SafeLoader):
    """YAML without aliases: a config never needs them, and a few hundred bytes of nested aliases expand into
    gigabytes (a "billion laughs" file hangs a run; issue 29)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise ConfigError(f"YAML aliases (*name) are not accepted in settings (line {mark.line + 1}); write the "
                              "values out")
        return super().compose_node(parent, index)


def load_yaml(text: str) -> Any:
    """Parse settings text as YAML without aliases (:class:`PlainLoader`)."""
    return yaml.load(text, Loader=PlainLoader)


def safe_name(name: object, setting: str) -> str:
    """``name`` when it can be one path component (letters, digits and ``_ . + = , -``, not starting with a dot,
    at most 100 characters), else a :class:`ConfigError`: no setting may lead a run to write or delete outside its
    output folder (issue 16)."""
    if not isinstance(name, str) or not SAFE_NAME.fullmatch(name) or ".." in name:
        raise ConfigError(f"{setting} = {name!r} cannot name a results folder; use letters, digits and _ . + = , - "
                          "(no /, no leading dot, no '..', at most 100 characters)")
    return name


def writable_folder(path: str | Path, setting: str) -> Path:
    """``path`` when it is, or can be made, a folder this process writes in: not empty, no existing part of it a
    file, and its nearest existing folder writable; else a one-line :class:`ConfigError` naming ``setting`` (issue
    29), raised before any data is read."""
    import os

    if not str(path).strip():
        raise ConfigError(f"{setting} is empty; give a folder (e.g. results)")
    folder = Path(path)
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise ConfigError(f"{setting} = {path}: {existing} is a file, not a folder; give another folder")
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{setting} = {path}: {existing} is not writable; give a folder you can write in")
    return folder


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping; a missing, unreadable or non-mapping file is a :class:`ConfigError`."""
    try:
        data = load_yaml(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at position "
                          f"{exc.start}); save it as UTF-8") from None
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of keys to values")
    return data


def choices(kind: str) -> list[str]:
    """Names of the YAML profiles of one kind (``datasets``, ``scenarios``, ``presets``)."""
    return sorted(p.stem for p in (CONFIG_DIR / kind).glob("*.yaml"))


def profile_summary(kind: str, name: str) -> str:
    """The first sentence of the leading comment of ``configs/<kind>/<name>.yaml`` (at most 150 characters):
    what the profile is, for ``runner.py list``."""
    lines = (CONFIG_DIR / kind / f"{name}.yaml").read_text().splitlines()
    leading = itertools.takewhile(lambda text: text.startswith("#"), lines)
    comment = " ".join(line.lstrip("# ").strip() for line in leading)
    sentence = comment.split(". ")[0].rstrip(".") + "."
    return sentence if len(sentence) <= 150 else sentence[:149] + "…"


def _type_ok(value: Any, default: Any, dotted: str) -> bool:
    if dotted in EXTRA_TYPES:
        return isinstance(value, EXTRA_TYPES[dotted]) and not isinstance(value, bool)
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    return isinstance(value, type(default))


def merge(base: dict[str, Any], override: dict[str, Any], source: str, prefix: str = "") -> dict[str, Any]:
    """``base`` updated by ``override``, checking every key and value type against ``base``."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        dotted = f"{prefix}{key}"
        if key not in base:
            raise ConfigError(f"{source}: unknown key {dotted!r}; valid keys here: {sorted(base)}")
        default = base[key]
        if isinstance(default, dict) and dotted not in FREE_FORM:
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: {dotted} must be a mapping with keys {sorted(default)}")
            out[key] = merge(default, value, source, f"{dotted}.")
        elif dotted in FREE_FORM:
            if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
                raise ConfigError(f"{source}: {dotted} must map names to mappings of parameters")
            out[key] = {**default, **{k: {**default.get(k, {}), **v} for k, v in value.items()}}
        elif isinstance(default, float) and isinstance(value, str) and FLOAT_TEXT.fullmatch(value.strip()):
            out[key] = float(value)
        elif not _type_ok(value, default, dotted):
            raise ConfigError(f"{source}: {dotted} = {value!r} has type {type(value).__name__}; expected "
                              f"{type(default).__name__} like the default {default!r}")
        else:
            out[key] = float(value) if isinstance(default, float) else value
    return out


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"training": {"epochs": 5}}`` -> ``{"training.epochs": 5}``: one entry per setting."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        out.update(flatten(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def parse_assignment(text: str) -> dict[str, Any]:
    """``"training.epochs=5"`` -> ``{"training": {"epochs": 5}}`` (the value is parsed as YAML)."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: use section.key=value, e.g. --set training.epochs=5")
    dotted, raw = text.split("=", 1)
    try:
        value = load_yaml(raw)
    except yaml.YAMLError:
        raise ConfigError(f"--set {text!r}: the value is not valid YAML") from None
    if isinstance(value, bool) and raw.strip().lower() not in ("true", "false"):
        value = raw.strip()  # YAML 1.1 reads on/off/yes/no as booleans; on the command line they are words
    for part in reversed(dotted.strip().split(".")):
        value = {part: value}
    return value


def resolve(user_layers: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """The full config: defaults, then the dataset / scenario / preset profiles they name, then ``user_layers``.

    ``user_layers`` are ``(source name, mapping)`` pairs, lowest priority first (config file, then CLI). The result
    is validated (:func:`validate`) before it is returned.
    """
    defaults = read_yaml(CONFIG_DIR / "default.yaml")
    names = defaults
    for source, layer in user_layers:
        names = merge(names, layer, source)
    layers = []
    for kind, key in (("datasets", "dataset"), ("scenarios", "scenario"), ("presets", "preset")):
        if names[key] not in choices(kind):
            raise ConfigError(f"unknown {key} {names[key]!r}; choose from {choices(kind)}")
        layers.append((f"configs/{kind}/{names[key]}.yaml", read_yaml(CONFIG_DIR / kind / f"{names[key]}.yaml")))
        adapted = CONFIG_DIR / "scenarios" / "per_dataset" / f"{names['scenario']}-{names['dataset']}.yaml"
        if kind == "scenarios" and adapted.is_file():
            layers.append((f"configs/scenarios/per_dataset/{adapted.name}", read_yaml(adapted)))
    config = defaults
    for source, layer in layers + user_layers:
        config = merge(config, layer, source)
    validate(config)
    return with_part_parameters(config)


ADAPT_KEYS = ("backfill_orders", "backfill_steps")


def adapt_settings(assignments: list[str]) -> dict[str, Any]:
    """The settings of ``runner.py adapt``: ``adapter_params`` and ``model_update.backfill_orders`` /
    ``backfill_steps`` from ``configs/default.yaml``, overridden by ``--set`` assignments, checked like a run's, and
    the default ``seed`` and ``output`` (written once, there)."""
    defaults = read_yaml(CONFIG_DIR / "default.yaml")
    base = {"adapter_params": defaults["adapter_params"],
            "model_update": {k: defaults["model_update"][k] for k in ADAPT_KEYS}}
    merged = base
    for assignment in assignments:
        merged = merge(merged, parse_assignment(assignment), f"--set {assignment}")
    from benchmarks.adapters import BACKFILL_ORDERS

    orders, steps = merged["model_update"]["backfill_orders"], merged["model_update"]["backfill_steps"]
    if not orders or any(o not in BACKFILL_ORDERS for o in orders):
        raise ConfigError(f"model_update.backfill_orders = {orders!r}; give a list from {list(BACKFILL_ORDERS)}")
    if steps < 1:
        raise ConfigError(f"model_update.backfill_steps = {steps!r} must be at least 1")
    from cl2r_bench.adapters import make_adapter

    for name in merged["adapter_params"]:
        make_adapter(name, merged["adapter_params"])
    return {"adapter_params": merged["adapter_params"], **merged["model_update"], "seed": defaults["seed"],
            "output": defaults["output"]}


def with_part_parameters(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` whose ``strategy_params.<strategy>`` and ``adapter_params.<adapter>`` hold every parameter the
    run uses, defaults included (they are written once, in each part's ``Config`` dataclass), so that a result's
    saved config says exactly what ran."""
    from cl2r_bench.adapters import make_adapter
    from strategies import strategy_parameters

    out = copy.deepcopy(config)
    out["strategy_params"][config["strategy"]] = strategy_parameters(config["strategy"], config["strategy_params"])
    adapter = config["adapter"]["name"]
    if adapter != "none":
        out["adapter_params"][adapter] = make_adapter(adapter, config["adapter_params"]).parameters_used()
    return out


AT_LEAST_ONE = ("training.epochs", "training.batch_size", "training.new_batch_size", "training.memory_batch_size",
                "training.memory_per_class", "evaluation.batch_size", "evaluation.resamples",
                "evaluation.heldout_classes", "evaluation.queries_per_class", "stream.initial_classes",
                "stream.increment", "stream.num_tasks", "stream.images_per_class", "data.image_size",
                "data.synthetic_classes", "data.synthetic_train_per_class", "data.synthetic_test_per_class",
                "replacement.pretrain.epochs", "replacement.pretrain.batch_size", "replacement.pretrain.patience",
                "replacement.pretrain.images_per_class", "model.small_width", "model.small_out_dim",
                "model_update.backfill_steps", "model_update.fit_per_class", "model_update.test_per_class",
                "model_update.encoder_batch_size")
AT_LEAST_ZERO = ("seed", "stream.order_seed", "replacement.pretrain.drops", "training.lr_min",
                 "training.weight_decay", "replacement.pretrain.lr_min", "replacement.pretrain.min_delta")
ABOVE_ZERO = ("training.lr", "replacement.pretrain.lr", "distributed.connect_timeout",
              "distributed.timeout")
DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


def validate(config: dict[str, Any]) -> None:
    """Check every setting of a resolved config before any data is read or model trained (issue 16): ranges,
    allowed values, the strategy's and adapter's parameters, and the rules between settings. Each problem is a
    one-line :class:`ConfigError` naming the setting and a value that works. The allowed values are those of the
    modules that use them."""
    flat = flatten(config)
    _check_ranges(flat)
    _check_choices(flat)
    _check_replacements(config)
    _check_encoders(config)
    _check_class_budget(config)
    _check_parts(config)


def _check_ranges(flat: dict[str, Any]) -> None:
    rules = ([(k, lambda v: v >= 1, "at least 1") for k in AT_LEAST_ONE]
             + [(k, lambda v: v >= 0, "at least 0") for k in AT_LEAST_ZERO]
             + [(k, lambda v: v > 0, "above 0") for k in ABOVE_ZERO]
             + [("evaluation.confidence", lambda v: 0 < v < 1, "between 0 and 1 (e.g. 0.95)"),
                ("training.momentum", lambda v: 0 <= v < 1, "in [0, 1)"),
                ("replacement.pretrain.decay", lambda v: 0 < v <= 1, "in (0, 1]"),
                ("model.simplex_classes", lambda v: v >= 2, "at least 2")])
    for key, ok, allowed in rules:
        if flat[key] is not None and not ok(flat[key]):
            raise ConfigError(f"{key} = {flat[key]!r} must be {allowed}")
    for section in ("training", "replacement.pretrain"):
        if flat[f"{section}.lr_min"] > flat[f"{section}.lr"]:
            raise ConfigError(f"{section}.lr_min = {flat[f'{section}.lr_min']:g} is above {section}.lr = "
                              f"{flat[f'{section}.lr']:g}; the cosine schedule goes down from lr to lr_min")


def _check_choices(flat: dict[str, Any]) -> None:
    from benchmarks.adapters import BACKFILL_ORDERS
    from benchmarks.metrics import TIE_RULES
    from benchmarks.retrieval import GALLERY_MODES
    from cl2r_bench.models import BACKBONES
    from cl2r_bench.settings import ADAPTER_AT, ADAPTER_DIRECTIONS, PRETRAIN_SCHEDULES, UPDATE_PROTOCOLS
    from scenarios import list_scenarios
    from scenarios.datasets import DATASETS, VERIFY_MODES
    from scenarios.model_update import HEADS as UPDATE_HEADS
    from scenarios.streams import CLASS_ORDERS, EVALUATION_SETS

    choices = {"scenario": list_scenarios(), "data.verify": VERIFY_MODES, "evaluation.dataset": EVALUATION_SETS, "evaluation.mode": GALLERY_MODES,
               "evaluation.tie_rule": TIE_RULES, "model.backbone": BACKBONES, "model_update.head": UPDATE_HEADS,
               "adapter.at": ADAPTER_AT, "adapter.direction": ADAPTER_DIRECTIONS,
               "replacement.pretrain.schedule": PRETRAIN_SCHEDULES, "replacement.pretrain.dataset": DATASETS,
               "model_update.protocol": UPDATE_PROTOCOLS}
    for key, allowed in choices.items():
        if flat[key] not in allowed:
            raise ConfigError(f"{key} = {flat[key]!r}; choose from {list(allowed)}")
    if not DEVICE.fullmatch(str(flat["device"])):
        raise ConfigError(f"device = {flat['device']!r}; use auto, cpu, cuda or cuda:N")
    unknown = [o for o in flat["model_update.backfill_orders"] if o not in BACKFILL_ORDERS]
    if unknown or not flat["model_update.backfill_orders"]:
        raise ConfigError(f"model_update.backfill_orders = {flat['model_update.backfill_orders']!r}; give a list "
                          f"from {list(BACKFILL_ORDERS)}")
    order = flat["stream.class_order"]
    if isinstance(order, str) and order not in CLASS_ORDERS or isinstance(order, list) and (
            not _ints(order) or len(set(order)) != len(order) or min(order, default=0) < 0):
        raise ConfigError(f"stream.class_order = {order!r}; use {' or '.join(CLASS_ORDERS)} or a list of distinct "
                          "class ids (ints >= 0)")
    if flat["adapter.label"]:
        safe_name(flat["adapter.label"], "adapter.label")


def _ints(values: Any) -> bool:
    return isinstance(values, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in values)


def _check_replacements(config: dict[str, Any]) -> None:
    """Replacement tasks, their checkpoints or pretraining class counts and seeds (``model_update`` has no
    replacement tasks and pretrains two models: the old and the new one)."""
    rep, num_tasks = config["replacement"], config["stream"]["num_tasks"]
    if config["scenario"] == "cl2r" and rep["tasks"]:
        raise ConfigError(f"replacement.tasks = {rep['tasks']}: CL2R has no replacements; use --scenario iamcl2r")
    if config["scenario"] == "model_update":
        seed = rep["pretrain"]["seed"]
        if isinstance(seed, list) and (not _ints(seed) or len(seed) < 2):
            raise ConfigError(f"replacement.pretrain.seed = {seed!r}: give one int, or a list of 2 ints (the old and "
                              "the new model)")
        return
    tasks = rep["tasks"]
    if not _ints(tasks) or len(set(tasks)) != len(tasks) or any(not 0 <= t < num_tasks for t in tasks):
        raise ConfigError(f"replacement.tasks = {tasks!r} must list distinct task numbers in 0..{num_tasks - 1} "
                          "(e.g. [0, 2, 4] for 7 tasks)")
    if rep["checkpoints"]:
        if not all(isinstance(p, str) for p in rep["checkpoints"]) or len(rep["checkpoints"]) != len(tasks):
            raise ConfigError(f"replacement.checkpoints has {len(rep['checkpoints'])} entries for {len(tasks)} "
                              f"replacement task(s) {tasks}; give one file path or encoder spec per task")
        from cl2r_bench.encoders import check_spec, is_spec

        for reference in rep["checkpoints"]:
            if is_spec(reference):
                check_spec(reference)
            elif not Path(reference).is_file():
                raise ConfigError(f"replacement.checkpoints: {reference} "
                                  f"{'is a folder' if Path(reference).is_dir() else 'does not exist'}; give one "
                                  "state-dict file (or encoder spec) per replacement task")
        return
    pre = rep["pretrain"]
    counts, seed = pre["class_counts"], pre["seed"]
    if tasks and (not _ints(counts) or len(counts) < len(tasks) or min(counts) < 1):
        raise ConfigError(f"replacement.pretrain.class_counts = {counts!r}: give one positive class count per "
                          f"replacement task ({len(tasks)})")
    if isinstance(seed, list) and (not _ints(seed) or len(seed) < len(tasks)):
        raise ConfigError(f"replacement.pretrain.seed = {seed!r}: give one int, or a list of {len(tasks)} ints "
                          "(one per pretrained model)")


def _check_class_budget(config: dict[str, Any]) -> None:
    """The stream, the held-out evaluation classes and the replacement models' classes must fit the data set."""
    from scenarios.datasets import class_count

    s, e = config["stream"], config["evaluation"]
    from cl2r_bench.settings import ModelUpdateSettings

    if config["scenario"] == "model_update" and ModelUpdateSettings(**config["model_update"]).leave_one_out:
        return
    available = class_count(config["dataset"], config["data"]["synthetic_classes"])
    stream = s["initial_classes"] + s["increment"] * (s["num_tasks"] - 1)
    heldout = e["heldout_classes"] if e["dataset"] == "heldout" else 0
    if config["scenario"] == "model_update" and s["num_tasks"] != 2:
        raise ConfigError(f"model_update needs stream.num_tasks = 2 (old classes, then the new ones), not "
                          f"{s['num_tasks']}")
    if stream + heldout > available:
        fits = (available - heldout - s["initial_classes"]) // s["increment"] + 1
        fix = (f"--set stream.num_tasks={fits}" if fits >= 2 and config["scenario"] != "model_update" else
               f"--set stream.initial_classes={max(1, (available - heldout) // 2)} --set stream.increment="
               f"{max(1, (available - heldout) // 2)}")
        raise ConfigError(f"the stream needs {stream} classes ({s['initial_classes']} + {s['increment']} x "
                          f"{s['num_tasks'] - 1}){f' + {heldout} held out' if heldout else ''}; {config['dataset']} "
                          f"has {available}; e.g. {fix}")
    rep = config["replacement"]
    if config["scenario"] != "model_update" and rep["tasks"] and not rep["checkpoints"]:
        source = rep["pretrain"]["dataset"]
        pool = (available - stream - heldout if source == config["dataset"]
                else class_count(source, config["data"]["synthetic_classes"]))
        wanted = max(rep["pretrain"]["class_counts"][:len(rep["tasks"])])
        if wanted > pool:
            raise ConfigError(f"replacement.pretrain.class_counts asks up to {wanted} classes of {source}; only "
                              f"{pool} are free for pretraining (outside the stream and its evaluation classes); "
                              "lower the counts or pretrain on another replacement.pretrain.dataset")


def _check_encoders(config: dict[str, Any]) -> None:
    """``model_update.old`` / ``new``: both or neither, each a spec that exists in its library (nothing is built or
    downloaded here; :func:`cl2r_bench.encoders.check_spec`), and the protocol that measures them."""
    from cl2r_bench.encoders import check_spec

    update = config["model_update"]
    specs = [update["old"], update["new"]]
    if config["scenario"] != "model_update" and any(specs):
        raise ConfigError("model_update.old / model_update.new name the models of --scenario model_update; for "
                          "IAM-CL2R's replacements use replacement.checkpoints")
    if any(specs) and not all(specs):
        raise ConfigError("give both model_update.old and model_update.new (encoder specs), or neither")
    for spec in specs:
        if spec:
            check_spec(spec)
    if all(specs) and update["protocol"] == "stream":
        raise ConfigError("model_update.protocol=stream measures models the suite trains; encoder specs are measured "
                          "by leave_one_out (or auto)")
    if update["protocol"] == "leave_one_out" and not any(specs):
        raise ConfigError("model_update.protocol=leave_one_out needs the two encoders: --set model_update.old=SPEC "
                          "--set model_update.new=SPEC")


def _check_part_names(config: dict[str, Any], section: str, check: Any) -> None:
    """Every name under ``strategy_params`` / ``adapter_params`` is a registered part whose parameters are valid, used
    or not, so that a typo is an error as an unknown key is everywhere else (issue 29)."""
    from cl2r_bench.registry import PartError

    for name in config[section]:
        try:
            check(name)
        except PartError as exc:
            raise ConfigError(str(exc) if str(exc).startswith(section) else f"{section}.{name}: {exc}") from None


def _check_parts(config: dict[str, Any]) -> None:
    """The strategy, the adapter and the training settings, checked by the classes that use them."""
    from cl2r_bench.adapters import make_adapter
    from cl2r_bench.assembly import adapted_direction
    from cl2r_bench.settings import TrainSettings
    from strategies import load_plugin, strategy_parameters

    for path in config["plugins"]:
        load_plugin(path)
    strategy_parameters(config["strategy"], config["strategy_params"])
    _check_part_names(config, "strategy_params", lambda name: strategy_parameters(name, config["strategy_params"]))
    _check_part_names(config, "adapter_params", lambda name: make_adapter(name, config["adapter_params"]))
    TrainSettings(**config["training"])
    if config["adapter"]["name"] != "none":
        adapter = make_adapter(config["adapter"]["name"], config["adapter_params"])
        if config["scenario"] != "model_update":
            adapted_direction(adapter, config["adapter"]["direction"])
