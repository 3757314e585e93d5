"""Batched training augmentation on whatever device the images live on (METHODS.md §4: crop 32 pad 4, flip).

Images stay uint8 on the device (the GPU when there is one); each mini-batch is augmented there, so no per-image
CPU work sits on the training path. Normalisation is not an augmentation: the model owns it
(:func:`cl2r_bench.models.normalize`, applied by :class:`cl2r_bench.models.RetrievalModel`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

CROP_PADDING = 4


def crop_flip_draws(count: int, device: torch.device,
                    padding: int = CROP_PADDING) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(top, left, flip)`` of ``count`` images: crop offsets in ``0..2*padding`` and a flip with probability 1/2,
    drawn from the global random stream in this order (a data-parallel run draws them for the global batch on every
    rank and applies its share: :class:`cl2r_bench.training.engine.DeviceBatches`)."""
    top = torch.randint(0, 2 * padding + 1, (count,), device=device)
    left = torch.randint(0, 2 * padding + 1, (count,), device=device)
    return top, left, torch.rand(count, device=device) < 0.5


def crop_flip(images: torch.Tensor, top: torch.Tensor, left: torch.Tensor, flip: torch.Tensor,
              padding: int = CROP_PADDING) -> torch.Tensor:
    """Crop each image at ``(top, left)`` of its zero-padded copy and flip it where ``flip``."""
    n, _, h, w = images.shape
    dev = images.device
    padded = F.pad(images, (padding,) * 4)
    rows = (top[:, None] + torch.arange(h, device=dev))[:, :, None]
    cols = left[:, None] + torch.arange(w, device=dev)
    cols = torch.where(flip[:, None], cols.flip(1), cols)[:, None, :]
    batch = torch.arange(n, device=dev)[:, None, None]
    return padded.permute(0, 2, 3, 1)[batch, rows, cols].permute(0, 3, 1, 2)


def random_crop_flip(images: torch.Tensor, padding: int = CROP_PADDING) -> torch.Tensor:
    """Per-image random crop (zero padding ``padding``) and horizontal flip with probability 1/2."""
    return crop_flip(images, *crop_flip_draws(len(images), images.device, padding), padding=padding)
