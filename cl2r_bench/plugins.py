"""Plug-ins from outside the suite (``--plugin FILE`` or ``plugins:`` in a config; docs/plugins.md): a Python file
that registers strategies, scenarios, adapters, encoder families, data sets or backfilling orders with their
registries' decorators.
Loading it is all the suite does; the file's decorators do the rest."""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import pkgutil
import sys
import traceback
import warnings
from collections.abc import Iterable
from pathlib import Path

from cl2r_bench.errors import PartError, PluginError

PLUGIN_KINDS = "a strategy, scenario, adapter, encoder family, data set or backfilling order"
MODULE_PREFIX = "cl2r_plugin_"
"""The start of every plug-in module's name in ``sys.modules``."""


def load_plugin(path: str) -> None:
    """Import a plug-in file from outside the package; the parts it registers join their registries.

    Each file is its own module (named after its resolved path, so two files of one name both load, and loading
    one file again does nothing). Raises :class:`PluginError` with one line when the file is missing, fails to
    import (naming the plugin's line) or calls ``sys.exit`` while it is imported; a registry's own one-line error
    (a duplicate name, a part that breaks its kind's contract) passes through as it is.
    """
    file = Path(path)
    if not file.is_file():
        state = ("is a folder" if file.is_dir() else "is not a regular file (a FIFO, device or link to one)"
                 if file.exists() else "does not exist")
        raise PluginError(f"plugin {path} {state}; pass the path of a Python file that registers {PLUGIN_KINDS}")
    resolved = file.resolve()
    module_name = f"{MODULE_PREFIX}{file.stem}_{hashlib.sha256(str(resolved).encode()).hexdigest()[:12]}"
    if module_name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(module_name, resolved)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except PartError:
        del sys.modules[module_name]
        raise
    except SystemExit as exc:
        del sys.modules[module_name]
        raise PluginError(f"plugin {path} called sys.exit({exc.code!r}) while being imported{_line_in(exc, resolved)}"
                          "; a plugin file defines and registers its parts, it does not exit") from None
    except Exception as exc:  # noqa: BLE001 - any failure in user code is reported in one line
        del sys.modules[module_name]
        raise PluginError(f"plugin {path} failed to import{_line_in(exc, resolved)}: {type(exc).__name__}: {exc}"
                          ) from None


def _line_in(exc: BaseException, file: Path) -> str:
    """`` (line N)``: the last line of ``file`` in ``exc``'s traceback, or nothing (e.g. a syntax error names its
    line itself)."""

    lines = [frame.lineno for frame in traceback.extract_tb(exc.__traceback__) if frame.filename == str(file)]
    return f" (line {lines[-1]})" if lines else ""


class PluginNotice(UserWarning):
    """A module of one of the suite's plug-in folders failed to import: the others are loaded (printed as one
    ``notice:`` line by the command line)."""


def import_folder(package: str, path: Iterable[str], skip: Iterable[str] = ()) -> list[str]:
    """Import every module of the package ``package`` whose folder is ``path`` (its ``__path__``), in name order,
    except those named in ``skip`` and those whose name starts with ``_``: a plug-in is its file, registered as it is
    imported, with no import line to add anywhere (timm's and Mammoth's way). A module that fails to import is one
    :class:`PluginNotice` line naming its file (and line) and the error, and the others still load. Returns the names
    imported."""
    loaded = []
    for module in sorted(pkgutil.iter_modules(list(path)), key=lambda found: found.name):
        if module.name.startswith("_") or module.name in set(skip):
            continue
        try:
            importlib.import_module(f"{package}.{module.name}")
        except PartError:
            raise
        except Exception as exc:  # noqa: BLE001 - a broken plug-in file must not stop the others from loading
            folder = package.replace(".", "/")
            file = Path(module.module_finder.path) / f"{module.name}.py"
            lines = [frame.lineno for frame in traceback.extract_tb(exc.__traceback__) if frame.filename == str(file)]
            warnings.warn_explicit(f"failed to import ({type(exc).__name__}: {exc}); the other modules of {folder}/ "
                                   "are loaded", PluginNotice, filename=f"{folder}/{module.name}.py",
                                   lineno=lines[-1] if lines else 1)
            continue
        loaded.append(module.name)
    return loaded
