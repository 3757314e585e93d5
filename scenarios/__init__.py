"""Data sets, class-incremental streams, evaluation sets and the scenarios (one file each, registered by name; the
template is in ``scenarios/base.py``).

The scenario files are imported on first lookup, so that reading data (``scenarios.datasets``) does not import the
training code the scenarios use."""
from __future__ import annotations

SCENARIO_MODULES = ("cl2r", "iamcl2r", "model_update")


def _register_all() -> None:
    import importlib

    for module in SCENARIO_MODULES:
        importlib.import_module(f"{__name__}.{module}")


def get_scenario(name: str) -> type:
    """The scenario class registered as ``name`` (:class:`scenarios.base.Scenario`)."""
    from .base import SCENARIOS

    _register_all()
    return SCENARIOS.get(name)


def list_scenarios() -> list[str]:
    from .base import SCENARIOS

    _register_all()
    return SCENARIOS.names()
