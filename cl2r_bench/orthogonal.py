"""A linear layer with an orthogonal weight (BT²'s and OCA's maps, METHODS.md §6b), trained at the cost of a few
products of the batch with the weight's generator instead of the matrix exponential and its derivative.

:class:`OrthogonalLinear` is ``torch.nn.utils.parametrizations.orthogonal(nn.Linear(n, n))`` (the authors' layer, the
map ``matrix_exp`` with trivialisation): the same parameters, state dict and weight, ``W = B exp(A)`` with ``B`` the
fixed base (the layer's initial orthogonal weight) and ``A = tril(X) - tril(X)ᵀ`` skew-symmetric from the trained
``X``. Only how a training step computes it differs. torch forms ``exp(A)`` (a Taylor polynomial, up to five
``n x n`` products and a squaring per doubling of ``A``'s norm) and back-propagates through the exponential of a
``2n x 2n`` block matrix (eight times the cost of each product): at ``n`` = 544 this is 18-28 times a whole
iteration of ER on the pretrained-backbone track (issue "speed of the orthogonal strategies"). What the layer needs
is the batch times the weight, ``y = x Wᵀ + b = (x exp(-A)) Bᵀ + b`` (``exp(A)ᵀ = exp(-A)`` for a skew-symmetric
``A``), and

    x exp(-A) = sum_k x (-A)^k / k!         (the terms T_k = T_{k-1} (-A) / k, T_0 = x)

costs one ``batch x n`` by ``n x n`` product a term (a quarter of an ``n x n`` product at a batch of 128 and n 544)
and autograd's backward two more. The series stops at the first term whose largest entry is below
:data:`SERIES_TOLERANCE` times the sum's (the rest cannot move a float32 sum); it runs on ``A / s`` ``s`` times
(``exp(-A) = exp(-A/s)^s``) with ``s`` the smallest integer that brings ``A``'s 1-norm to :data:`STEP_NORM`, so the
terms never grow by more than ``e^STEP_NORM`` before they shrink and float32 loses no more than torch's own
polynomial. With ``A`` far from the identity's neighbourhood (1-norm above ``STEP_NORM * MAX_STEPS``) and outside
training (evaluation, embedding galleries: batches of thousands, no gradient) the layer uses torch's weight as is.
``tests/test_orthogonal.py`` checks outputs and gradients against torch's layer within 1e-5.

``orthogonal_map: cayley`` (an option, not the authors' map) is torch's Cayley parametrisation,
``W = B (I - A/2)^{-1} (I + A/2)``, trained as ``y = x (I - A/2) (I + A/2)^{-1} Bᵀ + b = (2 x (I + A/2)^{-1} - x) Bᵀ
+ b``: one LU solve on the batch and no product (:func:`times_cayley`; docs/scale-out.md gives its time against the
series'). It is a different orthogonal map of the same parameters, whose results are compared with the exponential's
before it could become a default (docs/METHODS.md §6b).
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn.utils.parametrizations import orthogonal

SERIES_TOLERANCE = 2.0 ** -26
"""A series term whose largest entry is below this fraction of the sum's largest is the last one summed (float32's
unit round-off is 2^-24; a term a quarter of it and every smaller one after it cannot change the sum)."""
STEP_NORM = 1.0
"""The largest 1-norm of ``A / s``: each step's terms grow at most ``e`` times before they shrink."""
MAX_STEPS = 4
"""Beyond ``MAX_STEPS`` steps the series costs more than torch's exponential; the layer then uses torch's weight."""
POWER_ITERATIONS = 8
ESTIMATE_MARGIN = 1.5
"""Power iteration approaches the largest singular value from below; the step count takes this margin over it."""
AUTHORS_MAP = "matrix_exp"
"""The orthogonal map BT²'s and OCA's authors train with: torch's matrix exponential (the default)."""
ORTHOGONAL_MAPS = (AUTHORS_MAP, "cayley")
"""The maps of :class:`OrthogonalLinear`: the authors' exponential, or torch's Cayley map."""
MAX_TERMS = 40
"""A cap that a step never reaches at ``STEP_NORM`` (``1 / 40!`` is far below any tolerance)."""


def skew_generator(original: torch.Tensor) -> torch.Tensor:
    """``A = tril(X) - tril(X)ᵀ`` of torch's orthogonal parametrisation (``_Orthogonal.forward``, square case)."""
    lower = original.tril()
    return lower - lower.mT


