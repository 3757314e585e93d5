"""A plug-in's settings (a strategy's, adapter's or scenario's ``Config`` dataclass): each field declares its
default and what values it takes in one place, and :func:`config_from_params` checks every value a user gives
before anything is built or read.

A field is written ``rank: int = setting(64, at_least=1, at_most=WIDTH_MAX)`` or ``mask: str = setting("zero",
choices=MASKS)``. A number declared without bounds takes the defaults of its kind (:func:`allowed`: a count from 0 to
:data:`~cl2r_bench.limits.COUNT_MAX`, a float at least 0), so no numeric setting goes unchecked; a string declares its
choices. ``tests/plugins/test_plugin_settings.py`` feeds every registered plug-in's every setting a value out of its
range and an unknown choice, so a new plug-in is covered without a new test.
"""
from __future__ import annotations

import dataclasses
from dataclasses import Field, dataclass, field, fields
from typing import Any, get_args, get_type_hints

from cl2r_bench.limits import COUNT_MAX, Allowed, bounds

WIDTH_MAX = 16384
"""The most units a plug-in's layer may have, or dimensions it may add (a 16384 x 16384 float matrix is 1 GiB)."""
ALLOWED = "allowed"


@dataclass(frozen=True)
class NoParams:
    """The ``Config`` of a part without parameters."""


def setting(default: Any, *, at_least: float | None = None, above: float | None = None,
            at_most: float | None = None, below: float | None = None, choices: tuple[Any, ...] | None = None) -> Any:
    """A ``Config`` field with its default and the values it takes (module docstring)."""
    if choices is not None:
        rule = Allowed(choices=tuple(choices))
    else:
        rule = bounds(at_least=at_least, above=above, at_most=at_most, below=below)
    return field(default=default, metadata={ALLOWED: rule})


def allowed(config_class: type, item: Field) -> Allowed:
    """What ``item`` (a field of ``config_class``) takes: its declaration (a count's at most
    :data:`~cl2r_bench.limits.COUNT_MAX` unless it says less), else the defaults of its kind."""
    kinds = setting_types(config_class, item.name)
    declared = item.metadata.get(ALLOWED)
    if declared is not None:
        counted = int in kinds and declared.choices is None and declared.high is None
        return dataclasses.replace(declared, high=COUNT_MAX) if counted else declared
    if int in kinds:
        return Allowed(low=0, high=COUNT_MAX)
    if float in kinds:
        return Allowed(low=0)
    return Allowed()


def setting_types(config_class: type, key: str) -> list[type]:
    """The types a setting takes: its annotation's (``float | None`` gives float and NoneType)."""
    hint = get_type_hints(config_class)[key]
    return [kind for kind in (get_args(hint) or (hint,)) if isinstance(kind, type)]


def config_from_params(config_class: type, params: dict[str, Any], section: str,
                       error: type[Exception]) -> Any:
    """``config_class(**params)`` after checking every key, type and value against the dataclass (the one place
    where a plug-in's defaults and ranges are written); any problem (also a ``ValueError`` of ``__post_init__``)
    raises ``error`` naming ``section.key``, its value and what is allowed."""
    declared = {item.name: item for item in fields(config_class)}
    unknown = sorted(set(params) - set(declared))
    if unknown:
        raise error(f"{section}: unknown parameter(s) {unknown}; valid: {sorted(declared)}")
    for key, value in params.items():
        default = declared[key].default
        expected = [type(default)] if default is not None else setting_types(config_class, key)
        if not any(fits(value, kind) for kind in expected):
            raise error(f"{section}.{key} = {value!r}: expected {' or '.join(k.__name__ for k in expected)} like "
                        f"the default {default!r}")
        problem = allowed(config_class, declared[key]).problem(value)
        if problem:
            raise error(f"{section}.{key} = {value!r} {problem}" if problem.startswith("must")
                        else f"{section}.{key} = {value!r}; {problem}")
    try:
        return config_class(**params)
    except ValueError as exc:
        raise error(f"{section}.{exc}") from None


def fits(value: Any, kind: type) -> bool:
    """Whether ``value`` is of ``kind``; a float setting takes an integer too, and no number is a bool."""
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, kind) and not (kind is int and isinstance(value, bool))
