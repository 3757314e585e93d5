"""UniBCT (Zhang et al., IJCAI 2022): ArcFace against old prototypes refined by the new model's graph (§6b).

"Towards universal backward-compatible representation learning" (METHODS.md §6b): the new model is trained to
classify its features against the old model's class prototypes, made from the old features of the data the new
model trains on (so new classes get prototypes too) and refined by the new model's structure of that data.

    L = CE(W phi_t(x), y) + weight * CE(s * arc_m(cos(phi_t(x), p_c)), y)
    arc_m: cos(theta_{y}) -> cos(theta_{y} + m) for the target prototype (ArcFace), s = 30, m = 0.3
    p_c = mean_i O~_i,   O~ = (1 - lambda) (I - lambda S)^{-1} O                (``refinement: graph``)
    S_ij = softmax_j(n_i . n_j / tau) over j != i (rows sum to 1),   lambda = 0.9, tau = 0.05

per class c, with ``O`` the old model's and ``n`` the new model's unit features of the class's images: the closed
form of label propagation along the new model's affinities, each old feature replaced by a mix of its class-mates'
that the new model finds close, so that the new model's structure of the class moves its prototype. ``transition:
columns`` normalises each column instead, as the public reimplementation does (MixBCT, ``softmax(edges, dim=0)``):
then ``1^T S = 1^T``, so ``mean_i O~_i`` is exactly the plain class mean and the refinement changes nothing
(METHODS.md §6b shows the algebra; a test checks it). ``refinement: none`` takes the plain class means of the old
unit features, as the reference implementation does (``Ashespt/AdvBCT``, ``COMP_LOSS.TYPE: uni_bct``, there over the old
classes only: ``centre_classes: old``). The refinement's lambda and tau are those of the public reimplementation in
MixBCT (the paper's own code is not released); METHODS.md §6b says what comes from where. Prototypes are made once per
task, in ``before_task``, from the task's new data and the replay memory, with the model the task starts from as the new
model: in a stream it is already trained (the previous task's, or the replacement), so the graph is meaningful from the
first iteration. The old model is the teacher of ``cl2r_bench/strategy.py``: at a replacement, by default, the model
deployed before it (``replacement_teacher: outgoing``: UniBCT trains the new model against the deployed one's
prototypes; ``incoming`` anchors the replacement to itself, as the IAM-CL2R code's shared loop does). At CL2R task 0 (no
old model) the loss is CE.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cl2r_bench.class_regions import CENTRE_CLASSES
from cl2r_bench.models import embed, same_features
from cl2r_bench.plugin_settings import setting
from cl2r_bench.strategy import REPLACEMENT_TEACHERS, Step, Strategy, TaskContext, register_strategy

from .advbct import ADVBCT_TRAINER_RECIPE

REFINEMENTS = ("graph", "none")
TRANSITIONS = {"rows": 1, "columns": 0}
"""The softmax dimension of each ``transition``."""
COSINE_LIMIT = 1 - 1e-7
"""Cosines are clamped to ``[-COSINE_LIMIT, COSINE_LIMIT]`` before the arc-cosine, whose slope is infinite at +-1."""


@dataclass(frozen=True)
class UniBCTConfig:
    weight: float = 1.0
    scale: float = 30.0
    margin: float = 0.3
    refinement: str = setting("graph", choices=REFINEMENTS)
    propagation: float = setting(0.9, at_least=0, below=1)
    affinity_temperature: float = setting(0.05, above=0)
    transition: str = setting("rows", choices=tuple(TRANSITIONS))
    centre_classes: str = setting("seen", choices=CENTRE_CLASSES)
    replacement_teacher: str = setting("outgoing", choices=REPLACEMENT_TEACHERS)


def refined_prototype(old: torch.Tensor, new: torch.Tensor, propagation: float, temperature: float,
                      transition: str) -> torch.Tensor:
    """``mean_i O~_i`` of one class from its old and new unit features (rows), in float64; the softmax normalises
    the affinities over each row (``rows``) or each column (``columns``)."""
    old, new = old.double(), new.double()
    affinity = (new @ new.t() / temperature).fill_diagonal_(float("-inf"))
    steps = torch.softmax(affinity, dim=TRANSITIONS[transition]) if len(new) > 1 else torch.ones_like(affinity)
    eye = torch.eye(len(new), dtype=new.dtype, device=new.device)
    return ((1 - propagation) * torch.linalg.solve(eye - propagation * steps, old)).mean(dim=0)


def class_prototypes(old: torch.Tensor, new: torch.Tensor | None, labels: torch.Tensor, classes: list[int],
                     num_classes: int, config: UniBCTConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """``(prototypes, row_of_label)``: one unit prototype per class of ``classes`` from unit ``old`` (and ``new``
    with ``refinement: graph``) features; ``row_of_label[y]`` is y's row or -1."""
    rows = []
    for label in classes:
        members = labels == label
        if config.refinement == "graph":
            rows.append(refined_prototype(old[members], new[members], config.propagation,
                                          config.affinity_temperature, config.transition))
        else:
            rows.append(old[members].double().mean(dim=0))
    row_of_label = torch.full((num_classes,), -1, dtype=torch.long, device=old.device)
    row_of_label[classes] = torch.arange(len(classes), device=old.device)
    return F.normalize(torch.stack(rows).float(), dim=1), row_of_label


