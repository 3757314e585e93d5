"""Parity of FCT's transformation with the authors' code on one step (results/parity/README.md).

    python -m tools.parity.fct --ml-fct REF/ml-fct [--reference-python PYTHON] [--out results/parity/fct.json]

The same weights and the same batch go to both codes: ``fct_probe.py`` runs, under the reference's Python,
``apple/ml-fct``'s ``MLP_BN_SIDE_PROJECTION`` through one ``TransformationTrainer.train`` epoch of one batch (their
``nn.MSELoss``, ``get_optimizer`` and ``get_policy`` with their CIFAR-100 transformation config) and their exported
map ``TransformedOldModel`` in eval mode; this script runs the suite's ``fct`` adapter (``network:
side_projection``): its ``batch_loss`` in train mode, as its fit calls it, and its ``forward`` in eval mode. The
suite's weights are converted to their names (``Linear`` ``(out, in)`` -> 1x1 ``Conv2d`` ``(out, in, 1, 1)``,
``BatchNorm1d`` -> their ``BatchNorm2d``), and their load is strict, so every weight is mapped. Batch-norm scales,
shifts and running statistics are drawn away from their initial values, as a trained network's are.

Cases: their CIFAR-100 configuration's widths (old, new and side information 128-d, inner 2048) with side
information; their run without a side-information model (``side_info_model = old_model``: the suite given no side
information), old 24-d into new 20-d; and side information of its own width (16-d). Rows: the parameter count, the
eval-mode map of a test batch, the train-mode output (batch statistics), the loss, every parameter's gradient and
the running statistics after the step. The suite's loss is ``mean_i ‖h_i - φ_new,i‖²``, theirs ``nn.MSELoss``, the
mean over items and dimensions: the suite's loss and gradients are divided by the new width ``D`` before they are
compared (a constant factor, which Adam's update ignores up to its ε). Their optimiser step is not compared: their
recipe (Adam with weight decay 2^-15, a warm-up and cosine schedule by epoch) is not the suite's (METHODS.md §7).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

import torch
import yaml

from cl2r_bench.adapters import FeaturePair, make_adapter
from cl2r_bench.adapters.fct import FCT
from tools.parity.common import ROOT, ParityError, provenance, reference_checkout, run_reference_probe
from tools.parity.steps import row

CONFIG = "cifar100_transformation.yaml"
"""Their transformation config whose ``arch_params``, optimiser and schedule the check uses."""
TOLERANCE = 1e-5
BATCH, TEST = 64, 32
CASES = {
    "their CIFAR-100 widths (128-d old, new, side information; inner 2048), with side information":
        {"side": True},
    "no side-information model (theirs: side_info_model = old_model), 24-d old -> 20-d new, inner 64":
        {"old": 24, "new": 20, "side": False, "inner": 64},
    "side information of its own width, 24-d old + 16-d side -> 20-d new, inner 64":
        {"old": 24, "new": 20, "side": 16, "inner": 64},
}
BRANCHES = {"old_branch": "p1", "side_branch": "p2", "mixer": "mixer"}


def their_name(key: str) -> str:
    """The ml-fct name of a suite weight: ``net.<branch>.<i>.<param>``, where layer ``i`` is part ``i % 3`` (linear,
    batch norm, ReLU) of their ``ConvBlock`` ``i // 3``; the mixer's last linear layer is their last block's conv."""
    branch, index, param = re.fullmatch(r"net\.(\w+)\.(\d+)\.(\w+)", key).groups()
    block, part = divmod(int(index), 3)
    return f"{BRANCHES[branch]}.{block}.{'conv' if part == 0 else 'normalizer'}.{param}"


def to_reference_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The suite's state dict under their names, linear weights as 1x1 convolution kernels."""
    return {their_name(k): v[:, :, None, None] if v.dim() == 2 else v for k, v in state.items()}


def arch_params(checkout: Path, spec: dict) -> dict:
    """Their ``arch_params``: the config's, with the case's widths where it gives them."""
    params = dict(yaml.safe_load((checkout / "configs" / CONFIG).read_text())["arch_params"])
    if "old" in spec:
        params.update(old_embedding_dim=spec["old"], new_embedding_dim=spec["new"], inner_dim=spec["inner"])
    side = spec["side"]
    params["side_info_dim"] = params["old_embedding_dim"] if side is False else (
        params["side_info_dim"] if side is True else side)
    return params


