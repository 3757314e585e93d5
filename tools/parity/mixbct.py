"""Parity of MixBCT with its authors' code on one batch (results/parity/README.md, MixBCT).

    python -m tools.parity.mixbct --mixbct REF/MixBCT [--reference-python PYTHON] [--out results/parity/mixbct.json]

The same old features of a training set (6 classes of 10 images, sorted by class as their feature files are), a batch
of 20 of its images with the new model's raw features, the new classifier's weights and the rows drawn for mixing go
to both codes. ``mixbct_probe.py`` runs, under the reference's Python, ``yuleung/MixBCT``'s
``tools/denoising/denoise_credible.py`` (``--T 0.9``) on the old features and then one iteration of
``BCT_Methods/MixBCT/train.py``'s ``main`` with their ``OPclass_..._MixBCT_softmax_to_arc_f128`` config (mix ratio
0.3, ``ArcFace()``: s 64, m 0.5, ``PartialFC`` at sample rate 1); this script runs ``strategies/mixbct.py`` at its
defaults with the suite's ``CosineHead``. The random draw is an input: the suite draws with its generator and their
``random.sample`` is handed the same positions among the batch's credible rows. Each row reports the largest
absolute difference (the credible masks and the replaced rows: how many items differ); each reading's term moves
the loss by more than 0.05 (listed under the rows, checked by ``tests/strategies/test_mixbct.py``).
"""
from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from cl2r_bench.heads import CosineHead
from strategies import Step, get_strategy
from strategies.mixbct import arcface_logits, credible, credible_regions
from tools.parity.common import (
    ROOT,
    provenance,
    reference_checkout,
    reference_python,
    run_reference_probe,
)
from tools.parity.steps import row

CLASSES, PER_CLASS, WIDTH, BATCH, SEED = 6, 10, 32, 20, 3
TOLERANCE = 1e-5
TERMS = {"mixing (mix_ratio 0)": {"mix_ratio": 0.0}, "the ArcFace margin (margin 0)": {"margin": 0.0},
         "denoising (credible_ratio 1)": {"credible_ratio": 1.0}}
"""Each reading's term and the setting that removes it: the loss must move by more than 0.05 without it."""


def batch_inputs(seed: int = 0) -> dict:
    """Old raw features of 60 images (6 classes of 10, sorted by class; one per class far from its class), a batch of
    20 of them (every far one among them) with new raw features around the class directions, and a classifier near
    those directions."""
    gen = torch.Generator().manual_seed(seed)
    directions = F.normalize(torch.randn(CLASSES, WIDTH, generator=gen), dim=1)
    labels = torch.arange(CLASSES).repeat_interleave(PER_CLASS)
    spread = torch.full((len(labels),), 0.5)
    spread[::PER_CLASS] = 2.5
    noise = torch.randn(len(labels), WIDTH, generator=gen) / WIDTH ** 0.5
    old = (directions[labels] + spread[:, None] * noise) * (3 + torch.rand(len(labels), 1, generator=gen))
    far = torch.arange(0, len(labels), PER_CLASS)
    others = torch.tensor([i for i in torch.randperm(len(labels), generator=gen).tolist() if i % PER_CLASS])
    index = torch.cat([far, others[:BATCH - len(far)]])[torch.randperm(BATCH, generator=gen)]
    new_directions = F.normalize(directions + 0.5 * torch.randn(CLASSES, WIDTH, generator=gen) / WIDTH ** 0.5, dim=1)
    new = (new_directions[labels[index]] + 0.9 * torch.randn(BATCH, WIDTH, generator=gen) / WIDTH ** 0.5) * 5
    classifier = directions + 0.4 * torch.randn(CLASSES, WIDTH, generator=gen) / WIDTH ** 0.5
    return {"old_features": old, "labels": labels, "index": index, "new_features": new, "classifier": classifier,
            "classes": CLASSES, "width": WIDTH, "batch": BATCH, **arcface_inputs()}