def arcface_logits(cosine: torch.Tensor, targets: torch.Tensor, scale: float, margin: float) -> torch.Tensor:
    """``s * cos(theta + m * onehot(target))``."""
    angle = torch.acos(cosine.clamp(-COSINE_LIMIT, COSINE_LIMIT))
    return scale * torch.cos(angle + margin * F.one_hot(targets, cosine.shape[1]))


def prototype_loss(features: torch.Tensor, labels: torch.Tensor, prototypes: torch.Tensor,
                   row_of_label: torch.Tensor, scale: float, margin: float) -> torch.Tensor:
    """The ArcFace cross-entropy of the samples whose class has a prototype (0 when none has)."""
    rows = row_of_label[labels]
    keep = rows >= 0
    if not bool(keep.any()):
        return features.new_zeros(())
    cosine = F.normalize(features[keep], dim=1) @ prototypes.t()
    return F.cross_entropy(arcface_logits(cosine, rows[keep], scale, margin), rows[keep])


@register_strategy("unibct")
class UniBCT(Strategy):
    loss_summary = "`CE + ArcFace(φ_t against old prototypes refined by the new model's affinities, s 30, m 0.3)`"
    reference = 'Zhang et al., IJCAI 2022'
    authors_recipe = ADVBCT_TRAINER_RECIPE
    authors_recipe_source = ("Ashespt/AdvBCT's reimplementation, whose classifier, scale and margin the loss reads "
                             "(UniBCT's own code is not released): train.py L72-74, L134, configs/new_uniBCT.yml "
                             "L38 (SGD 0.1, MultiStepLR [5, 10, 20] x 0.1, 30 epochs)")
    head = "learnable"
    uses_memory = True
    needs_teacher = True
    Config = UniBCTConfig

    def __init__(self, config: UniBCTConfig) -> None:
        super().__init__(config)
        self.prototypes: torch.Tensor | None = None
        self.row_of_label: torch.Tensor | None = None

    def before_task(self, context: TaskContext) -> None:
        self.prototypes = self.row_of_label = None
        if not context.has_teacher:
            return
        data = context.seen_data
        _, old, labels = context.teacher_outputs(data)
        new = None
        if self.config.refinement == "graph":
            if context.model is None:
                raise ValueError("UniBCT's graph refinement needs the trained model: TaskContext.model must be given")
            new = (F.normalize(old, dim=1) if same_features(context.model, context.teacher)
                   else embed(context.model, data.images, amp=context.amp).to(old.device))
        limit = context.num_old_classes if self.config.centre_classes == "old" else context.num_seen_classes
        classes = labels[labels < limit].unique().tolist()
        if classes:
            self.prototypes, self.row_of_label = class_prototypes(F.normalize(old, dim=1), new, labels, classes,
                                                                  context.num_seen_classes, self.config)

    def loss(self, step: Step) -> torch.Tensor:
        ce = F.cross_entropy(step.logits, step.targets)
        if self.prototypes is None:
            return self.terms(classification=ce)
        return self.terms(classification=ce, prototype=self.config.weight * prototype_loss(
            step.features, step.labels, self.prototypes, self.row_of_label, self.config.scale, self.config.margin))
