"""Parity of BT² with the authors' code on one batch (results/parity/README.md §5).

    python -m tools.parity.bt2 --bt2 REF/BT-2 [--reference-python PYTHON] [--out results/parity/bt2.json]

The same backbone features, old-model and independent-model features, labels, pseudo-classifier and
basis-transformation weights go to both codes: ``bt2_probe.py`` runs one iteration of ``YifeiZhou02/BT-2``'s
``TransferTrainer.train`` on their ``ResNet_ortho`` under the reference's Python, this script the suite's
``BasisTransformationHead`` and ``strategies/bt2.py``'s loss. Their ``fc3`` has ``old_width`` outputs read over
``d_new + d_old`` channels; the suite's has the ``k`` outputs that are read, over the ``d_new`` backbone channels
(:class:`cl2r_bench.heads.BasisTransformationHead`): their backbone output gets ``d_old`` zero channels and
their ``fc3``'s other weights random values, whose gradients must then be zero (a row says so). Each row
reports the largest absolute difference of the loss or of a gradient.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from cl2r_bench.heads import BasisTransformationHead
from cl2r_bench.models import class_means
from strategies import Step, get_strategy
from tools.parity.common import (
    ROOT,
    provenance,
    reference_checkout,
    reference_python,
    run_reference_probe,
)
from tools.parity.steps import row

NEW_WIDTH, OLD_WIDTH, ADDED, CLASSES, BATCH, SCALE = 64, 48, 24, 6, 18, 2.0
"""Old narrower than new, so that the old branch's share ``k = 48 + 24 - 64 = 8`` differs from ``added``."""
TOLERANCE = 1e-5
WEIGHTS = {"influence": 10.0, "old": 5.0, "independent": 1.0}
"""The authors' ``configs/cifar100_transfer.yaml`` (``lambda_2``, ``lambda_3``, ``lambda_1``): the suite's defaults."""


