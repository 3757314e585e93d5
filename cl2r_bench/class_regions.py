"""The old model's class regions that LCE, UniBCT and AdvBCT constrain the new model to (METHODS.md §6b).

Each class is summarised from the old model's L2-normalised features of its training images: a centre (their mean,
not re-normalised) and the spread of its items around it, a radius with outliers removed by the 1.5 IQR rule, as the
authors' ``extract_feat.py`` (``gen_class_meta`` for distances, ``gen_class_theta`` for angles) does before
training. Here the summary is made in each task's ``before_task`` from the teacher's features of the data the task
can see (its new data and the replay memory), for the classes chosen by ``centre_classes``:

* ``old``: the classes seen before this task (labels ``< num_old_classes``: the replay memory's, and in the
  two-model protocol the old model's classes among the new training data), as the reference code, whose class
  summaries cover the old model's training set only;
* ``seen``: every class with data in the task, the new ones too (the class-mean extension BCT's synthesised
  classifier makes, ``strategies/bct.py``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cl2r_bench.strategy import TaskContext

CENTRE_CLASSES = ("old", "seen")


@dataclass
class ClassRegions:
    """Per label ``0..num_classes-1``.

    Attributes:
        centres: mean of the old model's unit features of the class (not re-normalised; zeros where absent).
        present: the class has a centre.
        distance_radius: the largest distance ``||f - centre||`` of the class's unit features left by the 1.5 IQR
            rule (AdvBCT's ``r``); NaN where fewer than two remain.
        angle_radius: the largest angle ``arccos(f . centre / |centre|)`` left by the rule (LCE's ``theta`` in
            ``Ashespt/AdvBCT``); NaN likewise.
        cosine_floor: the smallest cosine of the class's unit features to its unit centre, every item counted (LCE's
            boundary in its authors' code, ``IrvingMeng/LCE``'s ``old_class_cos``); NaN where absent.
    """

    centres: torch.Tensor
    present: torch.Tensor
    distance_radius: torch.Tensor
    angle_radius: torch.Tensor
    cosine_floor: torch.Tensor

    @property
    def unit_centres(self) -> torch.Tensor:
        return F.normalize(self.centres, dim=1)


def largest_inlier(values: list[float]) -> tuple[float, int]:
    """``(largest value kept, how many kept)`` by the reference's 1.5 IQR rule: sorted values, ``q1`` / ``q3`` at
    indices ``n // 4`` / ``3n // 4``, values outside ``[q1 - 1.5 IQR, q3 + 1.5 IQR]`` dropped when ``n >= 4``;
    all values are kept when the rule would drop every one."""
    ordered = sorted(values)
    n = len(ordered)
    kept = ordered
    if n >= 4:
        q1, q3 = ordered[n // 4], ordered[3 * n // 4]
        spread = q3 - q1
        kept = [v for v in ordered if q1 - 1.5 * spread <= v <= q3 + 1.5 * spread] or ordered
    return kept[-1], len(kept)


def class_regions(unit_features: torch.Tensor, labels: torch.Tensor, classes: torch.Tensor,
                  num_classes: int) -> ClassRegions:
    """The regions of ``classes`` from unit-norm ``unit_features`` (float64 sums, so a region does not depend on
    the order of its items)."""
    device = unit_features.device
    centres = torch.zeros(num_classes, unit_features.shape[1], device=device)
    present = torch.zeros(num_classes, dtype=torch.bool, device=device)
    distance = torch.full((num_classes,), math.nan, device=device)
    angle = torch.full((num_classes,), math.nan, device=device)
    floor = torch.full((num_classes,), math.nan, device=device)
    for label in classes.tolist():
        rows = unit_features[labels == label].double()
        if not len(rows):
            continue
        centre = rows.mean(dim=0)
        centres[label], present[label] = centre.float(), True
        distances = (rows - centre).norm(dim=1).tolist()
        cosines = rows @ (centre / centre.norm())
        floor[label] = float(cosines.min())
        angles = torch.acos(cosines.clamp(max=1.0)).tolist()
        for radii, values in ((distance, distances), (angle, angles)):
            largest, kept = largest_inlier(values)
            if kept > 1:
                radii[label] = largest
    return ClassRegions(centres, present, distance, angle, floor)


def task_regions(context: TaskContext, centre_classes: str) -> ClassRegions | None:
    """The teacher's regions of the classes ``centre_classes`` names, from the task's data and the replay memory;
    None without a teacher."""
    if not context.has_teacher:
        return None
    data = context.seen_data
    _, features, labels = context.teacher_outputs(data)
    unit = F.normalize(features.float(), dim=1)
    limit = context.num_old_classes if centre_classes == "old" else context.num_seen_classes
    classes = labels[labels < limit].unique()
    return class_regions(unit, labels, classes, context.num_seen_classes)