def suite_adapter(params: dict, with_side: bool, generator: torch.Generator) -> FCT:
    """The suite's ``fct`` for these widths (mixer width ``inner_dim``, 2 layers), with batch-norm scales, shifts and
    running statistics drawn away from their initial values."""
    adapter = make_adapter("fct", {"fct": {"network": "side_projection", "hidden": params["inner_dim"],
                                           "layers": 2}})
    adapter.build(params["old_embedding_dim"], params["new_embedding_dim"],
                  params["side_info_dim"] if with_side else 0)
    with torch.no_grad():
        for module in adapter.modules():
            if isinstance(module, torch.nn.BatchNorm1d):
                module.weight.copy_(1 + 0.2 * torch.randn(module.weight.shape, generator=generator))
                module.bias.copy_(0.2 * torch.randn(module.bias.shape, generator=generator))
                module.running_mean.copy_(0.3 * torch.randn(module.running_mean.shape, generator=generator))
                module.running_var.copy_(0.5 + torch.rand(module.running_var.shape, generator=generator))
                module.num_batches_tracked.fill_(7)
    return adapter


def features(params: dict, with_side: bool, items: int, generator: torch.Generator) -> dict:
    """Unit-length old and new features (as the suite's adapters get them), side information of its own scale."""
    def unit(width: int) -> torch.Tensor:
        return torch.nn.functional.normalize(torch.randn(items, width, generator=generator), dim=1)

    side = torch.randn(items, params["side_info_dim"], generator=generator) if with_side else None
    return {"old": unit(params["old_embedding_dim"]), "new": unit(params["new_embedding_dim"]), "side": side}


def suite_side(adapter: FCT, train: dict, test: dict) -> dict:
    """The suite's eval-mode map of ``test``, then one training step's output, loss, gradients and running
    statistics on ``train`` (its ``batch_loss`` in train mode, as its fit calls it)."""
    with torch.no_grad():
        mapped = adapter.eval().forward(test["old"], test["side"])
    adapter.train()
    outputs: list[torch.Tensor] = []

    def keep_output(module: torch.nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        outputs.append(output.detach().clone())

    hook = adapter.net.register_forward_hook(keep_output)
    pair = FeaturePair(train["old"], train["new"], torch.zeros(len(train["old"]), dtype=torch.long),
                       side=train["side"])
    loss = adapter.batch_loss(pair, torch.arange(len(train["old"])))
    loss.backward()
    hook.remove()
    return {"eval_map": mapped, "output": outputs[0], "loss": loss.item(),
            "grads": {their_name(n): p.grad[:, :, None, None] if p.dim() == 2 else p.grad
                      for n, p in adapter.named_parameters()},
            "statistics": {their_name(n): v.clone() for n, v in adapter.state_dict().items()
                           if n.endswith(("running_mean", "running_var", "num_batches_tracked"))},
            "parameters": sum(p.numel() for p in adapter.parameters())}


def largest(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor], scale: float = 1.0) -> float:
    if set(ours) != set(theirs):
        raise ParityError(f"the weights differ in name: {sorted(set(ours) ^ set(theirs))}")
    return max(float((ours[k].double() / scale - theirs[k].double()).abs().max()) for k in ours)


