"""Step-level parity with the authors' code on identical tensors (results/parity/README.md).

    python -m tools.parity.steps --iamcl2r REF/iamcl2r --cl2r REF/CompatibleLifelongRepresentation \\
        --cifar10 data [--reference-python REF/venv/bin/python] [--out results/parity/steps.json]

The same weights (suite models converted to the authors' checkpoint format), the same batch and float64 where it
helps are given to both codes: ``probe.py`` runs the authors' functions under their own Python, this script runs
the suite's, and each row reports the largest absolute difference and its tolerance, or why the two cannot agree.
FCT's transformation has its own check against ml-fct (``tools/parity/fct.py``).
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import subprocess
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.retrieval import CompatibilityEvaluator
from cl2r_bench.data.cifar import read_cifar
from cl2r_bench.data.datasets import CIFAR100_MEAN, CIFAR100_STD, DataError, ImageSet
from cl2r_bench.heads import simplex_vertices
from cl2r_bench.models import build_model, load_replacement, normalize
from cl2r_bench.training.engine import DeviceBatches, make_optimizer, scheduled_lr
from cl2r_bench.training_settings import TrainSettings
from strategies import Step, TaskContext, get_strategy
from strategies.dsimplex_hoc import hoc_loss
from strategies.fd import distillation_weight
from tools.parity.common import (  # noqa: I001
    ROOT,
    ParityError,
    first_per_class,
    provenance,
    reference_checkout,
    reference_name,
    reference_python,
    save_reference_checkpoint,
    to_reference_state,
    write_cifar_pickles,
)

CLASSES = 10
EPOCH = 10
QUERIES_PER_CLASS = 200


def row(name: str, diff: float, tolerance: float, note: str = "") -> dict:
    """A result row; an infinite difference means the two cannot be compared (stored as null, the note says why)."""
    finite = math.isfinite(diff)
    return {"name": name, "max_abs_diff": float(diff) if finite else None, "tolerance": float(tolerance),
            "agree": bool(finite and diff <= tolerance), "note": note}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def suite_models(work: Path) -> dict:
    """Suite ResNet-18s (d-Simplex student / teacher / replacement, learnable student / task model) in float64,
    saved in the authors' format; returns the models and the checkpoint paths the probe reads. They are built with
    the identity normalisation, so the step's float64 batch reaches both codes' backbones unchanged."""
    torch.manual_seed(1)
    models = {"hoc_student": build_model(backbone="resnet18", head="dsimplex", num_classes=CLASSES),
              "hoc_teacher": build_model(backbone="resnet18", head="dsimplex", num_classes=CLASSES),
              "er_student": build_model(backbone="resnet18", head="learnable", num_classes=CLASSES),
              "er_task_checkpoint": build_model(backbone="resnet18", head="learnable", num_classes=CLASSES)}
    for model in models.values():
        model.train()
        with torch.no_grad():  # non-trivial batch-norm statistics, as a trained model has
            model(torch.randn(32, 3, 32, 32))
        model.double()
    paths = {name: save_reference_checkpoint(to_reference_state(m.state_dict(), "dsimplex" if "hoc" in name
                                                                else "learnable"), work / f"{name}.pt")
             for name, m in models.items()}
    replacement = work / "replacement_hoc.pt"
    torch.save({k: v.float() for k, v in models["hoc_teacher"].state_dict().items()}, replacement)
    paths["hoc_replacement"] = save_reference_checkpoint(
        to_reference_state(torch.load(replacement, weights_only=True), "dsimplex"), work / "pretrained" / "ckpt_0.pt")
    initial = {name: {k: v.clone() for k, v in m.state_dict().items()} for name, m in models.items()}
    return {"models": models, "paths": paths, "replacement": replacement, "initial": initial}


def suite_step(models: dict, name: str, images: torch.Tensor, labels: torch.Tensor) -> dict:
    """The suite's training step on one batch (the trainer's forward, the strategy's loss), float64 models."""
    strategy = get_strategy("dsimplex_hoc" if name == "hoc" else "er").from_params({})
    model = models[f"{name}_student"]
    model.train().zero_grad()
    logits, features = model(images)
    teacher_features = None
    if strategy.needs_teacher:
        teacher = models[f"{name}_teacher"].eval()
        with torch.no_grad():
            teacher_features = F.normalize(teacher(images)[1], dim=1)
    step = Step(labels=labels, targets=model.class_targets(labels), logits=logits, features=features,
                from_memory=torch.zeros_like(labels, dtype=torch.bool), teacher_features=teacher_features)
    loss = strategy.loss(step)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return {"loss": loss.item(), "grads": grads}


