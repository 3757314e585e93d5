"""Parity with the methods' own authors' code, at the defaults the zoos run (results/parity/README.md §7).

    python -m tools.parity.authors --opencompatible REF/OpenCompatible --lce REF/LCE --mixbct REF/MixBCT \\
        [--reference-python REF/venv/bin/python] [--out results/parity/authors.json]

``authors_probe.py`` runs, under the references' Python, the code of the papers' authors where it is public:
``TencentARC/OpenCompatible`` for RACT (the hot-refresh authors' ``BackwardCompatibleLoss``, ``contra_ract``, one
process), ``IrvingMeng/LCE`` for LCE (its ``train`` and ``save_lcefeat``) and, UniBCT's authors having released
none, ``yuleung/MixBCT``'s reimplementation of UniBCT's prototype refinement. This script runs the suite's
strategies on the same tensors at their defaults and each reference reading, and writes one row per check (the
largest absolute difference against 1e-5) with both sides' commits. Each compatibility term moves its loss by more
than 0.05 on these inputs (``tests/tools/test_parity.py`` checks it), so a row that agrees checks the term.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from cl2r_bench.class_regions import class_regions
from strategies import Step, get_strategy
from strategies.ract import regression_alleviating_loss
from strategies.unibct import UniBCTConfig, class_prototypes
from tools.parity.bct_line import batch_inputs
from tools.parity.common import ROOT, ParityError, provenance, reference_checkout, reference_python
from tools.parity.steps import row

TOLERANCE = 1e-5
LCE_CLASSES, LCE_WIDTH, LCE_PER_CLASS, LCE_BATCH = 6, 32, 10, 12
UNIBCT_CLASSES, UNIBCT_PER_CLASS = 6, 8


def lce_inputs(seed: int = 1) -> dict:
    """Unit old features of every class (10 each, one far from its class), a batch of 12 unit new features (two per
    class, some inside and some outside their class's cosine floor) and a classifier near the class directions."""
    gen = torch.Generator().manual_seed(seed)
    directions = F.normalize(torch.randn(1, LCE_WIDTH, generator=gen) + 0.6 * torch.randn(
        LCE_CLASSES, LCE_WIDTH, generator=gen), dim=1)
    old_labels = torch.arange(LCE_CLASSES).repeat_interleave(LCE_PER_CLASS)
    spread = torch.full((len(old_labels),), 0.4)
    spread[::LCE_PER_CLASS] = 1.2
    old = F.normalize(directions[old_labels] + spread[:, None] * torch.randn(len(old_labels), LCE_WIDTH,
                                                                             generator=gen) / LCE_WIDTH ** 0.5, dim=1)
    labels = torch.arange(LCE_CLASSES).repeat(LCE_BATCH // LCE_CLASSES)
    new_spread = torch.linspace(0.1, 2.0, LCE_BATCH)
    features = F.normalize(directions[labels] + new_spread[:, None] * torch.randn(LCE_BATCH, LCE_WIDTH, generator=gen)
                           / LCE_WIDTH ** 0.5, dim=1)
    return {"lce_old_features": old, "lce_old_labels": old_labels, "lce_features": features, "lce_labels": labels,
            "lce_classifier": directions + 0.3 * torch.randn(LCE_CLASSES, LCE_WIDTH, generator=gen)}


def unibct_inputs(seed: int = 2) -> dict:
    """Unit old and new features of 6 classes, 8 items each, the new ones a rotated, noisier copy."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(UNIBCT_CLASSES).repeat_interleave(UNIBCT_PER_CLASS)
    centres = torch.randn(UNIBCT_CLASSES, 24, generator=gen)
    old = F.normalize(centres[labels] + torch.randn(len(labels), 24, generator=gen), dim=1)
    new = F.normalize(old + 0.7 * torch.randn(len(labels), 24, generator=gen), dim=1)
    return {"unibct_old": old, "unibct_new": new, "unibct_labels": labels}


def ract_rows(inputs: dict, reference: dict) -> list[dict]:
    """The suite's RACT term at its default (the gradient through the new-to-new negatives) against OpenCompatible
    without the gathered batch, and with ``detach_new_negatives`` against their default gathered batch."""
    rows = []
    for detach, gather_all in ((False, False), (True, True)):
        features = nn.Parameter(inputs["features"].clone())
        loss = regression_alleviating_loss(features, F.normalize(inputs["old_raw_features"], dim=1), inputs["labels"],
                                           temperature=0.01, hard_negatives=10, detach_new_negatives=detach)
        loss.backward()
        theirs = reference["ract"][f"gather_all={gather_all}"]
        reading = "the suite's default" if not detach else "detach_new_negatives: true"
        rows.append(row(f"RACT ({reading}) vs BackwardCompatibleLoss(contra_ract, gather_all={gather_all}): loss",
                        float((loss.detach() - theirs["loss"]).abs()), TOLERANCE,
                        f"theirs {float(theirs['loss']):.6f}, ours {float(loss):.6f}; tau 0.01, top-10 negatives"))
        rows.append(row(f"RACT ({reading}) vs gather_all={gather_all}: gradient of the new features",
                        float((features.grad - theirs["features_grad"]).abs().max()), TOLERANCE,
                        "all_gather carries no gradient: gather_all=True makes the other samples' new features "
                        "constants, as detach_new_negatives: true"))
    return rows


def lce_rows(inputs: dict, reference: dict) -> list[dict]:
    """The suite's LCE at its default (``form: authors``) against ``IrvingMeng/LCE``: class centres and cosine floors,
    the loss of one iteration and the gradients of the classifier and of the features."""
    regions = class_regions(inputs["lce_old_features"], inputs["lce_old_labels"], torch.arange(LCE_CLASSES),
                            LCE_CLASSES)
    theirs = reference["lce"]
    rows = [row("LCE: unit class centres (save_lcefeat)", float((regions.unit_centres - theirs["centres"]).abs().max()),
                TOLERANCE, "the normalised mean of each class's unit old features"),
            row("LCE: cosine floor of each class (old_class_cos)",
                float((regions.cosine_floor - theirs["cosines"]).abs().max()), TOLERANCE,
                "the smallest cosine of a class's old features to its centre, every item counted")]
    strategy = get_strategy("lce").from_params({})
    classifier = nn.Linear(LCE_WIDTH, LCE_CLASSES, bias=False)
    with torch.no_grad():
        classifier.weight.copy_(inputs["lce_classifier"])
    strategy.regions, strategy.model = regions, nn.Module()
    strategy.model.head = nn.Module()
    strategy.model.head.classifier = classifier
    features = nn.Parameter(inputs["lce_features"].clone())
    labels = inputs["lce_labels"]
    cosines = F.linear(F.normalize(features, dim=1), F.normalize(classifier.weight, dim=1))   # the cosine head
    loss = strategy.loss(Step(labels=labels, targets=labels, logits=cosines, features=features,
                              from_memory=torch.zeros(len(labels), dtype=torch.bool)))
    loss.backward()
    rows.append(row("LCE (the suite's default, form: authors): loss of one training iteration",
                    float((loss.detach() - theirs["loss"]).abs()), TOLERANCE,
                    f"theirs {float(theirs['loss']):.6f}, ours {float(loss):.6f}; ArcFace (s 16, m 0.1) on their "
                    "normalised classifier + 100 align + 1 boundary"))
    rows.append(row("LCE: gradient of the classifier", float((classifier.weight.grad - theirs["classifier_grad"])
                                                              .abs().max()), TOLERANCE, "ArcFace and the alignment"))
    radial = boundary_radial_part(features.detach(), labels, regions)
    rows.append(row("LCE: gradient of the features, theirs less the radial part the suite's normalisation removes",
                    float((features.grad - (theirs["features_grad"] - radial)).abs().max()), TOLERANCE,
                    "their boundary takes the dot product of the un-normalised feature (clamped to [-1, 1]); on unit "
                    "features the values agree and the suite's gradient lacks only the component along the feature"))
    return rows


def boundary_radial_part(features: torch.Tensor, labels: torch.Tensor, regions) -> torch.Tensor:
    """The component along each unit feature of the authors' boundary gradient (``-c^_y / B`` where a sample is
    inside ``max(kappa - cos, 0)``'s active side): what normalising the feature removes from it."""
    cosine = (features * regions.unit_centres[labels]).sum(dim=1)
    active = (regions.cosine_floor[labels] - cosine > 0).float()
    gradient = -regions.unit_centres[labels] * active[:, None] / len(labels)
    return (gradient * features).sum(dim=1, keepdim=True) * features


def unibct_rows(inputs: dict, reference: dict) -> tuple[list[dict], list[dict]]:
    """The suite's refined prototypes with MixBCT's column-normalised transition against theirs, and the default's
    (row-normalised) distance from them."""
    old, new, labels = inputs["unibct_old"], inputs["unibct_new"], inputs["unibct_labels"]
    theirs = F.normalize(reference["unibct"]["prototypes"].float(), dim=1)
    classes = list(range(UNIBCT_CLASSES))
    columns, _ = class_prototypes(old, new, labels, classes, UNIBCT_CLASSES, UniBCTConfig(transition="columns"))
    plain, _ = class_prototypes(old, new, labels, classes, UNIBCT_CLASSES, UniBCTConfig(refinement="none"))
    rows = [row("UniBCT: refined prototypes (transition: columns) vs MixBCT's PrototypeGeneration",
                float((columns - theirs).abs().max()), TOLERANCE, "lambda 0.9, tau 0.05; each normalised"),
            row("UniBCT: MixBCT's refinement equals the plain class means (refinement: none)",
                float((plain - theirs).abs().max()), TOLERANCE,
                "their softmax over each column makes 1^T S = 1^T, so the mean of the refined features is the mean")]
    default, _ = class_prototypes(old, new, labels, classes, UNIBCT_CLASSES, UniBCTConfig())
    differences = [{"name": "UniBCT's default (transition: rows) against MixBCT's refinement",
                    "prototype_max_abs_diff": float((default - theirs).abs().max()),
                    "note": "the suite's default normalises each row (each old feature a mix of its class-mates'), "
                            "which moves the prototypes; MixBCT's columns leave them at the class mean "
                            "(METHODS.md §6b)"}]
    return rows, differences


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--opencompatible", required=True, help="a checkout of TencentARC/OpenCompatible")
    parser.add_argument("--lce", required=True, help="a checkout of IrvingMeng/LCE")
    parser.add_argument("--mixbct", required=True, help="a checkout of yuleung/MixBCT")
    parser.add_argument("--reference-python", help="their interpreter (default: venv/bin/python beside them)")
    parser.add_argument("--out", default=str(ROOT / "results/parity/authors.json"))
    args = parser.parse_args(argv)
    checkouts = {"opencompatible": reference_checkout(args.opencompatible, "model/loss.py",
                                                      "TencentARC/OpenCompatible"),
                 "lce": reference_checkout(args.lce, "main.py", "IrvingMeng/LCE"),
                 "mixbct": reference_checkout(args.mixbct, "BCT_Methods/UniBCT/refine_prototype.py",
                                              "yuleung/MixBCT")}
    python = reference_python(args.reference_python, checkouts["lce"],
                              "make the references' environment (results/parity/README.md §7)")
    inputs = {**batch_inputs(), **lce_inputs(), **unibct_inputs()}
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        torch.save(inputs, work / "inputs.pt")
        command = [str(python), str(Path(__file__).with_name("authors_probe.py")), "--work", str(work),
                   *(f"--{name}={path}" for name, path in checkouts.items())]
        done = subprocess.run(command, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
        if done.returncode != 0:
            raise ParityError(f"the reference probe failed: {done.stderr.strip().splitlines()[-1:]}")
        reference = torch.load(work / "reference.pt", weights_only=False)
    unibct, differences = unibct_rows(inputs, reference)
    rows = ract_rows(inputs, reference) + lce_rows(inputs, reference) + unibct
    repositories = {"opencompatible": "TencentARC/OpenCompatible", "lce": "IrvingMeng/LCE", "mixbct": "yuleung/MixBCT"}
    Path(args.out).write_text(json.dumps({
        **provenance({name: (repositories[name], path) for name, path in checkouts.items()}),
        "rows": rows, "differences": differences}, indent=1) + "\n")
    for r in rows:
        print(f"{'ok ' if r['agree'] else 'NO '} {r['name']}: {r['max_abs_diff']:.3g} (tolerance {r['tolerance']})")


if __name__ == "__main__":
    main()
