"""Post-hoc adapters between an old and a new model: one file each, registered by name as it is imported (every
module of this folder is, by :func:`cl2r_bench.plugins.import_folder`; the template is ``base.py``)."""
from cl2r_bench.plugins import import_folder

from .base import (
                   Adapter,
                   AdapterError,
                   FeaturePair,
                   embed_pair,
                   fit_adapter,
                   get_adapter,
                   list_adapters,
                   make_adapter,
                   register_adapter,
                   unpaired_adapters,
                   unpaired_halves,
)
from .learned import convergence_note

import_folder(__name__, __path__, skip=("training",))   # the old name of learned.py, kept one release

__all__ = ["Adapter", "AdapterError", "FeaturePair", "convergence_note", "embed_pair", "fit_adapter", "get_adapter",
           "list_adapters", "make_adapter", "register_adapter", "unpaired_adapters", "unpaired_halves"]