def spectral_norm_estimate(generator: torch.Tensor, iterations: int = POWER_ITERATIONS) -> float:
    """An estimate of ``generator``'s largest singular value from the top of it: power iteration on ``GᵀG`` from the
    column of largest norm, times :data:`ESTIMATE_MARGIN`, and never above the 1-norm (an upper bound for a
    skew-symmetric matrix)."""
    upper = float(generator.abs().sum(dim=0).max())
    vector = generator[:, int(generator.norm(dim=0).argmax())]
    for _ in range(iterations):
        length = vector.norm()
        if float(length) == 0.0:
            return 0.0
        vector = generator.mT @ (generator @ (vector / length))
    return min(upper, ESTIMATE_MARGIN * float(vector.norm()) ** 0.5)


def times_exponential(rows: torch.Tensor, generator: torch.Tensor, spectral_norm: float | None = None) -> torch.Tensor:
    """``rows @ exp(generator)`` by the scaled Taylor series (module docstring); differentiable in both.
    ``spectral_norm``: :func:`spectral_norm_estimate` of ``generator`` when the caller has it."""
    if spectral_norm is None:
        spectral_norm = spectral_norm_estimate(generator.detach())
    steps = max(1, math.ceil(spectral_norm / STEP_NORM))
    step = generator / steps
    for _ in range(steps):
        term, total = rows, rows
        scale = float(total.detach().abs().max())
        for k in range(1, MAX_TERMS + 1):
            term = (term @ step) / k
            total = total + term
            if float(term.detach().abs().max()) <= SERIES_TOLERANCE * scale:
                break
        rows = total
    return rows


def times_cayley(rows: torch.Tensor, generator: torch.Tensor) -> torch.Tensor:
    """``rows @ ((I - A/2)^{-1} (I + A/2))ᵀ = rows (I - A/2) (I + A/2)^{-1}`` for a skew-symmetric ``A``: one solve
    and no product, since ``(I - A/2) (I + A/2)^{-1} = (2I - (I + A/2)) (I + A/2)^{-1} = 2 (I + A/2)^{-1} - I``."""
    eye = torch.eye(len(generator), dtype=generator.dtype, device=generator.device)
    return 2 * torch.linalg.solve(eye + generator / 2, rows, left=False) - rows


class OrthogonalLinear(nn.Linear):
    """``orthogonal(nn.Linear(width, width, bias), orthogonal_map)`` (trivialisation) whose training forward multiplies
    the batch by the map without forming the weight: the exponential's series, or the Cayley map's solve (module
    docstring)."""

    def __init__(self, width: int, *, bias: bool = True, orthogonal_map: str = AUTHORS_MAP) -> None:
        super().__init__(width, width, bias=bias)
        if orthogonal_map not in ORTHOGONAL_MAPS:
            raise ValueError(f"orthogonal_map must be one of {list(ORTHOGONAL_MAPS)}, not {orthogonal_map!r}")
        self.orthogonal_map = orthogonal_map
        orthogonal(self, orthogonal_map=orthogonal_map)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        """``rows Wᵀ + b``: while training with gradients on a batch no larger than the width (in float32, outside
        autocast), by the Cayley map's solve, or by the series when the generator is within ``STEP_NORM *
        MAX_STEPS`` of 0; else from torch's weight."""
        if self.training and torch.is_grad_enabled() and rows.ndim == 2 and len(rows) <= self.in_features:
            parametrization = self.parametrizations.weight
            generator = skew_generator(parametrization.original)
            with torch.autocast(rows.device.type, enabled=False):
                if self.orthogonal_map == "cayley":
                    return self._finish(times_cayley(rows.float(), generator.float()), parametrization)
                norm = spectral_norm_estimate(generator.detach())
                if norm <= STEP_NORM * MAX_STEPS:
                    return self._finish(times_exponential(rows.float(), -generator.float(), norm), parametrization)
        return super().forward(rows)

    def _finish(self, mapped: torch.Tensor, parametrization: nn.Module) -> torch.Tensor:
        """``mapped Bᵀ + b``: the fixed base of the trivialisation, then the bias."""
        rotated = mapped @ parametrization[0].base.mT
        return rotated if self.bias is None else rotated + self.bias