def batch_inputs(seed: int = 0) -> dict:
    """Three images of each of six classes: backbone features (non-negative, as after a ReLU and an average pool),
    the old model's and the independent model's normalised features around class directions, the pseudo-classifier
    (the old features' class means, as the strategy makes it), and a seeded head."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(CLASSES).repeat(BATCH // CLASSES)

    def around(width: int) -> torch.Tensor:
        directions = torch.randn(CLASSES, width, generator=gen)
        return F.normalize(directions[labels] + 0.6 * torch.randn(BATCH, width, generator=gen), dim=1)

    torch.manual_seed(seed)
    head = BasisTransformationHead(NEW_WIDTH, CLASSES, old_width=OLD_WIDTH, added_dims=ADDED, scale=SCALE)
    old = around(OLD_WIDTH)
    return {"backbone_features": torch.rand(BATCH, NEW_WIDTH, generator=gen) * 2, "labels": labels,
            "old_features": old, "independent_features": around(NEW_WIDTH),
            "pseudo_classifier": class_means(old, labels, CLASSES)[0], "head": head.state_dict(),
            "classes": CLASSES, "scale": SCALE, "weights": WEIGHTS,
            "widths": {"new": NEW_WIDTH, "old": OLD_WIDTH, "old_part": head.old_part}}


def reference_state(inputs: dict, seed: int = 1) -> dict[str, torch.Tensor]:
    """The suite head's weights under ``ResNet_ortho``'s names; ``fc3``'s weights the suite has no counterpart of
    are seeded random values (their gradients must be zero)."""
    head, k = inputs["head"], inputs["widths"]["old_part"]
    gen = torch.Generator().manual_seed(seed)
    fc3 = torch.randn(OLD_WIDTH, NEW_WIDTH + OLD_WIDTH, 1, 1, generator=gen) / NEW_WIDTH ** 0.5
    fc3[:k, :NEW_WIDTH, 0, 0] = head["old_branch.weight"]
    bias = torch.randn(OLD_WIDTH, generator=gen)
    bias[:k] = head["old_branch.bias"]
    state = {"fc3.weight": fc3, "fc3.bias": bias, "fc_out.weight": head["classifier.weight"]}
    for ours, theirs in (("new_basis", "ortholinear_p"), ("old_basis", "ortholinear_old2")):
        state.update({key.replace(ours, theirs, 1): value for key, value in head.items() if key.startswith(ours)})
    return state


def suite_iteration(inputs: dict, params: dict | None = None) -> dict:
    """The suite's loss on the batch and its gradients, under the reference's parameter names."""
    strategy = get_strategy("bt2").from_params(params or {})
    head = BasisTransformationHead(NEW_WIDTH, CLASSES, old_width=OLD_WIDTH, added_dims=ADDED, scale=SCALE)
    head.load_state_dict(inputs["head"])
    features = nn.Parameter(inputs["backbone_features"].clone())
    logits, merged = head(features)
    strategy.pseudo_classifier, strategy.old_width = inputs["pseudo_classifier"], OLD_WIDTH
    labels = inputs["labels"]
    step = Step(labels=labels, targets=labels, logits=logits, features=merged,
                from_memory=torch.zeros(len(labels), dtype=torch.bool),
                teacher_raw_features=3.0 * inputs["old_features"],
                independent_features=inputs["independent_features"], new_features=head.new_features)
    loss = strategy.loss(step)
    loss.backward()
    named = {"resnet.features": features, "fc_out.weight": head.classifier.weight}
    named.update({name.replace("new_basis", "ortholinear_p", 1).replace("old_basis", "ortholinear_old2", 1): p
                  for name, p in head.named_parameters() if "basis" in name})
    grads = {n: p.grad for n, p in named.items()}
    grads["fc3.weight"] = head.old_branch.weight.grad
    grads["fc3.bias"] = head.old_branch.bias.grad
    return {"loss": loss.detach(), "grads": grads}


def compare(reference: dict, inputs: dict) -> list[dict]:
    ours = suite_iteration(inputs)
    theirs, k = reference["grads"], inputs["widths"]["old_part"]
    rows = [row("bt2: loss of one training iteration", float((ours["loss"] - reference["loss"]).abs()), TOLERANCE,
                f"TransferTrainer.train, lambda_1 1, lambda_2 10, lambda_3 5, C {SCALE}, widths new {NEW_WIDTH} / "
                f"old {OLD_WIDTH} / added {ADDED}; theirs {float(reference['loss']):.6f}, ours "
                f"{float(ours['loss']):.6f}")]
    matched = {"resnet.features": theirs["resnet.features"][:, :NEW_WIDTH, 0, 0],
               "fc3.weight": theirs["fc3.weight"][:k, :NEW_WIDTH, 0, 0], "fc3.bias": theirs["fc3.bias"][:k]}
    matched.update({n: theirs[n] for n in ours["grads"] if n not in matched})
    diff = max(float((ours["grads"][n] - matched[n]).abs().max()) for n in ours["grads"])
    rows.append(row(f"bt2: gradient w.r.t. every weight and the backbone features ({len(ours['grads'])} tensors)",
                    diff, TOLERANCE, "fc3's read rows and channels; P and O through torch's orthogonal "
                                     "parametrisation (original weights)"))
    unread = torch.cat([theirs["fc3.weight"][k:].flatten(), theirs["fc3.weight"][:k, NEW_WIDTH:].flatten(),
                        theirs["fc3.bias"][k:], theirs["resnet.features"][:, NEW_WIDTH:].flatten()])
    rows.append(row("bt2: their gradient of what the suite does not have (fc3's unread outputs, the zero "
                    "channels)", float(unread.abs().max()), TOLERANCE,
                    "zero: the suite's narrower fc3 is the same function"))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bt2", required=True, help="a checkout of YifeiZhou02/BT-2")
    parser.add_argument("--reference-python", help="a Python with torch, tqdm and scikit-learn (default: "
                                                   "advbct-venv/bin/python beside the checkout)")
    parser.add_argument("--out", default=str(ROOT / "results/parity/bt2.json"))
    args = parser.parse_args(argv)
    bt2 = reference_checkout(args.bt2, "trainers/transfer_trainer.py", "YifeiZhou02/BT-2")
    python = reference_python(args.reference_python, bt2,
                              "make the reference's environment (results/parity/README.md §5)", venv="advbct-venv")
    inputs = batch_inputs()
    inputs["reference_state"] = reference_state(inputs)
    features = inputs["backbone_features"]
    inputs["reference_features"] = torch.cat([features, features.new_zeros(len(features), OLD_WIDTH)], dim=1)
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        torch.save(inputs, work / "inputs.pt")
        reference = run_reference_probe(python, "bt2_probe.py", "--bt2", bt2, work)
    rows = compare(reference, inputs)
    Path(args.out).write_text(json.dumps({**provenance({"bt2": ("YifeiZhou02/BT-2", bt2)}), "rows": rows}, indent=1)
                              + "\n")
    for r in rows:
        print(f"{'ok ' if r['agree'] else 'NO '} {r['name']}: {r['max_abs_diff']} (tolerance {r['tolerance']})")


if __name__ == "__main__":
    main()
