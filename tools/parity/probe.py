"""The reference side of the step-level parity check: run under the authors' own Python environment.

    <reference venv>/bin/python -m tools.parity.probe --iamcl2r PATH --cl2r PATH --work DIR

``DIR/inputs.pt`` (written by ``tools/parity/steps.py``) holds the tensors and checkpoint paths; this script
calls the authors' functions on them (``create_model``, ``train_one_epoch``, ``HocLoss``, ``BalancedBatchSampler``,
``load_cifar_identification``, ``evaluate``, CL2R's ``update_criterion_weight`` / ``EmbeddingsSimilarity``) and
writes what they return to ``DIR/reference.pt`` (ml-fct's FCT has its own check: ``fct_probe.py``). It imports
nothing of the suite and copies none of the authors' code: where a rule lives inline in their ``main.py``
(parameter groups), it is read from that file and evaluated.
"""
from __future__ import annotations

import argparse
import logging
import re
import sys
from pathlib import Path

import numpy as np
import torch


def patch_offline() -> None:
    """torchvision checks the official md5 sums even when the files exist; the parity data are our own files."""
    import torchvision.datasets.cifar as cifar

    cifar.check_integrity = lambda *args, **kwargs: True


def reference_args(method: str, **extra):
    from iamcl2r.methods import set_method_configs
    from iamcl2r.params import ExperimentParams

    args = ExperimentParams()
    set_method_configs(args, name=method)
    args.method, args.distributed, args.amp, args.is_main_process = method, False, False, False
    args.current_task_id, args.current_epoch = 0, 0
    for key, value in extra.items():
        setattr(args, key, value)
    return args


def training_step(inputs: dict, method: str) -> dict:
    """One batch through the authors' ``train_one_epoch`` (lr 0, so the weights stay): loss and gradients."""
    import iamcl2r.train as train
    from iamcl2r.methods import HocLoss
    from iamcl2r.models import create_model

    fixed = method == "hoc"
    classes = inputs["classes"]
    args = reference_args(method, classes_at_task=[classes], new_data_ids_at_task=[list(range(classes))])
    device = torch.device("cpu")
    net = create_model(args, device, resume_path=inputs[f"{method}_student"]).double()
    teacher = None
    if args.create_old_model:
        teacher = create_model(args, device, resume_path=inputs[f"{method}_teacher"], new_classes=0).double()
        teacher.requires_grad_(False)
        teacher.eval()
    captured = {}
    train.log_epoch = lambda n_epochs=None, loss=None, *a, **k: captured.setdefault("loss", loss)
    batch = [(inputs["images"].double(), inputs["labels"])]
    optimizer = torch.optim.SGD(net.parameters(), lr=0.0)
    scaler = torch.cuda.amp.GradScaler(enabled=False)
    target_transform = (lambda y: args.preallocated_classes - 1 - y) if fixed else None
    train.train_one_epoch(args, device, net, teacher, batch, scaler, optimizer, 0, torch.nn.CrossEntropyLoss(), 0,
                          HocLoss(mu_=args.mu_) if fixed else None, target_transform=target_transform)
    grads = {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}
    return {"loss": captured["loss"], "grads": grads,
            "state": {k: v.clone() for k, v in net.state_dict().items()}}


def replacement_load(inputs: dict) -> dict:
    """Their loader on a converted replacement checkpoint (path with "pretrained": head dropped, non-strict)."""
    from iamcl2r.models import Incremental_ResNet, create_model, dsimplex

    args = reference_args("hoc", classes_at_task=[inputs["classes"]], new_data_ids_at_task=[[]])
    net = create_model(args, torch.device("cpu"), resume_path=inputs["hoc_replacement"])
    saved = torch.load(inputs["hoc_replacement"], map_location="cpu")["net"]
    result = Incremental_ResNet(num_classes=1024, feat_size=1023).load_state_dict(saved, strict=False)
    return {"state": {k: v.clone() for k, v in net.state_dict().items()}, "missing": list(result.missing_keys),
            "unexpected": list(result.unexpected_keys), "dsimplex": dsimplex(num_classes=1024, device="cpu")}


def hoc_loss_values(inputs: dict) -> dict:
    from iamcl2r.methods import HocLoss

    loss = HocLoss(mu_=10)
    return {"random": loss(inputs["hoc_new"], inputs["hoc_old"], inputs["hoc_labels"]).item(),
            "worked_example": loss(*inputs["hoc_example"]).item()}