def compare(name: str, ours: dict, theirs: dict, new_dim: int) -> list[dict]:
    grad_scale = max(float(g.abs().max()) for g in theirs["grads"].values())
    return [
        row(f"FCT, {name}: parameters", abs(ours["parameters"] - theirs["parameters"]), 0,
            f"ours {ours['parameters']:,}, theirs {theirs['parameters']:,}; their load is strict"),
        row(f"FCT, {name}: the map in eval mode (running statistics)",
            float((ours["eval_map"] - theirs["eval_map"]).abs().max()), TOLERANCE,
            f"{TEST} test items; theirs: TransformedOldModel (old model, side model, transformation), before training"),
        row(f"FCT, {name}: the output in train mode (batch statistics)",
            float((ours["output"] - theirs["output"]).abs().max()), TOLERANCE, f"{BATCH} items"),
        row(f"FCT, {name}: loss of one training step (ours / D)", abs(ours["loss"] / new_dim - theirs["loss"]),
            TOLERANCE, f"D = {new_dim}; theirs {theirs['loss']:.6f} (TransformationTrainer.train, nn.MSELoss), ours "
                       f"{ours['loss']:.6f} / {new_dim}"),
        row(f"FCT, {name}: gradient of every parameter ({len(ours['grads'])} tensors; ours / D)",
            largest(ours["grads"], theirs["grads"], new_dim), TOLERANCE,
            f"the largest of theirs {grad_scale:.3g}; recorded before their Adam step (lr {theirs['lr']:.3g} at "
            "epoch 0 of their schedule)"),
        row(f"FCT, {name}: batch-norm running statistics and batch counts after the step",
            largest(ours["statistics"], theirs["statistics"]), TOLERANCE, "momentum 0.1 from drawn statistics"),
    ]


def differences(adapter_state: dict, params: dict, train: dict) -> list[dict]:
    """How much the rows' inputs move what they check (each far above the tolerance): the side information
    zeroed, and the running statistics read instead of the batch's."""
    def output(side: torch.Tensor | None, training: bool) -> torch.Tensor:
        adapter = suite_adapter(params, True, torch.Generator().manual_seed(0))
        adapter.load_state_dict(adapter_state)
        adapter.train(training)
        with torch.no_grad():
            return adapter.forward(train["old"], side)

    full = output(train["side"], True)
    return [{"name": "the side information's part, first case: the train-mode output with the side information "
                     "zeroed", "max_abs_diff": float((output(torch.zeros_like(train["side"]), True) - full)
                                                     .abs().max()),
             "note": "so the output's rows check the side branch"},
            {"name": "batch against running statistics, first case: the output in eval mode on the training batch",
             "max_abs_diff": float((output(train["side"], False) - full).abs().max()),
             "note": "so the train-mode rows check the batch statistics"}]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ml-fct", required=True, help="a checkout of apple/ml-fct")
    parser.add_argument("--reference-python", help="a Python with torch, numpy, tqdm, PyYAML and scikit-learn "
                                                   "(default: this one)")
    parser.add_argument("--out", default=str(ROOT / "results/parity/fct.json"))
    args = parser.parse_args(argv)
    checkout = reference_checkout(args.ml_fct, "models/transformations.py", "apple/ml-fct")
    python = Path(args.reference_python) if args.reference_python else Path(sys.executable)
    if not python.is_file():
        raise ParityError(f"no Python at {python}; pass --reference-python")
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    cases, ours, dims, first = {}, {}, {}, None
    for name, spec in CASES.items():
        params = arch_params(checkout, spec)
        with_side = spec["side"] is not False
        adapter = suite_adapter(params, with_side, generator)
        state = {k: v.clone() for k, v in adapter.state_dict().items()}
        train, test = (features(params, with_side, n, generator) for n in (BATCH, TEST))
        cases[name] = {"arch_params": {"arch": "MLP_BN_SIDE_PROJECTION", **params}, "config": CONFIG,
                       "state": to_reference_state(state), "train": train, "test": test}
        ours[name], dims[name] = suite_side(adapter, train, test), params["new_embedding_dim"]
        first = first or (state, params, train)
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        torch.save({"cases": cases}, work / "inputs.pt")
        reference = run_reference_probe(python, "fct_probe.py", "--ml-fct", checkout, work)
    rows = [r for name in CASES for r in compare(name, ours[name], reference[name], dims[name])]
    record = {**provenance({"ml_fct": ("apple/ml-fct", checkout)}), "rows": rows, "differences": differences(*first)}
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    for r in rows:
        print(f"{'ok ' if r['agree'] else 'NO '} {r['name']}: {r['max_abs_diff']} (tolerance {r['tolerance']})")
    for difference in record["differences"]:
        print(f"    {difference['name']}: {difference['max_abs_diff']:.4g}")


if __name__ == "__main__":
    main()
