"""Parity of OCA with the authors' code on one batch (results/parity/README.md).

    python -m tools.parity.oca --oca REF/OCA [--reference-python PYTHON] [--out results/parity/oca.json]

The same widened features, old-model features, labels and orthogonal-layer and classifier weights go to both codes:
``oca_probe.py`` runs, under the reference's Python, the authors' ``train_OCA.main`` (``z3n0e/OCA``, their
``configs/train/cifar100_OCA.yaml`` with small widths) up to one iteration of ``OCATrainer.train`` on their
``ResNet50_OCA``, and their ``eval.main`` on the two OCA evaluation configurations; this script runs the suite's
``OrthogonalTransformationHead`` and ``strategies/oca.py`` (``before_task`` for the pseudo-classifier, ``loss`` at its
defaults). The authors' backbone outputs the widened feature itself; the suite's head widens a fixed-width backbone's
output with a linear layer (``compatible`` and ``added``), whose output is the feature both sides are given: a row
checks that the gradients of that layer are the authors' feature gradient chained through it. Each row reports the
largest absolute difference. Each loss term moves the loss by more than 0.05 on these inputs (the ``differences``
entry; ``tests/strategies/test_oca.py`` checks it), so a loss that agrees checks every term.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.retrieval import common_width
from cl2r_bench.data.datasets import ImageSet
from cl2r_bench.heads import OrthogonalTransformationHead
from strategies import Step, TaskContext, get_strategy
from tools.parity.common import (
    ROOT,
    provenance,
    reference_checkout,
    reference_python,
    run_reference_probe,
)
from tools.parity.steps import row

BACKBONE_WIDTH, OLD_WIDTH, ADDED, CLASSES, BATCH = 40, 48, 16, 6, 18
"""A backbone narrower than the widened feature (48 + 16 = 64), so that the widening layer is not square."""
TOLERANCE = 1e-5
WEIGHTS = {"classification_weight": 5.0, "influence_weight": 10.0, "alignment_weight": 5.0}
"""What ``trainers/OCA_trainer.py`` computes (``5 * loss_ce + 10 * loss_bct + 5 * loss_cosine``): the suite's
defaults. The configuration's ``lambda_1``-``lambda_3`` are never read."""
TERMS = {"classification": "classification_weight", "influence": "influence_weight", "alignment": "alignment_weight"}
REFERENCE_NAMES = {"classifier.weight": "fc_out.weight", "transform.bias": "fc_orth.bias",
                   "transform.parametrizations.weight.original": "fc_orth.parametrizations.weight.original",
                   "transform.parametrizations.weight.0.base": "fc_orth.parametrizations.weight.0.base"}


def new_head() -> OrthogonalTransformationHead:
    return OrthogonalTransformationHead(BACKBONE_WIDTH, CLASSES, old_width=OLD_WIDTH, added_dims=ADDED)


