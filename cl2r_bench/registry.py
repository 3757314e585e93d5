"""Named plug-ins of one kind (strategies, adapters, scenarios): each registered once by a class decorator.

A registry is the one line that makes a new file part of the suite (``@register_strategy("name")`` and the like);
its names become folder names, so each is checked by :func:`cl2r_bench.errors.safe_name`.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, get_args, get_type_hints

from cl2r_bench.errors import ConfigError, safe_name


@dataclass(frozen=True)
class NoParams:
    """The ``Config`` of a part without parameters."""


class Registry:
    """Named classes of one kind: each name registered once by a class decorator, looked up with a one-line error
    that lists the valid names. ``check(name, cls)`` may reject a class."""

    def __init__(self, kind: str, error: type[Exception], check: Callable[[str, type], None] | None = None) -> None:
        self.kind, self.error, self.check = kind, error, check
        self.classes: dict[str, type] = {}

    def register(self, name: str) -> Callable[[type], type]:
        """Class decorator: register ``cls`` under ``name`` and set ``cls.name`` (a duplicate is an error)."""

        def decorate(cls: type) -> type:
            try:
                safe_name(name, f"the {self.kind} name")
            except ConfigError as exc:
                raise self.error(str(exc)) from None
            if name in self.classes:
                raise self.error(f"{self.kind} {name!r} is registered twice ({self.classes[name].__module__} and "
                                 f"{cls.__module__})")
            if self.check is not None:
                self.check(name, cls)
            cls.name = name
            self.classes[name] = cls
            return cls

        return decorate

    def get(self, name: str) -> type:
        """The class registered as ``name``; a miss lists the valid names."""
        if name not in self.classes:
            raise self.error(f"unknown {self.kind} {name!r}; choose from {sorted(self.classes)}")
        return self.classes[name]

    def names(self) -> list[str]:
        return sorted(self.classes)


def config_from_params(config_class: type, params: dict[str, Any], section: str,
                       error: type[Exception]) -> Any:
    """``config_class(**params)`` after checking every key and value type against the dataclass defaults (the one
    place where a strategy's or adapter's defaults are written); any problem (also a ``ValueError`` of
    ``__post_init__``) raises ``error`` naming ``section.key``."""
    valid = {f.name for f in fields(config_class)}
    unknown = sorted(set(params) - valid)
    if unknown:
        raise error(f"{section}: unknown parameter(s) {unknown}; valid: {sorted(valid)}")
    defaults = config_class()
    for key, value in params.items():
        default = getattr(defaults, key)
        expected = [type(default)] if default is not None else optional_types(config_class, key)
        if not any(fits(value, kind) for kind in expected):
            raise error(f"{section}.{key} = {value!r}: expected {' or '.join(k.__name__ for k in expected)} like "
                        f"the default {default!r}")
    try:
        return config_class(**params)
    except ValueError as exc:
        raise error(f"{section}.{exc}") from None


def fits(value: Any, kind: type) -> bool:
    """Whether ``value`` is of ``kind``; a float setting takes an integer too, and no number is a bool."""
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, kind) and not (kind is int and isinstance(value, bool))


def optional_types(config_class: type, key: str) -> list[type]:
    """The types a setting whose default is None takes: None and those its annotation names (``float | None``)."""
    hint = get_type_hints(config_class)[key]
    return [type(None), *(kind for kind in get_args(hint) if isinstance(kind, type) and kind is not type(None))]


def check_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    """In a part's ``Config.__post_init__``: raise ``ValueError`` (reported by ``from_params`` as
    ``strategy_params.<name>.<key> ...`` or ``adapter_params.<name>.<key> ...``) when ``value`` is not one of
    ``choices``."""
    if value not in choices:
        raise ValueError(f"{key} must be one of {list(choices)}, not {value!r}")
