"""How the suite imports Avalanche 0.6 (:func:`importing_avalanche`) and runs its strategies
(:func:`avalanche_warnings_filtered`): its known warnings silenced, and four libraries it imports at start-up but
calls only in parts the suite does not use by default deferred until they are first used.

``import avalanche`` imports every part of Avalanche, and with it ``qpsolvers`` (for GEM; it imports every QP solver
installed, JAX's among them), ``wandb`` (the W&B logger and confusion-matrix plots), ``gdown`` (the CUB-200
download) and ``torchmetrics`` (its top-k accuracy metric; torchmetrics imports its audio, image and text metrics,
SciPy's signal processing among them). Avalanche binds them at import and calls them only inside GEM, those loggers,
that download and that metric, so while the suite imports Avalanche a :class:`DeferredModule` stands in
``sys.modules`` for each (:data:`DEFERRED_LIBRARIES`); the one function Avalanche binds by ``from … import``
(torchmetrics' ``accuracy``) is a :class:`DeferredFunction`. Importing torch and Avalanche then takes 4.4 s of CPU
instead of 7.2 s (5.6 s with only the first three deferred) on 2 idle CPU cores (``/usr/bin/time``, user and
system; torch alone 1.9 s, torch and torchvision 3.6 s), saved in every process that trains the suite's strategies:
runs, sweep points, ranks and SLURM jobs.

The stand-ins leave ``sys.modules`` once Avalanche is imported: Avalanche's own modules keep them, and every other
import of these libraries gets the real module as usual. An Avalanche strategy may call any of them, so building one
imports them for real first (:func:`import_deferred`), before its training is timed."""
import contextlib
import importlib.util
import sys
import threading
import types
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

DEFERRED_FUNCTIONS = {"torchmetrics.functional": ("accuracy",)}
"""The functions Avalanche binds by ``from module import function`` at start-up, by module."""
DEFERRED_LIBRARIES = ("qpsolvers", "wandb", "gdown", "torchmetrics", *DEFERRED_FUNCTIONS)
"""The libraries Avalanche imports at start-up and calls only in GEM, its W&B logging, its CUB-200 download and its
top-k accuracy, with the modules of :data:`DEFERRED_FUNCTIONS`; a package's submodule follows the package."""
_RESOLVING = threading.Lock()


class DeferredModule(types.ModuleType):
    """A stand-in for an installed module that reads every attribute it lacks from the real module, imported (once,
    by the import system) at the first such read.

    It carries the module's ``__spec__``, ``__file__`` and ``__loader__``, so an ``import`` statement (which reads
    ``__spec__``) and :func:`inspect.getmodule` (which reads every module's ``__file__``) leave it deferred. Each read
    goes to the real module, so its later state (``wandb.run``) is seen; a failed import raises at the read. A plain
    module's stand-in has no ``__path__``, as the real one, so that ``from module import name`` does not import it
    (a package's, see :func:`defer_import`)."""

    def __getattr__(self, attribute: str) -> Any:
        if attribute == "__path__" and self.__spec__.submodule_search_locations is None:
            raise AttributeError(f"module {self.__name__!r} is not a package")
        if attribute in DEFERRED_FUNCTIONS.get(self.__name__, ()):
            return DeferredFunction(self.__name__, attribute)
        return getattr(_imported(self.__name__), attribute)


class DeferredFunction:
    """A function of a deferred module, as ``from module import function`` binds it: each call calls the real
    function, its module imported at the first."""

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(_imported(self.module), self.name)(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<deferred function {self.module}.{self.name}>"


def _imported(name: str) -> types.ModuleType:
    """The real module ``name``, imported now if a stand-in held its place. The stand-ins of its whole package go
    first, so that the real package and its submodules are imported together, never a stand-in among them."""
    package = name.partition(".")[0]
    with _RESOLVING:
        if isinstance(sys.modules.get(package), DeferredModule) or isinstance(sys.modules.get(name), DeferredModule):
            for held, module in list(sys.modules.items()):
                if isinstance(module, DeferredModule) and (held == package or held.startswith(package + ".")):
                    del sys.modules[held]
    return importlib.import_module(name)


def defer_import(name: str, package_path: bool = False) -> DeferredModule | None:
    """Put a :class:`DeferredModule` for ``name`` in ``sys.modules`` and return it; None (and nothing changed) when
    ``name`` is imported already or not installed, or is a submodule of a package that is not deferred. With
    ``package_path``, a package's stand-in carries its ``__path__``, so that its deferred submodules are found and
    its deferred functions bound without importing it; without, reading ``__path__`` imports the package, so that a
    submodule that is not deferred is imported under the real package."""
    parent = name.rpartition(".")[0]
    if name in sys.modules or (parent and not isinstance(sys.modules.get(parent), DeferredModule)):
        return None
    spec = importlib.util.find_spec(name)
    if spec is None:
        return None
    module = DeferredModule(name)
    module.__spec__, module.__file__, module.__loader__, module.__package__ = (spec, spec.origin, spec.loader,
                                                                               spec.parent)
    if package_path and spec.submodule_search_locations is not None:
        module.__path__ = list(spec.submodule_search_locations)
    sys.modules[name] = module
    return module


@contextlib.contextmanager
def deferring(names: Iterable[str]) -> Iterator[None]:
    """Inside: ``names`` stand deferred in ``sys.modules`` (:func:`defer_import`; a package carries its ``__path__``
    when a submodule or a function of it is deferred). After: the stand-ins still there are removed, so that later
    imports of those names are ordinary ones; whatever bound a stand-in meanwhile keeps it."""
    names = list(names)
    holders = {name.rpartition(".")[0] for name in names} | set(DEFERRED_FUNCTIONS)
    stand_ins = [module for module in (defer_import(name, package_path=name in holders) for name in names)
                 if module is not None]
    try:
        yield
    finally:
        for module in stand_ins:
            if sys.modules.get(module.__name__) is module:
                del sys.modules[module.__name__]


@contextlib.contextmanager
def avalanche_warnings_filtered() -> Iterator[None]:
    """Silence Avalanche 0.6's known warnings on this stack, and only those: qpsolvers' and JAXopt's at import, an
    evaluator without loggers, the replay buffers' deprecated ``update`` (Replay, ER_ACE, MIR: once per
    experience), and NumPy 2 / PyTorch indexing deprecations inside EWC, MAS and SynapticIntelligence. Any other
    warning still shows."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*QP solver.*")
        warnings.filterwarnings("ignore", message="JAXopt is no longer maintained", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message="No loggers specified")
        warnings.filterwarnings("ignore", message="Call to deprecated function update", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message="__array_wrap__ must accept context", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message="Using a non-tuple sequence for multidimensional indexing",
                                category=UserWarning)
        yield


@contextlib.contextmanager
def importing_avalanche() -> Iterator[None]:
    """Import Avalanche (or any part of it) inside this: :data:`DEFERRED_LIBRARIES` deferred and its warnings
    filtered (:func:`avalanche_warnings_filtered`)."""
    with deferring(DEFERRED_LIBRARIES), avalanche_warnings_filtered():
        yield


def import_deferred() -> None:
    """Import :data:`DEFERRED_LIBRARIES` for real (those installed; their import warnings filtered), so that
    Avalanche's stand-ins read from imported modules: before an Avalanche strategy trains, which may call them."""
    with avalanche_warnings_filtered():
        for name in DEFERRED_LIBRARIES:
            with contextlib.suppress(ModuleNotFoundError):
                if name in sys.modules or importlib.util.find_spec(name) is not None:
                    _imported(name)
