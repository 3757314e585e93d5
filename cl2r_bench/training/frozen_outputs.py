"""The frozen teacher's and independent model's outputs of every training item, computed once per task where an item
is the same at every draw (docs/METHODS.md §4b).

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
import torch.nn.functional as F
from torch import nn

from cl2r_bench.data.datasets import ImageSet

TABLE_BATCH = 4096
"""Items a forward of the table takes at once."""


class FrozenOutputs:
    """``(logits, raw features)`` of a frozen model for every row of ``new`` then ``memory`` (``memory``'s rows after
    ``new``'s, as :attr:`DeviceBatches.last_rows` numbers them), in float32."""

    def __init__(self, model: nn.Module, new: ImageSet, memory: ImageSet | None,
                 amp_dtype: torch.dtype | None) -> None:
        items = new.images if memory is None else torch.cat([new.images, memory.images])
        device_type = items.device.type
        logits, features = [], []
        with torch.no_grad(), torch.autocast(device_type, dtype=amp_dtype, enabled=amp_dtype is not None):
            for start in range(0, len(items), TABLE_BATCH):
                chunk_logits, chunk_features = model(items[start:start + TABLE_BATCH])
                logits.append(chunk_logits.float())
                features.append(chunk_features.float())
        self.logits, self.raw_features = torch.cat(logits), torch.cat(features)

    def rows(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logits, raw features)`` of the items ``rows``."""
        return self.logits[rows], self.raw_features[rows]

    def normalized_features(self, rows: torch.Tensor) -> torch.Tensor:
        """The unit features of the items ``rows``."""
        return F.normalize(self.raw_features[rows], dim=1)


def frozen_tables(teacher: nn.Module | None, independent: nn.Module | None, new: ImageSet,
                  memory: ImageSet | None, amp_dtype: torch.dtype | None
                  ) -> tuple[FrozenOutputs | None, FrozenOutputs | None]:
    """The teacher's and the independent model's tables when the items are drawn as they are (features), else
    ``(None, None)``: the models then run on each batch. Both models must already be frozen (eval mode)."""
    if new.are_images:
        return None, None
    return tuple(None if model is None else FrozenOutputs(model, new, memory, amp_dtype)
                 for model in (teacher, independent))
