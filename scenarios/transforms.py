"""Batched training augmentation on whatever device the images live on (METHODS.md §4: crop 32 pad 4, flip).

Images stay uint8 on the device (the GPU when there is one); each mini-batch is augmented there, so no per-image
CPU work sits on the training path. Normalisation is not an augmentation: the model owns it
(:func:`cl2r_bench.models.normalize`, applied by :class:`cl2r_bench.models.RetrievalModel`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def random_crop_flip(images: torch.Tensor, padding: int = 4) -> torch.Tensor:
    """Per-image random crop (zero padding ``padding``) and horizontal flip with probability 1/2."""
    n, _, h, w = images.shape
    dev = images.device
    padded = F.pad(images, (padding,) * 4)
    top = torch.randint(0, 2 * padding + 1, (n,), device=dev)
    left = torch.randint(0, 2 * padding + 1, (n,), device=dev)
    rows = (top[:, None] + torch.arange(h, device=dev))[:, :, None]
    cols = left[:, None] + torch.arange(w, device=dev)
    flip = torch.rand(n, device=dev) < 0.5
    cols = torch.where(flip[:, None], cols.flip(1), cols)[:, None, :]
    batch = torch.arange(n, device=dev)[:, None, None]
    return padded.permute(0, 2, 3, 1)[batch, rows, cols].permute(0, 3, 1, 2)