def optimizer_step(inputs: dict) -> dict:
    """Their parameter groups (the ``exclude`` rule read from main.py), SGD and the cosine schedule at an epoch,
    stepped with the gradients the suite computed (so that only the optimisers are compared)."""
    from iamcl2r.models import create_model
    from iamcl2r.params import ExperimentParams

    source = (Path(inputs["iamcl2r"]) / "src" / "iamcl2r" / "main.py").read_text()
    exclude = eval(re.search(r"exclude = (lambda n, p: .*)", source).group(1))  # noqa: S307 - their own rule
    args = reference_args("hoc", classes_at_task=[inputs["classes"]], new_data_ids_at_task=[[]])
    net = create_model(args, torch.device("cpu"), resume_path=inputs["hoc_student"]).double()
    named = list(net.named_parameters())
    no_decay = [p for n, p in named if exclude(n, p) and p.requires_grad]
    decay = [p for n, p in named if not exclude(n, p) and p.requires_grad]
    defaults = ExperimentParams()
    optimizer = torch.optim.SGD([{"params": no_decay, "weight_decay": 0.0},
                                 {"params": decay, "weight_decay": defaults.weight_decay}],
                                lr=defaults.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=defaults.epochs, eta_min=defaults.min_lr)
    for _ in range(inputs["epoch"]):
        optimizer.step()  # no gradients yet: advances nothing but the schedule's bookkeeping
        scheduler.step()
    for name, p in named:
        if name in inputs["optimizer_grads"]:
            p.grad = inputs["optimizer_grads"][name].clone()
    optimizer.step()
    return {"lr": optimizer.param_groups[0]["lr"], "state": {k: v.clone() for k, v in net.state_dict().items()},
            "no_decay": sorted(n for n, p in named if exclude(n, p) and p.requires_grad)}


def sampler_counts(inputs: dict) -> dict:
    from iamcl2r.dataset.dataset_utils import BalancedBatchSampler

    class Labels:
        def __init__(self, labels):
            self._y = labels

    new, memory, seen = inputs["sampler"]
    labels = np.concatenate([np.arange(new) % 15 + seen, np.arange(memory) % seen])
    np.random.seed(0)
    sampler = BalancedBatchSampler(Labels(labels), batch_size=128, n_classes=15 + seen, n_samples=len(labels),
                                   seen_classes=torch.arange(seen), rehearsal=20)
    batches = list(sampler)
    from_memory = [int(sum(labels[i] < seen for i in b)) for b in batches]
    distinct = [len(set(b)) for b in batches]
    task0 = len(torch.utils.data.DataLoader(range(inputs["task0_images"]), batch_size=128, shuffle=True,
                                            drop_last=True))
    return {"batches": len(sampler), "memory_per_batch": from_memory, "distinct_per_batch": distinct, "task0": task0}


def evaluation(inputs: dict, work: Path) -> dict:
    """Their evaluation transform on the first images, and their ``evaluate`` on two checkpoints (a 2x2 matrix)."""
    from iamcl2r.dataset import create_data_and_transforms
    from iamcl2r.eval import evaluate

    args = reference_args("hoc", data_path=str(inputs["data_root"]), num_workers=0, batch_size=256,
                          checkpoint_path=str(work / "reference_eval"))
    args.classes_at_task = [inputs["classes"]] * 2
    data = create_data_and_transforms(args, mode="identification")
    first = torch.stack([data["gallery_loader"].dataset[i][0] for i in range(len(inputs["eval_images"]))])
    evaluate(args, torch.device("cpu"), data["query_loader"], data["gallery_loader"], ntasks_eval=2)
    text = (work / "reference_eval" / "comp-matrix.txt").read_text()
    numbers = [float(x) for x in re.findall(r"\d+\.\d*(?:e[-+]?\d+)?", text.split("Avg. Comp.")[0])]
    return {"transform": first, "matrix": np.array(numbers[:4]).reshape(2, 2)}


def learnable_expansion(inputs: dict) -> dict:
    from iamcl2r.models import create_model

    args = reference_args("er", classes_at_task=[10, 25], new_data_ids_at_task=[list(range(10)), list(range(10, 25))])
    args.current_task_id = 1
    net = create_model(args, torch.device("cpu"), resume_path=inputs["er_task_checkpoint"])
    return {"classifier": net.fc2.weight.detach().clone()}


def cl2r_fd(inputs: dict) -> dict:
    from cl2r.train import EmbeddingsSimilarity
    from cl2r.utils import l2_norm, update_criterion_weight

    args = argparse.Namespace(criterion_weight_base=5)
    weight = update_criterion_weight(args, inputs["fd_old_classes"], inputs["fd_new_classes"])
    half = len(inputs["fd_labels"]) // 2
    ce = torch.nn.CrossEntropyLoss()(inputs["fd_logits"], inputs["fd_labels"])
    fd = EmbeddingsSimilarity(l2_norm(inputs["fd_new"][:half]), l2_norm(inputs["fd_old"][:half]))
    return {"lambda": float(weight), "loss": float(ce + weight * fd)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("--iamcl2r", "--cl2r", "--work"):
        parser.add_argument(name, required=True)
    args = parser.parse_args()
    sys.path[:0] = [str(Path(args.iamcl2r) / "src"), str(Path(args.cl2r) / "src")]
    logging.disable(logging.CRITICAL)
    patch_offline()
    torch.manual_seed(0)
    work = Path(args.work)
    inputs = torch.load(work / "inputs.pt", weights_only=False)
    inputs["iamcl2r"] = args.iamcl2r
    out = {"hoc_step": training_step(inputs, "hoc"), "er_step": training_step(inputs, "er"),
           "hoc_loss": hoc_loss_values(inputs), "sampler": sampler_counts(inputs),
           "expansion": learnable_expansion(inputs), "fd": cl2r_fd(inputs), "replacement": replacement_load(inputs)}
    out["optimizer"] = optimizer_step(inputs)
    out["evaluation"] = evaluation(inputs, work)
    torch.save(out, work / "reference.pt")


if __name__ == "__main__":
    main()
