"""Named plug-ins of one kind (strategies, adapters, scenarios): each registered once by a class decorator.

A registry is the one line that makes a new file part of the suite (``@register_strategy("name")`` and the like);
its names become folder names, so each is checked by :func:`cl2r_bench.errors.safe_name`.
"""
from __future__ import annotations

from collections.abc import Callable

from cl2r_bench.errors import ConfigError, safe_name


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
