"""Post-hoc adapters between an old and a new model: one file each, registered by name (template in ``base.py``)."""
from . import drift, fct, lambda_orth, latent_translation, mini_vec2vec, slerp, translation  # noqa: F401  (each registers its adapters)
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
from .training import convergence_note

__all__ = ["Adapter", "AdapterError", "FeaturePair", "convergence_note", "embed_pair", "fit_adapter", "get_adapter",
           "list_adapters", "make_adapter", "register_adapter", "unpaired_adapters", "unpaired_halves"]