def batch_inputs(seed: int = 0) -> dict:
    """Three images of each of six classes: backbone features (non-negative, as after a ReLU and an average pool),
    the old model's unit features around class directions, and a seeded head whose orthogonal layer is moved away
    from its initial base (so that the matrix exponential is not the identity)."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(CLASSES).repeat(BATCH // CLASSES)
    directions = torch.randn(CLASSES, OLD_WIDTH, generator=gen)
    old = F.normalize(directions[labels] + 0.6 * torch.randn(BATCH, OLD_WIDTH, generator=gen), dim=1)
    torch.manual_seed(seed)
    head = new_head()
    with torch.no_grad():
        head.transform.parametrizations.weight.original.copy_(
            0.3 * torch.randn(OLD_WIDTH + ADDED, OLD_WIDTH + ADDED, generator=gen))
        head.classifier.weight.mul_(20.0)
    return {"backbone_features": torch.rand(BATCH, BACKBONE_WIDTH, generator=gen) * 2, "labels": labels,
            "old_features": old, "head": head.state_dict(), "classes": CLASSES,
            "widths": {"backbone": BACKBONE_WIDTH, "old": OLD_WIDTH, "added": ADDED}}


def reference_inputs(inputs: dict) -> dict:
    """What the probe reads besides the batch: the widened feature (the authors' backbone output) and the head's
    weights under ``ResNet_OCA``'s names."""
    head = new_head()
    head.load_state_dict(inputs["head"])
    with torch.no_grad():
        widened = torch.cat([head.compatible(inputs["backbone_features"]), head.added(inputs["backbone_features"])],
                            dim=1)
    return {**inputs, "reference_features": widened,
            "reference_state": {theirs: inputs["head"][ours] for ours, theirs in REFERENCE_NAMES.items()}}


class Teacher(nn.Module):
    """The old model as ``TaskContext.teacher_outputs`` runs it: the images are the items' indices, the features
    three times the unit old features (so that the strategy's normalisation is exercised)."""

    def __init__(self, features: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("table", 3.0 * features)
        self.unused = nn.Parameter(torch.zeros(1))

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.table[images.flatten(1)[:, 0].long()]
        return rows.new_zeros(len(rows), CLASSES), rows


def task_context(inputs: dict) -> TaskContext:
    labels = inputs["labels"]
    images = torch.arange(len(labels), dtype=torch.uint8)[:, None, None, None]
    return TaskContext(index=1, num_old_classes=0, num_new_classes=CLASSES, teacher=Teacher(inputs["old_features"]),
                       new_data=ImageSet(images, labels), amp=False)


def suite_iteration(inputs: dict, params: dict | None = None) -> dict:
    """The suite's pseudo-classifier, loss and gradients on the batch (gradients under the reference's names; the
    widened feature's is the gradient at the widening layer's output), with the widening layer's own gradients."""
    strategy = get_strategy("oca").from_params(params or {})
    strategy.before_task(task_context(inputs))
    head = new_head()
    head.load_state_dict(inputs["head"])
    features = nn.Parameter(inputs["backbone_features"].clone())
    widened: dict[str, torch.Tensor] = {}

    def keep(name: str):
        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
            output.retain_grad()
            widened[name] = output
        return hook

    hooks = [head.compatible.register_forward_hook(keep("compatible")), head.added.register_forward_hook(keep("added"))]
    logits, retrieval = head(features)
    for hook in hooks:
        hook.remove()
    labels = inputs["labels"]
    step = Step(labels=labels, targets=labels, logits=logits, features=retrieval,
                from_memory=torch.zeros(len(labels), dtype=torch.bool),
                teacher_raw_features=3.0 * inputs["old_features"])
    loss = strategy.loss(step)
    loss.backward()
    grads = {"resnet.features": torch.cat([widened["compatible"].grad, widened["added"].grad], dim=1),
             "fc_out.weight": head.classifier.weight.grad, "fc_orth.bias": head.transform.bias.grad,
             "fc_orth.parametrizations.weight.original": head.transform.parametrizations.weight.original.grad}
    widening = {"compatible.weight": head.compatible.weight.grad, "compatible.bias": head.compatible.bias.grad,
                "added.weight": head.added.weight.grad, "added.bias": head.added.bias.grad,
                "backbone features": features.grad}
    return {"loss": loss.detach(), "grads": grads, "widening": widening,
            "pseudo_classifier": strategy.pseudo_classifier, "retrieval": retrieval.detach(),
            "orthogonal": head.transform.weight.detach(), "classifier_input": head.transform(retrieval).detach(),
            "head": head}


def chained(feature_grad: torch.Tensor, inputs: dict, head: OrthogonalTransformationHead) -> dict:
    """The widening layer's gradients given the gradient at its output (theirs at their backbone's output)."""
    h = inputs["backbone_features"]
    old, added = feature_grad[:, :OLD_WIDTH], feature_grad[:, OLD_WIDTH:]
    return {"compatible.weight": old.t() @ h, "compatible.bias": old.sum(dim=0), "added.weight": added.t() @ h,
            "added.bias": added.sum(dim=0),
            "backbone features": old @ head.compatible.weight.detach() + added @ head.added.weight.detach()}


def suite_distances(ours: dict, inputs: dict) -> dict[str, torch.Tensor]:
    """1 - cosine of the suite's retrieval features, new/new and new/old (cut to the common width as
    ``benchmarks.retrieval.common_width`` cuts them; the cut query renormalised, which changes no ranking)."""
    new = F.normalize(ours["retrieval"], dim=1)
    queries, gallery = common_width(new, inputs["old_features"])
    return {"new/new": 1 - new @ new.t(), "new/old": 1 - F.normalize(queries, dim=1) @ gallery.t()}


def ulp(value: float) -> float:
    """The spacing of float32 numbers at ``value``: the loss's rounding."""
    return float(torch.finfo(torch.float32).eps * 2.0 ** torch.tensor(abs(value)).log2().floor())


def largest(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[name].reshape(b[name].shape) - b[name]).abs().max()) for name in b)


def term_moves(inputs: dict) -> dict:
    """How much each term (and the label smoothing, and the configuration's CE weight 1) moves the default loss."""
    full = float(suite_iteration(inputs)["loss"])
    moves = {term: full - float(suite_iteration(inputs, {weight: 0.0})["loss"]) for term, weight in TERMS.items()}
    moves["label smoothing"] = abs(full - float(suite_iteration(inputs, {"label_smoothing": 0.0})["loss"]))
    moves["configuration's CE weight 1"] = full - float(suite_iteration(inputs, {"classification_weight": 1.0})["loss"])
    return moves