def explicit_true_mask(old: torch.Tensor, new: torch.Tensor, labels: torch.Tensor, mu: float) -> float:
    """``l_i = -S_ii + log(exp(S_ii) + sum_{y_j != y_i} exp(S_ij))`` by loops (METHODS.md §6, ``mask: true``)."""
    total = 0.0
    for i in range(len(labels)):
        terms = [mu * float(old[i] @ new[j]) for j in range(len(labels)) if j == i or labels[j] != labels[i]]
        total += -mu * float(old[i] @ new[i]) + float(torch.logsumexp(torch.tensor(terms, dtype=torch.float64), 0))
    return total / len(labels)


def evaluation_data(cifar10: str, work: Path) -> tuple[Path, ImageSet, ImageSet]:
    """A CIFAR-10 copy with the first QUERIES_PER_CLASS train images of each class (queries) and the whole test
    split (gallery), in the official layout, for both codes."""
    try:
        splits = read_cifar("cifar10", cifar10, verify="off")
    except DataError as exc:
        raise ParityError(str(exc)) from None
    query = first_per_class(splits.train, QUERIES_PER_CLASS)
    root = work / "data"
    write_cifar_pickles(root / "cifar-10-batches-py", query, splits.test, list(splits.class_names),
                        "cifar-10-batches-py")
    return root, query, splits.test


def run_probe(python: Path, refs: dict[str, Path], work: Path) -> dict:
    command = [str(python), str(Path(__file__).with_name("probe.py")), "--iamcl2r", str(refs["iamcl2r"]),
               "--cl2r", str(refs["cl2r"]), "--work", str(work)]
    done = subprocess.run(command, capture_output=True, text=True,
                          env={"WANDB_MODE": "disabled", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1",
                               "PATH": "/usr/bin:/bin"})
    if done.returncode != 0:
        raise ParityError(f"the reference probe failed: {done.stderr.strip().splitlines()[-1:]}")
    return torch.load(work / "reference.pt", weights_only=False)


