"""One config schema, one override path (``configs/default.yaml`` is the schema and shows every default).

Layers, later wins: ``default.yaml`` < ``datasets/<dataset>.yaml`` < ``scenarios/<scenario>.yaml`` <
``scenarios/per_dataset/<scenario>-<dataset>.yaml`` (a scenario's defaults adapted to a data set's class count,
where one exists) < ``presets/<preset>.yaml`` < ``presets/per_scenario/<preset>-<scenario>.yaml`` (a preset adapted
to a scenario, where one exists) < ``--config FILE`` < command-line flags. This module only reads and
layers YAML and parses ``--set``: every value is checked against the type of its default, and unknown keys are
errors that list the valid ones. The values are checked by the parts that own them when the assembly step builds the
run (:func:`cl2r_bench.app.assembly.assemble`): each section of :mod:`cl2r_bench.settings`, the scenario's rules
between sections, and each strategy's and adapter's own ``Config``, all before any data is read.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import re
from pathlib import Path
from typing import Any, TypeVar

import yaml

from cl2r_bench.errors import ConfigError
from cl2r_bench.limits import TextFileError, read_text

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
Section = TypeVar("Section")
SPEED_OPTIONS = ("training.channels_last", "training.fused_optimizer", "training.compile")
"""Settings that change how fast a run trains, not what it trains: a run resumes under other values, the leaderboard
counts its seeds in one experiment, and a replacement model's cache key leaves them out."""
FREE_FORM = {"strategy_params", "adapter_params", "scenario_params"}
EXTRA_TYPES: dict[str, tuple[type, ...]] = {
    "stream.class_order": (str, list),
    "stream.images_per_class": (int, type(None)),
    "evaluation.queries_per_class": (int, type(None)),
    "replacement.pretrain.images_per_class": (int, type(None)),
    "replacement.pretrain.seed": (int, list),
    "model_update.fit_per_class": (int, type(None)),
    "model_update.test_per_class": (int, type(None)),
    "model_update.queries": (int, type(None)),
    "model_update.stream_rows": (int, str, type(None)),
    "training.compile": (bool, str),
    "training.clip_grad_norm": (float, type(None)),
}
"""The settings whose values may have another type than their default's, and the types they accept: the union
annotations of :mod:`cl2r_bench.settings`, which imports this module and so cannot be read here
(``tests/test_structure.py`` checks that the two agree). Where a float is accepted, so is an int, as for a float
default."""


FLOAT_TEXT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")  # 1e-3: a string in YAML 1.1, a float here


