"""How a settings section checks itself (:mod:`cl2r_bench.settings`): rules of range and choice, each failure one
line naming ``section.key``, its value and what it may be."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cl2r_bench.errors import ConfigError
from cl2r_bench.limits import COUNT_MAX

Rule = tuple[str, Callable[[Any], bool], str]


def at_least(bound: int, *keys: str) -> list[Rule]:
    """Each of ``keys`` at least ``bound``; a count (a bound of 1 or more) also at most :data:`COUNT_MAX`, the same
    ceiling as a count on the command line, so that no setting asks for more than a 32-bit count."""
    if bound < 1:
        return [(key, lambda value: value >= bound, f"at least {bound}") for key in keys]
    return [(key, lambda value: bound <= value <= COUNT_MAX, f"from {bound} to {COUNT_MAX}") for key in keys]


def above_zero(*keys: str) -> list[Rule]:
    return [(key, lambda value: value > 0, "above 0") for key in keys]


def check_rules(section: str, settings: Any, rules: list[Rule]) -> None:
    """Each ``(key, ok, allowed)`` of ``rules`` holds for the value of ``section.key`` (None passes: "not set")."""
    for key, ok, allowed in rules:
        value = getattr(settings, key)
        if value is not None and not ok(value):
            raise ConfigError(f"{_dotted(section, key)} = {value!r} must be {allowed}")


def check_choices(section: str, settings: Any, choices: dict[str, tuple[str, ...]]) -> None:
    """The value of each ``section.key`` is one of ``choices[key]``."""
    for key, allowed in choices.items():
        if getattr(settings, key) not in allowed:
            raise ConfigError(f"{_dotted(section, key)} = {getattr(settings, key)!r}; choose from {list(allowed)}")


def check_schedule(section: str, settings: Any) -> None:
    """The cosine schedule goes down from ``lr`` to ``lr_min``."""
    if settings.lr_min > settings.lr:
        raise ConfigError(f"{section}.lr_min = {settings.lr_min:g} is above {section}.lr = {settings.lr:g}; the "
                          "cosine schedule goes down from lr to lr_min")


def _dotted(section: str, key: str) -> str:
    return f"{section}.{key}" if section else key


def int_list(values: Any) -> bool:
    """Whether ``values`` is a list of ints (booleans are not)."""
    return isinstance(values, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in values)