def compare(ref: dict, ours: dict) -> list[dict]:
    """One row per step: the reference's value against the suite's."""
    simplex_diff = float((ref["replacement"]["dsimplex"] - simplex_vertices(1024)).abs().max())
    rows = [row("d-Simplex matrix (K = 1024)", simplex_diff,
                1e-6, "theirs in float32 with +1e-8 in the norm; ours in float64 rounded to float32")]
    rows.append(row("L_hoc value, mask zero (random batch of 64)", abs(ours["hoc_random"] - ref["hoc_loss"]["random"]),
                    1e-5, "ours accumulates in float32"))
    example_diff = max(abs(ours["hoc_example"] + 4.069), abs(ref["hoc_loss"]["worked_example"] + 4.069))
    rows.append(row("L_hoc worked example of METHODS.md (-4.069)", example_diff,
                    5e-4, f"theirs {ref['hoc_loss']['worked_example']:.4f}, ours {ours['hoc_example']:.4f}"))
    rows.append(row("L_hoc value, mask true", abs(ours["hoc_true"] - ours["hoc_true_loops"]), 1e-5,
                    "the authors' code has no true mask: compared with the formula of METHODS.md §6 by loops"))
    for name in ("hoc", "er"):
        mine, theirs = ours[f"{name}_step"], ref[f"{name}_step"]
        label = "d-Simplex-HOC (0.1 CE + 0.9 L_hoc, mask zero)" if name == "hoc" else "ER (CE)"
        rows.append(row(f"{label}: loss of one training step", abs(mine["loss"] - theirs["loss"]), 1e-5,
                        "theirs: train_one_epoch on one batch; ours: the trainer's forward and the strategy's loss"))
        grads = {reference_name(k): v for k, v in mine["grads"].items()}
        scale = max(float(g.abs().max()) for g in theirs["grads"].values())
        differing = sorted(set(theirs["grads"]) ^ set(grads))
        rows.append(row(f"{label}: gradient w.r.t. every trained parameter ({len(grads)} tensors)",
                        max_diff(theirs["grads"], grads) if not differing else float("inf"), 1e-4 * scale,
                        f"tolerance 1e-4 x the largest gradient ({scale:.3g}); names on one side only: {differing}"))
    rows.append(row("d-Simplex-FD lambda_t (10 old, 15 new classes)", abs(ours["fd_lambda"] - ref["fd"]["lambda"]),
                    1e-12,
                    f"{ours['fd_lambda']:.6f}"))
    rows.append(row("d-Simplex-FD loss (CE + lambda_t (1 - cos) on the replay half, the old classes' samples)",
                    abs(ours["fd_loss"] - ref["fd"]["loss"]),
                    1e-5, "theirs: CL2R's update_criterion_weight and EmbeddingsSimilarity (replay half first)"))
    old_rows = ref["expansion"]["classifier"][:CLASSES].double()
    grown = ours["expansion"]
    rows.append(row("learnable head expansion 10 -> 25: old rows copied",
                    float((old_rows - grown[:CLASSES].double()).abs().max()),
                    0.0))
    bound = 512 ** -0.5
    rows.append(row("learnable head expansion: new rows within nn.Linear's init bound 1/sqrt(512)",
                    max(0.0, float(ref["expansion"]["classifier"][CLASSES:].abs().max()) - bound,
                        float(grown[CLASSES:].abs().max()) - bound), 0.0,
                    "new rows are random in both: same law, different draws"))
    theirs_rep, saved = ref["replacement"], ours["replacement_saved"]
    lost = sorted(set(saved) - set(theirs_rep["state"])) + theirs_rep["missing"] + theirs_rep["unexpected"]
    rows.append(row("replacement load, theirs (non-strict, head dropped): saved weights kept",
                    max_diff(saved, {k: theirs_rep["state"][k] for k in saved}) if not lost else float("inf"), 0.0,
                    f"keys missing or unexpected in their load: {lost}"))
    rows.append(row("replacement load, ours (strict): saved weights kept", ours["replacement_kept"], 0.0,
                    "any missing or unexpected weight stops the run; the simplex is a non-persistent buffer"))
    rows.append(row("replacement load: regenerated d-Simplex classifier",
                    float((theirs_rep["state"]["fc2.weight"] - simplex_vertices(1024)).abs().max()), 1e-6))
    theirs_opt = ref["optimizer"]
    rows.append(row(f"learning rate at epoch {EPOCH} (CosineAnnealingLR stepped per epoch)",
                    abs(ours["lr"] - theirs_opt["lr"]), 1e-15, f"theirs {theirs_opt['lr']:.6g}, ours {ours['lr']:.6g}"))
    rows.append(row("parameters without weight decay (norm weights, biases)",
                    len(set(theirs_opt["no_decay"]) ^ set(ours["no_decay"])), 0, f"{len(ours['no_decay'])} tensors"))
    rows.append(row("weights after one SGD step (momentum 0.9, weight decay 5e-4)",
                    max_diff(ours["after_step"], theirs_opt["state"]),
                    1e-12))
    counts = ref["sampler"]
    rows.append(row("batches per epoch, task 1 of the 7-task split (4,500 new + 200 memory)",
                    abs(counts["batches"] - ours["sampler"]["batches"]), 0,
                    f"theirs {counts['batches']}, ours {ours['sampler']['batches']}"))
    rows.append(row("replay / new samples per batch (64 / 64), distinct inside each half",
                    max(max(abs(m - 64) for m in counts["memory_per_batch"]),
                        max(abs(d - 128) for d in counts["distinct_per_batch"]), ours["sampler"]["worst"]), 0))
    rows.append(row("batches per epoch, task 0 (3,000 images, last partial batch dropped)",
                    abs(counts["task0"] - ours["sampler"]["task0"]), 0,
                    f"theirs {counts['task0']}, ours {ours['sampler']['task0']}"))
    rows.append(row("evaluation transform (resize 32, to tensor, CIFAR-100 normalisation)",
                    float((ref["evaluation"]["transform"] - ours["transform"]).abs().max()), 1e-5))
    theirs_m, ours_m = torch.tensor(ref["evaluation"]["matrix"]), ours["matrix"]
    rows.append(row(f"compatibility matrix of two checkpoints ({ours['queries']:,} queries, 10,000 gallery images)",
                    float((theirs_m - ours_m).abs().max()), 1 / ours["queries"],
                    f"theirs {theirs_m.numpy().round(4).tolist()}, ours {ours_m.numpy().round(4).tolist()}; "
                    "tolerance one query"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iamcl2r", required=True, help="checkout of miccunifi/iamcl2r")
    parser.add_argument("--cl2r", required=True, help="checkout of NiccoBiondi/CompatibleLifelongRepresentation")
    parser.add_argument("--cifar10", required=True, help="folder holding cifar-10-batches-py/")
    parser.add_argument("--reference-python", help="the reference's interpreter (default: venv/bin/python beside "
                                                   "the iamcl2r checkout)")
    parser.add_argument("--out", default=str(ROOT / "results" / "parity" / "steps.json"))
    args = parser.parse_args()
    refs = {"iamcl2r": reference_checkout(args.iamcl2r, "src/iamcl2r/methods/hoc.py", "miccunifi/iamcl2r"),
            "cl2r": reference_checkout(args.cl2r, "src/cl2r/train.py", "NiccoBiondi/CompatibleLifelongRepresentation")}
    python = reference_python(args.reference_python, refs["iamcl2r"])
    torch.set_default_dtype(torch.float32)
    with tempfile.TemporaryDirectory(prefix="parity-") as tmp:
        work = Path(tmp)
        rows = run(python, refs, work, args.cifar10)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    repositories = {"iamcl2r": "miccunifi/iamcl2r", "cl2r": "NiccoBiondi/CompatibleLifelongRepresentation"}
    sources = provenance({name: (repositories[name], path) for name, path in refs.items()})
    Path(args.out).write_text(json.dumps({**sources, "rows": rows}, indent=1, allow_nan=False) + "\n")
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        diff = "n/a" if r["max_abs_diff"] is None else f"{r['max_abs_diff']:.3g}"
        print(f"{'ok  ' if r['agree'] else 'DIFF'} {r['name']:<{width}}  {diff} (tol {r['tolerance']:.3g})")
    print(f"{sum(r['agree'] for r in rows)} of {len(rows)} rows agree; written to {args.out}")


def run(python: Path, refs: dict[str, Path], work: Path, cifar10: str) -> list[dict]:
    built = suite_models(work)
    models, paths = built["models"], built["paths"]
    gen = torch.Generator().manual_seed(2)
    images = torch.randn(16, 3, 32, 32, generator=gen, dtype=torch.float64)
    labels = torch.tensor([0, 0, 1, 2, 3, 3, 3, 4, 5, 6, 7, 7, 8, 9, 9, 1])
    example = (torch.tensor([[0.6, 0.8], [1.0, 0.0], [-0.6, 0.8]], dtype=torch.float64),
               torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]], dtype=torch.float64), torch.tensor([0, 0, 1]))
    data_root, query, gallery = evaluation_data(cifar10, work)
    for t, name in enumerate(("hoc_teacher", "hoc_student")):
        save_reference_checkpoint(to_reference_state({k: v.float() for k, v in models[name].state_dict().items()},
                                                     "dsimplex"), work / "reference_eval" / f"ckpt_{t}.pt")
    inputs = {**{k: str(v) for k, v in paths.items()}, "classes": CLASSES, "images": images, "labels": labels,
              "hoc_old": F.normalize(torch.randn(64, 32, generator=gen, dtype=torch.float64), dim=1),
              "hoc_new": F.normalize(torch.randn(64, 32, generator=gen, dtype=torch.float64), dim=1),
              "hoc_labels": torch.randint(0, 8, (64,), generator=gen), "hoc_example": example,
              "sampler": (4500, 200, 10), "task0_images": 3000, "epoch": EPOCH, "fd_old_classes": 10,
              "fd_new_classes": 15, "fd_labels": replay_then_new_labels(gen),
              "fd_logits": torch.randn(128, 25, generator=gen), "fd_new": torch.randn(128, 64, generator=gen),
              "fd_old": torch.randn(128, 64, generator=gen), "data_root": str(data_root),
              "eval_images": torch.zeros(64)}
    ours = suite_values(built, inputs, query, gallery)
    inputs["optimizer_grads"] = {reference_name(k): v for k, v in ours["hoc_step"]["grads"].items()}
    torch.save(inputs, work / "inputs.pt")
    return compare(run_probe(python, refs, work), ours)


