"""How the suite imports Avalanche 0.6: its known warnings silenced, and the three libraries it imports at start-up
but calls only in parts the suite does not use (by default) deferred until they are first used.

``import avalanche`` imports every part of Avalanche, and with it ``qpsolvers`` (for GEM and A-GEM; it imports every
QP solver installed, JAX among them), ``wandb`` (the W&B logger and confusion-matrix plots) and ``gdown`` (the CUB-200
download). Avalanche binds them at import and calls them only inside those strategies, loggers and downloads, so
the suite puts a :class:`DeferredModule` in ``sys.modules`` for each before importing Avalanche. Importing torch and
Avalanche then takes 5.1 s of CPU instead of 6.5 s on 2 idle CPU cores (``/usr/bin/time``; torch alone 1.7 s),
saved in every process that trains: runs, sweep points, ranks and SLURM jobs. The first use of any of them
(``avalanche:GEM``, a W&B logger) imports the real library; nothing else changes."""
import contextlib
import importlib
import importlib.util
import sys
import types
import warnings
from collections.abc import Iterator
from typing import Any

DEFERRED_LIBRARIES = ("qpsolvers", "wandb", "gdown")


class DeferredModule(types.ModuleType):
    """A stand-in for an installed module that is imported for real at the first use of an attribute it lacks.

    It carries the module's ``__spec__``, ``__file__`` and ``__loader__``, so an ``import`` statement (which reads
    ``__spec__``) and :func:`inspect.getmodule` (which reads every module's ``__file__``) leave it deferred. Every
    other attribute is read from the real module each time, so the module's later state (``wandb.run``) is seen."""

    def __getattr__(self, attribute: str) -> Any:
        name = self.__name__
        if sys.modules.get(name) is self:
            del sys.modules[name]
            try:
                importlib.import_module(name)
            except BaseException:
                sys.modules.setdefault(name, self)
                raise
        return getattr(sys.modules[name], attribute)


def defer_import(name: str) -> None:
    """Put a :class:`DeferredModule` for ``name`` in ``sys.modules``, unless it is imported already or not
    installed."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None:
        return
    module = DeferredModule(name)
    module.__spec__, module.__file__, module.__loader__, module.__package__ = spec, spec.origin, spec.loader, name
    sys.modules[name] = module


@contextlib.contextmanager
def avalanche_warnings_filtered() -> Iterator[None]:
    """Import Avalanche, or run its strategies, inside this: :data:`DEFERRED_LIBRARIES` are deferred first, and
    Avalanche 0.6's known warnings on this stack are silenced, and only those: qpsolvers' and JAXopt's at import, an
    evaluator without loggers, the replay buffers' deprecated ``update`` (Replay, ER_ACE, MIR: once per
    experience), and NumPy 2 / PyTorch indexing deprecations inside EWC, MAS and SynapticIntelligence. Any other
    warning still shows."""
    for name in DEFERRED_LIBRARIES:
        defer_import(name)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*QP solver.*")
        warnings.filterwarnings("ignore", message="JAXopt is no longer maintained", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message="No loggers specified")
        warnings.filterwarnings("ignore", message="Call to deprecated function update", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message="__array_wrap__ must accept context", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message="Using a non-tuple sequence for multidimensional indexing",
                                category=UserWarning)
        yield
