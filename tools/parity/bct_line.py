"""Parity of LCE, UniBCT, RACT and AdvBCT with the reference code on one batch (results/parity/README.md §4).

    python -m tools.parity.bct_line --advbct REF/AdvBCT [--reference-python REF/advbct-venv/bin/python] \\
        [--out results/parity/bct_line.json]

The same batch (new features, the old model's raw features, labels), the same classifier, discriminator and
elastic-boundary weights and the same old-model features of the old training set go to both codes:
``bct_probe.py`` runs ``Ashespt/AdvBCT``'s class summaries and one iteration of its training loop under the
reference's Python, this script runs the suite's (``cl2r_bench/class_regions.py`` and each strategy's ``loss``), and
each row reports the largest absolute difference of the loss, of each gradient and of the class summaries. The
suite's UniBCT is compared in its reference reading (``refinement: none``, ``centre_classes: old``); how far its
default (the paper's graph refinement) moves the loss is listed apart, under ``differences``.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from cl2r_bench.class_regions import class_regions
from strategies import Step, get_strategy
from strategies.advbct import ElasticBoundary, discriminator
from strategies.unibct import class_prototypes
from tools.parity.common import (
    ROOT,
    provenance,
    reference_checkout,
    reference_python,
    run_reference_probe,
)
from tools.parity.steps import row

WIDTH, CLASSES, OLD_CLASSES, PER_OLD_CLASS, BATCH = 256, 8, 6, 12, 16
"""256 wide: the reference's LCE branch fixes the centres' width at 256."""
EPOCH, EPOCHS, THRESHOLD = 2, 5, 1.0
SPREAD_OF_CLASSES = 0.3
TOLERANCE = 1e-5


def batch_inputs(seed: int = 0) -> dict:
    """One batch of 16 (every class twice; classes 6 and 7 are new, so the old-class terms skip them), class
    directions close to one another (cosines about 0.9, so that at RACT's temperature of 0.01 negatives compete
    with the positive and every term is far from zero) with noise so that some samples fall outside their
    class's boundary and some inside, and the old model's features of 12 items of each old class, one of them an
    outlier the 1.5 IQR rule drops."""
    gen = torch.Generator().manual_seed(seed)
    shared = torch.randn(1, WIDTH, generator=gen)
    directions = F.normalize(shared + SPREAD_OF_CLASSES * torch.randn(CLASSES, WIDTH, generator=gen), dim=1)

    def around(labels: torch.Tensor, spread: torch.Tensor) -> torch.Tensor:
        return directions[labels] + spread[:, None] * torch.randn(len(labels), WIDTH, generator=gen) / WIDTH ** 0.5

    old_labels = torch.arange(OLD_CLASSES).repeat_interleave(PER_OLD_CLASS)
    spread = torch.full((len(old_labels),), 0.5)
    spread[::PER_OLD_CLASS] = 3.0
    labels = torch.arange(CLASSES).repeat(BATCH // CLASSES)
    new_spread = torch.linspace(0.2, 1.5, BATCH)
    torch.manual_seed(seed)
    judge = discriminator(WIDTH, 100)
    return {"features": 2.0 * around(labels, new_spread), "old_raw_features": 3.0 * around(labels, torch.full(
                (BATCH,), 0.8)),
            "labels": labels, "classifier": directions + 0.05 * torch.randn(CLASSES, WIDTH, generator=gen),
            "discriminator": list(judge.state_dict().values()),
            "boundary_logit": torch.empty(CLASSES).uniform_(-1, 1, generator=gen),
            "old_features": 1.5 * around(old_labels, spread), "old_labels": old_labels, "old_classes": OLD_CLASSES,
            "new_of_old": around(old_labels, torch.full((len(old_labels),), 0.8)),
            "epoch": EPOCH, "epochs": EPOCHS, "threshold": THRESHOLD}


def suite_iteration(name: str, inputs: dict, params: dict | None = None) -> dict:
    """The suite's loss of ``name`` on the batch and its gradients, named as the reference's parameters."""
    strategy = get_strategy(name).from_params(params or {})
    features = nn.Parameter(inputs["features"].clone())
    classifier = nn.Linear(WIDTH, CLASSES, bias=False)
    with torch.no_grad():
        classifier.weight.copy_(inputs["classifier"])
    old_unit = F.normalize(inputs["old_features"], dim=1)
    regions = class_regions(old_unit, inputs["old_labels"], inputs["old_labels"].unique(), CLASSES)
    named = {"convnet.features": features, "projection_cls.weight": classifier.weight}
    if name in ("lce", "advbct"):
        strategy.regions = regions
    if name == "lce":
        strategy.model = nn.Module()
        strategy.model.head = nn.Module()
        strategy.model.head.classifier = classifier
    if name == "unibct":
        new = F.normalize(inputs["new_of_old"], dim=1)
        limit = OLD_CLASSES if strategy.config.centre_classes == "old" else CLASSES
        classes = [c for c in inputs["old_labels"].unique().tolist() if c < limit]
        strategy.prototypes, strategy.row_of_label = class_prototypes(old_unit, new, inputs["old_labels"], classes,
                                                                      CLASSES, strategy.config)
    if name == "advbct":
        strategy.boundary = ElasticBoundary(regions.distance_radius.clone(), THRESHOLD)
        strategy.judge = discriminator(WIDTH, 100)
        with torch.no_grad():
            strategy.boundary.logit.copy_(inputs["boundary_logit"])
            for ours, given in zip(strategy.judge.state_dict().values(), inputs["discriminator"], strict=True):
                ours.copy_(given)
        named["eboundary.weight"] = strategy.boundary.logit
        names = ("d_fc1.weight", "d_fc1.bias", "d_bn1.weight", "d_bn1.bias", "d_fc2.weight", "d_fc2.bias")
        named.update({f"discriminator.{n}": p for n, p in zip(names, strategy.judge.parameters(), strict=True)})
    labels = inputs["labels"]
    raw_old = inputs["old_raw_features"]
    step = Step(labels=labels, targets=labels, logits=classifier(features), features=features,
                from_memory=torch.zeros(len(labels), dtype=torch.bool), teacher_features=F.normalize(raw_old, dim=1),
                teacher_raw_features=raw_old, iteration=EPOCH, iterations_per_epoch=1, epochs=EPOCHS)
    loss = strategy.loss(step)
    loss.backward()
    return {"loss": loss.detach(), "grads": {n: p.grad.clone() for n, p in named.items() if p.grad is not None},
            "regions": regions}


def summary_rows(meta: dict, regions) -> list[dict]:
    """The class summaries: their JSON's centres and largest inlier radii (and how many inliers) against ours."""
    classes = sorted(int(k) for k in meta["distance"])
    rows = []
    centres = torch.tensor([meta["distance"][str(c)]["center"] for c in classes])
    rows.append(row("class centres (6 classes, mean of unit old features)",
                    float((centres - regions.centres[classes]).abs().max()), TOLERANCE,
                    "theirs: extract_feat.gen_class_meta; ours: cl2r_bench.class_regions.class_regions"))
    for kind, ours in (("distance", regions.distance_radius), ("angle", regions.angle_radius)):
        theirs = torch.tensor([meta[kind][str(c)]["radius"][-1] for c in classes])
        kept = [len(meta[kind][str(c)]["radius"]) for c in classes]
        rows.append(row(f"largest {kind} radius after the 1.5 IQR rule", float((theirs - ours[classes]).abs().max()),
                        TOLERANCE, f"inliers per class (theirs): {kept} of {PER_OLD_CLASS}"))
    return rows