def suite_values(built: dict, inputs: dict, query: ImageSet, gallery: ImageSet) -> dict:
    """Every suite-side value of :func:`compare`, computed before anything changes the models."""
    models = built["models"]
    ours = {"hoc_step": suite_step(models, "hoc", inputs["images"], inputs["labels"]),
            "er_step": suite_step(models, "er", inputs["images"], inputs["labels"])}
    old, new, labels = inputs["hoc_old"], inputs["hoc_new"], inputs["hoc_labels"]
    example_new, example_old, example_labels = inputs["hoc_example"]
    ours |= {"hoc_random": float(hoc_loss(old, new, labels, 10.0, "zero")),
             "hoc_example": float(hoc_loss(example_old, example_new, example_labels, 10.0, "zero")),
             "hoc_true": float(hoc_loss(old, new, labels, 10.0, "true")),
             "hoc_true_loops": explicit_true_mask(old, new, labels, 10.0)}
    ours |= fd_values(inputs) | optimizer_values(models["hoc_student"], built["initial"]["hoc_student"])
    ours |= replacement_values(built)
    ours["expansion"] = grown_classifier(built["paths"]["er_task_checkpoint"])
    ours["sampler"] = sampler_counts()
    ours["transform"] = normalize(gallery.images[:len(inputs["eval_images"])], CIFAR100_MEAN, CIFAR100_STD)
    evaluator = CompatibilityEvaluator(query, gallery, amp=False)
    for name in ("hoc_teacher", "hoc_student"):
        model = build_model(backbone="resnet18", head="dsimplex", num_classes=CLASSES, mean=CIFAR100_MEAN,
                            std=CIFAR100_STD)
        model.load_state_dict({k: v.float() for k, v in built["initial"][name].items()})
        evaluator.deploy(model.eval())
    ours["matrix"] = torch.tensor([[evaluator.matrix[0][0], 0.0], evaluator.matrix[1]], dtype=torch.float64)
    ours["queries"] = len(query)
    return ours


