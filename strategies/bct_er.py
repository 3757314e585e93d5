"""BCT-ER: BCT (:mod:`strategies.bct`, same loss and options) with the replay memory (METHODS.md §6).

Batches mix 64 replay + 64 new samples from task 1 on, so old classes reach both the new classifier and the
frozen old one; class means for ``W_old`` rows the old model was not trained on come from the new data and the
memory (at a replacement with ``replacement_teacher: incoming``: every seen class).
"""
from __future__ import annotations

from cl2r_bench.strategy import register_strategy

from .bct import BCT


@register_strategy("bct_er")
class BCTER(BCT):
    loss_summary = 'BCT with replay'
    reference = "Shen et al., CVPR 2020 (with the CL2R papers' replay)"
    uses_memory = True