def compare(reference: dict, inputs: dict) -> tuple[list[dict], list[dict]]:
    ours = suite_iteration(inputs)
    rows = [row("oca: pseudo-classifier (the strategy's before_task against train_OCA.py's class means of the old "
                "model's features)", float((ours["pseudo_classifier"] - reference["pseudo_classifier"]).abs().max()),
                TOLERANCE, f"{CLASSES} classes x {OLD_WIDTH}; the suite's teacher gives 3x the unit features, theirs "
                           "the unit ones (their old ResNet50 normalises)")]
    rows.append(row("oca: loss of one training iteration", float((ours["loss"] - reference["loss"]).abs()),
                    TOLERANCE, f"OCATrainer.train: 5 CE + 10 BCT + 5 cosine, label smoothing "
                               f"{reference['label_smoothing']} (their yaml's); widths old {OLD_WIDTH} / added "
                               f"{ADDED}; theirs {float(reference['loss']):.6f}, ours {float(ours['loss']):.6f} "
                               f"(one float32 step there: {ulp(float(reference['loss'])):.2g})"))
    for term, weight in TERMS.items():
        alone = {name: (1.0 if name == weight else 0.0) for name in TERMS.values()}
        value = float(suite_iteration(inputs, alone)["loss"])
        rows.append(row(f"oca: {term} term alone", abs(value - reference["terms"][term]), TOLERANCE,
                        f"theirs {reference['terms'][term]:.6f}, ours {value:.6f}"))
    theirs = reference["grads"]
    rows.append(row(f"oca: gradient w.r.t. the widened feature, the classifier and the orthogonal layer "
                    f"({len(ours['grads'])} tensors)", largest(theirs, ours["grads"]), TOLERANCE,
                    "the orthogonal layer through torch's orthogonal parametrisation (original weight) and its bias"))
    rows.append(row("oca: the suite's widening layer: its gradients are their feature gradient chained through it "
                    "(5 tensors)", largest(chained(theirs["resnet.features"].flatten(1), inputs, ours["head"]),
                                           ours["widening"]), TOLERANCE,
                    "weights, biases and the backbone output; the layer the suite adds to widen a fixed-width "
                    "backbone"))
    q, their_q = ours["orthogonal"], reference["orthogonal"]
    rows.append(row("oca: the orthogonal matrix Q (their fc_orth.weight against the suite's transform.weight)",
                    float((q - their_q).abs().max()), TOLERANCE,
                    f"{len(q)} x {len(q)}: base @ matrix_exp(A - Aᵀ), A the lower triangle of the stored weight"))
    rows.append(row("oca: Q is orthogonal (the largest absolute entry of Q Qᵀ - I, either side)",
                    max(float((m @ m.t() - torch.eye(len(m))).abs().max()) for m in (q, their_q)), TOLERANCE,
                    "torch's orthogonal parametrisation on both sides"))
    distances = suite_distances(ours, inputs)
    for case in ("new/new", "new/old"):
        rows.append(row(f"oca: retrieval distances, {case} (their eval.py's cmc_evaluate against the suite's "
                        "retrieval features)", float((distances[case] - reference["distances"][case]).abs().max()),
                        TOLERANCE, "ResNet_OCA's fourth output (new_feature, before the orthogonal layer)"
                        + ("; both cut to the old width" if case == "new/old" else "")))
    moved = F.normalize(ours["classifier_input"], dim=1)
    differences = [{"name": "how much each term moves the default loss on these inputs (each above 0.05, so the "
                            "loss row checks it)", **term_moves(inputs),
                    "note": "the loss less the loss with that weight at 0 (label smoothing: at 0; the last: the "
                            "configuration's reading, CE weight 1 instead of the trainer's 5)"},
                   {"name": "the new/new distances had the suite ranked the orthogonal layer's output Q f + c",
                    "max_abs_diff": float(((1 - moved @ moved.t()) - reference["distances"]["new/new"]).abs().max()),
                    "note": "so the retrieval rows tell the two features apart"}]
    return rows, differences


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--oca", required=True, help="a checkout of z3n0e/OCA")
    parser.add_argument("--reference-python", help="a Python with torch, torchvision, tqdm, pyyaml, scikit-learn and "
                                                   "accelerate (default: venv/bin/python beside the checkout)")
    parser.add_argument("--out", default=str(ROOT / "results/parity/oca.json"))
    args = parser.parse_args(argv)
    oca = reference_checkout(args.oca, "trainers/OCA_trainer.py", "z3n0e/OCA")
    python = reference_python(args.reference_python, oca, "make the reference's environment")
    inputs = batch_inputs()
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        torch.save(reference_inputs(inputs), work / "inputs.pt")
        reference = run_reference_probe(python, "oca_probe.py", "--oca", oca, work)
    rows, differences = compare(reference, inputs)
    Path(args.out).write_text(json.dumps({**provenance({"oca": ("z3n0e/OCA", oca)}), "rows": rows,
                                          "differences": differences}, indent=1) + "\n")
    for r in rows:
        print(f"{'ok ' if r['agree'] else 'NO '} {r['name']}: {r['max_abs_diff']} (tolerance {r['tolerance']})")
    for difference in differences:
        print(f"    {difference['name']}: " + ", ".join(f"{k} {v:.4g}" for k, v in difference.items()
                                                        if isinstance(v, float)))


if __name__ == "__main__":
    main()