def replay_then_new_labels(generator: torch.Generator) -> torch.Tensor:
    """The labels of a task-1 batch of the CL2R code: 64 replay samples of the 10 old classes, then 64 new samples of
    the 15 new ones (the suite distils the old classes' samples, the CL2R code the replay half: the same samples)."""
    return torch.cat([torch.randint(0, 10, (64,), generator=generator),
                      torch.randint(10, 25, (64,), generator=generator)])


def fd_values(inputs: dict) -> dict:
    fd = get_strategy("dsimplex_fd").from_params({})
    fd.before_task(TaskContext(index=1, num_old_classes=inputs["fd_old_classes"],
                               num_new_classes=inputs["fd_new_classes"], teacher=object()))
    half = len(inputs["fd_labels"]) // 2
    step = Step(labels=inputs["fd_labels"], targets=inputs["fd_labels"], logits=inputs["fd_logits"],
                features=inputs["fd_new"], from_memory=torch.arange(len(inputs["fd_labels"])) < half,
                teacher_features=F.normalize(inputs["fd_old"], dim=1))
    return {"fd_lambda": distillation_weight(5.0, inputs["fd_new_classes"], inputs["fd_old_classes"]),
            "fd_loss": float(fd.loss(step))}


def replacement_values(built: dict) -> dict:
    """What the suite's strict loader keeps of a replacement checkpoint (the probe loads the converted file)."""
    model = build_model(backbone="resnet18", head="dsimplex", num_classes=CLASSES)
    load_replacement(model, built["replacement"])
    saved = torch.load(built["replacement"], weights_only=True)
    kept = max(float((model.state_dict()[k].double() - v.double()).abs().max()) for k, v in saved.items())
    return {"replacement_kept": kept, "replacement_saved": {reference_name(k): v for k, v in saved.items()}}


