"""The reference side of FCT's parity check: run under a Python with torch, numpy, tqdm, PyYAML and scikit-learn
(ml-fct's requirements without the image packages this check does not use).

    <reference python> tools/parity/fct_probe.py --ml-fct PATH --work DIR

``DIR/inputs.pt`` (written by ``tools/parity/fct.py``) holds cases: the transformation's architecture parameters
(their ``arch_params``), its weights under their names, a training batch and a test batch of old, new and
side-information features (side information None: their run without a side-information model), and the name of
their transformation config whose optimiser and schedule to build. For each case this script, importing nothing of
the suite and copying none of the authors' code, builds ``apple/ml-fct``'s objects as ``train_transformation.py``
does: ``utils.getters.get_model`` (their ``MLP_BN_SIDE_PROJECTION``), loaded strictly with the weights;
``TransformationTrainer`` with the old, new and side-information models (``side_info_model = old_model`` when no
side information is given); ``nn.MSELoss``; ``get_optimizer`` and ``get_policy`` with the config's
``optimizer_params`` and ``lr_policy_params``, the policy called for epoch 0. The feature models are stand-ins
that return the given features of the items a batch names, shaped ``(N, C, 1, 1)`` as their backbones' pooled
features are; the train loader is one batch of item indices.

Per case it writes to ``DIR/reference.pt``: ``TransformedOldModel`` (their exported map: old model, side model
and transformation, in eval mode) on the test batch before training; then, from one ``TransformationTrainer.train``
epoch of that one batch, the transformation's output (a forward hook), the loss it returns, every parameter's
gradient (recorded by a wrapper of their Adam's ``step`` before it steps), the batch-norm running statistics after
the step, and the learning rate of epoch 0.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import yaml
from torch import nn


class Features(nn.Module):
    """A feature model: the given features of the items ``index`` names, as ``(N, C, 1, 1)``."""

    def __init__(self, features: torch.Tensor) -> None:
        super().__init__()
        self.features = features

    def forward(self, index: torch.Tensor) -> torch.Tensor:
        return self.features[index][:, :, None, None]


def reference_case(case: dict, checkout: Path) -> dict:
    from trainers import TransformationTrainer
    from utils.getters import get_model, get_optimizer
    from utils.net_utils import TransformedOldModel
    from utils.schedulers import get_policy

    config = yaml.safe_load((checkout / "configs" / case["config"]).read_text())
    model = get_model(case["arch_params"])
    model.load_state_dict(case["state"], strict=True)
    train, test = case["train"], case["test"]
    old_model, new_model = Features(torch.cat([train["old"], test["old"]])), Features(train["new"])
    side_model = old_model if train["side"] is None else Features(torch.cat([train["side"], test["side"]]))
    test_index = torch.arange(len(train["old"]), len(train["old"]) + len(test["old"]))
    with torch.no_grad():
        mapped = TransformedOldModel(old_model, side_model, model.eval())(test_index).flatten(1)

    trainer = TransformationTrainer(old_model, new_model, side_model)
    optimizer = get_optimizer(model, **config["optimizer_params"])
    lr = get_policy(optimizer, **config["lr_policy_params"])(0, iteration=None)
    recorded: dict = {}
    step = optimizer.step

    def recording_step(*args, **kwargs):
        recorded["grads"] = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
        return step(*args, **kwargs)

    optimizer.step = recording_step
    def keep_output(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        recorded["output"] = output.detach().clone()

    hook = model.register_forward_hook(keep_output)
    loader = [(torch.arange(len(train["old"])), torch.zeros(len(train["old"]), dtype=torch.long))]
    loss = trainer.train(train_loader=loader, model=model, criterion=nn.MSELoss(), optimizer=optimizer,
                         device=torch.device("cpu"), switch_mode_to_eval=False)
    hook.remove()
    statistics = {name: value.clone() for name, value in model.state_dict().items()
                  if name.endswith(("running_mean", "running_var", "num_batches_tracked"))}
    return {"eval_map": mapped, "output": recorded["output"].flatten(1), "loss": float(loss),
            "grads": recorded["grads"], "statistics": statistics, "lr": float(lr),
            "parameters": sum(p.numel() for p in model.parameters())}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ml-fct", required=True)
    parser.add_argument("--work", required=True)
    args = parser.parse_args()
    checkout, work = Path(args.ml_fct).resolve(), Path(args.work)
    sys.path.insert(0, str(checkout))
    torch.manual_seed(0)
    inputs = torch.load(work / "inputs.pt", weights_only=False)
    torch.save({name: reference_case(case, checkout) for name, case in inputs["cases"].items()},
               work / "reference.pt")


if __name__ == "__main__":
    main()