METHOD_NOTES = {
    "lce": "COMP_LOSS.TYPE lce (K = 0): CE + boundary (angles) + alignment; suite form advbct",
    "unibct": "COMP_LOSS.TYPE uni_bct: CE + ArcFace (s 30, m 0.3) on old centres; suite refinement none, classes old",
    "ract": "COMP_LOSS.TYPE hot_refresh (tau 0.01, top-10 negatives): CE + contrastive with n2o and n2n negatives;"
            " suite detach_new_negatives (their all_gather carries no gradient)",
    "advbct": "bct_limit + ELASTIC_BOUNDARY + adv_compatible (epoch 2 of 5): CE + elastic boundary + adversarial",
}
REFERENCE_READINGS = {"lce": {"form": "advbct"}, "unibct": {"refinement": "none", "centre_classes": "old"},
                      "ract": {"detach_new_negatives": True}, "advbct": {"threshold": THRESHOLD}}


def compare(reference: dict, inputs: dict) -> tuple[list[dict], list[dict]]:
    rows, differences = [], []
    first = suite_iteration("lce", inputs, REFERENCE_READINGS["lce"])
    rows += summary_rows(reference["lce"]["meta"], first["regions"])
    for name, note in METHOD_NOTES.items():
        ours = suite_iteration(name, inputs, REFERENCE_READINGS.get(name))
        theirs = reference[name]
        rows.append(row(f"{name}: loss of one training iteration", float((ours["loss"] - theirs["loss"]).abs()),
                        TOLERANCE, f"{note}; theirs {float(theirs['loss']):.6f}, ours {float(ours['loss']):.6f}"))
        names = sorted(set(ours["grads"]) | set(theirs["grads"]))
        missing = [n for n in names if n not in ours["grads"] or n not in theirs["grads"]]
        diff = max(float((ours["grads"][n] - theirs["grads"][n]).abs().max()) for n in names if n not in missing)
        rows.append(row(f"{name}: gradient w.r.t. every weight ({len(names)} tensors)",
                        diff if not missing else float("inf"), TOLERANCE, f"names on one side only: {missing}"))
    authors = suite_iteration("lce", inputs)
    differences.append({"name": "lce default (form: authors, IrvingMeng/LCE's) against this reimplementation",
                        "loss_suite": float(authors["loss"]), "loss_reference": float(reference["lce"]["loss"]),
                        "note": "the paper's authors' forms: an MSE alignment weighted 100 and a cosine floor; "
                                "checked against their own code in results/parity/authors.json"})
    paper = suite_iteration("unibct", inputs)
    differences.append({"name": "unibct default (graph refinement, rows; classes seen) against the reference's "
                                "plain old centres", "loss_suite": float(paper["loss"]),
                        "loss_reference": float(reference["unibct"]["loss"]),
                        "note": "the paper's refinement, absent from the reference code (METHODS.md §6b)"})
    paper = suite_iteration("ract", inputs)
    gradient = float((paper["grads"]["convnet.features"] - reference["ract"]["grads"]["convnet.features"]).abs().max())
    differences.append({"name": "ract default (gradient through the new-to-new negatives) against the reference",
                        "loss_suite": float(paper["loss"]), "loss_reference": float(reference["ract"]["loss"]),
                        "feature_gradient_max_abs_diff": gradient,
                        "note": "same loss; the reference's all_gather makes the other samples' new features "
                                "constants (METHODS.md §6b)"})
    return rows, differences


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--advbct", required=True, help="a checkout of Ashespt/AdvBCT")
    parser.add_argument("--reference-python", help="its interpreter (default: advbct-venv/bin/python beside it)")
    parser.add_argument("--out", default=str(ROOT / "results/parity/bct_line.json"))
    args = parser.parse_args(argv)
    advbct = reference_checkout(args.advbct, "trainer/trainer.py", "Ashespt/AdvBCT")
    python = reference_python(args.reference_python, advbct,
                              "make the reference's environment (results/parity/README.md §4)", venv="advbct-venv")
    inputs = batch_inputs()
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        torch.save(inputs, work / "inputs.pt")
        reference = run_reference_probe(python, "bct_probe.py", "--advbct", advbct, work)
    rows, differences = compare(reference, inputs)
    Path(args.out).write_text(json.dumps({**provenance({"advbct": ("Ashespt/AdvBCT", advbct)}), "rows": rows,
                                          "differences": differences}, indent=1) + "\n")
    for r in rows:
        print(f"{'ok ' if r['agree'] else 'NO '} {r['name']}: {r['max_abs_diff']} (tolerance {r['tolerance']})")


if __name__ == "__main__":
    main()