class PlainLoader(yaml.SafeLoader):
    """YAML without aliases: a config never needs them, and a few hundred bytes of nested aliases expand into
    gigabytes (a "billion laughs" file hangs a run)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise ConfigError(f"YAML aliases (*name) are not accepted in settings (line {mark.line + 1}); write the "
                              "values out")
        return super().compose_node(parent, index)


def load_yaml(text: str) -> Any:
    """Parse settings text as YAML without aliases (:class:`PlainLoader`); nesting deeper than Python's recursion
    limit (``[[[[...]]]]``) is a :class:`~cl2r_bench.errors.ConfigError`, not a ``RecursionError``."""
    try:
        return yaml.load(text, Loader=PlainLoader)
    except RecursionError:
        raise ConfigError("YAML nested too deeply; settings are a few levels of mappings and lists") from None


def config_text(config: dict[str, Any]) -> str:
    """A resolved config as its run folder's ``config.yaml`` holds it, keys in their order; what a resume compares
    is :func:`load_yaml` of this text, so tuples and lists read back alike."""
    return yaml.safe_dump(config, sort_keys=False)


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping; a missing, unreadable (:func:`cl2r_bench.limits.read_text`: a folder, a FIFO, too large,
    not UTF-8), malformed or non-mapping file is a :class:`ConfigError` naming it."""
    if not Path(path).exists():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = load_yaml(read_text(path, "config file"))
    except TextFileError as exc:
        fix = "; save it as UTF-8" if exc.problem.startswith("not UTF-8") else ""
        raise ConfigError(f"config file {path} is {exc.problem}{fix}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    except ConfigError as exc:
        raise ConfigError(f"config file {path}: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of keys to values")
    return data


PROFILE_FOLDERS: list[Path] = [CONFIG_DIR]
"""Where profiles are looked up, first match wins: the suite's ``configs/``, then the ``configs/`` folder beside each
plug-in file a config names (:func:`add_plugin_profiles`), so that a plug-in data set brings its profile along."""


def add_plugin_profiles(plugins: list[str]) -> None:
    """Look up profiles also in ``configs/`` beside each of ``plugins`` (the config's plug-in files), where one is;
    the first reader of the list, so the one that refuses an entry that is not a path."""
    odd = [plugin for plugin in plugins if not isinstance(plugin, str) or not plugin.strip()]
    if odd:
        raise ConfigError(f"plugins holds {odd[0]!r}: list the paths of Python files, e.g. plugins: [my_strategy.py]")
    for plugin in plugins:
        folder = Path(plugin).resolve().parent / "configs"
        if folder.is_dir() and folder not in PROFILE_FOLDERS:
            PROFILE_FOLDERS.append(folder)


def profile_path(kind: str, name: str) -> Path | None:
    """The profile ``<kind>/<name>.yaml`` in the first of :data:`PROFILE_FOLDERS` that holds it, or None."""
    return next((path for folder in PROFILE_FOLDERS if (path := folder / kind / f"{name}.yaml").is_file()), None)


def choices(kind: str) -> list[str]:
    """Names of the YAML profiles of one kind (``datasets``, ``scenarios``, ``presets``), the suite's and those
    beside the plug-ins of the config resolved last (:data:`PROFILE_FOLDERS`)."""
    return sorted({p.stem for folder in PROFILE_FOLDERS for p in (folder / kind).glob("*.yaml")})


def profile_summary(kind: str, name: str) -> str:
    """The first sentence of the leading comment of ``configs/<kind>/<name>.yaml`` (at most 150 characters):
    what the profile is, for ``runner.py list``."""
    lines = profile_path(kind, name).read_text().splitlines()
    leading = itertools.takewhile(lambda text: text.startswith("#"), lines)
    comment = " ".join(line.lstrip("# ").strip() for line in leading)
    sentence = comment.split(". ")[0].rstrip(".") + "."
    return sentence if len(sentence) <= 150 else sentence[:149] + "…"


def _type_ok(value: Any, default: Any, dotted: str) -> bool:
    if dotted in EXTRA_TYPES:
        kinds = EXTRA_TYPES[dotted] + ((int,) if float in EXTRA_TYPES[dotted] else ())
        return isinstance(value, kinds) and (bool in kinds or not isinstance(value, bool))
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
            expected = " or ".join(kind.__name__ for kind in EXTRA_TYPES.get(dotted, (type(default),)))
            raise ConfigError(f"{source}: {dotted} = {value!r} has type {type(value).__name__}; expected "
                              f"{expected} like the default {default!r}")
        else:
            out[key] = float(value) if isinstance(default, float) else value
    return out


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"training": {"epochs": 5}}`` -> ``{"training.epochs": 5}``: one entry per setting."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        out.update(flatten(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def differing(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The keys, sorted, whose values differ between two flat configs (:func:`flatten`), a key missing from one
    counting as its value in ``configs/default.yaml`` (a setting added since the earlier config was written, at its
    default, is no difference), else as None: what a resumed run or study names when its settings are not the
    earlier run's."""
    defaults = default_settings()
    return sorted(key for key in a.keys() | b.keys()
                  if a.get(key, defaults.get(key)) != b.get(key, defaults.get(key)))


