"""Batched image transforms on whatever device the images live on (METHODS.md §4: crop 32 pad 4, flip, normalise).

Images stay uint8 on the device (the GPU when there is one); each mini-batch is augmented and normalised there,
so no per-image CPU work sits on the training path.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def normalize(images: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """uint8 ``N x 3 x H x W`` -> float, scaled to [0, 1] then standardised per channel."""
    mean_t = torch.tensor(mean, device=images.device).view(1, -1, 1, 1)
    std_t = torch.tensor(std, device=images.device).view(1, -1, 1, 1)
    return (images.float() / 255.0 - mean_t) / std_t


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