def arcface_inputs() -> dict:
    """Cosines whose target entries cover both of ArcFace's branches (at or below ``cos(pi - m)``, about -0.878, the
    margin is replaced by ``- m sin(pi - m)``) and the weights of a linear read-out of the logits, for its gradient."""
    gen = torch.Generator().manual_seed(1)
    targets = torch.arange(8) % 5
    cosine = torch.rand(8, 5, generator=gen) * 2 - 1
    cosine[torch.arange(8), targets] = torch.tensor([-0.99, -0.95, -0.9, -0.85, -0.3, 0.2, 0.7, 0.99])
    return {"arcface_cosines": cosine, "arcface_targets": targets,
            "arcface_readout": torch.randn(8, 5, generator=gen)}


def suite_arcface(inputs: dict) -> dict:
    cosine = nn.Parameter(inputs["arcface_cosines"].clone())
    logits = arcface_logits(cosine, inputs["arcface_targets"], 64.0, 0.5)
    (logits * inputs["arcface_readout"]).sum().backward()
    return {"logits": logits.detach(), "grad": cosine.grad}


def suite_iteration(inputs: dict, params: dict | None = None, seed: int = SEED) -> dict:
    """The suite's MixBCT on the batch: its credible mask of the training set, the rows it mixed, the loss and the
    gradients of the new features and of the classifier."""
    strategy = get_strategy("mixbct").from_params(params or {})
    config = strategy.config
    unit_old, labels = F.normalize(inputs["old_features"], dim=1), inputs["labels"]
    regions = credible_regions(unit_old, labels, CLASSES, config.credible_ratio, config.denoise_space)
    head = CosineHead(WIDTH, CLASSES)
    with torch.no_grad():
        head.classifier.weight.copy_(inputs["classifier"])
    features = nn.Parameter(inputs["new_features"].clone())
    logits, feats = head(features)
    strategy.regions, strategy.model = regions, SimpleNamespace(head=head)
    strategy.generator = torch.Generator().manual_seed(seed)
    index = inputs["index"]
    batch_labels = labels[index]
    step = Step(labels=batch_labels, targets=batch_labels, logits=logits, features=feats,
                from_memory=torch.zeros(BATCH, dtype=torch.bool), teacher_features=unit_old[index])
    loss = strategy.loss(step)
    loss.backward()
    batch_credible = credible(regions, unit_old[index], batch_labels)
    return {"loss": loss.detach(), "credible": credible(regions, unit_old, labels), "mixed": strategy.mixed,
            "batch_credible": batch_credible,
            "grads": {"features": features.grad, "classifier": head.classifier.weight.grad}}


def drawn_positions(ours: dict) -> list[int]:
    """Where the suite's mixed rows stand among the batch's credible rows: what their ``random.sample`` returns."""
    credible_rows = torch.nonzero(ours["batch_credible"]).flatten().tolist()
    return [position for position, r in enumerate(credible_rows) if bool(ours["mixed"][r])]


