"""CoReS: the fixed d-Simplex classifier trained with plain cross-entropy on replay batches (METHODS.md §6).

ER's loss (:mod:`strategies.er`) on the d-Simplex head. No old model: compatibility comes only from the
stationary simplex targets (class y on vertex 1023 - y). At a replacement it starts from the d-Simplex
replacement model, keeps the replay memory and the simplex.
"""
from __future__ import annotations

from typing import ClassVar

from cl2r_bench.strategy import register_strategy

from .er import ExperienceReplay


@register_strategy("cores")
class CoReS(ExperienceReplay):
    loss_summary = 'CE'
    reference = 'Biondi et al., TPAMI 2023 (CoReS)'
    authors_recipe: ClassVar[dict] = {}
    authors_recipe_source = ("none: CoReS's own training code is not at hand, and the IAM-CL2R code (ER's recipe) "
                             "trains no CoReS")
    head = "dsimplex"
