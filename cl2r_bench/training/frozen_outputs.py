"""The frozen teacher's and independent model's outputs of a batch: read from a table built once per task where an
item is the same at every draw, else the model run on the batch (docs/METHODS.md §4b).

On the pretrained-backbone track an item is a frozen encoder's cached feature, drawn as it is (no crop, no flip:
:class:`~cl2r_bench.training.engine.DeviceBatches`), and the teacher and the independent model are frozen in eval
mode, so their outputs of an item are the same at every epoch. Running them on each batch recomputes those outputs
``epochs`` times; a table built once before the task's first batch and read by each batch's item rows
(``DeviceBatches.last_rows``) gives the same outputs (up to the float rounding of another batch size) at one
epoch's cost of their forwards. BT²'s authors read their old and independent features from such tables
(docs/strategies.md). Images are cropped and flipped at every draw, so for them the models run on each batch.
"""
from __future__ import annotations

import torch
from torch import nn

from cl2r_bench.data.datasets import ImageSet

TABLE_BATCH = 4096
"""Items a forward of the table takes at once."""


class FrozenOutputs:
    """A frozen model's ``(logits, raw features)`` of each batch, in float32 and without gradient: read from a table
    of ``items`` built here once, where each batch names its items as rows of ``items``, or, with ``items`` None,
    the model run on the batch. The model must already be frozen (eval mode)."""

    def __init__(self, model: nn.Module, items: torch.Tensor | None, amp_dtype: torch.dtype | None) -> None:
        self.model = model
        self.table: tuple[torch.Tensor, torch.Tensor] | None = None
        if items is not None:
            with torch.autocast(items.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                chunks = [self._run(items[start:start + TABLE_BATCH]) for start in range(0, len(items), TABLE_BATCH)]
            self.table = torch.cat([logits for logits, _ in chunks]), torch.cat([raw for _, raw in chunks])

    def __call__(self, batch: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logits, raw features)`` of ``batch``, whose items are the table's rows ``rows``."""
        if self.table is None:
            return self._run(batch)
        return self.table[0][rows], self.table[1][rows]

    def _run(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            logits, raw_features = self.model(batch)
        return logits.float(), raw_features.float()


def frozen_outputs(model: nn.Module | None, new: ImageSet, memory: ImageSet | None,
                   amp_dtype: torch.dtype | None) -> FrozenOutputs | None:
    """``model``'s :class:`FrozenOutputs` for a task of ``new`` and ``memory`` (None without a model): on features
    a table of every row of ``new`` then ``memory`` (``memory``'s rows after ``new``'s, as
    :attr:`DeviceBatches.last_rows` numbers them); on images the model on each batch."""
    if model is None:
        return None
    if new.are_images:
        return FrozenOutputs(model, None, amp_dtype)
    return FrozenOutputs(model, new.images if memory is None else torch.cat([new.images, memory.images]), amp_dtype)