def compare(reference: dict, inputs: dict, ours: dict) -> list[dict]:
    theirs = reference["grads"]
    mask_diff = int((ours["credible"] != reference["credible"]).sum())
    their_replaced = theirs["features"].abs().sum(dim=1) == 0
    rows = [row("MixBCT: credible old features of the 60 training images (items that differ)", mask_diff, TOLERANCE,
                f"denoise_credible.py --T 0.9: the ceil(0.9 n) nearest their class mean after normalising rows, then "
                f"columns; {int(reference['credible'].sum())} of {len(reference['credible'])} credible in theirs"),
            row("MixBCT: the replaced rows of the batch (rows that differ)",
                int((their_replaced != ours["mixed"]).sum()), TOLERANCE,
                f"{int(ours['mixed'].sum())} = int(20 x 0.3) rows drawn among the batch's "
                f"{reference['credible_in_batch']} credible ones (theirs: the rows without a backbone gradient)"),
            row("MixBCT: loss of one training iteration", float((ours["loss"] - reference["loss"]).abs()), TOLERANCE,
                f"train.py main, OPclass softmax_to_arc_f128 config, ArcFace s 64 m 0.5; theirs "
                f"{float(reference['loss']):.6f}, ours {float(ours['loss']):.6f}"),
            row("MixBCT: gradient of the new features", float((ours["grads"]["features"] - theirs["features"])
                                                             .abs().max()), TOLERANCE,
                f"before their clip_grad_norm_(5), made a no-op (part of the optimiser's step, not of the loss; the "
                f"norm here is {reference['backbone_grad_norm']:.3f}"
                f"{', under 5: their step would not clip it either' if reference['backbone_grad_norm'] < 5 else ''})"),
            row("MixBCT: gradient of the classifier", float((ours["grads"]["classifier"] - theirs["classifier"])
                                                           .abs().max()), TOLERANCE,
                "PartialFC.weight_activated (sample rate 1) against the suite's CosineHead")]
    arcface = suite_arcface(inputs)
    targets = inputs["arcface_cosines"].gather(1, inputs["arcface_targets"][:, None])
    below = int((targets <= math.cos(math.pi - 0.5)).sum())
    rows.append(row("MixBCT: ArcFace logits on cosines in both branches",
                    float((arcface["logits"] - reference["arcface"]["logits"]).abs().max()), TOLERANCE,
                    f"their losses.ArcFace() (s 64, m 0.5, easy_margin off) on 8 target cosines from -0.99 to 0.99, "
                    f"{below} of them below cos(pi - m)"))
    rows.append(row("MixBCT: gradient of those ArcFace logits (a linear read-out) w.r.t. the cosines",
                    float((arcface["grad"] - reference["arcface"]["grad"]).abs().max()), TOLERANCE,
                    f"the target's slope cos m + t sin m / sqrt(1 - t^2) above cos(pi - m), 1 below it, times 64: "
                    f"entries up to {float(arcface['grad'].abs().max()):.0f} in float32"))
    return rows


def term_checks(inputs: dict, full: dict) -> list[dict]:
    """How much each term moves the loss on this batch (the same draw seed)."""
    out = []
    for name, params in TERMS.items():
        without = float(suite_iteration(inputs, params)["loss"])
        out.append({"name": f"the loss without {name}", "loss_without": without,
                    "moves_by": abs(float(full["loss"]) - without),
                    "note": "more than 0.05: the rows above check this term"})
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mixbct", required=True, help="a checkout of yuleung/MixBCT")
    parser.add_argument("--reference-python", help="a Python with torch, torchvision, numpy, scipy, scikit-learn and "
                                                   "easydict (default: venv/bin/python beside the checkout)")
    parser.add_argument("--out", default=str(ROOT / "results/parity/mixbct.json"))
    args = parser.parse_args(argv)
    mixbct = reference_checkout(args.mixbct, "BCT_Methods/MixBCT/train.py", "yuleung/MixBCT")
    python = reference_python(args.reference_python, mixbct,
                              "make the references' environment (results/parity/README.md)")
    inputs = batch_inputs()
    ours = suite_iteration(inputs)
    inputs["positions"] = drawn_positions(ours)
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        torch.save(inputs, work / "inputs.pt")
        reference = run_reference_probe(python, "mixbct_probe.py", "--mixbct", mixbct, work)
    rows = compare(reference, inputs, ours)
    terms = term_checks(inputs, ours)
    Path(args.out).write_text(json.dumps({**provenance({"mixbct": ("yuleung/MixBCT", mixbct)}), "rows": rows,
                                          "differences": terms}, indent=1) + "\n")
    for r in rows:
        print(f"{'ok ' if r['agree'] else 'NO '} {r['name']}: {r['max_abs_diff']:.3g} (tolerance {r['tolerance']})")
    for t in terms:
        print(f"{'ok ' if t['moves_by'] > 0.05 else 'NO '} {t['name']}: moves the loss by {t['moves_by']:.4g}")


if __name__ == "__main__":
    main()
