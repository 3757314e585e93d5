"""d-Simplex-FD (CL2R): the fixed d-Simplex classifier + feature distillation (METHODS.md §6).

The loss, the ``lambda_t`` rule and the options are those of :mod:`strategies.fd`; only the head differs: the
frozen d-Simplex classifier (K = 1024, class y on vertex 1023 - y), so the retrieval feature distilled is the
1023-d lifted vector. At a replacement the model starts from the d-Simplex replacement model and, by default,
distils towards the model deployed before it (``replacement_teacher: outgoing``, :mod:`strategies.fd`); the fixed
classifier is the same simplex before and after, which is what keeps the spaces aligned.
"""
from __future__ import annotations

from cl2r_bench.strategy import register_strategy

from .fd import FeatureDistillation


@register_strategy("dsimplex_fd")
class DSimplexFD(FeatureDistillation):
    loss_summary = "`CE + λ_t·mean(1 − cos(φ_t, φ_old))` on old classes' samples, `λ_t = 5·sqrt(new/old classes)`"
    reference = 'Biondi et al., TOMM 2023 (CL2R)'
    head = "dsimplex"