def with_defaults(cls: type[Section], section: str, **changes: Any) -> Section:
    """``cls`` (a settings section's dataclass) built from the ``section`` of ``configs/default.yaml`` (a dotted path)
    with ``changes``: for tests, tools and benchmark scripts that need settings outside a resolved run config."""
    values = read_yaml(CONFIG_DIR / "default.yaml")
    for key in section.split("."):
        values = values[key]
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{**{k: v for k, v in values.items() if k in names}, **changes})


@functools.cache
def default_settings() -> dict[str, Any]:
    """``configs/default.yaml`` flattened (:func:`flatten`), read once."""
    return flatten(read_yaml(CONFIG_DIR / "default.yaml"))


def parse_assignment(text: str) -> dict[str, Any]:
    """``"training.epochs=5"`` -> ``{"training": {"epochs": 5}}`` (the value is parsed as YAML)."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: use section.key=value, e.g. --set training.epochs=5")
    dotted, raw = text.split("=", 1)
    try:
        value = load_yaml(raw)
    except yaml.YAMLError:
        raise ConfigError(f"--set {text!r}: the value is not valid YAML") from None
    except ConfigError as exc:
        raise ConfigError(f"--set {dotted.strip()}=...: {exc}") from None
    if isinstance(value, bool) and raw.strip().lower() not in ("true", "false"):
        value = raw.strip()  # YAML 1.1 reads on/off/yes/no as booleans; on the command line they are words
    return nested(dotted.strip(), value)


def nested(dotted: str, value: Any) -> dict[str, Any]:
    """``"training.epochs", 5`` -> ``{"training": {"epochs": 5}}``: one setting as a config layer."""
    for part in reversed(dotted.split(".")):
        value = {part: value}
    return value


ADAPTED_PROFILES = {"scenarios": "scenarios/per_dataset/{scenario}-{dataset}.yaml",
                    "presets": "presets/per_scenario/{preset}-{scenario}.yaml"}
"""The optional profiles that adapt one profile to another, each read right after the profile it adapts: a
scenario's defaults to a data set's class count, a preset to a scenario (the pretrained-backbone track's encoders
and evaluation for ``upgrade``)."""


def resolve(user_layers: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """The full config: defaults, then the dataset / scenario / preset profiles they name (each followed by the
    profile adapting it, :data:`ADAPTED_PROFILES`), then ``user_layers``. A
    scenario's profile is optional (a plug-in's settings are its ``Config``), so its name is checked by the
    scenario registry when the run is assembled; a plug-in data set's profile sits beside the plug-in file
    (:data:`PROFILE_FOLDERS`).

    ``user_layers`` are ``(source name, mapping)`` pairs, lowest priority first (config file, then CLI). Every key
    and value type is checked here; the values themselves are checked by the parts that own them when the assembly
    step builds the run (:func:`cl2r_bench.app.assembly.assemble`).
    """
    defaults = read_yaml(CONFIG_DIR / "default.yaml")
    names = defaults
    for source, layer in user_layers:
        names = merge(names, layer, source)
    add_plugin_profiles(names["plugins"])
    layers = []
    for kind, key in (("datasets", "dataset"), ("scenarios", "scenario"), ("presets", "preset")):
        path = profile_path(kind, names[key])
        if path is None:
            if kind == "scenarios":
                continue
            raise ConfigError(f"unknown {key} {names[key]!r}; choose from {choices(kind)} (a plug-in's profile goes "
                              f"in configs/{kind}/{names[key]}.yaml beside the plug-in file)")
        layers.append((f"configs/{kind}/{names[key]}.yaml", read_yaml(path)))
        adapted = ADAPTED_PROFILES.get(kind)
        adapted = adapted and CONFIG_DIR / adapted.format(**names)
        if adapted and adapted.is_file():
            layers.append((str(adapted.relative_to(CONFIG_DIR.parent)), read_yaml(adapted)))
    config = defaults
    for source, layer in layers + user_layers:
        config = merge(config, layer, source)
    return config
