"""What measuring may ask of a fitted adapter (docs/METHODS.md §7): the typed protocol ``benchmarks/`` imports.

The evaluator (``benchmarks/retrieval.py``) and an adapter study's cases and backfilling
(``benchmarks/adapted_cases.py``) use an adapter only through these members, so they know no adapter class and no
training method; every adapter of ``cl2r_bench/adapters/`` satisfies it (:class:`cl2r_bench.adapters.base.Adapter`).
Features in and out are ``(n, d)`` tensors; maps return un-normalised features (the caller normalises where a
retrieval system would).
"""
from __future__ import annotations

from typing import Any, ClassVar, Protocol, runtime_checkable

import torch

ORTHOGONALITY_GAP = "f_W"
"""The fit-log key of ``‖WWᵀ − I‖_F`` of a linear backward map (λ-orthogonal's diagnostic column f(W))."""


@runtime_checkable
class FeatureAdapter(Protocol):
    """A fitted map between an old and a new model's feature spaces."""

    name: ClassVar[str]
    directions: ClassVar[tuple[str, ...]]
    forward_into_new_space: ClassVar[bool]

    def backward(self, new: torch.Tensor) -> torch.Tensor:
        """New-model features into the old model's frame (new queries search the old gallery)."""

    def forward(self, old: torch.Tensor, side: torch.Tensor | None = None) -> torch.Tensor:
        """Old gallery features into the new frame (an upgrade without re-embedding images)."""

    def dual_query(self, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        """The same queries embedded by the old and the new model, combined into the frame of :meth:`old_frame`
        (the old encoder keeps running at query time)."""

    def new_frame(self, new: torch.Tensor) -> torch.Tensor:
        """The new model's own features in the frame ``forward`` maps into."""

    def old_frame(self, old: torch.Tensor) -> torch.Tensor:
        """The old gallery as compared with backward-adapted queries."""

    def uncertainty(self, old: torch.Tensor, side: torch.Tensor | None = None) -> torch.Tensor | None:
        """A per-item score, larger = backfill first, or None."""

    def export(self) -> dict[str, Any]:
        """The fitted adapter as plain tensors and numbers (kept in a run's state for resuming)."""

    def restore(self, exported: dict[str, Any], device: torch.device | str = "cpu") -> FeatureAdapter:
        """Rebuild from :meth:`export`'s output."""