def grown_classifier(task_checkpoint: Path) -> torch.Tensor:
    state = torch.load(task_checkpoint, weights_only=True)["net"]
    model = build_model(backbone="resnet18", head="learnable", num_classes=CLASSES)
    model.head.classifier.weight.data.copy_(state["fc2.weight"])
    model.head.grow(25)
    return model.head.classifier.weight.detach().clone()


def sampler_counts() -> dict:
    def fake(n: int, offset: int) -> ImageSet:
        return ImageSet(torch.zeros(n, 3, 2, 2, dtype=torch.uint8), torch.arange(n) + offset)

    batches = DeviceBatches(fake(4500, 0), fake(200, 10_000), new_batch=64, memory_batch=64, epoch_length="reference")
    worst = 0
    for _, labels, from_memory in batches:
        worst = max(worst, abs(int(from_memory.sum()) - 64),
                    128 - len(labels[from_memory].unique()) - len(labels[~from_memory].unique()))
    task0 = DeviceBatches(fake(3000, 0), None, new_batch=128, memory_batch=64, epoch_length="reference")
    return {"batches": len(batches), "worst": worst, "task0": len(task0)}


def optimizer_values(student, initial: dict[str, torch.Tensor]) -> dict:
    """One SGD step at epoch EPOCH with the suite's groups and schedule, from the student's saved weights and the
    gradients of the d-Simplex-HOC step (the probe steps its copy with the same gradients)."""
    model = copy.deepcopy(student)
    model.load_state_dict(initial)
    settings = TrainSettings.with_defaults()
    optimizer = make_optimizer(model, settings)
    lr = scheduled_lr(EPOCH * 36, 36, settings)
    for group in optimizer.param_groups:
        group["lr"] = lr
    for p, q in zip(model.parameters(), student.parameters(), strict=True):
        p.grad = None if q.grad is None else q.grad.clone()
    optimizer.step()
    no_decay = [reference_name(n) for n, p in model.named_parameters() if p.requires_grad and p.ndim <= 1]
    return {"lr": lr, "no_decay": no_decay,
            "after_step": {reference_name(n): p.detach() for n, p in model.named_parameters() if p.requires_grad}}


if __name__ == "__main__":
    main()
